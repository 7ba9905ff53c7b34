// profile::TokenSampler (moe/profile/token_batches.hpp): token-level batches from aggregated counts.
//
// References: the inclusion probabilities of sequential weighted draws without replacement,
// enumerated over every draw order of a small row (shares no code with the sampler); hand-built
// profiles whose ids always route one way; the real OLMoE arxiv counts (tests/data) for the
// structure of every sampled token.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "moe/profile/olmoe_tokens.hpp"
#include "moe/profile/token_batches.hpp"

using namespace moe;
using namespace moe::profile;

namespace {

/// P(item i is among the first n of a sequential draw without replacement, each draw proportional
/// to the weights of the items left), by enumerating every ordered prefix.
std::vector<double> inclusion(std::vector<double> const& w, int n) {
  std::vector<double> p(w.size(), 0.0);
  std::vector<char> used(w.size(), 0);
  std::function<void(int, double)> go = [&](int depth, double prob) {
    if (depth == n) {
      for (std::size_t i = 0; i < w.size(); ++i)
        if (used[i]) p[i] += prob;
      return;
    }
    double left = 0;
    for (std::size_t i = 0; i < w.size(); ++i)
      if (!used[i]) left += w[i];
    for (std::size_t i = 0; i < w.size(); ++i)
      if (!used[i] && w[i] > 0) {
        used[i] = 1;
        go(depth + 1, prob * w[i] / left);
        used[i] = 0;
      }
  };
  go(0, 1.0);
  return p;
}

/// `tokens` tokens drawn from layer 0 of `p` with a sampler seeded by `seed` (tokens x top_k).
std::vector<int> draw_tokens(RouteProfile const& p, std::uint64_t seed, int tokens) {
  TokenSampler ts(p, 0);
  Rng rng(seed);
  std::vector<int> out;
  ts.sample(tokens, rng, out);
  return out;
}

/// A sampled frequency within 5 binomial standard deviations of probability q over n trials.
bool near(double frequency, double q, double n) { return std::abs(frequency - q) < 5 * std::sqrt(q * (1 - q) / n); }

}  // namespace

TEST_CASE("token sampler: ids that always route one way give exactly their sets, in proportion") {
  RouteRecorder rec(6, 2);
  for (int i = 0; i < 10; ++i) rec.record(5, 0, std::vector<int>{1, 3});
  for (int i = 0; i < 30; ++i) rec.record(7, 0, std::vector<int>{2, 0});
  int const T = 20000;
  auto out = draw_tokens(rec.profile(), 3, T);
  REQUIRE(out.size() == 2u * T);
  int second = 0;
  for (int t = 0; t < T; ++t) {
    std::set<int> s{out[2 * t], out[2 * t + 1]};
    bool a = s == std::set<int>{1, 3}, b = s == std::set<int>{0, 2};
    REQUIRE((a || b));
    second += b;
  }
  // Id 7 holds 30 of the 40 occurrences: 0.75, binomial sd sqrt(0.75 * 0.25 / T) = 0.003.
  CHECK(near(second / static_cast<double>(T), 0.75, T));
}

TEST_CASE("token sampler: experts of one id follow sequential draws without replacement (enumerated)") {
  // One id, 5 experts, unequal counts; top-3. Counts sum to 3 x occurrences (12 occurrences).
  RouteRecorder rec(5, 3);
  std::vector<std::int64_t> counts{12, 9, 7, 5, 3};
  for (int e = 0; e < 5; ++e) rec.add(0, 42, e, counts[static_cast<std::size_t>(e)]);
  int const T = 100000;
  auto out = draw_tokens(rec.profile(), 11, T);
  std::vector<double> seen(5, 0.0);
  for (int t = 0; t < T; ++t) {
    std::set<int> s(out.begin() + 3 * t, out.begin() + 3 * t + 3);
    REQUIRE(s.size() == 3u);  // distinct experts per token
    for (int e : s) seen[static_cast<std::size_t>(e)] += 1;
  }
  auto want = inclusion({12, 9, 7, 5, 3}, 3);
  for (int e = 0; e < 5; ++e) {
    double q = want[static_cast<std::size_t>(e)];
    INFO("expert " << e << ": sampled " << seen[static_cast<std::size_t>(e)] / T << ", enumerated " << q);
    CHECK(near(seen[static_cast<std::size_t>(e)] / T, q, T));
  }
}

TEST_CASE("token sampler: a thinned row fills its token from the layer's loads") {
  // Id 1 has one distinct expert (as after a thinning split), top-2: its second expert comes from
  // the layer's loads without the first: id 2's experts 2 and 3 (counts 30 and 10), never 0 again.
  RouteRecorder rec(4, 2);
  rec.add(0, 1, 0, 2);
  rec.add(0, 2, 2, 30);
  rec.add(0, 2, 3, 10);
  int const T = 40000;
  auto out = draw_tokens(rec.profile(), 5, T);
  int thinned = 0, with3 = 0;
  for (int t = 0; t < T; ++t) {
    REQUIRE(out[2 * t] != out[2 * t + 1]);
    if (out[2 * t] == 0) {  // id 1 (expert 0 only appears there)
      ++thinned;
      REQUIRE((out[2 * t + 1] == 2 || out[2 * t + 1] == 3));
      with3 += out[2 * t + 1] == 3;
    }
  }
  REQUIRE(thinned > 0);
  // Id 1 holds 2 of 42 activations; its fill is expert 3 with probability 10 / 40.
  CHECK(near(thinned / static_cast<double>(T), 2.0 / 42, T));
  CHECK(near(with3 / static_cast<double>(thinned), 0.25, thinned));
}

TEST_CASE("token sampler: the real OLMoE arxiv counts give top-8 tokens of distinct experts") {
  auto p = olmoe::load(MOE_SHARED_DATA_DIR, {"arxiv"}, {.token_counts = true, .crosslayer = false, .only_layer = 0});
  TokenSampler ts(p, 0);
  REQUIRE(ts.top_k() == 8);
  Rng rng(1);
  std::vector<int> out;
  ts.sample(4096, rng, out);
  REQUIRE(out.size() == 8u * 4096);
  for (std::size_t t = 0; t < out.size(); t += 8) {
    std::set<int> s(out.begin() + static_cast<std::ptrdiff_t>(t), out.begin() + static_cast<std::ptrdiff_t>(t) + 8);
    REQUIRE(s.size() == 8u);
    REQUIRE(*s.begin() >= 0);
    REQUIRE(*s.rbegin() < 64);
  }
}

TEST_CASE("token sampler: bad input is an error") {
  RouteRecorder rec(4, 0);  // top_k unknown (as a file without it)
  rec.add(0, 1, 0, 2);
  auto p = rec.profile();
  CHECK_THROWS_WITH(TokenSampler(p, 0), Catch::Contains("top_k is unknown"));
  RouteRecorder ok(4, 2);
  ok.add(0, 1, 0, 2);
  auto q = ok.profile();
  CHECK_THROWS_WITH(TokenSampler(q, 3), Catch::Contains("no layer 3"));
  TokenSampler ts(q, 0);
  Rng rng(1);
  std::vector<int> out;
  CHECK_THROWS_WITH(ts.sample(-1, rng, out), Catch::Contains("negative token count"));
}
