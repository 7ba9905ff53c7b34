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

TEST_CASE("seeded sampler rejects options that would hang or give infinite loads") {
  auto m = profile::zipf_marginals(1, 4, 1, 1, 1);
  profile::SampleOptions o;
  o.batches = 1;
  o.concentration = kInf;  // the gamma sampler's acceptance test is NaN forever
  CHECK_THROWS_WITH(profile::sample_profile(m, o), Contains("must be finite"));
  o.concentration = 2000;
  o.tokens_per_batch = kInf;
  CHECK_THROWS_WITH(profile::sample_profile(m, o), Contains("must be finite"));
  o.tokens_per_batch = 1e308;  // finite, but tokens * top_k overflows
  CHECK_THROWS_WITH(profile::sample_profile(m, o), Contains("must be finite"));
  o.tokens_per_batch = 100;
  o.top_k = 0;
  CHECK_THROWS_WITH(profile::sample_profile(m, o), Contains("must be positive"));
  o.top_k = 2;
  auto zero = m;
  std::fill(zero.weight.begin(), zero.weight.end(), 0.0);
  CHECK_THROWS_WITH(profile::sample_profile(zero, o), Contains("layer 0 has zero total marginal weight"));
  auto bad = m;
  bad.weight[2] = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(profile::sample_profile(bad, o), Contains("negative or not finite"));
  bad.weight.pop_back();
  CHECK_THROWS_WITH(profile::sample_profile(bad, o), Contains("marginals have the wrong size"));
  CHECK_THROWS_WITH(profile::zipf_marginals(2, 4, 1.0, 0.5, 1), Contains("need 0 <= s_min <= s_max"));
  CHECK_THROWS_WITH(profile::zipf_marginals(0, 4, 1.0, 1.0, 1), Contains("layers and experts must be positive"));
  CHECK_THROWS_WITH(profile::profile_from_marginals({}), Contains("no marginals"));
  auto a = profile::zipf_marginals(2, 4, 1, 1, 1), b = profile::zipf_marginals(3, 4, 1, 1, 1);
  CHECK_THROWS_WITH(profile::profile_from_marginals({a, b}), Contains("batch 1 has shape 3x4, expected 2x4"));
  CHECK_THROWS_WITH(profile::LoadProfile(0, 1, 1), Contains("must be positive"));
  profile::LoadProfile p(2, 1, 1);
  CHECK_THROWS_WITH(p.slice(1, 3), Contains("batch range [1, 3) outside [0, 2)"));
  CHECK_THROWS_WITH(p.totals(1, 1), Contains("batch range [1, 1)"));
}
