#pragma once
// CRAFT: cost-aware expert replication (craft-replication paper, section 4 and Appendix A).
//
//  1. estimate_benefit (Algorithm 1): for each replica count r in {1, 2, 4, ..., D} (and 0, the
//     placement-only baseline) every layer gets r extra copies (to the experts with the largest
//     load per copy, as in EPLB's replicate_experts) placed by the capacity-aware greedy below;
//     every profiled batch is replayed and the per-layer balancedness (mean / max GPU load) is
//     averaged. T[r][l] = balancedness with r replicas - balancedness with none.
//  2. choose_replicas (Algorithm 2): a multiple-choice knapsack solved by dynamic programming -
//     one replica count per layer from {0} + R, using exactly C = R_factor * D replicas, maximising
//     the sum of the layers' gains. (The paper's pseudo-code weighs a choice by r * T[r][l];
//     Objective::paper_weighted selects that variant.) When exactly C cannot be reached, the best
//     selection with fewer replicas is returned.
//  3. auto_replication_factor: R (replicas per GPU) from {1, 2, 4, ..., L} with the highest
//     balancedness gain per replica.
//  4. assign_capacity (Algorithm 3): per layer and GPU the number of expert slots - the layer's
//     copies spread evenly, and the remainder given to the GPUs with the fewest slots so far,
//     ties broken by evenly spaced picks (interleaving nodes).
//  5. place_layer: capacity-aware greedy placement - copies by load per copy, heaviest first, each
//     to the least-loaded GPU with a free slot that does not hold the expert yet.

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <numeric>
#include <thread>
#include <vector>

#include "moe/config.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/plan/replica_table.hpp"

