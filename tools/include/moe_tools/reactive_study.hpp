#pragma once
// A study for joint_compare (`--reactive greedy|lp|both`, `--reactive-rounds N`; docs/planners.md,
// "Routing that reacts to each batch"), not a plan: how far routing that knows each batch's own
// counts could take the joint planner's fixed placement. Every rank would first need every GPU's
// per-expert counts (an all-gather, charged by count_allgather_us); from them, each rank can
// compute the same routes.
//
// Per held-out batch and layer the routes are x(s, c): the token-expert pairs of source server s
// that copy c serves. Three ways to choose them:
//   - greedy_routes: the rule replication::Reactive applies on every rank, pair by pair (the
//     study runs that policy itself: Reactive::plan_batch, then Reactive::deal);
//   - round_routes: parallel rounds of reweighting from the static routes (a GPU kernel's shape);
//   - lp_routes (GLPK): two linear programs, the least possible busiest-GPU load M, then, with
//     every GPU within max((1 + eps) x mean, M), the least dispatch + combine bottleneck over the
//     server-to-server links: a bound on what such routing can do under the same model.
// None models de-duplication (a token sent once to a GPU holding several of its experts) or the
// NVLink level; the traffic model judges the result with both. DealtRoutes then gives the pairs of
// each (server, expert) to its copies exactly (no hashing), in batch order.

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#ifdef MOE_JOINT_COMPARE_GLPK
#include <glpk.h>
#endif

#include "moe/config.hpp"
#include "moe/replication/reactive.hpp"
#include "moe/topology/traffic.hpp"

namespace moe::study {

// The problem, the link loads and the greedy rule are the library's (replication::Reactive runs
// the greedy rule in the host layer).
using replication::reactive::greedy_routes;
using replication::reactive::ix;
using replication::reactive::LinkLoads;
using replication::reactive::RoutingProblem;
using replication::reactive::ServerPaths;

/// A rule made of parallel rounds (each a scatter of link loads, then an independent update of
/// every (server, expert) group), the shape a GPU kernel could take. It starts from the static
/// routes, `start[c]` = the share of column c's copy in its group under the plan's routing. Each
/// round prices every column by the most loaded link of its dispatch and combine paths, relative
/// to the busiest link and raised to `power` (so links near the top count most), plus how far its
/// GPU is over the cap, and scales the column by exp(-rate x (price - its group's lowest)) before
/// renormalising the group. Fractional; dealt like the others.
inline std::vector<double> round_routes(RoutingProblem const& p, ServerPaths const& path, std::vector<double> const& start,
                                        double eps, int rounds, double rate, double power = 4) {
  std::vector<double> x(p.cols.size());
  for (int se = 0; se < p.S * p.E; ++se)
    for (int c = p.first[ix(se)]; c < p.first[ix(se) + 1]; ++c) x[ix(c)] = p.n[ix(se)] * start[ix(c)];
  double cap = (1 + eps) * p.mean;
  std::vector<double> gpu(ix(p.G)), price(x.size());
  LinkLoads loads(path);
  for (int r = 0; r < rounds; ++r) {
    loads.clear();
    std::fill(gpu.begin(), gpu.end(), 0.0);
    for (std::size_t c = 0; c < x.size(); ++c) {
      gpu[ix(p.cols[c].g)] += x[c];
      loads.add(p.cols[c], x[c]);
    }
    double top = loads.top();
    if (top <= 0) break;
    for (std::size_t c = 0; c < x.size(); ++c)
      price[c] = std::pow(loads.worst(p.cols[c], 0) / top, power) + std::max(0.0, gpu[ix(p.cols[c].g)] / cap - 1);
    for (int se = 0; se < p.S * p.E; ++se) {
      int lo = p.first[ix(se)], hi = p.first[ix(se) + 1];
      if (hi - lo < 2) continue;
      double low = 1e300, sum = 0;
      for (int c = lo; c < hi; ++c) low = std::min(low, price[ix(c)]);
      for (int c = lo; c < hi; ++c) sum += (x[ix(c)] = (x[ix(c)] + 1e-3) * std::exp(-rate * (price[ix(c)] - low)));
      for (int c = lo; c < hi; ++c) x[ix(c)] *= p.n[ix(se)] / sum;
    }
  }
  return x;
}

#ifdef MOE_JOINT_COMPARE_GLPK
namespace detail {
/// A GLPK minimisation with non-negative columns, rows added one by one.
class Lp {
 public:
  explicit Lp(int columns) {
    glp_set_obj_dir(p_, GLP_MIN);
    glp_add_cols(p_, columns);
    for (int c = 1; c <= columns; ++c) glp_set_col_bnds(p_, c, GLP_LO, 0, 0);
  }
  Lp(Lp const&) = delete;
  Lp& operator=(Lp const&) = delete;
  ~Lp() { glp_delete_prob(p_); }
  int row(int type, double lo, double hi) {
    int r = glp_add_rows(p_, 1);
    glp_set_row_bnds(p_, r, type, lo, hi);
    return r;
  }
  void at(int r, int c, double v) { ia_.push_back(r), ja_.push_back(c), ar_.push_back(v); }
  void cost(int c, double v) { glp_set_obj_coef(p_, c, v); }
  void solve() {
    glp_load_matrix(p_, static_cast<int>(ia_.size()) - 1, ia_.data(), ja_.data(), ar_.data());
    glp_smcp parm;
    glp_init_smcp(&parm);
    parm.msg_lev = GLP_MSG_OFF;
    parm.presolve = GLP_ON;
    check(glp_simplex(p_, &parm) == 0 && glp_get_status(p_) == GLP_OPT, "reactive study: a linear program was not solved");
  }
  [[nodiscard]] double value(int c) const { return glp_get_col_prim(p_, c); }

