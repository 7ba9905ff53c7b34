// The textbook fp64 reference (tests/support/textbook.hpp) against values worked out by hand on a
// two-wide layer, for the three router rules; then moe::reference_forward (the host kernels)
// against the textbook on every shape the layer tests use. The hand values below come from the
// formulas in the comments (silu(v) = v / (1 + e^-v)).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "moe/layer/reference.hpp"
#include "moe/models/models.hpp"
#include "moe/router/router.hpp"
#include "../support/textbook.hpp"

using namespace moe;
namespace tb = moe::test::textbook;

namespace {
// hidden = 2, expert_ffn = 1 (gate, up: 1 x 2; down: 2 x 1), four experts, x = [1, 2].
// Router rows give logits [1, 2, 3, -1].
struct Tiny {
  std::vector<float> x{1, 2};
  std::vector<float> router{1, 0, 0, 1, 1, 1, -1, 0};
  // expert: gate, up, down
  std::vector<std::vector<float>> w{
      {1, 0}, {1, 1}, {1, 2},    // e0: a = 1, b = 3, out = silu(1) * 3 * [1, 2]
      {1, 0}, {0, 1}, {1, -1},   // e1: a = 1, b = 2, out = silu(1) * 2 * [1, -1]
      {0, 1}, {1, 0}, {2, 0},    // e2: a = 2, b = 1, out = silu(2) * [2, 0]
      {1, 1}, {-1, 0}, {0, 1},   // e3: a = 3, b = -1, out = -silu(3) * [0, 1]
      {0, 1}, {0, 1}, {1, 1}};   // shared: a = 2, b = 2, out = silu(2) * 2 * [1, 1]
  std::vector<float> bias{0.5f, 0.0f, 0.0f, -0.9f};
  std::vector<ExpertWeights<float>> experts, shared;
  Tiny() {
    for (int e = 0; e < 4; ++e) experts.push_back({w[3 * e].data(), w[3 * e + 1].data(), w[3 * e + 2].data()});
    shared.push_back({w[12].data(), w[13].data(), w[14].data()});
  }
  LayerWeights<float> view(bool with_shared, bool with_bias) const {
    return {router.data(), with_bias ? bias.data() : nullptr, experts,
            with_shared ? std::span<ExpertWeights<float> const>(shared) : std::span<ExpertWeights<float> const>{}};
  }
};

ShapeSpec tiny_shape() {
  ShapeSpec s;
  s.hidden = 2;
  s.expert_ffn = 1;
  s.experts = 4;
  s.top_k = 2;
  s.dtype = DType::f32;
  return s;
}

template <class Router>
std::vector<float> library(ShapeSpec const& s, LayerWeights<float> const& w, std::vector<float> const& x) {
  std::vector<float> y(2);
  reference_forward<Router>(s, w, 1, x.data(), y.data());
  return y;
}
}  // namespace

TEST_CASE("textbook reference: softmax top-k on a hand-worked layer", "[textbook]") {
  // p = softmax([1, 2, 3, -1]); top 2 = e2 (p2 = e^3 / z), e1 (p1 = e^2 / z); no renormalisation.
  // y = p2 * silu(2) * [2, 0] + p1 * silu(1) * 2 * [1, -1]
  Tiny t;
  ShapeSpec s = tiny_shape();
  std::vector<tb::Route> routes;
  auto y = tb::forward(s, t.view(false, false), 1, t.x.data(), &routes);
  REQUIRE(routes[0].ids == std::vector<int>{2, 1});
  CHECK(routes[0].weight[0] == Approx(0.6572330228318555).epsilon(1e-14));
  CHECK(routes[0].weight[1] == Approx(0.2417825171588008).epsilon(1e-14));
  CHECK(y[0] == Approx(2.6690700709068715).epsilon(1e-14));
  CHECK(y[1] == Approx(-0.35351436666339536).epsilon(1e-14));
  auto lib = library<router::SoftmaxTopK>(s, t.view(false, false), t.x);
  CHECK(tb::relative_error(lib.data(), y.data(), 2) < 1e-6);
}

