// replication::BatchSplit through the host path of moe::Layer on 4 in-process ranks: every case
// equals the single-process reference, and the bytes sent follow the split (the test's own walk).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>

#include "batch_split_layer_case.hpp"

TEST_CASE("BatchSplit through the host layer equals the reference (in-process)", "[layer][batch-split]") {
  std::uint64_t seed = 31;
  for (auto const& tokens : moe::test::batch_split_counts()) {
    std::array<moe::test::Outcome, 4> o;
    moe::collective::run_in_process<4>([&](auto& comm) {
      o[static_cast<std::size_t>(comm.rank())] = moe::test::run_batch_split_case(comm, tokens, seed);
    });
    for (int r = 0; r < 4; ++r) {
      INFO("tokens " << tokens[0] << "/" << tokens[1] << "/" << tokens[2] << "/" << tokens[3] << ", rank " << r);
      auto const& x = o[static_cast<std::size_t>(r)];
      CHECK(x.error <= 1e-5);
      CHECK(x.stats.dispatch_bytes == x.expected_dispatch);
      CHECK(x.stats.combine_bytes == x.expected_combine);
    }
    ++seed;
  }
}

TEST_CASE("BatchSplit through the host layer: one expert takes all tokens (in-process)", "[layer][batch-split]") {
  for (int hot : {0, 1}) {
    std::array<moe::test::Outcome, 4> o;
    moe::collective::run_in_process<4>([&](auto& comm) {
      o[static_cast<std::size_t>(comm.rank())] = moe::test::run_batch_split_case(comm, {13, 7, 0, 20}, 61, hot);
    });
    for (int r = 0; r < 4; ++r) {
      INFO("every token to expert " << hot << ", rank " << r);
      auto const& x = o[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < x.ids.size(); i += static_cast<std::size_t>(moe::test::JointModel::spec.top_k))
        REQUIRE(std::count(x.ids.begin() + static_cast<std::ptrdiff_t>(i),
                           x.ids.begin() + static_cast<std::ptrdiff_t>(i) + moe::test::JointModel::spec.top_k, hot) == 1);
      CHECK(x.error <= 1e-5);
      CHECK(x.stats.dispatch_bytes == x.expected_dispatch);
      CHECK(x.stats.combine_bytes == x.expected_combine);
    }
  }
}
