// The serving-loop study's two per-step costs (tools/planner/serving_loop.cpp,
// docs/results/serving-loop.md), DeepSeek-V3 shape at EP32 (preset h800:4, 288 slots, 8 groups on
// 4 nodes), in the study's own scenario (moe_tools/serving_loop.hpp, seed 1, 2,000 passes, 256
// tokens per rank per pass):
//   - one re-plan: replication::migration::rebalance from the initial EPLB plan (the loads of
//     passes 0-99, arxiv) to the loads of passes 900-999 (the arxiv -> github crossfade), for one
//     layer and for 58 layers (every MoE layer given the same loads); beside it EPLB from scratch
//     on the same loads (the engine-style re-plan);
//   - one per-batch split: replication::BatchSplit::plan_batch on pass 1000's counts with the
//     initial plan's copies.
// The CPU column is the time (one thread); wall also counts time the process waited for a core.
#include <benchmark/benchmark.h>

#include "moe/replication/batch_split.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/replication/migration.hpp"
#include "moe/replication/reactive.hpp"
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

}  // namespace

BENCHMARK_MAIN();
