#pragma once
// The joint planner: replica counts, topology-aware placement of every copy, balance, and the
// routing of tokens to copies, in one plan per layer.
//
// ILPLoad places for the network but replicates nothing. EPLB and CRAFT replicate for balance but
// ignore the network, and their routing (any copy, whatever its distance) sends most tokens of a hot
// expert across the fabric however its copies are placed. This planner combines them per layer:
//
//   1. Slots and counts. S slots per GPU (default ceil((E + G) / G): at least G redundant slots per
//      layer, EPLB's default memory), so P = G x S copies. Each of the P - E extra copies goes to
//      the expert with the largest load per copy (the replication rule of EPLB and CRAFT).
//   2. Routing (transport). An expert's tokens come evenly from all GPUs. Each copy of an expert
//      with c copies serves exactly 1/c of them, so the per-GPU load is what the placement plans.
//      Subject to that, tokens go to the nearest copies: nearer distance levels fill first, each
//      server's tokens to the copies at the current distance that still have room (transport()).
//      On topologies whose server distances form an ultrametric (the fat trees), filling nearer
//      levels first minimises the expected distance for a given placement.
//   3. Placement. Copies go in order of load per copy, heaviest first. Each goes to a GPU with a
//      free slot and no copy of the expert yet, chosen by:
//        - balance: the GPU stays within (1 + eps) x mean load, when any GPU allows it;
//        - spread: among those, the server that most shortens the distance from the tokens to the
//          expert's nearest copy;
//        - then the least loaded GPU, then the lowest index.
//      (one key comparison per GPU: tier, value, server score, GPU load.)
//      A hot expert's copies thus spread over leaves first, then servers.
//   3b. Co-location (when Options::coact gives how many tokens chose each pair of experts
//      together): a token crosses to a GPU once however many of its experts run there, so a copy
//      placed next to copies of experts it is chosen with saves sends. Among the GPUs within the
//      caps, the value of a GPU is then the token-hops the spread saves (spread gain x the
//      expert's tokens per GPU) plus, for each partner f already on the GPU,
//      coact(e, f) / max(copies of e, copies of f) saved sends, each worth the mean server hops
//      to the GPU plus one. Routes list their copies in GPU order, so a token (one random point
//      for all its experts, replication::Routed) tends to pick co-located copies of two
//      replicated experts together. plan() keeps a layer's co-located placement only if its
//      largest GPU load stays within the cap (or within the plain placement's, where that misses
//      the cap too); otherwise it tries paced co-location (partners count only on a GPU at most one
//      slot ahead of its share of the cap), then none (LayerStats::co_location).
//   3c. Regrouping (with Options::coact, unless Options::regroup is off): swaps of two copies
//      between GPUs of one server, taken when they co-locate more co-chosen experts (the sum of
//      coact(e, f) / max(c_e, c_f) over the pairs sharing a GPU) and keep both GPUs within the
//      cap (or the layer's largest load before, if that is above it). A swap inside a server
//      changes neither server loads nor distances, so it only removes sends; the greedy of 3b
//      chooses servers and GPUs at once, copy by copy, and can leave pairs split inside a server
//      that a later copy made worth joining (regroup()). Where 3b kept a placement, 3c also
//      regroups the plain placement (steps 3 and 4 without co-activation) and keeps whichever of
//      the two saves more sends (ties: 3b's). Both meet the same caps, and under de-duplication
//      per rank only experts sharing a GPU save a send, so the saved sends compare them; 3b's
//      greedy sometimes spends a server's slots on pairs that regrouping the plain placement
//      beats.
//   4. Server cap (when Options::load_sd gives each expert's batch-to-batch load spread): a copy
//      also keeps its server's expected load plus z standard deviations within (1 + server_eps)
//      x the server's share; among servers within both caps the spread rule decides, ties going
//      to the lower server score. Meant for NIC-bound clusters, where the busiest server's
//      ingress follows how far its experts' loads drift from the plan.
//   Options::counts replaces step 1 with given counts (e.g. EPLB's: the two-step baseline).
//
// replication::Routed (replication/routed.hpp) runs the routing in the host layer: per (source
// server, expert), the copies and their shares.
//
// For each layer the result reports three things:
//   - the expected distance: the load-weighted mean server hops from a token to its copy;
//   - a lower bound on that distance for the same copy counts, valid for every placement and every
//     routing that gives each copy 1/c of its expert's tokens (hops_lower_bound; it is exact on
//     symmetric fat trees when c copies can spread evenly over the leaves and servers);
//   - the largest GPU load over the mean.
//
// Infeasible input is a moe::Error naming the constraint:
//   - S x G < E (too few slots for the experts);
//   - eps < 0, or an eps that no plan can meet: an expert whose load, over the most copies the
//     slots allow it (min(G, P - E + 1)), still exceeds (1 + eps) x the mean per copy. Otherwise eps
//     is a target the greedy placement keeps where the slots allow, and the result reports the
//     largest GPU load reached (max_load_ratio);
//   - loads of the wrong size, or negative loads;
//   - a topology that is not finalized (finalize() also rejects unconnected servers).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "moe/config.hpp"
#include "moe/plan/plan_io.hpp"
#include "moe/replication/routed.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/topology/topology.hpp"

