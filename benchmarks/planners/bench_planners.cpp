// Planner benchmarks (host, single thread):
//  - exact ILPLoad for DeepSeek-R1 (58 MoE layers x 256 experts) on the ILP paper's 256-GPU cluster,
//    c_layer 1 and 8, c_exp 64 (the paper's CVXPY solve took 1397 s); greedy and, when LEMON is
//    available, LEMON's NetworkSimplex on the GPU-grouped expert network in the same run;
//  - CRAFT's whole plan for DeepSeek-R1 on 64 GPUs from 3000 profiled batches (the paper: about
//    10 s), with EPLB (one replica per layer per GPU) in the same run.
// Loads are synthetic (seeded Zipf-like marginals, exponents 0.3..0.8; seeded batches).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "moe/placement/heuristics.hpp"
#include "moe/placement/ilp.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/replication/craft.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/topology/topology.hpp"

#ifdef MOE_BENCH_LEMON
#include <lemon/network_simplex.h>
#include <lemon/smart_graph.h>
#endif

using namespace moe;

namespace {
constexpr int kLayers = 58, kExperts = 256;

placement::Problem const& r1_problem(int c_layer) {
  static std::map<int, placement::Problem> cache;
  auto it = cache.find(c_layer);
  if (it == cache.end())
    it = cache.emplace(c_layer, placement::make_problem(topology::paper_cluster(topology::Kind::fat_tree), kLayers, kExperts,
                                                        c_layer, 64)).first;
  return it->second;
}
std::vector<double> const& r1_load() {
  static auto m = profile::zipf_marginals(kLayers, kExperts, 0.3, 0.8, 1);
  return m.weight;
}
profile::LoadProfile const& r1_profile_3000() {
  static auto p = [] {
    profile::SampleOptions o;
    o.batches = 3000;
    o.tokens_per_batch = 4096;
    o.top_k = 8;
    o.concentration = 2000;
    o.seed = 7;
    return profile::sample_profile(profile::zipf_marginals(kLayers, kExperts, 0.3, 0.8, 2), o);
  }();
  return p;
}
}  // namespace

// Arguments: c_layer, solver (0 = our network simplex, 1 = our successive shortest paths).
static void BM_ILPLoad_R1_256gpu(benchmark::State& st) {
  auto const& p = r1_problem(static_cast<int>(st.range(0)));
  auto const& load = r1_load();
  auto solver = st.range(1) == 0 ? placement::Solver::network_simplex : placement::Solver::shortest_paths;
  placement::ExactResult r;
  for (auto _ : st) {
    r = placement::ilp_load(p, load, solver);
    benchmark::DoNotOptimize(r.assignment.gpu.data());
  }
  auto t0 = std::chrono::steady_clock::now();
  auto g = placement::greedy(p);
  double greedy_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> f(load.size());
  for (int l = 0; l < kLayers; ++l) {
    double s = 0;
    for (int e = 0; e < kExperts; ++e) s += load[l * kExperts + e];
    for (int e = 0; e < kExperts; ++e) f[l * kExperts + e] = load[l * kExperts + e] / s;
  }
  st.counters["objective"] = r.objective;
  st.counters["greedy_objective"] = placement::objective(p, g, f);
  st.counters["greedy_s"] = greedy_s;
  st.counters["gpu_groups"] = r.groups;
  st.counters["augmentations"] = r.augmentations;
  st.counters["pivots"] = static_cast<double>(r.pivots);
  st.counters["experts_per_s"] = benchmark::Counter(static_cast<double>(kLayers) * kExperts, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["paper_cvxpy_s"] = 1397.5;
}
BENCHMARK(BM_ILPLoad_R1_256gpu)
    ->Args({1, 0})
    ->Args({8, 0})
    ->Args({1, 1})
    ->Args({8, 1})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);

static void BM_ILP_R1_256gpu(benchmark::State& st) {
  auto const& p = r1_problem(static_cast<int>(st.range(0)));
  placement::ExactResult r;
  for (auto _ : st) {
    r = placement::ilp(p);
    benchmark::DoNotOptimize(r.assignment.gpu.data());
  }
  st.counters["objective"] = r.objective;
  st.counters["paper_cvxpy_s"] = 1185.9;
}
BENCHMARK(BM_ILP_R1_256gpu)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond);

