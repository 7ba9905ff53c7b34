// Solver and closed-form evaluator: the evaluator agrees with the discrete-event simulator; the
// solver's choice equals the best of an exhaustive search in the simulator and is never below the best
// PPPipe configuration; bad inputs give clear errors.
#include <catch2/catch.hpp>

#include <random>
#include <string>

#include "moe/models/models.hpp"
#include "moe/schedule/solver.hpp"

using namespace moe::schedule;

namespace {
Problem make_problem(moe::ShapeSpec const& s, int ag, int eg, int seq, int samples, int layers) {
  Problem p;
  p.shape = s;
  p.ag = ag;
  p.eg = eg;
  p.seq = seq;
  p.layers = layers;
  p.bytes_per_token = default_bytes_per_token(s);
  p.memory_bytes = (samples + 0.5) * seq * p.bytes_per_token;  // room for exactly `samples` samples
  return p;
}
}  // namespace

TEST_CASE("closed-form evaluator equals the event simulator", "[schedule][solver]") {
  std::mt19937 rng(2026);
  PerfModels m = h100_cluster_reference();
  moe::ShapeSpec shapes[] = {moe::models::DeepSeekV2::spec, moe::models::Qwen3_235B_A22B::spec};
  for (int trial = 0; trial < 60; ++trial) {
    moe::ShapeSpec const& s = shapes[trial % 2];
    int seq = 256 << (trial % 4);
    int ag = 1 + static_cast<int>(rng() % 6), eg = 1 + static_cast<int>(rng() % 6);
    int layers = 1 + static_cast<int>(rng() % 12);
    if (trial % 10 == 0) layers = 59;  // long enough for the periodic extrapolation
    Problem p = make_problem(s, ag, eg, seq, 12, layers);
    Config c;
    c.pipeline = trial % 3 == 0 ? Pipeline::pppipe : Pipeline::findep;
    c.order = trial % 2 ? Order::aass : Order::asas;
    c.r1 = 1 + static_cast<int>(rng() % 6);
    c.m_a = 1 + static_cast<int>(rng() % 2);
    c.r2 = c.pipeline == Pipeline::pppipe ? 1 : 1 << (rng() % 5);
    double simulated = simulate(p, m, c).makespan;
    double closed = makespan(p, m, c);
    INFO("trial " << trial << " r1 " << c.r1 << " m_a " << c.m_a << " r2 " << c.r2 << " layers " << layers);
    CHECK(closed == Approx(simulated).epsilon(1e-9));
  }
}

TEST_CASE("solver equals exhaustive simulation and is never below the best PPPipe",
          "[schedule][solver]") {
  PerfModels m = h100_cluster_reference();
  struct Split { int ag, eg; };
  int checked = 0;
  for (moe::ShapeSpec const& s : {moe::models::DeepSeekV2::spec, moe::models::Qwen3_235B_A22B::spec})
    for (int seq : {1024, 4096})
      for (Split split : {Split{4, 4}, Split{6, 2}, Split{2, 6}})
        for (int samples : {3, 8}) {
          Problem p = make_problem(s, split.ag, split.eg, seq, samples, 3);
          p.r2_max = 32;
          Solution sol = solve_findep(p, m);
          Solution best = search_all(p, m, Pipeline::findep, Scorer::simulator);
          Solution pp = search_all(p, m, Pipeline::pppipe, Scorer::simulator);
          // The solver's own score must be the simulator's makespan of its configuration.
          CHECK(sol.makespan_us == Approx(simulate(p, m, sol.config).makespan).epsilon(1e-9));
          INFO("seq " << seq << " ag " << split.ag << " eg " << split.eg << " M " << samples);
          CHECK(sol.throughput >= best.throughput * (1 - 1e-12));  // equal: docs/findep.md says the choice equals the exhaustive best
          CHECK(sol.throughput >= pp.throughput * (1 - 1e-12));
          CHECK(best.throughput >= sol.throughput * (1 - 1e-12));  // exhaustive really is the best
          CHECK(sol.evaluations < best.evaluations);
          ++checked;
        }
  CHECK(checked == 24);
}

