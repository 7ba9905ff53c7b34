#pragma once
// s-EG: balanced token-expert co-clustering (Speculative MoE, section 3.4 and Appendix B).
//
// Given, for one MoE layer, the profiled activations c(t, e) (how often token t chose expert e) and
// the token frequencies f(t), find
//   - an expert -> device grouping with exactly experts/devices experts per device, and
//   - a token -> device table (where s-TS re-batches each token before the gate),
// such that most activations are local (expert on the token's device) while the token frequency
// per device stays balanced. The paper's objective is
//     J = sum_d (F_d - F/D)^2  +  lambda * sum_{t,e: dev(e) != dev(t)} c(t, e)
// with F_d the token frequency on device d; `objective()` evaluates a normalised form of it.
//
// Solvers:
//   solve_cross_entropy  the cross-entropy method of Algorithm 1 (seeded, deterministic)
//   balanced_kmeans      two-stage balanced k-means baseline (experts first, then tokens)
//   solve_metis          METIS baseline, in moe/speculative/cocluster_metis.hpp (needs libmetis)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/hungarian.hpp"
#include "moe/core/rng.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/profile/route_profile.hpp"

namespace moe::speculative {

/// One layer's co-clustering input: rows are distinct tokens, CSR activations per row.
struct CoclusterProblem {
  int experts = 0;
  int devices = 0;
  std::vector<std::int32_t> tokens;   ///< token id of row i
  std::vector<double> frequency;      ///< occurrences f(i) of row i
  std::vector<std::int64_t> offsets;  ///< row i is [offsets[i], offsets[i+1])
  std::vector<std::int32_t> expert;   ///< expert of each entry
  std::vector<double> weight;         ///< activations c(i, e) of each entry

  [[nodiscard]] std::size_t rows() const { return tokens.size(); }
  [[nodiscard]] int experts_per_device() const { return experts / devices; }
  [[nodiscard]] double total_weight() const { return std::accumulate(weight.begin(), weight.end(), 0.0); }
  [[nodiscard]] double total_frequency() const {
    return std::accumulate(frequency.begin(), frequency.end(), 0.0);
  }

  /// Throws moe::Error when the problem cannot be solved as stated.
  void validate() const {
    check(devices > 0, "co-clustering: devices must be positive, got ", devices);
    check(experts > 0, "co-clustering: experts must be positive, got ", experts);
    check(devices <= experts, "co-clustering: more devices (", devices, ") than experts (", experts,
          "): every device needs at least one expert");
    check(experts % devices == 0, "co-clustering: ", experts, " experts do not split evenly over ",
          devices, " devices");
    check(!tokens.empty(), "co-clustering: the profile has no tokens (empty profile)");
    check(offsets.size() == tokens.size() + 1 && frequency.size() == tokens.size() &&
              expert.size() == weight.size() && static_cast<std::size_t>(offsets.back()) == expert.size(),
          "co-clustering: inconsistent problem arrays");
    check(offsets.front() == 0, "co-clustering: offsets must start at 0, got ", offsets.front());
    for (std::size_t i = 0; i < rows(); ++i)
      check(offsets[i] <= offsets[i + 1], "co-clustering: offsets decrease at row ", i, " (", offsets[i], " > ",
            offsets[i + 1], ")");
    for (double w : weight)
      check(std::isfinite(w) && w >= 0, "co-clustering: activation count ", w, " is negative or not finite");
    for (auto e : expert)
      check(e >= 0 && e < experts, "co-clustering: expert ", e, " outside [0, ", experts, ")");
    for (std::size_t i = 0; i < rows(); ++i)
      check(frequency[i] > 0 && std::isfinite(frequency[i]), "co-clustering: token ", tokens[i], " has frequency ",
            frequency[i], " (must be positive and finite)");
    check(total_weight() > 0, "co-clustering: the profile has no activations (empty profile)");
  }

