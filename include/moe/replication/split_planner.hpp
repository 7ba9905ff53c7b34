#pragma once
// A re-planner for layers that balance every batch (replication::BatchSplit): it scores a slot
// layout by the split's balance over the passes of a load window, not by the average load.
//
// Why. The minimal-move planner (replication::migration) aims at EPLB's balance of the window's
// *average* loads. Under a per-batch split that is the wrong measure: a copy the average does not
// need can still take a batch's skew, and a copy the average wants may add nothing the split could
// not already do with the copies there are. What a split layer pays per pass is the split's least
// max load, which depends on the pass's own loads and on how the copies connect the ranks.
//
// What. The score of a layout is the mean over the window's passes of T(p) / mean(p): T(p) the
// least max rank load over every split of pass p's pairs over the layout's copies
// (BatchSplit::least_max_load; it depends on each expert's total only), mean(p) the pass's pairs
// over the ranks. From the layout the ranks hold now, a greedy search changes one slot per round:
// on rank r, a slot that is empty, holds a second copy of an expert on r, or holds an expert with
// a copy elsewhere, gets an expert r does not hold. The change with the lowest score is kept when
//   - it brings an expert back that r held (no weights move): any gain;
//   - it gives r a new expert (one copy moves): a gain of at least `min_gain_permille` / 1000 of
//     max/mean (by default 80 / ranks permille: automatic_gain_permille), r still within `spare`
//     new experts, and the copies in all within `max_copies`.
// With Options::swaps, a round also tries swaps: rank r gives one of its hottest experts (load per
// copy) to a rank q and takes one of q's coolest in exchange (q on r's node with node_size); two
// copies move, so a swap is kept only for twice the least gain.
// With Options::node_size, new copies stay on the nodes that hold the expert already. It stops
// when no change is kept. Candidates per round: every rank x the `drop_candidates`
// slots of it whose expert has the least load per copy (empty and second-copy slots first) x the
// `add_candidates` experts it may take (not on it; on its node, with node_size) with the most load
// per copy; each is screened on a quarter of
// `sample_passes` passes spread over the window, the best 4 x `finalists` on `sample_passes`, and
// the best `finalists` of those on every pass.
// Deterministic: integer loads, fixed orders, ties to the lower (rank, slot, expert).
//
// Cost: one least-max flow (split::least_max, BatchSplit's first stage) per (candidate, screened
// pass): milliseconds for OLMoE- and Mixtral-sized layers, a tenth of a second and more for a
// DeepSeek-V3 layer at EP32 (bench_serving_loop), run on the layer's planner thread
// (moe/layer/live.hpp). Tested against brute force: every single-slot change scored by the
// max-flow min-cut bound (tests/planners/test_split_planner.cpp).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "moe/config.hpp"
#include "moe/replication/batch_split.hpp"

