#pragma once
// Exact ILP / ILPLoad placement (the ILP paper's problem (4) and its load-weighted objective),
// solved as a min-cost flow instead of with a generic ILP solver.
//
//   minimise  sum_{l,e} w(l,e) * p(l, gpu(l,e))
//   s.t.      each expert placed once, <= c_layer experts of a layer per GPU, <= c_exp per GPU.
// ILP uses w = 1, ILPLoad uses w(l,e) = f(l,e), the expert's load frequency in layer l.
//
// The constraint matrix is a transportation (network) matrix, so the LP optimum is integral. The
// network is made small with two exact reductions:
//  1. GPUs with the same cost vector p(., g) over all layers (e.g. the GPUs of one server, or
//     servers at equal distance from every attention GPU) are interchangeable: they are merged
//     into one group with capacities n*c_layer per layer and n*c_exp in all. Any group flow splits
//     back onto the group's GPUs by dealing the experts cyclically (each GPU then gets floor or
//     ceil of the group's share, which respects both caps).
//  2. Inside a layer, once the number of experts sent to each distinct cost value ("class") is
//     fixed, the best assignment puts the heaviest experts on the cheapest class. With classes
//     p_1 < ... < p_K and t_k experts sent beyond class k, that cost is
//        p_1 * W + sum_k (p_{k+1} - p_k) * (sum of the t_k lightest weights),
//     a separable convex function of the t_k. So a layer becomes a chain of K class nodes whose
//     chain arcs carry convex costs, instead of E expert nodes with E*G arcs.
// The reduced network (source -> layer chain -> class -> GPU group -> sink) is solved by
// successive shortest paths with Dijkstra on reduced costs (convex arcs priced at their current
// marginal cost), which is exact. The experts are then dealt out in weight order.

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <utility>
#include <vector>

#include "moe/config.hpp"
#include "moe/placement/network_simplex.hpp"
#include "moe/placement/problem.hpp"

namespace moe::placement {

/// A general instance: cost is L x G (p(l, g) >= 0), weight is L x E (>= 0; empty = all 1).
struct FlowInstance {
  int layers = 0, experts = 0, gpus = 0, c_layer = 0, c_exp = 0;
  std::vector<double> cost;
  std::vector<double> weight;
};

struct ExactResult {
  Assignment assignment;
  double objective = 0;
  int groups = 0;         ///< GPU groups after merging interchangeable GPUs
  int augmentations = 0;  ///< shortest-path augmentations (Solver::shortest_paths)
  long long pivots = 0;   ///< simplex pivots (Solver::network_simplex)
};

/// Which min-cost-flow method solves the reduced network (both exact; the simplex is faster on
/// the planners' networks, the shortest-path method is kept as an independent cross-check).
enum class Solver { network_simplex, shortest_paths };

namespace detail {

class ConvexFlow {
public:
  struct Arc {
    int to;
    int cap;      // residual capacity (plain arcs)
    double cost;  // plain arcs
    int convex;   // -1 plain, else index into chains_
  };
  struct Chain {
    double delta;
    int flow;
    std::vector<double> const* asc;  // ascending weights of the layer
    std::vector<int> const* run_fwd;
    std::vector<int> const* run_bwd;
  };

  explicit ConvexFlow(int nodes) : head_(static_cast<std::size_t>(nodes)) {}

  int add_arc(int u, int v, int cap, double cost) {
    int id = static_cast<int>(arcs_.size());
    arcs_.push_back({v, cap, cost, -1});
    from_.push_back(u);
    arcs_.push_back({u, 0, -cost, -1});
    from_.push_back(v);
    head_[static_cast<std::size_t>(u)].push_back(id);
    head_[static_cast<std::size_t>(v)].push_back(id + 1);
    return id;
  }
  int add_convex(int u, int v, double delta, std::vector<double> const* asc, std::vector<int> const* fwd,
                 std::vector<int> const* bwd) {
    int id = add_arc(u, v, 0, 0);
    int c = static_cast<int>(chains_.size());
    chains_.push_back({delta, 0, asc, fwd, bwd});
    arcs_[static_cast<std::size_t>(id)].convex = c;
    arcs_[static_cast<std::size_t>(id) + 1].convex = c;
    return id;
  }

