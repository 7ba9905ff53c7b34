#pragma once
// A primal network simplex for min-cost flow (no dependency; LEMON's NetworkSimplex is the
// reference it is checked and timed against in tests/ and benchmarks/planners).
//
//   minimise sum cost(a) * flow(a)   s.t. 0 <= flow(a) <= cap(a), out(v) - in(v) = supply(v).
//
// The textbook method (Ahuja, Magnanti, Orlin, ch. 11):
//  - start: a spanning tree rooted at an artificial node, free arcs from supply nodes and big-M
//    arcs to demand nodes (the artificial arcs are never priced, so once out they stay out);
//  - pricing: block search (blocks of about sqrt(arcs) arcs, the most negative reduced cost of the
//    first block that has one; the next search goes on where the last one stopped), over an
//    interleaved arc order so that each block samples the whole network (as LEMON does); the
//    arc data read by pricing (ends and cost) lies in one array of structs;
//  - leaving arc: the last blocking arc of the cycle (strongly feasible trees, no cycling);
//  - tree: parent / predecessor arc / direction plus a preorder thread with reverse thread,
//    subtree sizes and last successors. A pivot splices the cut-off subtree, re-rooted at the
//    entering arc's end, into the thread after the other end: O(size of that subtree + depth),
//    no allocation. Potentials of the moved subtree are recomputed from their new parents in
//    preorder (never accumulated), so rounding does not drift over many pivots.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "moe/config.hpp"

namespace moe::placement {

class NetworkSimplex {
public:
  enum class Status { optimal, infeasible };

  explicit NetworkSimplex(int nodes) : n_(nodes), supply_(static_cast<std::size_t>(nodes), 0) {
    check(nodes > 0, "network simplex: needs at least one node");
  }

  /// Reserves room for `arcs` arcs (optional).
  void reserve(int arcs) { arcs_.reserve(static_cast<std::size_t>(arcs)); }

  /// Adds arc u -> v; returns its id.
  int add_arc(int u, int v, long long cap, double cost) {
    check(u >= 0 && u < n_ && v >= 0 && v < n_, "network simplex: arc ", u, " -> ", v, " outside [0, ", n_, ")");
    check(cap >= 0, "network simplex: negative capacity");
    check(std::isfinite(cost), "network simplex: cost is not finite");
    arcs_.push_back({u, v, cap, cost, false});
    return static_cast<int>(arcs_.size()) - 1;
  }
  void set_supply(int v, long long s) { supply_[static_cast<std::size_t>(v)] = s; }
  /// Warm start (optional): arc `a` starts at its upper bound (flow = capacity) instead of 0.
  /// Any set of such arcs gives a valid starting tree (the artificial arcs take up the
  /// imbalance), so the optimum does not depend on it; arcs that are saturated in an optimal
  /// solution (e.g. forced by capacities) save the pivots that would saturate them one by one.
  void start_at_upper(int a) {
    check(a >= 0 && a < arcs(), "network simplex: arc ", a, " outside [0, ", arcs(), ")");
    arcs_[static_cast<std::size_t>(a)].upper = true;
  }

  [[nodiscard]] int nodes() const { return n_; }
  [[nodiscard]] int arcs() const { return static_cast<int>(arcs_.size()); }
  [[nodiscard]] int source(int a) const { return arcs_[static_cast<std::size_t>(a)].src; }
  [[nodiscard]] int target(int a) const { return arcs_[static_cast<std::size_t>(a)].dst; }
  [[nodiscard]] long long capacity(int a) const { return arcs_[static_cast<std::size_t>(a)].cap; }
  [[nodiscard]] double cost(int a) const { return arcs_[static_cast<std::size_t>(a)].cost; }
  [[nodiscard]] long long supply(int v) const { return supply_[static_cast<std::size_t>(v)]; }
  [[nodiscard]] bool starts_at_upper(int a) const { return arcs_[static_cast<std::size_t>(a)].upper; }

  /// Flow on arc `a` after run().
  [[nodiscard]] long long flow(int a) const { return flow_[static_cast<std::size_t>(pos_[static_cast<std::size_t>(a)])]; }
  [[nodiscard]] long long pivots() const { return pivots_; }
  [[nodiscard]] double total_cost() const {
    double s = 0;
    for (std::size_t a = 0; a < arcs_.size(); ++a) s += arcs_[a].cost * static_cast<double>(flow(static_cast<int>(a)));
    return s;
  }

