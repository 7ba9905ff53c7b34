// Round-robin and greedy placement (ILP paper 4.1, 4.2) on hand-worked cases.
#include <catch2/catch.hpp>

#include "moe/placement/heuristics.hpp"
#include "moe/placement/ilp.hpp"

using namespace moe;
using namespace moe::placement;

namespace {
/// Two servers of two GPUs under one spine: GPUs 0,1 | 2,3; across servers 4 hops.
Problem tiny(int layers, int experts, int c_layer, int c_exp, std::vector<int> attention) {
  auto topo = topology::fat_tree(2, 1, 2, 1);
  Problem p;
  p.layers = layers;
  p.experts = experts;
  p.gpus = topo.gpus();
  p.c_layer = c_layer;
  p.c_exp = c_exp;
  p.hops = topo.gpu_hops();
  p.attention = std::move(attention);
  return p;
}
}  // namespace

TEST_CASE("round-robin deals experts over the window centred on the dispatching attention") {
  REQUIRE(tiny(1, 4, 1, 4, {0, 0}).hop(0, 2) == 4);
  // c_layer 1: d = 4 GPUs, window starts d/2 = 2 to the left of GPU 0: GPUs 2, 3, 0, 1.
  CHECK(round_robin(tiny(1, 4, 1, 4, {0, 0})).gpu == std::vector<int>{2, 3, 0, 1});
  // c_layer 2: d = 2 GPUs: window 3, 0; experts alternate.
  CHECK(round_robin(tiny(1, 4, 2, 4, {0, 0})).gpu == std::vector<int>{3, 0, 3, 0});
  // Dispatch on GPU 2.
  CHECK(round_robin(tiny(1, 4, 2, 4, {2, 0})).gpu == std::vector<int>{1, 2, 1, 2});
  // Two layers, both windows on GPUs 3 and 0: c_exp = 3 is too small for 4 experts there.
  CHECK_THROWS_WITH(round_robin(tiny(2, 4, 2, 3, {0, 0, 0})), Catch::Contains("c_exp"));
}

TEST_CASE("greedy takes the closest GPU with room, in expert order") {
  // p(0, g) = hops(0, g) + hops(g, 0): GPUs 0 and 1 cost 0, GPUs 2 and 3 cost 8.
  CHECK(greedy(tiny(1, 4, 1, 4, {0, 0})).gpu == std::vector<int>{0, 1, 2, 3});
  CHECK(greedy(tiny(1, 4, 2, 4, {0, 0})).gpu == std::vector<int>{0, 0, 1, 1});
  // Collect on GPU 3: every GPU costs 4, ties go to the lower GPU number.
  CHECK(greedy(tiny(1, 4, 2, 4, {0, 3})).gpu == std::vector<int>{0, 0, 1, 1});
  // c_exp binds: layer 0 fills GPU 0; layer 1 must use GPU 1.
  CHECK(greedy(tiny(2, 2, 2, 2, {0, 0, 0})).gpu == std::vector<int>{0, 0, 1, 1});
  // Greedy can run out of room where an exact plan exists (reported, never a wrong plan).
  auto tight = tiny(3, 4, 2, 3, {0, 0, 0, 0});
  CHECK_THROWS_WITH(greedy(tight), Catch::Contains("greedy"));
  CHECK_NOTHROW(check_assignment(tight, ilp(tight).assignment));
  // Capacities that cannot hold the experts at all.
  CHECK_THROWS_WITH(greedy(tiny(1, 9, 2, 4, {0, 0})), Catch::Contains("infeasible"));
}
