#pragma once
// Held-out evaluation of an s-TS token table at an ENFORCED token balance.
//
// A token table fitted on some data does not keep its balance on other data (a table balanced on
// arxiv + book can put 3x the mean load on one device of github). Online, s-TS bounds the tokens per
// device anyway (cap_predictions in shuffle_plan.hpp: on an over-full device the least confident
// tokens move elsewhere). To compare placements fairly, every method is evaluated here under the same
// cap: capacity = capacity_factor * (occurrences / devices) per device.
//
// The held-out data are aggregated counts (token, expert, count), so the evaluation works on expected
// occurrences: token t has f_t = activations / top_k occurrences, and when a share x of them sits on
// device d they contribute x / f_t * (activations of t on the experts of d) local activations (the
// occurrences of one token are exchangeable in aggregated counts). This is the large-batch limit of
// cap_predictions applied to a batch holding the whole held-out set; occurrences of one token may be
// split between devices (different occurrences of a token can land on different devices online).
//
// Steps, identical for every placement method:
//   1. every token gets its predicted device and confidence (the predictor's answer); tokens the
//      table never saw get the fallback device with confidence 0 (`Fallback::modulo`: token id mod D,
//      the predictor's default; `Fallback::prior`: the device with the largest prior share, see 3);
//   2. on every device above the capacity, the least confident occurrences (ties: larger token id
//      first) beyond the capacity are taken off;
//   3. they are placed on devices with room: `Fallback::modulo` fills the device with the most room
//      first (as cap_predictions does); `Fallback::prior` fills devices in descending order of a
//      prior share vector (e.g. `device_prior`: the share of the FITTED layer's activations served
//      by each device's experts, i.e. the chance that an unknown token's activation is local there).
// All the data the rule uses at prediction time (table, placement, prior from fitted counts) is
// available online; only the scoring reads the held-out activations.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "moe/config.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/profile/route_profile.hpp"
#include "moe/speculative/predictor.hpp"

