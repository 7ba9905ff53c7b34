// Plan files: write, load, compare, validate; and bad plan files.
#include <catch2/catch.hpp>

#include <sstream>

#include "moe/placement/heuristics.hpp"
#include "moe/placement/ilp.hpp"
#include "moe/plan/plan_io.hpp"
#include "moe/replication/craft.hpp"

using namespace moe;
using namespace moe::placement;

static LoadedPlan parse_plan(std::string const& s) {
  std::istringstream in(s);
  core::TsvReader r(in, "plan.tsv");
  return read_plan(r);
}

TEST_CASE("plan files round-trip placement and replica tables") {
  int L = 3, E = 8, D = 4;
  auto m = profile::zipf_marginals(L, E, 0.5, 1.0, 2);
  profile::SampleOptions o;
  o.batches = 10;
  o.tokens_per_batch = 100;
  o.top_k = 2;
  auto prof = profile::sample_profile(m, o);
  replication::craft::Options opt;
  opt.replication_factor = 2;
  auto cp = replication::craft::plan(prof, D, opt);
  std::vector<LayerPlan> plan;
  for (int l = 0; l < L; ++l) plan.push_back({cp.placement[static_cast<std::size_t>(l)], cp.tables[static_cast<std::size_t>(l)]});
  std::ostringstream os;
  write_plan(os, plan, D);
  auto back = parse_plan(os.str());
  REQUIRE(back.layers.size() == plan.size());
  CHECK(back.gpus == D);
  for (int l = 0; l < L; ++l) {
    CHECK(back.layers[static_cast<std::size_t>(l)].placement == plan[static_cast<std::size_t>(l)].placement);
    CHECK(back.layers[static_cast<std::size_t>(l)].replicas.replicas() == plan[static_cast<std::size_t>(l)].replicas.replicas());
    back.layers[static_cast<std::size_t>(l)].placement.validate(E, D);
    back.layers[static_cast<std::size_t>(l)].replicas.validate(E, D, back.layers[static_cast<std::size_t>(l)].placement.ranks());
  }
  // A placement-only plan (ILP) round-trips too.
  auto topo = topology::fat_tree(2, 1, 2, 1);
  auto p = make_problem(topo, L, E, 2, 8);
  auto a = ilp(p).assignment;
  std::vector<placement::Table> tables;
  for (int l = 0; l < L; ++l) tables.push_back(a.table(l));
  std::ostringstream os2;
  write_plan(os2, plan_without_replicas(tables), p.gpus);
  auto back2 = parse_plan(os2.str());
  for (int l = 0; l < L; ++l) CHECK(back2.layers[static_cast<std::size_t>(l)].placement == tables[static_cast<std::size_t>(l)]);
}

TEST_CASE("bad plan files are reported") {
  std::string head = "moe-plan\t1\t1\t2\t2\n";
  CHECK_THROWS_WITH(parse_plan(""), Catch::Contains("empty"));
  CHECK_THROWS_WITH(parse_plan("plan\t1\t1\t2\t2\n"), Catch::Contains("header"));
  CHECK_THROWS_WITH(parse_plan(head + "0\t0\t1\n"), Catch::Contains("truncated"));
  // A corrupt header with a huge expert count is rejected before any allocation; one within the
  // limits but without the lines is a truncated file.
  CHECK_THROWS_WITH(parse_plan("moe-plan\t1\t1\t2000000000\t2\n0\t0\t1\n"),
                    Catch::Contains("column 4 (experts): 2000000000 outside [1, 65536]"));
  CHECK_THROWS_WITH(parse_plan("moe-plan\t1\t1\t65536\t2\n0\t0\t1\n"),
                    Catch::Contains("truncated plan: expected layer 0 expert 1"));
  CHECK_THROWS_WITH(parse_plan(""), Catch::Contains("empty plan file"));
  CHECK_THROWS_WITH(parse_plan("moe-plan\t2\t1\t2\t2\n"), Catch::Contains("unsupported plan version 2"));
  CHECK_THROWS_WITH(parse_plan(head + "0\t0\t1\n0\t1\t2\n"), Catch::Contains("outside"));
  CHECK_THROWS_WITH(parse_plan(head + "0\t0\t1\t1\n0\t1\t0\n"), Catch::Contains("twice"));
  CHECK_THROWS_WITH(parse_plan(head + "0\t1\t1\n0\t0\t0\n"), Catch::Contains("expected layer 0 expert 0"));
  CHECK_THROWS_WITH(parse_plan(head + "0\t0\n0\t1\t0\n"), Catch::Contains("at least 3 fields"));
  CHECK_THROWS_WITH(parse_plan(head + "0\t0\t1\n0\t1\t0\n0\t2\t0\n"), Catch::Contains("extra"));
  auto ok = parse_plan(head + "0\t0\t1\t0\n0\t1\t0\n");
  CHECK(ok.layers[0].replicas.copies(0) == 2);
  CHECK(ok.layers[0].placement.rank_of(0) == 1);
}
