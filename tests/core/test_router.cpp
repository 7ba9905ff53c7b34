// Router policies against hand-computed examples (textbook softmax/sigmoid written out here),
// including ties and group limits.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "moe/router/router.hpp"

using namespace moe;

namespace {
struct Routed {
  std::vector<int> ids;
  std::vector<float> w;
};
template <class R>
Routed route(ShapeSpec const& s, std::vector<float> logits, std::vector<float> bias = {}) {
  Routed r{std::vector<int>(static_cast<std::size_t>(s.top_k)), std::vector<float>(static_cast<std::size_t>(s.top_k))};
  router::route_all<R>(s, logits, bias, 1, r.ids, r.w);
  return r;
}
double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace

TEST_CASE("softmax top-2 with renormalisation (Mixtral)", "[router]") {
  ShapeSpec s{.hidden = 1, .expert_ffn = 1, .experts = 4, .top_k = 2, .renormalize = true};
  auto r = route<router::SoftmaxTopK>(s, {1, 3, 2, 0});
  CHECK(r.ids == std::vector<int>{1, 2});
  // Renormalised over the two chosen: e^3 / (e^3 + e^2) = 1 / (1 + e^-1).
  CHECK(r.w[0] == Approx(1.0 / (1.0 + std::exp(-1.0))).epsilon(1e-6));
  CHECK(r.w[1] == Approx(1.0 / (1.0 + std::exp(1.0))).epsilon(1e-6));
}

TEST_CASE("softmax top-k without renormalisation keeps the probabilities (OLMoE)", "[router]") {
  ShapeSpec s{.hidden = 1, .expert_ffn = 1, .experts = 4, .top_k = 2};
  auto r = route<router::SoftmaxTopK>(s, {2, 2, 1, 2});
  // Three-way tie at 2: the lower indices win.
  CHECK(r.ids == std::vector<int>{0, 1});
  double z = 3 * std::exp(2.0) + std::exp(1.0);
  CHECK(r.w[0] == Approx(std::exp(2.0) / z).epsilon(1e-6));
  CHECK(r.w[1] == Approx(std::exp(2.0) / z).epsilon(1e-6));
}

TEST_CASE("group-limited top-k picks experts only from the best groups (DeepSeek-V2)", "[router]") {
  // 8 experts in 4 groups of 2; a token may use 2 groups; top-3; routed scale 2.
  ShapeSpec s{.hidden = 1, .expert_ffn = 1, .experts = 8, .top_k = 3, .groups = 4, .groups_per_token = 2,
              .group_score = GroupScore::max, .routed_scale = 2.0f};
  std::vector<float> logits{5.0f, 0.0f, 4.0f, 3.9f, 4.5f, 0.0f, 0.0f, 0.0f};
  auto r = route<router::GroupLimitedTopK>(s, logits);
  // Group maxima 5.0, 4.0, 4.5, 0.0 -> groups 0 and 2 -> experts {0,1,4,5}. Expert 2 (4.0) would win
  // without the limit; 1 and 5 tie at 0.0 and the lower index wins.
  CHECK(r.ids == std::vector<int>{0, 4, 1});
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  CHECK(r.w[0] == Approx(2.0 * std::exp(5.0) / z).epsilon(1e-6));
  CHECK(r.w[1] == Approx(2.0 * std::exp(4.5) / z).epsilon(1e-6));
  CHECK(r.w[2] == Approx(2.0 * std::exp(0.0) / z).epsilon(1e-6));
}

TEST_CASE("sigmoid + bias + group limit + renormalisation + scaling (DeepSeek-V3)", "[router]") {
  // 8 experts in 4 groups of 2; 2 groups per token; top-2; renormalised; routed scale 2.5.
  ShapeSpec s{.hidden = 1, .expert_ffn = 1, .experts = 8, .top_k = 2, .groups = 4, .groups_per_token = 2,
              .scoring = Scoring::sigmoid, .group_score = GroupScore::sum_top2, .renormalize = true,
              .routed_scale = 2.5f};
  std::vector<float> logits{0.5f, 0.5f, 2.0f, -2.0f, 1.0f, 0.8f, -1.0f, 3.0f};

  SECTION("the bias only steers selection") {
    // Group scores (sum of both members): g0 1.245, g1 1.000, g2 1.421, g3 0.269 + (0.953 - 2) < 0.
    std::vector<float> bias{0, 0, 0, 0, 0, 0, 0, -2.0f};
    auto r = route<router::SigmoidGroupTopK>(s, logits, bias);
    CHECK(r.ids == std::vector<int>{4, 5});  // expert 2 (0.881) is outside groups 2 and 0
    double a = sig(1.0), b = sig(0.8);
    CHECK(r.w[0] == Approx(2.5 * a / (a + b)).epsilon(1e-6));
    CHECK(r.w[1] == Approx(2.5 * b / (a + b)).epsilon(1e-6));
  }
  SECTION("a positive bias pulls an expert and its group in, weights stay unbiased") {
    std::vector<float> bias{0, 0, 0, 1.0f, 0, 0, 0, -2.0f};
    auto r = route<router::SigmoidGroupTopK>(s, logits, bias);
    // Expert 3: selection sig(-2) + 1 = 1.119 > expert 2's 0.881; group 1 scores 2.0.
    CHECK(r.ids == std::vector<int>{3, 2});
    double a = sig(-2.0), b = sig(2.0);
    CHECK(r.w[0] == Approx(2.5 * a / (a + b)).epsilon(1e-6));
    CHECK(r.w[1] == Approx(2.5 * b / (a + b)).epsilon(1e-6));
  }
  SECTION("equal groups tie towards the lower group index") {
    std::vector<float> flat(8, 0.0f);
    auto r = route<router::SigmoidGroupTopK>(s, flat);
    CHECK(r.ids == std::vector<int>{0, 1});
    CHECK(r.w[0] == Approx(1.25).epsilon(1e-6));
  }
}

TEST_CASE("routers reject what does not fit", "[router][errors]") {
  ShapeSpec s{.hidden = 1, .expert_ffn = 1, .experts = 4, .top_k = 5};
  std::vector<int> ids(5);
  std::vector<float> w(5), logits(4);
  CHECK_THROWS_WITH(router::route_all<router::SoftmaxTopK>(s, logits, {}, 1, ids, w), Catch::Contains("top-k (5)"));
  ShapeSpec sig_shape{.hidden = 1, .expert_ffn = 1, .experts = 4, .top_k = 2, .scoring = Scoring::sigmoid};
  CHECK_THROWS_WITH(router::route_all<router::SoftmaxTopK>(sig_shape, logits, {}, 1, ids, w),
                    Catch::Contains("does not fit"));
  ShapeSpec ok{.hidden = 1, .expert_ffn = 1, .experts = 4, .top_k = 2};
  CHECK_THROWS_WITH(router::route_all<router::SoftmaxTopK>(ok, logits, {}, 2, ids, w), Catch::Contains("logits hold"));
  std::vector<float> short_bias(3);
  CHECK_THROWS_WITH(router::route_all<router::SoftmaxTopK>(ok, logits, short_bias, 1, ids, w),
                    Catch::Contains("bias has 3 entries"));
}

#include "moe/models/models.hpp"
TEST_CASE("ForModel picks each model's published router", "[router]") {
  STATIC_REQUIRE(std::is_same_v<router::ForModel<models::Mixtral8x7B>, router::SoftmaxTopK>);
  STATIC_REQUIRE(std::is_same_v<router::ForModel<models::OLMoE_1B_7B>, router::SoftmaxTopK>);
  STATIC_REQUIRE(std::is_same_v<router::ForModel<models::DeepSeekV2>, router::GroupLimitedTopK>);
  STATIC_REQUIRE(std::is_same_v<router::ForModel<models::DeepSeekV3>, router::SigmoidGroupTopK>);
  STATIC_REQUIRE(std::is_same_v<router::ForModel<models::KimiK2>, router::SigmoidGroupTopK>);
}
