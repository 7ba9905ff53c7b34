#pragma once
// Replica allocator policies: which ranks hold a copy of each expert, and which copy a token uses.
//
// `replication::None`  - every expert has exactly one copy, on the rank the placement names.
// `replication::Table` - a per-expert list of ranks holding copies (from EPLB or CRAFT plans); the
//                        placement's rank must be among them. A token is served by the copy on its
//                        own rank when there is one, otherwise by copy (source rank + token) mod n,
//                        which spreads a hot expert's tokens evenly and needs no communication.
// (`replication::Routed` and `replication::Reactive` have their own headers.)

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "moe/config.hpp"

namespace moe::replication {

/// A replica policy picks, for one (token, expert) pair, the rank that serves it.
template <class R>
concept Policy = requires(R const& r, int expert, int primary, int source_rank, long long token,
                          int experts, int ranks, std::span<int const> placement) {
  { r.choose(expert, primary, source_rank, token) } -> std::convertible_to<int>;
  { r.holds(expert, primary, source_rank) } -> std::same_as<bool>;
  r.validate(experts, ranks, placement);
};

/// A replica policy whose choice depends on the whole batch (replication::Reactive): the host layer
/// gathers every rank's per-expert pair counts (ranks x experts, rank-major), calls plan_batch with
/// them, then asks dealt(expert, rank, m) for the rank serving this rank's m-th pair of `expert` in
/// token order.
template <class R>
concept BatchPolicy = Policy<R> && requires(R& r, R const& cr, std::span<std::int32_t const> counts, int expert,
                                           int rank, int m) {
  r.plan_batch(counts);
  { cr.dealt(expert, rank, m) } -> std::convertible_to<int>;
};

struct None {
  [[nodiscard]] int choose(int, int primary, int, long long) const { return primary; }
  [[nodiscard]] bool holds(int, int primary, int rank) const { return primary == rank; }
  void validate(int, int, std::span<int const>) const {}
};

class Table {
public:
  Table() = default;
  explicit Table(std::vector<std::vector<int>> replicas) : replicas_(std::move(replicas)) {}

  [[nodiscard]] int choose(int expert, int primary, int source_rank, long long token) const {
    auto const& copies = replicas_[static_cast<std::size_t>(expert)];
    if (copies.size() == 1) return primary;
    if (std::find(copies.begin(), copies.end(), source_rank) != copies.end()) return source_rank;
    auto n = static_cast<long long>(copies.size());
    return copies[static_cast<std::size_t>((source_rank + token) % n)];
  }

  /// Whether `rank` holds a copy of `expert`.
  [[nodiscard]] bool holds(int expert, int, int rank) const {
    auto const& copies = replicas_[static_cast<std::size_t>(expert)];
    return std::find(copies.begin(), copies.end(), rank) != copies.end();
  }

  [[nodiscard]] std::vector<std::vector<int>> const& replicas() const { return replicas_; }
  [[nodiscard]] int copies(int expert) const {
    return static_cast<int>(replicas_[static_cast<std::size_t>(expert)].size());
  }

  /// Throws moe::Error for a missing expert, an empty or duplicated copy list, a rank out of range,
  /// or a placement rank that holds no copy.
  void validate(int experts, int ranks, std::span<int const> placement) const {
    check(static_cast<int>(replicas_.size()) == experts, "replica table has ", replicas_.size(),
          " entries but the layer has ", experts, " experts");
    for (int e = 0; e < experts; ++e) {
      auto const& copies = replicas_[static_cast<std::size_t>(e)];
      check(!copies.empty(), "replica table: expert ", e, " has no copy");
      for (std::size_t i = 0; i < copies.size(); ++i) {
        check(copies[i] >= 0 && copies[i] < ranks, "replica table: expert ", e, " has a copy on rank ",
              copies[i], ", outside [0, ", ranks, ")");
        check(std::find(copies.begin(), copies.begin() + static_cast<long>(i), copies[i]) ==
                  copies.begin() + static_cast<long>(i),
              "replica table: expert ", e, " lists rank ", copies[i], " twice");
      }
      if (!placement.empty()) {
        int primary = placement[static_cast<std::size_t>(e)];
        check(std::find(copies.begin(), copies.end(), primary) != copies.end(), "replica table: expert ",
              e, " is placed on rank ", primary, " but that rank holds none of its copies");
      }
    }
  }

private:
  std::vector<std::vector<int>> replicas_;
};

static_assert(Policy<None> && Policy<Table>);

/// Every expert's copies back to back, as the executors and the device tables keep them: the
/// ranks of expert e are ranks[first[e] .. first[e + 1]), in the replica table's order.
struct CopyLists {
  std::vector<int> first{0};
  std::vector<int> ranks;

  [[nodiscard]] int copies(int e) const {
    return first[static_cast<std::size_t>(e) + 1] - first[static_cast<std::size_t>(e)];
  }
  /// Whether `rank` holds a copy of expert `e`.
  [[nodiscard]] bool holds(int e, int rank) const {
    auto lo = ranks.begin() + first[static_cast<std::size_t>(e)];
    auto hi = ranks.begin() + first[static_cast<std::size_t>(e) + 1];
    return std::find(lo, hi, rank) != hi;
  }
};

/// The copy lists of a replica table (already validated), or, for replication::None or an empty
/// table, one copy per expert on its `primary` rank.
template <class Replicas>
CopyLists copy_lists(std::span<int const> primary, Replicas const& replicas) {
  CopyLists out;
  for (std::size_t e = 0; e < primary.size(); ++e) {
    if constexpr (std::is_same_v<Replicas, Table>) {
      if (!replicas.replicas().empty()) {
        auto const& c = replicas.replicas()[e];
        out.ranks.insert(out.ranks.end(), c.begin(), c.end());
        out.first.push_back(static_cast<int>(out.ranks.size()));
        continue;
      }
    }
    out.ranks.push_back(primary[e]);
    out.first.push_back(static_cast<int>(out.ranks.size()));
  }
  return out;
}

/// The copy lists of any replica policy over `ranks` ranks: a replica table's own lists (in its
/// order) or one copy per expert for replication::None, and for any other policy the ranks whose
/// holds() is true, ascending. Every expert must have a copy.
template <Policy Replicas>
CopyLists copy_lists(std::span<int const> primary, Replicas const& replicas, int ranks) {
  if constexpr (std::is_same_v<Replicas, Table> || std::is_same_v<Replicas, None>) {
    return copy_lists(primary, replicas);
  } else {
    CopyLists out;
    for (std::size_t e = 0; e < primary.size(); ++e) {
      for (int r = 0; r < ranks; ++r)
        if (replicas.holds(static_cast<int>(e), primary[e], r)) out.ranks.push_back(r);
      check(static_cast<int>(out.ranks.size()) > out.first.back(), "replica policy: expert ", e,
            " has no copy on any of the ", ranks, " ranks");
      out.first.push_back(static_cast<int>(out.ranks.size()));
    }
    return out;
  }
}

}  // namespace moe::replication
