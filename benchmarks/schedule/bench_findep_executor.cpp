// Wall time of one MoE layer forward pass on 4 InProcess ranks (threads of one process): the host
// FinDEP executor on 2 AG + 2 EG ranks under several schedules, against the expert-parallel
// moe::Layer with the Sequential schedule on the same 4 ranks and the same tokens. Synthetic data:
// DeepSeek-V2 routing (160 experts, top-6, 2 shared experts) at hidden 256 / expert ffn 128, fp32,
// seeded weights and normal tokens, 192 tokens per AG rank (384 in all).
// Counters: items_per_second (tokens / s of wall time), vs_sequential (the sequential Layer's time /
// this schedule's time, the two run alternately in the same iterations; > 1 means faster).
// On the 2-core host the threads of all ranks share two cores, so this measures the executor's
// overhead and correctness path more than the overlap a GPU cluster would get.
#include <benchmark/benchmark.h>

#include <chrono>
#include <random>

#include "moe/collective/in_process.hpp"
#include "moe/layer/paths/host.hpp"
#include "moe/models/models.hpp"
#include "moe/layer/findep_executor.hpp"

using namespace moe;
using namespace moe::schedule;

namespace {
using Model = models::Reduced<models::DeepSeekV2, 256, 128, DType::f32>;
using Router = router::ForModel<Model>;
constexpr ShapeSpec s = Model::spec;
constexpr int world = 4, ag = 2, per_ag = 192, total = ag * per_ag;
using Comm = collective::InProcess<world>;

struct Data {
  RandomLayerWeights<float> weights{s, 42};
  std::vector<float> x, y;
  Data() : x(static_cast<std::size_t>(total) * s.hidden), y(x.size()) {
    std::mt19937_64 rng(43);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : x) v = d(rng);
  }
};
Data& data() {
  static Data d;
  return d;
}

/// One forward pass of the sequential expert-parallel Layer on 4 ranks (96 tokens each).
void sequential_pass() {
  Data& d = data();
  auto h = static_cast<std::size_t>(s.hidden);
  placement::Table ep = placement::Table::round_robin(s.experts, world);
  collective::run_in_process<world>([&](Comm& comm) {
    using Lyr = Layer<Model, Router, placement::Table, replication::None, Sequential, Comm>;
    int per = total / world, r = comm.rank();
    Lyr layer(comm, ep, replication::None{}, d.weights.view(), {.max_tokens = per});
    std::vector<std::byte> ws(layer.workspace_size());
    std::size_t first = static_cast<std::size_t>(r * per) * h;
    layer.run({.tokens = per, .x = d.x.data() + first, .y = d.y.data() + first, .first_token = r * per}, ws);
  });
}

/// One forward pass of the FinDEP executor on 2 AG + 2 EG ranks.
void findep_pass(Config const& c) {
  Data& d = data();
  auto h = static_cast<std::size_t>(s.hidden);
  placement::Table on_eg = placement::Table::round_robin(s.experts, world - ag);
  collective::run_in_process<world>([&](Comm& comm) {
    FinDepExecutor<Router, float, Comm> ex(comm, s, ag, on_eg, d.weights.view(), per_ag);
    std::vector<std::byte> ws(ex.workspace_size());
    typename FinDepExecutor<Router, float, Comm>::Arguments a;
    if (comm.rank() < ag) {
      std::size_t first = static_cast<std::size_t>(comm.rank()) * per_ag * h;
      a = {per_ag, d.x.data() + first, d.y.data() + first};
    }
    ex.run(a, c, ws);
  });
}

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The reported time is the executor's (manual timing, wall clock); every iteration also runs the
// sequential Layer right after, so both see the same load on the shared machine.
// args: pipeline (0 FinDEP, 1 PPPipe), order (0 AASS, 1 ASAS), r1, r2; r1 = 0: the sequential Layer.
void BM_Layer(benchmark::State& st) {
  bool sequential = st.range(2) == 0;
  Config c{st.range(0) == 0 ? Pipeline::findep : Pipeline::pppipe, st.range(1) == 0 ? Order::aass : Order::asas,
           static_cast<int>(st.range(2)), 1, static_cast<int>(st.range(3))};
  double mine = 0, base = 0;
  sequential_pass();  // warm-up (weights, first touches), not timed
  if (!sequential) findep_pass(c);
  for (auto _ : st) {
    auto t0 = std::chrono::steady_clock::now();
    if (sequential)
      sequential_pass();
    else
      findep_pass(c);
    double t = seconds(t0);
    st.SetIterationTime(t);
    mine += t;
    t0 = std::chrono::steady_clock::now();
    sequential_pass();
    base += seconds(t0);
  }
  st.SetItemsProcessed(st.iterations() * total);
  st.counters["vs_sequential"] = mine > 0 ? base / mine : 0.0;
  st.SetLabel(sequential ? std::string("sequential Layer, 4 EP ranks")
                         : std::string(pipeline_name(c.pipeline)) + " " + std::string(order_name(c.order)) + ", 2 AG + 2 EG");
}

BENCHMARK(BM_Layer)
    ->ArgNames({"pppipe", "asas", "r1", "r2"})
    ->Args({0, 0, 0, 0})
    ->Args({0, 1, 1, 1})
    ->Args({0, 0, 4, 1})
    ->Args({0, 1, 4, 1})
    ->Args({0, 0, 4, 4})
    ->Args({0, 1, 4, 4})
    ->Args({0, 1, 2, 8})
    ->Args({1, 1, 4, 1})
    ->Args({1, 1, 8, 1})
    ->UseManualTime()
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond);
}  // namespace

BENCHMARK_MAIN();