namespace moe::replication::craft {

/// k indices of `ordered` as evenly spaced as possible, both ends included when k > 1.
inline std::vector<int> interleave_select(std::vector<int> const& ordered, int k) {
  int n = static_cast<int>(ordered.size());
  check(k >= 0 && k <= n, "interleave_select: cannot pick ", k, " of ", n);
  std::vector<int> out;
  if (k == 0) return out;
  if (k == 1) return {ordered.front()};
  for (int i = 0; i < k; ++i) {
    long long num = static_cast<long long>(i) * (n - 1);
    int idx = static_cast<int>((2 * num + (k - 1)) / (2 * (k - 1)));  // round(i * (n-1) / (k-1))
    out.push_back(ordered[static_cast<std::size_t>(idx)]);
  }
  return out;
}

/// Algorithm 3 applied to each layer's total copies (experts + replicas): returns slots[l][g].
/// With experts divisible by the GPU count this is exactly the paper's replica assignment.
inline std::vector<std::vector<int>> assign_capacity(int experts, std::vector<int> const& replicas, int gpus) {
  check(gpus > 0 && experts > 0, "craft assign_capacity: experts and gpus must be positive");
  int L = static_cast<int>(replicas.size());
  std::vector<std::vector<int>> A(static_cast<std::size_t>(L), std::vector<int>(static_cast<std::size_t>(gpus)));
  std::vector<long long> G(static_cast<std::size_t>(gpus), 0);
  for (int l = 0; l < L; ++l) {
    check(replicas[static_cast<std::size_t>(l)] >= 0, "craft: negative replica count for layer ", l);
    int n = experts + replicas[static_cast<std::size_t>(l)];
    for (int g = 0; g < gpus; ++g) {
      A[static_cast<std::size_t>(l)][static_cast<std::size_t>(g)] = n / gpus;
      G[static_cast<std::size_t>(g)] += n / gpus;
    }
  }
  for (int l = 0; l < L; ++l) {
    int r = (experts + replicas[static_cast<std::size_t>(l)]) % gpus;
    if (r == 0) continue;
    std::vector<long long> sorted = G;
    std::nth_element(sorted.begin(), sorted.begin() + (r - 1), sorted.end());
    long long cutoff = sorted[static_cast<std::size_t>(r) - 1];
    std::vector<int> chosen, tied;
    for (int g = 0; g < gpus; ++g) {
      if (G[static_cast<std::size_t>(g)] < cutoff) chosen.push_back(g);
      else if (G[static_cast<std::size_t>(g)] == cutoff) tied.push_back(g);
    }
    auto extra = interleave_select(tied, r - static_cast<int>(chosen.size()));
    chosen.insert(chosen.end(), extra.begin(), extra.end());
    for (int g : chosen) {
      ++A[static_cast<std::size_t>(l)][static_cast<std::size_t>(g)];
      ++G[static_cast<std::size_t>(g)];
    }
  }
  return A;
}

/// Copies per expert after `r` extra copies, each to the expert with the largest load per copy
/// (first of equals), never more than `max_copies` copies of one expert.
inline std::vector<int> replicate(double const* load, int experts, int r, int max_copies) {
  check(static_cast<long long>(experts) * max_copies >= static_cast<long long>(experts) + r, "craft: ", r,
        " replicas do not fit with at most ", max_copies, " copies of each of ", experts, " experts");
  check(experts > 0 && r >= 0, "craft: replicate needs experts > 0 and r >= 0, got ", experts, " and ", r);
  for (int e = 0; e < experts; ++e)
    check(std::isfinite(load[e]) && load[e] >= 0, "craft: load ", load[e], " of expert ", e,
          " is negative or not finite");
  std::vector<int> cnt(static_cast<std::size_t>(experts), 1);
  for (int i = 0; i < r; ++i) {
    int best = -1;
    double bv = -1;
    for (int e = 0; e < experts; ++e) {
      if (cnt[static_cast<std::size_t>(e)] >= max_copies) continue;
      double v = load[e] / cnt[static_cast<std::size_t>(e)];
      if (v > bv) bv = v, best = e;
    }
    ++cnt[static_cast<std::size_t>(best)];
  }
  return cnt;
}

/// Capacity-aware greedy placement of one layer: copies sorted by load per copy (heaviest first,
/// ties by expert id), each to the least-loaded GPU with a free slot that holds no copy of the
/// expert yet. Returns per expert the GPUs of its copies (the first is the primary).
inline std::vector<std::vector<int>> place_layer(double const* load, std::vector<int> const& copies,
                                                 std::vector<int> const& slots) {
  int E = static_cast<int>(copies.size()), D = static_cast<int>(slots.size());
  long long total_slots = 0, total_copies = 0;
  for (int s : slots) total_slots += s;
  for (int c : copies) {
    check(c >= 1 && c <= D, "craft placement: an expert has ", c, " copies, needs 1..", D);
    total_copies += c;
  }
  check(total_slots == total_copies, "craft placement: ", total_copies, " copies for ", total_slots, " slots");
  std::vector<std::pair<double, int>> order;  // (load per copy, expert), one entry per copy
  for (int e = 0; e < E; ++e)
    for (int c = 0; c < copies[static_cast<std::size_t>(e)]; ++c) order.emplace_back(load[e] / copies[static_cast<std::size_t>(e)], e);
  std::stable_sort(order.begin(), order.end(), [](auto const& a, auto const& b) { return a.first > b.first; });
  std::vector<double> gl(static_cast<std::size_t>(D), 0.0);
  std::vector<int> left = slots;
  std::vector<std::vector<int>> where(static_cast<std::size_t>(E));
  std::vector<std::vector<int>> held(static_cast<std::size_t>(D));  // experts on each GPU
  auto holds = [&](int g, int e) {
    auto const& w = where[static_cast<std::size_t>(e)];
    return std::find(w.begin(), w.end(), g) != w.end();
  };
  for (auto [w, e] : order) {
    int best = -1;
    for (int g = 0; g < D; ++g)
      if (left[static_cast<std::size_t>(g)] > 0 && !holds(g, e) &&
          (best < 0 || gl[static_cast<std::size_t>(g)] < gl[static_cast<std::size_t>(best)]))
        best = g;
    if (best < 0) {
      // Every GPU with a free slot already holds e: move some expert x from a full GPU g without
      // e to such a GPU h that lacks x, then put e on g.
      int h = -1;
      for (int g = 0; g < D && h < 0; ++g)
        if (left[static_cast<std::size_t>(g)] > 0) h = g;
      bool done = false;
      for (int g = 0; g < D && !done; ++g) {
        if (g == h || holds(g, e)) continue;
        auto& hg = held[static_cast<std::size_t>(g)];
        for (std::size_t i = 0; i < hg.size() && !done; ++i) {
          int x = hg[i];
          if (holds(h, x)) continue;
          double wx = load[x] / copies[static_cast<std::size_t>(x)];
          std::replace(where[static_cast<std::size_t>(x)].begin(), where[static_cast<std::size_t>(x)].end(), g, h);
          held[static_cast<std::size_t>(h)].push_back(x);
          gl[static_cast<std::size_t>(h)] += wx;
          --left[static_cast<std::size_t>(h)];
          gl[static_cast<std::size_t>(g)] -= wx;
          hg[i] = e;
          gl[static_cast<std::size_t>(g)] += w;
          where[static_cast<std::size_t>(e)].push_back(g);
          done = true;
        }
      }
      check(done, "craft placement: cannot place a copy of expert ", e, " on a GPU without one");
      continue;
    }
    where[static_cast<std::size_t>(e)].push_back(best);
    held[static_cast<std::size_t>(best)].push_back(e);
    gl[static_cast<std::size_t>(best)] += w;
    --left[static_cast<std::size_t>(best)];
  }
  return where;
}

/// Replica counts whose benefit is estimated: 1, 2, 4, ... up to D, and D itself.
inline std::vector<int> replica_counts(int gpus) {
  std::vector<int> r;
  for (int x = 1; x < gpus; x *= 2) r.push_back(x);
  r.push_back(gpus);
  return r;
}

struct Benefit {
  std::vector<int> counts;               ///< replica counts r (keys of T)
  std::vector<double> base;              ///< per layer: balancedness with no replica
  std::vector<std::vector<double>> gain; ///< gain[k][l]: gain with counts[k] replicas in layer l
};

namespace detail {
/// A layer's placement as per-GPU lists of (expert, share) in compressed rows, for fast replay.
struct Csr {
  std::vector<int> begin, expert;
  std::vector<double> share;
};
inline Csr to_csr(std::vector<std::vector<int>> const& where, int gpus) {
  std::vector<std::vector<std::pair<int, double>>> per(static_cast<std::size_t>(gpus));
  for (std::size_t e = 0; e < where.size(); ++e)
    for (int g : where[e]) per[static_cast<std::size_t>(g)].emplace_back(static_cast<int>(e), 1.0 / static_cast<double>(where[e].size()));
  Csr c;
  c.begin.push_back(0);
  for (auto const& v : per) {
    for (auto [e, w] : v) c.expert.push_back(e), c.share.push_back(w);
    c.begin.push_back(static_cast<int>(c.expert.size()));
  }
  return c;
}

/// Max GPU load of one batch row under a placement.
inline double max_load(Csr const& c, double const* row) {
  double mx = 0;
  std::size_t G = c.begin.size() - 1;
  for (std::size_t g = 0; g < G; ++g) {
    double s = 0;
    for (int i = c.begin[g]; i < c.begin[g + 1]; ++i) s += row[c.expert[static_cast<std::size_t>(i)]] * c.share[static_cast<std::size_t>(i)];
    mx = std::max(mx, s);
  }
  return mx;
}

inline std::vector<std::vector<int>> layer_plan(double const* total, int E, int r, int gpus) {
  auto cnt = replicate(total, E, r, gpus);
  auto slots = assign_capacity(E, {r}, gpus)[0];
  return place_layer(total, cnt, slots);
}
}  // namespace detail

/// Algorithm 1 on the profile (B x L x E) for `gpus` GPUs: every layer's plans for r = 0 and
/// each count are replayed together in one pass over the batches. Layers are independent, so
/// they are shared out over `threads` threads (0 = the hardware's count); the result does not
/// depend on the thread count.
inline Benefit estimate_benefit(profile::LoadProfile const& prof, int gpus, int threads = 1) {
  check(gpus > 0, "craft: gpus must be positive");
  check(prof.experts() >= gpus, "craft: ", prof.experts(), " experts cannot cover ", gpus, " GPUs");
  check(threads >= 0, "craft: negative thread count");
  int L = prof.layers(), E = prof.experts(), B = prof.batches();
  Benefit T;
  T.counts = replica_counts(gpus);
  auto totals = prof.totals();
  std::size_t K = T.counts.size();
  T.base.assign(static_cast<std::size_t>(L), 0.0);
  T.gain.assign(K, std::vector<double>(static_cast<std::size_t>(L), 0.0));
  auto work = [&](int first, int step) {
    std::vector<detail::Csr> plans(K + 1);
    std::vector<double> acc(K + 1);
    for (int l = first; l < L; l += step) {
      double const* tot = totals.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(E);
      for (std::size_t k = 0; k <= K; ++k)
        plans[k] = detail::to_csr(detail::layer_plan(tot, E, k == 0 ? 0 : T.counts[k - 1], gpus), gpus);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int b = 0; b < B; ++b) {
        double const* row = prof.row(b, l);
        double mean = 0;
        for (int e = 0; e < E; ++e) mean += row[e];
        mean /= gpus;
        for (std::size_t k = 0; k <= K; ++k) {
          double mx = detail::max_load(plans[k], row);
          acc[k] += mx > 0 ? mean / mx : 1.0;
        }
      }
      T.base[static_cast<std::size_t>(l)] = acc[0] / B;
      for (std::size_t k = 0; k < K; ++k) T.gain[k][static_cast<std::size_t>(l)] = acc[k + 1] / B - acc[0] / B;
    }
  };
  int n = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n = std::min(n, L);
  if (n <= 1) {
    work(0, 1);
    return T;
  }
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> pool;
  for (int t = 0; t < n; ++t)
    pool.emplace_back([&, t] {
      try {
        work(t, n);
      } catch (...) { errors[static_cast<std::size_t>(t)] = std::current_exception(); }
    });
  for (auto& th : pool) th.join();
  for (auto const& e : errors)
    if (e) std::rethrow_exception(e);
  return T;
}

