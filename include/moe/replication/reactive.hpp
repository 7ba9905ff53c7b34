#pragma once
// Replica policy `replication::Reactive`: the copy that serves a token is chosen per batch, from
// every rank's counts of that batch, so the routes follow each batch's drift from the loads a plan
// was made for (docs/planners.md, "Routing that reacts to each batch").
//
// Once a batch is routed, every rank counts its token-expert pairs per expert and the host layer
// gathers these counts from all ranks (one all-gather of ranks x experts int32). Every rank then
// runs the same deterministic rule on the same counts (plan_batch), and deals its own pairs in
// token order (dealt): the pairs of (server s, expert e) are ordered by rank, then by token, and
// copy c of e takes the next x(s, c) of them. Ranks need not agree for the result to be correct
// (any copy computes the same expert); they agree for the loads to be the ones the rule chose.
//
// The rule (greedy_routes) works on servers and the server-to-server links of the topology's
// traffic model: the pairs of single-copy experts go to their copy, then each server's pairs stay
// on its own copies as far as the per-GPU cap allows, then the other pairs of every (server,
// expert) group go one by one to the copy that least raises the busiest link on its dispatch or
// combine path. It ignores de-duplication and NVLink; the traffic model judges the result with both.
//
// Host layer only (moe::Layer with InProcess or Mpi): the CUDA and disaggregated layers reject it.
// The rule costs milliseconds per layer at DeepSeek-R1 / 256-GPU scale on one CPU core
// (benchmarks/planners/bench_traffic.cpp, BM_ReactiveRoutes), which the layer spends on every rank.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "moe/config.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/topology/traffic.hpp"

namespace moe::replication {

namespace reactive {

inline std::size_t ix(int i) { return static_cast<std::size_t>(i); }

/// Seconds per token vector on every server-to-server link of each ordered server pair (NIC and
/// fabric levels, equal-cost paths split as the traffic model splits them), once per cluster.
class ServerPaths {
 public:
  using Path = std::vector<std::pair<int, double>>;  ///< (link, seconds per pair)

  ServerPaths(topology::Topology const& topo, topology::TrafficModel const& model, double token_bytes)
      : S_(topo.servers()), links_(model.links()), first_gpu_(ix(S_), -1), path_(ix(S_) * ix(S_)) {
    for (int g = topo.gpus() - 1; g >= 0; --g) first_gpu_[ix(topo.server_of(g))] = g;
    for (int a = 0; a < S_; ++a)
      for (int b = 0; b < S_; ++b)
        if (a != b)
          for (auto [l, f] : model.shares(first_gpu_[ix(a)], first_gpu_[ix(b)]))
            if (model.link(l).level != topology::Level::nvlink)
              path_[ix(a) * ix(S_) + ix(b)].emplace_back(l, f * token_bytes / model.link(l).bandwidth);
  }
  [[nodiscard]] Path const& operator()(int from, int to) const { return path_[ix(from) * ix(S_) + ix(to)]; }
  [[nodiscard]] int links() const { return links_; }
  /// The GPU that stands for server s's tokens (its first).
  [[nodiscard]] int gpu_of(int s) const { return first_gpu_[ix(s)]; }

 private:
  int S_, links_;
  std::vector<int> first_gpu_;
  std::vector<Path> path_;
};

/// One layer of one batch: the pairs of every (source server, expert) and the copies that can take
/// them. Column c = (s, e, g): copy of e on GPU g serving server s's pairs of e. Only groups with
/// pairs have columns.
struct RoutingProblem {
  struct Column {
    int s, e, g, server;  ///< server = the server of GPU g
  };
  int S = 0, E = 0, G = 0;
  std::vector<std::vector<int>> copies;  ///< per expert, its GPUs
  std::vector<int> server_of;            ///< per GPU
  std::vector<double> n;                 ///< pairs per (s, e), s * E + e
  std::vector<Column> cols;              ///< the columns of (s, e) are first[s E + e] .. first[s E + e + 1]
  std::vector<int> first;
  std::vector<std::vector<int>> of_gpu;  ///< columns per GPU
  double mean = 0;                       ///< pairs per GPU

