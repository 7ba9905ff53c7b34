// replication::Reactive, the replica policy that routes each batch from every rank's counts: it
// deals every pair of a batch to a GPU holding a copy of its expert, exactly as many to each copy
// as its routes say, conserving every (server, expert) group; and it rejects bad input by name.
// (Its greedy rule is checked against brute force and linear programs in test_reactive_study; the
// layer that runs it in test_planned_layer and test_joint_layer_mpi.)

#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "moe/replication/reactive.hpp"
#include "moe/topology/topology.hpp"

using namespace moe;

TEST_CASE("reactive replicas deal every pair of a batch to its routes", "[replication][reactive]") {
  std::mt19937 rng(41);
  for (int trial = 0; trial < 30; ++trial) {
    // 2 leaves x 2 servers x 2 GPUs; 12 experts with 1 to 3 copies on distinct GPUs (seeded).
    auto topo = topology::fat_tree(2, 2, 2);
    int G = topo.gpus(), E = 12;
    std::vector<std::vector<int>> copies(static_cast<std::size_t>(E));
    for (auto& c : copies) {
      int n = std::uniform_int_distribution<int>(1, 3)(rng);
      while (static_cast<int>(c.size()) < n) {
        int g = std::uniform_int_distribution<int>(0, G - 1)(rng);
        if (std::find(c.begin(), c.end(), g) == c.end()) c.push_back(g);
      }
    }
    double eps = std::uniform_real_distribution<double>(0.0, 0.5)(rng);
    replication::Reactive policy(copies, topo, eps);
    std::vector<std::int32_t> counts(static_cast<std::size_t>(G * E));
    for (auto& c : counts) c = std::uniform_int_distribution<int>(0, 6)(rng);
    policy.plan_batch(counts);

    // Deal every rank's pairs as the layer does; tally per (server, expert, GPU).
    std::map<std::tuple<int, int, int>, long long> dealt;
    std::map<std::pair<int, int>, long long> group;
    for (int r = 0; r < G; ++r)
      for (int e = 0; e < E; ++e)
        for (int m = 0; m < counts[static_cast<std::size_t>(r * E + e)]; ++m) {
          int g = policy.dealt(e, r, m);
          INFO("trial " << trial << ", rank " << r << ", expert " << e << ", pair " << m);
          REQUIRE(policy.holds(e, copies[static_cast<std::size_t>(e)][0], g));
          ++dealt[{topo.server_of(r), e, g}];
          ++group[{topo.server_of(r), e}];
        }
    // Against the routes the policy chose: each column gets exactly its whole pairs.
    auto const& p = policy.problem();
    auto const& x = policy.routes();
    std::map<std::pair<int, int>, double> routed;
    for (std::size_t c = 0; c < p.cols.size(); ++c) {
      auto const& col = p.cols[c];
      INFO("trial " << trial << ", server " << col.s << ", expert " << col.e << ", GPU " << col.g);
      CHECK(x[c] == std::round(x[c]));
      auto it = dealt.find({col.s, col.e, col.g});
      CHECK((it == dealt.end() ? 0 : it->second) == static_cast<long long>(x[c]));
      routed[{col.s, col.e}] += x[c];
    }
    // Every group's routes carry all its pairs (counted from the counts alone).
    for (auto const& [se, n] : group) CHECK(routed[se] == static_cast<double>(n));
  }
}

TEST_CASE("reactive replicas reject bad input by name", "[replication][reactive]") {
  auto topo = topology::fat_tree(1, 2, 2);  // 4 GPUs
  std::vector<std::vector<int>> copies{{0, 2}, {1}, {3}};
  CHECK_THROWS_WITH(replication::Reactive(copies, topo, -0.1), Catch::Contains("eps must be a non-negative number"));
  CHECK_THROWS_WITH(replication::Reactive(copies, topo, std::nan("")), Catch::Contains("eps must be a non-negative"));
  CHECK_THROWS_WITH(replication::Reactive({{0}, {}, {3}}, topo), Catch::Contains("expert 1 has no copy"));
  CHECK_THROWS_WITH(replication::Reactive({{0}, {4}, {3}}, topo),
                    Catch::Contains("expert 1 has a copy on GPU 4, outside [0, 4)"));
  replication::Reactive r(copies, topo);
  CHECK_THROWS_WITH(r.validate(3, 8, std::vector<int>{0, 1, 3}), Catch::Contains("built for 4 GPUs, the layer has 8"));
  CHECK_THROWS_WITH(r.validate(3, 4, std::vector<int>{1, 1, 3}), Catch::Contains("expert 0 is placed on rank 1"));
  CHECK_THROWS_WITH(r.plan_batch(std::vector<std::int32_t>(11, 1)), Catch::Contains("11 counts, expected 4 ranks x 3"));
  std::vector<std::int32_t> bad(12, 1);
  bad[7] = -2;  // rank 2, expert 1
  CHECK_THROWS_WITH(r.plan_batch(bad), Catch::Contains("rank 2 reports -2 pairs of expert 1"));
}