namespace moe::placement::joint {

struct Options {
  int slots_per_gpu = 0;  ///< S; 0 = min(E, ceil((E + G) / G))
  double eps = 0.05;      ///< per-GPU load <= (1 + eps) x mean where the slots allow it
  /// Copies per expert, layers x experts row-major, instead of step 1's rule (e.g. EPLB's logcnt,
  /// for the two-step baseline: someone else's counts, this planner's placement and routing).
  /// Empty = step 1. Each count in [1, G]; a layer's counts sum to at most G x S.
  std::vector<int> counts;
  /// Batch-to-batch standard deviation of each expert's load, layers x experts in the units of
  /// `loads` (e.g. the sd of one batch's load times the number of batches summed into `loads`).
  /// Non-empty turns on the server cap: a copy goes to a server only if the server's expected load
  /// plus z standard deviations stays within (1 + server_eps) x its share of the layer's total
  /// (mean plus z sd of the total variance spread evenly), where a server allows it.
  std::vector<double> load_sd;
  double z = 2.0;
  double server_eps = 0.02;
  /// Token-level co-activation, layers x experts x experts row-major, symmetric: how many tokens
  /// chose both experts, in the units of `loads` (e.g. summed over the same batches; see
  /// add_coactivation). Non-empty turns on co-location: a copy's GPU is also scored by the tokens
  /// it would share with the copies already there (step 3b of the file comment).
  std::vector<double> coact;
  /// With coact: after the placement, swap copies between the GPUs of each server where that
  /// co-locates more co-chosen experts (step 3c of the file comment). false = steps 3 and 3b only.
  bool regroup = true;
};

/// Adds the co-selections of a batch of tokens to `out` (experts x experts, row-major): for every
/// token and every ordered pair of distinct experts it chose, out[e * experts + f] += 1.
/// `chosen`: tokens x top_k expert ids.
inline void add_coactivation(std::span<int const> chosen, int top_k, int experts, std::span<double> out) {
  check(top_k > 0 && chosen.size() % static_cast<std::size_t>(top_k) == 0, "coactivation: ", chosen.size(),
        " expert ids do not split into tokens of top_k = ", top_k);
  check(out.size() == static_cast<std::size_t>(experts) * static_cast<std::size_t>(experts), "coactivation: ",
        out.size(), " cells for ", experts, " x ", experts, " experts");
  for (std::size_t t = 0; t < chosen.size(); t += static_cast<std::size_t>(top_k))
    for (int i = 0; i < top_k; ++i)
      for (int j = 0; j < top_k; ++j) {
        int e = chosen[t + static_cast<std::size_t>(i)], f = chosen[t + static_cast<std::size_t>(j)];
        check(e >= 0 && e < experts && f >= 0 && f < experts, "coactivation: expert ", e < 0 || e >= experts ? e : f,
              " outside [0, ", experts, ")");
        if (e != f) out[static_cast<std::size_t>(e) * static_cast<std::size_t>(experts) + static_cast<std::size_t>(f)] += 1;
      }
}

/// The server cap of Options (load_sd, z, server_eps) for one layer.
struct ServerCap {
  double const* sd = nullptr;  ///< per expert; nullptr = no server cap
  double z = 2.0;
  double eps = 0.02;
};

/// Options::coact of one layer: experts x experts; nullptr = no co-location.
struct Coactivation {
  double const* tokens = nullptr;
  /// 0: co-location counts on every GPU within the caps. k > 0: only on a GPU whose load after the
  /// copy stays within cap x (slots filled + k - 1) / S (at most k - 1 slots ahead of its share).
  int pace = 0;
};

struct LayerStats {
  double mean_hops = 0;       ///< load-weighted expected server hops from a token to its copy
  double hops_bound = 0;      ///< lower bound on mean_hops for the same copy counts
  double max_load_ratio = 0;  ///< largest GPU load / mean GPU load
  int replicas = 0;           ///< copies beyond one per expert
  /// Step 3b's placement kept: -1 if none was asked, none met the cap, or step 3c regrouped the
  /// plain placement to more saved sends; else the pace used (0 = unpaced).
  int co_location = -1;
  int regroup_swaps = 0;      ///< swaps step 3c made
  double co_located_before = 0;  ///< sends co-location saves (regroup()) before step 3c, in coact's units
  double co_located = 0;         ///< ... and after it
};

/// Steps 3b and 3c summed over the layers of a plan (Result::co_location_totals).
struct CoLocationTotals {
  int layers = 0;           ///< layers that kept step 3b's placement (LayerStats::co_location >= 0)
  int swaps = 0;            ///< step 3c's swaps
  double saved_before = 0;  ///< LayerStats::co_located_before, summed
  double saved_after = 0;   ///< LayerStats::co_located, summed
};

/// Routing of one layer: routes[s][e] = the copies serving server s's tokens of expert e.
using LayerRoutes = std::vector<std::vector<std::vector<replication::RouteShare>>>;

struct Result {
  int slots_per_gpu = 0;
  std::vector<LayerPlan> plan;      ///< per layer: primary = first copy; copies in placement order
  std::vector<LayerRoutes> routes;  ///< per layer
  std::vector<LayerStats> stats;
  double seconds = 0;

