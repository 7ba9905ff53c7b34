// s-EG co-clustering: validation, exactness on tiny problems (brute force), planted structure,
// balance, determinism; the METIS and k-means baselines.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <vector>

#include "moe/speculative/cocluster.hpp"
#include "moe/speculative/cocluster_metis.hpp"
#include "moe/profile/route_synthetic.hpp"

namespace pl = moe::placement;

namespace {
moe::speculative::CoclusterProblem random_problem(int tokens, int experts, int devices, std::uint64_t seed) {
  moe::core::Rng rng(seed);
  moe::speculative::CoclusterProblem p;
  p.experts = experts;
  p.devices = devices;
  p.offsets.push_back(0);
  for (int t = 0; t < tokens; ++t) {
    p.tokens.push_back(t);
    p.frequency.push_back(1.0 + static_cast<double>(rng.below(5)));
    for (int e = 0; e < experts; ++e)
      if (rng.uniform() < 0.6) {
        p.expert.push_back(e);
        p.weight.push_back(1.0 + static_cast<double>(rng.below(9)));
      }
    p.offsets.push_back(static_cast<std::int64_t>(p.expert.size()));
  }
  return p;
}

// Exhaustive optimum of the local activations over balanced expert groupings and every token
// assignment within the token-frequency cap.
double brute_force_best(moe::speculative::CoclusterProblem const& p, double gamma) {
  auto E = static_cast<std::size_t>(p.experts), N = p.rows();
  auto D = static_cast<std::size_t>(p.devices);
  double cap = gamma * p.total_frequency() / p.devices, best = -1;
  std::vector<int> ed(E, 0);
  std::size_t combos = 1, tcombos = 1;
  for (std::size_t e = 0; e < E; ++e) combos *= D;
  for (std::size_t i = 0; i < N; ++i) tcombos *= D;
  for (std::size_t c = 0; c < combos; ++c) {
    std::size_t x = c;
    std::vector<std::size_t> cnt(D, 0);
    for (std::size_t e = 0; e < E; ++e) {
      ed[e] = static_cast<int>(x % D);
      ++cnt[x % D];
      x /= D;
    }
    if (std::any_of(cnt.begin(), cnt.end(), [&](std::size_t k) { return k != E / D; })) continue;
    std::vector<int> td(N);
    for (std::size_t tc = 0; tc < tcombos; ++tc) {
      std::size_t y = tc;
      for (std::size_t i = 0; i < N; ++i) {
        td[i] = static_cast<int>(y % D);
        y /= D;
      }
      auto load = moe::speculative::device_token_load(p, td);
      if (*std::max_element(load.begin(), load.end()) > cap + 1e-9) continue;
      best = std::max(best, moe::speculative::local_rate(p, ed, td));
    }
  }
  return best;
}

void require_valid(moe::speculative::CoclusterProblem const& p, moe::speculative::CoclusterResult const& r) {
  r.experts.validate(p.experts, p.devices);
  std::vector<int> per(static_cast<std::size_t>(p.devices), 0);
  for (int e = 0; e < p.experts; ++e) ++per[static_cast<std::size_t>(r.experts.rank_of(e))];
  for (int c : per) REQUIRE(c == p.experts / p.devices);
  REQUIRE(r.token_device.size() == p.rows());
  for (int d : r.token_device) REQUIRE((d >= 0 && d < p.devices));
  REQUIRE(r.local_rate == Approx(moe::speculative::local_rate(p, r.experts.ranks(), r.token_device)));
}
}  // namespace

