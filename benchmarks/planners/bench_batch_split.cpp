// Per-batch replica split (host, one thread): what replication::BatchSplit::plan_batch costs each
// rank per layer, beside replication::Reactive::plan_batch on the same counts and copies, in the
// same run. DeepSeek-V3 at EP32: 256 experts, top-8, 32 ranks in 4 servers of 8 (preset h800:4),
// an EPLB plan of 288 slots (32 redundant copies) made from the mean loads, 4096 tokens per rank
// (prefill) or 64 (decode). Synthetic, seeded: expert popularity Gamma(0.7) (std::mt19937 seed 11),
// each rank's batch drawn from it after a drift of +-25 % per expert (seed 12), tokens of a rank
// with top-8 distinct experts (seed 100 + rank).
// The time per layer is the CPU column (one thread; the wall column also counts time the process
// waited for the core). Counters: max_over_mean of the received loads (fixed rule =
// replication::Table's, and the split's); arcs = the split's rank-graph arcs.
#include <benchmark/benchmark.h>

#include <random>

#include "moe/replication/batch_split.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/replication/reactive.hpp"
#include "moe/topology/presets.hpp"

using namespace moe;

namespace {
constexpr int kExperts = 256, kTopK = 8, kRanks = 32, kSlots = 288;

struct Setup {
  topology::Topology topo;
  std::vector<std::vector<int>> copies;
  std::vector<std::int32_t> counts;  // ranks x experts
  std::vector<std::vector<int>> ids;  // per rank, tokens x k
  double fixed_ratio = 0, mean = 0;
};

Setup make(int tokens) {
  Setup s;
  s.topo = topology::preset_topology("h800:4");
  std::mt19937 rng(11);
  std::gamma_distribution<double> gam(0.7, 1.0);
  std::vector<double> pop(kExperts);
  for (auto& p : pop) p = gam(rng);
  auto plan = replication::eplb::rebalance_experts(pop, 1, kExperts, kSlots, 8, 4, kRanks);
  s.copies = replication::eplb::layer_tables(plan, 0).replicas.replicas();
  std::mt19937 drift_rng(12);
  std::uniform_real_distribution<double> drift(0.75, 1.25);
  std::vector<double> now = pop;
  for (auto& p : now) p *= drift(drift_rng);
  s.counts.assign(static_cast<std::size_t>(kRanks * kExperts), 0);
  std::vector<long long> fixed(kRanks, 0);
  replication::Table table(s.copies);
  for (int r = 0; r < kRanks; ++r) {
    std::mt19937 tr(100 + static_cast<unsigned>(r));
    std::discrete_distribution<int> pick(now.begin(), now.end());
    std::vector<int> ids;
    for (int t = 0; t < tokens; ++t) {
      int row[kTopK];
      for (int j = 0; j < kTopK;) {
        int e = pick(tr);
        bool dup = false;
        for (int q = 0; q < j; ++q) dup |= row[q] == e;
        if (dup) continue;
        row[j++] = e;
        ids.push_back(e);
        ++s.counts[static_cast<std::size_t>(r * kExperts + e)];
        ++fixed[static_cast<std::size_t>(table.choose(e, s.copies[static_cast<std::size_t>(e)][0], r,
                                                       static_cast<long long>(r) * tokens + t))];
      }
    }
    s.ids.push_back(std::move(ids));
  }
  s.mean = static_cast<double>(tokens) * kTopK;
  s.fixed_ratio = static_cast<double>(*std::max_element(fixed.begin(), fixed.end())) / s.mean;
  return s;
}

void BM_BatchSplit(benchmark::State& state) {
  auto s = make(static_cast<int>(state.range(0)));
  replication::BatchSplit policy(s.copies, s.topo);
  for (auto _ : state) {
    auto out = policy.plan_batch(s.counts);
    benchmark::DoNotOptimize(out.max_load);
  }
  state.counters["fixed_max_over_mean"] = s.fixed_ratio;
  state.counters["split_max_over_mean"] = static_cast<double>(policy.outcome().max_load) / s.mean;
  state.counters["arcs"] = policy.layout().arcs;
  state.SetLabel("DeepSeek-V3 EP32, EPLB 288 slots, h800:4");
}
BENCHMARK(BM_BatchSplit)->Arg(4096)->Arg(256)->Arg(64)->Arg(16)->Unit(benchmark::kMicrosecond);

/// One rank dealing its own pairs in token order (what the dispatch adds per layer on the host).
void BM_BatchSplitDeal(benchmark::State& state) {
  auto s = make(static_cast<int>(state.range(0)));
  replication::BatchSplit policy(s.copies, s.topo);
  policy.plan_batch(s.counts);
  std::vector<int> dest(s.ids[0].size());
  for (auto _ : state) {
    policy.deal(0, s.ids[0], dest);
    benchmark::DoNotOptimize(dest.data());
  }
  state.SetLabel("rank 0's pairs");
}
BENCHMARK(BM_BatchSplitDeal)->Arg(4096)->Unit(benchmark::kMicrosecond);

void BM_ReactiveSameBatch(benchmark::State& state) {
  auto s = make(static_cast<int>(state.range(0)));
  replication::Reactive policy(s.copies, s.topo);
  for (auto _ : state) {
    policy.plan_batch(s.counts);
    benchmark::DoNotOptimize(policy.dealt(0, 0, 0));
  }
  state.SetLabel("DeepSeek-V3 EP32, EPLB 288 slots, h800:4");
}
BENCHMARK(BM_ReactiveSameBatch)->Arg(4096)->Arg(256)->Arg(64)->Arg(16)->Unit(benchmark::kMicrosecond);
}  // namespace
BENCHMARK_MAIN();
