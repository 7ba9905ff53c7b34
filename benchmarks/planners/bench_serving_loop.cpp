// The serving-loop study's two per-step costs (tools/planner/serving_loop.cpp,
// docs/results/serving-loop.md), DeepSeek-V3 shape at EP32 (preset h800:4, 288 slots, 8 groups on
// 4 nodes), in the study's own scenario (moe_tools/serving_loop.hpp, seed 1, 2,000 passes, 256
// tokens per rank per pass):
//   - one re-plan: replication::migration::rebalance from the initial EPLB plan (the loads of
//     passes 0-99, arxiv) to the loads of passes 900-999 (the arxiv -> github crossfade), for one
//     layer and for 58 layers (every MoE layer given the same loads); beside it EPLB from scratch
//     on the same loads (the engine-style re-plan);
//   - one per-batch split: replication::BatchSplit::plan_batch on pass 1000's counts with the
//     initial plan's copies;
//   - one split-aware re-plan: replication::split_planner::plan from the initial EPLB plan on the
//     per-pass loads of passes 900-999, one layer of OLMoE and Mixtral (8 ranks) and of
//     DeepSeek-V3 (8 groups kept on their nodes, and 1 group), the study's settings (2 spare slots,
//     10 permille least gain), beside the minimal-move re-plan;
//   - the re-plans of 16 layers (minimal moves) or 8 (split-aware) queued together on the live
//     layers' planner pool (live::Replanner, live::set_planner_threads), as a model whose layers
//     re-plan at the same pass queues them: the time until every plan is taken, with 1, 2 and 4
//     planner threads (each layer's loads differ a little, so that no plan is a twin of another).
// The CPU column is the time (one thread); wall also counts time the process waited for a core.
#include <benchmark/benchmark.h>

#include <string>

#include "moe/layer/live.hpp"
#include "moe/replication/batch_split.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/replication/migration.hpp"
#include "moe/replication/reactive.hpp"
#include "moe/replication/split_planner.hpp"
#include "moe_tools/serving_loop.hpp"

using namespace moe;
namespace sv = moe::tools::serving;
namespace mig = moe::replication::migration;
namespace eplb = moe::replication::eplb;

