#pragma once
// Support for the GPU tests (label `cuda`): skip without a device, device buffers, seeded data.
//
// A test program that includes this header exits with code 77 before Catch2 starts when no CUDA
// device can be used (cudaGetDeviceCount fails or reports none); CTest reports that as skipped
// (SKIP_RETURN_CODE 77, set by moe_add_test for the `cuda` label).

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "moe/kernels/cuda_common.cuh"

namespace moe::test {

inline bool gpu_present() {
  int n = 0;
  cudaError_t r = cudaGetDeviceCount(&n);
  return r == cudaSuccess && n > 0;
}

inline int skip_without_gpu() {
  if (!gpu_present()) {
    std::fprintf(stderr, "no CUDA device: skipping (exit 77)\n");
    std::exit(77);
  }
  return 1;
}

// Runs during static initialisation, before Catch2's main.
inline int const gpu_gate = skip_without_gpu();

/// Owning device buffer of n elements of T (test-only convenience).
template <class T>
class Device {
public:
  Device() = default;
  explicit Device(std::size_t n) : n_(n) {
    if (n) kernels::cuda::check_cuda(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMalloc");
  }
  explicit Device(std::vector<T> const& host) : Device(host.size()) { upload(host); }
  Device(Device const&) = delete;
  Device& operator=(Device const&) = delete;
  Device(Device&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  Device& operator=(Device&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~Device() {
    if (p_) cudaFree(p_);
  }
  void upload(std::vector<T> const& host) {
    kernels::cuda::check_cuda(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  [[nodiscard]] std::vector<T> download(std::size_t n) const {
    std::vector<T> out(n);
    kernels::cuda::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    kernels::cuda::check_cuda(cudaMemcpy(out.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return out;
  }
  [[nodiscard]] std::vector<T> download() const { return download(n_); }
  /// Fills every byte with 0xff: NaN for float and bf16, -1 for integers (poisoned outputs).
  void poison() { kernels::cuda::check_cuda(cudaMemset(p_, 0xff, n_ * sizeof(T)), "cudaMemset (poison)"); }
  [[nodiscard]] T* get() const { return p_; }
  [[nodiscard]] std::size_t size() const { return n_; }
  [[nodiscard]] std::span<std::byte> bytes() const { return {reinterpret_cast<std::byte*>(p_), n_ * sizeof(T)}; }

private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace moe::test
