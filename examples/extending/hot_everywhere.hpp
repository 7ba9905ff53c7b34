#pragma once
// HotEverywhere, the replica policy of examples/extending/replicas.cpp, in a header of its own so
// that the host program and the device program (device.cu, which adds its device form) choose with
// the same code. A hot expert has a copy on every rank and serves a pair on the token's own rank;
// every other expert has one copy, on the rank the placement names.
#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "moe/moe.hpp"

class HotEverywhere {
public:
  explicit HotEverywhere(std::vector<int> hot) : hot_(std::move(hot)) {}

  /// The rank that serves this (token, expert) pair; `token` is the global token index.
  [[nodiscard]] int choose(int expert, int primary, int source_rank, long long /*token*/) const {
    return is_hot(expert) ? source_rank : primary;
  }
  /// Whether `rank` holds a copy of `expert` (whose primary copy is on `primary`).
  [[nodiscard]] bool holds(int expert, int primary, int rank) const { return is_hot(expert) || primary == rank; }
  /// Throws moe::Error when the policy does not fit the layer.
  void validate(int experts, int /*ranks*/, std::span<int const> /*placement*/) const {
    for (int e : hot_) moe::check(e >= 0 && e < experts, "HotEverywhere: hot expert ", e, " outside [0, ", experts, ")");
  }

private:
  [[nodiscard]] bool is_hot(int expert) const { return std::find(hot_.begin(), hot_.end(), expert) != hot_.end(); }
  std::vector<int> hot_;
};
static_assert(moe::replication::Policy<HotEverywhere>);
