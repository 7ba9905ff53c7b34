#pragma once
// Disaggregated moe::Layer scenarios run by both the InProcess and the MPI tests: the Schedule policy
// (schedule::FinDep or schedule::PPPipe) is a template argument, its configuration comes from the
// solver (solve_findep / solve_pppipe on a small problem: 6 samples of 4 tokens per AG rank, the
// H100 reference models) and from a few fixed choices covering both orders. Each AG rank's output
// is compared with moe::reference_forward on its tokens (normwise relative error).

#include <type_traits>

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