  [[nodiscard]] int residual(int a) const {
    Arc const& x = arcs_[static_cast<std::size_t>(a)];
    if (x.convex < 0) return x.cap;
    Chain const& c = chains_[static_cast<std::size_t>(x.convex)];
    int n = static_cast<int>(c.asc->size());
    return (a & 1) == 0 ? (c.flow < n ? (*c.run_fwd)[static_cast<std::size_t>(c.flow)] : 0)
                        : (c.flow > 0 ? (*c.run_bwd)[static_cast<std::size_t>(c.flow)] : 0);
  }
  [[nodiscard]] double cost(int a) const {
    Arc const& x = arcs_[static_cast<std::size_t>(a)];
    if (x.convex < 0) return x.cost;
    Chain const& c = chains_[static_cast<std::size_t>(x.convex)];
    return (a & 1) == 0 ? c.delta * (*c.asc)[static_cast<std::size_t>(c.flow)]
                        : -c.delta * (*c.asc)[static_cast<std::size_t>(c.flow) - 1];
  }
  void push(int a, int d) {
    Arc& x = arcs_[static_cast<std::size_t>(a)];
    if (x.convex < 0) {
      x.cap -= d;
      arcs_[static_cast<std::size_t>(a ^ 1)].cap += d;
    } else {
      chains_[static_cast<std::size_t>(x.convex)].flow += (a & 1) == 0 ? d : -d;
    }
  }
  /// Flow on a plain forward arc.
  [[nodiscard]] int flow(int a) const { return arcs_[static_cast<std::size_t>(a) + 1].cap; }