  /// The replica policy that runs layer l of this plan.
  [[nodiscard]] replication::Routed policy(int l, topology::Topology const& topo) const {
    return {plan[static_cast<std::size_t>(l)].replicas.replicas(), topo, routes[static_cast<std::size_t>(l)]};
  }

  [[nodiscard]] CoLocationTotals co_location_totals() const {
    CoLocationTotals t;
    for (auto const& st : stats) {
      t.layers += st.co_location >= 0;
      t.swaps += st.regroup_swaps;
      t.saved_before += st.co_located_before;
      t.saved_after += st.co_located;
    }
    return t;
  }
};

/// Options::load_sd from a profile of batches whose totals are the planner's loads: for each layer
/// and expert, the standard deviation of one batch's load over the batches (population form),
/// times the number of batches (the scale of the totals). Any type with batches(), layers(),
/// experts() and row(b, l) (e.g. profile::LoadProfile).
template <class Profile>
std::vector<double> load_spread(Profile const& p) {
  int B = p.batches(), L = p.layers(), E = p.experts();
  std::vector<double> sd(static_cast<std::size_t>(L) * static_cast<std::size_t>(E), 0.0);
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < E; ++e) {
      double s1 = 0, s2 = 0;
      for (int b = 0; b < B; ++b) {
        double x = p.row(b, l)[e];
        s1 += x, s2 += x * x;
      }
      double mean = s1 / B;
      sd[static_cast<std::size_t>(l) * static_cast<std::size_t>(E) + static_cast<std::size_t>(e)] =
          B * std::sqrt(std::max(0.0, s2 / B - mean * mean));
    }
  return sd;
}

/// Copies per expert: one each, then `extra` more, each to the largest load per copy (first of
/// equals), at most `max_copies` of one expert.
inline std::vector<int> copy_counts(double const* load, int experts, int extra, int max_copies) {
  check(static_cast<long long>(experts) * max_copies >= static_cast<long long>(experts) + extra, "joint: ", extra,
        " extra copies do not fit with at most ", max_copies, " copies of each of ", experts, " experts");
  std::vector<int> c(static_cast<std::size_t>(experts), 1);
  for (int i = 0; i < extra; ++i) {
    int best = -1;
    for (int e = 0; e < experts; ++e) {
      if (c[static_cast<std::size_t>(e)] >= max_copies) continue;
      if (best < 0 || load[e] * c[static_cast<std::size_t>(best)] > load[best] * c[static_cast<std::size_t>(e)])
        best = e;
    }
    ++c[static_cast<std::size_t>(best)];
  }
  return c;
}

/// The distinct server distances of a topology, ascending (0 first).
inline std::vector<int> distance_levels(topology::Topology const& topo) {
  std::vector<int> d{0};
  for (int a = 0; a < topo.servers(); ++a)
    for (int b = 0; b < topo.servers(); ++b) d.push_back(topo.server_hops(a, b));
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  return d;
}