#ifdef MOE_BENCH_LEMON
// LEMON NetworkSimplex on expert -> (layer, GPU group) -> group -> sink, with the GPUs of equal
// cost columns merged (reduction 1 only); costs are frequencies scaled by 1e9 and rounded.
static void BM_LEMON_ILPLoad_R1_256gpu(benchmark::State& st) {
  using namespace lemon;
  auto const& p = r1_problem(static_cast<int>(st.range(0)));
  auto const& load = r1_load();
  std::map<std::vector<int>, std::vector<int>> groups;
  for (int g = 0; g < p.gpus; ++g) {
    std::vector<int> col;
    for (int l = 0; l < kLayers; ++l) col.push_back(p.cost(l, g));
    groups[col].push_back(g);
  }
  double total = 0;
  for (auto _ : st) {
    SmartDigraph gr;
    SmartDigraph::ArcMap<long long> cap(gr), cost(gr);
    SmartDigraph::NodeMap<long long> sup(gr);
    auto sink = gr.addNode();
    std::vector<SmartDigraph::Node> gn;
    std::vector<int> rep, size;
    for (auto const& [col, gs] : groups) {
      gn.push_back(gr.addNode());
      rep.push_back(gs[0]);
      size.push_back(static_cast<int>(gs.size()));
      auto a = gr.addArc(gn.back(), sink);
      cap[a] = static_cast<long long>(p.c_exp) * gs.size();
      cost[a] = 0;
    }
    int NG = static_cast<int>(gn.size());
    for (int l = 0; l < kLayers; ++l) {
      double s = 0;
      for (int e = 0; e < kExperts; ++e) s += load[l * kExperts + e];
      std::vector<SmartDigraph::Node> lg(NG);
      for (int j = 0; j < NG; ++j) {
        lg[j] = gr.addNode();
        auto a = gr.addArc(lg[j], gn[j]);
        cap[a] = static_cast<long long>(p.c_layer) * size[j];
        cost[a] = 0;
      }
      for (int e = 0; e < kExperts; ++e) {
        auto x = gr.addNode();
        sup[x] = 1;
        for (int j = 0; j < NG; ++j) {
          auto a = gr.addArc(x, lg[j]);
          cap[a] = 1;
          cost[a] = std::llround(1e9 * load[l * kExperts + e] / s * p.cost(l, rep[j]));
        }
      }
    }
    sup[sink] = -static_cast<long long>(kLayers) * kExperts;
    NetworkSimplex<SmartDigraph, long long, long long> ns(gr);
    ns.upperMap(cap).costMap(cost).supplyMap(sup);
    if (ns.run() != NetworkSimplex<SmartDigraph, long long, long long>::OPTIMAL) st.SkipWithError("LEMON: not optimal");
    total = static_cast<double>(ns.totalCost()) / 1e9;
  }
  st.counters["objective"] = total;
}
BENCHMARK(BM_LEMON_ILPLoad_R1_256gpu)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond)->Iterations(1);

