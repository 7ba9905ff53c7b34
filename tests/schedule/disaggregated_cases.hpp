#pragma once
// Disaggregated moe::Layer scenarios run by both the InProcess and the MPI tests: the Schedule policy
// (schedule::FinDep or schedule::PPPipe) is a template argument, its configuration comes from the
// solver (solve_findep / solve_pppipe on a small problem: 6 samples of 4 tokens per AG rank, the
// H100 reference models) and from a few fixed choices covering both orders. Each AG rank's output
// is compared with moe::reference_forward on its tokens (normwise relative error).

#include <catch2/catch.hpp>

#include <algorithm>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../support/least_max_load.hpp"
#include "executor_cases.hpp"
#include "moe/layer/paths/host_disaggregated.hpp"
#include "moe/schedule/findep.hpp"

namespace moe::test::findep {

/// The schedules tried for a policy type with `ag` AG ranks out of `world`.
template <class Schedule>
std::vector<Schedule> schedules(ShapeSpec const& s, int ag, int world) {
  Problem p;
  p.shape = s;
  p.ag = ag;
  p.eg = world - ag;
  p.seq = 4;
  p.batch = tokens_per_ag / p.seq;  // 6 samples per AG rank
  p.memory_bytes = 1e12;
  p.r2_max = 8;
  PerfModels m = h100_cluster_reference();
  std::vector<Schedule> out;
  if constexpr (Schedule::pipeline == Pipeline::findep) {
    out.push_back(Schedule::from(solve_findep(p, m).config, ag));
    out.push_back(Schedule{ag, Order::aass, 3, 2});
    out.push_back(Schedule{ag, Order::asas, 2, 4});
  } else {
    out.push_back(Schedule::from(solve_pppipe(p, m).config, ag));
    out.push_back(Schedule{ag, Order::asas, 4, 1});
  }
  return out;
}

/// The replica policy of a layer with one copy per expert: None, or a Table naming each expert's
/// EG index.
template <class Replicas>
Replicas single_copies(placement::Table const& on_eg) {
  if constexpr (std::is_same_v<Replicas, replication::Table>) {
    std::vector<std::vector<int>> copies;
    for (int e = 0; e < on_eg.experts(); ++e) copies.push_back({on_eg.rank_of(e)});
    return replication::Table(std::move(copies));
  } else {
    return Replicas{};
  }
}

/// A replica table over `eg` EG indices, seeded and labelled synthetic: expert 0 (the hot one in
/// a skewed load) on every EG index, every third expert on its placement index and the next one
/// (with two EG indices or more), the rest once. The placement's index is listed last for some
/// experts: the table's order, not the placement, decides which copy a token uses.
inline replication::Table replicated_on_eg(placement::Table const& on_eg, int eg) {
  std::vector<std::vector<int>> copies(static_cast<std::size_t>(on_eg.experts()));
  for (int e = 0; e < on_eg.experts(); ++e) {
    int p = on_eg.rank_of(e);
    auto& c = copies[static_cast<std::size_t>(e)];
    if (e == 0) {
      for (int g = eg - 1; g >= 0; --g) c.push_back(g);
    } else if (e % 3 == 0 && eg > 1) {
      c = e % 2 ? std::vector<int>{(p + 1) % eg, p} : std::vector<int>{p, (p + 1) % eg};
    } else {
      c = {p};
    }
  }
  return replication::Table(std::move(copies));
}

/// Every AG token's routed experts (AG rank p's token t at (p * tokens + t) * k), from the router
/// applied one token at a time, as the reference does.
template <class Router>
std::vector<int> routes_of(ShapeSpec const& s, LayerWeights<float> const& w, float const* x, int tokens) {
  auto k = static_cast<std::size_t>(s.top_k), h = static_cast<std::size_t>(s.hidden);
  std::vector<int> ids(static_cast<std::size_t>(tokens) * k);
  std::vector<float> logits(static_cast<std::size_t>(s.experts)), gates(k);
  std::span<float const> bias;
  if (w.router_bias) bias = {w.router_bias, static_cast<std::size_t>(s.experts)};
  for (int t = 0; t < tokens; ++t) {
    kernels::host::gate_logits(x + static_cast<std::size_t>(t) * h, 1, s.hidden, w.router, s.experts, logits.data());
    router::route_all<Router>(s, logits, bias, 1, std::span(ids).subspan(static_cast<std::size_t>(t) * k, k), gates);
  }
  return ids;
}

/// One schedule of run_batch_split_cases, as one rank saw it.
struct SplitResult {
  std::string what;
  double vs_reference = 0;              ///< AG ranks: normwise relative error against the reference
  long long max_sum = 0;                ///< AG ranks: busiest EG index per micro-batch, summed (the splits)
  long long least = 0, fixed = 0;       ///< the same at the least max load, and by the fixed rule
  std::size_t control = 0, expected_control = 0;  ///< AG ranks: stats().control_bytes, and the counts' bytes
  bool loads_match = true;  ///< every AG rank's splits say what each EG index then received
};

/// The checks of one SplitResult (with Catch2; `where` names the run in the failure messages):
/// output, loads, least max load, never above the fixed rule, control bytes.
inline void check_split(SplitResult const& r, std::string const& where) {
  INFO(r.what << where << ": busiest EG index summed over micro-batches: split " << r.max_sum << ", least "
              << r.least << ", fixed rule " << r.fixed);
  CHECK(r.vs_reference <= tolerance);
  CHECK(r.loads_match);
  CHECK(r.max_sum == r.least);
  CHECK(r.least <= r.fixed);
  CHECK(r.control == r.expected_control);
}

/// moe::Layer with replication::BatchSplit on the host disaggregated path (each micro-batch split
/// over the copies of replicated_on_eg, EG index g on server g / 2), for every schedule of
/// schedules(). Every rank must call it; the ranks' split loads and received pairs are compared
/// through one all-gather per schedule, so every rank reports loads_match the same.
template <class Model, class Schedule, class Comm>
std::vector<SplitResult> run_batch_split_cases(Comm& comm, int ag, std::uint64_t seed) {
  using Router = router::ForModel<Model>;
  using Lyr = Layer<Model, Router, placement::Table, replication::BatchSplit, Schedule, Comm>;
  static_assert(Lyr::path == ExecutionPath::host_disaggregated);
  constexpr ShapeSpec s = Model::spec;
  int world = comm.size(), rank = comm.rank(), eg = world - ag;
  auto h = static_cast<std::size_t>(s.hidden), k = static_cast<std::size_t>(s.top_k);
  RandomLayerWeights<float> weights(s, seed);
  auto x = random_tokens(ag * tokens_per_ag, s.hidden, seed + 3);
  placement::Table on_eg = blocks(s.experts, eg);
  auto copies = replicated_on_eg(on_eg, eg).replicas();
  std::vector<int> servers(static_cast<std::size_t>(eg));
  for (int g = 0; g < eg; ++g) servers[static_cast<std::size_t>(g)] = g / 2;
  replication::BatchSplit split(copies, servers);
  auto ids = routes_of<Router>(s, weights.view(), x.data(), ag * tokens_per_ag);
  bool is_ag = rank < ag;
  auto view = weights.view();
  auto held = weights.experts_where([&](int e) { return !is_ag && split.holds(e, 0, rank - ag); });
  view.experts = held;
  std::size_t first = is_ag ? static_cast<std::size_t>(rank) * tokens_per_ag * h : 0;
  std::size_t n = is_ag ? static_cast<std::size_t>(tokens_per_ag) * h : 0;
  std::vector<float> ref(n);
  if (is_ag) reference_forward<Router>(s, weights.view(), tokens_per_ag, x.data() + first, ref.data());

  std::vector<SplitResult> out;
  for (Schedule const& sched : schedules<Schedule>(s, ag, world)) {
    auto cfg = sched.config();
    SplitResult r{"Layer " + describe(cfg, ag, eg) + ", per-micro-batch split"};
    Lyr layer(comm, on_eg, split, view, {.max_tokens = tokens_per_ag, .schedule = sched});
    std::vector<std::byte> ws(layer.workspace_size());
    std::vector<float> y(n, -1.0f);
    typename Lyr::Arguments a;
    if (is_ag) a = {tokens_per_ag, x.data() + first, y.data()};
    layer.run(a, ws);
    auto const& f = layer.executor().findep();
    // each rank's view of the EG indices' loads: an AG rank's splits; an EG rank its own pairs
    std::vector<long long> mine(static_cast<std::size_t>(eg), -1), all(static_cast<std::size_t>(eg * world));
    if (is_ag) {
      mine = f.split_loads();
      r.vs_reference = rel_error(y.data(), ref.data(), n);
      r.max_sum = f.split_max_sum();
      r.control = layer.stats().control_bytes;
      r.expected_control = static_cast<std::size_t>(cfg.r1) * static_cast<std::size_t>(ag - 1) *
                           static_cast<std::size_t>(s.experts) * sizeof(std::int32_t);
    } else {
      mine[static_cast<std::size_t>(rank - ag)] = f.pairs_received();
    }
    if (mine.size() != static_cast<std::size_t>(eg)) mine.assign(static_cast<std::size_t>(eg), -2);
    comm.all_gather_v(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)),
                      std::vector<std::size_t>(static_cast<std::size_t>(world), mine.size() * sizeof(long long)));
    for (int p = 0; p < ag; ++p)
      for (int g = 0; g < eg; ++g)
        r.loads_match = r.loads_match && all[static_cast<std::size_t>(p * eg + g)] ==
                                             all[static_cast<std::size_t>((ag + g) * eg + g)];
    // the least max load and the fixed rule's, micro-batch by micro-batch
    int mb = tokens_per_ag / cfg.r1;
    for (int i = 0; i < cfg.r1; ++i) {
      std::vector<long long> pairs(static_cast<std::size_t>(s.experts), 0), rule(static_cast<std::size_t>(eg), 0);
      for (int p = 0; p < ag; ++p)
        for (int t = i * mb; t < (i + 1) * mb; ++t)
          for (std::size_t q = 0; q < k; ++q) {
            int e = ids[(static_cast<std::size_t>(p) * tokens_per_ag + static_cast<std::size_t>(t)) * k + q];
            auto const& c = copies[static_cast<std::size_t>(e)];
            ++pairs[static_cast<std::size_t>(e)];
            ++rule[static_cast<std::size_t>(c[static_cast<std::size_t>((p + t) % static_cast<int>(c.size()))])];
          }
      r.least += moe::test::least_max_load(pairs, copies, eg);
      r.fixed += *std::max_element(rule.begin(), rule.end());
    }
    if (!is_ag) r.max_sum = r.least;  // nothing to compare on an EG rank
    out.push_back(r);
  }
  return out;
}

