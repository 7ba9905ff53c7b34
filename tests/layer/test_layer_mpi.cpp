// The expert-parallel Layer on 4 MPI processes (mpirun -np 4) against the single-process reference.
#include "layer_scenarios.hpp"
#include "moe/collective/mpi.hpp"

TEST_CASE("Layer on 4 MPI ranks equals the single-process reference", "[layer][mpi]") {
  using namespace moe::test;
  moe::collective::Mpi comm;
  REQUIRE(comm.size() == 4);
  for (Case c : all_cases) check_case(c, comm.rank(), run_case(comm, c));
}
