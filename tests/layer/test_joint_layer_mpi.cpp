// The expert-parallel layer on 4 MPI processes runs a joint plan read back from its file, with the
// plan's routing or with routing that reacts to each batch (an all-gather of per-expert counts,
// the same routes computed in every process), and equals the single-process reference on every rank.
#include <catch2/catch.hpp>

#include "joint_layer_case.hpp"
#include "moe/collective/mpi.hpp"

TEST_CASE("a joint plan file drives the layer on 4 MPI ranks", "[layer][mpi][joint]") {
  moe::collective::Mpi comm;
  REQUIRE(comm.size() == 4);
  auto plan = moe::test::joint_plan_from_file();
  for (std::size_t l = 0; l < plan.layers.size(); ++l) {
    INFO("layer " << l << ", rank " << comm.rank());
    auto o = moe::test::run_joint_layer(comm, plan, l);
    CHECK(o.error <= 1e-5);
    CHECK(o.vs_textbook <= 1e-4);
    CHECK(o.stats.dispatch_bytes == o.expected_dispatch);
  }
}

TEST_CASE("a joint plan file drives the layer on 4 MPI ranks with routing that reacts to each batch",
          "[layer][mpi][joint][reactive]") {
  moe::collective::Mpi comm;
  REQUIRE(comm.size() == 4);
  auto plan = moe::test::joint_plan_from_file();
  for (std::size_t l = 0; l < plan.layers.size(); ++l) {
    INFO("layer " << l << ", rank " << comm.rank());
    auto o = moe::test::run_reactive_layer(comm, plan, l);
    CHECK(o.error <= 1e-5);
    CHECK(o.vs_textbook <= 1e-4);
    // The counts every rank gathered gave this rank the routes the test walks (from its own
    // process's policy): the bytes it sends and sends back follow them.
    CHECK(o.stats.dispatch_bytes == o.expected_dispatch);
    CHECK(o.stats.combine_bytes == o.expected_combine);
    CHECK(o.stats.control_bytes == moe::test::reactive_control_bytes);
  }
}
