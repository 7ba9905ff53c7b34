// Bad-input paths of the planner headers that had no test of their own: each asserts that a
// moe::Error is thrown and that its message names the problem.
#include <catch2/catch.hpp>

#include <limits>
#include <sstream>

#include "moe/placement/heuristics.hpp"
#include "moe/placement/metrics.hpp"
#include "moe/placement/plan_io.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/replication/craft.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/topology/topology.hpp"

using namespace moe;
using Catch::Contains;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

/// Two servers of two GPUs under one spine (GPUs 0,1 | 2,3).
placement::Problem small_problem() { return placement::make_problem(topology::fat_tree(2, 1, 2, 1), 2, 4, 4, 8); }
}  // namespace

TEST_CASE("placement objective rejects weights and assignments of the wrong shape") {
  auto p = small_problem();
  placement::Assignment a{2, 4, std::vector<int>(8, 0)};
  CHECK(placement::objective(p, a, std::vector<double>(8, 1.0)) == placement::objective(p, a));
  CHECK_THROWS_WITH(placement::objective(p, a, std::vector<double>(3, 1.0)),
                    Contains("weight has 3 entries, expected layers x experts = 2x4"));
  placement::Assignment short_a{2, 4, std::vector<int>(5, 0)};
  CHECK_THROWS_WITH(placement::objective(p, short_a), Contains("with 5 entries, the problem is 2x4"));
  placement::Assignment far{2, 4, std::vector<int>(8, 9)};
  CHECK_THROWS_WITH(placement::objective(p, far), Contains("GPU 9 outside [0, 4)"));
}
