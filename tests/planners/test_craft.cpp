// CRAFT: the knapsack DP against brute force, the interleaved capacity assignment, the greedy
// placement's validity, memory parity with EPLB at one replica per layer per GPU, and metrics.
#include <catch2/catch.hpp>

#include <functional>
#include <limits>

#include "moe/placement/eplb_packing.hpp"
#include "moe/placement/metrics.hpp"
#include "moe/replication/craft.hpp"
#include "moe/replication/eplb.hpp"

using namespace moe;
using namespace moe::replication;

namespace {
double value(craft::Benefit const& T, std::vector<int> const& x, craft::Objective obj) {
  double v = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] == 0) continue;
    auto k = std::find(T.counts.begin(), T.counts.end(), x[i]) - T.counts.begin();
    v += T.gain[static_cast<std::size_t>(k)][i] * (obj == craft::Objective::paper_weighted ? x[i] : 1);
  }
  return v;
}

/// Brute force over every per-layer choice: total exactly C if possible, else the best below C.
double brute_force(craft::Benefit const& T, long long C, craft::Objective obj) {
  int L = static_cast<int>(T.base.size());
  std::vector<int> opts{0};
  opts.insert(opts.end(), T.counts.begin(), T.counts.end());
  double best_exact = -1e300, best_below = -1e300;
  std::vector<int> x(static_cast<std::size_t>(L), 0);
  std::function<void(int)> rec = [&](int l) {
    if (l == L) {
      long long used = 0;
      for (int r : x) used += r;
      double v = value(T, x, obj);
      if (used == C) best_exact = std::max(best_exact, v);
      if (used <= C) best_below = std::max(best_below, v);
      return;
    }
    for (int o : opts) {
      x[static_cast<std::size_t>(l)] = o;
      rec(l + 1);
    }
  };
  rec(0);
  return best_exact > -1e300 ? best_exact : best_below;
}
}  // namespace

TEST_CASE("CRAFT DP equals brute force over all per-layer replica choices") {
  profile::Rng rng(99);
  for (int it = 0; it < 200; ++it) {
    int L = 1 + rng.below(5), D = 1 << rng.below(4);
    craft::Benefit T;
    T.counts = craft::replica_counts(D);
    T.base.assign(static_cast<std::size_t>(L), 0.5);
    for (std::size_t k = 0; k < T.counts.size(); ++k) {
      T.gain.emplace_back();
      for (int l = 0; l < L; ++l) T.gain.back().push_back(rng.uniform() - 0.2);  // some negative gains
    }
    long long C = rng.below(L * D + 3);
    for (auto obj : {craft::Objective::gain, craft::Objective::paper_weighted}) {
      auto x = craft::choose_replicas(T, C, obj);
      long long used = 0;
      for (int r : x) used += r;
      CHECK(used <= C);
      INFO("L=" << L << " D=" << D << " C=" << C);
      CHECK(value(T, x, obj) == Approx(brute_force(T, C, obj)).margin(1e-12));
    }
  }
}

TEST_CASE("interleaved capacity assignment keeps memory even") {
  CHECK(craft::interleave_select({0, 1, 2, 3, 4, 5, 6, 7}, 2) == std::vector<int>{0, 7});
  CHECK(craft::interleave_select({0, 1, 2, 3, 4, 5, 6, 7}, 3) == std::vector<int>{0, 4, 7});
  CHECK(craft::interleave_select({3, 5, 9}, 3) == std::vector<int>{3, 5, 9});
  // The paper's figure-10 setting: 4 layers, 4 GPUs, replicas 2, 2, 4, 0 (R = 2).
  auto A = craft::assign_capacity(4, {2, 2, 4, 0}, 4);
  std::vector<int> per_gpu(4, 0);
  for (auto const& row : A) {
    int mn = *std::min_element(row.begin(), row.end()), mx = *std::max_element(row.begin(), row.end());
    CHECK(mx - mn <= 1);
    for (int g = 0; g < 4; ++g) per_gpu[static_cast<std::size_t>(g)] += row[static_cast<std::size_t>(g)];
  }
  CHECK(per_gpu == std::vector<int>{6, 6, 6, 6});
  CHECK(A[0] == std::vector<int>{2, 1, 1, 2});  // both ends of the tied list: one GPU per node
  CHECK(A[1] == std::vector<int>{1, 2, 2, 1});  // then the GPUs with the fewest slots so far
}

