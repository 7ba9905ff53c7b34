// The host execution path of moe::Layer: expert parallelism over 4 in-process ranks (threads) with
// schedule::Sequential. Each rank routes its own tokens, sends each token once to every rank that
// serves one of its experts, and gets the weighted partial sums back. The result is checked against
// the single-process reference. Synthetic, seeded data: Mixtral-8x7B routing at hidden 128 / expert
// width 64, fp32, 32 tokens per rank.
//
//   example_host
#include <cmath>
#include <cstdio>
#include <random>

#include "moe/moe.hpp"

using Model = moe::models::Reduced<moe::models::Mixtral8x7B, 128, 64, moe::DType::f32>;
using Router = moe::router::ForModel<Model>;
constexpr int ranks = 4, tokens = 32;
using Comm = moe::collective::InProcess<ranks>;
using Layer = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential, Comm>;
static_assert(Layer::path == moe::ExecutionPath::host);

int main() {
  constexpr moe::ShapeSpec s = Model::spec;
  auto h = static_cast<std::size_t>(s.hidden);
  moe::RandomLayerWeights<float> weights(s, 1);
  std::vector<float> x(ranks * tokens * h), y(x.size()), ref(x.size());
  std::mt19937_64 rng(2);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& v : x) v = d(rng);
  moe::reference_forward<Router>(s, weights.view(), ranks * tokens, x.data(), ref.data());

  auto placement = moe::placement::Table::contiguous(s.experts, ranks);  // 2 experts per rank
  std::vector<moe::LayerStats> stats(ranks);
  moe::collective::run_in_process<ranks>([&](Comm& comm) {
    Layer layer(comm, placement, {}, weights.view(), {.max_tokens = tokens});
    std::vector<std::byte> ws(layer.workspace_size());
    std::size_t first = static_cast<std::size_t>(comm.rank()) * tokens * h;
    Layer::Arguments a{.tokens = tokens, .x = x.data() + first, .y = y.data() + first,
                       .first_token = comm.rank() * tokens};
    if (auto ok = layer.can_implement(a); !ok.ok) moe::fail(ok.message);
    layer.run(a, ws);
    stats[static_cast<std::size_t>(comm.rank())] = layer.stats();
  });

  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    diff = std::max(diff, std::abs(double(y[i]) - ref[i]));
    scale = std::max(scale, std::abs(double(ref[i])));
  }
  std::printf("host path: %d ranks x %d tokens, rank 0 sent %lld records (%zu bytes) and kept %lld\n", ranks, tokens,
              stats[0].records_remote, stats[0].dispatch_bytes, stats[0].records_local);
  std::printf("max |layer - reference| / max |reference| = %.2e\n", diff / scale);
  return diff / scale < 1e-5 ? 0 : 1;
}
