#pragma once
// FinDEP schedule solver (paper sections 4.2-4.3, Algorithm 1) and the PPPipe baseline.
//
// Throughput = tokens of the forward pass / makespan. The solver uses the paper's structure:
//   - throughput grows with m_a for fixed r1 and with r1 for fixed m_a (Theorems 1-3), so only the
//     Pareto frontier of r1 * m_a <= M is searched: for r1 = M .. 1 take m_a = floor(M / r1) and skip
//     an r1 whose m_a equals the previous one (the larger r1 was already tried);
//     with a fixed batch B the frontier is every divisor r1 of B with m_a = B / r1;
//   - for each frontier point and each order (AASS, ASAS; one order when the model has no shared
//     experts, where both coincide) the makespan is convex in r2 (Theorem 4), so r2 is found by a
//     ternary search over the admissible values (divisors of the micro-batch's tokens up to r2_max),
//     plus r2 = 1 as a guard;
//   - every candidate is scored with the exact closed-form evaluator (evaluate.hpp), which agrees
//     with the discrete-event simulator.
// search_all() enumerates the whole discrete space (every r1, every m_a <= M / r1, every admissible
// r2, both orders) and is the reference the solver is checked against.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "moe/schedule/evaluate.hpp"
#include "moe/schedule/problem.hpp"
#include "moe/schedule/simulator.hpp"