/// Routing of one expert (rules in the file comment): for each server, the copies (indices into
/// `copies`) serving its tokens with their shares.
inline std::vector<std::vector<replication::RouteShare>> transport(topology::Topology const& topo,
                                                                   std::vector<int> const& copies,
                                                                   std::vector<int> const& levels) {
  int S = topo.servers(), G = topo.gpus();
  auto c = static_cast<double>(copies.size());
  std::vector<double> supply(static_cast<std::size_t>(S));  // in GPUs' worth of tokens
  for (int s = 0; s < S; ++s) supply[static_cast<std::size_t>(s)] = topo.gpus_of_server(s);
  std::vector<double> room(copies.size(), G / c);
  std::vector<std::vector<replication::RouteShare>> out(static_cast<std::size_t>(S));
  constexpr double tiny = 1e-12;
  for (int d : levels)
    for (int s = 0; s < S; ++s)
      for (std::size_t i = 0; i < copies.size() && supply[static_cast<std::size_t>(s)] > tiny; ++i) {
        if (room[i] <= tiny || topo.server_hops(s, topo.server_of(copies[i])) != d) continue;
        double x = std::min(supply[static_cast<std::size_t>(s)], room[i]);
        supply[static_cast<std::size_t>(s)] -= x;
        room[i] -= x;
        out[static_cast<std::size_t>(s)].push_back({copies[i], x / topo.gpus_of_server(s)});
      }
  // Rounding leftovers: scale each server's shares to sum to one. Entries go in GPU order, so that
  // a token (which draws one point for all its experts, replication::Routed) tends to pick
  // co-located copies of two experts together.
  for (auto& r : out) {
    std::sort(r.begin(), r.end(), [](auto const& a, auto const& b) { return a.gpu < b.gpu; });
    double sum = 0;
    for (auto const& x : r) sum += x.share;
    check(!r.empty() && sum > 0, "joint: internal error: a server's tokens have no copy");
    for (auto& x : r) x.share /= sum;
  }
  return out;
}

/// Expected server hops of a routing: tokens spread evenly over the GPUs.
inline double routed_hops(topology::Topology const& topo, std::vector<std::vector<replication::RouteShare>> const& r) {
  double sum = 0;
  for (int s = 0; s < topo.servers(); ++s)
    for (auto const& x : r[static_cast<std::size_t>(s)])
      sum += topo.gpus_of_server(s) * x.share * topo.server_hops(s, topo.server_of(x.gpu));
  return sum / topo.gpus();
}

/// A lower bound on the expected hops of c copies of an expert over every placement and every
/// routing giving each copy 1/c of the tokens. For each distance level d > 0, a copy serves
/// at most min(1/c, ball(d) / G) of the tokens from closer than d, where ball(d) is the most GPUs
/// within distance < d of one server; so a fraction of at least 1 - min(1, c ball(d) / G) of the
/// tokens travels d or more. Summing the level steps gives the bound (exact on symmetric fat trees
/// when the copies can spread evenly; test_joint checks it against brute force and GLPK).
inline double hops_lower_bound(int c, int gpus, std::vector<int> const& levels, std::vector<int> const& balls) {
  double bound = 0;
  for (std::size_t k = 1; k < levels.size(); ++k) {
    double near = std::min(1.0, static_cast<double>(c) * balls[k] / gpus);
    bound += (levels[k] - levels[k - 1]) * (1.0 - near);
  }
  return bound;
}

/// ball(d) for each distance level d: the most GPUs within distance < d of one server.
inline std::vector<int> level_balls(topology::Topology const& topo, std::vector<int> const& levels) {
  int S = topo.servers();
  std::vector<int> balls(levels.size(), 0);
  for (std::size_t k = 0; k < levels.size(); ++k)
    for (int s = 0; s < S; ++s) {
      int n = 0;
      for (int t = 0; t < S; ++t)
        if (topo.server_hops(s, t) < levels[k]) n += topo.gpus_of_server(t);
      balls[k] = std::max(balls[k], n);
    }
  return balls;
}

