// Catch2's implementation, compiled once per build and shared by both test mains (catch_main.cpp,
// mpi_main.cpp). It is test scaffolding, not code under test: cmake/MoeHelpers.cmake builds it at -O1
// without debug info or sanitizers, which took it from minutes to seconds in the sanitizer builds.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_run.hpp"

int moe::test::run_catch(int argc, char** argv, bool report) {
  Catch::Session session;
  if (!report) session.configData().outputFilename = "%debug";  // e.g. every MPI rank but one
  return session.run(argc, argv);
}
