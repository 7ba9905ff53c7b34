// Compile coverage of the CUDA headers: the whole device layer (and with it every kernel) is
// instantiated for full-size example models (DeepSeek-V3, Mixtral-8x7B, DeepSeek-V2, Kimi-K2) and
// for the reduced fp32 shapes the other GPU tests use; with NCCL, also the device disaggregated
// path (FinDEP, PPPipe). CI compiles this without a GPU; on a GPU the
// test also builds each full-size layer (with placeholder weight pointers that are never read) and
// checks its workspace query.

#include <catch2/catch.hpp>

#include "cuda_test_support.cuh"
#include "moe/layer/paths/device_disaggregated.cuh"
#include "moe/layer/paths/device.cuh"
#include "moe/moe.hpp"
#if defined(MOE_TEST_NCCL)
#include "moe/collective/nccl.hpp"
#endif

namespace moe {
using router::GroupLimitedTopK;
using router::SigmoidGroupTopK;
using router::SoftmaxTopK;
using MixtralSmallF32 = models::Reduced<models::Mixtral8x7B, 64, 96, DType::f32>;
using DeepSeekSmallF32 = models::Reduced<models::DeepSeekV3, 64, 32, DType::f32>;
using DeepSeekSmallBf16 = models::Reduced<models::DeepSeekV3, 64, 32, DType::bf16>;

template class Layer<models::DeepSeekV3, SigmoidGroupTopK, placement::Table, replication::None, schedule::Sequential, collective::SingleGpu>;
template class Layer<models::Mixtral8x7B, SoftmaxTopK, placement::Table, replication::None, schedule::Sequential, collective::SingleGpu>;
template class Layer<models::DeepSeekV2, GroupLimitedTopK, placement::Table, replication::Table, schedule::Sequential, collective::SingleGpu>;
template class Layer<models::KimiK2, SigmoidGroupTopK, placement::Table, replication::None, schedule::Sequential, collective::SingleGpu>;
template class Layer<MixtralSmallF32, SoftmaxTopK, placement::Table, replication::None, schedule::Sequential, collective::SingleGpu>;
template class Layer<DeepSeekSmallF32, SigmoidGroupTopK, placement::Table, replication::Table, schedule::Sequential, collective::SingleGpu>;
template class Layer<DeepSeekSmallBf16, SigmoidGroupTopK, placement::Table, replication::None, schedule::Sequential, collective::SingleGpu>;
#if defined(MOE_TEST_NCCL)
template class Layer<models::DeepSeekV3, SigmoidGroupTopK, placement::Table, replication::Table, schedule::Sequential, collective::Nccl>;
template class Layer<models::Mixtral8x7B, SoftmaxTopK, placement::Table, replication::None, schedule::Sequential, collective::Nccl>;
// The disaggregated layer on GPUs: FinDEP and PPPipe over NCCL point-to-point links.
template class Layer<models::DeepSeekV3, SigmoidGroupTopK, placement::Table, replication::None, schedule::FinDep,
                     collective::Nccl>;
template class Layer<models::Mixtral8x7B, SoftmaxTopK, placement::Table, replication::Table, schedule::PPPipe,
                     collective::Nccl>;
static_assert(Layer<models::DeepSeekV3, SigmoidGroupTopK, placement::Table, replication::Table, schedule::Sequential,
                    collective::Nccl>::path == ExecutionPath::device);
static_assert(Layer<models::DeepSeekV3, SigmoidGroupTopK, placement::Table, replication::Table, schedule::FinDep,
                    collective::Nccl>::path == ExecutionPath::device_disaggregated);
#endif
// The path follows the policies: a device communicator and schedule::Sequential give the device path.
static_assert(Layer<models::Mixtral8x7B, SoftmaxTopK, placement::Table, replication::None, schedule::Sequential,
                    collective::SingleGpu>::path == ExecutionPath::device);
}  // namespace moe

namespace {

/// Workspace bytes of a full-size single-GPU layer whose expert weights are placeholders.
template <class Model, class Router>
std::size_t workspace_of(int max_tokens) {
  using L = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential,
                       moe::collective::SingleGpu>;
  using T = typename L::element_type;
  constexpr moe::ShapeSpec s = Model::spec;
  alignas(16) static T placeholder[8];
  std::vector<moe::ExpertWeights<T>> experts(static_cast<std::size_t>(s.experts), {placeholder, placeholder, placeholder});
  std::vector<moe::ExpertWeights<T>> shared(static_cast<std::size_t>(s.shared_experts), {placeholder, placeholder, placeholder});
  moe::LayerWeights<T> w{placeholder, nullptr, experts, shared};
  moe::collective::SingleGpu gpu;
  L layer(gpu, moe::placement::Table::contiguous(s.experts, 1), {}, w, {.max_tokens = max_tokens});
  return layer.workspace_size();
}

template <class Model, class Router>
void check_workspace() {
  constexpr moe::ShapeSpec s = Model::spec;
  std::size_t decode = workspace_of<Model, Router>(128), prefill = workspace_of<Model, Router>(4096);
  INFO(Model::name << ": decode " << decode << " bytes, prefill " << prefill << " bytes");
  // The routed activations alone: tokens x top_k rows of the intermediate and of the expert output.
  std::size_t floor = 4096ull * s.top_k * (s.expert_ffn + s.hidden) * 2;
  CHECK(prefill > floor);
  CHECK(prefill > decode);
  CHECK(decode > 128ull * s.top_k * (s.expert_ffn + s.hidden) * 2);
}

}  // namespace

TEST_CASE("full-size layers report workspace sizes that cover their routed activations") {
  check_workspace<moe::models::DeepSeekV3, moe::SigmoidGroupTopK>();
  check_workspace<moe::models::Mixtral8x7B, moe::SoftmaxTopK>();
  check_workspace<moe::models::KimiK2, moe::SigmoidGroupTopK>();
}