// LEMON NetworkSimplex on our fully reduced network: GPU groups merged and, per layer, a chain of
// equal-cost classes whose convex chain arcs are expanded into E parallel unit arcs (cost
// (p_{k+1} - p_k) x t-th lightest frequency, scaled by 1e9). Same optimum, linear costs only.
static void BM_LEMON_reduced_ILPLoad_R1_256gpu(benchmark::State& st) {
  using namespace lemon;
  auto const& p = r1_problem(static_cast<int>(st.range(0)));
  auto const& load = r1_load();
  std::map<std::vector<int>, std::vector<int>> groups;
  for (int g = 0; g < p.gpus; ++g) {
    std::vector<int> col;
    for (int l = 0; l < kLayers; ++l) col.push_back(p.cost(l, g));
    groups[col].push_back(g);
  }
  double total = 0;
  for (auto _ : st) {
    SmartDigraph gr;
    SmartDigraph::ArcMap<long long> cap(gr), cost(gr);
    SmartDigraph::NodeMap<long long> sup(gr);
    auto sink = gr.addNode();
    std::vector<SmartDigraph::Node> gn;
    std::vector<int> rep, size;
    for (auto const& [col, gs] : groups) {
      gn.push_back(gr.addNode());
      rep.push_back(gs[0]);
      size.push_back(static_cast<int>(gs.size()));
      auto a = gr.addArc(gn.back(), sink);
      cap[a] = static_cast<long long>(p.c_exp) * gs.size();
      cost[a] = 0;
    }
    int NG = static_cast<int>(gn.size());
    double base = 0;
    for (int l = 0; l < kLayers; ++l) {
      double s = 0;
      for (int e = 0; e < kExperts; ++e) s += load[l * kExperts + e];
      std::vector<double> asc(kExperts);
      for (int e = 0; e < kExperts; ++e) asc[e] = load[l * kExperts + e] / s;
      std::sort(asc.begin(), asc.end());
      std::vector<int> cls;
      for (int j = 0; j < NG; ++j) cls.push_back(p.cost(l, rep[j]));
      std::sort(cls.begin(), cls.end());
      cls.erase(std::unique(cls.begin(), cls.end()), cls.end());
      base += cls[0];  // frequencies of a layer sum to 1
      std::vector<SmartDigraph::Node> cn(cls.size());
      for (auto& n : cn) n = gr.addNode();
      sup[cn[0]] = kExperts;
      for (std::size_t k = 0; k + 1 < cls.size(); ++k)
        for (int t = 0; t < kExperts; ++t) {
          auto a = gr.addArc(cn[k], cn[k + 1]);
          cap[a] = 1;
          cost[a] = std::llround(1e9 * (cls[k + 1] - cls[k]) * asc[t]);
        }
      for (int j = 0; j < NG; ++j) {
        int k = static_cast<int>(std::lower_bound(cls.begin(), cls.end(), p.cost(l, rep[j])) - cls.begin());
        auto a = gr.addArc(cn[k], gn[j]);
        cap[a] = static_cast<long long>(p.c_layer) * size[j];
        cost[a] = 0;
      }
    }
    sup[sink] = -static_cast<long long>(kLayers) * kExperts;
    NetworkSimplex<SmartDigraph, long long, long long> ns(gr);
    ns.upperMap(cap).costMap(cost).supplyMap(sup);
    if (ns.run() != NetworkSimplex<SmartDigraph, long long, long long>::OPTIMAL) st.SkipWithError("LEMON: not optimal");
    total = base + static_cast<double>(ns.totalCost()) / 1e9;
  }
  st.counters["objective"] = total;
}
BENCHMARK(BM_LEMON_reduced_ILPLoad_R1_256gpu)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond)->MinTime(1.0);
#endif

static void BM_CRAFT_R1_64gpu_3000batches(benchmark::State& st) {
  auto const& prof = r1_profile_3000();
  replication::craft::Plan plan;
  replication::craft::Options o;
  o.replication_factor = static_cast<int>(st.range(0));
  o.threads = static_cast<int>(st.range(1));
  for (auto _ : st) {
    plan = replication::craft::plan(prof, 64, o);
    benchmark::DoNotOptimize(plan.replicas.data());
  }
  auto totals = prof.totals();
  auto t0 = std::chrono::steady_clock::now();
  auto e = replication::eplb::rebalance_experts(totals, kLayers, kExperts, kExperts + 64, 1, 1, 64);
  benchmark::DoNotOptimize(e.logcnt.v.data());
  st.counters["eplb_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st.counters["R"] = plan.replication_factor;
  st.counters["batch_layers_per_s"] =
      benchmark::Counter(3000.0 * kLayers, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["paper_s"] = 10;
}
// Arguments: replicas per GPU R (0 = automatic), threads for the benefit replay.
BENCHMARK(BM_CRAFT_R1_64gpu_3000batches)
    ->Args({0, 1})
    ->Args({8, 1})
    ->Args({0, 2})
    ->Args({8, 2})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0)
    ->UseRealTime();

BENCHMARK_MAIN();
