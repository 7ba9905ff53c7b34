#pragma once
// Router policies and their host reference. A router turns one token's gate logits (fp32, one per
// routed expert) into its top-k experts and their combine weights.
//
//   SoftmaxTopK       softmax over all experts, top-k, optional renormalisation
//                     (Mixtral and Qwen3 renormalise; OLMoE and DeepSeek-MoE-16B do not)
//   GroupLimitedTopK  softmax, then only the best `groups_per_token` groups (a group scores its best
//                     expert) are eligible; top-k among them (DeepSeek-V2)
//   SigmoidGroupTopK  sigmoid scores; a per-expert correction bias is added for selection only; a
//                     group scores the sum of its two best biased scores; top-k among the best groups;
//                     weights are the unbiased scores, renormalised (DeepSeek-V3, Kimi-K2)
// Every policy multiplies the final weights by the shape's routed scaling factor.
//
// Ties are broken towards the lower index (expert or group), so results are deterministic and
// identical on every backend. Experts come out in order of decreasing selection score.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <numeric>
#include <span>
#include <string_view>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/shape.hpp"

namespace moe::router {

namespace detail {

/// Indices of the `k` largest values among those with allowed[i], larger first, ties to the lower index.
inline void top_k_indices(std::span<float const> values, std::span<unsigned char const> allowed, int k,
                          std::span<int> out) {
  int n = static_cast<int>(values.size());
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int i = 0; i < n; ++i) {
      if (!allowed.empty() && !allowed[static_cast<std::size_t>(i)]) continue;
      bool taken = false;
      for (int q = 0; q < j; ++q) taken |= out[static_cast<std::size_t>(q)] == i;
      if (taken) continue;
      if (best < 0 || values[static_cast<std::size_t>(i)] > values[static_cast<std::size_t>(best)]) best = i;
    }
    out[static_cast<std::size_t>(j)] = best;
  }
}

inline void softmax(std::span<float const> logits, std::span<float> probs) {
  float m = *std::max_element(logits.begin(), logits.end());
  float sum = 0.0f;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    probs[i] = std::exp(logits[i] - m);
    sum += probs[i];
  }
  for (auto& p : probs) p /= sum;
}

/// Marks the experts of the best `s.groups_per_token` groups as allowed.
inline void allow_best_groups(ShapeSpec const& s, std::span<float const> selection, std::span<unsigned char> allowed) {
  int per = s.experts_per_group();
  std::vector<float> group_score(static_cast<std::size_t>(s.groups));
  for (int g = 0; g < s.groups; ++g) {
    auto first = selection.begin() + g * per;
    if (s.group_score == GroupScore::sum_top2) {
      float a = -INFINITY, b = -INFINITY;  // best and second best
      for (auto it = first; it != first + per; ++it) {
        if (*it > a) {
          b = a;
          a = *it;
        } else if (*it > b) {
          b = *it;
        }
      }
      group_score[static_cast<std::size_t>(g)] = a + b;
    } else {
      group_score[static_cast<std::size_t>(g)] = *std::max_element(first, first + per);
    }
  }
  std::vector<int> chosen(static_cast<std::size_t>(s.groups_per_token));
  top_k_indices(group_score, {}, s.groups_per_token, chosen);
  std::fill(allowed.begin(), allowed.end(), 0);
  for (int g : chosen) std::fill(allowed.begin() + g * per, allowed.begin() + (g + 1) * per, 1);
}

inline void finish_weights(ShapeSpec const& s, std::span<float> weights) {
  if (s.renormalize) {
    float sum = std::accumulate(weights.begin(), weights.end(), 0.0f);
    for (auto& w : weights) w /= sum;
  }
  for (auto& w : weights) w *= s.routed_scale;
}

}  // namespace detail

/// A router policy routes one token: `route(shape, logits, bias, experts_out, weights_out)`, and
/// says which shapes it fits with `fits(shape)`.
template <class R>
concept Policy = requires(ShapeSpec const& s, std::span<float const> logits, std::span<float const> bias,
                          std::span<int> ids, std::span<float> w) {
  { R::name } -> std::convertible_to<std::string_view>;
  { R::fits(s) } -> std::same_as<bool>;
  R::route(s, logits, bias, ids, w);
};

