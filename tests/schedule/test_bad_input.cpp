// Bad-input paths of the schedule headers that had no test of their own: each asserts a moe::Error
// whose message names the problem.
#include <catch2/catch.hpp>

#include <limits>
#include <sstream>

#include "moe/models/models.hpp"
#include "moe/schedule/solver.hpp"

using namespace moe::schedule;
using Catch::Contains;

namespace {
Problem small(int samples) {
  Problem p;
  p.shape = moe::models::DeepSeekV2::spec;
  p.ag = 2;
  p.eg = 2;
  p.seq = 1024;
  p.layers = 2;
  p.bytes_per_token = default_bytes_per_token(p.shape);
  p.memory_bytes = (samples + 0.5) * p.seq * p.bytes_per_token;  // room for exactly `samples` samples
  return p;
}
}  // namespace

TEST_CASE("simulator checks tasks filled in directly, not only through add()", "[schedule][bad-input]") {
  TaskGraph g;
  Task t;
  t.duration = 1;
  t.deps = {5};  // no task 5: read past the dependents array before the fix
  g.tasks.push_back(t);
  g.order[0] = {0};
  CHECK_THROWS_WITH(simulate(g), Contains("task 0 depends on unknown task 5"));
  g.tasks[0].deps = {};
  g.tasks[0].duration = std::numeric_limits<double>::quiet_NaN();  // gave a makespan of 0 before
  CHECK_THROWS_WITH(simulate(g), Contains("task 0 has duration nan"));
  g.tasks[0].duration = 1;
  g.order[0] = {};
  CHECK_THROWS_WITH(simulate(g), Contains("task 0 is on no resource"));
  g.order[0] = {0, 0};
  CHECK_THROWS_WITH(simulate(g), Contains("missing or listed twice"));
  StageTimes st{};
  CHECK_THROWS_WITH(build_tasks(st, Config{}, 0), Contains("layers must be at least 1, got 0"));
  CHECK_THROWS_WITH(build_tasks(st, Config{Pipeline::findep, Order::asas, 1, 1, 0}, 1),
                    Contains("r1 and r2 must be at least 1, got 1 and 0"));
  CHECK_THROWS_WITH(build_tasks(st, Config{Pipeline::pppipe, Order::asas, 1, 1, 2}, 1),
                    Contains("PPPipe has no token chunks"));
}

TEST_CASE("solvers refuse a search space too large to finish instead of hanging", "[schedule][bad-input]") {
  PerfModels m = h100_cluster_reference();
  // Room for 100000 samples per AG rank: solve_pppipe / search_all ran for minutes before.
  Problem p = small(100000);
  CHECK_THROWS_WITH(solve_findep(p, m), Contains("100000 samples per AG rank (what the memory limit holds) exceed the 4096"));
  CHECK_THROWS_WITH(solve_pppipe(p, m), Contains("exceed the 4096"));
  CHECK_THROWS_WITH(search_all(p, m, Pipeline::findep, Scorer::closed_form), Contains("exceed the 4096"));
  CHECK_THROWS_WITH(frontier(p), Contains("exceed the 4096"));
  // A memory limit far beyond a long long of samples (converting it was undefined behaviour).
  p.memory_bytes = 1e300;
  CHECK(max_samples(p) == std::numeric_limits<long long>::max());
  CHECK_THROWS_WITH(solve_findep(p, m), Contains("exceed the 4096"));
  // With a batch the memory limit does not bound the search; the batch does.
  p.batch = 5000;
  CHECK_THROWS_WITH(solve_pppipe(p, m), Contains("5000 samples per AG rank (the batch) exceed the 4096"));
  // An ordinary problem still solves (and agrees with the exhaustive closed-form search).
  Problem q = small(8);
  q.batch = 0;
  Solution f = solve_findep(q, m), ex = search_all(q, m, Pipeline::findep, Scorer::closed_form);
  CHECK(f.throughput >= 0.98 * ex.throughput);
}

TEST_CASE("problem, configuration and perf-model checks name the bad field", "[schedule][bad-input]") {
  PerfModels m = h100_cluster_reference();
  Problem p = small(8);
  REQUIRE_NOTHROW(validate(p));
  Problem q = p;
  q.layers = -1;
  CHECK_THROWS_WITH(validate(q), Contains("layers must not be negative, got -1"));
  q = p;
  q.r2_max = 0;
  CHECK_THROWS_WITH(validate(q), Contains("r2_max must be at least 1, got 0"));
  q = p;
  q.bytes_per_token = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(validate(q), Contains("bytes per token must be finite and non-negative"));
  q = p;
  q.memory_bytes = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(validate(q), Contains("memory limit must be positive"));
  q = p;
  q.batch = -2;
  CHECK_THROWS_WITH(validate(q), Contains("batch must not be negative, got -2"));
  q = p;
  q.layers = 0;
  q.shape.moe_layers = 0;
  CHECK_THROWS_WITH(validate(q), Contains("no MoE layers to schedule"));
  CHECK_THROWS_WITH(split_batch(p, 0, 1, 1, Order::asas), Contains("batch must be at least 1 sample, got 0"));
  CHECK_THROWS_WITH(validate(p, Config{Pipeline::findep, Order::asas, 1, 0, 1}), Contains("micro-batch size m_a must be at least 1 sample, got 0"));
  CHECK_THROWS_WITH(validate(p, Config{Pipeline::findep, Order::asas, 1, 1, 0}), Contains("r2 (token chunks) must be at least 1, got 0"));
  q = p;
  q.batch = 4;
  CHECK_THROWS_WITH(validate(q, Config{Pipeline::findep, Order::asas, 1, 2, 1}), Contains("does not match the batch of 4"));
  CHECK_THROWS_WITH(r_squared(Linear{}, {}), Contains("no samples to compute R^2 on"));
  CHECK_THROWS_WITH(fit_linear({{1, 2}, {std::numeric_limits<double>::quiet_NaN(), 3}}, "gemm"),
                    Contains("perf model 'gemm': sample (work nan"));
  PerfModels bad = m;
  bad[Op::gemm].alpha = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH(solve_findep(p, bad), Contains("perf model 'gemm': alpha inf us must be finite"));
  CHECK_THROWS_WITH(write_models(std::string("/nonexistent/dir/models.tsv"), m), Contains("cannot open '/nonexistent/dir/models.tsv' for writing"));
}
