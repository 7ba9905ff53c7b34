// Discrete-event simulator and closed-form evaluator against independent references:
// textbook flow-shop makespans and timelines worked out by hand.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "moe/schedule/evaluate.hpp"
#include "moe/schedule/simulator.hpp"

using namespace moe::schedule;

namespace {
StageTimes times(double a, double s, double d, double e, double c) {
  StageTimes t;
  t.attention = a;
  t.shared = s;
  t.has_shared = s > 0;
  t.a2e = d;
  t.experts = e;
  t.e2a = c;
  return t;
}
double sim(StageTimes const& t, Config const& c, int layers) {
  TaskGraph g = build_tasks(t, c, layers);
  return simulate(g).makespan;
}
double fast(StageTimes const& t, Config const& c, int layers) {
  FastEvaluator f;
  return f(t, c, layers);
}
Task const& find(TaskGraph const& g, TaskKind k, int layer, int mb, int chunk = 0) {
  for (auto const& t : g.tasks)
    if (t.kind == k && t.layer == layer && t.mb == mb && t.chunk == chunk) return t;
  FAIL("task not found");
  return g.tasks.front();
}
}  // namespace

TEST_CASE("one layer of identical micro-batches is a flow shop: sum + (n-1) * bottleneck",
          "[schedule][sim]") {
  // Permutation flow shop with n identical jobs on 4 machines in series:
  // makespan = (a + d + e + c) + (n - 1) * max(a, d, e, c).
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.5, 10.0);
  for (int trial = 0; trial < 50; ++trial) {
    double a = u(rng), d = u(rng), e = u(rng), c = u(rng);
    int r1 = 1 + trial % 7;
    Config cfg{Pipeline::findep, Order::asas, r1, 1, 1};
    double expect = a + d + e + c + (r1 - 1) * std::max({a, d, e, c});
    CHECK(sim(times(a, 0, d, e, c), cfg, 1) == Approx(expect));
    CHECK(fast(times(a, 0, d, e, c), cfg, 1) == Approx(expect));
  }
}

TEST_CASE("token chunks of one micro-batch form a three-stage flow shop after attention", "[schedule][sim]") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0.5, 10.0);
  for (int trial = 0; trial < 50; ++trial) {
    double a = u(rng), d = u(rng), e = u(rng), c = u(rng);
    int r2 = 1 + trial % 9;
    Config cfg{Pipeline::findep, Order::aass, 1, 1, r2};
    double expect = a + d + e + c + (r2 - 1) * std::max({d, e, c});
    CHECK(sim(times(a, 0, d, e, c), cfg, 1) == Approx(expect));
    CHECK(fast(times(a, 0, d, e, c), cfg, 1) == Approx(expect));
  }
}

TEST_CASE("without pipelining, layers run back to back", "[schedule][sim]") {
  // r1 = r2 = 1. FinDEP overlaps the shared expert with A2E -> experts -> E2A:
  // layer = a + max(s, d + e + c). PPPipe runs it before A2E: layer = a + s + d + e + c.
  double a = 3, s = 2.5, d = 1, e = 4, c = 1.5;
  for (int L : {1, 2, 5, 13}) {
    Config f{Pipeline::findep, Order::asas, 1, 1, 1};
    Config p{Pipeline::pppipe, Order::asas, 1, 1, 1};
    CHECK(sim(times(a, s, d, e, c), f, L) == Approx(L * (a + std::max(s, d + e + c))));
    CHECK(fast(times(a, s, d, e, c), f, L) == Approx(L * (a + std::max(s, d + e + c))));
    CHECK(sim(times(a, s, d, e, c), p, L) == Approx(L * (a + s + d + e + c)));
    CHECK(fast(times(a, s, d, e, c), p, L) == Approx(L * (a + s + d + e + c)));
    // A shared expert longer than the whole expert round trip dominates.
    CHECK(sim(times(a, 9, d, e, c), f, L) == Approx(L * (a + 9)));
  }
}

