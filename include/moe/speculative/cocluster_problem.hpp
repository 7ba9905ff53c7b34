#pragma once
// s-EG co-clustering (Speculative MoE, section 3.4 and Appendix B): the problem every solver takes,
// the result every solver returns, their quality measures (local activation rate, token-load
// imbalance, the normalised objective), and the best responses the solvers share: tokens to a fixed
// expert grouping under the balance cap (assign_tokens_to), experts to fixed token labels (an
// assignment problem, exact), and the alternating refinement of both (refine). The solvers are in
// cocluster_cross_entropy.hpp, cocluster_kmeans.hpp and cocluster_metis.hpp; cocluster.hpp
// includes the first two.

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

/// Greedy maximum-weight matching of a D x D weight matrix (row-major, non-negative): D rounds,
/// each pairing the unmatched row and column of the largest weight (the first in row-major order
/// on ties). Returns the column of each row.
inline std::vector<int> greedy_matching(std::vector<double> const& weight, std::size_t D) {
  std::vector<int> map(D, -1);
  std::vector<bool> used(D, false);
  for (std::size_t round = 0; round < D; ++round) {
    double best = -1;
    std::size_t bf = 0, bt = 0;
    for (std::size_t f = 0; f < D; ++f) {
      if (map[f] >= 0) continue;
      for (std::size_t t = 0; t < D; ++t)
        if (!used[t] && weight[f * D + t] > best) {
          best = weight[f * D + t];
          bf = f;
          bt = t;
        }
    }
    map[bf] = static_cast<int>(bt);
    used[bt] = true;
  }
  return map;
}

/// Relabels `labels` (values in [0, D)) to agree as much as possible with `reference`
/// (greedy maximum-overlap matching of the D x D overlap matrix).
inline void align_labels(std::vector<int>& labels, std::vector<int> const& reference, int devices) {
  auto D = static_cast<std::size_t>(devices);
  std::vector<double> overlap(D * D, 0.0);
  for (std::size_t e = 0; e < labels.size(); ++e)
    overlap[static_cast<std::size_t>(labels[e]) * D + static_cast<std::size_t>(reference[e])] += 1;
  auto map = greedy_matching(overlap, D);
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
