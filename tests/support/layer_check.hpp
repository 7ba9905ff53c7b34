#pragma once
// Shared checks of the expert-parallel Layer against the single-process reference. Every rank
// builds the same seeded global batch and weights, runs the reference on all tokens, runs the layer
// on its own slice and compares. The expected byte counts are computed here from the reference
// routes and the tables, independently of the layer's own bookkeeping.

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "moe/moe.hpp"
#include "textbook.hpp"

namespace moe::test {

/// max |a - b| / max |b| over all elements (normwise relative error).
template <class T>
double max_relative_error(std::vector<T> const& a, std::vector<T> const& b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(to_float(a[i])) - double(to_float(b[i]))));
    scale = std::max(scale, std::abs(double(to_float(b[i]))));
  }
  return scale > 0 ? diff / scale : diff;
}

template <class T>
std::vector<T> random_tokens(int tokens, int hidden, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<T> x(static_cast<std::size_t>(tokens) * static_cast<std::size_t>(hidden));
  for (auto& v : x) v = from_float<T>(d(rng));
  return x;
}

struct Scenario {
  std::vector<int> tokens_per_rank;
  placement::Table placement;
  bool deduplicate = true;
  std::uint64_t seed = 1;
};

struct Outcome {
  double error = 0.0;                 // this rank's normwise relative error against reference_forward
  double vs_textbook = 0.0;           // ... and against the independent fp64 textbook layer
  LayerStats stats;
  std::size_t expected_dispatch = 0;  // analytic bytes this rank sends in the dispatch
  std::size_t expected_combine = 0;   // analytic bytes this rank sends back in the combine
  std::size_t without_dedup = 0;      // bytes one copy per (token, remote expert) would take
  std::vector<int> source;            // per global token: its rank
  std::vector<int> ids;               // per global (token, slot): the reference's expert
  std::vector<int> dest;              // per global (token, slot): the rank expected to serve it
};

