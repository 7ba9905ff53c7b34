// The emulator's own tests: execution model, divergence errors, streams, events, graphs, errors.
// Each kernel's result is compared with a plain loop written here.

#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include "emu/hopper.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

template <class T>
T* device_alloc(std::size_t n) {
  T* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
  return p;
}
template <class T>
std::vector<T> download(T const* p, std::size_t n) {
  std::vector<T> v(n);
  REQUIRE(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return v;
}
template <class T>
void upload(T* p, std::vector<T> const& v) {
  REQUIRE(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
}

/// Expects the last launch to have failed with a kernel error whose message holds every `parts`.
void expect_kernel_error(std::vector<std::string> const& parts) {
  REQUIRE(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  REQUIRE(cudaGetLastError() == cudaErrorLaunchFailure);  // sticky: not cleared
  std::string msg = emu::last_kernel_error();
  INFO(msg);
  for (auto const& p : parts) CHECK(msg.find(p) != std::string::npos);
  emu::reset_errors();
  REQUIRE(cudaGetLastError() == cudaSuccess);
}

// ---------------------------------------------------------------------------------------------
// Kernels.
// ---------------------------------------------------------------------------------------------
__global__ void index_kernel(int* out, int nx, int ny) {
  int x = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  int y = static_cast<int>(blockIdx.y * blockDim.y + threadIdx.y);
  if (x < nx && y < ny) out[y * nx + x] = x * 1000 + y;
}

__global__ void block_sum_kernel(float const* in, float* out, int n) {
  __shared__ float part[256];
  int t = static_cast<int>(threadIdx.x);
  int i = static_cast<int>(blockIdx.x) * 256 + t;
  part[t] = i < n ? in[i] : 0.0f;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (t < s) part[t] += part[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = part[0];
}

__global__ void shuffle_kernel(int const* in, int* xor_sum, int* bcast, int* down, int* up, int* half) {
  int t = static_cast<int>(threadIdx.x);
  int v = in[t];
  int s = v;
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  xor_sum[t] = s;
  bcast[t] = __shfl_sync(0xffffffffu, v, 7);
  down[t] = __shfl_down_sync(0xffffffffu, v, 3);
  up[t] = __shfl_up_sync(0xffffffffu, v, 5);
  unsigned mask = t < 16 ? 0x0000ffffu : 0xffff0000u;
  half[t] = __shfl_sync(mask, v, (t & 16) + 2);  // lane 2 of each half-warp
}

__global__ void vote_kernel(int const* in, unsigned* ballot, int* any, int* all) {
  int t = static_cast<int>(threadIdx.x);
  ballot[t] = __ballot_sync(0xffffffffu, in[t] > 0);
  any[t] = __any_sync(0xffffffffu, in[t] > 5);
  all[t] = __all_sync(0xffffffffu, in[t] >= 0);
}

// Each half-warp reduces over its own lanes (mask 0x0000ffff or 0xffff0000): out[k][t].
__global__ void reduce_kernel(int const* in, int* out) {
  int t = static_cast<int>(threadIdx.x);
  unsigned mask = t < 16 ? 0x0000ffffu : 0xffff0000u;
  int v = in[t];
  auto u = static_cast<unsigned>(v);
  out[8 * 32 + t] = __reduce_min_sync(0xffffffffu, v);  // the whole warp first: then the halves
  out[0 * 32 + t] = __reduce_add_sync(mask, v);
  out[1 * 32 + t] = __reduce_min_sync(mask, v);
  out[2 * 32 + t] = __reduce_max_sync(mask, v);
  out[3 * 32 + t] = static_cast<int>(__reduce_min_sync(mask, u));
  out[4 * 32 + t] = static_cast<int>(__reduce_max_sync(mask, u));
  out[5 * 32 + t] = static_cast<int>(__reduce_and_sync(mask, u));
  out[6 * 32 + t] = static_cast<int>(__reduce_or_sync(mask, u));
  out[7 * 32 + t] = static_cast<int>(__reduce_xor_sync(mask, u));
}

__global__ void atomic_kernel(int* counter, unsigned* bits) {
  atomicAdd(counter, 1);
  atomicOr(bits, 1u << (threadIdx.x % 32));
}

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void early_exit_kernel(int* out) {
  if (threadIdx.x == 3) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void bad_mask_kernel(int* out) {
  out[threadIdx.x] = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x), 0);  // 16 lanes only
}

__global__ void outside_lane_kernel(int* out) {
  int t = static_cast<int>(threadIdx.x);
  if (t < 16) out[t] = __shfl_sync(0x0000ffffu, t, 20);  // lane 20 is not in the mask
}

// Warp and warpgroup operations whose participants can never all arrive. The emulator runs a block's
// threads in order until each blocks, so "before" and "after" below are the order of the events.
/// Lanes 0-3 exit before lane 4 starts the shuffle that names them.
__global__ void exited_before_shuffle_kernel(int* out) {
  if (threadIdx.x < 4) return;
  out[threadIdx.x] = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x), 0);
}
/// Lane 5 exits while lanes 0-4 wait in a shuffle that names it.
__global__ void exits_during_shuffle_kernel(int* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x), 0);
}
/// Lanes 16-31 reach __syncthreads while lanes 0-15 wait in a shuffle that names them.
__global__ void barrier_during_shuffle_kernel(int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x), 0);
  else __syncthreads();
}
/// Warp 3 exits while warps 0-2 are held up by two __syncwarp, so that the warpgroup's fence starts
/// after thread 96 has exited.
__global__ void exited_before_fence_kernel(int*) {
  if (threadIdx.x >= 96) return;
  __syncwarp();
  __syncwarp();
  emu::sm90::wgmma_fence();
}
/// Threads 64-127 reach __syncthreads while threads 0-63 wait at the warpgroup's fence.
__global__ void barrier_during_fence_kernel(int*) {
  if (threadIdx.x < 64) emu::sm90::wgmma_fence();
  else __syncthreads();
}

