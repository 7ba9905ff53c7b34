#pragma once
// Weights of one MoE layer as the Layer sees them: non-owning pointers, PyTorch Linear layout
// (out_features x in_features, row-major). On a rank only its own experts need to be present.
//
//   gate, up : expert_ffn x hidden        down : hidden x expert_ffn
//   router   : experts x hidden           router_bias : experts (sigmoid routers only, may be null)

#include <cmath>
#include <random>
#include <span>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/bf16.hpp"
#include "moe/core/shape.hpp"

namespace moe {

template <class T>
struct ExpertWeights {
  T const* gate = nullptr;
  T const* up = nullptr;
  T const* down = nullptr;
  [[nodiscard]] bool present() const { return gate && up && down; }
};

template <class T>
struct LayerWeights {
  T const* router = nullptr;
  float const* router_bias = nullptr;
  std::span<ExpertWeights<T> const> experts;  ///< one entry per routed expert (absent ones null)
  std::span<ExpertWeights<T> const> shared;   ///< one entry per shared expert
};

namespace detail {
/// Makes `w.shared` point into `store`, a copy of the caller's list: for device layers that copy
/// the routed experts' pointers into tables at construction but read the shared experts' list on
/// every forward pass (the caller's list may be a temporary).
template <class T>
void keep_shared_list(LayerWeights<T>& w, std::vector<ExpertWeights<T>>& store) {
  store.assign(w.shared.begin(), w.shared.end());
  w.shared = store;
}
}  // namespace detail

/// Owning storage for a whole layer's weights, filled with seeded random values. Used by tests,
/// benchmarks and the demo (synthetic weights: the library never needs real checkpoints to test).
template <class T>
class RandomLayerWeights {
public:
  RandomLayerWeights(ShapeSpec const& s, std::uint64_t seed) {
    validate(s);
    std::mt19937_64 rng(seed);
    auto h = static_cast<std::size_t>(s.hidden), f = static_cast<std::size_t>(s.expert_ffn);
    auto sf = static_cast<std::size_t>(s.shared_ffn);
    // Scales keep activations O(1) through the SwiGLU: ~1/sqrt(fan_in).
    router_ = fill(static_cast<std::size_t>(s.experts) * h, 1.0f / std::sqrt(float(h)), rng);
    if (s.scoring == Scoring::sigmoid) {
      std::uniform_real_distribution<float> b(-0.05f, 0.05f);
      bias_.resize(static_cast<std::size_t>(s.experts));
      for (auto& v : bias_) v = b(rng);
    }
    for (int e = 0; e < s.experts; ++e) {
      storage_.push_back(fill(f * h, 1.0f / std::sqrt(float(h)), rng));
      storage_.push_back(fill(f * h, 1.0f / std::sqrt(float(h)), rng));
      storage_.push_back(fill(h * f, 1.0f / std::sqrt(float(f)), rng));
    }
    for (int e = 0; e < s.shared_experts; ++e) {
      storage_.push_back(fill(sf * h, 1.0f / std::sqrt(float(h)), rng));
      storage_.push_back(fill(sf * h, 1.0f / std::sqrt(float(h)), rng));
      storage_.push_back(fill(h * sf, 1.0f / std::sqrt(float(sf)), rng));
    }
    std::size_t i = 0;
    for (int e = 0; e < s.experts; ++e, i += 3)
      experts_.push_back({storage_[i].data(), storage_[i + 1].data(), storage_[i + 2].data()});
    for (int e = 0; e < s.shared_experts; ++e, i += 3)
      shared_.push_back({storage_[i].data(), storage_[i + 1].data(), storage_[i + 2].data()});
  }

  [[nodiscard]] LayerWeights<T> view() const {
    return {router_.data(), bias_.empty() ? nullptr : bias_.data(), experts_, shared_};
  }
  /// The weights a rank holds: only the experts `keep(e)` says it owns are present.
  template <class Keep>
  [[nodiscard]] std::vector<ExpertWeights<T>> experts_where(Keep keep) const {
    std::vector<ExpertWeights<T>> out(experts_.size());
    for (std::size_t e = 0; e < experts_.size(); ++e)
      if (keep(static_cast<int>(e))) out[e] = experts_[e];
    return out;
  }

private:
  static std::vector<T> fill(std::size_t n, float scale, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> d(-scale, scale);
    std::vector<T> v(n);
    for (auto& x : v) x = from_float<T>(d(rng));
    return v;
  }

  std::vector<T> router_;
  std::vector<float> bias_;
  std::vector<std::vector<T>> storage_;
  std::vector<ExpertWeights<T>> experts_;
  std::vector<ExpertWeights<T>> shared_;
};

}  // namespace moe