TEST_CASE("hand-computed timelines: AASS, ASAS and PPPipe with two micro-batches", "[schedule][sim]") {
  // a = 2, s = 3, d = 1, e = 4, c = 1, r1 = 2, r2 = 1 (worked out by hand):
  // AASS : AG A0[0,2] A1[2,4] S0[4,7] S1[7,10]; D0[2,3] D1[4,5]; E0[3,7] E1[7,11]; C0[7,8] C1[11,12]
  // ASAS : AG A0[0,2] S0[2,5] A1[5,7] S1[7,10]; D0[2,3] D1[7,8]; E0[3,7] E1[8,12]; C0[7,8] C1[12,13]
  // PPPipe: AG as ASAS; D0[5,6] D1[10,11]; E0[6,10] E1[11,15]; C0[10,11] C1[15,16]
  StageTimes t = times(2, 3, 1, 4, 1);
  SECTION("AASS") {
    TaskGraph g = build_tasks(t, Config{Pipeline::findep, Order::aass, 2, 1, 1}, 1);
    CHECK(simulate(g).makespan == 12);
    CHECK(find(g, TaskKind::shared, 0, 0).start == 4);
    CHECK(find(g, TaskKind::a2e, 0, 1).start == 4);
    CHECK(find(g, TaskKind::experts, 0, 1).start == 7);
    CHECK(find(g, TaskKind::e2a, 0, 1).end == 12);
    CHECK(fast(t, Config{Pipeline::findep, Order::aass, 2, 1, 1}, 1) == 12);
  }
  SECTION("ASAS") {
    TaskGraph g = build_tasks(t, Config{Pipeline::findep, Order::asas, 2, 1, 1}, 1);
    CHECK(simulate(g).makespan == 13);
    CHECK(find(g, TaskKind::attention, 0, 1).start == 5);
    CHECK(find(g, TaskKind::a2e, 0, 1).start == 7);
    CHECK(find(g, TaskKind::experts, 0, 1).start == 8);
    CHECK(fast(t, Config{Pipeline::findep, Order::asas, 2, 1, 1}, 1) == 13);
  }
  SECTION("PPPipe") {
    TaskGraph g = build_tasks(t, Config{Pipeline::pppipe, Order::aass, 2, 1, 1}, 1);
    SimResult r = simulate(g);
    CHECK(r.makespan == 16);
    CHECK(find(g, TaskKind::a2e, 0, 0).start == 5);
    CHECK(find(g, TaskKind::experts, 0, 1).start == 11);
    CHECK(r.busy[static_cast<int>(Resource::ag)] == 10);
    CHECK(r.busy[static_cast<int>(Resource::eg)] == 8);
    CHECK(fast(t, Config{Pipeline::pppipe, Order::asas, 2, 1, 1}, 1) == 16);
  }
  SECTION("AASS, two layers") {
    // Layer 1: A0'[10,12] (AG free at 10; E2A0 at 8, S0 at 7) A1'[12,14] S0'[14,17] S1'[17,20];
    // D0'[12,13] D1'[14,15]; E0'[13,17] E1'[17,21]; C0'[17,18] C1'[21,22].
    TaskGraph g = build_tasks(t, Config{Pipeline::findep, Order::aass, 2, 1, 1}, 2);
    CHECK(simulate(g).makespan == 22);
    CHECK(find(g, TaskKind::attention, 1, 0).start == 10);
    CHECK(find(g, TaskKind::experts, 1, 0).start == 13);
    CHECK(find(g, TaskKind::experts, 1, 1).end == 21);
    CHECK(fast(t, Config{Pipeline::findep, Order::aass, 2, 1, 1}, 2) == 22);
  }
}

TEST_CASE("simulator respects resources and dependencies on random schedules", "[schedule][sim]") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0.1, 5.0);
  for (int trial = 0; trial < 30; ++trial) {
    StageTimes t = times(u(rng), trial % 3 == 0 ? 0.0 : u(rng), u(rng), u(rng), u(rng));
    Config c{trial % 2 ? Pipeline::findep : Pipeline::pppipe, trial % 4 < 2 ? Order::aass : Order::asas,
             1 + trial % 5, 1, trial % 2 ? 1 + trial % 4 : 1};
    TaskGraph g = build_tasks(t, c, 1 + trial % 3);
    SimResult r = simulate(g);
    for (auto const& task : g.tasks) {
      CHECK(task.end == Approx(task.start + task.duration));
      for (int d : task.deps) CHECK(task.start >= g.tasks[static_cast<std::size_t>(d)].end - 1e-9);
    }
    for (auto const& o : g.order)
      for (std::size_t i = 1; i < o.size(); ++i)
        CHECK(g.tasks[static_cast<std::size_t>(o[i])].start >= g.tasks[static_cast<std::size_t>(o[i - 1])].end - 1e-9);
    // Lower bound: no resource can finish before its own busy time.
    for (double b : r.busy) CHECK(r.makespan >= b - 1e-9);
  }
}

TEST_CASE("simulator reports a deadlocking resource order", "[schedule][sim][bad-input]") {
  TaskGraph g;
  int a = g.add(TaskKind::attention, Resource::ag, 1.0);
  int d = g.add(TaskKind::a2e, Resource::a2e, 1.0, {a});
  g.add(TaskKind::attention, Resource::ag, 1.0, {d}, 0, 1);
  // Put the dependent attention first on the AG: it waits for D, which waits for the first A.
  std::swap(g.order[0][0], g.order[0][1]);
  CHECK_THROWS_WITH(simulate(g), Catch::Contains("deadlocks"));
  CHECK_THROWS_WITH(g.add(TaskKind::experts, Resource::eg, 1.0, {42}), Catch::Contains("unknown task"));
  CHECK_THROWS_WITH(g.add(TaskKind::experts, Resource::eg, -1.0), Catch::Contains("non-negative"));
}