 private:
  glp_prob* p_ = glp_create_prob();
  std::vector<int> ia_{0}, ja_{0};
  std::vector<double> ar_{0.0};
};
}  // namespace detail

/// The two linear programs (see the header comment); columns x(s, c) are 1 .. X.
inline std::vector<double> lp_routes(RoutingProblem const& p, ServerPaths const& path, double eps) {
  int X = static_cast<int>(p.cols.size());
  auto pairs_rows = [&](detail::Lp& lp) {
    for (int se = 0; se < p.S * p.E; ++se)
      if (p.n[ix(se)] > 0) {
        int r = lp.row(GLP_FX, p.n[ix(se)], p.n[ix(se)]);
        for (int c = p.first[ix(se)]; c < p.first[ix(se) + 1]; ++c) lp.at(r, c + 1, 1);
      }
  };
  double M = 0;  // program 1: then M
  {
    detail::Lp lp(X + 1);
    pairs_rows(lp);
    for (int g = 0; g < p.G; ++g) {
      int r = lp.row(GLP_UP, 0, 0);
      for (int c : p.of_gpu[ix(g)]) lp.at(r, c + 1, 1);
      lp.at(r, X + 1, -1);
    }
    lp.cost(X + 1, 1);
    lp.solve();
    M = lp.value(X + 1);
  }
  double cap = std::max((1 + eps) * p.mean, M * (1 + 1e-9) + 1e-9);

  detail::Lp lp(X + 2);  // program 2: then T_dispatch, T_combine
  pairs_rows(lp);
  for (int g = 0; g < p.G; ++g) {
    int r = lp.row(GLP_UP, 0, cap);
    for (int c : p.of_gpu[ix(g)]) lp.at(r, c + 1, 1);
  }
  std::vector<int> dispatch(ix(path.links()), 0), combine(ix(path.links()), 0);  // row per link, 0: none yet
  auto row_of = [&](std::vector<int>& rows, int l, int t_col) {
    if (rows[ix(l)] == 0) {
      rows[ix(l)] = lp.row(GLP_UP, 0, 0);
      lp.at(rows[ix(l)], t_col, -1);
    }
    return rows[ix(l)];
  };
  for (int c = 0; c < X; ++c) {
    auto const& col = p.cols[ix(c)];
    if (col.server == col.s) continue;
    for (auto [l, sec] : path(col.s, col.server)) lp.at(row_of(dispatch, l, X + 1), c + 1, sec);
    for (auto [l, sec] : path(col.server, col.s)) lp.at(row_of(combine, l, X + 2), c + 1, sec);
    lp.cost(c + 1, 1e-12);  // among equal bottlenecks, fewer pairs leave home
  }
  lp.cost(X + 1, 1);
  lp.cost(X + 2, 1);
  lp.solve();
  std::vector<double> x(ix(X));
  for (int c = 0; c < X; ++c) x[ix(c)] = std::max(0.0, lp.value(c + 1));
  return x;
}
#endif

/// Routes x(s, c) as a replica policy for TrafficModel::evaluate_policy: the m-th pair of (s, e)
/// in batch order goes to the copy whose cumulative count first passes m + 1/2.
class DealtRoutes : public replication::reactive::PairRoutes {
 public:
  DealtRoutes(topology::Topology const& topo, RoutingProblem const& p, std::vector<double> const& x,
              topology::Batch const& batch)
      : PairRoutes{batch.top_k, &batch.experts, std::vector<int>(batch.experts.size(), -1)} {
    std::vector<int> seen(p.n.size(), 0);
    for (int t = 0; t < batch.tokens(); ++t)
      for (int j = 0; j < k; ++j) {
        auto se = p.at(topo.server_of(batch.source[ix(t)]), batch.experts[ix(t * k + j)]);
        int lo = p.first[se], hi = p.first[se + 1];
        double sum = std::accumulate(x.begin() + lo, x.begin() + hi, 0.0), point = seen[se]++ + 0.5, acc = 0;
        int g = p.cols[ix(hi - 1)].g;
        for (int c = lo; c < hi; ++c) {
          acc += sum > 0 ? x[ix(c)] / sum * p.n[se] : p.n[se] / (hi - lo);
          if (point < acc) {
            g = p.cols[ix(c)].g;
            break;
          }
        }
        gpu[ix(t * k + j)] = g;
      }
  }
};

/// Time of an all-gather of every GPU's per-expert token counts (int32) in the traffic model: each
/// GPU sends its vector to every other GPU (one flow per pair; one direction of the model's
/// dispatch, latency included). Routing that reacts to a batch needs these counts on every rank
/// before dispatch.
inline double count_allgather_us(topology::TrafficModel const& model, int experts) {
  struct ToGpu {  // "expert" g is GPU g
    [[nodiscard]] int choose(int expert, int, int, long long) const { return expert; }
  };
  int G = model.gpus();
  topology::Batch b;
  b.top_k = 1;
  for (int a = 0; a < G; ++a)
    for (int d = 0; d < G; ++d)
      if (d != a) b.source.push_back(a), b.experts.push_back(d);
  std::vector<int> ids(ix(G));
  std::iota(ids.begin(), ids.end(), 0);
  topology::TrafficOptions o;
  o.hidden = experts;
  o.bytes_per_element = 4;
  return model.evaluate_policy(ToGpu{}, ids, b, o).dispatch_time * 1e6;
}

}  // namespace moe::study
