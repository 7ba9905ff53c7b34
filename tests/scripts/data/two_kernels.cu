// Two small kernels for the test of scripts/kernel_lines.py and scripts/kernel_code_size.py.
__global__ void staged(int n, int const* in, int* out, long long* stamps) {
  long long t0 = clock64();
  int s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += in[i];
  long long t1 = clock64();
  out[threadIdx.x] = s * 3 + 1;
  long long t2 = clock64();
  if (threadIdx.x == 0) stamps[0] = t1 - t0, stamps[1] = t2 - t1;
}

__global__ void plain(int* out) { out[threadIdx.x] = static_cast<int>(threadIdx.x) * 7; }
