// The agreement of moe::Layer on 4 MPI processes: one rank's bad arguments or other tables, every
// rank throws the same error, no process is left waiting (a hang fails the test by its ctest timeout).
#include <catch2/catch.hpp>

#include "agreement_check.hpp"
#include "moe/collective/mpi.hpp"

TEST_CASE("agreement on 4 MPI ranks: host and host disaggregated paths", "[layer][mpi][agreement]") {
  moe::collective::Mpi comm;
  REQUIRE(comm.size() == 4);
  for (int bad = 0; bad < 4; ++bad) {
    INFO("bad rank " << bad);
    auto all = moe::test::gather_messages(comm, moe::test::host_path_bad_rank(comm, bad));
    for (auto const& m : all) CHECK(m == all[0]);
    CHECK_THAT(all[0], Catch::Contains(moe::detail::concat("rank ", bad, " rejected its arguments")));
    all = moe::test::gather_messages(comm, moe::test::disaggregated_path_bad_rank(comm, bad));
    for (auto const& m : all) CHECK(m == all[0]);
    CHECK_THAT(all[0], Catch::Contains(moe::detail::concat("rank ", bad, " rejected its arguments")));
  }
}

TEST_CASE("agreement on 4 MPI ranks: one rank built with other tables", "[layer][mpi][agreement]") {
  // Without the tables in the agreement, a rank sent pairs to a rank that does not serve them; that
  // rank threw and the others waited for it.
  moe::collective::Mpi comm;
  for (int odd = 0; odd < 4; ++odd) {
    INFO("odd rank " << odd);
    auto all = moe::test::gather_messages(comm, moe::test::host_path_other_tables(comm, odd));
    for (auto const& m : all) CHECK(m == all[0]);
    CHECK_THAT(all[0], Catch::Contains(moe::test::other_tables_message(odd)));
    all = moe::test::gather_messages(comm, moe::test::disaggregated_path_other_tables(comm, odd));
    for (auto const& m : all) CHECK(m == all[0]);
    CHECK_THAT(all[0], Catch::Contains(moe::test::other_tables_message(odd)));
  }
}