enum class Objective {
  gain,            ///< maximise sum over layers of T[x_l][l] (the mean balancedness gain)
  paper_weighted,  ///< maximise sum over layers of x_l * T[x_l][l] (Algorithm 2 as printed)
};

/// Algorithm 2: per layer a replica count from {0} + T.counts with total exactly `capacity`
/// (or, when that is unreachable, the best total below it), maximising the objective.
inline std::vector<int> choose_replicas(Benefit const& T, long long capacity, Objective obj = Objective::gain) {
  check(capacity >= 0, "craft: negative replica budget ", capacity);
  int L = static_cast<int>(T.base.size());
  // No selection uses more than `most` replicas (every layer at the largest count), so totals above
  // most + 1 are unreachable: clamping there keeps the answer (best total below the budget) and
  // bounds the DP table and the int below for any capacity.
  long long most = static_cast<long long>(L) * (T.counts.empty() ? 0 : *std::max_element(T.counts.begin(), T.counts.end()));
  check(most < std::numeric_limits<int>::max(), "craft: ", most, " replicas are too many to choose from");
  int C = static_cast<int>(std::min(capacity, most + 1));
  constexpr double ninf = -std::numeric_limits<double>::infinity();
  std::vector<double> prev(static_cast<std::size_t>(C) + 1, ninf), cur(static_cast<std::size_t>(C) + 1);
  std::vector<std::vector<signed char>> choice(static_cast<std::size_t>(L), std::vector<signed char>(static_cast<std::size_t>(C) + 1, -1));
  prev[0] = 0;
  for (int l = 0; l < L; ++l) {
    for (int c = 0; c <= C; ++c) {
      cur[static_cast<std::size_t>(c)] = prev[static_cast<std::size_t>(c)];
      choice[static_cast<std::size_t>(l)][static_cast<std::size_t>(c)] = -1;
      for (std::size_t k = 0; k < T.counts.size(); ++k) {
        int r = T.counts[k];
        if (c < r || prev[static_cast<std::size_t>(c - r)] == ninf) continue;
        double v = T.gain[k][static_cast<std::size_t>(l)] * (obj == Objective::paper_weighted ? r : 1);
        double cand = prev[static_cast<std::size_t>(c - r)] + v;
        if (cand > cur[static_cast<std::size_t>(c)]) {
          cur[static_cast<std::size_t>(c)] = cand;
          choice[static_cast<std::size_t>(l)][static_cast<std::size_t>(c)] = static_cast<signed char>(k);
        }
      }
    }
    std::swap(prev, cur);
  }
  int c = C;
  if (prev[static_cast<std::size_t>(C)] == ninf) {
    c = 0;
    for (int x = 0; x <= C; ++x)
      if (prev[static_cast<std::size_t>(x)] > prev[static_cast<std::size_t>(c)]) c = x;
  }
  std::vector<int> xs(static_cast<std::size_t>(L), 0);
  for (int l = L - 1; l >= 0; --l) {
    int k = choice[static_cast<std::size_t>(l)][static_cast<std::size_t>(c)];
    if (k >= 0) {
      xs[static_cast<std::size_t>(l)] = T.counts[static_cast<std::size_t>(k)];
      c -= xs[static_cast<std::size_t>(l)];
    }
  }
  return xs;
}