  /// Sends up to `want` units from s to t at minimum cost; returns the units sent.
  long long run(int s, int t, long long want, int& augmentations) {
    int V = static_cast<int>(head_.size());
    std::vector<double> pot(static_cast<std::size_t>(V), 0.0), dist(static_cast<std::size_t>(V));
    std::vector<int> prev(static_cast<std::size_t>(V));
    std::vector<char> done(static_cast<std::size_t>(V));
    constexpr double inf = std::numeric_limits<double>::infinity();
    using Item = std::pair<double, int>;
    std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;
    long long sent = 0;
    while (sent < want) {
      std::fill(dist.begin(), dist.end(), inf);
      std::fill(done.begin(), done.end(), 0);
      dist[static_cast<std::size_t>(s)] = 0;
      heap.push({0.0, s});
      while (!heap.empty()) {
        auto [d, u] = heap.top();
        heap.pop();
        if (done[static_cast<std::size_t>(u)]) continue;
        done[static_cast<std::size_t>(u)] = 1;
        if (u == t) break;
        for (int a : head_[static_cast<std::size_t>(u)]) {
          if (residual(a) <= 0) continue;
          int v = arcs_[static_cast<std::size_t>(a)].to;
          if (done[static_cast<std::size_t>(v)]) continue;
          double rc = cost(a) + pot[static_cast<std::size_t>(u)] - pot[static_cast<std::size_t>(v)];
          if (rc < 0) rc = 0;  // rounding noise; exact arithmetic gives rc >= 0
          double nd = d + rc;
          if (nd < dist[static_cast<std::size_t>(v)]) {
            dist[static_cast<std::size_t>(v)] = nd;
            prev[static_cast<std::size_t>(v)] = a;
            heap.push({nd, v});
          }
        }
      }
      while (!heap.empty()) heap.pop();
      if (!done[static_cast<std::size_t>(t)]) break;
      double dt = dist[static_cast<std::size_t>(t)];
      for (int v = 0; v < V; ++v) pot[static_cast<std::size_t>(v)] += done[static_cast<std::size_t>(v)] ? dist[static_cast<std::size_t>(v)] : dt;
      long long d = want - sent;
      for (int v = t; v != s; v = from_[static_cast<std::size_t>(prev[static_cast<std::size_t>(v)])])
        d = std::min<long long>(d, residual(prev[static_cast<std::size_t>(v)]));
      for (int v = t; v != s; v = from_[static_cast<std::size_t>(prev[static_cast<std::size_t>(v)])])
        push(prev[static_cast<std::size_t>(v)], static_cast<int>(d));
      sent += d;
      ++augmentations;
    }
    return sent;
  }

private:
  std::vector<Arc> arcs_;
  std::vector<int> from_;
  std::vector<std::vector<int>> head_;
  std::vector<Chain> chains_;
};

/// The whole exact solve; with `capture` set, the reduced network is built, copied there (not run)
/// and an empty result is returned. `presolve` fixes the chain arcs forced by c_layer (below).
inline ExactResult solve_exact_impl(FlowInstance const& in, Solver solver, NetworkSimplex* capture, bool presolve = true) {
  int L = in.layers, E = in.experts, G = in.gpus;
  check(L > 0 && E > 0 && G > 0, "exact placement: layers (", L, "), experts (", E, ") and gpus (", G,
        ") must be positive");
  check(in.cost.size() == static_cast<std::size_t>(L) * static_cast<std::size_t>(G), "exact placement: cost has ",
        in.cost.size(), " entries, expected ", L, "x", G);
  check(in.weight.empty() || in.weight.size() == static_cast<std::size_t>(L) * static_cast<std::size_t>(E),
        "exact placement: weight has ", in.weight.size(), " entries, expected ", L, "x", E);
  for (double c : in.cost) check(std::isfinite(c) && c >= 0, "exact placement: cost ", c, " is negative or not finite");
  for (double w : in.weight) check(std::isfinite(w) && w >= 0, "exact placement: weight ", w, " is negative or not finite");
  check(in.c_layer > 0 && in.c_exp > 0, "exact placement: capacities must be positive");
  check(static_cast<long long>(in.c_layer) * G >= E, "infeasible placement: c_layer = ", in.c_layer, " on ", G,
        " GPUs holds ", static_cast<long long>(in.c_layer) * G, " experts of a layer, but a layer has ", E);
  check(static_cast<long long>(in.c_exp) * G >= static_cast<long long>(L) * E, "infeasible placement: c_exp = ",
        in.c_exp, " on ", G, " GPUs holds ", static_cast<long long>(in.c_exp) * G, " experts, but the model has ",
        static_cast<long long>(L) * E);
  auto C = [&](int l, int g) { return in.cost[static_cast<std::size_t>(l) * static_cast<std::size_t>(G) + static_cast<std::size_t>(g)]; };
  auto W = [&](int l, int e) {
    return in.weight.empty() ? 1.0 : in.weight[static_cast<std::size_t>(l) * static_cast<std::size_t>(E) + static_cast<std::size_t>(e)];
  };

  // 1. Merge GPUs with identical cost columns.
  std::map<std::vector<double>, int> column_group;
  std::vector<int> group_of(static_cast<std::size_t>(G));
  std::vector<std::vector<int>> group_gpus;
  {
    std::vector<double> col(static_cast<std::size_t>(L));
    for (int g = 0; g < G; ++g) {
      for (int l = 0; l < L; ++l) col[static_cast<std::size_t>(l)] = C(l, g);
      auto [it, fresh] = column_group.emplace(col, static_cast<int>(group_gpus.size()));
      if (fresh) group_gpus.emplace_back();
      group_of[static_cast<std::size_t>(g)] = it->second;
      group_gpus[static_cast<std::size_t>(it->second)].push_back(g);
    }
  }
  int NG = static_cast<int>(group_gpus.size());
  std::vector<double> gcost(static_cast<std::size_t>(L) * static_cast<std::size_t>(NG));
  for (int j = 0; j < NG; ++j)
    for (int l = 0; l < L; ++l) gcost[static_cast<std::size_t>(l) * static_cast<std::size_t>(NG) + static_cast<std::size_t>(j)] = C(l, group_gpus[static_cast<std::size_t>(j)][0]);

  // 2. Per layer: experts by weight, classes of equal cost.
  std::vector<std::vector<double>> asc(static_cast<std::size_t>(L));
  std::vector<std::vector<int>> run_fwd(static_cast<std::size_t>(L)), run_bwd(static_cast<std::size_t>(L));
  std::vector<std::vector<double>> class_cost(static_cast<std::size_t>(L));
  int nodes = 2 + NG;
  std::vector<int> class_base(static_cast<std::size_t>(L));
  // heavy: per layer the experts by weight, heaviest first, ties by expert id (one sort per layer
  // serves both the ascending weights here and the dealing in step 4).
  std::vector<int> heavy(static_cast<std::size_t>(L) * static_cast<std::size_t>(E));
  std::vector<std::pair<double, int>> keyed(static_cast<std::size_t>(E));
  for (int l = 0; l < L; ++l) {
    for (int e = 0; e < E; ++e) keyed[static_cast<std::size_t>(e)] = {-W(l, e), e};
    std::sort(keyed.begin(), keyed.end());
    auto& a = asc[static_cast<std::size_t>(l)];
    a.resize(static_cast<std::size_t>(E));
    for (int t = 0; t < E; ++t) {
      auto const& k = keyed[static_cast<std::size_t>(E - 1 - t)];
      a[static_cast<std::size_t>(t)] = -k.first;
      heavy[static_cast<std::size_t>(l) * static_cast<std::size_t>(E) + static_cast<std::size_t>(E - 1 - t)] = k.second;
    }
    auto& f = run_fwd[static_cast<std::size_t>(l)];
    auto& b = run_bwd[static_cast<std::size_t>(l)];
    f.assign(static_cast<std::size_t>(E) + 1, 0);
    b.assign(static_cast<std::size_t>(E) + 1, 0);
    for (int t = E - 1; t >= 0; --t)
      f[static_cast<std::size_t>(t)] = (t + 1 < E && a[static_cast<std::size_t>(t) + 1] == a[static_cast<std::size_t>(t)]) ? f[static_cast<std::size_t>(t) + 1] + 1 : 1;
    for (int t = 1; t <= E; ++t)
      b[static_cast<std::size_t>(t)] = (t >= 2 && a[static_cast<std::size_t>(t) - 2] == a[static_cast<std::size_t>(t) - 1]) ? b[static_cast<std::size_t>(t) - 1] + 1 : 1;
    auto& cc = class_cost[static_cast<std::size_t>(l)];
    for (int j = 0; j < NG; ++j) cc.push_back(gcost[static_cast<std::size_t>(l) * static_cast<std::size_t>(NG) + static_cast<std::size_t>(j)]);
    std::sort(cc.begin(), cc.end());
    cc.erase(std::unique(cc.begin(), cc.end()), cc.end());
    class_base[static_cast<std::size_t>(l)] = nodes;
    nodes += static_cast<int>(cc.size());
  }

  // 3. The network: source -> first class of each layer -> chain of classes -> GPU groups -> sink.
  ExactResult res;
  res.groups = NG;
  long long want = static_cast<long long>(L) * E;
  std::vector<std::vector<int>> class_arc(static_cast<std::size_t>(L), std::vector<int>(static_cast<std::size_t>(NG)));
  auto group_cap = [&](int j, long long per) {
    return std::min<long long>(per * static_cast<long long>(group_gpus[static_cast<std::size_t>(j)].size()), want);
  };
  std::vector<long long> class_flow(static_cast<std::size_t>(L) * static_cast<std::size_t>(NG), 0);
  auto infeasible = [&](long long sent) {
    if (sent < 0) fail("infeasible placement: the ", want, " experts do not fit under c_layer = ", in.c_layer, " and c_exp = ", in.c_exp);
    fail("infeasible placement: only ", sent, " of ", want, " experts fit under c_layer = ", in.c_layer, " and c_exp = ",
         in.c_exp);
  };
  if (solver == Solver::network_simplex) {
    // Convex chain arcs become parallel arcs, one per run of equal weights (cheapest used first).
    NetworkSimplex net(nodes);
    for (int l = 0; l < L; ++l) {
      auto const& cc = class_cost[static_cast<std::size_t>(l)];
      auto const& a = asc[static_cast<std::size_t>(l)];
      auto const& f = run_fwd[static_cast<std::size_t>(l)];
      int base = class_base[static_cast<std::size_t>(l)];
      // Presolve: whatever the GPU groups of classes 0..k cannot take (c_layer caps) must go on
      // beyond class k in every feasible flow, and some optimal flow sends it over the cheapest
      // chain arcs (any flow can swap to cheaper parallel arcs without cost increase). Those arcs
      // (whole runs only) are fixed at their capacity: left out, their flow moved into the supplies
      // of their ends. At c_layer 1 on the 256-GPU cluster this removes 5 of every 6 arcs.
      std::vector<long long> class_room(cc.size(), 0), fixed(cc.size(), 0);
      for (int j = 0; j < NG; ++j) {
        double c = gcost[static_cast<std::size_t>(l) * static_cast<std::size_t>(NG) + static_cast<std::size_t>(j)];
        class_room[static_cast<std::size_t>(std::lower_bound(cc.begin(), cc.end(), c) - cc.begin())] += group_cap(j, in.c_layer);
      }
      long long room = 0;
      for (std::size_t k = 0; k + 1 < cc.size(); ++k) {
        room += class_room[k];
        long long forced = E - room;  // lower bound on the flow beyond class k
        for (int t = 0; t < E; t += f[static_cast<std::size_t>(t)]) {
          if (presolve && t + f[static_cast<std::size_t>(t)] <= forced) {
            fixed[k] += f[static_cast<std::size_t>(t)];
            continue;
          }
          net.add_arc(base + static_cast<int>(k), base + static_cast<int>(k) + 1, f[static_cast<std::size_t>(t)],
                      (cc[k + 1] - cc[k]) * a[static_cast<std::size_t>(t)]);
        }
      }
      for (std::size_t k = 0; k < cc.size(); ++k)
        net.set_supply(base + static_cast<int>(k), (k == 0 ? E : 0) - fixed[k] + (k > 0 ? fixed[k - 1] : 0));
      for (int j = 0; j < NG; ++j) {
        double c = gcost[static_cast<std::size_t>(l) * static_cast<std::size_t>(NG) + static_cast<std::size_t>(j)];
        int k = static_cast<int>(std::lower_bound(cc.begin(), cc.end(), c) - cc.begin());
        class_arc[static_cast<std::size_t>(l)][static_cast<std::size_t>(j)] = net.add_arc(base + k, 2 + j, group_cap(j, in.c_layer), 0.0);
      }
    }
    for (int j = 0; j < NG; ++j) net.add_arc(2 + j, 1, group_cap(j, in.c_exp), 0.0);
    net.set_supply(1, -want);
    if (capture != nullptr) {
      *capture = std::move(net);
      return res;
    }
    if (net.run() != NetworkSimplex::Status::optimal) infeasible(-1);
    res.pivots = net.pivots();
    for (int l = 0; l < L; ++l)
      for (int j = 0; j < NG; ++j)
        class_flow[static_cast<std::size_t>(l) * static_cast<std::size_t>(NG) + static_cast<std::size_t>(j)] =
            net.flow(class_arc[static_cast<std::size_t>(l)][static_cast<std::size_t>(j)]);
  } else {
    int S = 0, T = 1;
    detail::ConvexFlow net(nodes);
    for (int l = 0; l < L; ++l) {
      auto const& cc = class_cost[static_cast<std::size_t>(l)];
      int base = class_base[static_cast<std::size_t>(l)];
      net.add_arc(S, base, E, 0.0);
      for (std::size_t k = 0; k + 1 < cc.size(); ++k)
        net.add_convex(base + static_cast<int>(k), base + static_cast<int>(k) + 1, cc[k + 1] - cc[k], &asc[static_cast<std::size_t>(l)],
                       &run_fwd[static_cast<std::size_t>(l)], &run_bwd[static_cast<std::size_t>(l)]);
      for (int j = 0; j < NG; ++j) {
        double c = gcost[static_cast<std::size_t>(l) * static_cast<std::size_t>(NG) + static_cast<std::size_t>(j)];
        int k = static_cast<int>(std::lower_bound(cc.begin(), cc.end(), c) - cc.begin());
        class_arc[static_cast<std::size_t>(l)][static_cast<std::size_t>(j)] =
            net.add_arc(base + k, 2 + j, static_cast<int>(group_cap(j, in.c_layer)), 0.0);
      }
    }
    for (int j = 0; j < NG; ++j) net.add_arc(2 + j, T, static_cast<int>(group_cap(j, in.c_exp)), 0.0);
    long long sent = net.run(S, T, want, res.augmentations);
    if (sent != want) infeasible(sent);
    for (int l = 0; l < L; ++l)
      for (int j = 0; j < NG; ++j)
        class_flow[static_cast<std::size_t>(l) * static_cast<std::size_t>(NG) + static_cast<std::size_t>(j)] =
            net.flow(class_arc[static_cast<std::size_t>(l)][static_cast<std::size_t>(j)]);
  }

  // 4. Deal experts out: heaviest experts to the cheapest groups, each group's share cyclically
  //    over its GPUs.
  res.assignment = Assignment{L, E, std::vector<int>(static_cast<std::size_t>(L) * static_cast<std::size_t>(E), -1)};
  std::vector<long long> cursor(static_cast<std::size_t>(NG), 0);
  std::vector<int> groups(static_cast<std::size_t>(NG));
  for (int l = 0; l < L; ++l) {
    int const* experts = heavy.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(E);
    std::iota(groups.begin(), groups.end(), 0);
    std::stable_sort(groups.begin(), groups.end(), [&](int a, int b) {
      return gcost[static_cast<std::size_t>(l) * static_cast<std::size_t>(NG) + static_cast<std::size_t>(a)] <
             gcost[static_cast<std::size_t>(l) * static_cast<std::size_t>(NG) + static_cast<std::size_t>(b)];
    });
    std::size_t next = 0;
    for (int j : groups) {
      long long x = class_flow[static_cast<std::size_t>(l) * static_cast<std::size_t>(NG) + static_cast<std::size_t>(j)];
      auto const& gg = group_gpus[static_cast<std::size_t>(j)];
      for (long long u = 0; u < x; ++u) {
        int gpu = gg[static_cast<std::size_t>(cursor[static_cast<std::size_t>(j)]++ % static_cast<long long>(gg.size()))];
        res.assignment.gpu[static_cast<std::size_t>(l) * static_cast<std::size_t>(E) + static_cast<std::size_t>(experts[next++])] = gpu;
      }
    }
    check(next == static_cast<std::size_t>(E), "exact placement: internal error, layer ", l, " placed ", next, " of ", E);
  }
  double obj = 0;
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < E; ++e) obj += W(l, e) * C(l, res.assignment.gpu[static_cast<std::size_t>(l) * static_cast<std::size_t>(E) + static_cast<std::size_t>(e)]);
  res.objective = obj;
  return res;
}

}  // namespace detail