TEST_CASE("co-clustering input validation", "[speculative][cocluster][errors]") {
  auto p = random_problem(5, 4, 2, 1);
  p.devices = 8;
  REQUIRE_THROWS_WITH(moe::speculative::solve_cross_entropy(p), Catch::Contains("more devices (8) than experts (4)"));
  REQUIRE_THROWS_WITH(moe::speculative::balanced_kmeans(p), Catch::Contains("more devices"));
  p.devices = 3;
  REQUIRE_THROWS_WITH(moe::speculative::solve_cross_entropy(p), Catch::Contains("do not split evenly"));
  p.devices = 0;
  REQUIRE_THROWS_AS(moe::speculative::solve_cross_entropy(p), moe::Error);
  moe::speculative::CoclusterProblem empty;
  empty.experts = 4;
  empty.devices = 2;
  empty.offsets = {0};
  REQUIRE_THROWS_WITH(moe::speculative::solve_cross_entropy(empty), Catch::Contains("empty profile"));
  moe::profile::LayerCounts lc;
  REQUIRE_THROWS_WITH(moe::speculative::CoclusterProblem::from_counts(lc, 2, 2), Catch::Contains("empty"));
  auto q = random_problem(5, 4, 2, 1);
  moe::speculative::CrossEntropyOptions bad;
  bad.elite_fraction = 0;
  REQUIRE_THROWS_AS(moe::speculative::solve_cross_entropy(q, bad), moe::Error);
  moe::speculative::CrossEntropyOptions negative_weight;
  negative_weight.balance_weight = -1;
  REQUIRE_THROWS_WITH(moe::speculative::solve_cross_entropy(q, negative_weight), Catch::Contains("balance_weight must be >= 0"));
}

TEST_CASE("Hungarian assignment against all permutations", "[speculative][cocluster]") {
  moe::core::Rng rng(4);
  for (int trial = 0; trial < 5; ++trial) {
    std::size_t n = 6;
    std::vector<double> cost(n * n);
    for (auto& c : cost) c = static_cast<double>(rng.below(100));
    auto col = moe::speculative::detail::hungarian(cost, n, n);
    double got = 0;
    for (std::size_t i = 0; i < n; ++i) got += cost[i * n + static_cast<std::size_t>(col[i])];
    std::vector<std::size_t> perm(n);
    std::iota(perm.begin(), perm.end(), std::size_t{0});
    double best = 1e18;
    do {
      double s = 0;
      for (std::size_t i = 0; i < n; ++i) s += cost[i * n + perm[i]];
      best = std::min(best, s);
    } while (std::next_permutation(perm.begin(), perm.end()));
    REQUIRE(got == best);
  }
}

TEST_CASE("cross-entropy reaches the brute-force optimum of tiny problems", "[speculative][cocluster]") {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    auto p = random_problem(6, 4, 2, seed);
    double gamma = 1.3;
    double best = brute_force_best(p, gamma);
    moe::speculative::CrossEntropyOptions plain;  // the method of Algorithm 1 without our refinement
    plain.balance_factor = gamma;
    plain.polish_rounds = 0;
    plain.final_polish_rounds = 0;
    plain.samples = 32;
    plain.seed = seed;
    auto r = moe::speculative::solve_cross_entropy(p, plain);
    require_valid(p, r);
    REQUIRE(r.imbalance <= gamma - 1 + 1e-9);
    REQUIRE(r.local_rate <= best + 1e-12);
    // The greedy token step may miss the exact optimum by a little on such small instances.
    REQUIRE(r.local_rate >= 0.95 * best);
    moe::speculative::CrossEntropyOptions full;
    full.balance_factor = gamma;
    full.seed = seed;
    auto f = moe::speculative::solve_cross_entropy(p, full);
    require_valid(p, f);
    REQUIRE(f.local_rate <= best + 1e-12);
    REQUIRE(f.local_rate >= 0.95 * best);
  }
}

TEST_CASE("best expert grouping for fixed tokens is exact", "[speculative][cocluster]") {
  auto p = random_problem(12, 6, 2, 8);
  std::vector<int> td(p.rows());
  for (std::size_t i = 0; i < td.size(); ++i) td[i] = static_cast<int>(i % 2);
  auto ed = moe::speculative::detail::best_experts_for(p, td);
  double got = moe::speculative::local_rate(p, ed, td), best = 0;
  for (int mask = 0; mask < 64; ++mask) {
    if (__builtin_popcount(static_cast<unsigned>(mask)) != 3) continue;
    std::vector<int> x(6);
    for (int e = 0; e < 6; ++e) x[static_cast<std::size_t>(e)] = (mask >> e) & 1;
    best = std::max(best, moe::speculative::local_rate(p, x, td));
  }
  REQUIRE(got == Approx(best));
}

