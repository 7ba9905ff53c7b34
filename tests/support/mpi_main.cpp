// Catch2 main for MPI tests: every rank runs the same test cases; the job fails if any rank fails.
// Catch2 itself is in catch_impl.cpp.
#include "catch_run.hpp"

#include "moe/collective/mpi.hpp"

int main(int argc, char** argv) {
  moe::collective::MpiSession session(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int rc = moe::test::run_catch(argc, argv, rank == 0);  // keep one rank's report
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