/// Placement of one layer (rules in the file comment): copies per expert, in placement order.
/// `fixed` (optional, `experts` entries): the copy counts to place instead of copy_counts'.
inline std::vector<std::vector<int>> place_layer(topology::Topology const& topo, double const* load, int experts,
                                                 int slots_per_gpu, double eps, int const* fixed = nullptr,
                                                 ServerCap const& sc = {}, Coactivation const& co = {}) {
  int G = topo.gpus(), S = topo.servers(), E = experts;
  auto counts = fixed ? std::vector<int>(fixed, fixed + E) : copy_counts(load, E, G * slots_per_gpu - E, G);
  if (fixed) {
    long long sum = 0;
    for (int e = 0; e < E; ++e) {
      check(counts[static_cast<std::size_t>(e)] >= 1 && counts[static_cast<std::size_t>(e)] <= G, "joint: expert ", e,
            " is given ", counts[static_cast<std::size_t>(e)], " copies; each needs 1 to ", G, " (one per GPU)");
      sum += counts[static_cast<std::size_t>(e)];
    }
    check(sum <= static_cast<long long>(G) * slots_per_gpu, "joint: the given counts make ", sum, " copies, more than the ",
          static_cast<long long>(G) * slots_per_gpu, " slots");
  }
  double total = 0;
  for (int e = 0; e < E; ++e) total += load[e];
  double cap = (1.0 + eps) * total / G;
  // An expert has at most min(G, P - E + 1) copies (one per GPU; every other expert needs a slot),
  // so its heaviest copy carries at least load / that: above the cap, no plan meets the bound.
  int most = std::min(G, G * slots_per_gpu - E + 1);
  for (int e = 0; e < E && !fixed; ++e)
    check(load[e] / most <= cap * (1 + 1e-12), "joint: expert ", e, " needs more than ", most,
          " copies to stay within (1 + eps) x the mean GPU load (1 + eps = ", 1.0 + eps, ", its copies carry ",
          load[e] / most / (total / G), " x the mean with ", most,
          "): eps is too tight for these loads and slots (raise eps or the slots per GPU)");
  std::vector<int> order(static_cast<std::size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return load[a] * counts[static_cast<std::size_t>(b)] > load[b] * counts[static_cast<std::size_t>(a)];
  });
  int far = distance_levels(topo).back();
  // Server cap: expected load + z sd of each server against its share of the total plus z times
  // the sd it would have if the copies' variance were spread evenly over the GPUs.
  std::vector<double> sl(static_cast<std::size_t>(S), 0.0), sv(static_cast<std::size_t>(S), 0.0),
      scap(static_cast<std::size_t>(S), std::numeric_limits<double>::infinity());
  if (sc.sd) {
    double var = 0;
    for (int e = 0; e < E; ++e) var += sc.sd[e] * sc.sd[e] / counts[static_cast<std::size_t>(e)];
    for (int s = 0; s < S; ++s) {
      double f = static_cast<double>(topo.gpus_of_server(s)) / G;
      scap[static_cast<std::size_t>(s)] = (1.0 + sc.eps) * (f * total + sc.z * std::sqrt(f * var));
    }
  }
  auto score = [&](int s, double w, double v) {
    return sl[static_cast<std::size_t>(s)] + w + sc.z * std::sqrt(sv[static_cast<std::size_t>(s)] + v);
  };
  std::vector<double> gl(static_cast<std::size_t>(G), 0.0);
  std::vector<int> left(static_cast<std::size_t>(G), slots_per_gpu);
  std::vector<std::vector<int>> where(static_cast<std::size_t>(E));
  std::vector<std::vector<int>> on_gpu(static_cast<std::size_t>(G));  // experts placed on each GPU
  std::vector<int> dist(static_cast<std::size_t>(S));
  std::vector<char> has(static_cast<std::size_t>(G));
  // What a send to server s costs: one for the GPU's own link plus the mean server hops from a token
  // (spread over all GPUs) to s.
  std::vector<double> reach(static_cast<std::size_t>(S), 0.0);
  for (int s = 0; s < S; ++s)
    for (int t = 0; t < S; ++t) reach[static_cast<std::size_t>(s)] += topo.gpus_of_server(t) * topo.server_hops(t, s);
  for (auto& x : reach) x = 1 + x / G;
  for (int e : order) {
    int c = counts[static_cast<std::size_t>(e)];
    double w = load[e] / c;
    double v = sc.sd ? sc.sd[e] * sc.sd[e] / (static_cast<double>(c) * c) : 0.0;
    std::fill(dist.begin(), dist.end(), far + 1);  // no copy yet: farther than anything
    std::fill(has.begin(), has.end(), 0);
    for (int k = 0; k < c; ++k) {
      // Candidates: every GPU with a free slot and no copy of e, ranked by the key
      //   (tier, value, -server score, -GPU load), larger first, the lowest GPU among equals.
      // Tier: 2 = within the GPU and the server cap, 1 = within the GPU cap, 0 = neither. Value
      // (tier 2 only): the spread gain of the GPU's server; with co-activation, the token-hops it
      // saves (spread gain x the expert's tokens per GPU) plus the cost (reach) of the sends that
      // co-location saves. The server score breaks ties in tier 1, and in tier 2 when the server
      // cap is on.
      using Key = std::tuple<int, double, double, double>;
      int best_gpu = -1;
      Key best{};
      double gain = 0;
      for (int g = 0, gain_of = -1; g < G; ++g) {
        if (left[static_cast<std::size_t>(g)] == 0 || has[static_cast<std::size_t>(g)]) continue;
        int s = topo.server_of(g);
        if (s != gain_of) {  // the spread gain is per server
          gain = 0, gain_of = s;
          for (int t = 0; t < S; ++t)
            gain += static_cast<double>(topo.gpus_of_server(t)) *
                    std::max(0, dist[static_cast<std::size_t>(t)] - topo.server_hops(t, s));
        }
        double shared = 0;  // tokens choosing e and a partner here, routed to both copies: sends saved
        // With pacing, co-location counts only on a GPU that keeps up with its share of the cap for
        // the slots it will have filled, so that grouping does not leave the last copies only
        // overfull GPUs (plan() falls back to pacing when the unpaced placement breaks the cap).
        bool pace = co.pace == 0 || gl[static_cast<std::size_t>(g)] + w <=
                                        cap * static_cast<double>(slots_per_gpu - left[static_cast<std::size_t>(g)] + co.pace) /
                                            slots_per_gpu;
        if (co.tokens && pace)
          for (int f : on_gpu[static_cast<std::size_t>(g)])
            shared += co.tokens[static_cast<std::size_t>(e) * static_cast<std::size_t>(E) + static_cast<std::size_t>(f)] /
                      std::max(c, counts[static_cast<std::size_t>(f)]);
        double sco = score(s, w, v);
        bool fits = gl[static_cast<std::size_t>(g)] + w <= cap;
        int tier = fits ? (sco <= scap[static_cast<std::size_t>(s)] ? 2 : 1) : 0;
        double value = 0;
        if (tier == 2 && co.tokens)
          value = gain * load[e] / G + shared * reach[static_cast<std::size_t>(s)];
        else if (tier == 2)
          value = gain;
        Key key{tier, value, tier == 1 || (tier == 2 && sc.sd) ? -sco : 0.0, -gl[static_cast<std::size_t>(g)]};
        if (best_gpu < 0 || key > best) best_gpu = g, best = key;
      }
      check(best_gpu >= 0, "joint: no GPU has a free slot for a copy of expert ", e, " (", slots_per_gpu,
            " slots per GPU)");
      where[static_cast<std::size_t>(e)].push_back(best_gpu);
      on_gpu[static_cast<std::size_t>(best_gpu)].push_back(e);
      has[static_cast<std::size_t>(best_gpu)] = 1;
      gl[static_cast<std::size_t>(best_gpu)] += w;
      --left[static_cast<std::size_t>(best_gpu)];
      int bs = topo.server_of(best_gpu);
      sl[static_cast<std::size_t>(bs)] += w;
      sv[static_cast<std::size_t>(bs)] += v;
      for (int t = 0; t < S; ++t)
        dist[static_cast<std::size_t>(t)] = std::min(dist[static_cast<std::size_t>(t)], topo.server_hops(t, bs));
    }
  }
  return where;
}

