#pragma once
// Quality metrics of s-TS / s-EG plans, on aggregated counts (e.g. a held-out domain) or on
// recorded per-occurrence routes.
//
//   local activation rate (LAR)  share of token-expert activations served on the token's device
//   token balance                token occurrences per device, imbalance = max/mean - 1
//   device top-1 accuracy        predicted device == the device holding most of the token's experts
//   expert top-k precision/recall of a predicted expert set against the routed experts
//   remote traffic               remote (token, expert) pairs and de-duplicated (token, device) pairs
//
// `device_of` arguments are callables int token_id -> int device.

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "moe/config.hpp"
#include "moe/speculative/cocluster.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/profile/route_profile.hpp"
#include "moe/speculative/predictor.hpp"

namespace moe::speculative {

/// LAR of aggregated counts when token t sits on device_of(t) and experts follow `placement`.
template <class DeviceOf>
[[nodiscard]] double local_activation_rate(profile::LayerCounts const& lc, placement::Table const& placement,
                                           DeviceOf&& device_of) {
  check(!lc.empty(), "LAR: layer ", lc.layer, " has no counts (empty profile)");
  check(placement.experts() == lc.experts, "LAR: placement has ", placement.experts(), " experts, counts ",
        lc.experts);
  double local = 0, total = 0;
  for (std::size_t i = 0; i < lc.rows(); ++i) {
    int d = device_of(static_cast<int>(lc.tokens[i]));
    for (auto j = lc.offsets[i]; j < lc.offsets[i + 1]; ++j) {
      auto ju = static_cast<std::size_t>(j);
      auto c = static_cast<double>(lc.count[ju]);
      total += c;
      if (placement.rank_of(lc.expert[ju]) == d) local += c;
    }
  }
  return total > 0 ? local / total : 0.0;
}

/// LAR without token shuffling: tokens land on devices independently of their identity, device d
/// receiving the share `shares[d]` of every token (equal shares: 1/D). Then
/// LAR = sum_d shares[d] * (activations of experts on d) / (all activations).
[[nodiscard]] inline double local_activation_rate_unshuffled(profile::LayerCounts const& lc,
                                                             placement::Table const& placement,
                                                             std::span<double const> shares) {
  check(!lc.empty(), "LAR: layer ", lc.layer, " has no counts (empty profile)");
  check(placement.experts() == lc.experts, "LAR: placement has ", placement.experts(), " experts, counts ",
        lc.experts);
  auto load = lc.expert_load();
  double total = 0, local = 0;
  for (std::size_t e = 0; e < load.size(); ++e) {
    int d = placement.rank_of(static_cast<int>(e));
    check(d >= 0 && static_cast<std::size_t>(d) < shares.size(), "LAR: expert ", e, " on device ", d,
          " without a share");
    total += static_cast<double>(load[e]);
    local += shares[static_cast<std::size_t>(d)] * static_cast<double>(load[e]);
  }
  return total > 0 ? local / total : 0.0;
}

struct Balance {
  std::vector<double> load;  ///< token occurrences per device
  double imbalance = 0;      ///< max/mean - 1
};

/// Token occurrences (activations / top_k) per device when token t sits on device_of(t).
template <class DeviceOf>
[[nodiscard]] Balance token_balance(profile::LayerCounts const& lc, int top_k, int devices, DeviceOf&& device_of) {
  check(top_k > 0 && devices > 0, "token balance: top_k and devices must be positive");
  Balance b;
  b.load.assign(static_cast<std::size_t>(devices), 0.0);
  for (std::size_t i = 0; i < lc.rows(); ++i) {
    int d = device_of(static_cast<int>(lc.tokens[i]));
    check(d >= 0 && d < devices, "token balance: token ", lc.tokens[i], " on device ", d, ", outside [0, ",
          devices, ")");
    b.load[static_cast<std::size_t>(d)] += static_cast<double>(lc.row_total(i)) / top_k;
  }
  b.imbalance = moe::speculative::imbalance(b.load);
  return b;
}

/// Aggregated device top-1 accuracy: the share of occurrences whose token's predicted device is the
/// device holding most of that token's activations in `lc` (a token-level proxy: aggregated counts do
/// not say which experts one occurrence chose; see device_top1_accuracy on paths for the exact one).
template <class DeviceOf>
[[nodiscard]] double device_top1_accuracy(profile::LayerCounts const& lc, placement::Table const& placement,
                                          int devices, DeviceOf&& device_of) {
  check(!lc.empty(), "device accuracy: layer ", lc.layer, " has no counts (empty profile)");
  check(devices > 0, "device accuracy: devices must be positive, got ", devices);
  placement.validate(lc.experts, devices);  // ranks index the per-device mass below
  std::vector<double> mass(static_cast<std::size_t>(devices));
  double hit = 0, total = 0;
  for (std::size_t i = 0; i < lc.rows(); ++i) {
    std::fill(mass.begin(), mass.end(), 0.0);
    double n = 0;
    for (auto j = lc.offsets[i]; j < lc.offsets[i + 1]; ++j) {
      auto ju = static_cast<std::size_t>(j);
      mass[static_cast<std::size_t>(placement.rank_of(lc.expert[ju]))] += static_cast<double>(lc.count[ju]);
      n += static_cast<double>(lc.count[ju]);
    }
    int d = device_of(static_cast<int>(lc.tokens[i]));
    double mx = *std::max_element(mass.begin(), mass.end());
    total += n;
    if (d >= 0 && d < devices && mass[static_cast<std::size_t>(d)] == mx) hit += n;
  }
  return total > 0 ? hit / total : 0.0;
}

namespace detail {
/// Recorded routes must hold top_k experts per occurrence, each inside the placement.
inline void check_paths(char const* what, profile::LayerPaths const& paths, int top_k,
                        placement::Table const& placement) {
  check(top_k > 0, what, ": top_k must be positive, got ", top_k);
  check(paths.experts.size() == paths.tokens.size() * static_cast<std::size_t>(top_k), what, ": paths hold ",
        paths.experts.size(), " expert ids for ", paths.tokens.size(), " occurrences of top_k = ", top_k);
  for (auto e : paths.experts)
    check(e >= 0 && e < placement.experts(), what, ": expert ", e, " outside the placement [0, ", placement.experts(),
          ")");
}
}  // namespace detail

/// Exact device top-1 accuracy on recorded routes: predicted[n] against the device holding most of
/// occurrence n's experts (any device tied for the most counts as correct).
[[nodiscard]] inline double device_top1_accuracy(profile::LayerPaths const& paths, int top_k,
                                                 placement::Table const& placement, int devices,
                                                 std::span<int const> predicted) {
  auto n = paths.tokens.size();
  check(n > 0, "device accuracy: no recorded occurrences");
  check(predicted.size() == n, "device accuracy: ", predicted.size(), " predictions for ", n, " occurrences");
  detail::check_paths("device accuracy", paths, top_k, placement);
  check(devices > 0, "device accuracy: devices must be positive, got ", devices);
  placement.validate(placement.experts(), devices);  // ranks index the per-device counts below
  std::vector<int> counts(static_cast<std::size_t>(devices));
  std::size_t hit = 0;
  for (std::size_t o = 0; o < n; ++o) {
    std::fill(counts.begin(), counts.end(), 0);
    for (int k = 0; k < top_k; ++k)
      ++counts[static_cast<std::size_t>(placement.rank_of(paths.experts[o * static_cast<std::size_t>(top_k) + static_cast<std::size_t>(k)]))];
    int mx = *std::max_element(counts.begin(), counts.end());
    int d = predicted[o];
    if (d >= 0 && d < devices && counts[static_cast<std::size_t>(d)] == mx) ++hit;
  }
  return static_cast<double>(hit) / static_cast<double>(n);
}

/// Exact LAR on recorded routes with occurrence n on device[n].
[[nodiscard]] inline double local_activation_rate(profile::LayerPaths const& paths, int top_k,
                                                  placement::Table const& placement, std::span<int const> device) {
  auto n = paths.tokens.size();
  check(n > 0, "LAR: no recorded occurrences");
  check(device.size() == n, "LAR: ", device.size(), " devices for ", n, " occurrences");
  detail::check_paths("LAR", paths, top_k, placement);
  std::size_t local = 0;
  for (std::size_t o = 0; o < n; ++o)
    for (int k = 0; k < top_k; ++k)
      local += placement.rank_of(paths.experts[o * static_cast<std::size_t>(top_k) + static_cast<std::size_t>(k)]) == device[o];
  return static_cast<double>(local) / static_cast<double>(n * static_cast<std::size_t>(top_k));
}

struct PrecisionRecall {
  double precision = 0;  ///< routed among predicted
  double recall = 0;     ///< predicted among routed
  double coverage = 0;   ///< share of occurrences whose token has a prediction
};

/// Expert top-k precision / recall of `table` against aggregated counts: a token occurrence
/// predicts table.experts(t); hits are its activations of those experts.
[[nodiscard]] inline PrecisionRecall expert_precision_recall(profile::LayerCounts const& lc, int top_k,
                                                             TokenExpertTable const& table) {
  check(!lc.empty(), "precision/recall: layer ", lc.layer, " has no counts (empty profile)");
  check(top_k > 0, "precision/recall: top_k must be positive");
  double hits = 0, predicted = 0, routed = 0, occ = 0, covered = 0;
  for (std::size_t i = 0; i < lc.rows(); ++i) {
    auto pred = table.experts(lc.tokens[i]);
    double n = static_cast<double>(lc.row_total(i)) / top_k;
    occ += n;
    if (!pred.empty()) covered += n;
    predicted += n * static_cast<double>(pred.size());
    for (auto j = lc.offsets[i]; j < lc.offsets[i + 1]; ++j) {
      auto ju = static_cast<std::size_t>(j);
      routed += static_cast<double>(lc.count[ju]);
      if (std::find(pred.begin(), pred.end(), lc.expert[ju]) != pred.end()) hits += static_cast<double>(lc.count[ju]);
    }
  }
  return {predicted > 0 ? hits / predicted : 0.0, routed > 0 ? hits / routed : 0.0, occ > 0 ? covered / occ : 0.0};
}

struct RemoteTraffic {
  std::size_t tokens = 0;               ///< tokens routed
  std::size_t pairs = 0;                ///< token-expert pairs (tokens * top_k)
  std::size_t remote_pairs = 0;         ///< pairs whose expert is not on the token's device
  std::size_t remote_token_devices = 0; ///< distinct (token, remote device) pairs: de-duplicated sends
  [[nodiscard]] double local_rate() const {
    return pairs ? 1.0 - static_cast<double>(remote_pairs) / static_cast<double>(pairs) : 0.0;
  }
};

/// Counts the dispatch traffic of one batch: token n sits on device[n] and chose
/// experts[n*top_k .. (n+1)*top_k).
[[nodiscard]] inline RemoteTraffic remote_traffic(std::span<int const> device, std::span<int const> experts, int top_k,
                                                  placement::Table const& placement, int devices) {
  check(top_k > 0, "remote traffic: top_k must be positive");
  check(experts.size() == device.size() * static_cast<std::size_t>(top_k), "remote traffic: ", device.size(),
        " tokens need ", device.size() * static_cast<std::size_t>(top_k), " expert ids, got ", experts.size());
  RemoteTraffic r;
  r.tokens = device.size();
  r.pairs = experts.size();
  std::vector<char> seen(static_cast<std::size_t>(devices));
  for (std::size_t n = 0; n < device.size(); ++n) {
    std::fill(seen.begin(), seen.end(), 0);
    for (int k = 0; k < top_k; ++k) {
      int e = experts[n * static_cast<std::size_t>(top_k) + static_cast<std::size_t>(k)];
      check(e >= 0 && e < placement.experts(), "remote traffic: expert ", e, " outside [0, ", placement.experts(), ")");
      int d = placement.rank_of(e);
      check(d >= 0 && d < devices, "remote traffic: expert ", e, " on device ", d, " outside [0, ", devices, ")");
      if (d == device[n]) continue;
      ++r.remote_pairs;
      if (!seen[static_cast<std::size_t>(d)]) {
        seen[static_cast<std::size_t>(d)] = 1;
        ++r.remote_token_devices;
      }
    }
  }
  return r;
}

}  // namespace moe::speculative
