#pragma once
// A small primal network simplex for min-cost flow (no dependency; LEMON's NetworkSimplex is the
// reference it is checked and timed against in tests/ and benchmarks/planners).
//
//   minimise sum cost(a) * flow(a)   s.t. 0 <= flow(a) <= cap(a), out(v) - in(v) = supply(v).
//
// The textbook method (Ahuja, Magnanti, Orlin, ch. 11), initialised like LEMON's: a spanning
// tree rooted at an artificial node (free arcs from supply nodes, big-M arcs to demand nodes);
// block-search pricing over the real arcs; the leaving arc chosen by the strongly
// feasible tree rule (the last blocking arc of the cycle, which prevents cycling on degenerate
// pivots). The tree is stored as parent / predecessor-arc / depth pointers plus per-node lists
// of tree arcs; after a pivot only the subtree cut off by the leaving arc is re-hung.

#include <algorithm>
#include <cmath>
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

  /// Adds arc u -> v; returns its id.
  int add_arc(int u, int v, long long cap, double cost) {
    check(u >= 0 && u < n_ && v >= 0 && v < n_, "network simplex: arc ", u, " -> ", v, " outside [0, ", n_, ")");
    check(cap >= 0, "network simplex: negative capacity");
    check(std::isfinite(cost), "network simplex: cost is not finite");
    src_.push_back(u);
    dst_.push_back(v);
    cap_.push_back(cap);
    cost_.push_back(cost);
    return static_cast<int>(src_.size()) - 1;
  }
  void set_supply(int v, long long s) { supply_[static_cast<std::size_t>(v)] = s; }

  [[nodiscard]] long long flow(int arc) const { return flow_[static_cast<std::size_t>(arc)]; }
  [[nodiscard]] long long pivots() const { return pivots_; }
  [[nodiscard]] double total_cost() const {
    double s = 0;
    for (std::size_t a = 0; a < src_.size(); ++a) s += cost_[a] * static_cast<double>(flow_[a]);
    return s;
  }

  Status run() {
    long long total = 0;
    for (long long s : supply_) total += s;
    check(total == 0, "network simplex: supplies sum to ", total, ", not 0");
    int m = static_cast<int>(src_.size());
    int root = n_;
    int N = n_ + 1;
    // Artificial arcs m .. m + n_ - 1, one per real node.
    double maxc = 0;
    long long flow_bound = 1;
    for (int a = 0; a < m; ++a) maxc = std::max(maxc, std::abs(cost_[static_cast<std::size_t>(a)]));
    for (long long s : supply_) flow_bound += std::abs(s);
    double big_m = (maxc + 1.0) * static_cast<double>(N);
    eps_ = 1e-12 * (maxc + 1.0);
    // As in LEMON: supply nodes hang on the root by free arcs, demand nodes by big-M arcs;
    // artificial arcs are never priced, so once out of the tree they stay out.
    for (int v = 0; v < n_; ++v) {
      if (supply_[static_cast<std::size_t>(v)] >= 0) add_raw(v, root, flow_bound, 0.0);
      else add_raw(root, v, flow_bound, big_m);
    }
    int M = static_cast<int>(src_.size());
    flow_.assign(static_cast<std::size_t>(M), 0);
    state_.assign(static_cast<std::size_t>(M), 1);  // 1 = at lower bound, -1 = at upper, 0 = tree
    tree_arcs_.clear();
    for (int v = 0; v < n_; ++v) {
      int a = m + v;
      flow_[static_cast<std::size_t>(a)] = std::abs(supply_[static_cast<std::size_t>(v)]);
      state_[static_cast<std::size_t>(a)] = 0;
      tree_arcs_.push_back(a);
    }
    parent_.assign(static_cast<std::size_t>(N), -1);
    pred_.assign(static_cast<std::size_t>(N), -1);
    up_.assign(static_cast<std::size_t>(N), 0);
    depth_.assign(static_cast<std::size_t>(N), 0);
    pi_.assign(static_cast<std::size_t>(N), 0.0);
    adj_.assign(static_cast<std::size_t>(N), {});
    for (int a : tree_arcs_) {
      adj_[static_cast<std::size_t>(src_[static_cast<std::size_t>(a)])].push_back(a);
      adj_[static_cast<std::size_t>(dst_[static_cast<std::size_t>(a)])].push_back(a);
    }
    rehang(root, -1, -1);

    if (m == 0) return finish(m);
    int block = std::max(10, static_cast<int>(std::sqrt(static_cast<double>(m))));
    int next = 0;
    for (;;) {
      // Block search over the real arcs: the most negative (state * reduced cost) in the first
      // block that has one.
      int in = -1;
      double best = -eps_;
      for (int scanned = 0; scanned < m;) {
        int end = std::min(scanned + block, m);
        for (; scanned < end; ++scanned) {
          int a = next;
          next = next + 1 == m ? 0 : next + 1;
          int st = state_[static_cast<std::size_t>(a)];
          if (st == 0) continue;
          double c = st * (cost_[static_cast<std::size_t>(a)] + pi_[static_cast<std::size_t>(src_[static_cast<std::size_t>(a)])] -
                           pi_[static_cast<std::size_t>(dst_[static_cast<std::size_t>(a)])]);
          if (c < best) best = c, in = a;
        }
        if (in >= 0) break;
      }
      if (in < 0) break;
      pivot(in);
      ++pivots_;
    }
    return finish(m);
  }

