// The reactive-routing study of joint_compare (tools/include/moe_tools/reactive_study.hpp): its routes
// serve every pair with a copy of the pair's expert, its linear program reaches the optimum of a
// brute-force search on small clusters, its greedy rule and the dealing of pairs to copies do what
// they say, on a hand-worked case and on seeded random instances.

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

#include "moe/topology/topology.hpp"
#include "moe/topology/traffic.hpp"
#include "moe_tools/reactive_study.hpp"

namespace {

using moe::study::RoutingProblem;

/// Bottleneck of routes x on a one-switch cluster of one-GPU servers, from first principles: a pair
/// served off its server crosses the source's NIC up and the destination's NIC down (dispatch),
/// and back (combine). In pairs: the busiest NIC direction of each phase, summed.
double star_bottleneck(RoutingProblem const& p, std::vector<double> const& x) {
  std::vector<double> out(static_cast<std::size_t>(p.S), 0.0), in(out);
  for (std::size_t c = 0; c < p.cols.size(); ++c)
    if (p.cols[c].server != p.cols[c].s) {
      out[static_cast<std::size_t>(p.cols[c].s)] += x[c];
      in[static_cast<std::size_t>(p.cols[c].server)] += x[c];
    }
  double d = std::max(*std::max_element(out.begin(), out.end()), *std::max_element(in.begin(), in.end()));
  return 2 * d;  // the combine sends the same pairs back: its busiest direction carries as much
}

/// Every (server, expert) group's columns sum to its pairs.
void require_rows(RoutingProblem const& p, std::vector<double> const& x) {
  REQUIRE(x.size() == p.cols.size());
  for (int se = 0; se < p.S * p.E; ++se) {
    double sum = 0;
    for (int c = p.first[static_cast<std::size_t>(se)]; c < p.first[static_cast<std::size_t>(se) + 1]; ++c) {
      REQUIRE(x[static_cast<std::size_t>(c)] >= -1e-9);
      sum += x[static_cast<std::size_t>(c)];
    }
    REQUIRE(sum == Approx(p.n[static_cast<std::size_t>(se)]).margin(1e-7));
  }
}

struct Instance {
  moe::topology::Topology topo;
  std::vector<std::vector<int>> copies;
  moe::topology::Batch batch;
};

/// `servers` one-GPU servers on one leaf; `experts` experts with one or two copies on distinct GPUs;
/// `tokens` top-1 tokens from random GPUs (seeded).
Instance random_instance(std::mt19937& rng, int servers, int experts, int tokens) {
  Instance in{moe::topology::fat_tree(1, servers, 1), {}, {}};
  std::uniform_int_distribution<int> gpu(0, servers - 1), ex(0, experts - 1), two(0, 1);
  for (int e = 0; e < experts; ++e) {
    std::vector<int> c{gpu(rng)};
    if (two(rng)) {
      int g = gpu(rng);
      if (g != c[0]) c.push_back(g);
    }
    in.copies.push_back(c);
  }
  in.batch.top_k = 1;
  for (int t = 0; t < tokens; ++t) in.batch.source.push_back(gpu(rng)), in.batch.experts.push_back(ex(rng));
  return in;
}

/// The least star_bottleneck over every split of every group's pairs, each column a multiple of
/// `step` (the GPU cap is left loose in these instances). Groups have one or two columns.
double brute_force(RoutingProblem const& p, double step) {
  std::vector<int> two;  // groups with a choice
  std::vector<double> x(p.cols.size(), 0.0);
  for (int se = 0; se < p.S * p.E; ++se) {
    int lo = p.first[static_cast<std::size_t>(se)], hi = p.first[static_cast<std::size_t>(se) + 1];
    if (hi - lo == 1) x[static_cast<std::size_t>(lo)] = p.n[static_cast<std::size_t>(se)];
    if (hi - lo == 2) two.push_back(se);
  }
  double best = 1e300;
  auto visit = [&](auto&& self, std::size_t i) -> void {
    if (i == two.size()) {
      best = std::min(best, star_bottleneck(p, x));
      return;
    }
    int se = two[i], lo = p.first[static_cast<std::size_t>(se)];
    double n = p.n[static_cast<std::size_t>(se)];
    for (double a = 0; a <= n + 1e-9; a += step) {
      x[static_cast<std::size_t>(lo)] = a;
      x[static_cast<std::size_t>(lo) + 1] = n - a;
      self(self, i + 1);
    }
  };
  visit(visit, 0);
  return best;
}

}  // namespace

