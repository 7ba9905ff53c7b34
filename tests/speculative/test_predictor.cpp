// s-TS predictors: token table, device-sequence table, the confidence rule and the fallbacks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "moe/speculative/cocluster.hpp"
#include "moe/profile/route_profile.hpp"
#include "moe/speculative/predictor.hpp"

namespace sp = moe::speculative;
using moe::placement::Table;
using moe::profile::RouteRecorder;

TEST_CASE("Q15 confidences", "[speculative][predictor]") {
  REQUIRE(sp::to_q15(1.0) == 32767);
  REQUIRE(sp::to_q15(0.0) == 0);
  REQUIRE(sp::to_q15(2.0) == 32767);
  REQUIRE(sp::from_q15(sp::to_q15(0.25)) == Approx(0.25).margin(1.0 / 32767));
  static_assert(sizeof(sp::Q15) == 2);
}

TEST_CASE("token table from counts picks the device with most activations", "[speculative][predictor]") {
  moe::core::Rng rng(3);
  RouteRecorder rec(8, 1);
  std::map<int, std::vector<long>> ref;  // token -> activations per expert
  for (int n = 0; n < 2000; ++n) {
    int t = static_cast<int>(rng.below(50));
    int e = static_cast<int>(rng.below(8));
    rec.add(0, t, e, 1);
    ref[t].resize(8);
    ++ref[t][static_cast<std::size_t>(e)];
  }
  auto p = rec.profile();
  auto placement = Table::round_robin(8, 4);
  auto table = sp::TokenDeviceTable::from_counts(p.layer(0), placement, 4, 64);
  REQUIRE(table.known_count() == ref.size());
  for (auto const& [t, counts] : ref) {
    std::vector<double> mass(4, 0.0);
    double total = 0;
    for (int e = 0; e < 8; ++e) {
      mass[static_cast<std::size_t>(e % 4)] += static_cast<double>(counts[static_cast<std::size_t>(e)]);
      total += static_cast<double>(counts[static_cast<std::size_t>(e)]);
    }
    auto best = std::max_element(mass.begin(), mass.end()) - mass.begin();  // first maximum
    auto l = table.lookup(t);
    REQUIRE(l.device == best);
    REQUIRE(sp::from_q15(l.confidence) == Approx(mass[static_cast<std::size_t>(best)] / total).margin(1e-4));
  }
  for (int t = 0; t < 64; ++t)
    if (!ref.count(t)) REQUIRE(table.lookup(t).device == -1);
}

TEST_CASE("token ids outside the table are errors", "[speculative][predictor][errors]") {
  sp::TokenDeviceTable table(10, 2);
  table.set(3, 1, 0.9);
  sp::Predictor pred(table);
  REQUIRE_THROWS_WITH(pred.predict(10), Catch::Contains("token id 10 outside the vocabulary [0, 10)"));
  REQUIRE_THROWS_WITH(pred.predict(-1), Catch::Contains("outside the vocabulary"));
  REQUIRE_THROWS_AS(table.set(2, 2, 0.5), moe::Error);
  REQUIRE_THROWS_AS(sp::TokenDeviceTable(0, 2), moe::Error);
  std::vector<int> toks{3, 11}, out(2);
  REQUIRE_THROWS_AS(pred.predict_devices(toks, out), moe::Error);
}

TEST_CASE("unseen tokens: nearest-token hook, then token id mod devices", "[speculative][predictor]") {
  sp::TokenDeviceTable table(20, 4);
  table.set(3, 2, 0.8);
  sp::Predictor plain(table);
  auto a = plain.predict(3);
  REQUIRE(a.device == 2);
  REQUIRE(a.source == sp::Prediction::Source::token_table);
  auto b = plain.predict(13);
  REQUIRE(b.device == 13 % 4);
  REQUIRE(b.confidence == 0);
  REQUIRE(b.source == sp::Prediction::Source::fallback);
  sp::Predictor hooked(table, std::nullopt, [](int t) { return t == 13 ? 3 : -1; });
  auto c = hooked.predict(13);
  REQUIRE(c.device == 2);
  REQUIRE(c.source == sp::Prediction::Source::nearest_token);
  REQUIRE(hooked.predict(14).source == sp::Prediction::Source::fallback);
  // A hook answering an unknown or out-of-range token falls through to the default.
  sp::Predictor silly(table, std::nullopt, [](int) { return 999; });
  REQUIRE(silly.predict(5).device == 1);
}

