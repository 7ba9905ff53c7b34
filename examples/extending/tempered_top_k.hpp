#pragma once
// TemperedTopK, the router of examples/extending/router.cpp, in a header of its own so that the host
// program and the device program (device.cu, which adds its device form) route with the same code.
// It keeps each token's top_k experts by logit (ties to the lower index, experts in order of
// decreasing logit) and weights them with a softmax over the chosen logits at temperature 0.5.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <string_view>
#include <vector>

#include "moe/moe.hpp"

struct TemperedTopK {
  static constexpr std::string_view name = "tempered-top-k";
  static constexpr float temperature = 0.5f;

  /// Softmax-scored, ungrouped shapes only (a grouped or sigmoid model fails to compile).
  static constexpr bool fits(moe::ShapeSpec const& s) { return s.scoring == moe::Scoring::softmax && s.groups == 1; }

  /// One token: `logits` has one entry per expert (`bias` is the model's correction bias, unused
  /// here); writes top_k expert ids and their weights.
  static void route(moe::ShapeSpec const& s, std::span<float const> logits, std::span<float const> /*bias*/,
                    std::span<int> ids, std::span<float> weights) {
    std::vector<int> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    auto k = static_cast<std::size_t>(s.top_k);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), [&](int a, int b) {
      return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)] ||
             (logits[static_cast<std::size_t>(a)] == logits[static_cast<std::size_t>(b)] && a < b);
    });
    float top = logits[static_cast<std::size_t>(order[0])], sum = 0;
    for (std::size_t j = 0; j < k; ++j) {
      ids[j] = order[j];
      weights[j] = std::exp((logits[static_cast<std::size_t>(order[j])] - top) / temperature);
      sum += weights[j];
    }
    for (std::size_t j = 0; j < k; ++j) weights[j] = weights[j] / sum * s.routed_scale;
  }
};
static_assert(moe::router::Policy<TemperedTopK>);
