#pragma once
// A textbook fp64 forward pass of one MoE layer, written from the model definitions and sharing no
// code with moe/kernels/host.hpp, moe/router/router.hpp or moe/layer/reference.hpp: it only reads
// the weights (PyTorch Linear layout, see moe/core/weights.hpp) and the shape's routing fields.
// The host reference, moe::Layer, the FinDEP executors and the MPI runs are all checked against it,
// so a mistake in the shared host kernels (a gate/up swap, a wrong rounding) can no longer pass
// because every side makes it.
//
//   logits   = R x                                     (R: experts x hidden)
//   scores   = softmax(logits) | sigmoid(logits)
//   choose   = scores (+ bias for sigmoid routers), restricted to the best groups_per_token groups
//              (a group scores its best value, or the sum of its two best), then the top_k largest;
//              ties go to the lower index
//   weights  = scores of the chosen experts, renormalised if the model does, times routed_scale
//   expert_e(x) = Down_e( silu(Gate_e x) * (Up_e x) ),  silu(v) = v / (1 + e^-v)
//   y        = sum_j weights_j expert_{id_j}(x) + sum_s shared_s(x)

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "moe/core/bf16.hpp"
#include "moe/core/shape.hpp"
#include "moe/core/weights.hpp"

namespace moe::test::textbook {

template <class T>
double value(T v) {
  return static_cast<double>(to_float(v));
}

/// y = W v for W (rows x cols, row-major).
template <class T>
std::vector<double> matvec(T const* W, int rows, int cols, std::vector<double> const& v) {
  std::vector<double> y(static_cast<std::size_t>(rows), 0.0);
  for (int r = 0; r < rows; ++r) {
    double s = 0.0;
    for (int c = 0; c < cols; ++c) s += value(W[static_cast<std::size_t>(r) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c)]) * v[static_cast<std::size_t>(c)];
    y[static_cast<std::size_t>(r)] = s;
  }
  return y;
}

/// Down( silu(Gate x) * (Up x) ) for one expert of intermediate width `ffn`.
template <class T>
std::vector<double> expert(ExpertWeights<T> const& w, int hidden, int ffn, std::vector<double> const& x) {
  std::vector<double> a = matvec(w.gate, ffn, hidden, x);
  std::vector<double> b = matvec(w.up, ffn, hidden, x);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
  return matvec(w.down, hidden, ffn, a);
}

/// Indices sorted by decreasing value, equal values by increasing index.
inline std::vector<int> ranked(std::vector<double> const& v) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[static_cast<std::size_t>(a)] > v[static_cast<std::size_t>(b)]; });
  return idx;
}

struct Route {
  std::vector<int> ids;        ///< top_k experts, in order of decreasing selection score
  std::vector<double> weight;  ///< their combine weights
};

/// Routes one token from its logits.
inline Route route(ShapeSpec const& s, std::vector<double> const& logits, float const* bias) {
  std::size_t E = logits.size();
  std::vector<double> score(E), choose(E);
  if (s.scoring == Scoring::softmax) {
    double m = *std::max_element(logits.begin(), logits.end()), z = 0.0;
    for (std::size_t e = 0; e < E; ++e) z += std::exp(logits[e] - m);
    for (std::size_t e = 0; e < E; ++e) score[e] = std::exp(logits[e] - m) / z;
  } else {
    for (std::size_t e = 0; e < E; ++e) score[e] = 1.0 / (1.0 + std::exp(-logits[e]));
  }
  for (std::size_t e = 0; e < E; ++e)
    choose[e] = score[e] + (s.scoring == Scoring::sigmoid && bias ? static_cast<double>(bias[e]) : 0.0);
  if (s.groups > 1) {
    std::size_t per = E / static_cast<std::size_t>(s.groups);
    std::vector<double> group(static_cast<std::size_t>(s.groups));
    for (std::size_t g = 0; g < group.size(); ++g) {
      std::vector<double> members(choose.begin() + static_cast<std::ptrdiff_t>(g * per),
                                  choose.begin() + static_cast<std::ptrdiff_t>((g + 1) * per));
      std::sort(members.rbegin(), members.rend());  // descending
      group[g] = s.group_score == GroupScore::sum_top2 ? members[0] + members[1] : members[0];
    }
    std::vector<int> best = ranked(group);
    std::vector<bool> keep(E, false);
    for (int j = 0; j < s.groups_per_token; ++j)
      for (std::size_t i = 0; i < per; ++i) keep[static_cast<std::size_t>(best[static_cast<std::size_t>(j)]) * per + i] = true;
    for (std::size_t e = 0; e < E; ++e)
      if (!keep[e]) choose[e] = -INFINITY;
  }
  std::vector<int> order = ranked(choose);
  Route r;
  r.ids.assign(order.begin(), order.begin() + s.top_k);
  for (int e : r.ids) r.weight.push_back(score[static_cast<std::size_t>(e)]);
  if (s.renormalize) {
    double sum = std::accumulate(r.weight.begin(), r.weight.end(), 0.0);
    for (double& w : r.weight) w /= sum;
  }
  for (double& w : r.weight) w *= static_cast<double>(s.routed_scale);
  return r;
}

/// The layer's output for `tokens` rows of x (tokens x hidden), in fp64; routes into `routes`
/// when given.
template <class T>
std::vector<double> forward(ShapeSpec const& s, LayerWeights<T> const& w, int tokens, T const* x,
                            std::vector<Route>* routes = nullptr) {
  auto h = static_cast<std::size_t>(s.hidden);
  std::vector<double> y(static_cast<std::size_t>(tokens) * h, 0.0);
  for (int t = 0; t < tokens; ++t) {
    std::vector<double> xt(h);
    for (std::size_t i = 0; i < h; ++i) xt[i] = value(x[static_cast<std::size_t>(t) * h + i]);
    Route r = route(s, matvec(w.router, s.experts, s.hidden, xt), w.router_bias);
    double* yt = y.data() + static_cast<std::size_t>(t) * h;
    for (std::size_t j = 0; j < r.ids.size(); ++j) {
      auto out = expert(w.experts[static_cast<std::size_t>(r.ids[j])], s.hidden, s.expert_ffn, xt);
      for (std::size_t i = 0; i < h; ++i) yt[i] += r.weight[j] * out[i];
    }
    for (auto const& sw : w.shared) {
      auto out = expert(sw, s.hidden, s.shared_ffn, xt);
      for (std::size_t i = 0; i < h; ++i) yt[i] += out[i];
    }
    if (routes) routes->push_back(std::move(r));
  }
  return y;
}

/// max |a - b| / max |b| (normwise relative error) of a layer output against the textbook one.
template <class T>
double relative_error(T const* a, double const* b, std::size_t n) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(value(a[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

/// Tolerances against the textbook: fp32 storage differs only by float rounding in the sums;
/// bf16 storage also rounds the SwiGLU intermediate and the output to 8 significant bits.
inline constexpr double fp32_tolerance = 1e-4;
inline constexpr double bf16_tolerance = 2e-2;

}  // namespace moe::test::textbook