/// Each GPU's load when expert e's load[e] is split evenly over its copies `where[e]` (GPU ids in
/// [0, gpus), every expert with at least one copy).
inline std::vector<double> even_split_loads(std::vector<std::vector<int>> const& where, double const* load, int gpus) {
  std::vector<double> g(static_cast<std::size_t>(gpus), 0.0);
  for (std::size_t e = 0; e < where.size(); ++e)
    for (int x : where[e]) g[static_cast<std::size_t>(x)] += load[e] / static_cast<double>(where[e].size());
  return g;
}

/// What regroup() did to one layer.
struct Regrouping {
  double saved_before = 0;  ///< co-located sends (see regroup) of the placement it was given
  double saved_after = 0;   ///< ... and of the placement it returns
  int swaps = 0;
};

/// Step 3c (file comment): swaps of two copies between GPUs of one server that raise the sends
/// that co-location saves, sum over GPUs and over pairs of experts {e, f} on the GPU of
/// coact(e, f) / max(c_e, c_f). A swap keeps every server's copies, so server loads, distances and
/// routes between servers stay as they were; it is taken only if both GPUs stay within
/// max((1 + eps) x the mean load, the largest GPU load before) and neither would hold an expert
/// twice. First improvement, pass after pass until no swap improves (at most 100 passes).
/// `where`: the copies of each expert (GPU ids), changed in place; `load`, `coact`: the layer's.
inline Regrouping regroup(topology::Topology const& topo, std::vector<std::vector<int>>& where, double const* load,
                          double eps, double const* coact) {
  check(topo.finalized(), "regroup: the topology is not finalized");
  check(std::isfinite(eps) && eps >= 0, "regroup: the balance bound eps = ", eps, " must be >= 0");
  auto G = static_cast<std::size_t>(topo.gpus()), E = where.size();
  std::vector<std::vector<int>> on(G);  // experts on each GPU
  double total = 0;
  for (std::size_t e = 0; e < E; ++e) {
    check(!where[e].empty(), "regroup: expert ", e, " has no copy");
    total += load[e];
    for (int g : where[e]) {
      check(g >= 0 && static_cast<std::size_t>(g) < G, "regroup: expert ", e, " has a copy on GPU ", g, ", outside [0, ",
            G, ")");
      on[static_cast<std::size_t>(g)].push_back(static_cast<int>(e));
    }
  }
  std::vector<double> gpu_load = even_split_loads(where, load, topo.gpus());
  std::vector<std::vector<std::size_t>> members(static_cast<std::size_t>(topo.servers()));  // GPUs of each server
  for (std::size_t g = 0; g < G; ++g) members[static_cast<std::size_t>(topo.server_of(static_cast<int>(g)))].push_back(g);
  double cap = std::max((1 + eps) * total / static_cast<double>(G), *std::max_element(gpu_load.begin(), gpu_load.end()));
  auto pair = [&](int e, int f) {
    auto ue = static_cast<std::size_t>(e), uf = static_cast<std::size_t>(f);
    return coact[ue * E + uf] / static_cast<double>(std::max(where[ue].size(), where[uf].size()));
  };
  auto shared = [&](int e, std::size_t g, int skip) {  // what e shares with the experts on g but e and skip
    double x = 0;
    for (int f : on[g])
      if (f != skip && f != e) x += pair(e, f);
    return x;
  };
  auto holds = [&](std::size_t g, int e) { return std::find(on[g].begin(), on[g].end(), e) != on[g].end(); };
  auto saved = [&] {
    double x = 0;
    for (auto const& v : on)
      for (std::size_t i = 0; i < v.size(); ++i)
        for (std::size_t j = i + 1; j < v.size(); ++j) x += pair(v[i], v[j]);
    return x;
  };
  Regrouping r;
  r.saved_before = saved();
  for (int pass = 0; pass < 100; ++pass) {
    int before = r.swaps;
    for (auto const& m : members)
      for (std::size_t i = 0; i < m.size(); ++i)
        for (std::size_t j = i + 1; j < m.size(); ++j) {
          std::size_t g1 = m[i], g2 = m[j];
          for (auto& e : on[g1])
            for (auto& f : on[g2]) {
              if (e == f || holds(g2, e) || holds(g1, f)) continue;
              auto ue = static_cast<std::size_t>(e), uf = static_cast<std::size_t>(f);
              double d = load[uf] / static_cast<double>(where[uf].size()) - load[ue] / static_cast<double>(where[ue].size());
              if (gpu_load[g1] + d > cap || gpu_load[g2] - d > cap) continue;
              double gain = shared(e, g2, f) + shared(f, g1, e) - shared(e, g1, e) - shared(f, g2, f);
              if (gain <= 1e-9 * (1 + r.saved_before)) continue;
              std::replace(where[ue].begin(), where[ue].end(), static_cast<int>(g1), static_cast<int>(g2));
              std::replace(where[uf].begin(), where[uf].end(), static_cast<int>(g2), static_cast<int>(g1));
              gpu_load[g1] += d, gpu_load[g2] -= d;
              std::swap(e, f);  // on[g1] now holds f where e was, on[g2] e where f was
              ++r.swaps;
            }
        }
    if (r.swaps == before) break;
  }
  r.saved_after = saved();
  return r;
}

