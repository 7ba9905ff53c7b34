// The expert-parallel layer on 4 MPI processes runs a joint plan read back from its file, with the
// plan's routing or with routing that reacts to each batch (an all-gather of per-expert counts,
// the same routes computed in every process), and equals the single-process reference on every rank.
#include <catch2/catch.hpp>

#include "joint_layer_case.hpp"
#include "moe/collective/mpi.hpp"

namespace {

/// Every layer of the joint plan, run by `run(comm, plan, layer)` on this process's rank: the
/// output against the reference and the textbook, and the bytes sent against the test's own walk
/// of the routes (for Reactive, each process's own policy's routes: so they also agree).
template <class Run>
void check_every_layer(Run run) {
  moe::collective::Mpi comm;
  REQUIRE(comm.size() == 4);
  auto plan = moe::test::joint_plan_from_file();
  for (std::size_t l = 0; l < plan.layers.size(); ++l) {
    INFO("layer " << l << ", rank " << comm.rank());
    auto o = run(comm, plan, l);
    CHECK(o.error <= 1e-5);
    CHECK(o.vs_textbook <= 1e-4);
    CHECK(o.stats.dispatch_bytes == o.expected_dispatch);
    CHECK(o.stats.combine_bytes == o.expected_combine);
  }
}

}  // namespace

TEST_CASE("a joint plan file drives the layer on 4 MPI ranks", "[layer][mpi][joint]") {
  check_every_layer([](auto& comm, auto const& plan, std::size_t l) { return moe::test::run_joint_layer(comm, plan, l); });
}

TEST_CASE("a joint plan file drives the layer on 4 MPI ranks with routing that reacts to each batch",
          "[layer][mpi][joint][reactive]") {
  check_every_layer([](auto& comm, auto const& plan, std::size_t l) {
    auto o = moe::test::run_reactive_layer(comm, plan, l);
    CHECK(o.stats.control_bytes == moe::test::reactive_control_bytes);
    return o;
  });
}