/// Solves the instance exactly. Throws moe::Error when the capacities cannot hold all experts.
inline ExactResult solve_exact(FlowInstance const& in, Solver solver = Solver::network_simplex) {
  return detail::solve_exact_impl(in, solver, nullptr);
}

/// The reduced network that solve_exact hands to the network simplex for this instance, built but
/// not run (benchmarks time other solvers on exactly this network). Same checks as solve_exact.
/// With presolve = false the chain arcs forced by c_layer are kept (a larger network, same optimum).
inline NetworkSimplex reduced_network(FlowInstance const& in, bool presolve = true) {
  NetworkSimplex net(1);
  detail::solve_exact_impl(in, Solver::network_simplex, &net, presolve);
  return net;
}

/// ILP: minimises the hops of all experts, every expert weighted 1.
inline ExactResult ilp(Problem const& p, Solver solver = Solver::network_simplex) {
  p.validate();
  return solve_exact(FlowInstance{p.layers, p.experts, p.gpus, p.c_layer, p.c_exp, p.cost_matrix(), {}}, solver);
}

/// ILPLoad: minimises the load-weighted hops; load is L x E (e.g. LoadProfile::totals()). Each
/// layer's loads are normalised to frequencies f(l, .) summing to one, as in the paper.
inline FlowInstance ilp_load_instance(Problem const& p, std::vector<double> const& load) {
  p.validate();
  check(load.size() == static_cast<std::size_t>(p.layers) * static_cast<std::size_t>(p.experts), "ILPLoad: load has ",
        load.size(), " entries, expected ", p.layers, "x", p.experts);
  std::vector<double> f(load.size());
  for (int l = 0; l < p.layers; ++l) {
    double s = 0;
    for (int e = 0; e < p.experts; ++e) {
      double v = load[static_cast<std::size_t>(l) * static_cast<std::size_t>(p.experts) + static_cast<std::size_t>(e)];
      check(std::isfinite(v) && v >= 0, "ILPLoad: load ", v, " of layer ", l, " expert ", e, " is negative or not finite");
      s += v;
    }
    for (int e = 0; e < p.experts; ++e) {
      std::size_t i = static_cast<std::size_t>(l) * static_cast<std::size_t>(p.experts) + static_cast<std::size_t>(e);
      f[i] = s > 0 ? load[i] / s : 1.0 / p.experts;
    }
  }
  return FlowInstance{p.layers, p.experts, p.gpus, p.c_layer, p.c_exp, p.cost_matrix(), std::move(f)};
}
inline ExactResult ilp_load(Problem const& p, std::vector<double> const& load, Solver solver = Solver::network_simplex) {
  return solve_exact(ilp_load_instance(p, load), solver);
}

}  // namespace moe::placement