TEST_CASE("CRAFT plan is valid and matches EPLB's memory at one replica per layer per GPU") {
  int L = 6, E = 16, D = 4;
  auto m = profile::zipf_marginals(L, E, 0.3, 1.2, 5);
  profile::SampleOptions o;
  o.batches = 40;
  o.tokens_per_batch = 256;
  o.top_k = 2;
  o.seed = 8;
  auto prof = profile::sample_profile(m, o);
  // R = L: with at most D replicas per layer, L*D replicas means D in every layer.
  craft::Options opt;
  opt.replication_factor = L;
  auto plan = craft::plan(prof, D, opt);
  for (int l = 0; l < L; ++l) {
    CHECK(plan.replicas[static_cast<std::size_t>(l)] == D);
    plan.placement[static_cast<std::size_t>(l)].validate(E, D);
    plan.tables[static_cast<std::size_t>(l)].validate(E, D, plan.placement[static_cast<std::size_t>(l)].ranks());
  }
  auto eplb_r = eplb::rebalance_experts(prof.totals(), L, E, E + D, 1, 1, D);
  double eb = placement::expert_bytes(128, 64);
  auto cs = placement::replica_stats(plan.tables, D, eb);
  CHECK(cs.replicas == static_cast<long long>(L) * D);
  CHECK(cs.max_gpu_slots == L * (E / D + 1));
  CHECK(cs.min_gpu_slots == L * (E / D + 1));
  // EPLB: E + D physical slots per layer, E/D + 1 per GPU per layer.
  CHECK(eplb_r.slots_per_gpu() * L == cs.max_gpu_slots);
  long long eplb_replicas = 0;
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < E; ++e) eplb_replicas += eplb_r.logcnt(l, e) - 1;
  CHECK(eplb_replicas == cs.replicas);
  CHECK(cs.replica_bytes == Approx(static_cast<double>(eplb_replicas) * eb));
  // The automatic factor is one of the candidates, and the plan it gives is valid.
  auto autop = craft::plan(prof, D);
  CHECK(autop.replication_factor >= 1);
  CHECK(autop.replication_factor <= L);
  long long used = 0;
  for (int r : autop.replicas) used += r;
  CHECK(used <= static_cast<long long>(autop.replication_factor) * D);
}

TEST_CASE("capacity-aware greedy placement respects slots and keeps copies apart") {
  profile::Rng rng(4);
  for (int it = 0; it < 100; ++it) {
    int D = 2 + rng.below(6), E = D * (1 + rng.below(4));
    int r = rng.below(E * (D - 1) + 1);
    std::vector<double> load(static_cast<std::size_t>(E));
    for (auto& x : load) x = rng.below(100);
    auto cnt = craft::replicate(load.data(), E, r, D);
    auto slots = craft::assign_capacity(E, {r}, D)[0];
    auto where = craft::place_layer(load.data(), cnt, slots);
    std::vector<int> used(static_cast<std::size_t>(D), 0);
    for (int e = 0; e < E; ++e) {
      CHECK(static_cast<int>(where[static_cast<std::size_t>(e)].size()) == cnt[static_cast<std::size_t>(e)]);
      for (int g : where[static_cast<std::size_t>(e)]) ++used[static_cast<std::size_t>(g)];
    }
    CHECK(used == slots);
    std::vector<int> primary;
    for (auto const& w : where) primary.push_back(w.front());
    Table(where).validate(E, D, primary);
  }
  std::vector<double> ones(4, 1.0);
  CHECK_THROWS_AS(craft::replicate(ones.data(), 4, 13, 4), moe::Error);
}

