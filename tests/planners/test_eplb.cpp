// EPLB port: DeepSeek's published example (issue 3 / the EPLB README) must come out exactly.
#include <catch2/catch.hpp>

#include "moe/replication/eplb.hpp"

using namespace moe::replication;

TEST_CASE("EPLB reproduces DeepSeek's published example (hierarchical policy)") {
  std::vector<double> w = {90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86,
                           20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27};
  auto r = eplb::rebalance_experts(w, 2, 12, 16, 4, 2, 8);
  std::vector<int> phy2log = {5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1,
                              7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1};
  std::vector<int> logcnt = {1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1, 1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1};
  CHECK(r.phy2log.v == phy2log);
  CHECK(r.logcnt.v == logcnt);
  // log2phy is consistent with phy2log.
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 12; ++e)
      for (int p : r.log2phy[l][e]) CHECK(r.phy2log(l, p) == e);
  auto t = eplb::layer_tables(r, 0);
  t.placement.validate(12, 8);
  t.replicas.validate(12, 8, t.placement.ranks());
}

TEST_CASE("EPLB global policy keeps every slot filled and counts consistent") {
  std::vector<double> w = {90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86};
  // 4 groups over 3 nodes does not divide: the global policy is used.
  auto r = eplb::rebalance_experts(w, 1, 12, 15, 4, 3, 3);
  int total = 0;
  for (int e = 0; e < 12; ++e) total += r.logcnt(0, e);
  CHECK(total == 15);
  // The 3 redundant copies go to the experts with the largest load per copy: 183, 165, 132.
  CHECK(r.logcnt(0, 10) == 2);
  CHECK(r.logcnt(0, 5) == 2);
  CHECK(r.logcnt(0, 1) == 2);
}

TEST_CASE("EPLB rejects bad shapes and loads") {
  std::vector<double> w = {1, 2, 3, 4};
  CHECK_THROWS_AS(eplb::rebalance_experts(w, 1, 4, 6, 1, 1, 4), moe::Error);   // 6 slots on 4 GPUs
  CHECK_THROWS_AS(eplb::rebalance_experts(w, 1, 4, 2, 1, 1, 2), moe::Error);   // fewer slots than experts
  std::vector<double> bad = {1, -2, 3, 4};
  CHECK_THROWS_AS(eplb::rebalance_experts(bad, 1, 4, 4, 1, 1, 2), moe::Error);
}

#if defined(__GLIBCXX__)
#include <algorithm>
#include <random>

TEST_CASE("EPLB's sort replays libstdc++'s std::sort exactly, ties included") {
  // eplb.py's tie order is that of std::sort in torch's (libstdc++) build; IntroSort must give the
  // same permutation for heavily tied keys, sorted and reversed inputs, below and above 16 elements.
  std::mt19937 rng(1);
  using KV = std::pair<float, int>;
  auto greater = [](KV const& a, KV const& b) { return a.first > b.first; };
  int differ = 0, total = 0;
  for (int n : {1, 2, 3, 5, 16, 17, 31, 64, 100, 160, 256, 288, 384, 1000}) {
    for (int rep = 0; rep < 60; ++rep) {
      int distinct = 1 + static_cast<int>(rng() % 8);
      std::vector<KV> a(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) a[static_cast<std::size_t>(i)] = {float(rng() % static_cast<unsigned>(distinct)), i};
      if (rep % 3 == 1) std::sort(a.begin(), a.end(), greater);
      if (rep % 3 == 2) std::sort(a.begin(), a.end(), [](KV const& x, KV const& y) { return x.first < y.first; });
      auto b = a;
      std::sort(a.begin(), a.end(), greater);
      eplb::detail::IntroSort<KV, decltype(greater)>(b, greater).run();
      differ += a != b;
      ++total;
    }
  }
  CHECK(total == 14 * 60);
  CHECK(differ == 0);
}
#endif

TEST_CASE("balanced_packing sums pack weights in float32 (eplb.py) or double (SGLang's deepseek.py)") {
  // Six items into 2 packs of 3, heaviest first into the lighter pack (the first on a tie).
  // After 2^24, 2^24 and 1 the packs weigh 2^24 + 1 and 2^24: float32 rounds the first to 2^24
  // (a tie, so the next 1 goes to pack 0), double keeps it (so the next 1 goes to pack 1).
  eplb::Matrix<float> w(1, 6);
  w.v = {16777216.0f, 16777216.0f, 1.0f, 1.0f, 0.75f, 0.5f};
  auto f = eplb::balanced_packing(w, 2);  // eplb.py: torch float32 pack weights
  CHECK(f.pack_index.v == std::vector<int>{0, 1, 0, 0, 1, 1});
  CHECK(f.rank_in_pack.v == std::vector<int>{0, 0, 1, 2, 1, 2});
  auto d = eplb::balanced_packing<double>(w, 2);  // SGLang 0.5.23: Python float pack weights
  CHECK(d.pack_index.v == std::vector<int>{0, 1, 0, 1, 0, 1});
  CHECK(d.rank_in_pack.v == std::vector<int>{0, 0, 1, 1, 2, 2});
}