TEST_CASE("cosine nearest known token matches a brute-force search", "[speculative][predictor]") {
  int vocab = 30, hidden = 5;
  moe::core::Rng rng(11);
  std::vector<float> emb(static_cast<std::size_t>(vocab * hidden));
  for (auto& v : emb) v = static_cast<float>(rng.uniform() * 2 - 1);
  sp::TokenDeviceTable table(vocab, 3);
  for (int t = 0; t < vocab; t += 3) table.set(t, t % 3, 0.5);
  auto nearest = sp::cosine_nearest(emb, hidden, table);
  auto cosine = [&](int a, int b) {
    double d = 0, na = 0, nb = 0;
    for (int h = 0; h < hidden; ++h) {
      double x = emb[static_cast<std::size_t>(a * hidden + h)], y = emb[static_cast<std::size_t>(b * hidden + h)];
      d += x * y;
      na += x * x;
      nb += y * y;
    }
    return d / std::sqrt(na * nb);
  };
  for (int t = 0; t < vocab; ++t) {
    if (t % 3 == 0) continue;
    int best = -1;
    double bc = -2;
    for (int k = 0; k < vocab; k += 3)
      if (cosine(t, k) > bc) {
        bc = cosine(t, k);
        best = k;
      }
    REQUIRE(nearest(t) == best);
  }
  REQUIRE_THROWS_AS(sp::cosine_nearest(std::vector<float>(7), hidden, table), moe::Error);
}

TEST_CASE("device-sequence table counts device paths over 2 previous layers", "[speculative][predictor]") {
  // 4 experts on 2 devices (round robin), top-2, layers 0, 1, 2.
  moe::core::Rng rng(5);
  RouteRecorder rec(4, 2, true);
  int const n = 400;
  std::vector<std::vector<int>> route(3 * n);
  for (int l = 0; l < 3; ++l)
    for (int o = 0; o < n; ++o) {
      std::vector<int> ex;
      while (ex.size() < 2) {
        int e = static_cast<int>(rng.below(4));
        if (std::find(ex.begin(), ex.end(), e) == ex.end()) ex.push_back(e);
      }
      rec.record(o % 17, l, ex);
      route[static_cast<std::size_t>(l * n + o)] = ex;
    }
  auto p = rec.profile();
  auto placement = Table::round_robin(4, 2);
  auto dev = [&](std::vector<int> const& ex) {  // device with most experts, ties lowest
    int c[2] = {0, 0};
    for (int e : ex) ++c[e % 2];
    return c[1] > c[0] ? 1 : 0;
  };
  std::map<std::pair<int, int>, std::vector<int>> ref;
  for (int o = 0; o < n; ++o) {
    auto& v = ref[{dev(route[static_cast<std::size_t>(o)]), dev(route[static_cast<std::size_t>(n + o)])}];
    v.resize(2);
    ++v[static_cast<std::size_t>(dev(route[static_cast<std::size_t>(2 * n + o)]))];
  }
  std::vector<moe::profile::LayerPaths const*> paths{&p.paths(0), &p.paths(1), &p.paths(2)};
  std::vector<Table const*> pl{&placement, &placement, &placement};
  auto seq = sp::DeviceSequenceTable::from_paths(paths, pl, 2, 2);
  REQUIRE(seq.lookback() == 2);
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) {
      std::vector<int> prev{a, b};
      auto l = seq.lookup(prev);
      auto it = ref.find({a, b});
      if (it == ref.end()) {
        REQUIRE(l.device == -1);
        continue;
      }
      auto const& c = it->second;
      int best = c[1] > c[0] ? 1 : 0;
      REQUIRE(l.device == best);
      REQUIRE(sp::from_q15(l.confidence) ==
              Approx(double(c[static_cast<std::size_t>(best)]) / (c[0] + c[1])).margin(1e-4));
    }
  std::vector<int> bad{0, 2}, short_{0};
  REQUIRE_THROWS_AS(seq.lookup(bad), moe::Error);
  REQUIRE_THROWS_AS(seq.lookup(short_), moe::Error);
}