TEST_CASE("balancedness and hops metrics on hand-computed cases") {
  // 2 GPUs, 1 layer, 4 experts, loads 6 2 1 1: experts 0,1 on GPU 0, experts 2,3 on GPU 1.
  profile::LoadProfile prof(1, 1, 4);
  double loads[] = {6, 2, 1, 1};
  for (int e = 0; e < 4; ++e) prof.at(0, 0, e) = loads[e];
  placement::Assignment a{1, 4, {0, 0, 1, 1}};
  auto s = placement::Shares::from_assignment(a, 2);
  CHECK(placement::balancedness(s, prof) == Approx(5.0 / 8.0));
  // Expert 0 on both GPUs: GPU loads 3+2 = 5 and 3+1+1 = 5.
  Table t({{0, 1}, {0}, {1}, {1}});
  CHECK(placement::balancedness(placement::Shares::from_tables({t}, 2), prof) == Approx(1.0));
  placement::Problem p;
  p.layers = 1;
  p.experts = 4;
  p.gpus = 2;
  p.c_layer = 2;
  p.c_exp = 2;
  p.hops = {0, 3, 3, 0};
  p.attention = {0, 1};  // dispatch on GPU 0, collect on GPU 1: every GPU costs 3
  auto h = placement::hops_per_batch(p, a, prof, 2);  // 10 assignments = 5 tokens of top-2
  CHECK(h[0] == Approx(10.0 * 3 / 5));
  p.attention = {0, 0};  // both on GPU 0: GPU 1 costs 6
  h = placement::hops_per_batch(p, a, prof, 2);
  CHECK(h[0] == Approx((0 * 8 + 6 * 2) / 5.0));
  // EPLB shares: two slots of one expert on one GPU carry two thirds of its load there.
  std::vector<double> w = {6, 2, 1, 1};
  auto r = eplb::rebalance_experts(w, 1, 4, 6, 1, 1, 2);
  auto es = placement::Shares::from_eplb(r);
  double sum = 0;
  for (auto [g, share] : es.of[0][0]) sum += share;
  CHECK(sum == Approx(1.0));
  CHECK(placement::balancedness(es, prof) > 5.0 / 8.0);
}

TEST_CASE("EPLB balanced-packing placement balances a layer") {
  std::vector<double> load = {8, 1, 1, 8, 4, 4, 2, 2};
  auto t = placement::eplb_packing(load, 1, 8, 2);
  t[0].validate(8, 2);
  double g0 = 0, g1 = 0;
  for (int e = 0; e < 8; ++e) (t[0].rank_of(e) == 0 ? g0 : g1) += load[static_cast<std::size_t>(e)];
  CHECK(g0 == g1);
  CHECK_THROWS_AS(placement::eplb_packing(load, 1, 8, 3), moe::Error);
}

TEST_CASE("CRAFT benefit estimation does not depend on the thread count") {
  auto m = profile::zipf_marginals(7, 16, 0.3, 1.0, 3);
  profile::SampleOptions o;
  o.batches = 20;
  o.tokens_per_batch = 128;
  o.top_k = 2;
  auto prof = profile::sample_profile(m, o);
  auto a = craft::estimate_benefit(prof, 4, 1), b = craft::estimate_benefit(prof, 4, 3);
  CHECK(a.base == b.base);
  CHECK(a.gain == b.gain);
  CHECK_THROWS_AS(craft::estimate_benefit(prof, 4, -1), moe::Error);
  CHECK_THROWS_AS(craft::estimate_benefit(prof, 32, 1), moe::Error);  // fewer experts than GPUs
}

