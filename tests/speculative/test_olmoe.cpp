// The OLMoE experiment on real routing data (layer 0): fit on arxiv + book, evaluate on github.
// The data is loaded once for the whole program.
#include <catch2/catch.hpp>

#include <vector>

#include "moe/speculative/cocluster.hpp"
#include "moe/speculative/cocluster_metis.hpp"
#include "moe/profile/olmoe_tokens.hpp"
#include "moe/profile/route_split.hpp"
#include "moe/speculative/capped_eval.hpp"
#include "moe/speculative/metrics.hpp"
#include "moe/speculative/predictor.hpp"

namespace ol = moe::profile::olmoe;
namespace pl = moe::placement;
namespace sp = moe::speculative;

namespace {
struct Data {
  moe::profile::RouteProfile fit, held;
  moe::speculative::CoclusterProblem problem;
};
Data const& data() {
  static Data d = [] {
    Data x;
    ol::LoadOptions o;
    o.only_layer = 0;
    x.fit = ol::load(MOE_SHARED_DATA_DIR, {"arxiv", "book"}, o);
    x.held = ol::load(MOE_SHARED_DATA_DIR, {"github"}, o);
    x.problem = moe::speculative::CoclusterProblem::from_counts(x.fit.layer(0), ol::top_k, 8);
    return x;
  }();
  return d;
}
double held_out_lar(moe::speculative::CoclusterResult const& r) {
  auto table = sp::TokenDeviceTable::from_cocluster(data().problem, r, ol::vocab);
  sp::Predictor pred(table);
  return sp::local_activation_rate(data().held.layer(0), r.experts, [&](int t) { return pred.predict(t).device; });
}
// Held-out LAR at the enforced balance (capacity 1.1 x mean per device, predictor default for unseen
// tokens), the same rule for every method.
sp::CappedEval held_out_capped(moe::speculative::CoclusterResult const& r) {
  auto table = sp::TokenDeviceTable::from_cocluster(data().problem, r, ol::vocab);
  sp::Predictor pred(table);
  return sp::capped_evaluation(data().held.layer(0), r.experts, ol::top_k, 8, [&](int t) { return pred.predict(t); });
}
moe::speculative::CrossEntropyOptions quick() {
  moe::speculative::CrossEntropyOptions o;  // fewer rounds than the example program to keep the test short
  o.iterations = 6;
  o.samples = 8;
  return o;
}
}  // namespace

TEST_CASE("OLMoE: contiguous placement without shuffling is 1/8 local", "[speculative][olmoe]") {
  auto c = pl::Table::contiguous(64, 8);
  std::vector<double> eq(8, 1.0 / 8);
  REQUIRE(sp::local_activation_rate_unshuffled(data().held.layer(0), c, eq) == Approx(0.125));
  // s-TS alone (token table over the contiguous placement) is better than 1/8 on held-out data.
  auto r = moe::speculative::assign_tokens_to(data().problem, c, 1.1);
  REQUIRE(r.local_rate > 0.125);
  REQUIRE(held_out_lar(r) > 0.125);
}

TEST_CASE("OLMoE: the 8-device co-clustering problem and its errors", "[speculative][olmoe][errors]") {
  auto const& lc = data().fit.layer(0);
  REQUIRE_THROWS_WITH(moe::speculative::CoclusterProblem::from_counts(lc, ol::top_k, 128),
                      Catch::Contains("more devices (128) than experts (64)"));
  REQUIRE(data().problem.total_frequency() == Approx(2 * 208896.0));
}

TEST_CASE("OLMoE: cross-entropy beats two-stage balanced k-means at the same balance cap", "[speculative][olmoe]") {
  auto ce = moe::speculative::solve_cross_entropy(data().problem, quick());
  auto km = moe::speculative::balanced_kmeans(data().problem);
  REQUIRE(ce.imbalance <= 0.1 + 1e-9);
  REQUIRE(km.imbalance <= 0.1 + 1e-9);
  REQUIRE(ce.local_rate > km.local_rate);
  REQUIRE(held_out_lar(ce) > held_out_lar(km));
}