  /// From one layer of a route profile: f(t) = activations / top_k.
  static CoclusterProblem from_counts(profile::LayerCounts const& lc, int top_k, int devices) {
    check(top_k > 0, "co-clustering: top_k must be positive, got ", top_k);
    check(!lc.empty(), "co-clustering: layer ", lc.layer, " of the profile is empty");
    CoclusterProblem p;
    p.experts = lc.experts;
    p.devices = devices;
    p.tokens = lc.tokens;
    p.offsets = lc.offsets;
    p.expert = lc.expert;
    p.weight.assign(lc.count.begin(), lc.count.end());
    p.frequency.resize(lc.rows());
    for (std::size_t i = 0; i < lc.rows(); ++i)
      p.frequency[i] = static_cast<double>(lc.row_total(i)) / top_k;
    p.validate();
    return p;
  }
};

/// A co-clustering: expert grouping, token table and its quality on the training data.
struct CoclusterResult {
  placement::Table experts;                         ///< expert -> device
  std::vector<int> token_device;         ///< row i of the problem -> device
  std::vector<double> token_confidence;  ///< share of row i's activations on its device
  double local_rate = 0;                 ///< LAR on the training activations
  double imbalance = 0;                  ///< max/mean - 1 of the token frequency per device
  int iterations = 0;                    ///< solver iterations run
};

// -------------------------------------------------------------------------------------------------
// Evaluation on the problem's own data.
// -------------------------------------------------------------------------------------------------

/// Share of activations whose expert sits on the token's device.
inline double local_rate(CoclusterProblem const& p, std::span<int const> expert_device,
                         std::span<int const> token_device) {
  check(expert_device.size() == static_cast<std::size_t>(p.experts) && token_device.size() == p.rows(),
        "co-clustering: local_rate needs ", p.experts, " expert devices and ", p.rows(), " token devices, got ",
        expert_device.size(), " and ", token_device.size());
  double local = 0, total = 0;
  for (std::size_t i = 0; i < p.rows(); ++i)
    for (auto j = p.offsets[i]; j < p.offsets[i + 1]; ++j) {
      auto ju = static_cast<std::size_t>(j);
      total += p.weight[ju];
      if (expert_device[static_cast<std::size_t>(p.expert[ju])] == token_device[i]) local += p.weight[ju];
    }
  return total > 0 ? local / total : 0.0;
}

/// Token frequency per device.
inline std::vector<double> device_token_load(CoclusterProblem const& p, std::span<int const> token_device) {
  check(token_device.size() == p.rows(), "co-clustering: ", token_device.size(), " token devices for ", p.rows(),
        " tokens");
  std::vector<double> load(static_cast<std::size_t>(p.devices), 0.0);
  for (std::size_t i = 0; i < p.rows(); ++i) {
    int d = token_device[i];
    check(d >= 0 && d < p.devices, "co-clustering: token ", p.tokens[i], " on device ", d, ", outside [0, ",
          p.devices, ")");
    load[static_cast<std::size_t>(d)] += p.frequency[i];
  }
  return load;
}

/// max/mean - 1 of a load vector (0 = perfectly balanced).
inline double imbalance(std::span<double const> load) {
  double sum = 0, mx = 0;
  for (double v : load) {
    sum += v;
    mx = std::max(mx, v);
  }
  if (sum <= 0) return 0;
  return mx / (sum / static_cast<double>(load.size())) - 1.0;
}

/// The 3.4 objective, normalised: sum_d (F_d / (F/D) - 1)^2 + lambda * (1 - LAR).
inline double objective(CoclusterProblem const& p, std::span<int const> expert_device,
                        std::span<int const> token_device, double lambda) {
  auto load = device_token_load(p, token_device);
  double mean = p.total_frequency() / p.devices, bal = 0;
  for (double v : load) bal += (v / mean - 1) * (v / mean - 1);
  return bal + lambda * (1.0 - local_rate(p, expert_device, token_device));
}

namespace detail {

/// Rows sorted by descending frequency (ties: row index), the order tokens pick devices in.
inline std::vector<std::size_t> frequency_order(CoclusterProblem const& p) {
  std::vector<std::size_t> order(p.rows());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return p.frequency[a] > p.frequency[b]; });
  return order;
}

/// Capacity-constrained best response of the tokens to an expert grouping: in `order`, each token
/// takes the device holding most of its activations among devices whose token frequency stays
/// within balance_factor * F / D (the least loaded device when none does). Returns the local weight.
inline double assign_tokens(CoclusterProblem const& p, std::span<int const> expert_device,
                            std::span<std::size_t const> order, double balance_factor,
                            std::vector<int>& token_device, std::vector<double>& load,
                            std::vector<double>& mass) {
  auto D = static_cast<std::size_t>(p.devices);
  double cap = balance_factor * p.total_frequency() / p.devices;
  token_device.assign(p.rows(), 0);
  load.assign(D, 0.0);
  mass.assign(D, 0.0);
  double local = 0;
  for (std::size_t i : order) {
    std::fill(mass.begin(), mass.end(), 0.0);
    for (auto j = p.offsets[i]; j < p.offsets[i + 1]; ++j) {
      auto ju = static_cast<std::size_t>(j);
      mass[static_cast<std::size_t>(expert_device[static_cast<std::size_t>(p.expert[ju])])] += p.weight[ju];
    }
    std::size_t best = D, least = 0;
    for (std::size_t d = 0; d < D; ++d) {
      if (load[d] < load[least]) least = d;
      if (load[d] + p.frequency[i] <= cap && (best == D || mass[d] > mass[best])) best = d;
    }
    if (best == D) best = least;
    token_device[i] = static_cast<int>(best);
    load[best] += p.frequency[i];
    local += mass[best];
  }
  return local;
}