/// Runs one scenario on this rank. Model must be f32 or bf16; Router fits it.
template <class Model, class Router, class Replicas, class Comm>
Outcome run_scenario(Comm& comm, Scenario const& sc, Replicas replicas) {
  using Lyr = Layer<Model, Router, placement::Table, Replicas, schedule::Sequential, Comm>;
  using T = typename Lyr::element_type;
  constexpr ShapeSpec s = Model::spec;
  int rank = comm.rank();
  auto const& counts = sc.tokens_per_rank;
  int total = std::accumulate(counts.begin(), counts.end(), 0);
  int first = std::accumulate(counts.begin(), counts.begin() + rank, 0);
  auto h = static_cast<std::size_t>(s.hidden), k = static_cast<std::size_t>(s.top_k);

  RandomLayerWeights<T> weights(s, sc.seed);
  auto x = random_tokens<T>(total, s.hidden, sc.seed + 1000);
  std::vector<T> ref(x.size());
  std::vector<int> ids(static_cast<std::size_t>(total) * k);
  std::vector<float> gw(ids.size());
  reference_forward<Router>(s, weights.view(), total, x.data(), ref.data(), ids, gw);

  // This rank holds only the experts it serves.
  std::vector<int> primary = sc.placement.ranks();
  auto local = weights.experts_where([&](int e) { return replicas.holds(e, primary[static_cast<std::size_t>(e)], rank); });
  auto view = weights.view();
  view.experts = local;
  int max_tokens = std::max(1, *std::max_element(counts.begin(), counts.end()));
  Lyr layer(comm, sc.placement, replicas, view, {.max_tokens = max_tokens, .deduplicate = sc.deduplicate});
  std::vector<std::byte> ws(layer.workspace_size());
  std::vector<T> y(static_cast<std::size_t>(counts[static_cast<std::size_t>(rank)]) * h);
  layer.run({.tokens = counts[static_cast<std::size_t>(rank)], .x = x.data() + static_cast<std::size_t>(first) * h,
             .y = y.data(), .first_token = first},
            ws);

  Outcome o;
  std::vector<T> mine(ref.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(first) * h),
                      ref.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(first + counts[static_cast<std::size_t>(rank)]) * h));
  o.error = max_relative_error(y, mine);
  auto book = textbook::forward(s, weights.view(), total, x.data());
  if (!y.empty())
    o.vs_textbook = textbook::relative_error(y.data(), book.data() + static_cast<std::size_t>(first) * h, y.size());
  o.stats = layer.stats();

  // The serving rank of every reference pair: the policy's rule; for a batch-aware policy, the
  // routes it chose for this batch, dealt as documented (the pairs of a (server, expert) group in
  // rank, then token order; each column takes the next routes()[c] of them), by this test's walk.
  for (int r = 0; r < static_cast<int>(counts.size()); ++r)
    o.source.insert(o.source.end(), static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]), r);
  o.ids = ids;
  o.dest.resize(ids.size());
  [[maybe_unused]] std::vector<long long> seen;
  for (int t = 0; t < total; ++t)
    for (std::size_t j = 0; j < k; ++j) {
      auto i = static_cast<std::size_t>(t) * k + j;
      int e = ids[i], src = o.source[static_cast<std::size_t>(t)];
      if constexpr (requires { layer.executor().replicas().take(); }) {
        // replication::BatchSplit: rank src's m-th pair of e goes to the copy whose running sum of
        // take (this rank's row, copies in list order) first exceeds m; one copy takes them all.
        auto const& pol = layer.executor().replicas();
        auto const& lists = pol.copy_lists();
        auto slots = static_cast<std::size_t>(lists.ranks.size());
        seen.resize(counts.size() * static_cast<std::size_t>(s.experts));
        long long m = seen[static_cast<std::size_t>(src) * static_cast<std::size_t>(s.experts) + static_cast<std::size_t>(e)]++;
        int lo = lists.first[static_cast<std::size_t>(e)], hi = lists.first[static_cast<std::size_t>(e) + 1];
        o.dest[i] = lists.ranks[static_cast<std::size_t>(lo)];
        long long acc = 0;
        for (int c = lo; hi - lo > 1 && c < hi; ++c) {
          acc += pol.take()[static_cast<std::size_t>(src) * slots + static_cast<std::size_t>(c)];
          if (m < acc) {
            o.dest[i] = lists.ranks[static_cast<std::size_t>(c)];
            break;
          }
        }
      } else if constexpr (replication::BatchPolicy<Replicas>) {
        auto const& p = layer.executor().replicas().problem();
        auto const& x = layer.executor().replicas().routes();
        seen.resize(p.n.size());
        auto se = p.at(p.server_of[static_cast<std::size_t>(src)], e);
        double point = static_cast<double>(seen[se]++) + 0.5, acc = 0;
        o.dest[i] = -1;
        for (int c = p.first[se]; c < p.first[se + 1] && o.dest[i] < 0; ++c)
          if (point < (acc += x[static_cast<std::size_t>(c)])) o.dest[i] = p.cols[static_cast<std::size_t>(c)].g;
      } else {
        o.dest[i] = replicas.choose(e, primary[static_cast<std::size_t>(e)], src, t);
      }
    }

  // Analytic volumes from those routes: one record per distinct remote serving rank.
  std::size_t rec = o.stats.record_bytes;
  for (int t = 0; t < total; ++t) {
    int src = o.source[static_cast<std::size_t>(t)];
    std::set<int> dests;
    for (std::size_t j = 0; j < k; ++j) {
      int d = o.dest[static_cast<std::size_t>(t) * k + j];
      dests.insert(d);
      if (src == rank && d != rank) o.without_dedup += rec;
    }
    for (int d : dests) {
      if (src == rank && d != rank) o.expected_dispatch += rec;
      if (d == rank && src != rank) o.expected_combine += h * sizeof(T);
    }
  }
  return o;
}

}  // namespace moe::test
