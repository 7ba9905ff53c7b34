#pragma once
// What the five programs of examples/extending/ share: one reduced OLMoE-shaped layer (64 experts,
// top-8, hidden 64, expert width 32, fp32), seeded weights and tokens, the single-process reference
// (moe::reference_forward, include/moe/layer/reference.hpp) over all tokens, and one run of a
// moe::Layer on `Ranks` in-process ranks (threads), each holding only the experts it serves.
// Nothing here is a policy: each program defines its own in its own file, or (the router and the
// replica policy, which device.cu runs on the device path too) in a header of its own
// (docs/extending.md).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <type_traits>
#include <vector>

#include "moe/moe.hpp"

namespace extending {

using Model = moe::models::Reduced<moe::models::OLMoE_1B_7B, 64, 32, moe::DType::f32>;
inline constexpr moe::ShapeSpec shape = Model::spec;

/// The global batch of one run, its reference output and routes, and the layer's output.
struct Run {
  int ranks = 0, tokens_per_rank = 0;
  std::vector<float> x, reference, y;
  std::vector<int> ids;                 ///< reference routes: (token, slot) -> expert
  std::vector<moe::LayerStats> stats;   ///< per rank
  /// max |y - reference| / max |reference|
  [[nodiscard]] double relative_error() const {
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      diff = std::max(diff, std::abs(double(y[i]) - double(reference[i])));
      scale = std::max(scale, std::abs(double(reference[i])));
    }
    return diff / scale;
  }
  /// The rank that holds token t (rank r has tokens [r * tokens_per_rank, (r + 1) * tokens_per_rank)).
  [[nodiscard]] int source(int t) const { return t / tokens_per_rank; }
};

/// The seed of every program's layer weights (moe::RandomLayerWeights<float>(shape, weight_seed)).
inline constexpr std::uint64_t weight_seed = 11;

/// `total` tokens of `shape.hidden` values, seeded and standard normal: the same in every program.
inline std::vector<float> seeded_tokens(int total) {
  std::vector<float> x(static_cast<std::size_t>(total) * static_cast<std::size_t>(shape.hidden));
  std::mt19937_64 rng(12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = normal(rng);
  return x;
}

/// Runs Layer<Model, Router, Placement, Replicas, Schedule, Comm> on `Ranks` in-process ranks, where
/// Comm is what `wrap(InProcess<Ranks>&)` returns a reference to (the in-process collective itself
/// by default), and the reference with the same Router on the whole batch.
template <class Router, class Placement, class Replicas, class Schedule, int Ranks, class Wrap>
Run run_layer(Placement const& placement, Replicas const& replicas, int tokens_per_rank, Wrap&& wrap) {
  auto h = static_cast<std::size_t>(shape.hidden);
  Run r;
  r.ranks = Ranks;
  r.tokens_per_rank = tokens_per_rank;
  int total = Ranks * tokens_per_rank;
  moe::RandomLayerWeights<float> weights(shape, weight_seed);
  r.x = seeded_tokens(total);
  r.reference.resize(r.x.size());
  r.y.resize(r.x.size());
  r.ids.resize(static_cast<std::size_t>(total) * static_cast<std::size_t>(shape.top_k));
  std::vector<float> gate(r.ids.size());
  moe::reference_forward<Router>(shape, weights.view(), total, r.x.data(), r.reference.data(), r.ids, gate);

  r.stats.resize(Ranks);
  moe::collective::run_in_process<Ranks>([&](moe::collective::InProcess<Ranks>& inner) {
    auto& comm = wrap(inner);
    using Comm = std::remove_reference_t<decltype(comm)>;
    using Layer = moe::Layer<Model, Router, Placement, Replicas, Schedule, Comm>;
    int rank = comm.rank();
    // This rank keeps the weights of the experts it serves, as a serving rank would.
    auto mine = weights.experts_where([&](int e) { return replicas.holds(e, placement.rank_of(e), rank); });
    auto view = weights.view();
    view.experts = mine;
    Layer layer(comm, placement, replicas, view, {.max_tokens = tokens_per_rank});
    std::vector<std::byte> workspace(layer.workspace_size());
    std::size_t first = static_cast<std::size_t>(rank) * static_cast<std::size_t>(tokens_per_rank) * h;
    typename Layer::Arguments a{.tokens = tokens_per_rank, .x = r.x.data() + first, .y = r.y.data() + first,
                                .first_token = static_cast<long long>(rank) * tokens_per_rank};
    layer.run(a, workspace);
    r.stats[static_cast<std::size_t>(rank)] = layer.stats();
  });
  return r;
}

template <class Router, class Placement, class Replicas, class Schedule, int Ranks>
Run run_layer(Placement const& placement, Replicas const& replicas, int tokens_per_rank) {
  return run_layer<Router, Placement, Replicas, Schedule, Ranks>(
      placement, replicas, tokens_per_rank, [](moe::collective::InProcess<Ranks>& c) -> auto& { return c; });
}

/// Prints "<what>: ok" or "<what>: FAILED" and returns whether `ok`.
inline bool expect(bool ok, char const* what) {
  std::printf("%s: %s\n", what, ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace extending