  /// No pairs yet: set n (S x E) and call build(), or use the batch constructor.
  RoutingProblem(topology::Topology const& topo, std::vector<std::vector<int>> copies_)
      : S(topo.servers()), E(static_cast<int>(copies_.size())), G(topo.gpus()), copies(std::move(copies_)),
        n(ix(S) * ix(E), 0.0) {
    for (int e = 0; e < E; ++e) {
      check(!copies[ix(e)].empty(), "reactive routing: expert ", e, " has no copy");
      for (int g : copies[ix(e)])
        check(g >= 0 && g < G, "reactive routing: expert ", e, " has a copy on GPU ", g, ", outside [0, ", G, ")");
    }
    for (int g = 0; g < G; ++g) server_of.push_back(topo.server_of(g));
  }

  /// The pairs of a batch of tokens (source GPU and top-k experts each).
  RoutingProblem(topology::Topology const& topo, std::vector<std::vector<int>> const& copies_,
                 topology::Batch const& batch)
      : RoutingProblem(topo, copies_) {
    int k = batch.top_k;
    for (int t = 0; t < batch.tokens(); ++t)
      for (int j = 0; j < k; ++j) n[at(server_of[ix(batch.source[ix(t)])], batch.experts[ix(t * k + j)])] += 1;
    build();
  }

  /// The columns and the mean from n. Reuses the vectors' storage.
  void build() {
    cols.clear();
    first.assign(n.size() + 1, 0);
    double total = 0;
    for (int s = 0; s < S; ++s)
      for (int e = 0; e < E; ++e) {
        total += n[at(s, e)];
        if (n[at(s, e)] > 0)
          for (int g : copies[ix(e)]) cols.push_back({s, e, g, server_of[ix(g)]});
        first[at(s, e) + 1] = static_cast<int>(cols.size());
      }
    of_gpu.resize(ix(G));
    for (auto& v : of_gpu) v.clear();
    for (std::size_t c = 0; c < cols.size(); ++c) of_gpu[ix(cols[c].g)].push_back(static_cast<int>(c));
    mean = total / G;
  }
  [[nodiscard]] std::size_t at(int s, int e) const { return ix(s) * ix(E) + ix(e); }
};

/// Seconds of pairs on every link, per phase, as routes are added: the dispatch crosses from the
/// column's source server to its copy's server, the combine back.
class LinkLoads {
 public:
  explicit LinkLoads(ServerPaths const& path) : path_(&path), dispatch_(ix(path.links()), 0.0), combine_(dispatch_) {}

  void clear() {
    std::fill(dispatch_.begin(), dispatch_.end(), 0.0);
    std::fill(combine_.begin(), combine_.end(), 0.0);
  }
  /// `pairs` of column `col` (nothing crosses when the copy is on the source server).
  void add(RoutingProblem::Column const& col, double pairs) {
    if (col.server == col.s) return;
    for (auto const& [l, sec] : (*path_)(col.s, col.server)) dispatch_[ix(l)] += pairs * sec;
    for (auto const& [l, sec] : (*path_)(col.server, col.s)) combine_[ix(l)] += pairs * sec;
  }
  /// The most loaded link on the column's paths once `pairs` more are added (0 at home).
  [[nodiscard]] double worst(RoutingProblem::Column const& col, double pairs) const {
    double w = 0;
    if (col.server == col.s) return w;
    for (auto const& [l, sec] : (*path_)(col.s, col.server)) w = std::max(w, dispatch_[ix(l)] + pairs * sec);
    for (auto const& [l, sec] : (*path_)(col.server, col.s)) w = std::max(w, combine_[ix(l)] + pairs * sec);
    return w;
  }
  /// The most loaded link of either phase.
  [[nodiscard]] double top() const {
    return std::max(*std::max_element(dispatch_.begin(), dispatch_.end()),
                    *std::max_element(combine_.begin(), combine_.end()));
  }