#if MOE_HAS_METIS && defined(MOE_WITH_METIS)
TEST_CASE("OLMoE: cross-entropy beats METIS on the FITTED data's LAR at equal or better balance",
          "[speculative][olmoe][metis]") {
  // In-sample only: on the held-out domain the two are within seed noise (docs/results/cocluster-olmoe.md),
  // so no held-out ordering between them is asserted.
  auto ce = moe::speculative::solve_cross_entropy(data().problem, quick());
  auto me = moe::speculative::solve_metis(data().problem);
  REQUIRE(ce.imbalance <= me.imbalance + 1e-9);
  REQUIRE(ce.local_rate > me.local_rate);
}

TEST_CASE("OLMoE held-out domain at an enforced balance: co-clustering beats contiguous s-TS",
          "[speculative][olmoe][metis][capped]") {
  auto contiguous = held_out_capped(moe::speculative::assign_tokens_to(data().problem, pl::Table::contiguous(64, 8), 1.1));
  auto ce = held_out_capped(moe::speculative::solve_cross_entropy(data().problem, quick()));
  auto me = held_out_capped(moe::speculative::solve_metis(data().problem));
  // Reference for the unseen share, counted straight from the two profiles: activations of held-out
  // tokens that the fitted layer never saw, over all held-out activations (the data gives 1 - 0.679).
  auto const& fit = data().fit.layer(0);
  auto const& held = data().held.layer(0);
  double unseen = 0, all = 0;
  for (std::size_t i = 0; i < held.rows(); ++i) {
    auto act = static_cast<double>(held.row_total(i));
    all += act;
    if (fit.find(held.tokens[i]) < 0) unseen += act;
  }
  REQUIRE(all > 0);
  for (auto const* r : {&contiguous, &ce, &me}) {
    REQUIRE(r->imbalance <= 0.1 + 1e-9);     // the cap holds for every method
    REQUIRE(r->imbalance_uncapped > 0.2);    // and is needed: fitted tables do not keep their balance
    REQUIRE(r->unseen_share == Approx(unseen / all).margin(1e-12));
  }
  CAPTURE(contiguous.lar, ce.lar, me.lar);
  // Measured here: contiguous 0.151, METIS 0.173, the shortened cross-entropy run (6 x 8) 0.158; the
  // full run (30 x 16) reaches 0.165-0.176 over seeds 1-3.
  REQUIRE(ce.lar > contiguous.lar);
  REQUIRE(me.lar > contiguous.lar + 0.01);
}

TEST_CASE("OLMoE same domains, held-out 80 % split, enforced balance: cross-entropy beats METIS",
          "[speculative][olmoe][metis][capped]") {
  // Fit on a seeded 20 % of arxiv + book + github occurrences (layer 0), evaluate on the other 80 %
  // at the enforced 1.1 cap. Measured with the full solver (30 x 16) at layers 0 / 7 / 15 and seeds
  // 1-3: +4.5 % to +12.2 % LAR over METIS in all 9 cells; with this short run (6 x 8) at layer 0,
  // seeds 1-3: +8.0 / +3.0 / +5.2 %. (Across domains the order is not robust: not asserted.)
  ol::LoadOptions o;
  o.only_layer = 0;
  auto parts = moe::profile::split_profile(ol::load(MOE_SHARED_DATA_DIR, {"arxiv", "book", "github"}, o), 0.2, 1);
  auto problem = moe::speculative::CoclusterProblem::from_counts(parts.first.layer(0), ol::top_k, 8);
  auto eval = [&](moe::speculative::CoclusterResult const& r) {
    sp::Predictor pred(sp::TokenDeviceTable::from_cocluster(problem, r, ol::vocab));
    return sp::capped_evaluation(parts.second.layer(0), r.experts, ol::top_k, 8, [&](int t) { return pred.predict(t); });
  };
  auto ce = eval(moe::speculative::solve_cross_entropy(problem, quick()));
  auto me = eval(moe::speculative::solve_metis(problem));
  CAPTURE(ce.lar, me.lar);
  REQUIRE(ce.imbalance <= 0.1 + 1e-9);
  REQUIRE(me.imbalance <= 0.1 + 1e-9);
  REQUIRE(ce.lar > me.lar);
}
#endif