/// Capacity-constrained token assignment with device prices (Lagrangian relaxation): token i
/// prefers the device maximising mass(i, d) - price_d * f(i); prices rise on devices over the cap
/// gamma * F / D and fall on the others (subgradient steps), then a final pass in frequency order
/// gives each token its most preferred device that still has room. Returns the local weight.
inline double assign_tokens_priced(CoclusterProblem const& p, std::span<int const> expert_device,
                                   std::span<std::size_t const> order, double balance_factor,
                                   std::vector<int>& token_device, int steps = 40) {
  auto D = static_cast<std::size_t>(p.devices);
  auto N = p.rows();
  double cap = balance_factor * p.total_frequency() / p.devices;
  std::vector<double> mass(N * D, 0.0);
  for (std::size_t i = 0; i < N; ++i)
    for (auto j = p.offsets[i]; j < p.offsets[i + 1]; ++j) {
      auto ju = static_cast<std::size_t>(j);
      mass[i * D + static_cast<std::size_t>(expert_device[static_cast<std::size_t>(p.expert[ju])])] += p.weight[ju];
    }
  std::vector<double> price(D, 0.0), load(D);
  std::vector<int> choice(N);
  // Prices are in units of activations per occurrence (mass / f is at most top_k).
  double scale = 0;
  for (std::size_t i = 0; i < N; ++i)
    for (std::size_t d = 0; d < D; ++d) scale = std::max(scale, mass[i * D + d] / p.frequency[i]);
  for (int s = 0; s < steps; ++s) {
    std::fill(load.begin(), load.end(), 0.0);
    for (std::size_t i = 0; i < N; ++i) {
      std::size_t best = 0;
      double bv = -std::numeric_limits<double>::infinity();
      for (std::size_t d = 0; d < D; ++d) {
        double v = mass[i * D + d] - price[d] * p.frequency[i];
        if (v > bv) {
          bv = v;
          best = d;
        }
      }
      choice[i] = static_cast<int>(best);
      load[best] += p.frequency[i];
    }
    double step = 0.5 * scale / (1.0 + s);
    bool feasible = true;
    for (std::size_t d = 0; d < D; ++d) {
      double excess = load[d] / cap - 1.0;
      if (excess > 0) feasible = false;
      price[d] = std::max(0.0, price[d] + step * excess);
    }
    if (feasible) break;
  }
  token_device.assign(N, 0);
  std::fill(load.begin(), load.end(), 0.0);
  std::vector<std::size_t> pref(D);
  double local = 0;
  for (std::size_t i : order) {
    std::iota(pref.begin(), pref.end(), std::size_t{0});
    std::stable_sort(pref.begin(), pref.end(), [&](std::size_t a, std::size_t b) {
      return mass[i * D + a] - price[a] * p.frequency[i] > mass[i * D + b] - price[b] * p.frequency[i];
    });
    std::size_t pick = D;
    for (std::size_t d : pref)
      if (load[d] + p.frequency[i] <= cap) {
        pick = d;
        break;
      }
    if (pick == D) pick = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    token_device[i] = static_cast<int>(pick);
    load[pick] += p.frequency[i];
    local += mass[i * D + pick];
  }
  return local;
}

/// Fills result statistics (confidence, LAR, imbalance) from labels.
inline CoclusterResult finish(CoclusterProblem const& p, std::vector<int> expert_device,
                              std::vector<int> token_device, int iterations) {
  CoclusterResult r;
  r.token_confidence.resize(p.rows());
  for (std::size_t i = 0; i < p.rows(); ++i) {
    double local = 0, total = 0;
    for (auto j = p.offsets[i]; j < p.offsets[i + 1]; ++j) {
      auto ju = static_cast<std::size_t>(j);
      total += p.weight[ju];
      if (expert_device[static_cast<std::size_t>(p.expert[ju])] == token_device[i]) local += p.weight[ju];
    }
    r.token_confidence[i] = total > 0 ? local / total : 0.0;
  }
  r.local_rate = local_rate(p, expert_device, token_device);
  auto load = device_token_load(p, token_device);
  r.imbalance = imbalance(load);
  r.experts = placement::Table(std::move(expert_device));
  r.token_device = std::move(token_device);
  r.iterations = iterations;
  return r;
}

