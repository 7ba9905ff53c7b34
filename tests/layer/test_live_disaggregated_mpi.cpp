// Re-planning while serving on the host disaggregated path over 6 MPI processes: 2 attention ranks
// hold the tokens, 4 expert ranks the experts (test_live_disaggregated.cpp in process). The
// drifting loop with every AG pass equal to the single-process reference, and the migration bytes
// of all processes equal to the copies the adopted plans added, none from an attention rank.
#include <catch2/catch.hpp>

#include "live_layer_case.hpp"
#include "moe/collective/mpi.hpp"

using namespace moe;
using namespace moe::test;

namespace {

constexpr int ag = 2, ranks = ag + live_ranks;

void serve_and_check(live::Options o) {
  collective::Mpi comm;
  REQUIRE(comm.size() == ranks);
  LiveHarness<collective::Mpi, replication::Table, schedule::FinDep> hx(
      comm, live_table(), o, schedule::FinDep{.ag = ag, .order = schedule::Order::asas, .r1 = 2, .r2 = 2});
  auto run = hx.serve(0, 200);
  INFO("rank " << comm.rank());
  auto all = check_process_run(comm, run, 3);  // every rank's migration bytes sum to the added copies
  for (int r = 0; r < ag; ++r) CHECK(all[static_cast<std::size_t>(r)] == 0);
  // live.plan_rank: that process alone sent layouts (4 EG ranks x 20 slots int32 to 5 others each)
  check_plan_bytes(run, comm.rank(), o.plan_rank, 5 * 4 * 20 * 4);
}

}  // namespace

TEST_CASE("live disaggregated layer: 200 drifting passes on 6 MPI ranks (2 AG, 4 EG)", "[layer][live][mpi][disaggregated]") {
  serve_and_check({.window = 20, .replan_every = 20, .spare_slots = 3, .migration_bytes_per_pass = 4096});
}

TEST_CASE("live disaggregated layer: an attention process plans for all 6 MPI ranks", "[layer][live][mpi][disaggregated]") {
  serve_and_check({.window = 20, .replan_every = 20, .spare_slots = 3, .migration_bytes_per_pass = 4096, .plan_rank = 1});
}