  Status run() {
    long long total = 0;
    for (long long s : supply_) total += s;
    check(total == 0, "network simplex: supplies sum to ", total, ", not 0");
    init();
    pivots_ = 0;
    if (m_ > 0) {
      int block = std::max(10, static_cast<int>(std::sqrt(static_cast<double>(m_))));
      int next = 0;
      for (;;) {
        int in = find_entering(block, next);
        if (in < 0) break;
        pivot(in);
        ++pivots_;
      }
    }
    for (int v = 0; v < n_; ++v)
      if (flow_[static_cast<std::size_t>(m_ + v)] != 0) return Status::infeasible;
    return Status::optimal;
  }

private:
  struct UserArc {
    int src, dst;
    long long cap;
    double cost;
    bool upper = false;  // warm start at the upper bound
  };
  struct Arc {  // what pricing reads, in internal order
    int src, dst;
    double cost;
  };

  void init() {
    m_ = static_cast<int>(arcs_.size());
    int N = n_ + 1, M = m_ + n_;
    root_ = n_;
    arc_.resize(static_cast<std::size_t>(M));
    cap_.resize(static_cast<std::size_t>(M));
    flow_.assign(static_cast<std::size_t>(M), 0);
    state_.assign(static_cast<std::size_t>(M), 1);  // 1 = at lower bound, -1 = at upper, 0 = tree
    pos_.resize(static_cast<std::size_t>(m_));
    // Interleave: user arc k goes to slot i, i advancing by `skip` and wrapping to the next start.
    // Arcs started at the upper bound move their flow into the supplies the artificial arcs see.
    // Artificial capacity: more than any flow an artificial arc can carry (all supplies plus all
    // real capacities), clamped far below overflow.
    constexpr long long clamp = std::numeric_limits<long long>::max() / 4;
    double maxc = 0;
    long long flow_bound = 1;
    std::vector<long long>& b = start_supply_;
    b = supply_;
    {
      int skip = std::max(m_ / n_, 3), i = 0, j = 0;
      for (int k = 0; k < m_; ++k) {
        UserArc const& u = arcs_[static_cast<std::size_t>(k)];
        std::size_t ii = static_cast<std::size_t>(i);
        arc_[ii] = {u.src, u.dst, u.cost};
        cap_[ii] = u.cap;
        if (u.upper) {
          state_[ii] = -1;
          flow_[ii] = u.cap;
          b[static_cast<std::size_t>(u.src)] -= u.cap;
          b[static_cast<std::size_t>(u.dst)] += u.cap;
        }
        pos_[static_cast<std::size_t>(k)] = i;
        maxc = std::max(maxc, std::abs(u.cost));
        flow_bound = u.cap >= clamp - flow_bound ? clamp : flow_bound + u.cap;
        if ((i += skip) >= m_) i = ++j;
      }
    }
    for (long long s : supply_) {
      long long a = s < 0 ? (s < -clamp ? clamp : -s) : s;
      flow_bound = a >= clamp - flow_bound ? clamp : flow_bound + a;
    }
    double big_m = (maxc + 1.0) * static_cast<double>(N);
    eps_ = 1e-12 * (maxc + 1.0);

    parent_.assign(static_cast<std::size_t>(N), -1);
    pred_.assign(static_cast<std::size_t>(N), -1);
    dir_.assign(static_cast<std::size_t>(N), 0);
    thread_.resize(static_cast<std::size_t>(N));
    rev_.resize(static_cast<std::size_t>(N));
    succ_.resize(static_cast<std::size_t>(N));
    last_.resize(static_cast<std::size_t>(N));
    pi_.assign(static_cast<std::size_t>(N), 0.0);
    buf_.resize(static_cast<std::size_t>(N));
    stem_.resize(static_cast<std::size_t>(N));
    size_.resize(static_cast<std::size_t>(N));
    // Root first in the thread, then nodes 0 .. n-1, each a leaf below the root.
    thread_[static_cast<std::size_t>(root_)] = 0;
    rev_[0] = root_;
    succ_[static_cast<std::size_t>(root_)] = N;
    last_[static_cast<std::size_t>(root_)] = n_ - 1;
    for (int v = 0; v < n_; ++v) {
      std::size_t e = static_cast<std::size_t>(m_ + v), vv = static_cast<std::size_t>(v);
      parent_[vv] = root_;
      pred_[vv] = m_ + v;
      thread_[vv] = v + 1;
      rev_[vv + 1] = v;
      succ_[vv] = 1;
      last_[vv] = v;
      state_[e] = 0;
      cap_[e] = flow_bound;
      long long s = b[vv];
      if (s >= 0) {  // v -> root, free
        arc_[e] = {v, root_, 0.0};
        dir_[vv] = 1;
        flow_[e] = s;
        pi_[vv] = 0;
      } else {  // root -> v, big M
        arc_[e] = {root_, v, big_m};
        dir_[vv] = -1;
        flow_[e] = -s;
        pi_[vv] = big_m;
      }
    }
  }

