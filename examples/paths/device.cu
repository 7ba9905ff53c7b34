// The device execution path of moe::Layer on one GPU (collective::SingleGpu, schedule::Sequential): the
// gate GEMM, routing, dispatch, grouped expert GEMMs and combine as CUDA kernels on the caller's
// stream, with a caller-owned device workspace. With collective::Nccl instead of collective::SingleGpu the
// same type runs expert-parallel over GPUs. Checked against the host reference. Synthetic, seeded
// data: DeepSeek-V3 routing (256 experts, 8 groups, sigmoid, a shared expert) at hidden 64 / expert
// width 32, fp32, 64 tokens.
//
//   example_device
#include <cmath>
#include <cstdio>
#include <random>

#include "device_weights.cuh"
#include "moe/moe.hpp"

namespace kc = moe::kernels::cuda;
using Model = moe::models::Reduced<moe::models::DeepSeekV3, 64, 32, moe::DType::f32>;
using Router = moe::router::ForModel<Model>;
using Layer = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential,
                         moe::collective::SingleGpu>;
static_assert(Layer::path == moe::ExecutionPath::device);
constexpr int tokens = 64;

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("example_device: no CUDA device\n");
    return 1;
  }
  constexpr moe::ShapeSpec s = Model::spec;
  auto n = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(s.hidden);
  moe::RandomLayerWeights<float> weights(s, 1);
  std::vector<float> x(n), y(n), ref(n);
  std::mt19937_64 rng(2);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& v : x) v = d(rng);
  moe::reference_forward<Router>(s, weights.view(), tokens, x.data(), ref.data());

  DeviceWeights<float> dw(s, weights.view());
  float *dx = nullptr, *dy = nullptr;
  void* ws = nullptr;
  cudaStream_t stream = nullptr;
  kc::check_cuda(cudaMalloc(&dx, n * sizeof(float)), "cudaMalloc");
  kc::check_cuda(cudaMalloc(&dy, n * sizeof(float)), "cudaMalloc");
  kc::check_cuda(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  kc::check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  {
    moe::collective::SingleGpu gpu;
    Layer layer(gpu, moe::placement::Table::contiguous(s.experts, 1), {}, dw.view(), {.max_tokens = tokens});
    kc::check_cuda(cudaMalloc(&ws, layer.workspace_size()), "cudaMalloc");
    Layer::Arguments a{.tokens = tokens, .x = dx, .y = dy, .stream = stream};
    if (auto ok = layer.can_implement(a); !ok.ok) moe::fail(ok.message);
    layer.run(a, {static_cast<std::byte*>(ws), layer.workspace_size()});
    kc::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    std::printf("device path: %d tokens, %lld token-expert assignments, workspace %zu bytes\n", tokens,
                layer.stats().assignments, layer.workspace_size());
  }
  kc::check_cuda(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double(y[i]) - ref[i]));
    scale = std::max(scale, std::abs(double(ref[i])));
  }
  std::printf("max |layer - reference| / max |reference| = %.2e\n", diff / scale);
  (void)cudaFree(ws);
  (void)cudaFree(dx);
  (void)cudaFree(dy);
  (void)cudaStreamDestroy(stream);
  return diff / scale < 1e-4 ? 0 : 1;
}
