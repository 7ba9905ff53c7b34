#pragma once
// Shared pieces of the CUDA kernels (nvcc only): error checks that throw moe::Error, storage-type
// conversions on the device (float and moe::bf16, which is bit-compatible with __nv_bfloat16), and
// 16-byte vector helpers.
//
// Storage rule, identical to the host reference (kernels/host.hpp): values are stored as float or
// bf16, arithmetic is fp32, and a conversion to bf16 rounds to nearest, ties to even.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "moe/config.hpp"
#include "moe/core/bf16.hpp"

/// Dynamic shared memory of a kernel: `MOE_EXTERN_SHARED(unsigned char, smem);` declares `smem` as
/// the launch's dynamic shared-memory buffer (`extern __shared__ unsigned char smem[];` under nvcc).
#if defined(MOE_CUDA_EMULATOR)
#define MOE_EXTERN_SHARED(type, name) MOE_EMU_EXTERN_SHARED(type, name)
#else
#define MOE_EXTERN_SHARED(type, name) extern __shared__ type name[]
#endif

namespace moe::kernels::cuda {

/// Throws moe::Error naming the CUDA call and the runtime's message.
/// A failed call's error is also the runtime's "last error" of this thread until cudaGetLastError
/// reads it: it is read here, so that a caller who catches this exception (a failed allocation
/// turned into a rank's vote, say) does not see it again from the next check_launch, reported as
/// a launch failure of an unrelated kernel on this rank alone. Sticky errors (a device fault) stay.
inline void check_cuda(cudaError_t r, char const* what) {
  if (r == cudaSuccess) return;
  (void)cudaGetLastError();
  fail(what, " failed: ", cudaGetErrorString(r), " (cudaError ", static_cast<int>(r), ")");
}

/// Checks that the last kernel launch was accepted (launch errors only; never synchronises).
inline void check_launch(char const* kernel) { check_cuda(cudaGetLastError(), kernel); }

/// Blocks needed to cover n items with `per` items per block (0 when n is 0).
constexpr long long blocks_for(long long n, long long per) { return (n + per - 1) / per; }

/// Every kernel launch of the library: `kernel<<<grid, block, shared_bytes, stream>>>(args...)`
/// under nvcc; in the project's tests built for the CPU emulator (tests/emu, MOE_CUDA_EMULATOR) the
/// emulator's launch, which checks the configuration as the driver does and runs the threads as
/// fibers. Launch errors are reported as by `<<<>>>`: through cudaGetLastError (check_launch).
template <class... P, class... A>
inline void launch(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream,
                   A&&... args) {
#if defined(MOE_CUDA_EMULATOR)
  (void)::emu::kernel_launch(kernel, grid, block, shared_bytes, stream, std::forward<A>(args)...);
#else
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<A>(args)...);
#endif
}

// ---------------------------------------------------------------------------------------------
// Storage conversions on the device.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float load_float(float v) { return v; }
__device__ __forceinline__ float load_float(moe::bf16 v) { return __uint_as_float(static_cast<unsigned>(v.bits) << 16); }

template <class T>
__device__ __forceinline__ T store_as(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    moe::bf16 out;
    out.bits = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    return out;
  }
}

/// SiLU in fp32, the same formula as the host reference.
__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

/// Elements of T in one 16-byte vector.
template <class T>
inline constexpr int vec_elems = 16 / static_cast<int>(sizeof(T));

/// Unpacks a 16-byte vector of T into fp32 values.
template <class T>
__device__ __forceinline__ void unpack(uint4 v, float (&out)[vec_elems<T>]) {
  if constexpr (std::is_same_v<T, float>) {
    out[0] = __uint_as_float(v.x);
    out[1] = __uint_as_float(v.y);
    out[2] = __uint_as_float(v.z);
    out[3] = __uint_as_float(v.w);
  } else {
    unsigned const w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
}

/// Packs fp32 values into a 16-byte vector of T (rounding to nearest even for bf16).
template <class T>
__device__ __forceinline__ uint4 pack(float const (&in)[vec_elems<T>]) {
  if constexpr (std::is_same_v<T, float>) {
    return make_uint4(__float_as_uint(in[0]), __float_as_uint(in[1]), __float_as_uint(in[2]), __float_as_uint(in[3]));
  } else {
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      unsigned lo = __bfloat16_as_ushort(__float2bfloat16_rn(in[2 * i]));
      unsigned hi = __bfloat16_as_ushort(__float2bfloat16_rn(in[2 * i + 1]));
      w[i] = lo | (hi << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

/// A device allocation owned by a host object (small tables the layer uploads once).
template <class T>
class DeviceArray {
public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t n) : n_(n) {
    if (n) check_cuda(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMalloc");
  }
  DeviceArray(DeviceArray const&) = delete;
  DeviceArray& operator=(DeviceArray const&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceArray() {
    if (p_) cudaFree(p_);
  }
  /// Synchronous upload (construction time only, never on the forward path).
  void upload(T const* host, std::size_t n) {
    check(n <= n_, "DeviceArray::upload: ", n, " elements into ", n_);
    if (n) check_cuda(cudaMemcpy(p_, host, n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy (upload)");
  }
  [[nodiscard]] T* get() const { return p_; }
  [[nodiscard]] std::size_t size() const { return n_; }

private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Unique ownership of a CUDA runtime or library handle (a stream, an event, a cuBLAS handle),
/// released with `Destroy` when its owner goes, so that a constructor that throws after creating
/// some of its handles releases them (its fully built members are destroyed).
template <class H, auto Destroy>
class Owned {
public:
  Owned() = default;
  explicit Owned(H h) : h_(h) {}
  Owned(Owned const&) = delete;
  Owned& operator=(Owned const&) = delete;
  Owned(Owned&& o) noexcept : h_(o.h_) { o.h_ = H{}; }
  Owned& operator=(Owned&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  ~Owned() {
    if (h_) (void)Destroy(h_);
  }
  [[nodiscard]] H get() const { return h_; }
  explicit operator bool() const { return h_ != H{}; }

private:
  H h_{};
};

using OwnedStream = Owned<cudaStream_t, &cudaStreamDestroy>;
using OwnedEvent = Owned<cudaEvent_t, &cudaEventDestroy>;

/// A new stream (non-blocking by default), owned.
inline OwnedStream make_stream(unsigned flags = cudaStreamNonBlocking) {
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, flags), "cudaStreamCreateWithFlags");
  return OwnedStream(s);
}

/// A new event (without timing by default), owned.
inline OwnedEvent make_event(unsigned flags = cudaEventDisableTiming) {
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreateWithFlags(&e, flags), "cudaEventCreate");
  return OwnedEvent(e);
}

/// Page-locked host memory of n elements of T (cudaMallocHost), owned.
template <class T>
class PinnedArray {
public:
  PinnedArray() = default;
  explicit PinnedArray(std::size_t n) {
    if (n) check_cuda(cudaMallocHost(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMallocHost");
  }
  PinnedArray(PinnedArray const&) = delete;
  PinnedArray& operator=(PinnedArray const&) = delete;
  PinnedArray(PinnedArray&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  PinnedArray& operator=(PinnedArray&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~PinnedArray() {
    if (p_) (void)cudaFreeHost(p_);
  }
  [[nodiscard]] T* get() const { return p_; }

private:
  T* p_ = nullptr;
};

}  // namespace moe::kernels::cuda
