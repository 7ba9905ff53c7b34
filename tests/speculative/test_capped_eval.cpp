// Held-out evaluation at an enforced token balance (capped_eval.hpp), checked against the online
// cap (cap_predictions) followed by the plain LAR, and against hand-computed small cases.
#include <catch2/catch.hpp>

#include <vector>

#include "moe/speculative/cocluster.hpp"
#include "moe/profile/route_profile.hpp"
#include "moe/speculative/capped_eval.hpp"
#include "moe/speculative/metrics.hpp"
#include "moe/speculative/shuffle_plan.hpp"

namespace sp = moe::speculative;
namespace pl = moe::placement;
using Source = sp::Prediction::Source;

TEST_CASE("capped evaluation equals cap_predictions + LAR when every token occurs once", "[speculative][capped]") {
  // Seeded synthetic data: N distinct tokens, one occurrence each, top-2 of 8 experts, 4 devices.
  moe::core::Rng rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int E = 8, K = 2, D = 4, N = 40;
    moe::profile::RouteRecorder rec(E, K);
    for (int t = 0; t < N; ++t) {
      int a = static_cast<int>(rng.below(E)), b = static_cast<int>(rng.below(E - 1));
      if (b >= a) ++b;
      std::vector<int> ex{a, b};
      rec.record(t, 0, ex);
    }
    auto prof = rec.profile();
    auto const& lc = prof.layer(0);
    std::vector<int> ranks(E);
    for (int e = 0; e < E; ++e) ranks[static_cast<std::size_t>(e)] = static_cast<int>(rng.below(D));
    pl::Table placement(ranks);
    // Skewed predictions so that the cap moves tokens; a few distinct confidences (ties included).
    std::vector<int> pred(N);
    std::vector<std::int16_t> conf(N);
    for (int t = 0; t < N; ++t) {
      pred[static_cast<std::size_t>(t)] = rng.uniform() < 0.5 ? 0 : static_cast<int>(rng.below(D));
      conf[static_cast<std::size_t>(t)] = static_cast<std::int16_t>(1000 * rng.below(5));
    }
    double factor = trial % 2 ? 1.0 : 1.2;  // capacity 10 or 12 tokens per device
    auto predict = [&](int t) {
      return sp::Prediction{pred[static_cast<std::size_t>(t)], conf[static_cast<std::size_t>(t)], Source::token_table};
    };
    sp::CappedEvalOptions opt;
    opt.capacity_factor = factor;
    opt.fallback = sp::Fallback::modulo;
    auto got = sp::capped_evaluation(lc, placement, K, D, predict, {}, opt);

    auto capped = pred;
    sp::cap_predictions(capped, conf, D, static_cast<std::int32_t>(factor * N / D + 1e-9));
    double ref = sp::local_activation_rate(lc, placement, [&](int t) { return capped[static_cast<std::size_t>(t)]; });
    double ref0 = sp::local_activation_rate(lc, placement, [&](int t) { return pred[static_cast<std::size_t>(t)]; });
    auto bal = sp::token_balance(lc, K, D, [&](int t) { return capped[static_cast<std::size_t>(t)]; });
    REQUIRE(got.lar == Approx(ref).margin(1e-12));
    REQUIRE(got.lar_uncapped == Approx(ref0).margin(1e-12));
    REQUIRE(got.imbalance == Approx(bal.imbalance).margin(1e-12));
    REQUIRE(got.imbalance <= factor - 1 + 1e-12);
    REQUIRE(got.unseen_share == 0);
  }
}