/// Relabels `labels` (values in [0, D)) to agree as much as possible with `reference`
/// (greedy maximum-overlap matching of the D x D overlap matrix).
inline void align_labels(std::vector<int>& labels, std::vector<int> const& reference, int devices) {
  auto D = static_cast<std::size_t>(devices);
  std::vector<double> overlap(D * D, 0.0);
  for (std::size_t e = 0; e < labels.size(); ++e)
    overlap[static_cast<std::size_t>(labels[e]) * D + static_cast<std::size_t>(reference[e])] += 1;
  std::vector<int> map(D, -1);
  std::vector<bool> used(D, false);
  for (std::size_t round = 0; round < D; ++round) {
    double best = -1;
    std::size_t bf = 0, bt = 0;
    for (std::size_t f = 0; f < D; ++f) {
      if (map[f] >= 0) continue;
      for (std::size_t t = 0; t < D; ++t)
        if (!used[t] && overlap[f * D + t] > best) {
          best = overlap[f * D + t];
          bf = f;
          bt = t;
        }
    }
    map[bf] = static_cast<int>(bt);
    used[bt] = true;
  }
  for (auto& l : labels) l = map[static_cast<std::size_t>(l)];
}

/// Minimum-cost assignment of n rows to m >= n columns: the library's one implementation.
using core::hungarian;

/// Best expert grouping (exactly E/D per device) for fixed token labels: maximises the local
/// activations, an assignment problem solved exactly.
inline std::vector<int> best_experts_for(CoclusterProblem const& p, std::span<int const> token_device) {
  auto E = static_cast<std::size_t>(p.experts);
  auto D = static_cast<std::size_t>(p.devices);
  auto per = static_cast<std::size_t>(p.experts_per_device());
  std::vector<double> local(E * D, 0.0);
  for (std::size_t i = 0; i < p.rows(); ++i)
    for (auto j = p.offsets[i]; j < p.offsets[i + 1]; ++j) {
      auto ju = static_cast<std::size_t>(j);
      local[static_cast<std::size_t>(p.expert[ju]) * D + static_cast<std::size_t>(token_device[i])] += p.weight[ju];
    }
  std::vector<double> cost(E * E);
  for (std::size_t e = 0; e < E; ++e)
    for (std::size_t slot = 0; slot < E; ++slot) cost[e * E + slot] = -local[e * D + slot / per];
  auto col = hungarian(cost, E, E);
  std::vector<int> out(E);
  for (std::size_t e = 0; e < E; ++e) out[e] = static_cast<int>(static_cast<std::size_t>(col[e]) / per);
  return out;
}

/// Alternating refinement: experts' exact best response to the tokens, then the tokens' capacity
/// -constrained best response to the experts, while the local activations grow (at most `rounds`).
/// Returns the local weight of the final labels.
inline double polish(CoclusterProblem const& p, std::vector<int>& expert_device, std::vector<int>& token_device,
                     std::span<std::size_t const> order, double balance_factor, int rounds, double score) {
  std::vector<int> tokens;
  for (int r = 0; r < rounds; ++r) {
    auto experts = best_experts_for(p, token_device);
    double s = assign_tokens_priced(p, experts, order, balance_factor, tokens);
    if (s <= score * (1 + 1e-12)) break;
    score = s;
    expert_device = std::move(experts);
    token_device = tokens;
  }
  return score;
}

}  // namespace detail

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

/// Alternating refinement of any co-clustering (e.g. a baseline's), keeping the balance cap.
inline CoclusterResult refine(CoclusterProblem const& p, CoclusterResult const& r, int rounds,
                              double balance_factor = 1.1) {
  p.validate();
  auto experts = r.experts.ranks();
  auto tokens = r.token_device;
  auto order = detail::frequency_order(p);
  double score = local_rate(p, experts, tokens) * p.total_weight();
  detail::polish(p, experts, tokens, order, balance_factor, rounds, score);
  return detail::finish(p, std::move(experts), std::move(tokens), r.iterations + rounds);
}