/// Runs moe::Layer<Model, ..., Replicas, Schedule, Comm> (the host disaggregated path) for every
/// schedule of schedules(); returns one Result per schedule (errors are zero on EG ranks). Every rank
/// must call it.
template <class Model, class Schedule, class Comm, class Replicas = replication::None>
std::vector<Result> run_disaggregated_cases(Comm& comm, int ag, std::uint64_t seed) {
  using Router = router::ForModel<Model>;
  using Lyr = Layer<Model, Router, placement::Table, Replicas, Schedule, Comm>;
  static_assert(Lyr::path == ExecutionPath::host_disaggregated);
  constexpr ShapeSpec s = Model::spec;
  int world = comm.size(), rank = comm.rank(), eg = world - ag;
  auto h = static_cast<std::size_t>(s.hidden);
  RandomLayerWeights<float> weights(s, seed);
  auto x = random_tokens(ag * tokens_per_ag, s.hidden, seed + 3);
  placement::Table on_eg = blocks(s.experts, eg);
  bool is_ag = rank < ag;
  auto view = weights.view();
  auto experts = weights.experts_where([&](int e) { return is_ag ? false : on_eg.rank_of(e) == rank - ag; });
  view.experts = experts;
  std::size_t first = is_ag ? static_cast<std::size_t>(rank) * tokens_per_ag * h : 0;
  std::size_t n = is_ag ? static_cast<std::size_t>(tokens_per_ag) * h : 0;
  std::vector<float> ref(n);
  if (is_ag) reference_forward<Router>(s, weights.view(), tokens_per_ag, x.data() + first, ref.data());
  auto book = is_ag ? textbook::forward(s, weights.view(), tokens_per_ag, x.data() + first) : std::vector<double>{};

  std::vector<Result> out;
  for (Schedule const& sched : schedules<Schedule>(s, ag, world)) {
    Lyr layer(comm, on_eg, single_copies<Replicas>(on_eg), view, {.max_tokens = tokens_per_ag, .schedule = sched});
    std::vector<std::byte> ws(layer.workspace_size());
    std::vector<float> y(n, -1.0f);
    typename Lyr::Arguments a;
    if (is_ag) a = {tokens_per_ag, x.data() + first, y.data()};
    layer.run(a, ws);
    Result r{"Layer " + describe(sched.config(), ag, eg)};
    if (is_ag) {
      r.vs_reference = rel_error(y.data(), ref.data(), n);
      r.vs_textbook = textbook::relative_error(y.data(), book.data(), n);
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace moe::test::findep
