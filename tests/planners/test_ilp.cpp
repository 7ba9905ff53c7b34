// Exact ILP / ILPLoad placement: the min-cost-flow optimum must equal GLPK's MIP optimum (an
// independent solver on the plain 0-1 model) and LEMON's NetworkSimplex on the unreduced network
// (one node per expert, one arc per expert and GPU), on random small and a few medium instances.
#include <catch2/catch.hpp>

#include <glpk.h>
#include <lemon/network_simplex.h>
#include <lemon/smart_graph.h>

#include "moe/placement/heuristics.hpp"
#include "moe/placement/ilp.hpp"
#include "moe/placement/network_simplex.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/topology/topology.hpp"

using namespace moe;
using namespace moe::placement;

namespace {

double W(FlowInstance const& in, int l, int e) { return in.weight.empty() ? 1.0 : in.weight[l * in.experts + e]; }

/// GLPK MIP on y(l,e,g) in {0,1}. Returns NaN when GLPK finds no feasible solution.
double glpk_optimum(FlowInstance const& in) {
  int L = in.layers, E = in.experts, G = in.gpus;
  glp_prob* lp = glp_create_prob();
  glp_set_obj_dir(lp, GLP_MIN);
  int nv = L * E * G;
  glp_add_cols(lp, nv);
  auto var = [&](int l, int e, int g) { return 1 + (l * E + e) * G + g; };
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < E; ++e)
      for (int g = 0; g < G; ++g) {
        int j = var(l, e, g);
        glp_set_col_kind(lp, j, GLP_BV);
        glp_set_obj_coef(lp, j, W(in, l, e) * in.cost[l * G + g]);
      }
  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0};
  int row = 0;
  auto add_row = [&](int type, double lo, double hi) {
    glp_add_rows(lp, 1);
    ++row;
    glp_set_row_bnds(lp, row, type, lo, hi);
  };
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < E; ++e) {
      add_row(GLP_FX, 1, 1);
      for (int g = 0; g < G; ++g) ia.push_back(row), ja.push_back(var(l, e, g)), ar.push_back(1);
    }
  for (int g = 0; g < G; ++g) {
    add_row(GLP_UP, 0, in.c_exp);
    for (int l = 0; l < L; ++l)
      for (int e = 0; e < E; ++e) ia.push_back(row), ja.push_back(var(l, e, g)), ar.push_back(1);
  }
  for (int l = 0; l < L; ++l)
    for (int g = 0; g < G; ++g) {
      add_row(GLP_UP, 0, in.c_layer);
      for (int e = 0; e < E; ++e) ia.push_back(row), ja.push_back(var(l, e, g)), ar.push_back(1);
    }
  glp_load_matrix(lp, static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());
  glp_iocp parm;
  glp_init_iocp(&parm);
  parm.presolve = GLP_ON;
  parm.msg_lev = GLP_MSG_OFF;
  int rc = glp_intopt(lp, &parm);
  double v = std::numeric_limits<double>::quiet_NaN();
  if (rc == 0 && glp_mip_status(lp) == GLP_OPT) v = glp_mip_obj_val(lp);
  glp_delete_prob(lp);
  return v;
}

/// LEMON NetworkSimplex on the plain network: expert -> (layer, GPU) -> GPU -> sink. Costs are
/// scaled to integers (test weights are integers already).
double lemon_optimum(FlowInstance const& in) {
  using namespace lemon;
  int L = in.layers, E = in.experts, G = in.gpus;
  SmartDigraph g;
  SmartDigraph::ArcMap<long long> cap(g), cost(g);
  SmartDigraph::NodeMap<long long> sup(g);
  auto sink = g.addNode();
  std::vector<SmartDigraph::Node> gpu(G), lg(L * G);
  for (int s = 0; s < G; ++s) {
    gpu[s] = g.addNode();
    auto a = g.addArc(gpu[s], sink);
    cap[a] = in.c_exp;
    cost[a] = 0;
  }
  for (int l = 0; l < L; ++l)
    for (int s = 0; s < G; ++s) {
      lg[l * G + s] = g.addNode();
      auto a = g.addArc(lg[l * G + s], gpu[s]);
      cap[a] = in.c_layer;
      cost[a] = 0;
    }
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < E; ++e) {
      auto x = g.addNode();
      sup[x] = 1;
      for (int s = 0; s < G; ++s) {
        auto a = g.addArc(x, lg[l * G + s]);
        cap[a] = 1;
        cost[a] = std::llround(W(in, l, e) * in.cost[l * G + s]);
      }
    }
  sup[sink] = -static_cast<long long>(L) * E;
  lemon::NetworkSimplex<SmartDigraph, long long, long long> ns(g);
  ns.upperMap(cap).costMap(cost).supplyMap(sup);
  if (ns.run() != lemon::NetworkSimplex<SmartDigraph, long long, long long>::OPTIMAL) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(ns.totalCost());
}

