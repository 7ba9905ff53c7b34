// Catch2's implementation, compiled once per build and shared by both test mains (catch_main.cpp,
// mpi_main.cpp). It is test scaffolding, not code under test: cmake/MoeHelpers.cmake builds it at -O1
// without debug info or sanitizers, which took it from minutes to seconds in the sanitizer builds.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