namespace moe::replication::split_planner {

/// The least gain (permille of the window's mean max/mean) a moved copy must bring when
/// Options::min_gain_permille is -1: 80 / ranks, at least 1 (10 at 8 ranks, 5 at 16, 2 at 32). A
/// copy is shared among more ranks at a larger EP degree and moves the mean max/mean less: with a
/// fixed 10 the serving-loop study stopped DeepSeek-V3 at 32 ranks at 1.0805 where 2 reached
/// 1.0462, for 0.59 % of a full reshuffle's bytes (docs/results/serving-loop.md).
inline int automatic_gain_permille(int ranks) { return std::max(1, 80 / std::max(1, ranks)); }

struct Options {
  int spare = 1;                ///< most experts a rank may hold that it did not hold in `held`
  long long max_copies = -1;    ///< most (rank, expert) copies added in all (-1: spare x ranks)
  int min_gain_permille = -1;   ///< least gain in mean max/mean (thousandths) a new copy must bring
                                ///< (-1: automatic_gain_permille(ranks))
  int sample_passes = 16;       ///< passes a candidate is screened on (all when the window is smaller)
  int drop_candidates = 3;      ///< slots per rank considered for replacement
  int add_candidates = 8;       ///< experts considered for a new copy
  int finalists = 2;            ///< candidates scored on every pass per round
  int max_rounds = -1;          ///< most changes kept (-1: 4 x the layout's slots)
  /// Ranks per node (rank r on node r / node_size). When > 0, a rank gets a new copy of an
  /// expert only if its node already holds one: every expert keeps to the nodes it is on, as
  /// EPLB's hierarchical plan keeps each expert group on one node. 0: any rank.
  int node_size = 0;
  /// Also try swaps: rank r gives one of its `drop_candidates` experts with the most load per
  /// copy to a rank q (on r's node, with node_size) for one of q's `drop_candidates` experts with
  /// the least load per copy. Two copies move, so a swap must gain twice the least gain. Under the
  /// node rule, where most experts have one copy, single-slot changes run out early; a swap moves
  /// an expert's only copy within its node. Costs about (ranks per node) x drop_candidates more
  /// candidates per round.
  bool swaps = false;
};

struct Result {
  std::vector<int> layout;      ///< ranks x width, each rank's experts as placed (-1 empty)
  long long copies = 0;         ///< (rank, expert) pairs the layout holds that `held` did not
  double before = 0, after = 0; ///< the score (mean split max/mean over the window) of `held` and of the result
  int rounds = 0;               ///< changes kept
};

namespace detail {

/// The copy lists of a layout: the ranks holding each expert, ascending, once each.
inline std::vector<std::vector<int>> copies_of(std::span<int const> layout, int ranks, int experts) {
  std::vector<std::vector<int>> c(static_cast<std::size_t>(experts));
  auto width = layout.size() / static_cast<std::size_t>(ranks);
  for (std::size_t i = 0; i < layout.size(); ++i) {
    int e = layout[i];
    if (e < 0) continue;
    auto& v = c[static_cast<std::size_t>(e)];
    int r = static_cast<int>(i / width);
    if (v.empty() || v.back() != r) v.push_back(r);  // slots go rank by rank: v stays ascending
  }
  return c;
}

/// The passes' loads as a BatchSplit count array: each pass's expert totals in row 0 of ranks x
/// experts (the least max load does not depend on the sources).
class Scorer {
public:
  Scorer(std::span<long long const> batches, int experts, int ranks) : E_(experts), R_(ranks) {
    auto P = batches.size() / static_cast<std::size_t>(experts);
    rows_.assign(P * static_cast<std::size_t>(experts) * static_cast<std::size_t>(ranks), 0);
    mean_.assign(P, 0.0);
    for (std::size_t p = 0; p < P; ++p) {
      long long total = 0;
      for (std::size_t e = 0; e < static_cast<std::size_t>(experts); ++e) {
        long long v = batches[p * static_cast<std::size_t>(experts) + e];
        check(v >= 0 && v <= std::numeric_limits<std::int32_t>::max(), "split planner: pass ", p, " has ", v,
              " pairs of expert ", e);
        rows_[p * static_cast<std::size_t>(experts * ranks) + e] = static_cast<std::int32_t>(v);
        total += v;
      }
      mean_[p] = static_cast<double>(total) / ranks;
      if (total > 0) used_.push_back(static_cast<int>(p));
    }
  }
  [[nodiscard]] std::vector<int> const& passes() const { return used_; }
  /// Mean over `which` (indices into passes()) of least max load / mean load. Runs split's stages
  /// on flat copy lists and a workspace kept from call to call (a BatchSplit per candidate cost as
  /// much as the flows themselves).
  [[nodiscard]] double score(std::vector<std::vector<int>> const& copies, std::span<int const> which) {
    if (which.empty()) return 1.0;
    first_.assign(1, 0);
    ranks_.clear();
    for (auto const& c : copies) {
      ranks_.insert(ranks_.end(), c.begin(), c.end());
      first_.push_back(static_cast<int>(ranks_.size()));
    }
    server_.assign(static_cast<std::size_t>(R_), 0);
    split::Layout L;
    L.ranks = R_, L.experts = E_, L.slots = static_cast<int>(ranks_.size()), L.servers = 1;
    L.first = first_.data(), L.rank = ranks_.data(), L.server = server_.data();
    L.arcs = split::arc_count(E_, L.first);
    work_.resize(static_cast<std::size_t>(split::workspace_words(L)));
    double sum = 0;
    auto stride = static_cast<std::size_t>(E_) * static_cast<std::size_t>(R_);
    for (int i : which) {
      auto p = static_cast<std::size_t>(used_[static_cast<std::size_t>(i)]);
      std::int32_t const* counts = rows_.data() + p * stride;
      split::count_servers(L, counts, work_.data());
      split::detail::Work W(L, work_.data());
      sum += static_cast<double>(split::least_max(L, counts, W)) / mean_[p];
    }
    return sum / static_cast<double>(which.size());
  }

private:
  int E_, R_;
  std::vector<std::int32_t> rows_;
  std::vector<double> mean_;
  std::vector<int> used_;
  std::vector<int> first_, ranks_, server_;
  std::vector<long long> work_;
};

}  // namespace detail

/// The layout (ranks x width, from `held`, the layout the ranks hold now) with the best window
/// score the greedy search of the file comment reaches. `batches`: passes x experts, pairs per
/// expert and pass (LoadWindow's rows). `held` may hold -1 (empty) and an expert twice on a rank.
inline Result plan(std::span<long long const> batches, int experts, std::span<int const> held, int ranks,
                   Options const& o) {
  check(experts > 0 && ranks > 0, "split planner: ", experts, " experts on ", ranks, " ranks");
  check(batches.size() % static_cast<std::size_t>(experts) == 0, "split planner: ", batches.size(),
        " loads do not split into passes of ", experts, " experts");
  check(!held.empty() && held.size() % static_cast<std::size_t>(ranks) == 0, "split planner: a layout of ",
        held.size(), " slots does not split over ", ranks, " ranks");
  check(o.node_size >= 0 && (o.node_size == 0 || ranks % o.node_size == 0), "split planner: nodes of ", o.node_size,
        " ranks do not divide ", ranks, " ranks");
  check(o.spare >= 0 && o.min_gain_permille >= -1 && o.sample_passes > 0 && o.drop_candidates > 0 &&
            o.add_candidates > 0 && o.finalists > 0,
        "split planner: options must be positive (spare and min_gain_permille may be 0; min_gain_permille -1: "
        "automatic)");
  int const min_gain = o.min_gain_permille < 0 ? automatic_gain_permille(ranks) : o.min_gain_permille;
  auto W = held.size() / static_cast<std::size_t>(ranks);
  auto R = static_cast<std::size_t>(ranks), E = static_cast<std::size_t>(experts);
  auto const D = static_cast<std::size_t>(o.drop_candidates);
  for (std::size_t i = 0; i < held.size(); ++i)
    check(held[i] >= -1 && held[i] < experts, "split planner: slot ", i % W, " of rank ", i / W, " names expert ",
          held[i], ", outside [0, ", experts, ")");
  auto had = [&](std::size_t r, int e) {
    for (std::size_t j = 0; j < W; ++j)
      if (held[r * W + j] == e) return true;
    return false;
  };
  // slot j of rank r holds an expert r also holds in an earlier slot
  auto second_copy = [&](std::vector<int> const& layout, std::size_t r, std::size_t j) {
    for (std::size_t k = 0; k < j; ++k)
      if (layout[r * W + k] == layout[r * W + j]) return true;
    return false;
  };
  // emptying slot j of rank r gives up an expert r did not hold in `held` (frees one of its spare slots)
  auto frees_new = [&](std::vector<int> const& layout, std::size_t r, std::size_t j) {
    int e = layout[r * W + j];
    return e >= 0 && !had(r, e) &&
           std::count(layout.begin() + static_cast<std::ptrdiff_t>(r * W),
                      layout.begin() + static_cast<std::ptrdiff_t>(r * W + W), e) == 1;
  };
  long long budget = o.max_copies >= 0 ? o.max_copies : static_cast<long long>(o.spare) * ranks;

  detail::Scorer scorer(batches, experts, ranks);
  std::vector<int> all(scorer.passes().size());
  std::iota(all.begin(), all.end(), 0);
  auto spread = [&](int n) {  // n passes spread evenly over the window (all when fewer)
    std::vector<int> out;
    auto k = std::min<std::size_t>(all.size(), static_cast<std::size_t>(std::max(n, 1)));
    for (std::size_t i = 0; i < k; ++i) out.push_back(static_cast<int>(i * all.size() / k));
    return out;
  };
  // screening in two stages: every candidate on a quarter of the sample, the best 4 x finalists on
  // the sample, the best finalists on every pass
  auto coarse = spread(o.sample_passes / 4), sample = spread(o.sample_passes);

  // the window's load of each expert, for the candidate orders
  std::vector<long long> load(E, 0);
  for (std::size_t i = 0; i < batches.size(); ++i) load[i % E] += batches[i];

  Result out;
  out.layout.assign(held.begin(), held.end());
  auto copies = detail::copies_of(out.layout, ranks, experts);
  for (std::size_t e = 0; e < E; ++e)
    check(!copies[e].empty(), "split planner: the layout holds expert ", e, " on no rank");
  out.before = out.after = scorer.score(copies, all);
  std::vector<int> new_on(R, 0);

  // One slot edit, or two (a swap: `expert` to `rank`'s `slot`, `expert2` to `rank2`'s `slot2`).
  struct Change {
    std::size_t rank, slot;
    int expert;
    double screened = 0, full = 0;
    std::size_t rank2 = 0, slot2 = 0;
    int expert2 = -1;  // -1: one edit
  };
  // copies moved by a change: experts a rank takes that it did not hold in `held`
  auto moved = [&](Change const& c) {
    return (had(c.rank, c.expert) ? 0 : 1) + (c.expert2 >= 0 && !had(c.rank2, c.expert2) ? 1 : 0);
  };
  // what rank r's count of new experts (new_on, and the copies against the budget) changes by when
  // slot j of the current layout takes expert e: +1 for an expert r did not hold in `held`, -1 when
  // the slot gave up such an expert
  auto adds = [&](std::size_t r, std::size_t j, int e) {
    return (had(r, e) ? 0 : 1) - (frees_new(out.layout, r, j) ? 1 : 0);
  };
  long long rounds_left = o.max_rounds >= 0 ? o.max_rounds : 4 * static_cast<long long>(held.size());
  while (rounds_left-- > 0) {
    // per copy: the load one copy of e carries on average (times the copies' product, to compare exactly)
    auto per_copy_less = [&](int a, int b) {  // a's load per copy below b's; ties to the lower expert
      auto ca = static_cast<long long>(copies[static_cast<std::size_t>(a)].size()),
           cb = static_cast<long long>(copies[static_cast<std::size_t>(b)].size());
      auto la = load[static_cast<std::size_t>(a)] * cb, lb = load[static_cast<std::size_t>(b)] * ca;
      return la != lb ? la < lb : a < b;
    };
    std::vector<int> by_heat(E);  // most load per copy first
    std::iota(by_heat.begin(), by_heat.end(), 0);
    std::sort(by_heat.begin(), by_heat.end(), [&](int a, int b) { return per_copy_less(b, a); });

    // the score of the layout with one change, on the passes `which`
    auto score_with = [&](Change const& c, std::span<int const> which) {
      auto trial = out.layout;
      trial[c.rank * W + c.slot] = c.expert;
      if (c.expert2 >= 0) trial[c.rank2 * W + c.slot2] = c.expert2;
      return scorer.score(detail::copies_of(trial, ranks, experts), which);
    };
    auto holds = [&](std::size_t r, int e) {
      auto const& ce = copies[static_cast<std::size_t>(e)];
      return std::find(ce.begin(), ce.end(), static_cast<int>(r)) != ce.end();
    };
    double base = scorer.score(copies, coarse);
    std::vector<Change> screened;
    for (std::size_t r = 0; r < R; ++r) {
      // droppable slots of r: empty or a second copy on r first, then experts with a copy elsewhere
      // by load per copy, least first
      std::vector<std::size_t> drops, shared;
      for (std::size_t j = 0; j < W; ++j) {
        int e = out.layout[r * W + j];
        if (e < 0 || second_copy(out.layout, r, j))
          drops.push_back(j);
        else if (copies[static_cast<std::size_t>(e)].size() >= 2)
          shared.push_back(j);
      }
      std::stable_sort(shared.begin(), shared.end(), [&](std::size_t x, std::size_t y) {
        return per_copy_less(out.layout[r * W + x], out.layout[r * W + y]);
      });
      drops.insert(drops.end(), shared.begin(), shared.end());
      if (drops.size() > D) drops.resize(D);
      // the experts r may take, most load per copy first: not on r, and on r's node if nodes are kept
      std::vector<int> hot;
      for (int b : by_heat) {
        if (hot.size() == static_cast<std::size_t>(o.add_candidates)) break;
        auto const& cb = copies[static_cast<std::size_t>(b)];
        if (holds(r, b)) continue;
        if (o.node_size > 0 && std::none_of(cb.begin(), cb.end(), [&](int q) {
              return q / o.node_size == static_cast<int>(r) / o.node_size;
            }))
          continue;  // b is on no rank of r's node
        hot.push_back(b);
      }
      for (std::size_t j : drops) {
        for (int b : hot) {
          if (!had(r, b)) {
            int const add = adds(r, j, b);
            if (out.copies + add > budget || new_on[r] + add > o.spare) continue;
          }
          Change c{r, j, b};
          c.screened = score_with(c, coarse);
          if (c.screened < base) screened.push_back(c);
        }
      }
    }
    if (o.swaps) {
      // each rank's slots holding an expert once (not empty, not a second copy), by load per copy,
      // the first drop_candidates: hottest (what the rank gives) and coolest (what it gives back)
      std::vector<std::vector<std::size_t>> hottest(R), coolest(R);
      for (std::size_t r = 0; r < R; ++r) {
        std::vector<std::size_t> v;
        for (std::size_t j = 0; j < W; ++j)
          if (out.layout[r * W + j] >= 0 && !second_copy(out.layout, r, j)) v.push_back(j);
        auto first = [&](bool most_first) {
          auto u = v;
          std::stable_sort(u.begin(), u.end(), [&](std::size_t x, std::size_t y) {
            int a = out.layout[r * W + x], b = out.layout[r * W + y];
            return most_first ? per_copy_less(b, a) : per_copy_less(a, b);
          });
          if (u.size() > D) u.resize(D);
          return u;
        };
        hottest[r] = first(true), coolest[r] = first(false);
      }
      for (std::size_t r = 0; r < R; ++r) {
        for (std::size_t q = 0; q < R; ++q) {
          if (q == r || (o.node_size > 0 && static_cast<int>(q) / o.node_size != static_cast<int>(r) / o.node_size))
            continue;
          for (std::size_t j : hottest[r])
            for (std::size_t k : coolest[q]) {
              int a = out.layout[r * W + j], b = out.layout[q * W + k];
              if (a == b || holds(q, a) || holds(r, b)) continue;
              Change c{r, j, b};
              c.rank2 = q, c.slot2 = k, c.expert2 = a;
              int ar = adds(r, j, b), aq = adds(q, k, a);
              if ((!had(r, b) && new_on[r] + ar > o.spare) || (!had(q, a) && new_on[q] + aq > o.spare) ||
                  (moved(c) > 0 && out.copies + ar + aq > budget))
                continue;
              c.screened = score_with(c, coarse);
              if (c.screened < base) screened.push_back(c);
            }
        }
      }
    }
    if (screened.empty()) break;
    auto keep_best = [&](std::size_t n) {
      std::stable_sort(screened.begin(), screened.end(),
                       [](Change const& x, Change const& y) { return x.screened < y.screened; });
      if (screened.size() > n) screened.resize(n);
    };
    if (coarse.size() < sample.size()) {
      keep_best(4 * static_cast<std::size_t>(o.finalists));
      for (auto& c : screened) c.screened = score_with(c, sample);
    }
    keep_best(static_cast<std::size_t>(o.finalists));
    Change const* best = nullptr;
    for (auto& c : screened) {
      c.full = score_with(c, all);
      if (!best || c.full < best->full) best = &c;
    }
    double gain = out.after - best->full;
    if (gain <= 0 || gain * 1000.0 < static_cast<double>(min_gain) * moved(*best)) break;
    auto apply = [&](std::size_t r, std::size_t j, int e) {
      int added = adds(r, j, e);
      out.layout[r * W + j] = e;
      new_on[r] += added;
      out.copies += added;
    };
    apply(best->rank, best->slot, best->expert);
    if (best->expert2 >= 0) apply(best->rank2, best->slot2, best->expert2);
    out.after = best->full;
    copies = detail::copies_of(out.layout, ranks, experts);
    ++out.rounds;
  }
  return out;
}

}  // namespace moe::replication::split_planner