struct SoftmaxTopK {
  static constexpr std::string_view name = "softmax-top-k";
  static constexpr bool fits(ShapeSpec const& s) { return s.scoring == Scoring::softmax && s.groups == 1; }
  static void route(ShapeSpec const& s, std::span<float const> logits, std::span<float const>, std::span<int> ids,
                    std::span<float> weights) {
    std::vector<float> p(logits.size());
    detail::softmax(logits, p);
    detail::top_k_indices(p, {}, s.top_k, ids);
    for (int j = 0; j < s.top_k; ++j) weights[static_cast<std::size_t>(j)] = p[static_cast<std::size_t>(ids[j])];
    detail::finish_weights(s, weights.first(static_cast<std::size_t>(s.top_k)));
  }
};

struct GroupLimitedTopK {
  static constexpr std::string_view name = "group-limited-top-k";
  static constexpr bool fits(ShapeSpec const& s) {
    return s.scoring == Scoring::softmax && (s.groups == 1 || s.group_score == GroupScore::max);
  }
  static void route(ShapeSpec const& s, std::span<float const> logits, std::span<float const>, std::span<int> ids,
                    std::span<float> weights) {
    std::vector<float> p(logits.size());
    detail::softmax(logits, p);
    std::vector<unsigned char> allowed(logits.size(), 1);
    if (s.groups > 1) detail::allow_best_groups(s, p, allowed);
    detail::top_k_indices(p, allowed, s.top_k, ids);
    for (int j = 0; j < s.top_k; ++j) weights[static_cast<std::size_t>(j)] = p[static_cast<std::size_t>(ids[j])];
    detail::finish_weights(s, weights.first(static_cast<std::size_t>(s.top_k)));
  }
};

struct SigmoidGroupTopK {
  static constexpr std::string_view name = "sigmoid-group-top-k";
  static constexpr bool fits(ShapeSpec const& s) {
    return s.scoring == Scoring::sigmoid && (s.groups == 1 || s.group_score == GroupScore::sum_top2);
  }
  /// `bias` is the per-expert correction bias (empty = zero).
  static void route(ShapeSpec const& s, std::span<float const> logits, std::span<float const> bias,
                    std::span<int> ids, std::span<float> weights) {
    std::size_t e = logits.size();
    std::vector<float> score(e), selection(e);
    for (std::size_t i = 0; i < e; ++i) {
      score[i] = 1.0f / (1.0f + std::exp(-logits[i]));
      selection[i] = score[i] + (bias.empty() ? 0.0f : bias[i]);
    }
    std::vector<unsigned char> allowed(e, 1);
    if (s.groups > 1) detail::allow_best_groups(s, selection, allowed);
    detail::top_k_indices(selection, allowed, s.top_k, ids);
    for (int j = 0; j < s.top_k; ++j) weights[static_cast<std::size_t>(j)] = score[static_cast<std::size_t>(ids[j])];
    detail::finish_weights(s, weights.first(static_cast<std::size_t>(s.top_k)));
  }
};

static_assert(Policy<SoftmaxTopK> && Policy<GroupLimitedTopK> && Policy<SigmoidGroupTopK>);

/// The router a model's published configuration uses.
template <ModelShape M>
using ForModel = std::conditional_t<M::spec.scoring == Scoring::sigmoid, SigmoidGroupTopK,
                                    std::conditional_t<(M::spec.groups > 1), GroupLimitedTopK, SoftmaxTopK>>;

/// Routes `tokens` tokens whose logits are rows of `logits` (tokens x experts). Checks sizes.
template <Policy R>
void route_all(ShapeSpec const& s, std::span<float const> logits, std::span<float const> bias, int tokens,
               std::span<int> ids, std::span<float> weights) {
  validate(s);
  check(R::fits(s), "router ", R::name, " does not fit this shape's scoring and grouping");
  check(tokens >= 0, "router: negative token count ", tokens);
  auto e = static_cast<std::size_t>(s.experts), k = static_cast<std::size_t>(s.top_k);
  auto t = static_cast<std::size_t>(tokens);
  check(logits.size() >= t * e, "router: logits hold ", logits.size(), " values, need ", t * e);
  check(bias.empty() || bias.size() == e, "router: bias has ", bias.size(), " entries for ", e, " experts");
  check(ids.size() >= t * k && weights.size() >= t * k, "router: outputs too small for ", tokens, " tokens");
  for (std::size_t i = 0; i < t; ++i) {
    R::route(s, logits.subspan(i * e, e), bias, ids.subspan(i * k, k), weights.subspan(i * k, k));
  }
}

}  // namespace moe::router