__global__ void trap_kernel(int* out, int when) {
  if (static_cast<int>(threadIdx.x) == when) __trap();
  out[threadIdx.x] = 1;
}

__global__ void dynamic_shared_kernel(int* out, int n) {
  auto* buf = static_cast<int*>(emu::dynamic_shared());
  int t = static_cast<int>(threadIdx.x);
  for (int i = t; i < n; i += static_cast<int>(blockDim.x)) buf[i] = i;
  __syncthreads();
  int s = 0;
  for (int i = 0; i < n; ++i) s += buf[i];
  out[t] = s;
}

/// Busy work, so that a later kernel on another stream would overtake it without ordering.
__global__ void slow_fill_kernel(int* p, int n, int value) {
  volatile int sink = 0;
  for (int r = 0; r < 2000; ++r) sink = sink + r;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) p[i] = value;
}
__global__ void add_kernel(int const* a, int* b, int n, int delta) {
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) b[i] = a[i] + delta;
}

}  // namespace

TEST_CASE("device attributes are an H100's", "[emu]") {
  int n = 0;
  REQUIRE(cudaGetDeviceCount(&n) == cudaSuccess);
  CHECK(n >= 1);
  cudaDeviceProp p;
  REQUIRE(cudaGetDeviceProperties(&p, 0) == cudaSuccess);
  CHECK(p.major == 9);
  CHECK(p.minor == 0);
  CHECK(p.multiProcessorCount == 132);
  int v = 0;
  REQUIRE(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) == cudaSuccess);
  CHECK(v == 232448);
  CHECK(cudaSetDevice(n) == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaSuccess);  // non-sticky: cleared by the read
}

TEST_CASE("thread and block indices cover a 2-D grid exactly once", "[emu]") {
  int const nx = 37, ny = 11;
  int* out = device_alloc<int>(nx * ny);
  REQUIRE(cudaMemset(out, 0xff, nx * ny * sizeof(int)) == cudaSuccess);
  REQUIRE(emu::kernel_launch(index_kernel, dim3(3, 2), dim3(16, 8), 0, nullptr, out, nx, ny) == cudaSuccess);
  auto got = download(out, nx * ny);
  for (int y = 0; y < ny; ++y)
    for (int x = 0; x < nx; ++x) REQUIRE(got[static_cast<std::size_t>(y * nx + x)] == x * 1000 + y);
  cudaFree(out);
}

