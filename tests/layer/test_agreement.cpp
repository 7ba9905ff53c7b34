// One rank's bad arguments make every rank throw the same moe::Error, and none is left waiting
// (moe::Layer's agreement), on the host paths with in-process ranks.
#include <catch2/catch.hpp>

#include <array>

#include "agreement_check.hpp"

using namespace moe;

namespace {
template <int N, class Body>
std::array<std::string, N> on_ranks(Body body) {
  std::array<std::string, N> what;
  collective::run_in_process<N>([&](collective::InProcess<N>& comm) { what[static_cast<std::size_t>(comm.rank())] = body(comm); });
  return what;
}
}  // namespace

TEST_CASE("host path: every rank throws the bad rank's error", "[layer][errors][agreement]") {
  for (int bad = 0; bad < 4; ++bad) {
    auto what = on_ranks<4>([&](auto& comm) { return test::host_path_bad_rank(comm, bad); });
    INFO("bad rank " << bad);
    for (auto const& m : what) CHECK(m == what[0]);
    CHECK_THAT(what[0], Catch::Contains(detail::concat("rank ", bad, " rejected its arguments")) &&
                            Catch::Contains("5 tokens exceed the 4"));
  }
}

TEST_CASE("host disaggregated path: every rank throws the bad rank's error", "[layer][errors][agreement]") {
  // Rank 0 is the attention rank: 6 tokens do not split into r1 = 2 micro-batches of r2 = 2 chunks.
  auto what = on_ranks<3>([&](auto& comm) { return test::disaggregated_path_bad_rank(comm, 0); });
  for (auto const& m : what) CHECK(m == what[0]);
  CHECK_THAT(what[0], Catch::Contains("rank 0 rejected its arguments") && Catch::Contains("r2 = 2 does not divide"));
  // Rank 2 is an expert rank that was given tokens.
  what = on_ranks<3>([&](auto& comm) { return test::disaggregated_path_bad_rank(comm, 2); });
  for (auto const& m : what) CHECK(m == what[0]);
  CHECK_THAT(what[0], Catch::Contains("rank 2 rejected its arguments") && Catch::Contains("is an expert-group rank"));
  // And with every rank valid, no rank throws.
  what = on_ranks<3>([&](auto& comm) { return test::disaggregated_path_bad_rank(comm, -1); });
  for (auto const& m : what) CHECK(m.empty());
}

TEST_CASE("ranks built with other tables: every rank throws the same error", "[layer][errors][agreement]") {
  for (int odd = 0; odd < 4; ++odd) {
    INFO("odd rank " << odd);
    auto what = on_ranks<4>([&](auto& comm) { return test::host_path_other_tables(comm, odd); });
    for (auto const& m : what) CHECK(m == what[0]);
    CHECK_THAT(what[0], Catch::Contains(test::other_tables_message(odd)));
  }
  for (int odd : {0, 2}) {  // the attention rank, an expert rank
    INFO("disaggregated, odd rank " << odd);
    auto what = on_ranks<3>([&](auto& comm) { return test::disaggregated_path_other_tables(comm, odd); });
    for (auto const& m : what) CHECK(m == what[0]);
    CHECK_THAT(what[0], Catch::Contains(test::other_tables_message(odd)));
  }
  // The same tables everywhere: the passes run.
  auto what = on_ranks<4>([&](auto& comm) { return test::host_path_other_tables(comm, -1); });
  for (auto const& m : what) CHECK(m.empty());
  auto dis = on_ranks<3>([&](auto& comm) { return test::disaggregated_path_other_tables(comm, -1); });
  for (auto const& m : dis) CHECK(m.empty());
}