/// Mean balancedness gain over layers of a selection.
inline double selection_gain(Benefit const& T, std::vector<int> const& x) {
  double s = 0;
  for (std::size_t l = 0; l < x.size(); ++l) {
    if (x[l] == 0) continue;
    auto k = static_cast<std::size_t>(std::find(T.counts.begin(), T.counts.end(), x[l]) - T.counts.begin());
    check(k < T.counts.size(), "craft: replica count ", x[l], " was not estimated");
    s += T.gain[k][l];
  }
  return s / static_cast<double>(x.size());
}

/// R with the best gain per replica among 1, 2, 4, ... up to the number of layers.
inline int auto_replication_factor(Benefit const& T, int gpus, Objective obj = Objective::gain) {
  int L = static_cast<int>(T.base.size());
  int best = 1;
  double best_eff = -std::numeric_limits<double>::infinity();
  for (int R = 1; R <= L; R *= 2) {
    auto x = choose_replicas(T, static_cast<long long>(R) * gpus, obj);
    double eff = selection_gain(T, x) / (static_cast<double>(R) * gpus);
    if (eff > best_eff) best_eff = eff, best = R;
  }
  return best;
}

struct Plan {
  int replication_factor = 0;            ///< R: replicas per GPU
  std::vector<int> replicas;             ///< per layer
  std::vector<std::vector<int>> slots;   ///< per layer and GPU: expert copies
  std::vector<placement::Table> placement;
  std::vector<replication::Table> tables;
  Benefit benefit;
};