  /// Block search: returns the arc with the most negative (state * reduced cost) in the first
  /// block (starting at `next`) that has one, or -1 when no arc prices out. The next search
  /// starts where this one stopped.
  int find_entering(int block, int& next) const {
    int in = -1;
    double best = -eps_;
    Arc const* arc = arc_.data();
    std::int8_t const* st = state_.data();
    double const* pi = pi_.data();
    // Blocks of `block` arcs from `next`, wrapping around once; a block may straddle the end.
    int e = next, left = m_;
    while (left > 0) {
      int len = std::min(block, left);
      left -= len;
      while (len > 0) {
        int stop = std::min(e + len, m_);
        len -= stop - e;
        for (; e < stop; ++e) {
          Arc const& x = arc[e];
          double c = st[e] * (x.cost + pi[x.src] - pi[x.dst]);
          if (c < best) best = c, in = e;
        }
        if (e == m_) e = 0;
      }
      if (in >= 0) {
        next = e;
        return in;
      }
    }
    return -1;
  }

  void pivot(int in) {
    std::size_t ie = static_cast<std::size_t>(in);
    int st = state_[ie];
    int first = st == 1 ? arc_[ie].src : arc_[ie].dst;
    int second = st == 1 ? arc_[ie].dst : arc_[ie].src;
    // Join node: climb from the end with the smaller subtree (it cannot be the other's ancestor).
    int a = first, b = second;
    while (a != b) {
      if (succ_[static_cast<std::size_t>(a)] < succ_[static_cast<std::size_t>(b)]) a = parent_[static_cast<std::size_t>(a)];
      else b = parent_[static_cast<std::size_t>(b)];
    }
    int join = a;
    // Flow runs join -> ... -> first, then first -> second over `in`, then second -> ... -> join.
    long long delta = cap_[ie];
    int u_out = -1, result = 0;
    for (int u = first; u != join; u = parent_[static_cast<std::size_t>(u)]) {
      std::size_t e = static_cast<std::size_t>(pred_[static_cast<std::size_t>(u)]);
      long long d = dir_[static_cast<std::size_t>(u)] == 1 ? flow_[e] : cap_[e] - flow_[e];
      if (d < delta) delta = d, u_out = u, result = 1;
    }
    for (int u = second; u != join; u = parent_[static_cast<std::size_t>(u)]) {
      std::size_t e = static_cast<std::size_t>(pred_[static_cast<std::size_t>(u)]);
      long long d = dir_[static_cast<std::size_t>(u)] == 1 ? cap_[e] - flow_[e] : flow_[e];
      if (d <= delta) delta = d, u_out = u, result = 2;
    }
    if (delta > 0) {
      long long val = st * delta;
      flow_[ie] += val;
      for (int u = arc_[ie].src; u != join; u = parent_[static_cast<std::size_t>(u)])
        flow_[static_cast<std::size_t>(pred_[static_cast<std::size_t>(u)])] -= dir_[static_cast<std::size_t>(u)] * val;
      for (int u = arc_[ie].dst; u != join; u = parent_[static_cast<std::size_t>(u)])
        flow_[static_cast<std::size_t>(pred_[static_cast<std::size_t>(u)])] += dir_[static_cast<std::size_t>(u)] * val;
    }
    if (result == 0) {  // the entering arc itself blocks: it just changes bound
      state_[ie] = static_cast<std::int8_t>(-st);
      return;
    }
    std::size_t oe = static_cast<std::size_t>(pred_[static_cast<std::size_t>(u_out)]);
    state_[oe] = flow_[oe] == 0 ? 1 : -1;
    state_[ie] = 0;
    int u_in = result == 1 ? first : second, v_in = result == 1 ? second : first;
    update_tree(in, u_in, v_in, u_out);
  }