 private:
  ServerPaths const* path_;
  std::vector<double> dispatch_, combine_;
};

/// The greedy rule: whole pairs x(s, c) per column. First the pairs of experts with one copy, which
/// have no choice; then each server's pairs go to its own copies, as far as the GPU cap allows.
/// Then the other (server, expert) groups, those with the fewest copies first and larger groups
/// first: each pair to the copy that least raises the most loaded link on its dispatch or combine
/// path (GPUs within the cap first, then the lower GPU load). The cap is
/// (1 + eps) x the mean, or what the batch forces if more: an expert's pairs over its copies, a
/// GPU's single-copy experts.
inline std::vector<double> greedy_routes(RoutingProblem const& p, ServerPaths const& path, double eps) {
  std::vector<double> ne(ix(p.E), 0.0), forced(ix(p.G), 0.0);
  for (int s = 0; s < p.S; ++s)
    for (int e = 0; e < p.E; ++e) ne[ix(e)] += p.n[p.at(s, e)];
  double cap = (1 + eps) * p.mean;
  for (int e = 0; e < p.E; ++e) {
    auto const& c = p.copies[ix(e)];
    cap = std::max(cap, std::ceil(ne[ix(e)] / static_cast<double>(c.size())));
    if (c.size() == 1) cap = std::max(cap, forced[ix(c[0])] += ne[ix(e)]);
  }

  std::vector<double> x(p.cols.size(), 0.0), gpu(ix(p.G), 0.0), rem(p.n);
  LinkLoads loads(path);
  auto copies_of = [&](int se) { return p.first[ix(se) + 1] - p.first[ix(se)]; };
  for (int se = 0; se < p.S * p.E; ++se)  // no choice: experts with one copy
    if (rem[ix(se)] > 0 && copies_of(se) == 1) {
      int c = p.first[ix(se)];
      x[ix(c)] = rem[ix(se)], gpu[ix(p.cols[ix(c)].g)] += rem[ix(se)], rem[ix(se)] = 0;
      loads.add(p.cols[ix(c)], x[ix(c)]);
    }
  std::vector<int> groups;
  for (int se = 0; se < p.S * p.E; ++se) {
    if (rem[ix(se)] <= 0) continue;
    for (int c = p.first[ix(se)]; c < p.first[ix(se) + 1]; ++c) {
      auto const& col = p.cols[ix(c)];
      if (col.server != col.s) continue;
      double take = std::min(rem[ix(se)], std::max(0.0, std::floor(cap - gpu[ix(col.g)])));
      x[ix(c)] += take, gpu[ix(col.g)] += take, rem[ix(se)] -= take;
    }
    if (rem[ix(se)] > 0) groups.push_back(se);
  }
  std::sort(groups.begin(), groups.end(), [&](int a, int b) {
    return std::tuple(copies_of(a), -rem[ix(a)], a) < std::tuple(copies_of(b), -rem[ix(b)], b);
  });
  for (int se : groups)
    for (; rem[ix(se)] > 0; rem[ix(se)] -= 1) {
      int best = -1;
      std::tuple<bool, double, double> key{};
      for (int c = p.first[ix(se)]; c < p.first[ix(se) + 1]; ++c) {
        auto const& col = p.cols[ix(c)];
        std::tuple<bool, double, double> k{gpu[ix(col.g)] + 1 > cap, loads.worst(col, 1), gpu[ix(col.g)]};
        if (best < 0 || k < key) best = c, key = k;
      }
      auto const& col = p.cols[ix(best)];
      x[ix(best)] += 1, gpu[ix(col.g)] += 1;
      loads.add(col, 1);
    }
  return x;
}

/// Pairs per (source GPU, expert) of a batch, rank-major: the counts the host layer gathers.
inline std::vector<std::int32_t> pair_counts(topology::Batch const& batch, int gpus, int experts) {
  std::vector<std::int32_t> counts(ix(gpus) * ix(experts), 0);
  int k = batch.top_k;
  for (int t = 0; t < batch.tokens(); ++t)
    for (int j = 0; j < k; ++j) ++counts[ix(batch.source[ix(t)]) * ix(experts) + ix(batch.experts[ix(t * k + j)])];
  return counts;
}

/// The GPU serving every (token, slot) of a batch, as a replica policy for
/// TrafficModel::evaluate_policy (which passes the token's index in the batch).
struct PairRoutes {
  int k = 0;
  std::vector<int> const* experts = nullptr;  ///< the batch's, tokens x k
  std::vector<int> gpu;                       ///< per (token, slot)

  [[nodiscard]] int choose(int expert, int, int, long long token) const {
    for (int j = 0; j < k; ++j) {
      auto i = static_cast<std::size_t>(token * k + j);
      if ((*experts)[i] == expert) return gpu[i];
    }
    return -1;
  }
};

}  // namespace reactive

class Reactive {
 public:
  /// `copies`: the GPUs holding each expert (as replication::Table); `topo`: the cluster, one rank
  /// per GPU; `eps`: the per-GPU balance bound the rule keeps where the batch allows it.
  Reactive(std::vector<std::vector<int>> copies, topology::Topology const& topo, double eps = 0.05)
      : table_(copies), eps_(eps), paths_(topo, topology::TrafficModel(topo), 1.0), problem_(topo, std::move(copies)) {
    check(std::isfinite(eps) && eps >= 0, "reactive replicas: eps must be a non-negative number, got ", eps);
  }

