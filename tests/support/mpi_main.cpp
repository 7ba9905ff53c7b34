// Catch2 main for MPI tests: every rank runs the same test cases; the job fails if any rank fails.
// Catch2 itself is in catch_impl.cpp.
#include <catch2/catch.hpp>

#include "moe/collective/mpi.hpp"

int main(int argc, char** argv) {
  moe::collective::MpiSession session(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Catch::Session catch_session;
  if (rank != 0) catch_session.configData().outputFilename = "%debug";  // keep one rank's report
  int rc = catch_session.run(argc, argv);
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
