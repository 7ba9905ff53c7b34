#pragma once
// Placement policy `placement::Table`: the expert -> rank table of one MoE layer, computed offline
// by a planner (or by the simple rules below) and handed to moe::Layer at run time.

#include <concepts>
#include <vector>

#include "moe/config.hpp"

namespace moe::placement {

/// A placement policy tells which rank owns (the primary copy of) each expert.
template <class P>
concept Policy = requires(P const& p, int expert, int experts, int ranks) {
  { p.rank_of(expert) } -> std::convertible_to<int>;
  p.validate(experts, ranks);
};

class Table {
public:
  Table() = default;
  explicit Table(std::vector<int> expert_rank) : expert_rank_(std::move(expert_rank)) {}

  /// Experts [r*E/R, (r+1)*E/R) on rank r: the usual expert-parallel layout.
  static Table contiguous(int experts, int ranks) {
    check(experts > 0 && ranks > 0, "placement: experts (", experts, ") and ranks (", ranks,
          ") must be positive");
    check(experts % ranks == 0, "placement: ", experts, " experts do not split evenly over ", ranks,
          " ranks");
    std::vector<int> t(static_cast<std::size_t>(experts));
    for (int e = 0; e < experts; ++e) t[static_cast<std::size_t>(e)] = e / (experts / ranks);
    return Table(std::move(t));
  }

  /// Expert e on rank e mod R.
  static Table round_robin(int experts, int ranks) {
    check(experts > 0 && ranks > 0, "placement: experts (", experts, ") and ranks (", ranks,
          ") must be positive");
    std::vector<int> t(static_cast<std::size_t>(experts));
    for (int e = 0; e < experts; ++e) t[static_cast<std::size_t>(e)] = e % ranks;
    return Table(std::move(t));
  }

  [[nodiscard]] int rank_of(int expert) const { return expert_rank_[static_cast<std::size_t>(expert)]; }
  [[nodiscard]] int experts() const { return static_cast<int>(expert_rank_.size()); }
  [[nodiscard]] std::vector<int> const& ranks() const { return expert_rank_; }

  /// Throws moe::Error when the table misses an expert or names a rank outside [0, ranks).
  void validate(int experts, int ranks) const {
    check(static_cast<int>(expert_rank_.size()) == experts, "placement table has ",
          expert_rank_.size(), " entries but the layer has ", experts, " experts");
    for (int e = 0; e < experts; ++e) {
      int r = expert_rank_[static_cast<std::size_t>(e)];
      check(r >= 0 && r < ranks, "placement table puts expert ", e, " on rank ", r,
            ", outside [0, ", ranks, ")");
    }
  }

  friend bool operator==(Table const&, Table const&) = default;

private:
  std::vector<int> expert_rank_;
};

static_assert(Policy<Table>);

}  // namespace moe::placement