TEST_CASE("__syncthreads orders shared-memory phases", "[emu]") {
  int const n = 1000;
  std::vector<float> in(n);
  std::iota(in.begin(), in.end(), 1.0f);
  float* din = device_alloc<float>(n);
  float* dout = device_alloc<float>(4);
  upload(din, in);
  REQUIRE(emu::kernel_launch(block_sum_kernel, dim3(4), dim3(256), 0, nullptr, din, dout, n) == cudaSuccess);
  auto got = download(dout, 4);
  for (int b = 0; b < 4; ++b) {
    float ref = 0;
    for (int i = b * 256; i < std::min(n, (b + 1) * 256); ++i) ref += in[static_cast<std::size_t>(i)];
    CHECK(got[static_cast<std::size_t>(b)] == ref);
  }
  cudaFree(din);
  cudaFree(dout);
}

TEST_CASE("warp shuffles and votes match the programming guide", "[emu]") {
  std::vector<int> in(32);
  std::mt19937 rng(7);
  for (auto& v : in) v = static_cast<int>(rng() % 11) - 1;
  int* din = device_alloc<int>(32);
  upload(din, in);
  int* o[5];
  for (auto& p : o) p = device_alloc<int>(32);
  REQUIRE(emu::kernel_launch(shuffle_kernel, dim3(1), dim3(32), 0, nullptr, din, o[0], o[1], o[2], o[3], o[4]) == cudaSuccess);
  auto xs = download(o[0], 32), bc = download(o[1], 32), dn = download(o[2], 32), up = download(o[3], 32),
       hf = download(o[4], 32);
  int total = std::accumulate(in.begin(), in.end(), 0);
  for (int l = 0; l < 32; ++l) {
    auto L = static_cast<std::size_t>(l);
    CHECK(xs[L] == total);
    CHECK(bc[L] == in[7]);
    CHECK(dn[L] == (l + 3 < 32 ? in[L + 3] : in[L]));  // out of range: own value
    CHECK(up[L] == (l >= 5 ? in[L - 5] : in[L]));
    CHECK(hf[L] == in[static_cast<std::size_t>((l & 16) + 2)]);
  }
  unsigned* ballot = device_alloc<unsigned>(32);
  REQUIRE(emu::kernel_launch(vote_kernel, dim3(1), dim3(32), 0, nullptr, din, ballot, o[0], o[1]) == cudaSuccess);
  auto b = download(ballot, 32);
  auto any = download(o[0], 32), all = download(o[1], 32);
  unsigned ref = 0;
  for (int l = 0; l < 32; ++l) ref |= (in[static_cast<std::size_t>(l)] > 0 ? 1u : 0u) << l;
  bool ref_any = std::any_of(in.begin(), in.end(), [](int v) { return v > 5; });
  bool ref_all = std::all_of(in.begin(), in.end(), [](int v) { return v >= 0; });
  for (int l = 0; l < 32; ++l) {
    CHECK(b[static_cast<std::size_t>(l)] == ref);
    CHECK((any[static_cast<std::size_t>(l)] != 0) == ref_any);
    CHECK((all[static_cast<std::size_t>(l)] != 0) == ref_all);
  }
  cudaFree(din);
  cudaFree(ballot);
  for (auto& p : o) cudaFree(p);
}

TEST_CASE("warp reductions (__reduce_*_sync) match a loop over the lanes", "[emu]") {
  // seeded values with negatives, so that the signed and unsigned orders differ
  std::vector<int> in(32);
  std::mt19937 rng(11);
  for (auto& v : in) v = static_cast<int>(rng() % 2001) - 1000;
  int* din = device_alloc<int>(32);
  int* dout = device_alloc<int>(9 * 32);
  upload(din, in);
  REQUIRE(emu::kernel_launch(reduce_kernel, dim3(1), dim3(32), 0, nullptr, din, dout) == cudaSuccess);
  auto got = download(dout, 9 * 32);
  for (int t = 0; t < 32; ++t) {
    int lo = t < 16 ? 0 : 16;
    long long add = 0;
    int smin = in[static_cast<std::size_t>(lo)], smax = smin;
    unsigned umin = static_cast<unsigned>(smin), umax = umin, uand = umin, uor = 0, uxor = 0;
    for (int l = lo; l < lo + 16; ++l) {
      int v = in[static_cast<std::size_t>(l)];
      auto u = static_cast<unsigned>(v);
      add += v, smin = std::min(smin, v), smax = std::max(smax, v);
      umin = std::min(umin, u), umax = std::max(umax, u), uand &= u, uor |= u, uxor ^= u;
    }
    auto at = [&](int k) { return got[static_cast<std::size_t>(k * 32 + t)]; };
    CHECK(at(0) == add);
    CHECK(at(1) == smin);
    CHECK(at(2) == smax);
    CHECK(static_cast<unsigned>(at(3)) == umin);
    CHECK(static_cast<unsigned>(at(4)) == umax);
    CHECK(static_cast<unsigned>(at(5)) == uand);
    CHECK(static_cast<unsigned>(at(6)) == uor);
    CHECK(static_cast<unsigned>(at(7)) == uxor);
    CHECK(at(8) == *std::min_element(in.begin(), in.end()));
  }
  cudaFree(din);
  cudaFree(dout);
}