namespace moe::speculative {

enum class Fallback { modulo, prior };

struct CappedEvalOptions {
  double capacity_factor = 1.1;  ///< occurrences per device <= factor * mean (>= 1)
  Fallback fallback = Fallback::modulo;  ///< modulo was better on our validation split (docs/results/cocluster-olmoe.md)
};

struct CappedEval {
  double lar = 0;               ///< local activation rate after the cap
  double lar_uncapped = 0;      ///< the same table and fallback without the cap
  double imbalance = 0;         ///< max/mean - 1 of occurrences per device after the cap
  double imbalance_uncapped = 0;
  double moved_share = 0;       ///< share of occurrences moved by the cap
  double unseen_share = 0;      ///< share of occurrences whose token the table never saw
  std::vector<double> load;     ///< occurrences per device after the cap
};

/// Share of the layer's activations served by each device's experts (sums to 1).
[[nodiscard]] inline std::vector<double> device_prior(profile::LayerCounts const& lc, placement::Table const& placement,
                                                      int devices) {
  check(devices > 0, "device prior: devices must be positive, got ", devices);
  check(!lc.empty(), "device prior: layer ", lc.layer, " has no counts (empty profile)");
  check(placement.experts() == lc.experts, "device prior: placement has ", placement.experts(), " experts, counts ",
        lc.experts);
  std::vector<double> prior(static_cast<std::size_t>(devices), 0.0);
  double total = 0;
  for (std::size_t j = 0; j < lc.expert.size(); ++j) {
    int d = placement.rank_of(lc.expert[j]);
    check(d >= 0 && d < devices, "device prior: expert ", lc.expert[j], " is on device ", d, ", outside [0, ", devices,
          ")");
    prior[static_cast<std::size_t>(d)] += static_cast<double>(lc.count[j]);
    total += static_cast<double>(lc.count[j]);
  }
  check(total > 0, "device prior: layer ", lc.layer, " has no activations");
  for (auto& v : prior) v /= total;
  return prior;
}

/// Evaluates `predict(token) -> Prediction` on the held-out counts `lc` at the enforced cap.
/// `prior` (one value per device) is needed for Fallback::prior and ignored otherwise.
template <class Predict>
[[nodiscard]] CappedEval capped_evaluation(profile::LayerCounts const& lc, placement::Table const& placement, int top_k,
                                           int devices, Predict&& predict, std::span<double const> prior = {},
                                           CappedEvalOptions const& opt = {}) {
  check(devices > 0, "capped evaluation: devices must be positive, got ", devices);
  check(top_k > 0, "capped evaluation: top_k must be positive, got ", top_k);
  check(opt.capacity_factor >= 1, "capped evaluation: capacity_factor must be >= 1, got ", opt.capacity_factor);
  check(!lc.empty(), "capped evaluation: layer ", lc.layer, " has no counts (empty profile)");
  check(placement.experts() == lc.experts, "capped evaluation: placement has ", placement.experts(),
        " experts, counts ", lc.experts);
  check(opt.fallback != Fallback::prior || prior.size() == static_cast<std::size_t>(devices),
        "capped evaluation: the prior fallback needs one prior value per device (", devices, "), got ", prior.size());
  auto D = static_cast<std::size_t>(devices);
  auto N = lc.rows();
  // Device order of the prior fallback: descending prior, ties lower id.
  std::vector<std::size_t> by_prior(D);
  std::iota(by_prior.begin(), by_prior.end(), std::size_t{0});
  if (opt.fallback == Fallback::prior)
    std::stable_sort(by_prior.begin(), by_prior.end(), [&](std::size_t a, std::size_t b) { return prior[a] > prior[b]; });

  std::vector<double> f(N), mass(N * D, 0.0), conf(N);
  std::vector<int> dev(N);
  double total_act = 0, total_f = 0, unseen = 0;
  for (std::size_t i = 0; i < N; ++i) {
    double act = 0;
    for (auto j = lc.offsets[i]; j < lc.offsets[i + 1]; ++j) {
      auto ju = static_cast<std::size_t>(j);
      int d = placement.rank_of(lc.expert[ju]);
      check(d >= 0 && d < devices, "capped evaluation: expert ", lc.expert[ju], " is on device ", d,
            ", outside [0, ", devices, ")");
      mass[i * D + static_cast<std::size_t>(d)] += static_cast<double>(lc.count[ju]);
      act += static_cast<double>(lc.count[ju]);
    }
    f[i] = act / top_k;
    total_act += act;
    total_f += f[i];
    Prediction p = predict(static_cast<int>(lc.tokens[i]));
    if (p.source == Prediction::Source::fallback) {
      unseen += f[i];
      dev[i] = opt.fallback == Fallback::prior ? static_cast<int>(by_prior[0]) : p.device;
      conf[i] = -1;  // below every table confidence: unseen tokens move first
    } else {
      dev[i] = p.device;
      conf[i] = static_cast<double>(p.confidence);
    }
    check(dev[i] >= 0 && dev[i] < devices, "capped evaluation: token ", lc.tokens[i], " predicted for device ", dev[i],
          ", outside [0, ", devices, ")");
  }
  check(total_act > 0, "capped evaluation: layer ", lc.layer, " has no activations");
  CappedEval out;
  out.unseen_share = unseen / total_f;
  std::vector<double> load(D, 0.0);
  double local0 = 0;
  for (std::size_t i = 0; i < N; ++i) {
    load[static_cast<std::size_t>(dev[i])] += f[i];
    local0 += mass[i * D + static_cast<std::size_t>(dev[i])];
  }
  out.lar_uncapped = local0 / total_act;
  auto imb = [&](std::vector<double> const& l) {
    return *std::max_element(l.begin(), l.end()) / (total_f / static_cast<double>(D)) - 1.0;
  };
  out.imbalance_uncapped = imb(load);

  // Cap: per over-full device keep the most confident occurrences.
  double cap = opt.capacity_factor * total_f / static_cast<double>(D);
  std::vector<std::vector<std::size_t>> members(D);
  for (std::size_t i = 0; i < N; ++i) members[static_cast<std::size_t>(dev[i])].push_back(i);
  struct Piece {
    std::size_t row;
    double amount;
  };
  std::vector<Piece> moved;
  std::vector<double> kept(N, 0.0);  // occurrences of row i kept on dev[i]
  std::vector<double> after(D, 0.0);
  for (std::size_t d = 0; d < D; ++d) {
    auto& m = members[d];
    std::stable_sort(m.begin(), m.end(), [&](std::size_t a, std::size_t b) {
      if (conf[a] != conf[b]) return conf[a] > conf[b];
      return lc.tokens[a] < lc.tokens[b];
    });
    for (std::size_t i : m) {
      double take = std::min(f[i], std::max(0.0, cap - after[d]));
      kept[i] = take;
      after[d] += take;
      if (f[i] - take > 0) moved.push_back({i, f[i] - take});
    }
  }
  double local = 0, moved_total = 0;
  for (std::size_t i = 0; i < N; ++i) local += kept[i] / f[i] * mass[i * D + static_cast<std::size_t>(dev[i])];
  for (auto const& pc : moved) {
    double left = pc.amount;
    moved_total += left;
    while (left > 1e-12 * total_f) {
      std::size_t to = D;
      if (opt.fallback == Fallback::prior) {
        for (std::size_t d : by_prior)
          if (cap - after[d] > 1e-12 * total_f) {
            to = d;
            break;
          }
      } else {
        to = static_cast<std::size_t>(std::min_element(after.begin(), after.end()) - after.begin());  // most room
      }
      if (to == D) to = static_cast<std::size_t>(std::min_element(after.begin(), after.end()) - after.begin());
      double put = std::min(left, std::max(cap - after[to], 0.0));
      if (put <= 0) put = left;  // rounding: total fits by construction (factor >= 1)
      after[to] += put;
      local += put / f[pc.row] * mass[pc.row * D + to];
      left -= put;
    }
  }
  out.lar = local / total_act;
  out.moved_share = moved_total / total_f;
  out.imbalance = imb(after);
  out.load = std::move(after);
  return out;
}

}  // namespace moe::speculative