TEST_CASE("CRAFT DP with a budget far above every layer's largest count equals brute force") {
  // A budget above what any selection can use (here above INT_MAX) once overflowed the DP's int
  // table size; the answer is the best selection of any total, as brute force finds it.
  profile::Rng rng(7);
  for (int it = 0; it < 20; ++it) {
    int L = 1 + rng.below(4), D = 1 << rng.below(4);
    craft::Benefit T;
    T.counts = craft::replica_counts(D);
    T.base.assign(static_cast<std::size_t>(L), 0.5);
    for (std::size_t k = 0; k < T.counts.size(); ++k) {
      T.gain.emplace_back();
      for (int l = 0; l < L; ++l) T.gain.back().push_back(rng.uniform() - 0.2);
    }
    for (long long C : {5'000'000'000LL, static_cast<long long>(L) * D, static_cast<long long>(L) * D + 1}) {
      auto x = craft::choose_replicas(T, C);
      INFO("L=" << L << " D=" << D << " C=" << C);
      CHECK(value(T, x, craft::Objective::gain) == Approx(brute_force(T, C, craft::Objective::gain)).margin(1e-12));
    }
  }
}

TEST_CASE("CRAFT replicate rejects non-finite and negative loads") {
  std::vector<double> nan_load(4, std::numeric_limits<double>::quiet_NaN());
  CHECK_THROWS_WITH(craft::replicate(nan_load.data(), 4, 2, 4), Catch::Contains("not finite"));
  std::vector<double> neg{1, -1, 2, 3};
  CHECK_THROWS_WITH(craft::replicate(neg.data(), 4, 2, 4), Catch::Contains("load -1 of expert 1"));
  std::vector<double> ok{1, 1, 2, 3};
  CHECK_THROWS_WITH(craft::replicate(ok.data(), 4, -1, 4), Catch::Contains("r >= 0"));
  // Too many replicas for max_copies (existing path, now with its message asserted).
  CHECK_THROWS_WITH(craft::replicate(ok.data(), 4, 13, 4), Catch::Contains("do not fit"));
}

TEST_CASE("CRAFT benefit estimation replays the batches: by hand and against the balancedness metric") {
  // By hand: 2 GPUs, one layer, one batch with loads 3 and 1. No replica: GPUs carry 3 and 1,
  // balancedness 2/3. One replica goes to expert 0 (3 per copy > 1): 1.5 + 1 and 1.5, so 2/2.5 = 0.8.
  // Two replicas: both experts on both GPUs, 2 and 2, balancedness 1.
  profile::LoadProfile one(1, 1, 2);
  one.at(0, 0, 0) = 3;
  one.at(0, 0, 1) = 1;
  auto T = craft::estimate_benefit(one, 2);
  REQUIRE(T.counts == std::vector<int>{1, 2});
  CHECK(T.base[0] == Approx(2.0 / 3.0));
  CHECK(T.gain[0][0] == Approx(0.8 - 2.0 / 3.0));
  CHECK(T.gain[1][0] == Approx(1.0 - 2.0 / 3.0));
  // Random profiles: each gain equals the balancedness metric (metrics.hpp, a separate replay) of
  // the same layer plan minus that of the plan without replicas.
  auto m = profile::zipf_marginals(3, 8, 0.5, 1.2, 11);
  profile::SampleOptions o;
  o.batches = 15;
  o.tokens_per_batch = 64;
  o.top_k = 2;
  auto prof = profile::sample_profile(m, o);
  int D = 4, E = 8;
  auto B = craft::estimate_benefit(prof, D);
  auto totals = prof.totals();
  auto bal = [&](int r) {
    std::vector<Table> tables;
    for (int l = 0; l < prof.layers(); ++l) {
      double const* tot = totals.data() + static_cast<std::size_t>(l) * E;
      auto cnt = craft::replicate(tot, E, r, D);
      tables.emplace_back(craft::place_layer(tot, cnt, craft::assign_capacity(E, {r}, D)[0]));
    }
    return placement::balancedness_per_layer(placement::Shares::from_tables(tables, D), prof);
  };
  auto base = bal(0);
  for (int l = 0; l < prof.layers(); ++l) CHECK(B.base[static_cast<std::size_t>(l)] == Approx(base[static_cast<std::size_t>(l)]).epsilon(1e-12));
  for (std::size_t k = 0; k < B.counts.size(); ++k) {
    auto with = bal(B.counts[k]);
    for (int l = 0; l < prof.layers(); ++l)
      CHECK(B.gain[k][static_cast<std::size_t>(l)] ==
            Approx(with[static_cast<std::size_t>(l)] - base[static_cast<std::size_t>(l)]).margin(1e-12));
  }
}