TEST_CASE("atomics are device-wide", "[emu]") {
  int* c = device_alloc<int>(1);
  unsigned* bits = device_alloc<unsigned>(1);
  REQUIRE(cudaMemset(c, 0, sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMemset(bits, 0, sizeof(unsigned)) == cudaSuccess);
  // cudaMemset is asynchronous and on the legacy stream, which non-blocking streams do not wait for.
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  cudaStream_t s1, s2;
  REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(emu::kernel_launch(atomic_kernel, dim3(20), dim3(96), 0, s1, c, bits) == cudaSuccess);
  REQUIRE(emu::kernel_launch(atomic_kernel, dim3(20), dim3(96), 0, s2, c, bits) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download(c, 1)[0] == 2 * 20 * 96);
  CHECK(download(bits, 1)[0] == 0xffffffffu);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  cudaFree(c);
  cudaFree(bits);
}

TEST_CASE("divergence is an error naming the kernel, block and thread", "[emu][errors]") {
  int* out = device_alloc<int>(128);
  SECTION("threads at different __syncthreads") {
    REQUIRE(emu::kernel_launch(divergent_barrier_kernel, dim3(2), dim3(32), 0, nullptr, out) == cudaSuccess);
    expect_kernel_error({"divergent_barrier_kernel", "block (0,0,0)", "thread (16,0,0)", "another __syncthreads"});
  }
  SECTION("a thread exits while others wait") {
    REQUIRE(emu::kernel_launch(early_exit_kernel, dim3(1), dim3(8), 0, nullptr, out) == cudaSuccess);
    expect_kernel_error({"early_exit_kernel", "block (0,0,0)", "__syncthreads", "exited"});
  }
  SECTION("a shuffle mask names lanes that do not exist") {
    REQUIRE(emu::kernel_launch(bad_mask_kernel, dim3(1), dim3(16), 0, nullptr, out) == cudaSuccess);
    expect_kernel_error({"bad_mask_kernel", "thread (0,0,0)", "__shfl_sync", "0xffffffff", "do not exist"});
  }
  SECTION("a shuffle reads a lane outside its mask") {
    REQUIRE(emu::kernel_launch(outside_lane_kernel, dim3(1), dim3(32), 0, nullptr, out) == cudaSuccess);
    expect_kernel_error({"outside_lane_kernel", "reads lane 20", "not in the mask"});
  }
  SECTION("a shuffle names lanes that exited before it started") {
    REQUIRE(emu::kernel_launch(exited_before_shuffle_kernel, dim3(1), dim3(32), 0, nullptr, out) == cudaSuccess);
    expect_kernel_error({"exited_before_shuffle_kernel", "thread (4,0,0)", "__shfl_sync", "names lane 0, which has exited"});
  }
  SECTION("a lane exits while a shuffle that names it waits") {
    REQUIRE(emu::kernel_launch(exits_during_shuffle_kernel, dim3(1), dim3(32), 0, nullptr, out) == cudaSuccess);
    expect_kernel_error({"exits_during_shuffle_kernel", "thread (5,0,0)", "exited while lanes 0x0000001f of its warp wait at __shfl_sync"});
  }
  SECTION("a lane reaches __syncthreads while a shuffle that names it waits") {
    REQUIRE(emu::kernel_launch(barrier_during_shuffle_kernel, dim3(1), dim3(32), 0, nullptr, out) == cudaSuccess);
    expect_kernel_error({"barrier_during_shuffle_kernel", "thread (16,0,0)", "waits at __syncthreads",
                         "lanes 0x0000ffff of its warp wait at __shfl_sync"});
  }
  SECTION("a warpgroup operation starts after a thread of the warpgroup exited") {
    REQUIRE(emu::kernel_launch(exited_before_fence_kernel, dim3(1), dim3(128), 0, nullptr, out) == cudaSuccess);
    expect_kernel_error({"exited_before_fence_kernel", "wgmma.fence", "thread 96 of the warpgroup has exited"});
  }
  SECTION("a thread reaches __syncthreads while its warpgroup waits in a warpgroup operation") {
    REQUIRE(emu::kernel_launch(barrier_during_fence_kernel, dim3(1), dim3(128), 0, nullptr, out) == cudaSuccess);
    expect_kernel_error({"barrier_during_fence_kernel", "thread (64,0,0)", "waits at __syncthreads",
                         "while its warpgroup waits at wgmma.fence"});
  }
  SECTION("__trap") {
    REQUIRE(emu::kernel_launch(trap_kernel, dim3(1), dim3(32), 0, nullptr, out, 5) == cudaSuccess);
    expect_kernel_error({"trap_kernel", "thread (5,0,0)", "__trap"});
  }
  cudaFree(out);
}

TEST_CASE("a kernel error is sticky until reset", "[emu][errors]") {
  int* out = device_alloc<int>(32);
  REQUIRE(emu::kernel_launch(trap_kernel, dim3(1), dim3(32), 0, nullptr, out, 0) == cudaSuccess);
  std::vector<int> h(32);
  CHECK(cudaMemcpy(h.data(), out, 32 * sizeof(int), cudaMemcpyDeviceToHost) == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  emu::reset_errors();
  CHECK(cudaMemcpy(h.data(), out, 32 * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(out);
}

TEST_CASE("launch limits: block size, grid, dynamic shared memory", "[emu][errors]") {
  int* out = device_alloc<int>(1024);
  CHECK(emu::kernel_launch(trap_kernel, dim3(1), dim3(1025), 0, nullptr, out, -1) == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(emu::kernel_launch(trap_kernel, dim3(0), dim3(32), 0, nullptr, out, -1) == cudaErrorInvalidConfiguration);
  CHECK(emu::kernel_launch(trap_kernel, dim3(1, 65536), dim3(32), 0, nullptr, out, -1) == cudaErrorInvalidConfiguration);
  (void)cudaGetLastError();
  // 64 KB needs the attribute; 227 KB is the H100's limit.
  int const n = 16384;
  CHECK(emu::kernel_launch(dynamic_shared_kernel, dim3(1), dim3(64), n * sizeof(int), nullptr, out, n) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  REQUIRE(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536) == cudaSuccess);
  REQUIRE(emu::kernel_launch(dynamic_shared_kernel, dim3(1), dim3(64), n * sizeof(int), nullptr, out, n) == cudaSuccess);
  auto got = download(out, 64);
  CHECK(got[0] == n * (n - 1) / 2);
  CHECK(got[63] == n * (n - 1) / 2);
  CHECK(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232449) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  cudaFree(out);
}

TEST_CASE("memory: exact sizes, direction and range checks", "[emu][errors]") {
  int* d = device_alloc<int>(10);
  std::vector<int> h(11);
  CHECK(cudaMemcpy(h.data(), d, 11 * sizeof(int), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);  // past the end
  CHECK(cudaMemcpy(d, h.data(), 10 * sizeof(int), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);  // wrong direction
  CHECK(cudaMemset(d + 5, 0, 6 * sizeof(int)) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  CHECK(emu::is_device_range(d, 40));
  CHECK(!emu::is_device_range(d, 41));
  CHECK(!emu::is_device_range(h.data(), 4));
  REQUIRE(cudaFree(d) == cudaSuccess);
  CHECK(cudaFree(d) == cudaErrorInvalidValue);  // double free
  (void)cudaGetLastError();
}

TEST_CASE("streams: events order work across streams; the legacy stream waits for blocking streams", "[emu][streams]") {
  int const n = 4096;
  int* a = device_alloc<int>(n);
  int* b = device_alloc<int>(n);
  cudaStream_t s1, s2;
  REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t e;
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  for (int round = 0; round < 5; ++round) {
    REQUIRE(emu::kernel_launch(slow_fill_kernel, dim3(1), dim3(64), 0, s1, a, n, round) == cudaSuccess);
    REQUIRE(cudaEventRecord(e, s1) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(s2, e, 0) == cudaSuccess);
    REQUIRE(emu::kernel_launch(add_kernel, dim3(1), dim3(64), 0, s2, a, b, n, 100) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s2) == cudaSuccess);
    auto got = download(b, n);
    REQUIRE(std::all_of(got.begin(), got.end(), [&](int v) { return v == round + 100; }));
  }
  // A blocking stream's kernel, then a synchronous copy on the legacy stream: ordered implicitly.
  cudaStream_t blocking;
  REQUIRE(cudaStreamCreate(&blocking) == cudaSuccess);
  REQUIRE(emu::kernel_launch(slow_fill_kernel, dim3(1), dim3(64), 0, blocking, a, n, 42) == cudaSuccess);
  auto got = download(a, n);
  CHECK(std::all_of(got.begin(), got.end(), [](int v) { return v == 42; }));
  // Timing events.
  cudaEvent_t t0, t1;
  REQUIRE(cudaEventCreate(&t0) == cudaSuccess);
  REQUIRE(cudaEventCreate(&t1) == cudaSuccess);
  REQUIRE(cudaEventRecord(t0, s1) == cudaSuccess);
  REQUIRE(emu::kernel_launch(slow_fill_kernel, dim3(2), dim3(64), 0, s1, a, n, 1) == cudaSuccess);
  REQUIRE(cudaEventRecord(t1, s1) == cudaSuccess);
  REQUIRE(cudaEventSynchronize(t1) == cudaSuccess);
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess);
  CHECK(ms >= 0);
  CHECK(cudaEventElapsedTime(&ms, e, t1) == cudaErrorInvalidResourceHandle);  // no timing on e
  (void)cudaGetLastError();
  for (auto s : {s1, s2, blocking}) cudaStreamDestroy(s);
  for (auto ev : {e, t0, t1}) cudaEventDestroy(ev);
  cudaFree(a);
  cudaFree(b);
}

TEST_CASE("host round trips are counted: each blocking call and each device-to-host copy", "[emu][streams]") {
  // Tests of "a pass adds no host synchronisation" rest on these counters; each call below is
  // counted exactly once, and the calls that neither block nor read device memory are not.
  int const n = 256;
  int* d = device_alloc<int>(n);
  std::vector<int> h(n, 1);
  int* pinned = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), n * sizeof(int)) == cudaSuccess);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t e;
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  auto const before = emu::counters();
  auto delta = [&] {
    auto now = emu::counters();
    return std::pair{now.host_syncs - before.host_syncs, now.device_to_host - before.device_to_host};
  };
  // Neither blocks nor reads the device: host-to-device and device-to-device copies, a memset, a
  // launch, an event record, the non-blocking queries.
  REQUIRE(cudaMemcpyAsync(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice, s) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(d, d + n / 2, n / 2 * sizeof(int), cudaMemcpyDeviceToDevice, s) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(d, 0, n * sizeof(int), s) == cudaSuccess);
  REQUIRE(emu::kernel_launch(slow_fill_kernel, dim3(1), dim3(64), 0, s, d, n, 3) == cudaSuccess);
  REQUIRE(cudaEventRecord(e, s) == cudaSuccess);
  (void)cudaStreamQuery(s);
  (void)cudaEventQuery(e);
  CHECK(delta() == std::pair<std::uint64_t, std::uint64_t>{0, 0});
  // One each.
  REQUIRE(cudaMemcpyAsync(pinned, d, n * sizeof(int), cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(delta() == std::pair<std::uint64_t, std::uint64_t>{0, 1});
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(delta() == std::pair<std::uint64_t, std::uint64_t>{1, 1});
  REQUIRE(cudaEventSynchronize(e) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(delta() == std::pair<std::uint64_t, std::uint64_t>{3, 1});
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDefault) == cudaSuccess);  // blocks and reads
  CHECK(delta() == std::pair<std::uint64_t, std::uint64_t>{4, 2});
  REQUIRE(cudaMemcpy(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);  // blocks only
  CHECK(delta() == std::pair<std::uint64_t, std::uint64_t>{5, 2});
  CHECK(pinned[0] == 3);
  CHECK(h[n - 1] == 3);
  cudaEventDestroy(e);
  cudaStreamDestroy(s);
  cudaFreeHost(pinned);
  cudaFree(d);
}

TEST_CASE("graphs: capture with a fork and join, replay bitwise, capture rules", "[emu][graphs]") {
  int const n = 1000;
  int* a = device_alloc<int>(n);
  int* b = device_alloc<int>(n);
  int* c = device_alloc<int>(n);
  cudaStream_t s, side;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t fork, join;
  REQUIRE(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&join, cudaEventDisableTiming) == cudaSuccess);

  auto record_work = [&](int seed) {
    REQUIRE(emu::kernel_launch(slow_fill_kernel, dim3(1), dim3(64), 0, s, a, n, seed) == cudaSuccess);
    REQUIRE(cudaEventRecord(fork, s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(side, fork, 0) == cudaSuccess);
    REQUIRE(emu::kernel_launch(add_kernel, dim3(1), dim3(64), 0, side, a, b, n, 1) == cudaSuccess);
    REQUIRE(emu::kernel_launch(add_kernel, dim3(1), dim3(64), 0, s, a, c, n, 2) == cudaSuccess);
    REQUIRE(cudaEventRecord(join, side) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(s, join, 0) == cudaSuccess);
    REQUIRE(emu::kernel_launch(add_kernel, dim3(1), dim3(64), 0, s, b, a, n, 10) == cudaSuccess);
  };
  record_work(5);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  auto eager_a = download(a, n), eager_c = download(c, n);

  cudaStreamCaptureStatus st;
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  REQUIRE(cudaStreamIsCapturing(s, &st) == cudaSuccess);
  CHECK(st == cudaStreamCaptureStatusActive);
  record_work(5);
  cudaGraph_t g = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
  REQUIRE(cudaStreamIsCapturing(s, &st) == cudaSuccess);
  CHECK(st == cudaStreamCaptureStatusNone);
  std::size_t nodes = 0;
  REQUIRE(cudaGraphGetNodes(g, nullptr, &nodes) == cudaSuccess);
  CHECK(nodes == 4);  // kernels; events and waits are edges
  cudaGraphExec_t x;
  REQUIRE(cudaGraphInstantiate(&x, g, 0) == cudaSuccess);
  for (int rep = 0; rep < 3; ++rep) {
    REQUIRE(cudaMemset(a, 0, n * sizeof(int)) == cudaSuccess);
    REQUIRE(cudaMemset(c, 0, n * sizeof(int)) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaGraphLaunch(x, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(download(a, n) == eager_a);
    CHECK(download(c, n) == eager_c);
  }
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);

  SECTION("a forked stream that is not joined back") {
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(cudaEventRecord(fork, s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(side, fork, 0) == cudaSuccess);
    REQUIRE(emu::kernel_launch(add_kernel, dim3(1), dim3(64), 0, side, a, b, n, 1) == cudaSuccess);
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureUnjoined);
    CHECK(g == nullptr);
  }
  SECTION("cudaMalloc during a global-mode capture invalidates it") {
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    int* p = nullptr;
    std::thread other([&] { CHECK(cudaMalloc(&p, 16) == cudaErrorStreamCaptureUnsupported); });
    other.join();
    REQUIRE(cudaStreamIsCapturing(s, &st) == cudaSuccess);
    CHECK(st == cudaStreamCaptureStatusInvalidated);
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
  }
  SECTION("thread-local mode: another thread may allocate") {
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    int* p = nullptr;
    std::thread other([&] { CHECK(cudaMalloc(&p, 16) == cudaSuccess); });
    other.join();
    CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
    cudaFree(p);
  }
  SECTION("the legacy stream while a blocking stream captures") {
    cudaStream_t blocking;
    REQUIRE(cudaStreamCreate(&blocking) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(cudaStreamIsCapturing(nullptr, &st) == cudaErrorStreamCaptureImplicit);
    CHECK(cudaMemsetAsync(a, 0, 4, nullptr) == cudaErrorStreamCaptureImplicit);
    CHECK(cudaStreamEndCapture(blocking, &g) == cudaErrorStreamCaptureInvalidated);
    cudaStreamDestroy(blocking);
  }
  (void)cudaGetLastError();
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(s);
  cudaStreamDestroy(side);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
}
