// The Mpi collective against the same hand-written expectations (run under mpirun).
#include <catch2/catch.hpp>

#include "collective_cases.hpp"
#include "moe/collective/mpi.hpp"

TEST_CASE("Mpi collectives move and count the right bytes", "[collective][mpi]") {
  moe::collective::Mpi comm;
  auto bad = moe::test::run_collective_cases(comm);
  INFO((bad.empty() ? std::string() : bad.front()));
  CHECK(bad.empty());
}