TEST_CASE("reactive study: hand-worked split of one server's pairs over two copies", "[reactive]") {
  // Two one-GPU servers, expert 0 on both GPUs, 10 tokens on GPU 0. Mean 5 pairs per GPU, cap 5.25:
  // GPU 0 keeps 5 (greedy: whole pairs) or 5.25 (LP), the rest crosses to GPU 1.
  auto topo = moe::topology::fat_tree(1, 2, 1);
  moe::topology::TrafficModel model(topo);
  moe::study::ServerPaths paths(topo, model, 7168 * 2.0);
  std::vector<std::vector<int>> copies{{0, 1}};
  moe::topology::Batch batch{1, std::vector<int>(10, 0), std::vector<int>(10, 0)};
  RoutingProblem p(topo, copies, batch);
  REQUIRE(p.cols.size() == 2);
  auto g = moe::study::greedy_routes(p, paths, 0.05);
  CHECK(g[0] == 5);
  CHECK(g[1] == 5);
  auto lp = moe::study::lp_routes(p, paths, 0.05);
  CHECK(lp[0] == Approx(5.25));
  CHECK(lp[1] == Approx(4.75));
  // Dealing, in batch order: the first 5 pairs stay, the next 5 cross, for both (5.25 passes 4.5
  // but not 5.5).
  for (auto const* x : {&g, &lp}) {
    moe::study::DealtRoutes dealt(topo, p, *x, batch);
    for (int t = 0; t < 10; ++t) CHECK(dealt.choose(0, 0, 0, t) == (t < 5 ? 0 : 1));
  }
}

TEST_CASE("reactive study: the linear program meets brute force; greedy and dealing keep to their routes",
          "[reactive]") {
  std::mt19937 rng(2026);
  for (int trial = 0; trial < 40; ++trial) {
    int servers = 3 + trial % 2;
    auto in = random_instance(rng, servers, 4, 6 + trial % 5);
    INFO("trial " << trial);
    moe::topology::TrafficModel model(in.topo);
    double token_bytes = 1000;
    moe::study::ServerPaths paths(in.topo, model, token_bytes);
    RoutingProblem p(in.topo, in.copies, in.batch);
    double eps = 100;  // a loose GPU cap: the network alone decides

    auto lp = moe::study::lp_routes(p, paths, eps);
    require_rows(p, lp);
    // The LP optimum is at most the best point of the quarter-pair grid, and on these instances
    // the grid holds an optimal vertex, so the two agree.
    double best = brute_force(p, 0.25), lp_value = star_bottleneck(p, lp);
    CHECK(lp_value == Approx(best).margin(1e-7));

    auto g = moe::study::greedy_routes(p, paths, eps);
    require_rows(p, g);
    for (double v : g) CHECK(v == std::floor(v));           // whole pairs
    CHECK(star_bottleneck(p, g) >= lp_value - 1e-7);        // the LP is a bound

    // Dealing: every pair goes to a copy of its expert, and each column receives its x (whole).
    moe::study::DealtRoutes dealt(in.topo, p, g, in.batch);
    std::vector<double> got(p.cols.size(), 0.0);
    for (int t = 0; t < in.batch.tokens(); ++t) {
      int e = in.batch.experts[static_cast<std::size_t>(t)];
      int gpu = dealt.choose(e, 0, in.batch.source[static_cast<std::size_t>(t)], t);
      auto const& ce = in.copies[static_cast<std::size_t>(e)];
      REQUIRE(std::find(ce.begin(), ce.end(), gpu) != ce.end());
      auto se = p.at(in.topo.server_of(in.batch.source[static_cast<std::size_t>(t)]), e);
      for (int c = p.first[se]; c < p.first[se + 1]; ++c)
        if (p.cols[static_cast<std::size_t>(c)].g == gpu) got[static_cast<std::size_t>(c)] += 1;
    }
    for (std::size_t c = 0; c < got.size(); ++c) CHECK(got[c] == g[c]);
  }
}

TEST_CASE("reactive study: parallel rounds move pairs off the busiest link", "[reactive]") {
  // Four one-GPU servers. Expert 0 has copies on GPUs 2 and 3, expert 1 one copy on GPU 2.
  // Server 0 sends 4 pairs of expert 0, server 1 4 pairs of expert 1. The static start splits
  // expert 0 evenly: GPU 2's NIC receives 6 pairs, so the bottleneck is 2 x 6. Sending all of
  // expert 0 to GPU 3 gives 2 x 4, the optimum (each source sends 4 pairs whatever the routes).
  auto topo = moe::topology::fat_tree(1, 4, 1);
  moe::topology::TrafficModel model(topo);
  moe::study::ServerPaths paths(topo, model, 1000);
  std::vector<std::vector<int>> copies{{2, 3}, {2}};
  moe::topology::Batch batch{1, {0, 0, 0, 0, 1, 1, 1, 1}, {0, 0, 0, 0, 1, 1, 1, 1}};
  RoutingProblem p(topo, copies, batch);
  std::vector<double> start(p.cols.size()), x0(p.cols.size());
  for (std::size_t c = 0; c < p.cols.size(); ++c) {
    start[c] = p.cols[c].e == 0 ? 0.5 : 1.0;
    x0[c] = 4 * start[c];
  }
  CHECK(star_bottleneck(p, x0) == Approx(12));
  CHECK(brute_force(p, 0.25) == Approx(8));
  auto none = moe::study::round_routes(p, paths, start, 0.05, 0, 3);
  CHECK(star_bottleneck(p, none) == Approx(12));  // no round: the start
  auto x = moe::study::round_routes(p, paths, start, 0.05, 20, 3);
  require_rows(p, x);
  CHECK(star_bottleneck(p, x) < 8.5);
}