TEST_CASE("planted co-clusters are recovered (synthetic, seeded)", "[speculative][cocluster]") {
  // 4 topics of 4 experts each; every token only uses its topic's experts, so LAR 1 is reachable
  // when the token balance cap is loose enough.
  moe::profile::synthetic::Spec s{.vocab = 400, .experts = 16, .top_k = 2, .topics = 4, .occurrences = 20000,
                                  .zipf = 0.6, .affinity = 1.0, .seed = 5};
  auto prof = moe::profile::synthetic::generate(s);
  auto p = moe::speculative::CoclusterProblem::from_counts(prof.layer(0), 2, 4);
  moe::speculative::CrossEntropyOptions o;
  o.balance_factor = 4.0;
  auto r = moe::speculative::solve_cross_entropy(p, o);
  require_valid(p, r);
  REQUIRE(r.local_rate == Approx(1.0));
  // Same seed, same answer.
  auto again = moe::speculative::solve_cross_entropy(p, o);
  REQUIRE(again.experts == r.experts);
  REQUIRE(again.token_device == r.token_device);
  // k-means also finds the planted structure here.
  moe::speculative::KMeansOptions ko;
  ko.balance_factor = 4.0;
  auto k = moe::speculative::balanced_kmeans(p, ko);
  require_valid(p, k);
  REQUIRE(k.local_rate == Approx(1.0));
  // With the paper's gamma = 1.1 the token frequency per device stays within 10 %.
  auto tight = moe::speculative::solve_cross_entropy(p);
  require_valid(p, tight);
  REQUIRE(tight.imbalance <= 0.1 + 1e-9);
  auto kt = moe::speculative::balanced_kmeans(p);
  require_valid(p, kt);
  REQUIRE(kt.imbalance <= 0.1 + 1e-9);
  REQUIRE(tight.local_rate >= kt.local_rate - 1e-12);
  // Objective: zero remote activations, so the value is the balance term only.
  auto load = moe::speculative::device_token_load(p, r.token_device);
  double mean = p.total_frequency() / 4, bal = 0;
  for (double v : load) bal += (v / mean - 1) * (v / mean - 1);
  REQUIRE(moe::speculative::objective(p, r.experts.ranks(), r.token_device, 3.0) == Approx(bal));
}

TEST_CASE("refinement never lowers the local activations", "[speculative][cocluster]") {
  moe::profile::synthetic::Spec s{.vocab = 2000, .experts = 32, .top_k = 4, .topics = 8, .occurrences = 50000,
                                  .affinity = 0.7, .seed = 9};
  auto prof = moe::profile::synthetic::generate(s);
  auto p = moe::speculative::CoclusterProblem::from_counts(prof.layer(0), 4, 4);
  auto contiguous = moe::speculative::assign_tokens_to(p, pl::Table::contiguous(32, 4), 1.1);
  auto refined = moe::speculative::refine(p, contiguous, 5);
  require_valid(p, refined);
  REQUIRE(refined.local_rate >= contiguous.local_rate);
  REQUIRE(refined.imbalance <= 0.1 + 1e-9);
}

#if MOE_HAS_METIS && defined(MOE_WITH_METIS)
TEST_CASE("METIS baseline gives a valid balanced grouping", "[speculative][cocluster][metis]") {
  moe::profile::synthetic::Spec s{.vocab = 2000, .experts = 32, .top_k = 4, .topics = 8, .occurrences = 50000,
                                  .affinity = 0.7, .seed = 9};
  auto prof = moe::profile::synthetic::generate(s);
  auto p = moe::speculative::CoclusterProblem::from_counts(prof.layer(0), 4, 4);
  auto m = moe::speculative::solve_metis(p);
  require_valid(p, m);  // the repair step restores exactly E/D experts per device
  REQUIRE(m.imbalance <= 0.15);
  auto again = moe::speculative::solve_metis(p);
  REQUIRE(again.experts == m.experts);
  auto ce = moe::speculative::solve_cross_entropy(p);
  require_valid(p, ce);
  REQUIRE(ce.imbalance <= 0.1 + 1e-9);
  REQUIRE(ce.local_rate >= m.local_rate);
}
#endif
