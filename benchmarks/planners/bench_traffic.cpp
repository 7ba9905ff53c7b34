// Traffic model benchmark (host, single thread): one MoE layer of DeepSeek-R1 (256 experts, top-8,
// hidden 7168, BF16) with a 4096-token batch spread over all 256 GPUs of the ILP paper's cluster
// (FatTree and Dragonfly), token-level mode with de-duplication. Placements: one copy per expert
// on GPU e (contiguous), and the same plus a second copy of the 32 hottest experts (equal shares).
// The routing is synthetic: seeded std::mt19937, Zipf-like expert popularity (exponent 0.8),
// top-8 distinct experts per token. The per-topology precomputation is timed separately.
// BM_ReactiveRoutes: what replication::Reactive (routing that reacts to each batch) costs each
// rank per layer on the same batch and copies, and the modelled bottleneck it reaches against
// replication::Table's static rule on those copies.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <random>

#include "moe/replication/reactive.hpp"
#include "moe/topology/traffic.hpp"

using namespace moe;
using namespace moe::topology;

namespace {
constexpr int kExperts = 256, kTopK = 8, kTokens = 4096;

Batch r1_batch(int gpus) {
  std::mt19937 rng(17);
  std::vector<double> w(kExperts);
  for (int e = 0; e < kExperts; ++e) w[static_cast<std::size_t>(e)] = 1.0 / std::pow(e + 1.0, 0.8);
  std::discrete_distribution<int> pick(w.begin(), w.end());
  std::vector<int> ranks(static_cast<std::size_t>(gpus));
  for (int g = 0; g < gpus; ++g) ranks[static_cast<std::size_t>(g)] = g;
  Batch b;
  b.top_k = kTopK;
  b.source = spread_tokens(kTokens, ranks);
  std::vector<char> used(kExperts);
  for (int t = 0; t < kTokens; ++t) {
    std::fill(used.begin(), used.end(), 0);
    for (int j = 0; j < kTopK;) {
      int e = pick(rng);
      if (used[static_cast<std::size_t>(e)]) continue;
      used[static_cast<std::size_t>(e)] = 1;
      b.experts.push_back(e);
      ++j;
    }
  }
  return b;
}

LayerCopies r1_placement(int gpus, bool replicate) {
  replication::CopyLists c;
  for (int e = 0; e < kExperts; ++e) {
    c.ranks.push_back(e % gpus);
    if (replicate && e < 32) c.ranks.push_back((e + gpus / 2) % gpus);  // hot experts: a copy half the cluster away
    c.first.push_back(static_cast<int>(c.ranks.size()));
  }
  return equal_shares(std::move(c));
}

void BM_TrafficR1Batch(benchmark::State& state) {
  auto kind = static_cast<Kind>(state.range(0));
  bool replicate = state.range(1) != 0;
  auto topo = paper_cluster(kind);
  TrafficModel model(topo);
  auto batch = r1_batch(topo.gpus());
  auto placement = r1_placement(topo.gpus(), replicate);
  TrafficOptions opt;  // hidden 7168, BF16
  TrafficReport r;
  auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    r = model.evaluate(placement, batch, opt);
    benchmark::DoNotOptimize(r.dispatch_time);
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  state.SetLabel(std::string(kind_name(kind)) + (replicate ? ", 32 hot experts x2" : ", one copy each"));
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(kTokens) * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["ms_per_batch"] = seconds * 1e3 / static_cast<double>(state.iterations());
  state.counters["bottleneck_us"] = r.time() * 1e6;
  state.counters["dests/token"] = r.destinations_per_token;
}
BENCHMARK(BM_TrafficR1Batch)
    ->ArgsProduct({{static_cast<int>(Kind::fat_tree), static_cast<int>(Kind::dragonfly)}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

void BM_TrafficPrecompute(benchmark::State& state) {
  auto kind = static_cast<Kind>(state.range(0));
  auto topo = paper_cluster(kind);
  for (auto _ : state) {
    TrafficModel model(topo);
    benchmark::DoNotOptimize(model.links());
  }
  state.SetLabel(kind_name(kind));
}
BENCHMARK(BM_TrafficPrecompute)
    ->Arg(static_cast<int>(Kind::fat_tree))
    ->Arg(static_cast<int>(Kind::dragonfly))
    ->Unit(benchmark::kMillisecond);

void BM_ReactiveRoutes(benchmark::State& state) {
  auto kind = static_cast<Kind>(state.range(0));
  auto topo = paper_cluster(kind);
  int G = topo.gpus();
  TrafficModel model(topo);
  auto batch = r1_batch(G);
  auto copies = r1_placement(G, true).copies;
  std::vector<std::vector<int>> lists(kExperts);
  std::vector<int> primary(kExperts);
  for (int e = 0; e < kExperts; ++e) {
    lists[static_cast<std::size_t>(e)].assign(copies.ranks.begin() + copies.first[static_cast<std::size_t>(e)],
                                              copies.ranks.begin() + copies.first[static_cast<std::size_t>(e) + 1]);
    primary[static_cast<std::size_t>(e)] = lists[static_cast<std::size_t>(e)].front();
  }
  replication::Reactive policy(lists, topo);
  auto counts = replication::reactive::pair_counts(batch, G, kExperts);
  auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    policy.plan_batch(counts);
    benchmark::DoNotOptimize(policy.dealt(0, 0, 0));
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  TrafficOptions opt;
  auto reactive = model.evaluate_policy(policy.deal(batch), primary, batch, opt);
  auto fixed = model.evaluate_policy(replication::Table(lists), primary, batch, opt);
  state.SetLabel(std::string(kind_name(kind)) + ", 32 hot experts x2");
  state.counters["ms_per_layer"] = seconds * 1e3 / static_cast<double>(state.iterations());
  state.counters["columns"] = static_cast<double>(policy.problem().cols.size());
  state.counters["bottleneck_us"] = reactive.time() * 1e6;
  state.counters["table_us"] = fixed.time() * 1e6;
  state.counters["vs_table"] = reactive.time() / fixed.time();
}
BENCHMARK(BM_ReactiveRoutes)
    ->Arg(static_cast<int>(Kind::fat_tree))
    ->Arg(static_cast<int>(Kind::dragonfly))
    ->Unit(benchmark::kMillisecond);
}  // namespace
BENCHMARK_MAIN();
