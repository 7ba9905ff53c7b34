#pragma once
// A copy of a layer's weights in device memory, for the device examples: the LayerWeights view the
// device paths take is the host one with device pointers. An engine already has its weights on the
// GPU and builds the view from them directly.
#include <cuda_runtime.h>

#include <vector>

#include "moe/core/weights.hpp"
#include "moe/kernels/cuda_common.cuh"

template <class T>
class DeviceWeights {
public:
  /// Copies `w` (host pointers) to the current device; experts absent from `w` stay absent.
  DeviceWeights(moe::ShapeSpec const& s, moe::LayerWeights<T> const& w) {
    auto h = static_cast<std::size_t>(s.hidden), e = static_cast<std::size_t>(s.experts);
    view_.router = upload(w.router, e * h);
    if (w.router_bias) view_.router_bias = upload(w.router_bias, e);
    auto copy_all = [&](std::span<moe::ExpertWeights<T> const> in, int ffn, std::vector<moe::ExpertWeights<T>>& out) {
      auto f = static_cast<std::size_t>(ffn);
      for (auto const& x : in)
        out.push_back(x.present() ? moe::ExpertWeights<T>{upload(x.gate, f * h), upload(x.up, f * h),
                                                          upload(x.down, h * f)}
                                  : moe::ExpertWeights<T>{});
    };
    copy_all(w.experts, s.expert_ffn, experts_);
    copy_all(w.shared, s.shared_ffn, shared_);
    view_.experts = experts_;
    view_.shared = shared_;
  }
  DeviceWeights(DeviceWeights const&) = delete;
  DeviceWeights& operator=(DeviceWeights const&) = delete;
  ~DeviceWeights() {
    for (void* p : owned_) (void)cudaFree(p);
  }

  [[nodiscard]] moe::LayerWeights<T> view() const { return view_; }

private:
  template <class U>
  U const* upload(U const* host, std::size_t n) {
    void* p = nullptr;
    moe::kernels::cuda::check_cuda(cudaMalloc(&p, n * sizeof(U)), "cudaMalloc");
    owned_.push_back(p);
    moe::kernels::cuda::check_cuda(cudaMemcpy(p, host, n * sizeof(U), cudaMemcpyHostToDevice), "cudaMemcpy");
    return static_cast<U const*>(p);
  }

  std::vector<void*> owned_;
  std::vector<moe::ExpertWeights<T>> experts_, shared_;
  moe::LayerWeights<T> view_;
};
