#pragma once
// Shared by the GPU layer tests (test_cuda_layer.cu, test_findep_cuda.cu): seeded tokens, the
// near-tie ("fragile") tokens whose route may legitimately differ between GPU and host, and
// device copies of a layer's weights.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "cuda_test_support.cuh"
#include "moe/core/bf16.hpp"
#include "moe/kernels/host.hpp"
#include "moe/core/weights.hpp"
#include "moe/router/router.hpp"

namespace moe::test {

template <class T>
std::vector<T> random_tokens(int tokens, int hidden, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<T> x(static_cast<std::size_t>(tokens) * static_cast<std::size_t>(hidden));
  for (auto& v : x) v = moe::from_float<T>(d(rng));
  return x;
}

/// Tokens whose route changes under a relative perturbation of `delta` of their logits.
template <class Router, class T>
std::vector<char> fragile_tokens(moe::ShapeSpec const& s, moe::LayerWeights<T> const& w, std::vector<T> const& x,
                                 int tokens, float delta) {
  auto e = static_cast<std::size_t>(s.experts), k = static_cast<std::size_t>(s.top_k);
  std::vector<float> logits(static_cast<std::size_t>(tokens) * e);
  moe::kernels::host::gate_logits(x.data(), tokens, s.hidden, w.router, s.experts, logits.data());
  std::span<float const> bias;
  if (w.router_bias) bias = {w.router_bias, e};
  std::vector<int> ids(static_cast<std::size_t>(tokens) * k), alt(ids.size());
  std::vector<float> gw(ids.size());
  moe::router::route_all<Router>(s, logits, bias, tokens, ids, gw);
  std::vector<char> fragile(static_cast<std::size_t>(tokens), 0);
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int trial = 0; trial < 8; ++trial) {
    std::vector<float> p(logits);
    for (auto& v : p) v += delta * (std::abs(v) + 1e-3f) * u(rng);
    moe::router::route_all<Router>(s, p, bias, tokens, alt, gw);
    for (std::size_t t = 0; t < static_cast<std::size_t>(tokens); ++t)
      for (std::size_t j = 0; j < k; ++j) fragile[t] |= alt[t * k + j] != ids[t * k + j];
  }
  return fragile;
}

/// Device copies of a layer's weights (every expert present).
template <class T>
struct DeviceWeights {
  std::vector<Device<T>> store;
  Device<float> bias;
  std::vector<moe::ExpertWeights<T>> experts, shared;
  T const* router = nullptr;

  DeviceWeights(moe::ShapeSpec const& s, moe::LayerWeights<T> const& w) {
    auto h = static_cast<std::size_t>(s.hidden);
    store.reserve(static_cast<std::size_t>(1 + 3 * (s.experts + s.shared_experts)));
    store.emplace_back(std::vector<T>(w.router, w.router + static_cast<std::size_t>(s.experts) * h));
    router = store.back().get();
    if (w.router_bias) bias = Device<float>(std::vector<float>(w.router_bias, w.router_bias + s.experts));
    auto copy = [&](moe::ExpertWeights<T> const& ew, std::size_t f) {
      moe::ExpertWeights<T> d;
      store.emplace_back(std::vector<T>(ew.gate, ew.gate + f * h));
      d.gate = store.back().get();
      store.emplace_back(std::vector<T>(ew.up, ew.up + f * h));
      d.up = store.back().get();
      store.emplace_back(std::vector<T>(ew.down, ew.down + h * f));
      d.down = store.back().get();
      return d;
    };
    for (auto const& ew : w.experts) experts.push_back(copy(ew, static_cast<std::size_t>(s.expert_ffn)));
    for (auto const& ew : w.shared) shared.push_back(copy(ew, static_cast<std::size_t>(s.shared_ffn)));
  }
  moe::LayerWeights<T> view() const { return {router, bias.get(), experts, shared}; }
};

/// Errors of a layer output against a reference, token by token.
struct TokenErrors {
  double normwise = 0;      ///< max |y - ref| / max |ref| over all tokens
  double worst_stable = 0;  ///< worst per-token relative error among tokens with a stable route
  int fragile = 0;          ///< near-tie tokens (exempt from worst_stable)
  bool finite = true;       ///< false: an output was NaN or infinite (e.g. never written: poisoned)
};

template <class T>
TokenErrors token_errors(std::vector<T> const& got, std::vector<T> const& ref, std::vector<char> const& fragile,
                         int tokens, int hidden) {
  auto h = static_cast<std::size_t>(hidden);
  TokenErrors c;
  double diff = 0, scale = 0;
  for (std::size_t t = 0; t < static_cast<std::size_t>(tokens); ++t) {
    double td = 0, ts = 1e-6;
    for (std::size_t q = 0; q < h; ++q) {
      double g = moe::to_float(got[t * h + q]), r = moe::to_float(ref[t * h + q]);
      if (!std::isfinite(g)) {
        c.finite = false;
        return c;
      }
      td = std::max(td, std::abs(g - r));
      ts = std::max(ts, std::abs(r));
    }
    diff = std::max(diff, td);
    scale = std::max(scale, ts);
    if (fragile[t]) {
      ++c.fragile;
    } else {
      c.worst_stable = std::max(c.worst_stable, td / ts);
    }
  }
  c.normwise = scale > 0 ? diff / scale : diff;
  return c;
}

}  // namespace moe::test
