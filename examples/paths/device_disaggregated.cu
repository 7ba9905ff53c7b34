// The device disaggregated execution path of moe::Layer: FinDEP over collective::Nccl, one GPU per
// rank, with the attention group (AG) on GPU 0 and the expert group (EG) on GPUs 1 and 2. One host
// thread drives each GPU here; an engine would run one process per GPU and make the communicator
// with collective::nccl_from_mpi (moe/collective/nccl_mpi.hpp) instead, with the same layer code.
// The AG rank's output is checked against the host reference. Synthetic, seeded data: Mixtral-8x7B
// routing at hidden 64 / expert width 96, fp32, 24 tokens.
//
//   example_device_disaggregated          (needs 3 GPUs)
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>

#include "device_weights.cuh"
#include "moe/collective/nccl.hpp"
#include "moe/moe.hpp"

namespace kc = moe::kernels::cuda;
using Model = moe::models::Reduced<moe::models::Mixtral8x7B, 64, 96, moe::DType::f32>;
using Router = moe::router::ForModel<Model>;
using Layer = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, moe::schedule::FinDep,
                         moe::collective::Nccl>;
static_assert(Layer::path == moe::ExecutionPath::device_disaggregated);
constexpr int world = 3, ag = 1, tokens = 24;

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < world) {
    std::printf("example_device_disaggregated: needs %d CUDA devices, found %d\n", world, devices);
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

  // Routed expert e lives on EG index e mod 2; the schedule: AASS order, 2 micro-batches of 3 chunks.
  auto on_eg = moe::placement::Table::round_robin(s.experts, world - ag);
  moe::schedule::FinDep schedule{.ag = ag, .order = moe::schedule::Order::aass, .r1 = 2, .r2 = 3};
  auto id = moe::collective::Nccl::unique_id();
  std::vector<std::string> failed(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        kc::check_cuda(cudaSetDevice(rank), "cudaSetDevice");
        cudaStream_t stream = nullptr;
        kc::check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
        {
          auto comm = moe::collective::Nccl::create(rank, world, id, stream);
          DeviceWeights<float> dw(s, weights.view());  // every expert here; an EG rank needs only its own
          // The one-communicator constructor makes the E2A link's communicator (a collective call).
          Layer layer(comm, on_eg, {}, dw.view(), {.max_tokens = tokens, .schedule = schedule});
          void* ws = nullptr;
          float *dx = nullptr, *dy = nullptr;
          kc::check_cuda(cudaMalloc(&ws, layer.workspace_size()), "cudaMalloc");
          Layer::Arguments a{.tokens = tokens, .stream = stream};  // EG ranks: the AG rank's token count
          if (layer.is_attention_rank()) {
            kc::check_cuda(cudaMalloc(&dx, n * sizeof(float)), "cudaMalloc");
            kc::check_cuda(cudaMalloc(&dy, n * sizeof(float)), "cudaMalloc");
            kc::check_cuda(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
            a.x = dx;
            a.y = dy;
          }
          if (auto ok = layer.can_implement(a); !ok.ok) moe::fail(ok.message);
          layer.run(a, {static_cast<std::byte*>(ws), layer.workspace_size()});
          kc::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
          if (layer.is_attention_rank()) {
            kc::check_cuda(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
            std::printf("device disaggregated path: AG rank sent %zu bytes to the expert group\n",
                        layer.stats().dispatch_bytes);
          }
          (void)cudaFree(ws);
          (void)cudaFree(dx);
          (void)cudaFree(dy);
        }
        (void)cudaStreamDestroy(stream);
      } catch (std::exception const& e) {
        failed[static_cast<std::size_t>(rank)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r)
    if (!failed[static_cast<std::size_t>(r)].empty()) {
      std::printf("rank %d: %s\n", r, failed[static_cast<std::size_t>(r)].c_str());
      return 1;
    }
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double(y[i]) - ref[i]));
    scale = std::max(scale, std::abs(double(ref[i])));
  }
  std::printf("max |layer - reference| / max |reference| = %.2e\n", diff / scale);
  return diff / scale < 1e-4 ? 0 : 1;
}
