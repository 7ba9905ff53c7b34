// Bad-input paths of the planner headers that had no test of their own: each asserts that a
// moe::Error is thrown and that its message names the problem.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "moe/placement/heuristics.hpp"
#include "moe/placement/metrics.hpp"
#include "moe/plan/plan_io.hpp"
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

TEST_CASE("placement problem validation names inconsistent sizes") {
  auto p = small_problem();
  p.hops.pop_back();
  CHECK_THROWS_WITH(p.validate(), Contains("hop matrix has 15 entries, expected 4x4"));
  p = small_problem();
  p.attention.pop_back();
  CHECK_THROWS_WITH(p.validate(), Contains("2 attention GPUs given, expected layers + 1 = 3"));
  p = small_problem();
  p.attention[1] = 4;
  CHECK_THROWS_WITH(p.validate(), Contains("attention GPU 4 outside [0, 4)"));
  p = small_problem();
  p.hops[1] = -1;
  CHECK_THROWS_WITH(p.validate(), Contains("negative hop count -1"));
  p = small_problem();
  p.c_layer = 0;
  CHECK_THROWS_WITH(p.validate(), Contains("must be positive"));
  CHECK_THROWS_WITH(placement::spread_attention(0, 4), Contains("layers and gpus must be positive"));
  p = small_problem();
  placement::Assignment wrong{1, 4, std::vector<int>(4, 0)};
  CHECK_THROWS_WITH(placement::check_assignment(p, wrong), Contains("assignment has the wrong shape"));
  placement::Assignment crowded{2, 4, std::vector<int>(8, 0)};
  p.c_layer = 2;
  CHECK_THROWS_WITH(placement::check_assignment(p, crowded), Contains("more than c_layer = 2"));
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

TEST_CASE("EPLB and CRAFT name their bad inputs") {
  std::vector<double> w = {1, 2, 3, 4};
  CHECK_THROWS_WITH(replication::eplb::rebalance_experts(w, 2, 4, 4, 1, 1, 2), Contains("weight has 4 entries, expected 2x4"));
  CHECK_THROWS_WITH(replication::eplb::rebalance_experts(w, 1, 4, 6, 1, 1, 4), Contains("do not split over 4"));
  CHECK_THROWS_WITH(replication::eplb::rebalance_experts(w, 1, 4, 2, 1, 1, 2), Contains("cannot hold 4 logical experts"));
  std::vector<double> neg = {1, -2, 3, 4};
  CHECK_THROWS_WITH(replication::eplb::rebalance_experts(neg, 1, 4, 4, 1, 1, 2), Contains("is negative or not finite"));
  CHECK_THROWS_WITH(replication::eplb::rebalance_experts(w, 1, 4, 4, 0, 1, 2), Contains("must be positive"));
  auto r = replication::eplb::rebalance_experts(w, 1, 4, 4, 1, 1, 2);
  CHECK_THROWS_WITH(replication::eplb::layer_tables(r, 1), Contains("eplb: layer 1 outside [0, 1)"));
  std::vector<replication::Table> tables{replication::Table(std::vector<std::vector<int>>{{0}, {3}})};
  CHECK_THROWS_WITH(placement::replica_stats(tables, 2, 1.0), Contains("a copy on GPU 3, outside [0, 2)"));
  CHECK_THROWS_WITH(placement::replica_stats(tables, 0, 1.0), Contains("gpus must be positive, got 0"));
  std::vector<double> load = {4, 3, 2, 1};
  // 5 copies for 4 slots, and an expert with more copies than GPUs.
  CHECK_THROWS_WITH(replication::craft::place_layer(load.data(), {2, 1, 1, 1}, {2, 2}), Contains("5 copies for 4 slots"));
  CHECK_THROWS_WITH(replication::craft::place_layer(load.data(), {3, 1, 1, 1}, {3, 3}), Contains("needs 1..2"));
  CHECK_THROWS_WITH(replication::craft::interleave_select({0, 1, 2}, 4), Contains("cannot pick 4 of 3"));
  CHECK_THROWS_WITH(replication::craft::assign_capacity(4, {-1}, 2), Contains("negative replica count for layer 0"));
  replication::craft::Benefit T;
  T.counts = {1, 2};
  T.base = {0.5};
  T.gain = {{0.1}, {0.2}};
  CHECK_THROWS_WITH(replication::craft::selection_gain(T, {3}), Contains("replica count 3 was not estimated"));
  CHECK_THROWS_WITH(replication::craft::choose_replicas(T, -1), Contains("negative replica budget -1"));
  profile::LoadProfile prof(2, 1, 4);
  for (int e = 0; e < 4; ++e) prof.at(0, 0, e) = prof.at(1, 0, e) = e + 1;
  CHECK_THROWS_WITH(replication::craft::estimate_benefit(prof, 8), Contains("4 experts cannot cover 8 GPUs"));
  CHECK_THROWS_WITH(replication::craft::estimate_benefit(prof, 2, -1), Contains("negative thread count"));
  CHECK_THROWS_WITH(replication::craft::estimate_benefit(prof, 0), Contains("gpus must be positive"));
  replication::craft::Options o;
  o.replication_factor = -1;
  CHECK_THROWS_WITH(replication::craft::plan(prof, 2, o), Contains("negative replication factor"));
}

TEST_CASE("topology building names unknown, self and unfinished links") {
  topology::Topology t;
  int a = t.add_server("a", 2);
  CHECK_THROWS_WITH(t.add_link(a, 5), Contains("link between unknown vertices 0 and 5"));
  CHECK_THROWS_WITH(t.add_link(a, a), Contains("link from 'a' to itself"));
  CHECK_THROWS_WITH(t.vertex("zz"), Contains("unknown vertex 'zz'"));
  CHECK_THROWS_WITH(t.gpu_hops(), Contains("call finalize() first"));
  CHECK_THROWS_WITH(t.add_server("a", 1), Contains("duplicate"));
  CHECK_THROWS_WITH(topology::fat_tree(0, 1, 1), Contains("must be positive"));
  CHECK_THROWS_WITH(topology::fat_tree(2, 1, 1, 0), Contains("spines must be positive"));
  CHECK_THROWS_WITH(topology::fat_tree_sparse(6, 1, 1, 4), Contains("6 leaves do not split into pods of 4"));
  CHECK_THROWS_WITH(topology::dragonfly(6, 1, 1, 4), Contains("6 routers do not split into 4 groups"));
}

TEST_CASE("plan files and metrics name empty or mismatched input") {
  std::ostringstream os;
  CHECK_THROWS_WITH(placement::write_plan(os, {}, 2), Contains("write_plan: no layers"));
  CHECK_THROWS_WITH(placement::Shares::from_tables({}, 2), Contains("shares: no layers"));
  std::vector<replication::Table> two{replication::Table(std::vector<std::vector<int>>{{0}, {1}}),
                                      replication::Table(std::vector<std::vector<int>>{{0}, {1}, {1}})};
  CHECK_THROWS_WITH(placement::Shares::from_tables(two, 2), Contains("layers have different expert counts"));
  auto p = small_problem();
  auto a = placement::greedy(p);
  profile::LoadProfile wrong(1, 3, 4);
  CHECK_THROWS_WITH(placement::hops_per_batch(p, a, wrong, 2), Contains("hops: profile shape 3x4"));
  profile::LoadProfile right(1, 2, 4);
  CHECK_THROWS_WITH(placement::hops_per_batch(p, a, right, 0), Contains("top_k must be positive"));
  auto s = placement::Shares::from_assignment(a, 4);
  CHECK_THROWS_WITH(placement::balancedness(s, wrong), Contains("balancedness: profile shape 3x4"));
  // Assignments and shares that do not fit the problem were indexed out of bounds before.
  placement::Assignment short_a{2, 4, std::vector<int>(5, 0)};
  CHECK_THROWS_WITH(placement::hops_per_batch(p, short_a, right, 2), Contains("hops: assignment is 2x4 with 5 entries"));
  placement::Assignment far{2, 4, std::vector<int>(8, 7)};
  CHECK_THROWS_WITH(placement::hops_per_batch(p, far, right, 2), Contains("hops: assignment uses GPU 7 outside [0, 4)"));
  CHECK_THROWS_WITH(placement::balancedness(placement::Shares::from_assignment(far, 4), right),
                    Contains("layer 0 expert 0 has a copy on GPU 7, outside [0, 4)"));
}

// ------------------------------------------------------------------------------------------------
// Hostile files: every number that sizes memory is bounded (core::limits) before anything is
// allocated, and the error names file, line and column.
// ------------------------------------------------------------------------------------------------
namespace {
std::string write_temp(std::string const& name, std::string const& text) {
  std::string path = (std::filesystem::temp_directory_path() / ("moe_test_" + name)).string();
  std::ofstream(path) << text;
  return path;
}
}  // namespace

TEST_CASE("OLMoE expert counts: ids that would size a huge matrix are rejected with file:line:column") {
  // Resized one row to 2e9 experts (std::bad_alloc) before the bound.
  auto big = write_temp("hostile_counts.tsv", "layer\texpert\tcount\n0\t1\t5\n0\t2000000000\t5\n");
  CHECK_THROWS_WITH(profile::marginals_from_olmoe(big),
                    Contains("moe_test_hostile_counts.tsv:3: column 2 (expert): 2000000000 outside [0, 65535]"));
  auto layers = write_temp("hostile_layers.tsv", "0\t1\t5\n99999\t1\t5\n");
  CHECK_THROWS_WITH(profile::marginals_from_olmoe(layers),
                    Contains("moe_test_hostile_layers.tsv:2: column 1 (layer): 99999 outside [0, 4095]"));
  auto inf = write_temp("hostile_inf.tsv", "0\t1\t1e308\n0\t1\t1e308\n");
  CHECK_THROWS_WITH(profile::marginals_from_olmoe(inf), Contains("moe_test_hostile_inf.tsv:2: column 3 (count)"));
  auto neg = write_temp("hostile_neg.tsv", "0\t1\t-1\n");
  CHECK_THROWS_WITH(profile::marginals_from_olmoe(neg), Contains("moe_test_hostile_neg.tsv:1: column 3 (count): negative"));
}

TEST_CASE("load profile and plan headers are bounded before anything is sized from them") {
  std::istringstream p1("moe-load-profile\t1\t1\t1\t100000\n");
  core::TsvReader r1(p1, "prof.tsv");
  CHECK_THROWS_WITH(profile::read_profile(r1), Contains("prof.tsv:1: column 5 (experts): 100000 outside [1, 65536]"));
  std::istringstream p2("moe-load-profile\t1\t1\t0\t4\n");
  core::TsvReader r2(p2, "prof.tsv");
  CHECK_THROWS_WITH(profile::read_profile(r2), Contains("prof.tsv:1: column 4 (layers): 0 outside"));
  std::istringstream q1(std::string(placement::kPlanMagic) + "\t1\t1\t4\t2000000000\n");
  core::TsvReader s1(q1, "plan.tsv");
  CHECK_THROWS_WITH(placement::read_plan(s1), Contains("plan.tsv:1: column 5 (gpus): 2000000000 outside [1, 4096]"));
  std::istringstream q2(std::string(placement::kPlanMagic) + "\t1\t-3\t4\t2\n");
  core::TsvReader s2(q2, "plan.tsv");
  CHECK_THROWS_WITH(placement::read_plan(s2), Contains("plan.tsv:1: column 3 (layers): -3 outside"));
}
