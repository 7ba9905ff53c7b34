#pragma once
// s-EG baseline: two-stage balanced k-means (experts first, then tokens), seeded: balanced_kmeans.
// The problem, result and shared best responses are in cocluster_problem.hpp.

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
  auto map = detail::greedy_matching(m, D);
  std::vector<int> token_device(p.rows());
  for (std::size_t i = 0; i < p.rows(); ++i) token_device[i] = map[static_cast<std::size_t>(token_cluster[i])];
  return detail::finish(p, std::move(expert_device), std::move(token_device), it);
}

}  // namespace moe::speculative