TEST_CASE("textbook reference: sigmoid scores, bias, sum-of-two groups, renormalised and scaled, shared expert",
          "[textbook]") {
  // scores s = sigmoid([1, 2, 3, -1]); selection = s + bias [0.5, 0, 0, -0.9] = [1.231, 0.881, 0.953, -0.631];
  // groups {0,1} = 2.112 beat {2,3} = 0.322, so top 2 = e0, e1 (although s2 is the largest score);
  // weights = 2.5 * [s0, s1] / (s0 + s1); plus the shared expert silu(2) * 2 * [1, 1].
  Tiny t;
  ShapeSpec s = tiny_shape();
  s.scoring = Scoring::sigmoid;
  s.groups = 2;
  s.groups_per_token = 1;
  s.group_score = GroupScore::sum_top2;
  s.renormalize = true;
  s.routed_scale = 2.5f;
  s.shared_experts = 1;
  s.shared_ffn = 1;
  std::vector<tb::Route> routes;
  auto y = tb::forward(s, t.view(true, true), 1, t.x.data(), &routes);
  REQUIRE(routes[0].ids == std::vector<int>{0, 1});
  CHECK(routes[0].weight[0] == Approx(1.1338772420982481).epsilon(1e-14));
  CHECK(routes[0].weight[1] == Approx(1.3661227579017519).epsilon(1e-14));
  CHECK(y[0] == Approx(8.00741189001081).epsilon(1e-14));
  CHECK(y[1] == Approx(6.4993408983555465).epsilon(1e-14));
  auto lib = library<router::SigmoidGroupTopK>(s, t.view(true, true), t.x);
  CHECK(tb::relative_error(lib.data(), y.data(), 2) < 1e-6);
}

TEST_CASE("textbook reference: group-limited softmax (a group scores its best expert), renormalised", "[textbook]") {
  // p = softmax([1, 2, 3, -1]); groups {0,1} (best p1) and {2,3} (best p2): {2,3} wins;
  // top 2 = e2, e3 with weights [p2, p3] / (p2 + p3); y = w2 * silu(2) * [2, 0] - w3 * silu(3) * [0, 1].
  Tiny t;
  ShapeSpec s = tiny_shape();
  s.groups = 2;
  s.groups_per_token = 1;
  s.group_score = GroupScore::max;
  s.renormalize = true;
  std::vector<tb::Route> routes;
  auto y = tb::forward(s, t.view(false, false), 1, t.x.data(), &routes);
  REQUIRE(routes[0].ids == std::vector<int>{2, 3});
  CHECK(routes[0].weight[0] == Approx(0.9820137900379085).epsilon(1e-14));
  CHECK(routes[0].weight[1] == Approx(0.017986209962091562).epsilon(1e-14));
  CHECK(y[0] == Approx(3.4598195071975018).epsilon(1e-14));
  CHECK(y[1] == Approx(-0.05139959474845296).epsilon(1e-14));
  auto lib = library<router::GroupLimitedTopK>(s, t.view(false, false), t.x);
  CHECK(tb::relative_error(lib.data(), y.data(), 2) < 1e-6);
}

namespace {
template <class Model>
double library_vs_textbook(int tokens, std::uint64_t seed) {
  using T = std::conditional_t<Model::spec.dtype == DType::f32, float, bf16>;
  constexpr ShapeSpec s = Model::spec;
  RandomLayerWeights<T> w(s, seed);
  std::mt19937_64 rng(seed + 7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<T> x(static_cast<std::size_t>(tokens) * s.hidden), y(x.size());
  for (auto& v : x) v = from_float<T>(d(rng));
  reference_forward<router::ForModel<Model>>(s, w.view(), tokens, x.data(), y.data());
  auto want = tb::forward(s, w.view(), tokens, x.data());
  return tb::relative_error(y.data(), want.data(), y.size());
}
}  // namespace

TEST_CASE("the host reference agrees with the textbook on every model shape, in fp32 and bf16", "[textbook]") {
  CHECK(library_vs_textbook<models::Reduced<models::Mixtral8x7B, 64, 96, DType::f32>>(24, 1) < tb::fp32_tolerance);
  CHECK(library_vs_textbook<models::Reduced<models::DeepSeekV3, 64, 32, DType::f32>>(24, 2) < tb::fp32_tolerance);
  CHECK(library_vs_textbook<models::Reduced<models::DeepSeekV2, 64, 32, DType::f32>>(24, 3) < tb::fp32_tolerance);
  CHECK(library_vs_textbook<models::Reduced<models::OLMoE_1B_7B, 64, 32, DType::f32>>(24, 4) < tb::fp32_tolerance);
  CHECK(library_vs_textbook<models::Reduced<models::DeepSeekV3, 64, 32, DType::bf16>>(24, 5) < tb::bf16_tolerance);
}
