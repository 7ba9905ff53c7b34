// Re-planning while serving on 4 MPI processes (moe/layer/live.hpp): the drifting serving loop of
// test_live_layer.cpp, every pass equal to the single-process reference on every rank, and the
// bytes the migrations sent (summed over the ranks) equal to the copies the adopted plans added.
#include <catch2/catch.hpp>

#include "live_layer_case.hpp"
#include "moe/collective/mpi.hpp"

using namespace moe;
using namespace moe::test;

namespace {

template <class Replicas>
void serve_and_check(Replicas replicas, live::Options o) {
  collective::Mpi comm;
  REQUIRE(comm.size() == 4);
  LiveHarness<collective::Mpi, Replicas> hx(comm, std::move(replicas), o);
  auto run = hx.serve(0, 200);
  INFO("rank " << comm.rank());
  check_process_run(comm, run, 3);
  // live.plan_rank: that process alone sent layouts (4 ranks x 20 slots int32 to 3 others each)
  check_plan_bytes(run, comm.rank(), o.plan_rank, 3 * 4 * 20 * 4);
}

}  // namespace

TEST_CASE("live layer: 200 drifting passes on 4 MPI ranks, a re-plan every 20", "[layer][live][mpi]") {
  serve_and_check(live_table(), {.window = 20, .replan_every = 20, .spare_slots = 3, .migration_bytes_per_pass = 4096});
}

TEST_CASE("live layer: the split-aware re-planner on 4 MPI ranks", "[layer][live][mpi][batch-split]") {
  // Each process plans on its own planner thread from the same window: the plans must agree.
  serve_and_check(live_split(), {.window = 20, .replan_every = 20, .spare_slots = 3, .migration_bytes_per_pass = 4096,
                                 .tolerance_permille = 5, .planner = live::Planner::split_balance});
}

TEST_CASE("live layer: one process plans for all 4 MPI ranks (live.plan_rank)", "[layer][live][mpi]") {
  // Process 3 runs the planner and sends its layout to the others after a pass; the others plan
  // nothing. The drifting loop is served as when every process plans.
  serve_and_check(live_table(), {.window = 20, .replan_every = 20, .spare_slots = 3, .migration_bytes_per_pass = 4096,
                                 .plan_rank = 3});
}
