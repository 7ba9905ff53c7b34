#pragma once
// The scenario of the per-batch split benchmarks (benchmarks/planners/bench_batch_split.cpp on the
// host, benchmarks/cuda/bench_cuda_batch_split.cu on the GPU): DeepSeek-V3 at EP32, 256 experts,
// top-8, 32 ranks in 4 servers of 8 (preset h800:4), an EPLB plan of 288 slots (32 redundant
// copies) made from the mean loads. Synthetic, seeded: expert popularity Gamma(0.7) (std::mt19937
// seed 11); each rank's batch drawn after a drift of +-25 % per expert (seed 12); a rank's tokens
// take top-8 distinct experts (seed 100 + rank). make(tokens, b) with b >= 0 draws batch b of a
// series on the same plan instead (drift seed 1000 + b, rank r's tokens seed 100000 b + 100 + r),
// whose means docs/results/batch-balance.md reports beside the one batch (kSeriesBatches of them;
// kSeriesBatches4096 at 4096 tokens per rank).
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "moe/replication/eplb.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/topology/presets.hpp"

namespace moe::bench_split {
constexpr int kExperts = 256, kTopK = 8, kRanks = 32, kSlots = 288;
constexpr int kSeriesBatches = 40, kSeriesBatches4096 = 10;

/// The batches of the series at `tokens` per rank.
inline int series_batches(int tokens) { return tokens >= 4096 ? kSeriesBatches4096 : kSeriesBatches; }

struct Setup {
  topology::Topology topo;
  std::vector<std::vector<int>> copies;
  std::vector<std::int64_t> phy2log;  // the same plan as an engine's slots (GPU-major, 9 per GPU)
  std::vector<std::int32_t> counts;  // ranks x experts
  std::vector<std::vector<int>> ids;  // per rank, tokens x k
  double fixed_ratio = 0, mean = 0;
};

/// The benchmark's batch (batch < 0), or batch `batch` of the series (see the file comment).
inline Setup make(int tokens, int batch = -1) {
  Setup s;
  s.topo = topology::preset_topology("h800:4");
  std::mt19937 rng(11);
  std::gamma_distribution<double> gam(0.7, 1.0);
  std::vector<double> pop(kExperts);
  for (auto& p : pop) p = gam(rng);
  auto plan = replication::eplb::rebalance_experts(pop, 1, kExperts, kSlots, 8, 4, kRanks);
  s.copies = replication::eplb::layer_tables(plan, 0).replicas.replicas();
  for (int p = 0; p < kSlots; ++p) s.phy2log.push_back(plan.phy2log(0, p));
  std::mt19937 drift_rng(batch < 0 ? 12u : 1000u + static_cast<unsigned>(batch));
  std::uniform_real_distribution<double> drift(0.75, 1.25);
  std::vector<double> now = pop;
  for (auto& p : now) p *= drift(drift_rng);
  s.counts.assign(static_cast<std::size_t>(kRanks * kExperts), 0);
  std::vector<long long> fixed(kRanks, 0);
  replication::Table table(s.copies);
  for (int r = 0; r < kRanks; ++r) {
    std::mt19937 tr((batch < 0 ? 0u : 100000u * static_cast<unsigned>(batch)) + 100u + static_cast<unsigned>(r));
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

/// The series at `tokens` per rank: batches 0 .. series_batches(tokens) - 1 of make(tokens, b).
inline std::vector<Setup> series(int tokens) {
  std::vector<Setup> all;
  for (int b = 0; b < series_batches(tokens); ++b) all.push_back(make(tokens, b));
  return all;
}

}  // namespace moe::bench_split
