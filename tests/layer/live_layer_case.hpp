#pragma once
// Re-planning while serving (LayerOptions::live, moe/layer/live.hpp) on 4 ranks: OLMoE's routing
// shape (64 experts, top-8) at reduced width, with routing that drifts (seeded: each pass's tokens
// lean towards a few "hot" experts, and the hot set moves every 25 passes). Every pass is checked
// against the single-process reference on all tokens; the bytes the migrations send are checked
// against the plans the layer switched to (each (expert, rank) pair a plan adds is one expert's
// weights crossing ranks). Shared by the in-process and the MPI tests.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "layer_check.hpp"
#include "moe/layer/live.hpp"

namespace moe::test {

using LiveModel = models::Reduced<models::OLMoE_1B_7B, 32, 16, DType::f32>;
constexpr int live_ranks = 4;
constexpr int live_tokens = 8;  // per rank and pass

/// The first plan: expert e on rank e % 4, experts 0-15 also on rank (e + 1) % 4 (20 per rank).
inline std::vector<std::vector<int>> live_copies() {
  std::vector<std::vector<int>> c(64);
  for (int e = 0; e < 64; ++e) {
    c[static_cast<std::size_t>(e)] = {e % 4};
    if (e < 16) c[static_cast<std::size_t>(e)].push_back((e + 1) % 4);
    std::sort(c[static_cast<std::size_t>(e)].begin(), c[static_cast<std::size_t>(e)].end());
  }
  return c;
}
inline std::vector<int> live_primary() {
  std::vector<int> p(64);
  for (int e = 0; e < 64; ++e) p[static_cast<std::size_t>(e)] = e % 4;
  return p;
}

/// The global batch of pass p (all ranks' tokens, seeded): N(0, 1) plus 3x the router row of one
/// of the pass's hot experts (6 of them, moving by 7 every 25 passes), so the hot experts are chosen
/// far more often than the rest.
inline std::vector<float> live_batch(RandomLayerWeights<float> const& w, int pass) {
  constexpr int h = LiveModel::spec.hidden, n = live_ranks * live_tokens;
  auto x = random_tokens<float>(n, h, 5000 + static_cast<std::uint64_t>(pass));
  auto view = w.view();
  for (int t = 0; t < n; ++t) {
    int hot = ((pass / 25) * 7 + t % 6) % 64;
    for (int i = 0; i < h; ++i)
      x[static_cast<std::size_t>(t * h + i)] += 3.0f * static_cast<float>(h) *
                                                view.router[static_cast<std::size_t>(hot * h + i)];
  }
  return x;
}

/// (expert, rank) pairs a plan holds that the previous one did not.
inline long long added_copies(live::Plan const& from, live::Plan const& to) {
  long long n = 0;
  for (std::size_t e = 0; e < to.copies.size(); ++e)
    for (int r : to.copies[e]) n += std::find(from.copies[e].begin(), from.copies[e].end(), r) == from.copies[e].end();
  return n;
}

struct LiveRun {
  double worst_error = 0;       // over every pass
  long long bytes_sent = 0;     // migration bytes this rank sent
  long long plan_bytes = 0;     // bytes of plan layouts this rank sent (live.plan_rank)
  long long expected_bytes = 0;  // expert bytes of the copies the adopted plans added (all ranks)
  int adopted = 0;
  int changed = 0;              // adoptions after which layer.plan() differs from the plan before
  int changed_stat = 0;         // the layer's stats().plans_changed after the last pass
  int passes_moving = 0;        // passes during which a migration was under way
  bool window_counts_ok = true;  // the window's per-expert pairs equal the reference's routes
  std::vector<std::string> errors;  // what run() threw, per pass that threw
};

template <class Comm, class Replicas = replication::Table>
struct LiveHarness {
  using L = Layer<LiveModel, router::SoftmaxTopK, placement::Table, Replicas, schedule::Sequential, Comm>;
  static constexpr ShapeSpec s = LiveModel::spec;
  static constexpr auto h = static_cast<std::size_t>(s.hidden);

  Comm& comm;
  RandomLayerWeights<float> weights{s, 77};
  std::vector<ExpertWeights<float>> local;
  std::vector<float> arena;
  std::vector<std::byte> ws;
  L layer;

  LiveHarness(Comm& c, Replicas replicas, live::Options o)
      : comm(c),
        local(weights.experts_where([&](int e) { return replicas.holds(e, 0, c.rank()); })),
        layer(c, placement::Table(live_primary()), std::move(replicas), with_local(weights.view()),
              {.max_tokens = live_tokens, .live = o}) {
    arena.resize(layer.arena_elements());
    layer.attach_arena(arena);
    local.clear();  // the layer reads its experts from the arena now
    ws.resize(layer.workspace_size());
  }

  LayerWeights<float> with_local(LayerWeights<float> v) const {
    v.experts = local;
    return v;
  }

  /// One pass; returns the error against the reference, or -1 if run() threw (message kept).
  double pass(int p, LiveRun& out) {
    auto x = live_batch(weights, p);
    int n = live_ranks * live_tokens;
    std::vector<float> ref(x.size());
    std::vector<int> ids(static_cast<std::size_t>(n * s.top_k));
    std::vector<float> gw(ids.size());
    reference_forward<router::SoftmaxTopK>(s, weights.view(), n, x.data(), ref.data(), ids, gw);
    std::size_t first = static_cast<std::size_t>(comm.rank() * live_tokens) * h;
    std::vector<float> y(static_cast<std::size_t>(live_tokens) * h);
    try {
      layer.run({.tokens = live_tokens, .x = x.data() + first, .y = y.data(),
                 .first_token = comm.rank() * live_tokens},
                ws);
    } catch (Error const& e) {
      out.errors.emplace_back(e.what());
      return -1;
    }
    std::vector<float> mine(ref.begin() + static_cast<std::ptrdiff_t>(first),
                            ref.begin() + static_cast<std::ptrdiff_t>(first + y.size()));
    double err = max_relative_error(y, mine);
    out.worst_error = std::max(out.worst_error, err);
    out.bytes_sent += static_cast<long long>(layer.stats().migration_bytes);
    out.plan_bytes += static_cast<long long>(layer.stats().plan_bytes);
    // The window's newest pass: the pairs of each expert, as the reference routed them.
    auto const& w = layer.load_window();
    auto got = w.experts(w.size() - 1);
    std::vector<long long> want(static_cast<std::size_t>(s.experts), 0);
    for (int e : ids) ++want[static_cast<std::size_t>(e)];
    out.window_counts_ok = out.window_counts_ok && std::equal(got.begin(), got.end(), want.begin());
    return err;
  }

  /// `passes` passes; plans the layer switches to are compared with the one before.
  LiveRun serve(int first, int passes) {
    LiveRun out;
    live::Plan before = layer.plan();
    for (int p = first; p < first + passes; ++p) {
      out.passes_moving += layer.migrating();
      pass(p, out);
      if (layer.stats().plans_adopted > out.adopted) {
        live::Plan now = layer.plan();
        out.expected_bytes += added_copies(before, now) * static_cast<long long>(live::slot_bytes<float>(s));
        out.changed += now != before;  // plan() lists each expert's copies in rank order
        before = std::move(now);
        out.adopted = layer.stats().plans_adopted;
      }
    }
    out.changed_stat = layer.stats().plans_changed;
    return out;
  }
};

/// Replicas of the first plan.
inline replication::Table live_table() { return replication::Table(live_copies()); }
inline replication::BatchSplit live_split() {
  return replication::BatchSplit(live_copies(), std::vector<int>{0, 0, 1, 1});
}

}  // namespace moe::test