  /// The subtree S of u_out (u_in inside it) is cut off and hung below v_in by arc `in`,
  /// re-rooted at u_in.
  void update_tree(int in, int u_in, int v_in, int u_out) {
    int* parent = parent_.data();
    int* thread = thread_.data();
    int* rev = rev_.data();
    int* succ = succ_.data();
    int* last = last_.data();
    int v_out = parent[u_out];
    int s = succ[u_out];
    int old_last = last[u_out];
    // Stem u_in = x0, x1 = parent(x0), ..., xk = u_out.
    int k = 0;
    for (int x = u_in;; x = parent[x]) {
      stem_[static_cast<std::size_t>(k++)] = x;
      if (x == u_out) break;
    }
    // New preorder of S: for i = 0..k, the old preorder of subtree(x_i) without subtree(x_{i-1}).
    int nb = 0;
    for (int i = 0; i < k; ++i) {
      int x = stem_[static_cast<std::size_t>(i)];
      int end = thread[last[x]];
      int skip = i > 0 ? stem_[static_cast<std::size_t>(i) - 1] : -1;
      int skip_to = i > 0 ? thread[last[skip]] : -1;
      for (int u = x; u != end;) {
        if (u == skip) {
          u = skip_to;
          continue;
        }
        buf_[static_cast<std::size_t>(nb++)] = u;
        u = thread[u];
      }
    }
    int new_last = buf_[static_cast<std::size_t>(s) - 1];
    // Cut S out of the thread and out of its old ancestors.
    {
      int p = rev[u_out], q = thread[old_last];
      thread[p] = q;
      rev[q] = p;
      for (int a = v_out; a != -1 && last[a] == old_last; a = parent[a]) last[a] = p;
      for (int a = v_out; a != -1; a = parent[a]) succ[a] -= s;
    }
    // Re-root S: reverse the stem (parents, predecessor arcs, directions, sizes, last successors).
    {
      int prev_pred = pred_[static_cast<std::size_t>(u_in)];
      std::int8_t prev_dir = dir_[static_cast<std::size_t>(u_in)];
      int below = 0;  // old subtree size of x_{i-1}
      // sizes: new succ(x_k) = old succ(x_k) - old succ(x_{k-1}); going down adds up.
      for (int i = 0; i < k; ++i) {
        int x = stem_[static_cast<std::size_t>(i)];
        int old_size = succ[x];
        size_[static_cast<std::size_t>(i)] = old_size - below;
        below = old_size;
      }
      int acc = 0;
      for (int i = k - 1; i >= 0; --i) {
        acc += size_[static_cast<std::size_t>(i)];
        succ[stem_[static_cast<std::size_t>(i)]] = acc;
        last[stem_[static_cast<std::size_t>(i)]] = new_last;
      }
      for (int i = 1; i < k; ++i) {
        int x = stem_[static_cast<std::size_t>(i)];
        int np = pred_[static_cast<std::size_t>(x)];
        std::int8_t nd = dir_[static_cast<std::size_t>(x)];
        parent[x] = stem_[static_cast<std::size_t>(i) - 1];
        pred_[static_cast<std::size_t>(x)] = prev_pred;
        dir_[static_cast<std::size_t>(x)] = static_cast<std::int8_t>(-prev_dir);
        prev_pred = np;
        prev_dir = nd;
      }
      parent[u_in] = v_in;
      pred_[static_cast<std::size_t>(u_in)] = in;
      dir_[static_cast<std::size_t>(u_in)] = arc_[static_cast<std::size_t>(in)].src == u_in ? 1 : -1;
    }
    // Splice S in right after v_in.
    {
      int after = thread[v_in];
      int prev = v_in;
      for (int i = 0; i < s; ++i) {
        int u = buf_[static_cast<std::size_t>(i)];
        thread[prev] = u;
        rev[u] = prev;
        prev = u;
      }
      thread[new_last] = after;
      rev[after] = new_last;
      if (last[v_in] == v_in)
        for (int a = v_in; a != -1 && last[a] == v_in; a = parent[a]) last[a] = new_last;
      for (int a = v_in; a != -1; a = parent[a]) succ[a] += s;
    }
    // Potentials of S, parents first.
    double* pi = pi_.data();
    for (int i = 0; i < s; ++i) {
      int u = buf_[static_cast<std::size_t>(i)];
      Arc const& x = arc_[static_cast<std::size_t>(pred_[static_cast<std::size_t>(u)])];
      // Tree arcs have zero reduced cost: cost + pi(src) - pi(dst) = 0.
      pi[u] = dir_[static_cast<std::size_t>(u)] == 1 ? pi[parent[u]] - x.cost : pi[parent[u]] + x.cost;
    }
  }

  int n_, m_ = 0, root_ = 0;
  std::vector<long long> supply_, start_supply_;
  std::vector<UserArc> arcs_;    // as added
  std::vector<int> pos_;         // user arc -> internal slot
  std::vector<Arc> arc_;         // internal order; artificial arcs at m_ .. m_ + n_ - 1
  std::vector<long long> cap_, flow_;
  std::vector<std::int8_t> state_, dir_;
  std::vector<int> parent_, pred_, thread_, rev_, succ_, last_, buf_, stem_, size_;  // scratch of update_tree
  std::vector<double> pi_;
  double eps_ = 0;
  long long pivots_ = 0;
};

}  // namespace moe::placement
