// replication::BatchSplit through the host path of moe::Layer on 4 MPI processes: every case equals
// the single-process reference on every rank, and the bytes sent follow the split.
#include <catch2/catch.hpp>

#include "batch_split_layer_case.hpp"
#include "moe/collective/mpi.hpp"

TEST_CASE("BatchSplit through the host layer equals the reference (4 MPI ranks)", "[layer][mpi][batch-split]") {
  moe::collective::Mpi comm;
  REQUIRE(comm.size() == 4);
  std::uint64_t seed = 31;
  for (auto const& tokens : moe::test::batch_split_counts()) {
    INFO("rank " << comm.rank() << ", seed " << seed);
    auto o = moe::test::run_batch_split_case(comm, tokens, seed++);
    CHECK(o.error <= 1e-5);
    CHECK(o.stats.dispatch_bytes == o.expected_dispatch);
    CHECK(o.stats.combine_bytes == o.expected_combine);
  }
  for (int hot : {0, 1}) {  // one expert takes all tokens (copies on every rank; one copy)
    INFO("rank " << comm.rank() << ", every token to expert " << hot);
    auto o = moe::test::run_batch_split_case(comm, {13, 7, 0, 20}, 61, hot);
    CHECK(o.error <= 1e-5);
    CHECK(o.stats.dispatch_bytes == o.expected_dispatch);
    CHECK(o.stats.combine_bytes == o.expected_combine);
  }
}