void check_solution(FlowInstance const& in, ExactResult const& r) {
  Problem p;  // only for the constraint check
  p.layers = in.layers;
  p.experts = in.experts;
  p.gpus = in.gpus;
  p.c_layer = in.c_layer;
  p.c_exp = in.c_exp;
  check_assignment(p, r.assignment);
  double obj = 0;
  for (int l = 0; l < in.layers; ++l)
    for (int e = 0; e < in.experts; ++e) obj += W(in, l, e) * in.cost[l * in.gpus + r.assignment.at(l, e)];
  CHECK(obj == Approx(r.objective).margin(1e-9));
}

}  // namespace

TEST_CASE("exact placement equals GLPK and LEMON on 200 random small instances") {
  profile::Rng rng(2026);
  int feasible = 0, infeasible = 0;
  for (int it = 0; it < 200; ++it) {
    FlowInstance in;
    in.layers = 1 + rng.below(3);
    in.experts = 1 + rng.below(6);
    in.gpus = 1 + rng.below(6);
    in.c_layer = 1 + rng.below(in.experts);
    in.c_exp = 1 + rng.below(in.layers * in.experts);
    int distinct = 1 + rng.below(5);  // few distinct costs: many ties, like hop counts
    for (int i = 0; i < in.layers * in.gpus; ++i) in.cost.push_back(rng.below(distinct) * 2);
    if (it % 3 != 0)
      for (int i = 0; i < in.layers * in.experts; ++i) in.weight.push_back(rng.below(it % 2 ? 4 : 50));
    double ref = glpk_optimum(in);
    INFO("instance " << it << ": L=" << in.layers << " E=" << in.experts << " G=" << in.gpus
                     << " c_layer=" << in.c_layer << " c_exp=" << in.c_exp);
    if (std::isnan(ref)) {
      ++infeasible;
      CHECK_THROWS_WITH(solve_exact(in), Catch::Contains("infeasible"));
      CHECK_THROWS_WITH(solve_exact(in, Solver::shortest_paths), Catch::Contains("infeasible"));
      CHECK(std::isnan(lemon_optimum(in)));
      continue;
    }
    ++feasible;
    auto r = solve_exact(in);
    CHECK(r.objective == Approx(ref).margin(1e-9));
    auto r2 = solve_exact(in, Solver::shortest_paths);
    CHECK(r2.objective == Approx(ref).margin(1e-9));
    check_solution(in, r2);
    CHECK(r.objective == Approx(lemon_optimum(in)).margin(1e-9));
    check_solution(in, r);
  }
  CHECK(feasible >= 100);
  CHECK(infeasible > 0);
}

TEST_CASE("exact placement equals GLPK on medium topology instances (ILP and ILPLoad)") {
  struct Case { topology::Topology topo; int layers, experts, c_layer, c_exp; };
  std::vector<Case> cases = {
      {topology::fat_tree(4, 2, 2, 2), 4, 16, 2, 8},
      {topology::dragonfly(4, 2, 2, 2), 5, 16, 1, 6},
      {topology::fat_tree_sparse(4, 2, 2, 2), 6, 12, 3, 6},
      {topology::dragonfly_sparse(8, 1, 2, 4), 3, 24, 2, 5},
  };
  int k = 0, compared = 0;
  for (auto& c : cases) {
    auto p = make_problem(c.topo, c.layers, c.experts, c.c_layer, c.c_exp);
    auto marg = profile::zipf_marginals(c.layers, c.experts, 0.5, 1.5, 11 + k++);
    std::vector<double> load;
    for (double w : marg.weight) load.push_back(std::round(1000 * w));
    for (int weighted = 0; weighted < 2; ++weighted) {
      FlowInstance in{p.layers, p.experts, p.gpus, p.c_layer, p.c_exp, p.cost_matrix(), weighted ? load : std::vector<double>{}};
      auto r = solve_exact(in);
      double ref = glpk_optimum(in);
      CHECK(r.objective == Approx(ref).margin(1e-6));
      CHECK(solve_exact(in, Solver::shortest_paths).objective == Approx(ref).margin(1e-6));
      check_solution(in, r);
      // The exact optimum is never worse than the heuristics on the same objective (greedy may
      // run out of room under a tight c_exp, where it reports so).
      try {
        double g = objective(p, greedy(p), in.weight);
        CHECK(r.objective <= g + 1e-9);
        ++compared;
      } catch (moe::Error const& e) {
        CHECK_THAT(e.what(), Catch::Contains("greedy"));
      }
    }
  }
  CHECK(compared >= 6);
}