/// The whole plan for `loads` (layers x experts, row-major; e.g. LoadProfile::totals()).
inline Result plan(topology::Topology const& topo, std::vector<double> const& loads, int layers, int experts,
                   Options const& o = {}) {
  auto t0 = std::chrono::steady_clock::now();
  check(topo.finalized(), "joint: the topology is not finalized");
  int G = topo.gpus(), E = experts;
  check(layers > 0 && E > 0, "joint: layers (", layers, ") and experts (", E, ") must be positive");
  check(loads.size() == static_cast<std::size_t>(layers) * static_cast<std::size_t>(E), "joint: ", loads.size(),
        " loads for ", layers, " layers x ", E, " experts");
  for (double v : loads) check(std::isfinite(v) && v >= 0, "joint: load ", v, " is negative or not finite");
  check(std::isfinite(o.eps) && o.eps >= 0, "joint: the balance bound eps = ", o.eps, " must be >= 0");
  Result r;
  r.slots_per_gpu = o.slots_per_gpu > 0 ? o.slots_per_gpu : std::min(E, (E + G + G - 1) / G);
  check(static_cast<long long>(r.slots_per_gpu) * G >= E, "joint: ", r.slots_per_gpu, " slots on each of ", G,
        " GPUs cannot hold ", E, " experts (S x G >= E is needed)");
  check(r.slots_per_gpu <= E, "joint: ", r.slots_per_gpu, " slots per GPU is more than the ", E,
        " experts (a GPU holds an expert once)");
  check(o.load_sd.empty() || o.load_sd.size() == loads.size(), "joint: ", o.load_sd.size(), " load deviations for ",
        layers, " layers x ", E, " experts");
  for (double v : o.load_sd) check(std::isfinite(v) && v >= 0, "joint: load deviation ", v, " is negative or not finite");
  check(std::isfinite(o.z) && o.z >= 0 && std::isfinite(o.server_eps) && o.server_eps >= 0, "joint: z (", o.z,
        ") and server_eps (", o.server_eps, ") must be >= 0");
  check(o.counts.empty() || o.counts.size() == loads.size(), "joint: ", o.counts.size(), " copy counts for ", layers,
        " layers x ", E, " experts");
  auto cells = static_cast<std::size_t>(E) * static_cast<std::size_t>(E);
  check(o.coact.empty() || o.coact.size() == static_cast<std::size_t>(layers) * cells, "joint: ", o.coact.size(),
        " co-activation counts for ", layers, " layers x ", E, " x ", E, " experts");
  for (double v : o.coact) check(std::isfinite(v) && v >= 0, "joint: co-activation count ", v, " is negative or not finite");
  auto levels = distance_levels(topo);
  auto balls = level_balls(topo, levels);
  for (int l = 0; l < layers; ++l) {
    double const* w = loads.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(E);
    int const* fixed = o.counts.empty() ? nullptr : o.counts.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(E);
    ServerCap scap{o.load_sd.empty() ? nullptr : o.load_sd.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(E),
                   o.z, o.server_eps};
    auto where = place_layer(topo, w, E, r.slots_per_gpu, o.eps, fixed, scap);
    LayerStats st;
    if (!o.coact.empty()) {
      double const* co_layer = o.coact.data() + static_cast<std::size_t>(l) * cells;
      // Co-location, unless it breaks the GPU cap that the plain placement meets: then paced
      // co-location (at most one slot ahead of a GPU's share), then none.
      double tot = std::accumulate(w, w + E, 0.0);
      auto worst = [&](std::vector<std::vector<int>> const& wh) {
        auto g = even_split_loads(wh, w, G);
        return tot > 0 ? *std::max_element(g.begin(), g.end()) / (tot / G) : 1.0;
      };
      double bound = (1 + o.eps) * (1 + 1e-9), plain = worst(where);
      std::vector<std::vector<int>> plain_where;  // step 3c's second start, where co-location is kept
      for (int pace : {0, 2}) {
        auto co = place_layer(topo, w, E, r.slots_per_gpu, o.eps, fixed, scap, Coactivation{co_layer, pace});
        if (worst(co) <= std::max(bound, plain)) {
          plain_where = std::exchange(where, std::move(co));
          st.co_location = pace;
          break;
        }
      }
      if (o.regroup) {
        auto rg = regroup(topo, where, w, o.eps, co_layer);
        if (st.co_location >= 0) {  // also from the plain placement; the one saving more sends
          auto rp = regroup(topo, plain_where, w, o.eps, co_layer);
          if (rp.saved_after > rg.saved_after) {
            where = std::move(plain_where);
            rg = rp;
            st.co_location = -1;
          }
        }
        st.regroup_swaps = rg.swaps;
        st.co_located_before = rg.saved_before;
        st.co_located = rg.saved_after;
      }
    }
    LayerRoutes routes(static_cast<std::size_t>(topo.servers()),
                       std::vector<std::vector<replication::RouteShare>>(static_cast<std::size_t>(E)));
    std::vector<double> gl(static_cast<std::size_t>(G), 0.0);
    double total = 0;
    for (int e = 0; e < E; ++e) {
      auto const& c = where[static_cast<std::size_t>(e)];
      auto re = transport(topo, c, levels);
      total += w[e];
      st.replicas += static_cast<int>(c.size()) - 1;
      st.mean_hops += w[e] * routed_hops(topo, re);
      st.hops_bound += w[e] * hops_lower_bound(static_cast<int>(c.size()), G, levels, balls);
      for (int s = 0; s < topo.servers(); ++s) {
        for (auto const& x : re[static_cast<std::size_t>(s)])
          gl[static_cast<std::size_t>(x.gpu)] += w[e] * x.share * topo.gpus_of_server(s) / G;
        routes[static_cast<std::size_t>(s)][static_cast<std::size_t>(e)] = std::move(re[static_cast<std::size_t>(s)]);
      }
    }
    if (total > 0) st.mean_hops /= total, st.hops_bound /= total;
    double mean = total / G;
    st.max_load_ratio = mean > 0 ? *std::max_element(gl.begin(), gl.end()) / mean : 1.0;
    std::vector<int> primary;
    for (auto const& c : where) primary.push_back(c.front());
    r.plan.push_back({Table(std::move(primary)), replication::Table(std::move(where))});
    r.routes.push_back(std::move(routes));
    r.stats.push_back(st);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

/// The routing of a layer whose copies are given (e.g. read back from a plan file): the planner's
/// transport rule for every expert, so a plan file plus the topology determine the routes.
inline replication::Routed routed_policy(replication::Table const& copies, topology::Topology const& topo) {
  auto levels = distance_levels(topo);
  LayerRoutes routes(static_cast<std::size_t>(topo.servers()),
                     std::vector<std::vector<replication::RouteShare>>(copies.replicas().size()));
  for (std::size_t e = 0; e < copies.replicas().size(); ++e) {
    auto re = transport(topo, copies.replicas()[e], levels);
    for (int s = 0; s < topo.servers(); ++s)
      routes[static_cast<std::size_t>(s)][e] = std::move(re[static_cast<std::size_t>(s)]);
  }
  return {copies.replicas(), topo, routes};
}

}  // namespace moe::placement::joint
