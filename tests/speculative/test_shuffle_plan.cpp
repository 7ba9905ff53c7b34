// Host shuffle plan: stable argsort / group / align and the exact inverse.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "moe/speculative/cocluster.hpp"
#include "moe/speculative/shuffle_plan.hpp"

namespace sp = moe::speculative;

TEST_CASE("shuffle plan equals a stable sort by predicted device", "[speculative][shuffle]") {
  moe::core::Rng rng(42);
  for (int devices : {1, 3, 8}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{37}, std::size_t{1000}}) {
      std::vector<int> pred(n);
      for (auto& d : pred) d = static_cast<int>(rng.below(static_cast<std::size_t>(devices)));
      // Leave the odd devices empty on purpose when there are more than 2.
      if (devices > 2)
        for (auto& d : pred) d -= d % 2;
      auto plan = sp::make_shuffle_plan(pred, devices);
      std::vector<std::int32_t> ref(n);
      std::iota(ref.begin(), ref.end(), 0);
      std::stable_sort(ref.begin(), ref.end(), [&](int a, int b) {
        return pred[static_cast<std::size_t>(a)] < pred[static_cast<std::size_t>(b)];
      });
      REQUIRE(plan.permutation == ref);
      for (int d = 0; d < devices; ++d) {
        auto du = static_cast<std::size_t>(d);
        REQUIRE(plan.counts[du] == std::count(pred.begin(), pred.end(), d));
        for (auto j = plan.offsets[du]; j < plan.offsets[du + 1]; ++j)
          REQUIRE(pred[static_cast<std::size_t>(plan.permutation[static_cast<std::size_t>(j)])] == d);
      }
      REQUIRE(plan.offsets.back() == static_cast<std::int32_t>(n));
      for (std::size_t i = 0; i < n; ++i)
        REQUIRE(plan.permutation[static_cast<std::size_t>(plan.inverse[i])] == static_cast<std::int32_t>(i));
    }
  }
}

TEST_CASE("pack then unpack restores the rows exactly", "[speculative][shuffle]") {
  moe::core::Rng rng(1);
  std::size_t n = 257, width = 5;
  std::vector<int> pred(n);
  for (auto& d : pred) d = static_cast<int>(rng.below(4));
  auto plan = sp::make_shuffle_plan(pred, 4);
  std::vector<float> rows(n * width), packed(n * width), back(n * width);
  for (auto& v : rows) v = static_cast<float>(rng.uniform());
  sp::pack_rows<float>(plan, rows, packed, width);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t k = 0; k < width; ++k)
      REQUIRE(packed[j * width + k] == rows[static_cast<std::size_t>(plan.permutation[j]) * width + k]);
  sp::unpack_rows<float>(plan, packed, back, width);
  REQUIRE(back == rows);
  std::vector<float> wrong(3);
  REQUIRE_THROWS_AS(sp::pack_rows<float>(plan, rows, wrong, width), moe::Error);
}

TEST_CASE("aligned groups: padded offsets and slots", "[speculative][shuffle]") {
  std::vector<int> pred{2, 0, 2, 2, 0, 3, 2, 2};
  auto plan = sp::make_shuffle_plan(pred, 4, 4);
  REQUIRE(plan.counts == std::vector<std::int32_t>{2, 0, 5, 1});
  REQUIRE(plan.offsets == std::vector<std::int32_t>{0, 2, 2, 7, 8});
  REQUIRE(plan.aligned_offsets == std::vector<std::int32_t>{0, 4, 4, 12, 16});
  REQUIRE(plan.padded_tokens() == 16);
  std::set<std::size_t> slots;
  for (std::size_t i = 0; i < pred.size(); ++i) {
    auto s = plan.padded_slot(i);
    auto d = static_cast<std::size_t>(pred[i]);
    REQUIRE(s >= static_cast<std::size_t>(plan.aligned_offsets[d]));
    REQUIRE(s < static_cast<std::size_t>(plan.aligned_offsets[d]) + static_cast<std::size_t>(plan.counts[d]));
    slots.insert(s);
  }
  REQUIRE(slots.size() == pred.size());
}

TEST_CASE("shuffle plan rejects bad predictions", "[speculative][shuffle][errors]") {
  std::vector<int> bad{0, 4}, neg{-1};
  REQUIRE_THROWS_WITH(sp::make_shuffle_plan(bad, 4), Catch::Contains("token 1 is predicted for device 4"));
  REQUIRE_THROWS_AS(sp::make_shuffle_plan(neg, 4), moe::Error);
  REQUIRE_THROWS_AS(sp::make_shuffle_plan(bad, 0), moe::Error);
  REQUIRE_THROWS_AS(sp::make_shuffle_plan(bad, 8, 0), moe::Error);
}

TEST_CASE("cap_predictions bounds tokens per device, moving the least confident", "[speculative][shuffle]") {
  moe::core::Rng rng(17);
  std::size_t n = 500;
  int D = 4;
  std::vector<int> pred(n);
  std::vector<std::int16_t> conf(n);
  for (std::size_t i = 0; i < n; ++i) {
    pred[i] = rng.uniform() < 0.6 ? 0 : static_cast<int>(rng.below(4));  // device 0 overloaded
    conf[i] = static_cast<std::int16_t>(rng.below(32768));
  }
  auto orig = pred;
  std::int32_t cap = 140;
  auto moved = sp::cap_predictions(pred, conf, D, cap);
  auto plan = sp::make_shuffle_plan(pred, D);
  for (int d = 0; d < D; ++d) REQUIRE(plan.counts[static_cast<std::size_t>(d)] <= cap);
  std::size_t changed = 0;
  for (std::size_t i = 0; i < n; ++i) changed += pred[i] != orig[i];
  REQUIRE(changed == moved);
  auto c0 = std::count(orig.begin(), orig.end(), 0);
  REQUIRE(static_cast<long>(moved) >= c0 - cap);
  // Every token that left device 0 is no more confident than every token that stayed there.
  int kept_min = 1 << 20, moved_max = -1;
  for (std::size_t i = 0; i < n; ++i) {
    if (orig[i] != 0) continue;
    if (pred[i] == 0) kept_min = std::min<int>(kept_min, conf[i]);
    else moved_max = std::max<int>(moved_max, conf[i]);
  }
  REQUIRE(moved_max <= kept_min);
  // Already within capacity: nothing moves.
  auto again = pred;
  REQUIRE(sp::cap_predictions(again, conf, D, cap) == 0);
  REQUIRE(again == pred);
  // Infeasible capacity and bad inputs are errors.
  REQUIRE_THROWS_WITH(sp::cap_predictions(pred, conf, D, 100), Catch::Contains("do not fit"));
  REQUIRE_THROWS_AS(sp::cap_predictions(pred, std::vector<std::int16_t>(3), D, cap), moe::Error);
  std::vector<int> bad{5};
  REQUIRE_THROWS_AS(sp::cap_predictions(bad, {}, D, cap), moe::Error);
}