TEST_CASE("capped evaluation: prior fallback and fractional moves, by hand", "[speculative][capped]") {
  // 2 devices, 2 experts (expert 0 on device 0, expert 1 on device 1), top-1.
  // token 0: 6 occurrences, all expert 1, predicted device 0 with confidence 100 (a wrong table);
  // token 1: 2 occurrences, all expert 0, unseen by the table.
  moe::profile::RouteRecorder rec(2, 1);
  std::vector<int> e0{0}, e1{1};
  for (int i = 0; i < 6; ++i) rec.record(0, 0, e1);
  for (int i = 0; i < 2; ++i) rec.record(1, 0, e0);
  auto prof = rec.profile();
  pl::Table placement(std::vector<int>{0, 1});
  auto predict = [](int t) {
    return t == 0 ? sp::Prediction{0, 100, Source::token_table} : sp::Prediction{1, 0, Source::fallback};
  };
  std::vector<double> prior{0.7, 0.3};  // unseen tokens start on device 0
  sp::CappedEvalOptions opt;  // cap 1.1 x 4 = 4.4 occurrences per device
  opt.fallback = sp::Fallback::prior;
  auto r = sp::capped_evaluation(prof.layer(0), placement, 1, 2, predict, prior, opt);
  // Uncapped: all 8 on device 0; local = token 1's 2 activations -> 2/8.
  REQUIRE(r.lar_uncapped == Approx(2.0 / 8));
  REQUIRE(r.imbalance_uncapped == Approx(1.0));
  REQUIRE(r.unseen_share == Approx(2.0 / 8));
  // Cap: device 0 keeps 4.4 of token 0 (more confident), 1.6 of token 0 and all of token 1 move to
  // device 1 (the only one with room): local = 1.6 (token 0 on device 1) + 0 -> 1.6 / 8.
  REQUIRE(r.lar == Approx(1.6 / 8));
  REQUIRE(r.moved_share == Approx(3.6 / 8));
  REQUIRE(r.load[0] == Approx(4.4));
  REQUIRE(r.load[1] == Approx(3.6));
  REQUIRE(r.imbalance == Approx(0.1));
  // Modulo fallback: token 1 stays on the predictor's device 1 (1 mod 2), remote from its expert 0;
  // token 0 is remote on device 0. Uncapped LAR 0. Cap: device 0 holds 6 > 4.4, 1.6 of token 0 move
  // to device 1 (local there): 1.6 / 8; the loads are 4.4 and 3.6.
  opt.fallback = sp::Fallback::modulo;
  auto m = sp::capped_evaluation(prof.layer(0), placement, 1, 2, predict, {}, opt);
  REQUIRE(m.lar == Approx(1.6 / 8));
  REQUIRE(m.lar_uncapped == Approx(0.0).margin(1e-15));
  REQUIRE(m.moved_share == Approx(1.6 / 8));
  REQUIRE(m.load[1] == Approx(3.6));
  // device_prior: share of activations served per device (expert 1: 6 of 8).
  auto pr = sp::device_prior(prof.layer(0), placement, 2);
  REQUIRE(pr[0] == Approx(0.25));
  REQUIRE(pr[1] == Approx(0.75));
}

TEST_CASE("capped evaluation: bad input", "[speculative][capped][errors]") {
  moe::profile::RouteRecorder rec(2, 1);
  std::vector<int> e0{0};
  rec.record(0, 0, e0);
  auto prof = rec.profile();
  pl::Table placement(std::vector<int>{0, 1});
  auto predict = [](int) { return sp::Prediction{0, 0, Source::fallback}; };
  sp::CappedEvalOptions opt;
  opt.capacity_factor = 0.9;
  std::vector<double> prior{0.5, 0.5};
  REQUIRE_THROWS_WITH(sp::capped_evaluation(prof.layer(0), placement, 1, 2, predict, prior, opt),
                      Catch::Contains("capacity_factor must be >= 1"));
  sp::CappedEvalOptions with_prior;
  with_prior.fallback = sp::Fallback::prior;
  REQUIRE_THROWS_WITH(sp::capped_evaluation(prof.layer(0), placement, 1, 2, predict, {}, with_prior),
                      Catch::Contains("needs one prior value per device"));
  REQUIRE_THROWS_WITH(sp::capped_evaluation(prof.layer(0), pl::Table(std::vector<int>{0, 1, 1}), 1, 2, predict, prior),
                      Catch::Contains("placement has 3 experts"));
  auto bad = [](int) { return sp::Prediction{5, 10, Source::token_table}; };
  REQUIRE_THROWS_WITH(sp::capped_evaluation(prof.layer(0), placement, 1, 2, bad, prior),
                      Catch::Contains("outside [0, 2)"));
  moe::profile::LayerCounts empty;
  empty.experts = 2;
  REQUIRE_THROWS_WITH(sp::device_prior(empty, placement, 2), Catch::Contains("empty profile"));
}
