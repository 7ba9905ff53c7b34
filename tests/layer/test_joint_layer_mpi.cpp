// The expert-parallel layer on 4 MPI processes runs a joint plan read back from its file, with the
// plan's routing, and equals the single-process reference on every rank.
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
