#pragma once
// The scenarios run by both the InProcess and the MPI layer tests (4 ranks). A scenario runs on
// every rank (run_case) and its outcomes are checked afterwards (check_case): on the test thread for
// InProcess, since Catch2's assertions are not thread-safe, and on each process for MPI.

#include <catch2/catch.hpp>

#include "layer_check.hpp"

namespace moe::test {

// A Mixtral-8x7B-like layer (8 experts, top-2, renormalised softmax) and a DeepSeek-V3-like layer
// (256 experts, top-8, sigmoid + bias, 8 groups / 4 per token, 1 shared expert) at reduced widths.
using MixtralSmall = models::Reduced<models::Mixtral8x7B, 64, 96, DType::f32>;
using DeepSeekSmall = models::Reduced<models::DeepSeekV3, 64, 32, DType::f32>;
using DeepSeekSmallBf16 = models::Reduced<models::DeepSeekV3, 64, 32, DType::bf16>;

inline constexpr double fp32_tolerance = 1e-5;
inline constexpr double bf16_tolerance = 2e-2;

enum class Case {
  mixtral_even,        // Mixtral-like, even tokens, contiguous placement, two seeds
  mixtral_uneven,      // uneven tokens and a rank with none
  deepseek_uneven,     // DeepSeek-V3-like, uneven tokens
  deepseek_idle_rank,  // rank 3 serves no expert, so it receives no tokens
  dedup_saving,        // de-duplicated vs one copy per expert
  replicated,          // some experts copied on every rank
  bf16,                // bf16 storage
};
inline constexpr Case all_cases[] = {Case::mixtral_even,       Case::mixtral_uneven, Case::deepseek_uneven,
                                     Case::deepseek_idle_rank, Case::dedup_saving,   Case::replicated,
                                     Case::bf16};

inline char const* name(Case c) {
  constexpr char const* names[] = {"mixtral_even", "mixtral_uneven", "deepseek_uneven", "deepseek_idle_rank",
                                   "dedup_saving", "replicated",     "bf16"};
  return names[static_cast<int>(c)];
}

inline replication::Table every_16th_everywhere(placement::Table const& placement, int ranks) {
  std::vector<std::vector<int>> copies(static_cast<std::size_t>(placement.experts()));
  for (int e = 0; e < placement.experts(); ++e) {
    auto& c = copies[static_cast<std::size_t>(e)];
    c = {placement.rank_of(e)};
    if (e % 16 == 0)
      for (int r = 0; r < ranks; ++r)
        if (r != placement.rank_of(e)) c.push_back(r);
  }
  return replication::Table(copies);
}

/// Runs one case on this rank; returns its outcomes (one or two runs).
template <class Comm>
std::vector<Outcome> run_case(Comm& comm, Case c) {
  using router::SigmoidGroupTopK;
  using router::SoftmaxTopK;
  switch (c) {
    case Case::mixtral_even: {
      Scenario sc{{16, 16, 16, 16}, placement::Table::contiguous(8, 4), true, 11};
      auto a = run_scenario<MixtralSmall, SoftmaxTopK>(comm, sc, replication::None{});
      sc.seed = 12;
      return {a, run_scenario<MixtralSmall, SoftmaxTopK>(comm, sc, replication::None{})};
    }
    case Case::mixtral_uneven: {
      Scenario sc{{7, 0, 23, 3}, placement::Table::round_robin(8, 4), true, 21};
      return {run_scenario<MixtralSmall, SoftmaxTopK>(comm, sc, replication::None{})};
    }
    case Case::deepseek_uneven: {
      Scenario sc{{9, 30, 1, 14}, placement::Table::contiguous(256, 4), true, 31};
      return {run_scenario<DeepSeekSmall, SigmoidGroupTopK>(comm, sc, replication::None{})};
    }
    case Case::deepseek_idle_rank: {
      std::vector<int> table(256);
      for (int e = 0; e < 256; ++e) table[static_cast<std::size_t>(e)] = e % 3;
      Scenario sc{{12, 12, 12, 12}, placement::Table(table), true, 41};
      return {run_scenario<DeepSeekSmall, SigmoidGroupTopK>(comm, sc, replication::None{})};
    }
    case Case::dedup_saving: {
      Scenario sc{{20, 20, 20, 20}, placement::Table::contiguous(256, 4), true, 51};
      auto dedup = run_scenario<DeepSeekSmall, SigmoidGroupTopK>(comm, sc, replication::None{});
      sc.deduplicate = false;
      return {dedup, run_scenario<DeepSeekSmall, SigmoidGroupTopK>(comm, sc, replication::None{})};
    }
    case Case::replicated: {
      Scenario sc{{10, 25, 5, 17}, placement::Table::contiguous(256, 4), true, 61};
      auto plain = run_scenario<DeepSeekSmall, SigmoidGroupTopK>(comm, sc, replication::None{});
      return {plain, run_scenario<DeepSeekSmall, SigmoidGroupTopK>(comm, sc, every_16th_everywhere(sc.placement, 4))};
    }
    case Case::bf16: {
      Scenario sc{{8, 16, 4, 12}, placement::Table::contiguous(256, 4), true, 71};
      return {run_scenario<DeepSeekSmallBf16, SigmoidGroupTopK>(comm, sc, replication::None{})};
    }
  }
  return {};
}

/// Checks one rank's outcomes of a case.
inline void check_case(Case c, int rank, std::vector<Outcome> const& o) {
  INFO("case " << name(c) << ", rank " << rank);
  REQUIRE(!o.empty());
  double tolerance = c == Case::bf16 ? bf16_tolerance : fp32_tolerance;
  for (auto const& run : o) CHECK(run.error <= tolerance);
  double book = c == Case::bf16 ? test::textbook::bf16_tolerance : test::textbook::fp32_tolerance;
  for (auto const& run : o) CHECK(run.vs_textbook <= book);
  switch (c) {
    case Case::dedup_saving:
      CHECK(o[0].stats.dispatch_bytes == o[0].expected_dispatch);
      CHECK(o[1].stats.dispatch_bytes == o[1].without_dedup);
      CHECK(o[0].stats.dispatch_bytes < o[1].stats.dispatch_bytes);
      CHECK(o[0].stats.combine_bytes < o[1].stats.combine_bytes);
      break;
    case Case::replicated:
      CHECK(o[1].stats.dispatch_bytes == o[1].expected_dispatch);
      CHECK(o[1].stats.combine_bytes == o[1].expected_combine);
      CHECK(o[1].stats.local_assignments >= o[0].stats.local_assignments);
      break;
    default:
      for (auto const& run : o) {
        CHECK(run.stats.dispatch_bytes == run.expected_dispatch);
        CHECK(run.stats.combine_bytes == run.expected_combine);
        CHECK(run.stats.control_bytes == 3 * sizeof(std::uint64_t));
      }
  }
  if (c == Case::deepseek_idle_rank && rank == 3) {
    CHECK(o[0].stats.records_received == 0);
    CHECK(o[0].stats.combine_bytes == 0);
  }
}

}  // namespace moe::test