namespace {

constexpr int kPasses = 2000, kTokens = 256;

struct Setup {
  sv::Model model;
  topology::Topology topo;
  eplb::Matrix<float> arxiv, drifted;  // 1 x experts: window loads
  std::vector<int> initial;            // the initial plan's slot row
  std::vector<std::int32_t> counts;    // pass 1000: ranks x experts
  std::vector<long long> rows;         // passes 900-999: pairs per expert, pass-major
  mig::Options options;
};

eplb::Matrix<float> window(sv::Model const& m, int ranks, int first, int last) {
  std::vector<double> c(static_cast<std::size_t>(m.experts), 0.0);
  for (int p = first; p < last; ++p) sv::count_experts(sv::draw_pass(m, ranks, p, kPasses, kTokens, 1), c);
  eplb::Matrix<float> w(1, m.experts);
  for (int e = 0; e < m.experts; ++e) w(0, e) = static_cast<float>(c[static_cast<std::size_t>(e)]);
  return w;
}

Setup const& setup() {
  static Setup const s = [] {
    Setup x;
    x.model = sv::make_model("dsv3-h800", MOE_DATA_DIR);
    x.topo = topology::preset_topology(x.model.preset);
    int G = x.topo.gpus();
    x.arxiv = window(x.model, G, 0, 100);
    x.drifted = window(x.model, G, 900, 1000);
    x.initial = eplb::rebalance_experts(x.arxiv, x.model.slots, x.model.groups, x.topo.servers(), G).phy2log.row(0);
    x.counts = replication::reactive::pair_counts(sv::draw_pass(x.model, G, 1000, kPasses, kTokens, 1), G, x.model.experts);
    for (int p = 900; p < 1000; ++p) {
      std::vector<double> c(static_cast<std::size_t>(x.model.experts), 0.0);
      sv::count_experts(sv::draw_pass(x.model, G, p, kPasses, kTokens, 1), c);
      for (double v : c) x.rows.push_back(static_cast<long long>(v));
    }
    x.options.num_groups = x.model.groups;
    x.options.num_nodes = x.topo.servers();
    return x;
  }();
  return s;
}

/// `layers` copies of one row.
template <class T>
eplb::Matrix<T> stacked(std::vector<T> const& row, int layers) {
  eplb::Matrix<T> m(layers, static_cast<int>(row.size()));
  for (int l = 0; l < layers; ++l) std::copy(row.begin(), row.end(), m.v.begin() + static_cast<long>(l) * m.cols);
  return m;
}

void BM_ServingLoopReplan(benchmark::State& state) {
  auto const& s = setup();
  int layers = static_cast<int>(state.range(0));
  auto old = stacked(s.initial, layers);
  auto w = stacked(s.drifted.v, layers);
  long long copies = 0;
  for (auto _ : state) {
    auto r = mig::rebalance(w, old, s.topo.gpus(), s.options);
    copies = r.copies();
    benchmark::DoNotOptimize(r.phy2log.v.data());
  }
  state.counters["copies"] = static_cast<double>(copies);
  state.SetLabel("migration::rebalance, DeepSeek-V3 EP32, 288 slots, h800:4");
}
BENCHMARK(BM_ServingLoopReplan)->Arg(1)->Arg(58)->Unit(benchmark::kMillisecond);

void BM_ServingLoopEplbFromScratch(benchmark::State& state) {
  auto const& s = setup();
  int layers = static_cast<int>(state.range(0));
  auto w = stacked(s.drifted.v, layers);
  for (auto _ : state) {
    auto r = eplb::rebalance_experts(w, s.model.slots, s.model.groups, s.topo.servers(), s.topo.gpus());
    benchmark::DoNotOptimize(r.phy2log.v.data());
  }
  state.SetLabel("eplb::rebalance_experts, DeepSeek-V3 EP32, 288 slots, h800:4");
}
BENCHMARK(BM_ServingLoopEplbFromScratch)->Arg(1)->Arg(58)->Unit(benchmark::kMillisecond);

void BM_ServingLoopSplit(benchmark::State& state) {
  auto const& s = setup();
  replication::BatchSplit split(sv::copies_of(s.initial, s.model.experts, s.topo.gpus()), s.topo);
  for (auto _ : state) {
    auto out = split.plan_batch(s.counts);
    benchmark::DoNotOptimize(out.max_load);
  }
  double mean = static_cast<double>(kTokens) * s.model.top_k;
  state.counters["split_max_over_mean"] = static_cast<double>(split.outcome().max_load) / mean;
  state.SetLabel("BatchSplit::plan_batch, DeepSeek-V3 EP32, 256 tokens per rank, pass 1000");
}
BENCHMARK(BM_ServingLoopSplit)->Unit(benchmark::kMicrosecond);

/// The split-aware re-planner's inputs for one model of the study: the initial EPLB plan (passes
/// 0-99) and the per-pass loads of passes 900-999; DeepSeek-V3 with its 8 groups kept on nodes
/// (`groups` 8) or EPLB's global policy (1).
struct PlannerCase {
  std::vector<int> start;
  std::vector<long long> rows;
  int experts = 0, ranks = 0, node_size = 0;
};

PlannerCase planner_case(char const* name, int groups) {
  PlannerCase c;
  auto m = sv::make_model(name, MOE_DATA_DIR);
  auto topo = topology::preset_topology(m.preset);
  int G = topo.gpus();
  if (m.experts == 256) m.groups = groups;
  c.start = eplb::rebalance_experts(window(m, G, 0, 100), m.slots, m.groups, topo.servers(), G).phy2log.row(0);
  for (int p = 900; p < 1000; ++p) {
    std::vector<double> v(static_cast<std::size_t>(m.experts), 0.0);
    sv::count_experts(sv::draw_pass(m, G, p, kPasses, kTokens, 1), v);
    for (double x : v) c.rows.push_back(static_cast<long long>(x));
  }
  c.experts = m.experts, c.ranks = G;
  c.node_size = m.groups > 1 && topo.servers() > 1 ? G / topo.servers() : 0;
  return c;
}

void BM_ServingLoopSplitPlanner(benchmark::State& state) {
  static PlannerCase const cases[] = {planner_case("olmoe", 1), planner_case("mixtral", 1),
                                      planner_case("dsv3-h800", 8), planner_case("dsv3-h800", 1)};
  static char const* const labels[] = {"OLMoE, 8 ranks", "Mixtral, 8 ranks", "DeepSeek-V3 EP32, 8 groups kept on nodes",
                                       "DeepSeek-V3 EP32, 1 group"};
  auto i = static_cast<std::size_t>(state.range(0));
  auto const& c = cases[i];
  replication::split_planner::Options o;
  o.spare = 2;
  o.min_gain_permille = 10;
  o.node_size = c.node_size;
  replication::split_planner::Result r;
  for (auto _ : state) {
    r = replication::split_planner::plan(c.rows, c.experts, c.start, c.ranks, o);
    benchmark::DoNotOptimize(r.layout.data());
  }
  state.counters["copies"] = static_cast<double>(r.copies);
  state.counters["rounds"] = r.rounds;
  state.counters["score_before"] = r.before;
  state.counters["score_after"] = r.after;
  state.SetLabel(std::string("split_planner::plan, ") + labels[i] + ", 100 passes");
}
BENCHMARK(BM_ServingLoopSplitPlanner)->DenseRange(0, 3)->Unit(benchmark::kMillisecond);

/// Arguments: planner threads; 0 the minimal-move planner (16 layers), 1 the split-aware one (8
/// layers of the DeepSeek-V3 case with 8 groups, as BM_ServingLoopSplitPlanner/2).
void BM_ServingLoopReplanPool(benchmark::State& state) {
  auto const& s = setup();
  static PlannerCase const split_case = planner_case("dsv3-h800", 8);
  int const threads = static_cast<int>(state.range(0));
  bool const split = state.range(1) == 1;
  int const layers = split ? 8 : 16;
  live::set_planner_threads(threads);
  live::Replanner held;
  held.attach();  // the pool lives across the iterations
  std::vector<live::Replanner> replanners(static_cast<std::size_t>(layers));
  static long long round = 0;  // no two plans alike, in this run or an earlier one (the plan memo)
  for (auto _ : state) {
    ++round;
    for (int l = 0; l < layers; ++l) {
      auto& r = replanners[static_cast<std::size_t>(l)];
      auto const bump = round * layers + l;
      if (split) {
        auto rows = split_case.rows;
        rows[0] += bump;
        r.start(std::vector<float>(static_cast<std::size_t>(split_case.experts), 1.0F), split_case.start,
                split_case.ranks, 2, 10, 1, live::Planner::split_balance, {}, std::move(rows));
      } else {
        auto loads = s.drifted.v;
        loads[0] += static_cast<float>(bump);
        r.start(std::move(loads), s.initial, s.topo.gpus(), 2, 10, s.topo.servers(), live::Planner::minimal_move, {});
      }
    }
    for (auto& r : replanners) benchmark::DoNotOptimize(r.take().layout.data());
  }
  state.counters["plans_per_s"] =
      benchmark::Counter(static_cast<double>(layers), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::to_string(layers) + " layers' live::Replanner plans (" +
                 (split ? "split_balance" : "minimal_move") + ") on " + std::to_string(threads) +
                 " planner threads, DeepSeek-V3 EP32, 288 slots, h800:4");
  live::set_planner_threads(1);
}
BENCHMARK(BM_ServingLoopReplanPool)
    ->ArgsProduct({{1, 2, 4}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
