// Planner benchmarks (host, single thread):
//  - exact ILPLoad for DeepSeek-R1 (58 MoE layers x 256 experts) on the ILP paper's 256-GPU cluster,
//    c_layer 1 and 8, c_exp 64 (the paper's CVXPY solve took 1397 s); greedy and, when LEMON is
//    available, LEMON's NetworkSimplex on the GPU-grouped expert network in the same run;
//  - CRAFT's whole plan for DeepSeek-R1 on 64 GPUs from 3000 profiled batches (the paper: about
//    10 s), with EPLB (one replica per layer per GPU) in the same run;
//  - the joint planner for DeepSeek-R1 on the 256-GPU FatTree and Dragonfly (target: under 1 s), with
//    EPLB at the same memory (256 redundant slots per layer) in the same run.
// Loads are synthetic (seeded Zipf-like marginals, exponents 0.3..0.8; seeded batches).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <span>
#include <random>
#include <numeric>

#include "moe/placement/heuristics.hpp"
#include "moe/placement/ilp.hpp"
#include "moe/placement/joint.hpp"
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
/// Co-selections for the joint planner's steps 3b and 3c: per layer, 4096 seeded tokens each
/// choosing 8 distinct experts in proportion to r1_load() (experts drawn independently: pairs only
/// by popularity), counted by add_coactivation and scaled to the units of r1_load().
std::vector<double> const& r1_coact() {
  static auto co = [] {
    auto const& w = r1_load();
    int tokens = 4096, k = 8;
    std::vector<double> c(static_cast<std::size_t>(kLayers) * kExperts * kExperts, 0.0);
    std::mt19937_64 rng(41);
    std::vector<int> chosen;
    for (int l = 0; l < kLayers; ++l) {
      auto first = w.begin() + static_cast<std::ptrdiff_t>(l) * kExperts;
      std::discrete_distribution<int> pick(first, first + kExperts);
      double sum = std::accumulate(first, first + kExperts, 0.0);
      chosen.clear();
      for (int t = 0; t < tokens; ++t)
        for (int j = 0; j < k; ++j) {
          int e;
          do e = pick(rng);
          while (std::find(chosen.end() - j, chosen.end(), e) != chosen.end());
          chosen.push_back(e);
        }
      auto layer = std::span(c).subspan(static_cast<std::size_t>(l) * kExperts * kExperts,
                                        static_cast<std::size_t>(kExperts) * kExperts);
      placement::joint::add_coactivation(chosen, k, kExperts, layer);
      for (auto& x : layer) x *= sum / (static_cast<double>(tokens) * k);
    }
    return c;
  }();
  return co;
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

// The reduced network that ilp_load hands to our network simplex (placement::reduced_network),
// with costs scaled by 1e9 and rounded to integers, so that our solver and LEMON's get exactly
// the same arcs, in the same order, with the same integer-valued costs. Presolved: the network
// ilp_load solves (chain arcs forced by c_layer fixed and left out); full: without that presolve
// (the network the earlier versions solved, 6x more arcs at c_layer 1).
namespace {
struct ArcList {
  int nodes = 0;
  std::vector<int> src, dst;
  std::vector<long long> cap, cost, supply;
  std::vector<double> exact_cost;  // unscaled, as ilp_load uses them
};
ArcList const& r1_reduced(int c_layer, bool presolved) {
  static std::map<std::pair<int, bool>, ArcList> cache;
  auto key = std::make_pair(c_layer, presolved);
  auto it = cache.find(key);
  if (it == cache.end()) {
    auto net = placement::reduced_network(placement::ilp_load_instance(r1_problem(c_layer), r1_load()), presolved);
    ArcList l;
    l.nodes = net.nodes();
    for (int v = 0; v < l.nodes; ++v) l.supply.push_back(net.supply(v));
    for (int a = 0; a < net.arcs(); ++a) {
      l.src.push_back(net.source(a));
      l.dst.push_back(net.target(a));
      l.cap.push_back(net.capacity(a));
      l.cost.push_back(std::llround(1e9 * net.cost(a)));
      l.exact_cost.push_back(net.cost(a));
    }
    it = cache.emplace(key, std::move(l)).first;
  }
  return it->second;
}
double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
/// Builds our solver from the arc list and runs it; returns the optimum over the listed arcs
/// (scaled units unless exact_costs) and the pivots.
std::pair<double, long long> solve_ours(ArcList const& l, bool exact_costs) {
  placement::NetworkSimplex ns(l.nodes);
  ns.reserve(static_cast<int>(l.src.size()));
  for (std::size_t a = 0; a < l.src.size(); ++a) {
    ns.add_arc(l.src[a], l.dst[a], l.cap[a], exact_costs ? l.exact_cost[a] : static_cast<double>(l.cost[a]));
  }
  for (int v = 0; v < l.nodes; ++v) ns.set_supply(v, l.supply[static_cast<std::size_t>(v)]);
  if (ns.run() != placement::NetworkSimplex::Status::optimal) return {-1, 0};
  return {ns.total_cost(), ns.pivots()};
}
}  // namespace

// Our network simplex alone on the reduced network (graph build included). Arguments: c_layer,
// costs (0 = the integer-scaled costs LEMON gets, 1 = the exact double costs ilp_load uses),
// network (0 = full, 1 = presolved as in ilp_load).
static void BM_NS_same_network_R1_256gpu(benchmark::State& st) {
  auto const& l = r1_reduced(static_cast<int>(st.range(0)), st.range(2) == 1);
  bool exact = st.range(1) == 1;
  std::pair<double, long long> r;
  for (auto _ : st) {
    r = solve_ours(l, exact);
    benchmark::DoNotOptimize(r);
  }
  if (r.first < 0) st.SkipWithError("ours: not optimal");
  st.counters["pivots"] = static_cast<double>(r.second);
  st.counters["arcs"] = static_cast<double>(l.src.size());
  st.counters["nodes"] = l.nodes;
}
BENCHMARK(BM_NS_same_network_R1_256gpu)
    ->ArgsProduct({{1, 8}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);

#ifdef MOE_BENCH_LEMON
/// LEMON's NetworkSimplex (default Block Search pivot rule) built from the same arc list.
static double solve_lemon(ArcList const& l) {
  using namespace lemon;
  SmartDigraph gr;
  gr.reserveNode(l.nodes);
  gr.reserveArc(static_cast<int>(l.src.size()));
  std::vector<SmartDigraph::Node> nd(static_cast<std::size_t>(l.nodes));
  for (auto& x : nd) x = gr.addNode();
  SmartDigraph::ArcMap<long long> cap(gr), cost(gr);
  SmartDigraph::NodeMap<long long> sup(gr);
  for (std::size_t a = 0; a < l.src.size(); ++a) {
    auto e = gr.addArc(nd[static_cast<std::size_t>(l.src[a])], nd[static_cast<std::size_t>(l.dst[a])]);
    cap[e] = l.cap[a];
    cost[e] = l.cost[a];
  }
  for (int v = 0; v < l.nodes; ++v) sup[nd[static_cast<std::size_t>(v)]] = l.supply[static_cast<std::size_t>(v)];
  NetworkSimplex<SmartDigraph, long long, long long> ns(gr);
  ns.upperMap(cap).costMap(cost).supplyMap(sup);
  if (ns.run() != NetworkSimplex<SmartDigraph, long long, long long>::OPTIMAL) return -1;
  return static_cast<double>(ns.totalCost());
}

// LEMON alone on the same arc list (graph build included). Arguments: c_layer, network (0 =
// full, 1 = presolved as in ilp_load).
static void BM_LEMON_same_network_R1_256gpu(benchmark::State& st) {
  auto const& l = r1_reduced(static_cast<int>(st.range(0)), st.range(1) == 1);
  double r = 0;
  for (auto _ : st) {
    r = solve_lemon(l);
    benchmark::DoNotOptimize(r);
  }
  if (r < 0) st.SkipWithError("LEMON: not optimal");
  st.counters["arcs"] = static_cast<double>(l.src.size());
}
BENCHMARK(BM_LEMON_same_network_R1_256gpu)->ArgsProduct({{1, 8}, {0, 1}})->Unit(benchmark::kMillisecond)->MinTime(1.0);

// Paired: every iteration runs ours (integer-scaled costs) and LEMON on the same arc list, each
// timed with this thread's CPU clock, so both see the same machine load (which one goes first
// alternates). Arguments: c_layer,
// network (0 = full, 1 = presolved as in ilp_load). Counters: CPU ms per solve of each and
// ours / LEMON (sums over all iterations); the optima must agree exactly (integer costs).
static void BM_NS_vs_LEMON_paired_R1_256gpu(benchmark::State& st) {
  auto const& l = r1_reduced(static_cast<int>(st.range(0)), st.range(1) == 1);
  double ours_s = 0, lemon_s = 0;
  bool same = true;
  long long i = 0;
  for (auto _ : st) {
    // The solver that runs second in a pair is about 10% faster (it gets the memory the first
    // one just freed), so the order alternates.
    bool ours_first = (i++ & 1) == 0;
    double r = 0;
    std::pair<double, long long> o;
    double t0 = thread_cpu_s();
    if (ours_first) o = solve_ours(l, false);
    else r = solve_lemon(l);
    double t1 = thread_cpu_s();
    if (ours_first) r = solve_lemon(l);
    else o = solve_ours(l, false);
    double t2 = thread_cpu_s();
    ours_s += ours_first ? t1 - t0 : t2 - t1;
    lemon_s += ours_first ? t2 - t1 : t1 - t0;
    same = same && o.first >= 0 && o.first == r;
  }
  if (!same) st.SkipWithError("ours and LEMON disagree");
  auto n = static_cast<double>(st.iterations());
  st.counters["ours_cpu_ms"] = 1e3 * ours_s / n;
  st.counters["lemon_cpu_ms"] = 1e3 * lemon_s / n;
  st.counters["ours_over_lemon"] = ours_s / lemon_s;
}
BENCHMARK(BM_NS_vs_LEMON_paired_R1_256gpu)->ArgsProduct({{1, 8}, {0, 1}})->Unit(benchmark::kMillisecond)->MinTime(2.0);

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

// Arguments: topology (0 = FatTree, 1 = Dragonfly), the ILP paper's 256-GPU cluster; server cap
// (1 = on, with each expert's load spread set to 20% of its load: the timing does not depend on
// the values, joint_compare uses the training batches' spread); co-activation (1 = r1_coact():
// steps 3b and 3c, with the fallback placements they may need).
static void BM_Joint_R1_256gpu(benchmark::State& st) {
  auto kind = st.range(0) == 0 ? topology::Kind::fat_tree : topology::Kind::dragonfly;
  auto topo = topology::paper_cluster(kind);
  auto const& load = r1_load();
  placement::joint::Options o;
  if (st.range(1) == 1)
    for (double w : load) o.load_sd.push_back(0.2 * w);
  if (st.range(2) == 1) o.coact = r1_coact();
  placement::joint::Result r;
  for (auto _ : st) {
    r = placement::joint::plan(topo, load, kLayers, kExperts, o);
    benchmark::DoNotOptimize(r.stats.data());
  }
  auto t0 = std::chrono::steady_clock::now();
  auto e = replication::eplb::rebalance_experts(load, kLayers, kExperts, kExperts + 256, 8, topo.servers(), 256);
  benchmark::DoNotOptimize(e.logcnt.v.data());
  st.counters["eplb_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double hops = 0, bound = 0, worst = 0;
  for (auto const& x : r.stats) hops += x.mean_hops / kLayers, bound += x.hops_bound / kLayers, worst = std::max(worst, x.max_load_ratio);
  st.counters["hops"] = hops;
  st.counters["hops_bound"] = bound;
  st.counters["max_load"] = worst;
  st.counters["S"] = r.slots_per_gpu;
  auto co = r.co_location_totals();
  st.counters["co_layers"] = co.layers;
  st.counters["swaps"] = co.swaps;
}
BENCHMARK(BM_Joint_R1_256gpu)
    ->Args({0, 0, 0})
    ->Args({1, 0, 0})
    ->Args({0, 1, 0})
    ->Args({1, 1, 0})
    ->Args({0, 1, 1})
    ->Args({1, 1, 1})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);

BENCHMARK_MAIN();