TEST_CASE("with the host-fitted models the solver still matches exhaustive simulation", "[schedule][solver]") {
  // The model file measured on the host by findep_fit_host (tools/schedule/data).
  PerfModels m = read_models(std::string(MOE_SCHEDULE_DATA_DIR) + "/host_models_2026-11-21.tsv");
  REQUIRE_NOTHROW(m.validate());
  for (moe::ShapeSpec const& s : {moe::models::DeepSeekV2::spec, moe::models::Qwen3_235B_A22B::spec})
    for (int seq : {1024, 8192})
      for (int ag : {2, 6}) {
        Problem p = make_problem(s, ag, 8 - ag, seq, 4, 2);
        p.r2_max = 16;
        Solution sol = solve_findep(p, m);
        Solution best = search_all(p, m, Pipeline::findep, Scorer::simulator);
        Solution pp = search_all(p, m, Pipeline::pppipe, Scorer::simulator);
        INFO("seq " << seq << " ag " << ag);
        CHECK(sol.throughput >= best.throughput * (1 - 1e-12));  // equal to the exhaustive best
        CHECK(sol.throughput >= pp.throughput * (1 - 1e-12));
      }
}

TEST_CASE("a fixed batch is split over divisors only", "[schedule][solver]") {
  PerfModels m = h100_cluster_reference();
  Problem p = make_problem(moe::models::DeepSeekV2::spec, 4, 4, 2048, 16, 4);
  p.batch = 6;
  Solution sol = solve_findep(p, m);
  CHECK(6 % sol.config.r1 == 0);
  CHECK(sol.config.r1 * sol.config.m_a == 6);
  Solution best = search_all(p, m, Pipeline::findep, Scorer::simulator);
  CHECK(sol.throughput >= 0.98 * best.throughput);
}

TEST_CASE("bad input gives clear errors", "[schedule][solver][bad-input]") {
  PerfModels m = h100_cluster_reference();
  Problem good = make_problem(moe::models::DeepSeekV2::spec, 4, 4, 1024, 8, 2);
  REQUIRE_NOTHROW(validate(good));

  SECTION("r1 that does not divide the batch") {
    CHECK_THROWS_WITH(split_batch(good, 8, 3, 1, Order::aass), Catch::Contains("r1 = 3 does not divide the batch of 8"));
  }
  SECTION("r2 that does not divide the tokens of a micro-batch") {
    CHECK_THROWS_WITH(split_batch(good, 8, 4, 3, Order::aass),
                      Catch::Contains("r2 = 3 does not divide the 2048 tokens"));
    CHECK_THROWS_WITH(makespan(good, m, Config{Pipeline::findep, Order::asas, 1, 1, 7}),
                      Catch::Contains("r2 = 7 does not divide"));
  }
  SECTION("memory too small for one micro-batch") {
    Problem p = good;
    p.memory_bytes = 0.5 * p.seq * p.bytes_per_token;
    CHECK_THROWS_WITH(solve_findep(p, m), Catch::Contains("too small for one micro-batch"));
    CHECK_THROWS_WITH(solve_pppipe(p, m), Catch::Contains("too small for one micro-batch"));
  }
  SECTION("micro-batches above the memory limit") {
    CHECK_THROWS_WITH(makespan(good, m, Config{Pipeline::findep, Order::asas, 3, 3, 1}),
                      Catch::Contains("exceed the memory limit of 8 samples"));
    Problem p = good;
    p.batch = 9;
    CHECK_THROWS_WITH(solve_findep(p, m), Catch::Contains("above the memory limit"));
  }
  SECTION("empty attention group") {
    Problem p = good;
    p.ag = 0;
    CHECK_THROWS_WITH(solve_findep(p, m), Catch::Contains("attention group (AG) is empty"));
  }
  SECTION("empty expert group") {
    Problem p = good;
    p.eg = 0;
    CHECK_THROWS_WITH(solve_findep(p, m), Catch::Contains("expert group (EG) is empty"));
  }
  SECTION("expert group larger than the experts") {
    Problem p = good;
    p.eg = 161;
    CHECK_THROWS_WITH(solve_findep(p, m), Catch::Contains("larger than the 160 routed experts"));
  }
  SECTION("PPPipe with token chunks") {
    CHECK_THROWS_WITH(makespan(good, m, Config{Pipeline::pppipe, Order::asas, 1, 1, 2}),
                      Catch::Contains("PPPipe has no token chunks"));
  }
  SECTION("non-positive sequence and micro-batch") {
    Problem p = good;
    p.seq = 0;
    CHECK_THROWS_WITH(validate(p), Catch::Contains("sequence length must be positive"));
    CHECK_THROWS_WITH(makespan(good, m, Config{Pipeline::findep, Order::asas, 0, 1, 1}),
                      Catch::Contains("r1 (micro-batches) must be at least 1"));
  }
}
