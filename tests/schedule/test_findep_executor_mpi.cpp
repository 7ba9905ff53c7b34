// FinDEP host executor on MPI processes (run with 3, 4 and 5 processes): every AG/EG split of the
// world, micro-batches and token chunks, AASS, ASAS and PPPipe; every output must equal the
// single-process sequential layer (moe::reference_forward) and the expert-parallel moe::Layer
// (Sequential schedule) on the same MPI communicator, fp32, 1e-5 normwise relative. The scenarios
// are the InProcess test's (executor_cases.hpp). An AG rank sends from one thread and receives on
// another at the same time, so the MPI library must provide MPI_THREAD_MULTIPLE. The same for
// the disaggregated moe::Layer with the FinDep and PPPipe schedule policies (disaggregated_cases.hpp).
#include <catch2/catch.hpp>

#include "disaggregated_cases.hpp"
#include "executor_cases.hpp"
#include "moe/collective/mpi.hpp"

using namespace moe;
using namespace moe::test::findep;

namespace {
/// The worst value over all ranks (every rank calls it, in the same order).
double worst_over_ranks(double v) {
  double out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

template <class Model>
void check_all_splits(collective::Mpi& comm, std::uint64_t seed) {
  for (int ag = 1; ag < comm.size(); ++ag) {
    auto results = run_executor_cases<Model>(comm, ag, seed + static_cast<std::uint64_t>(ag));
    REQUIRE(results.size() == configs().size());
    for (Result const& r : results) {
      // Every rank reports the worst over all AG ranks, so the report of rank 0 names any failure.
      double ref = worst_over_ranks(r.vs_reference), layer = worst_over_ranks(r.vs_layer);
      INFO(r.what << " on " << comm.size() << " MPI ranks (worst AG rank)");
      CHECK(ref <= tolerance);
      CHECK(layer <= tolerance);
      CHECK(worst_over_ranks(r.vs_textbook) <= moe::test::textbook::fp32_tolerance);
    }
  }
}
}  // namespace

TEST_CASE("MPI grants the thread level the FinDEP executor needs", "[schedule][executor][mpi]") {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  INFO("MPI_Query_thread gave level " << level << "; MPI_THREAD_MULTIPLE is " << MPI_THREAD_MULTIPLE);
  if (level < MPI_THREAD_MULTIPLE)
    FAIL("the MPI library does not provide MPI_THREAD_MULTIPLE: the FinDEP executor sends and receives from "
         "two threads of a rank at once (build OpenMPI with thread support, or run with InProcess)");
}

TEMPLATE_TEST_CASE("FinDEP executor on MPI equals the sequential layer for every split, order, r1 and r2",
                   "[schedule][executor][mpi]", DeepSeekSmall, MixtralSmall) {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  // Without MPI_THREAD_MULTIPLE concurrent send/recv is undefined behaviour: do not run it.
  REQUIRE(level >= MPI_THREAD_MULTIPLE);
  collective::Mpi comm;
  REQUIRE(comm.size() >= 2);
  check_all_splits<TestType>(comm, 500);
}

TEMPLATE_TEST_CASE("disaggregated Layer on MPI equals the sequential layer for every split", "[schedule][disaggregated][mpi]",
                   schedule::FinDep, schedule::PPPipe) {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  REQUIRE(level >= MPI_THREAD_MULTIPLE);
  collective::Mpi comm;
  for (int ag = 1; ag < comm.size(); ++ag) {
    auto check = [&](std::vector<Result> const& results) {
      REQUIRE(!results.empty());
      for (Result const& r : results) {
        double ref = worst_over_ranks(r.vs_reference);
        INFO(r.what << " on " << comm.size() << " MPI ranks (worst AG rank)");
        CHECK(ref <= tolerance);
        CHECK(worst_over_ranks(r.vs_textbook) <= moe::test::textbook::fp32_tolerance);
      }
    };
    check(run_disaggregated_cases<DeepSeekSmall, TestType>(comm, ag, 900 + static_cast<std::uint64_t>(ag)));
    check(run_disaggregated_cases<MixtralSmall, TestType>(comm, ag, 950 + static_cast<std::uint64_t>(ag)));
  }
}

TEMPLATE_TEST_CASE("disaggregated Layer on MPI splits each micro-batch over the copies", "[schedule][disaggregated][mpi]",
                   schedule::FinDep, schedule::PPPipe) {
  // The AG ranks exchange split counts with blocking sends, pair by pair in one order: no process
  // may wait forever (see findep_executor.hpp), and every rank deals by the same splits.
  collective::Mpi comm;
  for (int ag = 1; ag < comm.size(); ++ag)
    for (SplitResult const& r : run_batch_split_cases<MixtralSmall, TestType>(comm, ag, 970 + static_cast<std::uint64_t>(ag)))
      check_split(r, " on " + std::to_string(comm.size()) + " MPI ranks, this rank " + std::to_string(comm.rank()));
}

TEST_CASE("FinDEP executor on MPI: bad input on one rank stops every process instead of hanging",
          "[schedule][executor][mpi][bad-input]") {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  REQUIRE(level >= MPI_THREAD_MULTIPLE);
  collective::Mpi comm;
  int ag = comm.size() / 2;
  for (int bad : {0, comm.size() - 1}) {
    // Without the executor's agreement step the good ranks would block in recv forever here.
    std::string msg = reject_on_one_rank<MixtralSmall>(comm, ag, bad);
    INFO("bad rank " << bad << ", this rank " << comm.rank() << ": " << msg);
    std::string reason = bad < ag ? "r1 = 2 does not divide the 23 tokens of AG rank " + std::to_string(bad)
                                  : "tokens live on the AG ranks";
    CHECK_THAT(msg, Catch::Contains(reason));
    if (comm.rank() != bad)
      CHECK_THAT(msg, Catch::Contains("rank " + std::to_string(bad) + " rejected this run(), so every rank stops"));
  }
}