TEST_CASE("ILP / ILPLoad wrappers and capacity errors") {
  auto topo = topology::fat_tree(2, 2, 2, 2);
  auto p = make_problem(topo, 2, 8, 2, 8);
  auto r = ilp(p);
  check_assignment(p, r.assignment);
  CHECK(r.groups <= p.gpus);
  std::vector<double> load(16, 1.0);
  load[3] = 100;
  auto rl = ilp_load(p, load);
  check_assignment(p, rl.assignment);
  // c_layer too small for a layer, c_exp too small for the model.
  CHECK_THROWS_WITH(make_problem(topo, 2, 8, 0, 8), Catch::Contains("positive"));
  CHECK_THROWS_WITH(make_problem(topo, 2, 17, 2, 8), Catch::Contains("infeasible"));
  CHECK_THROWS_WITH(make_problem(topo, 2, 8, 2, 1), Catch::Contains("infeasible"));
  std::vector<double> bad(16, 1.0);
  bad[0] = -1;
  CHECK_THROWS_AS(ilp_load(p, bad), moe::Error);
}

namespace {

/// One random general network (some negative costs, random supplies) solved by ours and LEMON's;
/// returns 1 when LEMON finds it optimal, 0 when infeasible. Our flow is checked arc by arc
/// (bounds, conservation) and our cost against LEMON's optimum. On odd instances about a third
/// of the arcs are given to ours as warm-start hints (start at the upper bound), which must not
/// change the optimum or the feasibility verdict.
int compare_random_network(profile::Rng& rng, int it, int n, int m, int max_cap, int max_supply) {
  NetworkSimplex ours(n);
  lemon::SmartDigraph g;
  std::vector<lemon::SmartDigraph::Node> v;
  for (int i = 0; i < n; ++i) v.push_back(g.addNode());
  lemon::SmartDigraph::ArcMap<long long> cap(g), cost(g);
  lemon::SmartDigraph::NodeMap<long long> sup(g);
  std::vector<int> src, dst;
  std::vector<long long> caps;
  for (int a = 0; a < m; ++a) {
    int s = rng.below(n), t = rng.below(n);
    if (s == t) continue;
    long long c = rng.below(max_cap), w = rng.below(20) - (it % 4 == 0 ? 0 : 5);  // some negative costs
    int id = ours.add_arc(s, t, c, static_cast<double>(w));
    if (it % 2 == 1 && rng.below(3) == 0) ours.start_at_upper(id);
    src.push_back(s), dst.push_back(t), caps.push_back(c);
    auto e = g.addArc(v[s], v[t]);
    cap[e] = c;
    cost[e] = w;
  }
  std::vector<long long> b(n, 0);
  for (int k = 0; k < n; ++k) {
    int x = rng.below(n), y = rng.below(n);
    long long amt = rng.below(max_supply);
    b[x] += amt;
    b[y] -= amt;
  }
  for (int i = 0; i < n; ++i) {
    ours.set_supply(i, b[i]);
    sup[v[i]] = b[i];
  }
  lemon::NetworkSimplex<lemon::SmartDigraph, long long, long long> ref(g);
  ref.upperMap(cap).costMap(cost).supplyMap(sup);
  auto rs = ref.run();
  auto os = ours.run();
  INFO("instance " << it << " (" << n << " nodes, " << src.size() << " arcs)");
  if (rs != lemon::NetworkSimplex<lemon::SmartDigraph, long long, long long>::OPTIMAL) {
    CHECK(os == NetworkSimplex::Status::infeasible);
    return 0;
  }
  REQUIRE(os == NetworkSimplex::Status::optimal);
  CHECK(ours.total_cost() == Approx(static_cast<double>(ref.totalCost())).margin(1e-9));
  std::vector<long long> net(n, 0);
  bool bounds = true;
  for (int a = 0; a < static_cast<int>(src.size()); ++a) {
    long long f = ours.flow(a);
    bounds = bounds && f >= 0 && f <= caps[a];
    net[src[a]] += f;
    net[dst[a]] -= f;
  }
  CHECK(bounds);
  CHECK(net == b);
  return 1;
}

}  // namespace

TEST_CASE("our network simplex equals LEMON's on random general networks") {
  profile::Rng rng(77);
  int optimal = 0, infeasible = 0;
  for (int it = 0; it < 300; ++it) {
    int n = 2 + rng.below(10), m = 2 * n + rng.below(4 * n);
    int r = compare_random_network(rng, it, n, m, 8, 5);
    optimal += r;
    infeasible += 1 - r;
  }
  CHECK(optimal >= 100);
  CHECK(infeasible > 0);
}

TEST_CASE("our network simplex equals LEMON's on larger random networks (deep trees, many pivots)") {
  profile::Rng rng(78);
  int optimal = 0;
  for (int it = 0; it < 40; ++it) {
    int n = 50 + rng.below(250), m = 4 * n + rng.below(16 * n);
    optimal += compare_random_network(rng, it, n, m, 30, 40);
  }
  CHECK(optimal >= 10);
}
