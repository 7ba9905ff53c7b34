#pragma once
// Support for the GPU tests (label `cuda`): skip without a device, device buffers, seeded data.
//
// A test program that includes this header exits with code 77 before Catch2 starts when no CUDA
// device can be used (cudaGetDeviceCount fails or reports none); CTest reports that as skipped
// (SKIP_RETURN_CODE 77, set by moe_add_test for the `cuda` label).

#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "moe/kernels/cuda_common.cuh"
#include "sanitized.hpp"

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

/// Whether the machine has `n` devices, for a case with one NCCL rank per device; if not, a warning
/// says the case is skipped.
inline bool has_devices(int n) {
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  if (devices >= n) return true;
  WARN("needs " << n << " devices; skipped");
  return false;
}

/// Owning device buffer of n elements of T: the library's DeviceArray plus test conveniences
/// (construct from host data, download, poison, byte view).
template <class T>
class Device : public kernels::cuda::DeviceArray<T> {
  using Base = kernels::cuda::DeviceArray<T>;

public:
  Device() = default;
  explicit Device(std::size_t n) : Base(n) {}
  explicit Device(std::vector<T> const& host) : Base(host.size()) { upload(host); }
  void upload(std::vector<T> const& host) { Base::upload(host.data(), host.size()); }
  [[nodiscard]] std::vector<T> download(std::size_t n) const {
    std::vector<T> out(n);
    kernels::cuda::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    kernels::cuda::check_cuda(cudaMemcpy(out.data(), this->get(), n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return out;
  }
  [[nodiscard]] std::vector<T> download() const { return download(this->size()); }
  /// Fills every byte with 0xff: NaN for float and bf16, -1 for integers (poisoned outputs).
  void poison() {
    kernels::cuda::check_cuda(cudaMemset(this->get(), 0xff, this->size() * sizeof(T)), "cudaMemset (poison)");
  }
  [[nodiscard]] std::span<std::byte> bytes() const {
    return {reinterpret_cast<std::byte*>(this->get()), this->size() * sizeof(T)};
  }
};

/// Owning CUDA stream, destroyed when it leaves scope (also when a REQUIRE throws). Converts to
/// cudaStream_t wherever one is taken.
class Stream {
public:
  Stream() { kernels::cuda::check_cuda(cudaStreamCreate(&stream_), "cudaStreamCreate"); }
  Stream(Stream const&) = delete;
  Stream& operator=(Stream const&) = delete;
  ~Stream() { cudaStreamDestroy(stream_); }
  operator cudaStream_t() const { return stream_; }  // NOLINT(google-explicit-constructor): a handle
  void synchronize(char const* what) const { kernels::cuda::check_cuda(cudaStreamSynchronize(stream_), what); }

private:
  cudaStream_t stream_ = nullptr;
};

/// The work `enqueue()` puts on `stream`, captured into a graph and instantiated; launch() replays
/// it. Graph and executable are destroyed with the object. If `enqueue` throws, the capture is
/// ended (and its graph dropped) before the exception leaves, so the stream is usable again.
class CapturedGraph {
public:
  template <class Enqueue>
  CapturedGraph(cudaStream_t stream, Enqueue&& enqueue, cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal) {
    using kernels::cuda::check_cuda;
    check_cuda(cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture");
    try {
      enqueue();
    } catch (...) {
      cudaGraph_t dropped = nullptr;
      if (cudaStreamEndCapture(stream, &dropped) == cudaSuccess && dropped != nullptr) cudaGraphDestroy(dropped);
      throw;
    }
    check_cuda(cudaStreamEndCapture(stream, &graph_), "cudaStreamEndCapture");
    if (cudaError_t r = cudaGraphInstantiate(&exec_, graph_, 0); r != cudaSuccess) {
      cudaGraphDestroy(graph_);
      check_cuda(r, "cudaGraphInstantiate");
    }
  }
  CapturedGraph(CapturedGraph const&) = delete;
  CapturedGraph& operator=(CapturedGraph const&) = delete;
  ~CapturedGraph() {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  void launch(cudaStream_t stream) const {
    kernels::cuda::check_cuda(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
  }

private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

/// Calls `enqueue` while `stream` is being captured into a CUDA graph (this thread's capture) and
/// returns the message of the moe::Error it threw, "" if it threw none. The capture is ended and
/// whatever it recorded dropped either way.
template <class Enqueue>
std::string error_under_capture(cudaStream_t stream, Enqueue&& enqueue) {
  using kernels::cuda::check_cuda;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  std::string what;
  try {
    enqueue();
  } catch (moe::Error const& e) {
    what = e.what();
  }
  cudaGraph_t graph = nullptr;
  cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (what.empty()) check_cuda(ended, "cudaStreamEndCapture");
  (void)cudaGetLastError();  // an invalidated capture's error is not the next call's
  return what;
}

}  // namespace moe::test