struct Options {
  int replication_factor = 0;  ///< R (replicas per GPU); 0 = automatic
  Objective objective = Objective::gain;
  int threads = 0;  ///< threads for the benefit replay (0 = the hardware's count)
};

/// CRAFT's whole plan from a profile for `gpus` GPUs.
inline Plan plan(profile::LoadProfile const& prof, int gpus, Options const& o = {}) {
  prof.validate();
  Plan p;
  p.benefit = estimate_benefit(prof, gpus, o.threads);
  check(o.replication_factor >= 0, "craft: negative replication factor");
  p.replication_factor = o.replication_factor > 0 ? o.replication_factor : auto_replication_factor(p.benefit, gpus, o.objective);
  p.replicas = choose_replicas(p.benefit, static_cast<long long>(p.replication_factor) * gpus, o.objective);
  p.slots = assign_capacity(prof.experts(), p.replicas, gpus);
  auto totals = prof.totals();
  int E = prof.experts();
  for (int l = 0; l < prof.layers(); ++l) {
    double const* tot = totals.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(E);
    auto cnt = replicate(tot, E, p.replicas[static_cast<std::size_t>(l)], gpus);
    auto where = place_layer(tot, cnt, p.slots[static_cast<std::size_t>(l)]);
    std::vector<int> primary;
    for (auto const& w : where) primary.push_back(w.front());
    p.placement.emplace_back(std::move(primary));
    p.tables.emplace_back(std::move(where));
  }
  return p;
}

}  // namespace moe::replication::craft