  // Policy: choose() is replication::Table's rule, for callers that see one token at a time; the
  // host layer calls plan_batch and dealt instead.
  [[nodiscard]] int choose(int expert, int primary, int source_rank, long long token) const {
    return table_.choose(expert, primary, source_rank, token);
  }
  [[nodiscard]] bool holds(int expert, int primary, int rank) const { return table_.holds(expert, primary, rank); }
  void validate(int experts, int ranks, std::span<int const> placement) const {
    check(ranks == problem_.G, "reactive replicas: built for ", problem_.G, " GPUs, the layer has ", ranks, " ranks");
    table_.validate(experts, ranks, placement);
  }
  [[nodiscard]] Table const& table() const { return table_; }

  /// Routes the batch whose pairs per (rank, expert) are `counts` (ranks x experts, rank-major).
  void plan_batch(std::span<std::int32_t const> counts) {
    auto const& p = problem_;
    check(counts.size() == ix(p.G) * ix(p.E), "reactive replicas: ", counts.size(), " counts, expected ", p.G, " ranks x ",
          p.E, " experts");
    std::fill(problem_.n.begin(), problem_.n.end(), 0.0);
    offset_.assign(counts.size(), 0);
    for (int r = 0; r < p.G; ++r)
      for (int e = 0; e < p.E; ++e) {
        std::int32_t c = counts[ix(r) * ix(p.E) + ix(e)];
        check(c >= 0, "reactive replicas: rank ", r, " reports ", c, " pairs of expert ", e);
        auto& n = problem_.n[p.at(p.server_of[ix(r)], e)];
        offset_[ix(r) * ix(p.E) + ix(e)] = static_cast<long long>(n);
        n += c;
      }
    problem_.build();
    x_ = reactive::greedy_routes(problem_, paths_, eps_);
    // Cumulative pairs per column: column c takes the pairs [end[c] - x[c], end[c]) of its group.
    end_.resize(x_.size());
    for (int se = 0; se < p.S * p.E; ++se) {
      long long sum = 0;
      for (int c = p.first[ix(se)]; c < p.first[ix(se) + 1]; ++c) end_[ix(c)] = sum += std::llround(x_[ix(c)]);
    }
  }

  /// The GPU of `rank`'s m-th pair of `expert` in token order (after plan_batch, whose counts gave
  /// `rank` more than m pairs of `expert`).
  [[nodiscard]] int dealt(int expert, int rank, int m) const {
    auto const& p = problem_;
    long long at = offset_[ix(rank) * ix(p.E) + ix(expert)] + m;
    auto se = p.at(p.server_of[ix(rank)], expert);
    int lo = p.first[se], hi = p.first[se + 1];
    for (int c = lo; c < hi; ++c)
      if (at < end_[ix(c)]) return p.cols[ix(c)].g;
    return hi > lo ? p.cols[ix(hi - 1)].g : table_.replicas()[ix(expert)].front();
  }

  /// Every pair of `batch` dealt as the host layer's ranks deal theirs, after plan_batch with the
  /// batch's own counts (reactive::pair_counts).
  [[nodiscard]] reactive::PairRoutes deal(topology::Batch const& batch) const {
    reactive::PairRoutes out{batch.top_k, &batch.experts, std::vector<int>(batch.experts.size())};
    std::vector<int> seen(ix(problem_.G) * ix(problem_.E), 0);  // per (source, expert): pairs dealt
    for (int t = 0; t < batch.tokens(); ++t)
      for (int j = 0; j < batch.top_k; ++j) {
        int src = batch.source[ix(t)], e = batch.experts[ix(t * batch.top_k + j)];
        out.gpu[ix(t * batch.top_k + j)] = dealt(e, src, seen[ix(src) * ix(problem_.E) + ix(e)]++);
      }
    return out;
  }

  /// The last batch's routes: pairs per column of problem().
  [[nodiscard]] std::vector<double> const& routes() const { return x_; }
  [[nodiscard]] reactive::RoutingProblem const& problem() const { return problem_; }

 private:
  static std::size_t ix(int i) { return reactive::ix(i); }

  Table table_;
  double eps_;
  reactive::ServerPaths paths_;
  reactive::RoutingProblem problem_;
  std::vector<long long> offset_;  ///< per (rank, expert): the rank's first pair within its server's group
  std::vector<double> x_;          ///< per column: pairs (whole numbers)
  std::vector<long long> end_;     ///< per column: cumulative pairs of its group up to and including it
};

static_assert(BatchPolicy<Reactive>);

}  // namespace moe::replication
