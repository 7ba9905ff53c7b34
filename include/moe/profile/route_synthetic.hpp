#pragma once
// Seeded synthetic route profiles (for benchmarks and tests; label results as synthetic).
//
// Model: `topics` groups of experts (topic c owns the experts whose seeded random rank r satisfies
// r % topics == c). Token t has a Zipf(s) frequency over the vocabulary and a home topic; each of
// its occurrences picks top_k distinct experts, each one from its home topic with probability
// `affinity`, otherwise uniformly from all experts.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/rng.hpp"
#include "moe/profile/route_profile.hpp"

namespace moe::profile::synthetic {

struct Spec {
  int vocab = 1000;
  int experts = 16;
  int top_k = 2;
  int topics = 4;
  std::int64_t occurrences = 100000;  ///< total token occurrences
  double zipf = 1.05;                 ///< Zipf exponent of token frequencies
  double affinity = 0.8;              ///< probability an expert comes from the token's home topic
  int layer = 0;
  std::uint64_t seed = 1;
};

/// Builds one layer of counts. Tokens drawing no occurrence are absent from the profile.
inline RouteProfile generate(Spec const& s) {
  check(s.vocab > 0 && s.experts > 0 && s.top_k > 0 && s.top_k <= s.experts && s.topics > 0 &&
            s.topics <= s.experts && s.occurrences > 0 && s.affinity >= 0 && s.affinity <= 1,
        "synthetic profile: invalid spec");
  check(s.affinity < 1 || s.experts / s.topics >= s.top_k,
        "synthetic profile: with affinity 1 every topic needs at least top_k experts");
  moe::core::Rng rng(s.seed);
  auto V = static_cast<std::size_t>(s.vocab);
  auto E = static_cast<std::size_t>(s.experts);
  // Topic membership of experts (a seeded permutation so topics are not contiguous ids).
  std::vector<int> perm(E);
  std::iota(perm.begin(), perm.end(), 0);
  rng.shuffle(perm);
  std::vector<std::vector<int>> topic_experts(static_cast<std::size_t>(s.topics));
  for (std::size_t r = 0; r < E; ++r) topic_experts[r % static_cast<std::size_t>(s.topics)].push_back(perm[r]);
  // Zipf frequencies -> occurrences per token (largest remainder rounding of the expectation, plus
  // a seeded random rank order so frequent tokens are not the low ids).
  std::vector<double> w(V);
  double wsum = 0;
  for (std::size_t r = 0; r < V; ++r) wsum += w[r] = 1.0 / std::pow(static_cast<double>(r + 1), s.zipf);
  std::vector<std::size_t> rank_token(V);
  std::iota(rank_token.begin(), rank_token.end(), std::size_t{0});
  rng.shuffle(rank_token);
  RouteRecorder rec(s.experts, s.top_k);
  std::vector<std::int64_t> cnt(E);
  std::vector<char> used(E);
  for (std::size_t r = 0; r < V; ++r) {
    double expect = static_cast<double>(s.occurrences) * w[r] / wsum;
    auto n = static_cast<std::int64_t>(expect);
    if (rng.uniform() < expect - static_cast<double>(n)) ++n;
    if (n == 0) continue;
    auto token = static_cast<int>(rank_token[r]);
    auto const& home = topic_experts[static_cast<std::size_t>(token) % topic_experts.size()];
    std::fill(cnt.begin(), cnt.end(), 0);
    for (std::int64_t o = 0; o < n; ++o) {
      std::fill(used.begin(), used.end(), 0);
      for (int k = 0; k < s.top_k; ++k) {
        int e;
        do {
          if (rng.uniform() < s.affinity) e = home[rng.below(home.size())];
          else e = static_cast<int>(rng.below(E));
        } while (used[static_cast<std::size_t>(e)]);
        used[static_cast<std::size_t>(e)] = 1;
        ++cnt[static_cast<std::size_t>(e)];
      }
    }
    for (std::size_t e = 0; e < E; ++e)
      if (cnt[e] > 0) rec.add(s.layer, token, static_cast<int>(e), cnt[e]);
  }
  return rec.profile();
}

}  // namespace moe::profile::synthetic