namespace moe::schedule {

struct Solution {
  Config config;
  double makespan_us = std::numeric_limits<double>::infinity();
  double tokens = 0;          ///< tokens of one forward pass over all AG ranks
  double throughput = 0;      ///< tokens per second
  double tokens_per_expert = 0;  ///< m_e of the chosen configuration
  long long evaluations = 0;  ///< candidate configurations scored
};

/// Admissible r2 values for a micro-batch of m_a samples: divisors of m_a * seq up to r2_max.
[[nodiscard]] inline std::vector<int> r2_candidates(Problem const& p, int m_a) {
  long long tokens = static_cast<long long>(m_a) * p.seq;
  std::vector<int> out;
  for (int r2 = 1; r2 <= p.r2_max && r2 <= tokens; ++r2)
    if (tokens % r2 == 0) out.push_back(r2);
  return out;
}

/// Largest number of samples per AG rank (the batch, or what the memory holds when batch = 0) the
/// solvers search. The exhaustive passes (solve_pppipe, search_all) grow faster than M^2: M = 4096
/// takes under a second here, M = 100000 more than a minute, so a larger M is refused with an error
/// rather than left to hang (and r1, m_a must fit an int).
inline constexpr long long max_search_samples = 4096;

/// Samples per AG rank to search; throws moe::Error when above max_search_samples.
[[nodiscard]] inline long long search_samples(Problem const& p) {
  long long M = p.batch > 0 ? p.batch : max_samples(p);
  check(M <= max_search_samples, "findep solver: ", M, " samples per AG rank (",
        p.batch > 0 ? "the batch" : "what the memory limit holds", ") exceed the ", max_search_samples,
        " samples the solver searches; set Problem::batch to the samples to run or lower memory_bytes");
  return M;
}

/// (r1, m_a) pairs on the Pareto frontier, r1 descending.
[[nodiscard]] inline std::vector<std::pair<int, int>> frontier(Problem const& p) {
  (void)search_samples(p);
  std::vector<std::pair<int, int>> out;
  if (p.batch > 0) {
    for (int r1 = p.batch; r1 >= 1; --r1)
      if (p.batch % r1 == 0) out.emplace_back(r1, p.batch / r1);
    return out;
  }
  long long M = search_samples(p);
  long long prev = -1;
  for (long long r1 = M; r1 >= 1; --r1) {
    long long m_a = M / r1;
    if (m_a == prev) continue;
    prev = m_a;
    out.emplace_back(static_cast<int>(r1), static_cast<int>(m_a));
  }
  return out;
}

namespace detail_solver {
inline void consider(Solution& best, Problem const& p, Config const& c, double span) {
  double tokens = tokens_of(p, c);
  double thr = tokens / (span * 1e-6);
  // Compare throughputs; prefer fewer tasks (smaller r1 * r2) on exact ties.
  if (thr > best.throughput * (1 + 1e-12) ||
      (thr >= best.throughput * (1 - 1e-12) && static_cast<long long>(c.r1) * c.r2 <
                                                  static_cast<long long>(best.config.r1) * best.config.r2)) {
    best.config = c;
    best.makespan_us = span;
    best.tokens = tokens;
    best.throughput = thr;
  }
}
}  // namespace detail_solver

/// FinDEP: order, r1, m_a and r2 maximising throughput (Algorithm 1 with the closed-form evaluator).
[[nodiscard]] inline Solution solve_findep(Problem const& p, PerfModels const& m) {
  validate(p);
  m.validate();
  int L = layers_of(p);
  Solution best;
  FastEvaluator eval;
  std::vector<Order> orders{Order::asas};
  if (p.shape.shared_experts > 0) orders.push_back(Order::aass);
  std::vector<double> memo;
  for (auto const& point : frontier(p)) {
    int const r1 = point.first, m_a = point.second;  // not a structured binding: clang < 16 cannot capture one
    std::vector<int> r2s = r2_candidates(p, m_a);
    for (Order o : orders) {
      memo.assign(r2s.size(), -1.0);
      auto f = [&](std::size_t idx) {
        if (memo[idx] < 0) {
          Config c{Pipeline::findep, o, r1, m_a, r2s[idx]};
          memo[idx] = eval(stage_times(p, m, c), c, L);
          ++best.evaluations;
          detail_solver::consider(best, p, c, memo[idx]);
        }
        return memo[idx];
      };
      std::size_t lo = 0, hi = r2s.size() - 1;
      while (hi - lo > 2) {
        std::size_t m1 = lo + (hi - lo) / 3, m2 = hi - (hi - lo) / 3;
        double f1 = f(m1), f2 = f(m2);
        if (f1 < f2)
          hi = m2 - 1;
        else if (f1 > f2)
          lo = m1 + 1;
        else {
          lo = m1;
          hi = m2;
        }
      }
      for (std::size_t i = lo; i <= hi; ++i) f(i);
      f(0);
    }
  }
  best.tokens_per_expert = stage_times(p, m, best.config).tokens_per_expert;
  return best;
}

/// Best PPPipe configuration: every r1 and every m_a with r1 * m_a <= M (or = batch), r2 = 1.
[[nodiscard]] inline Solution solve_pppipe(Problem const& p, PerfModels const& m) {
  validate(p);
  m.validate();
  int L = layers_of(p);
  Solution best;
  FastEvaluator eval;
  long long M = search_samples(p);
  for (long long r1 = 1; r1 <= M; ++r1)
    for (long long m_a = M / r1; m_a >= 1; --m_a) {
      if (p.batch > 0 && r1 * m_a != p.batch) continue;
      Config c{Pipeline::pppipe, Order::asas, static_cast<int>(r1), static_cast<int>(m_a), 1};
      double span = eval(stage_times(p, m, c), c, L);
      ++best.evaluations;
      detail_solver::consider(best, p, c, span);
    }
  best.tokens_per_expert = stage_times(p, m, best.config).tokens_per_expert;
  return best;
}

/// How search_all scores a candidate.
enum class Scorer { closed_form, simulator };

/// Exhaustive search over the whole discrete space of a pipeline kind: every r1, every
/// m_a <= M / r1 (or r1 * m_a = batch), every admissible r2 (FinDEP) and both orders.
/// `layers` = 0 takes the problem's.
[[nodiscard]] inline Solution search_all(Problem const& p, PerfModels const& m, Pipeline kind,
                                         Scorer scorer = Scorer::simulator, int layers = 0) {
  validate(p);
  m.validate();
  int L = layers > 0 ? layers : layers_of(p);
  Solution best;
  FastEvaluator eval;
  long long M = search_samples(p);
  std::vector<Order> orders{Order::asas};
  if (kind == Pipeline::findep && p.shape.shared_experts > 0) orders.push_back(Order::aass);
  for (long long r1 = 1; r1 <= M; ++r1)
    for (long long m_a = 1; r1 * m_a <= M; ++m_a) {
      if (p.batch > 0 && r1 * m_a != p.batch) continue;
      std::vector<int> r2s = kind == Pipeline::findep ? r2_candidates(p, static_cast<int>(m_a)) : std::vector<int>{1};
      for (Order o : orders)
        for (int r2 : r2s) {
          Config c{kind, o, static_cast<int>(r1), static_cast<int>(m_a), r2};
          StageTimes t = stage_times(p, m, c);
          double span;
          if (scorer == Scorer::simulator) {
            TaskGraph g = build_tasks(t, c, L);
            span = simulate(g).makespan;
          } else {
            span = eval(t, c, L);
          }
          ++best.evaluations;
          detail_solver::consider(best, p, c, span);
        }
    }
  best.tokens_per_expert = stage_times(p, m, best.config).tokens_per_expert;
  return best;
}

}  // namespace moe::schedule