TEST_CASE("device-sequence table from cross-layer counts", "[speculative][predictor]") {
  std::vector<std::int64_t> m(16, 0);
  m[0 * 4 + 1] = 5;  // expert 0 (dev 0) -> expert 1 (dev 1)
  m[0 * 4 + 2] = 2;  // -> expert 2 (dev 0)
  m[3 * 4 + 3] = 4;  // expert 3 (dev 1) -> expert 3 (dev 1)
  auto rr = Table::round_robin(4, 2);
  auto seq = sp::DeviceSequenceTable::from_crosslayer(m, rr, rr, 2);
  std::vector<int> d0{0}, d1{1};
  REQUIRE(seq.lookup(d0).device == 1);
  REQUIRE(sp::from_q15(seq.lookup(d0).confidence) == Approx(5.0 / 7).margin(1e-4));
  REQUIRE(seq.lookup(d1).device == 1);
  REQUIRE(sp::from_q15(seq.lookup(d1).confidence) == Approx(1.0).margin(1e-4));
  REQUIRE_THROWS_AS(sp::DeviceSequenceTable::from_crosslayer(std::vector<std::int64_t>(15), rr, rr, 2), moe::Error);
}

TEST_CASE("the predictor takes the more confident table", "[speculative][predictor]") {
  sp::TokenDeviceTable table(10, 2);
  table.set(1, 0, 0.6);
  table.set(2, 0, 0.95);
  sp::DeviceSequenceTable seq(2, 2);
  std::vector<int> p11{1, 1}, p00{0, 0};
  seq.add(p11, 1, 9);
  seq.add(p11, 0, 1);  // (1,1) -> 1 with confidence 0.9
  seq.finalize();
  sp::Predictor pred(table, seq);
  REQUIRE(pred.predict(1, p11).device == 1);  // 0.9 > 0.6
  REQUIRE(pred.predict(1, p11).source == sp::Prediction::Source::sequence_table);
  REQUIRE(pred.predict(2, p11).device == 0);  // 0.95 > 0.9
  REQUIRE(pred.predict(1, p00).device == 0);  // empty row: token table
  REQUIRE(pred.predict(1).device == 0);       // no history: token table
  REQUIRE(pred.predict(7, p11).device == 1);  // unseen token: sequence table beats the default
  REQUIRE(pred.predict(7, p00).source == sp::Prediction::Source::fallback);
  std::vector<int> toks{1, 2, 7}, hist{1, 1, 1, 1, 0, 0}, out(3);
  pred.predict_devices(toks, hist, out);
  REQUIRE(out == std::vector<int>{1, 0, 7 % 2});
  REQUIRE_THROWS_AS(pred.predict_devices(toks, std::vector<int>{1, 1}, out), moe::Error);
  REQUIRE_THROWS_AS(sp::Predictor(table, sp::DeviceSequenceTable(3, 2)), moe::Error);
}

TEST_CASE("token -> top-k expert table", "[speculative][predictor]") {
  RouteRecorder rec(6, 1);
  rec.add(0, 4, 2, 5);
  rec.add(0, 4, 5, 7);
  rec.add(0, 4, 1, 5);
  rec.add(0, 4, 0, 1);
  auto p = rec.profile();
  sp::TokenExpertTable t(p.layer(0), 3, 8);
  auto ex = t.experts(4);
  REQUIRE(std::vector<int>(ex.begin(), ex.end()) == std::vector<int>{5, 1, 2});  // ties: lower expert
  REQUIRE(t.experts(3).empty());
  REQUIRE_THROWS_AS(t.experts(8), moe::Error);
  REQUIRE_THROWS_AS(sp::TokenExpertTable(p.layer(0), 3, 4), moe::Error);  // token 4 outside vocab 4
}