private:
  Status finish(int m) {
    bool feasible = true;
    for (int v = 0; v < n_; ++v)
      if (flow_[static_cast<std::size_t>(m + v)] != 0) feasible = false;
    truncate(m);
    return feasible ? Status::optimal : Status::infeasible;
  }

  void add_raw(int u, int v, long long cap, double cost) {
    src_.push_back(u);
    dst_.push_back(v);
    cap_.push_back(cap);
    cost_.push_back(cost);
  }
  void truncate(int m) {
    src_.resize(static_cast<std::size_t>(m));
    dst_.resize(static_cast<std::size_t>(m));
    cap_.resize(static_cast<std::size_t>(m));
    cost_.resize(static_cast<std::size_t>(m));
    flow_.resize(static_cast<std::size_t>(m));
  }

  /// Hangs the subtree containing `top` below `parent` through tree arc `arc` (-1 for the root)
  /// and recomputes parent, predecessor arc, direction, depth and potential inside it.
  void rehang(int top, int parent, int arc) {
    parent_[static_cast<std::size_t>(top)] = parent;
    pred_[static_cast<std::size_t>(top)] = arc;
    if (arc < 0) {
      depth_[static_cast<std::size_t>(top)] = 0;
      pi_[static_cast<std::size_t>(top)] = 0;
    } else {
      bool down = src_[static_cast<std::size_t>(arc)] == parent;  // parent -> top
      up_[static_cast<std::size_t>(top)] = down ? 0 : 1;
      depth_[static_cast<std::size_t>(top)] = depth_[static_cast<std::size_t>(parent)] + 1;
      pi_[static_cast<std::size_t>(top)] = down ? pi_[static_cast<std::size_t>(parent)] + cost_[static_cast<std::size_t>(arc)]
                                                : pi_[static_cast<std::size_t>(parent)] - cost_[static_cast<std::size_t>(arc)];
    }
    stack_.clear();
    stack_.push_back(top);
    while (!stack_.empty()) {
      int u = stack_.back();
      stack_.pop_back();
      for (int a : adj_[static_cast<std::size_t>(u)]) {
        if (a == pred_[static_cast<std::size_t>(u)]) continue;
        bool out = src_[static_cast<std::size_t>(a)] == u;  // u -> w: w's arc points down from its parent
        int w = out ? dst_[static_cast<std::size_t>(a)] : src_[static_cast<std::size_t>(a)];
        parent_[static_cast<std::size_t>(w)] = u;
        pred_[static_cast<std::size_t>(w)] = a;
        up_[static_cast<std::size_t>(w)] = out ? 0 : 1;
        depth_[static_cast<std::size_t>(w)] = depth_[static_cast<std::size_t>(u)] + 1;
        pi_[static_cast<std::size_t>(w)] = out ? pi_[static_cast<std::size_t>(u)] + cost_[static_cast<std::size_t>(a)]
                                               : pi_[static_cast<std::size_t>(u)] - cost_[static_cast<std::size_t>(a)];
        stack_.push_back(w);
      }
    }
  }

  void remove_adj(int v, int a) {
    auto& l = adj_[static_cast<std::size_t>(v)];
    auto it = std::find(l.begin(), l.end(), a);
    *it = l.back();
    l.pop_back();
  }

  void pivot(int in) {
    int st = state_[static_cast<std::size_t>(in)];
    int first = st == 1 ? src_[static_cast<std::size_t>(in)] : dst_[static_cast<std::size_t>(in)];
    int second = st == 1 ? dst_[static_cast<std::size_t>(in)] : src_[static_cast<std::size_t>(in)];
    // Join node.
    int a = first, b = second;
    while (a != b) {
      if (depth_[static_cast<std::size_t>(a)] >= depth_[static_cast<std::size_t>(b)]) a = parent_[static_cast<std::size_t>(a)];
      else b = parent_[static_cast<std::size_t>(b)];
    }
    int join = a;
    long long delta = cap_[static_cast<std::size_t>(in)];
    int out_node = -1, result = 0;
    // Flow runs join -> ... -> first, then first -> second over `in`, then second -> ... -> join.
    for (int u = first; u != join; u = parent_[static_cast<std::size_t>(u)]) {
      int e = pred_[static_cast<std::size_t>(u)];
      long long d = up_[static_cast<std::size_t>(u)] ? flow_[static_cast<std::size_t>(e)]
                                                     : cap_[static_cast<std::size_t>(e)] - flow_[static_cast<std::size_t>(e)];
      if (d < delta) delta = d, out_node = u, result = 1;
    }
    for (int u = second; u != join; u = parent_[static_cast<std::size_t>(u)]) {
      int e = pred_[static_cast<std::size_t>(u)];
      long long d = up_[static_cast<std::size_t>(u)] ? cap_[static_cast<std::size_t>(e)] - flow_[static_cast<std::size_t>(e)]
                                                     : flow_[static_cast<std::size_t>(e)];
      if (d <= delta) delta = d, out_node = u, result = 2;
    }
    if (delta > 0) {
      long long val = st * delta;
      flow_[static_cast<std::size_t>(in)] += val;
      for (int u = src_[static_cast<std::size_t>(in)]; u != join; u = parent_[static_cast<std::size_t>(u)])
        flow_[static_cast<std::size_t>(pred_[static_cast<std::size_t>(u)])] -= (up_[static_cast<std::size_t>(u)] ? 1 : -1) * val;
      for (int u = dst_[static_cast<std::size_t>(in)]; u != join; u = parent_[static_cast<std::size_t>(u)])
        flow_[static_cast<std::size_t>(pred_[static_cast<std::size_t>(u)])] += (up_[static_cast<std::size_t>(u)] ? 1 : -1) * val;
    }
    if (result == 0) {
      state_[static_cast<std::size_t>(in)] = -st;
      return;
    }
    int out = pred_[static_cast<std::size_t>(out_node)];
    state_[static_cast<std::size_t>(out)] = flow_[static_cast<std::size_t>(out)] == 0 ? 1 : -1;
    state_[static_cast<std::size_t>(in)] = 0;
    // The subtree below the leaving arc holds `first` (result 1) or `second` (result 2); it is
    // re-hung from that end of the entering arc.
    remove_adj(src_[static_cast<std::size_t>(out)], out);
    remove_adj(dst_[static_cast<std::size_t>(out)], out);
    adj_[static_cast<std::size_t>(src_[static_cast<std::size_t>(in)])].push_back(in);
    adj_[static_cast<std::size_t>(dst_[static_cast<std::size_t>(in)])].push_back(in);
    int q = result == 1 ? first : second, p = result == 1 ? second : first;
    rehang(q, p, in);
  }

  int n_;
  std::vector<long long> supply_;
  std::vector<int> src_, dst_;
  std::vector<long long> cap_, flow_;
  std::vector<double> cost_;
  std::vector<int> state_, tree_arcs_, parent_, pred_, up_, depth_, stack_;
  std::vector<std::vector<int>> adj_;  // tree arcs at each node
  std::vector<double> pi_;
  double eps_ = 0;
  long long pivots_ = 0;
};

}  // namespace moe::placement
