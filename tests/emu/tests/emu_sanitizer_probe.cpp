// Planted bugs that only a sanitizer can see, one per argument; the CTest entries built from this
// program (tests/emu/CMakeLists.txt) pass when the sanitizer reports the bug, and the control runs
// (the same code without the bug) pass when it reports nothing.
//
//   overrun        a kernel writes one byte past a cudaMalloc allocation        (ASan)
//   block-race     a shared-memory exchange without its __syncthreads            (TSan)
//   block-ok       the same with the barrier                                      (control)
//   stream-race    stream B reads what stream A writes, no cudaStreamWaitEvent    (TSan)
//   stream-ok      the same with the event wait                                   (control)
//   graph-race     the same missing dependency inside a captured graph            (TSan)

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace {

__global__ void overrun_kernel(unsigned char* p, int n) {
  if (threadIdx.x == 0) p[n] = 1;  // one past the end
}

__global__ void exchange_kernel(int* out, bool barrier) {
  __shared__ int buf[64];
  int t = static_cast<int>(threadIdx.x);
  buf[t] = t;
  if (barrier) __syncthreads();
  out[t] = buf[63 - t];
}

__global__ void write_kernel(int* p, int n) {
  volatile int sink = 0;
  for (int r = 0; r < 20000; ++r) sink = sink + r;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) p[i] = i;
}
__global__ void read_kernel(int const* p, int* q, int n) {
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) q[i] = p[i] + 1;
}

int check(cudaError_t e, char const* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

int streams(bool wait, bool graph) {
  int const n = 256;
  int *a = nullptr, *b = nullptr;
  if (check(cudaMalloc(&a, n * sizeof(int)), "cudaMalloc") || check(cudaMalloc(&b, n * sizeof(int)), "cudaMalloc")) return 1;
  cudaStream_t s1, s2;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  cudaEvent_t fork, e, join;
  cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
  cudaGraph_t g = nullptr;
  if (graph) {
    if (check(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal), "begin")) return 1;
    cudaEventRecord(fork, s1);
    cudaStreamWaitEvent(s2, fork, 0);  // s2 joins the capture, before the write
  }
  emu::kernel_launch(write_kernel, dim3(1), dim3(64), 0, s1, a, n);
  if (wait) {
    cudaEventRecord(e, s1);
    cudaStreamWaitEvent(s2, e, 0);
  }
  emu::kernel_launch(read_kernel, dim3(1), dim3(64), 0, s2, static_cast<int const*>(a), b, n);
  if (graph) {
    cudaEventRecord(join, s2);
    cudaStreamWaitEvent(s1, join, 0);
    if (check(cudaStreamEndCapture(s1, &g), "end")) return 1;
    cudaGraphExec_t x;
    if (check(cudaGraphInstantiate(&x, g, 0), "instantiate")) return 1;
    if (check(cudaGraphLaunch(x, s1), "launch")) return 1;
  }
  return check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace

int main(int argc, char** argv) {
  std::string what = argc > 1 ? argv[1] : "";
  if (what == "overrun") {
    unsigned char* p = nullptr;
    if (check(cudaMalloc(&p, 37), "cudaMalloc")) return 1;
    emu::kernel_launch(overrun_kernel, dim3(1), dim3(32), 0, nullptr, p, 37);
    return check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  if (what == "block-race" || what == "block-ok") {
    int* out = nullptr;
    if (check(cudaMalloc(&out, 64 * sizeof(int)), "cudaMalloc")) return 1;
    emu::kernel_launch(exchange_kernel, dim3(2), dim3(64), 0, nullptr, out, what == "block-ok");
    return check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  if (what == "stream-race") return streams(false, false);
  if (what == "stream-ok") return streams(true, false);
  if (what == "graph-race") return streams(false, true);
  if (what == "graph-ok") return streams(true, true);
  std::fprintf(stderr, "usage: emu_sanitizer_probe overrun|block-race|block-ok|stream-race|stream-ok|graph-race|graph-ok\n");
  return 2;
}
