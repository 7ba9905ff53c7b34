// Per-batch replica split (host, one thread): what replication::BatchSplit::plan_batch costs each
// rank per layer, beside replication::Reactive::plan_batch on the same counts and copies, in the
// same run: DeepSeek-V3 at EP32 (batch_split_scenario.hpp), 16, 64, 256 (decode) and 4096 (prefill)
// tokens per rank. BM_BatchSplitSeries: the same over the scenario's series of seeded batches (40
// per size, 10 at 4096), one batch per iteration in turn, so the time is the mean over the series.
// The time per layer is the CPU column (one thread; the wall column also counts time the process
// waited for the core). Counters: max_over_mean of the received loads (fixed rule =
// replication::Table's, and the split's); arcs = the split's rank-graph arcs.
#include <benchmark/benchmark.h>

#include <random>

#include "batch_split_scenario.hpp"
#include "moe/replication/batch_split.hpp"
#include "moe/replication/reactive.hpp"

using namespace moe;

namespace {
using namespace moe::bench_split;

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

void BM_BatchSplitSeries(benchmark::State& state) {
  auto all = series(static_cast<int>(state.range(0)));
  int const B = static_cast<int>(all.size());
  replication::BatchSplit policy(all[0].copies, all[0].topo);
  std::vector<std::vector<std::int32_t>> counts;
  double fixed = 0, split = 0;
  for (auto& sb : all) {
    fixed += sb.fixed_ratio;
    split += static_cast<double>(policy.plan_batch(sb.counts).max_load) / sb.mean;
    counts.push_back(std::move(sb.counts));
  }
  all.clear();
  std::size_t i = 0;
  for (auto _ : state) {
    auto out = policy.plan_batch(counts[i]);
    benchmark::DoNotOptimize(out.max_load);
    i = i + 1 == counts.size() ? 0 : i + 1;
  }
  state.counters["batches"] = B;
  state.counters["fixed_max_over_mean"] = fixed / B;
  state.counters["split_max_over_mean"] = split / B;
  state.SetLabel("DeepSeek-V3 EP32, EPLB 288 slots, h800:4; mean over the seeded series");
}
BENCHMARK(BM_BatchSplitSeries)->Arg(4096)->Arg(256)->Arg(64)->Arg(16)->Unit(benchmark::kMicrosecond);

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
