#pragma once
// s-EG by the cross-entropy method of Algorithm 1 (Speculative MoE, Appendix B), seeded and
// deterministic: solve_cross_entropy. The problem, result and shared best responses are in
// cocluster_problem.hpp.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/rng.hpp"
#include "moe/speculative/cocluster_problem.hpp"

namespace moe::speculative {

// -------------------------------------------------------------------------------------------------
// Cross-entropy method (Algorithm 1).
// -------------------------------------------------------------------------------------------------

struct CrossEntropyOptions {
  int iterations = 30;          ///< T: sampling rounds (stops early once the distribution is settled)
  int samples = 16;             ///< n: samples per round
  double elite_fraction = 0.2;  ///< rho: share of samples that update the distribution (paper: 0.2)
  double smoothing = 0.7;       ///< weight of the elite frequencies in the update (1 - keeps the old)
  double balance_factor = 1.1;  ///< gamma: token frequency per device <= gamma * F / D (paper: 1.1)
  /// Our addition to Algorithm 1 (0 and 0 give the plain method): alternating refinement rounds
  /// (experts' exact best response, then the tokens' priced best response) applied to every
  /// sample before scoring, and to the best sample at the end.
  int polish_rounds = 2;
  int final_polish_rounds = 10;
  /// Weight of the balance term against the remote-activation term when ranking samples (the 3.4
  /// objective with lambda = 1 / balance_weight, in the normalised units of `objective()`); 0 ranks by
  /// local activations only (the hard cap balance_factor still applies).
  double balance_weight = 0;
  std::uint64_t seed = 1;
};

/// Balanced token-expert co-clustering by the cross-entropy method.
///
/// Each expert's device is a D-way multinomial with probabilities P_e (uniform at start). A round
/// draws `samples` expert groupings from P_e with exactly E/D experts per device (experts in a
/// random order, each drawn among the devices that still have room), lets the tokens pick their
/// devices under the balance cap gamma * F / D (largest tokens first, each to the device holding
/// most of its activations), scores each sample by its local activations, aligns the device labels
/// of the elite samples to the best one and moves P_e towards the elite label frequencies. The
/// best sample seen is returned. Deterministic for a given seed.
inline CoclusterResult solve_cross_entropy(CoclusterProblem const& p, CrossEntropyOptions const& opt = {}) {
  p.validate();
  check(opt.iterations > 0 && opt.samples > 0, "cross-entropy: iterations and samples must be positive");
  check(opt.elite_fraction > 0 && opt.elite_fraction <= 1, "cross-entropy: elite_fraction must be in (0, 1]");
  check(opt.smoothing > 0 && opt.smoothing <= 1, "cross-entropy: smoothing must be in (0, 1]");
  check(opt.balance_factor >= 1, "cross-entropy: balance_factor must be >= 1");
  check(opt.balance_weight >= 0, "cross-entropy: balance_weight must be >= 0");
  auto E = static_cast<std::size_t>(p.experts);
  auto D = static_cast<std::size_t>(p.devices);
  auto per = static_cast<std::size_t>(p.experts_per_device());
  core::Rng rng(opt.seed);
  auto order = detail::frequency_order(p);

  std::vector<double> prob(E * D, 1.0 / static_cast<double>(D));
  auto n_samples = static_cast<std::size_t>(opt.samples);
  auto n_elite = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(opt.elite_fraction * opt.samples)));
  std::vector<std::vector<int>> labels(n_samples, std::vector<int>(E));
  std::vector<double> score(n_samples);
  std::vector<int> best_experts, best_tokens, tokens;
  double best_score = -std::numeric_limits<double>::infinity(), best_local = 0;
  const double mean_load = p.total_frequency() / p.devices, total_weight = p.total_weight();
  std::vector<double> load, mass, w(D);
  std::vector<std::size_t> perm(E), room(D), idx(n_samples);
  std::iota(perm.begin(), perm.end(), std::size_t{0});
  int it = 0;
  for (; it < opt.iterations; ++it) {
    for (std::size_t s = 0; s < n_samples; ++s) {
      // Draw a balanced expert grouping.
      rng.shuffle(perm);
      std::fill(room.begin(), room.end(), per);
      for (std::size_t e : perm) {
        double sum = 0;
        for (std::size_t d = 0; d < D; ++d) sum += w[d] = room[d] > 0 ? prob[e * D + d] : 0.0;
        std::size_t pick = D;
        if (sum > 0) {
          double u = rng.uniform() * sum;
          for (std::size_t d = 0; d < D; ++d) {
            if (w[d] <= 0) continue;
            pick = d;
            if (u < w[d]) break;
            u -= w[d];
          }
        } else {  // all mass on full devices: any device with room, uniformly
          std::size_t free = 0;
          for (std::size_t d = 0; d < D; ++d) free += room[d] > 0;
          std::size_t k = rng.below(free);
          for (std::size_t d = 0; d < D; ++d)
            if (room[d] > 0 && k-- == 0) {
              pick = d;
              break;
            }
        }
        labels[s][e] = static_cast<int>(pick);
        --room[pick];
      }
      double local = detail::assign_tokens(p, labels[s], order, opt.balance_factor, tokens, load, mass);
      if (opt.polish_rounds > 0)
        local = detail::polish(p, labels[s], tokens, order, opt.balance_factor, opt.polish_rounds, local);
      // Samples are ranked by the 3.4 objective, negated and scaled by the total activations:
      // local activations - balance_weight * total * sum_d (F_d / (F/D) - 1)^2.
      score[s] = local;
      if (opt.balance_weight > 0) {
        auto dl = device_token_load(p, tokens);
        double bal = 0;
        for (double v : dl) bal += (v / mean_load - 1) * (v / mean_load - 1);
        score[s] -= opt.balance_weight * total_weight * bal;
      }
      if (score[s] > best_score) {
        best_score = score[s];
        best_local = local;
        best_experts = labels[s];
        best_tokens = tokens;
      }
    }
    // Elite update.
    std::iota(idx.begin(), idx.end(), std::size_t{0});
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return score[a] > score[b]; });
    std::vector<double> freq(E * D, 0.0);
    for (std::size_t k = 0; k < n_elite; ++k) {
      auto& l = labels[idx[k]];
      detail::align_labels(l, best_experts, p.devices);
      for (std::size_t e = 0; e < E; ++e) freq[e * D + static_cast<std::size_t>(l[e])] += 1.0 / static_cast<double>(n_elite);
    }
    double settled = 1.0;
    for (std::size_t e = 0; e < E; ++e) {
      double mx = 0;
      for (std::size_t d = 0; d < D; ++d) {
        auto& q = prob[e * D + d];
        q = (1 - opt.smoothing) * q + opt.smoothing * freq[e * D + d];
        mx = std::max(mx, q);
      }
      settled = std::min(settled, mx);
    }
    if (settled > 0.999) {
      ++it;
      break;
    }
  }
  if (opt.final_polish_rounds > 0)
    detail::polish(p, best_experts, best_tokens, order, opt.balance_factor, opt.final_polish_rounds, best_local);
  return detail::finish(p, std::move(best_experts), std::move(best_tokens), it);
}

}  // namespace moe::speculative
