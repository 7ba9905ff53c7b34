#pragma once
// The single-process reference forward of one MoE layer: router, routed SwiGLU experts, weighted
// combine, shared experts. Every distributed run (InProcess, MPI, NCCL) and every CUDA kernel is
// checked against it. Straightforward on purpose: one token at a time, experts in top-k order.
//
//   y[t] = sum_j w[t][j] * expert_{e[t][j]}(x[t]) + sum_s shared_s(x[t])

#include <algorithm>
#include <span>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/shape.hpp"
#include "moe/kernels/host.hpp"
#include "moe/core/weights.hpp"
#include "moe/router/router.hpp"

namespace moe {

/// Runs the reference on `tokens` rows of x (tokens x hidden) into y. When `ids`/`route_weights`
/// are non-empty they receive the routes (tokens x top_k).
template <router::Policy Router, class T>
void reference_forward(ShapeSpec const& s, LayerWeights<T> const& w, int tokens, T const* x, T* y,
                       std::span<int> ids = {}, std::span<float> route_weights = {}) {
  validate(s);
  check(tokens >= 0, "reference_forward: negative token count ", tokens);
  check(static_cast<int>(w.experts.size()) == s.experts, "reference_forward: weights hold ", w.experts.size(),
        " experts, the shape has ", s.experts);
  check(static_cast<int>(w.shared.size()) == s.shared_experts, "reference_forward: weights hold ", w.shared.size(),
        " shared experts, the shape has ", s.shared_experts);
  auto h = static_cast<std::size_t>(s.hidden), k = static_cast<std::size_t>(s.top_k);
  std::vector<float> logits(static_cast<std::size_t>(s.experts)), acc(h), out(h);
  std::vector<float> scratch(kernels::host::swiglu_scratch(1, std::max(s.expert_ffn, s.shared_ffn)));
  std::vector<int> e(k);
  std::vector<float> g(k);
  std::span<float const> bias;
  if (w.router_bias) bias = {w.router_bias, static_cast<std::size_t>(s.experts)};
  for (int t = 0; t < tokens; ++t) {
    T const* xt = x + static_cast<std::size_t>(t) * h;
    kernels::host::gate_logits(xt, 1, s.hidden, w.router, s.experts, logits.data());
    router::route_all<Router>(s, logits, bias, 1, e, g);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (std::size_t j = 0; j < k; ++j) {
      auto const& ew = w.experts[static_cast<std::size_t>(e[j])];
      check(ew.present(), "reference_forward: weights of expert ", e[j], " are missing");
      kernels::host::swiglu_expert(xt, 1, s.hidden, s.expert_ffn, ew, out.data(), scratch);
      for (std::size_t i = 0; i < h; ++i) acc[i] += g[j] * out[i];
    }
    for (auto const& sw : w.shared) {
      kernels::host::swiglu_expert(xt, 1, s.hidden, s.shared_ffn, sw, out.data(), scratch);
      for (std::size_t i = 0; i < h; ++i) acc[i] += out[i];
    }
    for (std::size_t i = 0; i < h; ++i) y[static_cast<std::size_t>(t) * h + i] = from_float<T>(acc[i]);
    if (!ids.empty()) std::copy(e.begin(), e.end(), ids.begin() + static_cast<std::ptrdiff_t>(t * k));
    if (!route_weights.empty()) std::copy(g.begin(), g.end(), route_weights.begin() + static_cast<std::ptrdiff_t>(t * k));
  }
}

}  // namespace moe