// -------------------------------------------------------------------------------------------------
// Two-stage balanced k-means baseline.
// -------------------------------------------------------------------------------------------------

struct KMeansOptions {
  int iterations = 30;
  double balance_factor = 1.1;  ///< token frequency per device <= factor * F / D
  std::uint64_t seed = 1;
};

/// Stage 1 clusters the experts into D groups of exactly E/D by balanced k-means on their
/// co-activation profiles (row e: sum_t c(t,e) c(t,e') / c(t), L2-normalised); stage 2 clusters the
/// tokens by balanced k-means on their activation shares over the D expert groups (centroids start
/// at the unit vectors, so cluster d starts as "device d"), with the token-frequency cap.
inline CoclusterResult balanced_kmeans(CoclusterProblem const& p, KMeansOptions const& opt = {}) {
  p.validate();
  check(opt.iterations > 0, "balanced k-means: iterations must be positive");
  check(opt.balance_factor >= 1, "balanced k-means: balance_factor must be >= 1");
  auto E = static_cast<std::size_t>(p.experts);
  auto D = static_cast<std::size_t>(p.devices);
  auto per = static_cast<std::size_t>(p.experts_per_device());
  core::Rng rng(opt.seed);

  // Stage 1: expert features.
  std::vector<double> feat(E * E, 0.0);
  for (std::size_t i = 0; i < p.rows(); ++i) {
    double total = 0;
    for (auto j = p.offsets[i]; j < p.offsets[i + 1]; ++j) total += p.weight[static_cast<std::size_t>(j)];
    if (total <= 0) continue;
    for (auto a = p.offsets[i]; a < p.offsets[i + 1]; ++a)
      for (auto b = p.offsets[i]; b < p.offsets[i + 1]; ++b) {
        auto au = static_cast<std::size_t>(a), bu = static_cast<std::size_t>(b);
        feat[static_cast<std::size_t>(p.expert[au]) * E + static_cast<std::size_t>(p.expert[bu])] +=
            p.weight[au] * p.weight[bu] / total;
      }
  }
  for (std::size_t e = 0; e < E; ++e) {
    double n = 0;
    for (std::size_t f = 0; f < E; ++f) n += feat[e * E + f] * feat[e * E + f];
    n = std::sqrt(n);
    if (n > 0)
      for (std::size_t f = 0; f < E; ++f) feat[e * E + f] /= n;
  }
  auto dist2 = [](double const* a, double const* b, std::size_t n) {
    double s = 0;
    for (std::size_t k = 0; k < n; ++k) s += (a[k] - b[k]) * (a[k] - b[k]);
    return s;
  };
  // k-means++ initialisation (seeded).
  std::vector<double> cent(D * E, 0.0);
  {
    std::size_t first = rng.below(E);
    std::copy_n(&feat[first * E], E, &cent[0]);
    std::vector<double> dmin(E, std::numeric_limits<double>::max());
    for (std::size_t c = 1; c < D; ++c) {
      double sum = 0;
      for (std::size_t e = 0; e < E; ++e) {
        dmin[e] = std::min(dmin[e], dist2(&feat[e * E], &cent[(c - 1) * E], E));
        sum += dmin[e];
      }
      std::size_t pick = 0;
      double u = rng.uniform() * sum;
      for (std::size_t e = 0; e < E; ++e) {
        pick = e;
        if (u < dmin[e]) break;
        u -= dmin[e];
      }
      std::copy_n(&feat[pick * E], E, &cent[c * E]);
    }
  }
  std::vector<int> expert_device(E, -1), prev;
  std::vector<std::pair<double, std::size_t>> pairs(E * D);
  int it = 0;
  for (; it < opt.iterations; ++it) {
    for (std::size_t e = 0; e < E; ++e)
      for (std::size_t c = 0; c < D; ++c) pairs[e * D + c] = {dist2(&feat[e * E], &cent[c * E], E), e * D + c};
    std::stable_sort(pairs.begin(), pairs.end());
    std::vector<std::size_t> size(D, 0);
    std::fill(expert_device.begin(), expert_device.end(), -1);
    for (auto const& [dist, key] : pairs) {
      std::size_t e = key / D, c = key % D;
      if (expert_device[e] >= 0 || size[c] >= per) continue;
      expert_device[e] = static_cast<int>(c);
      ++size[c];
    }
    std::fill(cent.begin(), cent.end(), 0.0);
    for (std::size_t e = 0; e < E; ++e)
      for (std::size_t f = 0; f < E; ++f) cent[static_cast<std::size_t>(expert_device[e]) * E + f] += feat[e * E + f] / static_cast<double>(per);
    if (expert_device == prev) break;
    prev = expert_device;
  }

  // Stage 2: tokens on their activation shares over the expert groups.
  std::vector<double> x(p.rows() * D, 0.0);
  for (std::size_t i = 0; i < p.rows(); ++i) {
    double total = 0;
    for (auto j = p.offsets[i]; j < p.offsets[i + 1]; ++j) {
      auto ju = static_cast<std::size_t>(j);
      x[i * D + static_cast<std::size_t>(expert_device[static_cast<std::size_t>(p.expert[ju])])] += p.weight[ju];
      total += p.weight[ju];
    }
    if (total > 0)
      for (std::size_t d = 0; d < D; ++d) x[i * D + d] /= total;
  }
  std::vector<double> tc(D * D, 0.0);
  for (std::size_t c = 0; c < D; ++c) tc[c * D + c] = 1.0;
  auto order = detail::frequency_order(p);
  double cap = opt.balance_factor * p.total_frequency() / p.devices;
  std::vector<int> token_cluster(p.rows(), 0), tprev;
  for (int t = 0; t < opt.iterations; ++t) {
    std::vector<double> load(D, 0.0);
    for (std::size_t i : order) {
      std::size_t best = D, least = 0;
      double bd = 0;
      for (std::size_t c = 0; c < D; ++c) {
        if (load[c] < load[least]) least = c;
        double dd = dist2(&x[i * D], &tc[c * D], D);
        if (load[c] + p.frequency[i] <= cap && (best == D || dd < bd)) {
          best = c;
          bd = dd;
        }
      }
      if (best == D) best = least;
      token_cluster[i] = static_cast<int>(best);
      load[best] += p.frequency[i];
    }
    std::vector<double> wsum(D, 0.0);
    std::fill(tc.begin(), tc.end(), 0.0);
    for (std::size_t i = 0; i < p.rows(); ++i) {
      auto c = static_cast<std::size_t>(token_cluster[i]);
      wsum[c] += p.frequency[i];
      for (std::size_t d = 0; d < D; ++d) tc[c * D + d] += p.frequency[i] * x[i * D + d];
    }
    for (std::size_t c = 0; c < D; ++c)
      for (std::size_t d = 0; d < D; ++d) tc[c * D + d] = wsum[c] > 0 ? tc[c * D + d] / wsum[c] : (c == d ? 1.0 : 0.0);
    if (token_cluster == tprev) break;
    tprev = token_cluster;
  }
  // Map token clusters to devices: greedy maximum activation mass matching.
  std::vector<double> m(D * D, 0.0);
  for (std::size_t i = 0; i < p.rows(); ++i)
    for (std::size_t d = 0; d < D; ++d)
      m[static_cast<std::size_t>(token_cluster[i]) * D + d] += p.frequency[i] * x[i * D + d];
  std::vector<int> map(D, -1);
  std::vector<bool> used(D, false);
  for (std::size_t round = 0; round < D; ++round) {
    double best = -1;
    std::size_t bc = 0, bd = 0;
    for (std::size_t c = 0; c < D; ++c) {
      if (map[c] >= 0) continue;
      for (std::size_t d = 0; d < D; ++d)
        if (!used[d] && m[c * D + d] > best) {
          best = m[c * D + d];
          bc = c;
          bd = d;
        }
    }
    map[bc] = static_cast<int>(bd);
    used[bd] = true;
  }
  std::vector<int> token_device(p.rows());
  for (std::size_t i = 0; i < p.rows(); ++i) token_device[i] = map[static_cast<std::size_t>(token_cluster[i])];
  return detail::finish(p, std::move(expert_device), std::move(token_device), it);
}

/// Tokens' best response to a fixed expert grouping (e.g. contiguous placement with s-TS only).
inline CoclusterResult assign_tokens_to(CoclusterProblem const& p, placement::Table const& experts,
                                        double balance_factor = std::numeric_limits<double>::infinity()) {
  p.validate();
  experts.validate(p.experts, p.devices);
  std::vector<int> tokens;
  std::vector<double> load, mass;
  auto order = detail::frequency_order(p);
  detail::assign_tokens(p, experts.ranks(), order, balance_factor, tokens, load, mass);
  return detail::finish(p, experts.ranks(), std::move(tokens), 0);
}

}  // namespace moe::speculative
