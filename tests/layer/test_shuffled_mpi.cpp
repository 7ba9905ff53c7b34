// s-TS on MPI (run with 2, 4 and 8 processes): lossless for any prediction, volumes as in section 3.2.
#include <catch2/catch.hpp>

#include "moe/collective/mpi.hpp"
#include "shuffled_cases.hpp"

TEST_CASE("shuffled pipeline on MPI equals the all-reduce pipeline", "[layer][shuffled][mpi]") {
  moe::collective::Mpi comm;
  auto bad = moe::test::run_shuffle_cases(comm);
  INFO(comm.size() << " ranks: " << (bad.empty() ? std::string("ok") : bad.front()));
  CHECK(bad.empty());
}
