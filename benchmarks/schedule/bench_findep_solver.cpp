// FinDEP solver time per query (target: under 1 ms on the host; the paper: under 1 s), the best
// PPPipe search and the two ways of scoring one configuration (closed form, event simulator).
// Counters: solve_time (seconds per query), evaluations, speedup of FinDEP over the best PPPipe in the same run.
#include <benchmark/benchmark.h>

#include "moe/models/models.hpp"
#include "moe/schedule/findep.hpp"

using namespace moe::schedule;

namespace {
// args: model (0 DeepSeek-V2, 1 Qwen3-235B), sequence length, AG ranks, EG ranks, memory GB
Problem problem(benchmark::State const& st) {
  Problem p;
  p.shape = st.range(0) == 0 ? moe::models::DeepSeekV2::spec : moe::models::Qwen3_235B_A22B::spec;
  p.seq = static_cast<int>(st.range(1));
  p.ag = static_cast<int>(st.range(2));
  p.eg = static_cast<int>(st.range(3));
  p.memory_bytes = static_cast<double>(st.range(4)) * 1e9;
  return p;  // all MoE layers of the model
}

void args(benchmark::internal::Benchmark* b) {
  for (int model : {0, 1})
    for (int seq : {1024, 4096, 8192})
      for (int mem : {20, 40, 80}) b->Args({model, seq, 4, 4, mem});
  b->Args({0, 1024, 16, 16, 80});
  b->Args({0, 8192, 6, 2, 20});
  b->ArgNames({"model", "seq", "ag", "eg", "memGB"});
}

void BM_SolveFinDEP(benchmark::State& st) {
  Problem p = problem(st);
  PerfModels m = h100_cluster_reference();
  Solution s;
  for (auto _ : st) {
    s = solve_findep(p, m);
    benchmark::DoNotOptimize(s);  // the whole struct: a double lvalue can be garbled by GCC
  }
  Solution pp = solve_pppipe(p, m);
  st.counters["solve_time"] = benchmark::Counter(static_cast<double>(st.iterations()),
                                                 benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  st.counters["evaluations"] = static_cast<double>(s.evaluations);
  st.counters["M"] = static_cast<double>(max_samples(p));
  st.counters["r1"] = s.config.r1;
  st.counters["r2"] = s.config.r2;
  st.counters["speedup_vs_pppipe"] = s.throughput / pp.throughput;
  st.counters["queries/s"] = benchmark::Counter(static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SolveFinDEP)->Apply(args)->Unit(benchmark::kMicrosecond);

void BM_SolvePPPipeBest(benchmark::State& st) {
  Problem p = problem(st);
  PerfModels m = h100_cluster_reference();
  Solution s;
  for (auto _ : st) {
    s = solve_pppipe(p, m);
    benchmark::DoNotOptimize(s);  // the whole struct: a double lvalue can be garbled by GCC
  }
  st.counters["evaluations"] = static_cast<double>(s.evaluations);
}
BENCHMARK(BM_SolvePPPipeBest)->Args({0, 1024, 4, 4, 40})->Args({0, 8192, 4, 4, 40})->Unit(benchmark::kMicrosecond);

// One configuration of DeepSeek-V2 (59 layers, r1 = 4, r2 = 8): closed form vs event simulator.
void BM_ScoreClosedForm(benchmark::State& st) {
  Problem p;
  p.shape = moe::models::DeepSeekV2::spec;
  p.ag = p.eg = 4;
  p.seq = 4096;
  p.memory_bytes = 40e9;
  PerfModels m = h100_cluster_reference();
  Config c{Pipeline::findep, Order::aass, 4, 1, 8};
  for (auto _ : st) benchmark::DoNotOptimize(makespan(p, m, c));
  st.counters["tasks"] = 59.0 * 4 * (2 + 3 * 8);
}
BENCHMARK(BM_ScoreClosedForm)->Unit(benchmark::kMicrosecond);

void BM_ScoreSimulator(benchmark::State& st) {
  Problem p;
  p.shape = moe::models::DeepSeekV2::spec;
  p.ag = p.eg = 4;
  p.seq = 4096;
  p.memory_bytes = 40e9;
  PerfModels m = h100_cluster_reference();
  Config c{Pipeline::findep, Order::aass, 4, 1, 8};
  for (auto _ : st) benchmark::DoNotOptimize(simulate(p, m, c).makespan);
  st.counters["tasks"] = 59.0 * 4 * (2 + 3 * 8);
  st.counters["tasks/s"] = benchmark::Counter(59.0 * 4 * 26 * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ScoreSimulator)->Unit(benchmark::kMicrosecond);
}  // namespace

BENCHMARK_MAIN();
