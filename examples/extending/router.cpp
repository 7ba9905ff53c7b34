// A router policy of one's own: TemperedTopK keeps each token's top_k experts by logit and weights
// them with a softmax over the chosen logits at temperature 0.5 (sharper than the model's own
// router). moe::Layer calls Router::route once per token after the gate GEMM, on every rank for its
// own tokens; Router::fits is checked at compile time against the model's shape. The policy is in
// tempered_top_k.hpp, which device.cu shares (it adds the router's device form).
//
// Checks: route() on hand-made logits gives the expected experts and weights; the layer on 4
// in-process ranks matches moe::reference_forward with the same router; and its output differs
// from the reference with the model's default router (the policy is really used).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <string_view>

#include "check.hpp"
#include "tempered_top_k.hpp"

int main() {
  using namespace extending;
  bool ok = true;

  // route() alone: logits 0.1 * e on 64 experts; the top 8 are experts 63..56, weights
  // proportional to exp(0.1 * e / 0.5) = exp(0.2 * e).
  std::vector<float> logits(static_cast<std::size_t>(shape.experts));
  for (std::size_t e = 0; e < logits.size(); ++e) logits[e] = 0.1f * static_cast<float>(e);
  std::vector<int> ids(static_cast<std::size_t>(shape.top_k));
  std::vector<float> w(ids.size());
  TemperedTopK::route(shape, logits, {}, ids, w);
  double denominator = 0;
  for (int j = 0; j < shape.top_k; ++j) denominator += std::exp(0.2 * (63 - j));
  bool route_ok = true;
  for (int j = 0; j < shape.top_k; ++j)
    route_ok = route_ok && ids[static_cast<std::size_t>(j)] == 63 - j &&
               std::abs(w[static_cast<std::size_t>(j)] - std::exp(0.2 * (63 - j)) / denominator) < 1e-6;
  ok &= expect(route_ok, "route(): experts 63..56 with weights exp(0.2 e) / sum");

  // Through moe::Layer on 4 ranks, experts contiguous (16 per rank), no replicas.
  auto run = run_layer<TemperedTopK, moe::placement::Table, moe::replication::None, moe::schedule::Sequential, 4>(
      moe::placement::Table::contiguous(shape.experts, 4), {}, 16);
  std::printf("layer vs reference_forward<TemperedTopK>: relative error %.2e\n", run.relative_error());
  ok &= expect(run.relative_error() < 1e-5, "layer matches the reference with the same router");

  // The model's own router gives another output: the layer did use TemperedTopK.
  moe::RandomLayerWeights<float> weights(shape, weight_seed);
  std::vector<float> other(run.x.size());
  moe::reference_forward<moe::router::ForModel<Model>>(shape, weights.view(), 4 * 16, run.x.data(), other.data());
  double diff = 0;
  for (std::size_t i = 0; i < other.size(); ++i) diff = std::max(diff, std::abs(double(other[i]) - run.y[i]));
  ok &= expect(diff > 1e-3, "the output differs from the default router's");
  return ok ? 0 : 1;
}
