#pragma once
// Rebalancing that moves the fewest expert weights: given the current slot layout of every layer
// (phy2log: slot p of a layer on GPU p / S, S slots per GPU) and new loads, a new layout whose
// largest GPU load is within (1 + tolerance) of what EPLB recomputed from scratch reaches on the
// new loads, keeping experts where they are as far as possible, and the transfers it implies.
//
// A slot "needs a copy" when the GPU holding it had no copy of the slot's new expert before: its
// weights must come over NVLink or the network from a GPU that had one. A slot whose new expert the
// GPU already held (in another slot) needs at most a copy inside the GPU; those are not counted.
//
// Per layer (layers are independent):
//  1. The target T = (1 + tolerance) x the largest GPU load of EPLB's plan on the new loads (the
//     hierarchical policy when groups split over nodes, as eplb.py chooses). A GPU's load is the
//     sum over its slots of load(e) / copies(e).
//  2. Local search from the old layout, while the heaviest GPU h is above T. Candidate moves, each
//     changing one or two slots:
//       swap     a slot of h with a slot of one of the `candidate_gpus` lightest GPUs;
//       replace  a slot of h (whose expert has another copy) by an expert h held before, or by one
//                of the `candidate_gpus` experts with the least load per copy after one more copy
//                (chosen when the layer's search starts);
//       add      a copy of one of h's `hot_experts` experts with the most load per copy into a slot of one of the lightest GPUs (whose expert has
//                another copy), which takes load off every copy of that expert.
//     A move must lower h's load and leave every GPU it touches below h's current load. Its gain
//     is h's load minus max(T, the largest load among the GPUs it touches); its cost is the change
//     in slots that need a copy (relative to the old layout, so undoing a move is free). The move
//     with the largest gain / (max(cost, 0) + 0.1) is applied.
//  3. If the search stops above T (no improving move), the layer falls back to EPLB's plan with its
//     GPUs relabelled to match the old layout best (an assignment problem, solved exactly by the
//     Hungarian method): EPLB's balance, with every pack of slots on the GPU that already holds most
//     of it. It is also used when it needs fewer copies than the search's result.
//  4. Inside every GPU, experts that stay keep their old slot (as vLLM's preserve_intragpu_slots).
//
// The group-to-node rule: when EPLB would use its hierarchical policy (groups % nodes == 0, more
// than one node), every expert group's copies stay on one node, as in EPLB's plan. The search then
// starts from two group -> node assignments (the one keeping the most old slots, an assignment
// problem; EPLB's own, relabelled), first completed (slots of groups assigned elsewhere emptied and
// refilled), its moves stay inside one node, and the fallback relabels EPLB's plan node by node.
// Result::group_rule says whether the rule applied; LayerStats::scattered_groups counts violations.
//
// Elastic expert parallelism (Options::num_replicas): the old layout may be wider than the new
// one (GPUs >= num_gpus leave; their experts are re-homed, heaviest first, into an empty slot of
// the lightest GPU, else in place of the lightest copy of an expert that has another copy) and may
// hold -1 (empty slots, e.g. a new GPU's), filled with copies of the experts with the most load per
// copy before the search. Departing GPUs may be transfer sources.
//
// The knob: `tolerance` trades balance for moves (0: EPLB's max load; larger: fewer copies);
// `max_copies_per_layer` >= 0 caps the copies per layer instead (best balance within the cap; no
// fallback). The cap bounds what the search adds: the copies that make the layout valid at all come
// first and may exceed it on their own (the group-to-node rule's completion, the elastic re-homing
// and filling of empty slots); LayerStats::copies counts every copy.
// Transfers: every slot that needs a copy receives it from a GPU that held the expert before: one
// in the same node if any, else the one with the fewest sends so far in this layer, then the
// lowest index. transfer_time() models their duration on a topology with the link-level
// traffic model (moe/topology/traffic.hpp): per layer, the busiest directed link's bytes over its
// bandwidth plus the largest path latency used; layers move one after another.

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/hungarian.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/topology/topology.hpp"
#include "moe/topology/traffic.hpp"

namespace moe::replication::migration {

struct Options {
  double tolerance = 0.01;            ///< target max GPU load <= (1 + tolerance) x EPLB's, per layer
  long long max_copies_per_layer = -1;  ///< >= 0: the search adds no copy past this many per layer
                                        ///< (the completion's own copies may exceed it; header)
  int num_groups = 1;                 ///< EPLB reference: expert groups
  int num_nodes = 1;                  ///< EPLB reference and sources: nodes (GPU g on node g / (G / nodes))
  int candidate_gpus = 3;             ///< lightest GPUs (and experts) a move may use
  int hot_experts = 2;                ///< heaviest experts of the busiest GPU an `add` move may copy
  int num_replicas = 0;               ///< new slots per layer (0: the old placement's width)
};

/// One expert copy: `expert` of `layer` goes into `slot` on GPU dst, sent by GPU src.
struct Transfer {
  int layer = 0, slot = 0, expert = 0, src = 0, dst = 0;
};

struct LayerStats {
  int copies = 0;              ///< slots needing an expert from another GPU
  double max_load = 0;         ///< largest GPU load of the new layout
  double eplb_max_load = 0;    ///< ... of EPLB's plan from scratch
  double old_max_load = 0;     ///< ... of the old layout under the new loads
  double mean_load = 0;        ///< total load / GPUs
  bool fallback = false;       ///< the layout is EPLB's, relabelled
  int steps = 0;               ///< local-search moves applied
  int scattered_groups = 0;    ///< expert groups with copies on more than one node (0 under the group rule)
};

struct Result {
  eplb::Matrix<int> phy2log;  ///< layers x slots
  eplb::Matrix<int> logcnt;   ///< layers x experts
  std::vector<Transfer> transfers;
  std::vector<LayerStats> layers;
  int num_gpus = 0;
  int old_gpus = 0;            ///< GPUs of the old placement (> num_gpus: scale-down; sources may be >= num_gpus)
  bool group_rule = false;     ///< every expert group kept on one node (EPLB's hierarchical case, > 1 node)
  [[nodiscard]] long long copies() const {
    long long n = 0;
    for (auto const& s : layers) n += s.copies;
    return n;
  }
};

/// GPU loads of one layer's slot row: sum over a GPU's slots of load(e) / copies(e).
inline std::vector<double> gpu_loads(std::span<float const> load, std::span<int const> row, int gpus) {
  int E = static_cast<int>(load.size()), P = static_cast<int>(row.size());
  check(gpus > 0 && P % gpus == 0, "gpu_loads: ", P, " slots do not split over ", gpus, " GPUs");
  std::vector<int> cnt(static_cast<std::size_t>(E), 0);
  for (int e : row) {
    check(e >= 0 && e < E, "gpu_loads: slot holds expert ", e, ", outside [0, ", E, ")");
    ++cnt[static_cast<std::size_t>(e)];
  }
  std::vector<double> L(static_cast<std::size_t>(gpus), 0.0);
  int S = P / gpus;
  for (int p = 0; p < P; ++p) {
    int e = row[static_cast<std::size_t>(p)];
    L[static_cast<std::size_t>(p / S)] += static_cast<double>(load[static_cast<std::size_t>(e)]) / cnt[static_cast<std::size_t>(e)];
  }
  return L;
}

namespace detail {

/// The group-to-node rule of one layer, when it applies: experts e of group e / (E / groups) are
/// kept on one node; GPU g is on node g / (G / nodes).
struct Grouping {
  int groups = 1, nodes = 1;
};

/// The search state of one layer; its buffers are reused from layer to layer.
class LayerSearch {
 public:
  /// old: P slots of the new GPUs as they were (-1: an empty slot, a new GPU's or one freed by a
  /// departed GPU's numbering); eplb_row: P slots; out: P slots. grp: the group-to-node rule, or
  /// nullptr. Returns the layer's statistics.
  LayerStats run(float const* wf, int E, int G, int S, int const* old, int const* eplb_row, Options const& o, int* out,
                 Grouping const* grp) {
    E_ = E, G_ = G, S_ = S, P_ = G * S;
    auto uE = static_cast<std::size_t>(E), uG = static_cast<std::size_t>(G);
    w_.assign(wf, wf + E);
    oldm_.assign(uG * uE, 0);
    for (int p = 0; p < P_; ++p)
      if (old[p] >= 0) ++oldm_[static_cast<std::size_t>(p / S) * uE + static_cast<std::size_t>(old[p])];
    LayerStats st;
    double total = 0;
    for (double x : w_) total += x;
    st.mean_load = total / G;
    st.eplb_max_load = max_of(load_of(eplb_row));
    double T = (1.0 + o.tolerance) * st.eplb_max_load;
    st.old_max_load = old_max_load(old);
    bool capped = o.max_copies_per_layer >= 0;

    // EPLB's plan relabelled to the GPUs that hold most of it already: GPU relabel[k] takes EPLB's
    // pack k. Under the group rule, whole nodes are relabelled (then the GPUs inside them), so that
    // EPLB's groups stay on one node.
    std::vector<int> relabel = grp ? relabel_nodes(eplb_row, grp->nodes) : relabel_gpus(eplb_row);
    long long fc = 0;
    for (int k = 0; k < G; ++k)
      for (int p = k * S; p < (k + 1) * S; ++p) fc += put_cost(relabel[static_cast<std::size_t>(k)], eplb_row[p]);

    Attempt best;
    if (!grp) {
      node_of_.clear();
      best = attempt(old, T, o);
    } else {
      // Two group -> node assignments: the one keeping the most old slots (an assignment problem),
      // and EPLB's own (its node packing, relabelled as above); the search runs from each.
      int gsize = E / grp->groups, per_node_groups = grp->groups / grp->nodes, gpn = G / grp->nodes;
      auto ug = static_cast<std::size_t>(grp->groups);
      std::vector<long long> kept(ug * ug, 0);
      for (int p = 0; p < P_; ++p) {
        if (old[p] < 0) continue;
        int k = old[p] / gsize, n = (p / S) / gpn;
        for (int c = 0; c < per_node_groups; ++c) --kept[static_cast<std::size_t>(k) * ug + static_cast<std::size_t>(n * per_node_groups + c)];
      }
      auto col = core::hungarian(kept, ug, ug);
      std::vector<int> node_a(ug), node_b(ug, -1);
      for (std::size_t k = 0; k < ug; ++k) node_a[k] = col[k] / per_node_groups;
      for (int k = 0; k < G; ++k)
        for (int p = k * S; p < (k + 1) * S; ++p)
          node_b[static_cast<std::size_t>(eplb_row[p] / gsize)] = relabel[static_cast<std::size_t>(k)] / gpn;
      bool first = true;
      for (auto const* nodes : {&node_a, &node_b}) {
        if (!first && *nodes == node_a) break;
        node_of_.resize(uE);
        for (int e = 0; e < E; ++e) node_of_[static_cast<std::size_t>(e)] = (*nodes)[static_cast<std::size_t>(e / gsize)];
        gpn_ = gpn;
        Attempt a = attempt(old, T, o);
        bool a_ok = a.max_load <= T, b_ok = best.max_load <= T;
        if (first || (a_ok && (!b_ok || a.copies < best.copies)) || (!a_ok && !b_ok && a.max_load < best.max_load))
          best = std::move(a);
        first = false;
      }
    }
    st.max_load = best.max_load;
    st.copies = static_cast<int>(best.copies);
    st.steps = best.steps;
    std::copy(best.slots.begin(), best.slots.end(), out);

    if (!capped && (st.max_load > T || best.copies > P_ / 3)) {
      if (st.max_load > T || fc < best.copies) {
        for (int k = 0; k < G; ++k) {
          int g = relabel[static_cast<std::size_t>(k)];
          for (int q = 0; q < S; ++q) out[g * S + q] = eplb_row[k * S + q];
        }
        st.fallback = true;
        st.copies = static_cast<int>(fc);
        st.max_load = st.eplb_max_load;
      }
    }
    keep_slots(old, out);
    return st;
  }

 private:
  struct Attempt {
    std::vector<int> slots;
    double max_load = std::numeric_limits<double>::infinity();
    long long copies = 0;
    int steps = 0;
  };

  [[nodiscard]] int node_of_gpu(int g) const { return g / gpn_; }
  [[nodiscard]] bool grouped() const { return !node_of_.empty(); }
  /// Whether expert e may sit on GPU g (the group rule, when it applies).
  [[nodiscard]] bool allowed(int e, int g) const {
    return node_of_.empty() || node_of_[static_cast<std::size_t>(e)] == node_of_gpu(g);
  }

  double old_max_load(int const* old) {
    std::vector<int> cnt(static_cast<std::size_t>(E_), 0);
    for (int p = 0; p < P_; ++p)
      if (old[p] >= 0) ++cnt[static_cast<std::size_t>(old[p])];
    std::vector<double> L(static_cast<std::size_t>(G_), 0.0);
    for (int p = 0; p < P_; ++p)
      if (old[p] >= 0) L[static_cast<std::size_t>(p / S_)] += w_[static_cast<std::size_t>(old[p])] / cnt[static_cast<std::size_t>(old[p])];
    // An expert with no copy left on the remaining GPUs (elastic scale-down) carries no load here.
    return max_of(L);
  }

  /// Sum over a pack of EPLB's slots of put_cost on GPU g.
  long long pack_cost(int const* eplb_row, int k, int g) const {
    long long c = 0;
    for (int p = k * S_; p < (k + 1) * S_; ++p) c += put_cost(g, eplb_row[p]);
    return c;
  }
  std::vector<int> relabel_gpus(int const* eplb_row) {
    auto uG = static_cast<std::size_t>(G_);
    std::vector<long long> cost(uG * uG, 0);
    for (int k = 0; k < G_; ++k)
      for (int g = 0; g < G_; ++g) cost[static_cast<std::size_t>(k) * uG + static_cast<std::size_t>(g)] = pack_cost(eplb_row, k, g);
    return core::hungarian(cost, uG, uG);
  }
  /// EPLB's node a onto node b, each with the best GPU assignment inside (two levels of assignment).
  std::vector<int> relabel_nodes(int const* eplb_row, int nodes) {
    int gpn = G_ / nodes;
    auto un = static_cast<std::size_t>(nodes), ug = static_cast<std::size_t>(gpn);
    std::vector<long long> outer(un * un, 0), inner(ug * ug);
    std::vector<std::vector<int>> inner_col(un * un);
    for (int a = 0; a < nodes; ++a)
      for (int b = 0; b < nodes; ++b) {
        for (int i = 0; i < gpn; ++i)
          for (int j = 0; j < gpn; ++j)
            inner[static_cast<std::size_t>(i) * ug + static_cast<std::size_t>(j)] = pack_cost(eplb_row, a * gpn + i, b * gpn + j);
        auto col = core::hungarian(inner, ug, ug);
        long long c = 0;
        for (int i = 0; i < gpn; ++i) c += inner[static_cast<std::size_t>(i) * ug + static_cast<std::size_t>(col[static_cast<std::size_t>(i)])];
        outer[static_cast<std::size_t>(a) * un + static_cast<std::size_t>(b)] = c;
        inner_col[static_cast<std::size_t>(a) * un + static_cast<std::size_t>(b)] = std::move(col);
      }
    auto node = core::hungarian(outer, un, un);
    std::vector<int> relabel(static_cast<std::size_t>(G_));
    for (int a = 0; a < nodes; ++a) {
      int b = node[static_cast<std::size_t>(a)];
      auto const& col = inner_col[static_cast<std::size_t>(a) * un + static_cast<std::size_t>(b)];
      for (int i = 0; i < gpn; ++i) relabel[static_cast<std::size_t>(a * gpn + i)] = b * gpn + col[static_cast<std::size_t>(i)];
    }
    return relabel;
  }

  /// Current GPU loads of a partial layout (-1: empty slot).
  void partial_loads() {
    std::fill(cnt_.begin(), cnt_.end(), 0);
    for (int e : slot_)
      if (e >= 0) ++cnt_[static_cast<std::size_t>(e)];
    L_.assign(static_cast<std::size_t>(G_), 0.0);
    for (int p = 0; p < P_; ++p) {
      int e = slot_[static_cast<std::size_t>(p)];
      if (e >= 0) L_[static_cast<std::size_t>(p / S_)] += w_[static_cast<std::size_t>(e)] / cnt_[static_cast<std::size_t>(e)];
    }
  }

  /// Completes the old layout into a valid one: slots breaking the group rule are emptied; experts
  /// without a copy (their GPUs left, or the rule moved their group) go, heaviest first, into an
  /// empty slot of their node on its lightest GPU, else replace the lightest copy (load per copy)
  /// of an expert with another copy there; empty slots left take another copy of the expert with
  /// the most load per copy (EPLB's replication rule), on the lightest GPU with an empty slot.
  void complete(int const* old) {
    slot_.assign(old, old + P_);
    for (int p = 0; p < P_; ++p)
      if (slot_[static_cast<std::size_t>(p)] >= 0 && !allowed(slot_[static_cast<std::size_t>(p)], p / S_)) slot_[static_cast<std::size_t>(p)] = -1;
    cnt_.assign(static_cast<std::size_t>(E_), 0);
    partial_loads();
    missing_.clear();
    for (int e = 0; e < E_; ++e)
      if (cnt_[static_cast<std::size_t>(e)] == 0) missing_.push_back(e);
    std::stable_sort(missing_.begin(), missing_.end(),
                     [&](int a, int b) { return w_[static_cast<std::size_t>(a)] > w_[static_cast<std::size_t>(b)]; });
    for (int e : missing_) {
      int hole = -1, evict = -1;
      for (int p = 0; p < P_; ++p) {
        int g = p / S_, d = slot_[static_cast<std::size_t>(p)];
        if (!allowed(e, g)) continue;
        if (d < 0) {
          if (hole < 0 || L_[static_cast<std::size_t>(g)] < L_[static_cast<std::size_t>(hole / S_)]) hole = p;
        } else if (cnt_[static_cast<std::size_t>(d)] >= 2) {
          double u = w_[static_cast<std::size_t>(d)] / cnt_[static_cast<std::size_t>(d)];
          if (evict < 0) {
            evict = p;
          } else {
            int x = slot_[static_cast<std::size_t>(evict)];
            double ux = w_[static_cast<std::size_t>(x)] / cnt_[static_cast<std::size_t>(x)];
            if (u < ux || (u == ux && L_[static_cast<std::size_t>(g)] > L_[static_cast<std::size_t>(evict / S_)])) evict = p;
          }
        }
      }
      int p = hole >= 0 ? hole : evict;
      check(p >= 0, "migration: no slot can take expert ", e, " (every slot of its node holds an expert's only copy)");
      slot_[static_cast<std::size_t>(p)] = e;
      partial_loads();
    }
    for (;;) {
      int best_e = -1, best_p = -1;
      double best_u = -1;
      for (int p = 0; p < P_; ++p) {
        if (slot_[static_cast<std::size_t>(p)] >= 0) continue;
        int g = p / S_;
        for (int e = 0; e < E_; ++e) {
          if (!allowed(e, g)) continue;
          double u = w_[static_cast<std::size_t>(e)] / (cnt_[static_cast<std::size_t>(e)] + 1);
          bool better = u > best_u || (u == best_u && L_[static_cast<std::size_t>(g)] < L_[static_cast<std::size_t>(best_p / S_)]);
          if (better) best_u = u, best_e = e, best_p = p;
        }
      }
      if (best_p < 0) break;
      slot_[static_cast<std::size_t>(best_p)] = best_e;
      partial_loads();
    }
  }

  /// The completed layout, then the local search (header comment, step 2) under the group rule when
  /// node_of_ is set.
  Attempt attempt(int const* old, double T, Options const& o) {
    complete(old);
    rebuild();
    long long copies = 0;
    for (int p = 0; p < P_; ++p) copies += put_cost(p / S_, slot_[static_cast<std::size_t>(p)]);
    bool capped = o.max_copies_per_layer >= 0;
    int G = G_, S = S_, E = E_;
    auto uE = static_cast<std::size_t>(E);
    int K = std::max(1, std::min(o.candidate_gpus, G));
    int max_steps = 4 * P_ + 16;
    int steps = 0;
    // The experts with the least load per copy after one more copy (taken once per layer), per node
    // under the group rule.
    cand_.resize(uE);
    std::iota(cand_.begin(), cand_.end(), 0);
    std::stable_sort(cand_.begin(), cand_.end(), [&](int a, int b) {
      double x = w_[static_cast<std::size_t>(a)] / (cnt_[static_cast<std::size_t>(a)] + 1);
      double y = w_[static_cast<std::size_t>(b)] / (cnt_[static_cast<std::size_t>(b)] + 1);
      return x < y;
    });
    int nodes = grouped() ? G / gpn_ : 1;
    lightest_by_node_.assign(static_cast<std::size_t>(nodes), {});
    for (int e : cand_) {
      int n = grouped() ? node_of_[static_cast<std::size_t>(e)] : 0;
      auto& v = lightest_by_node_[static_cast<std::size_t>(n)];
      if (static_cast<int>(v.size()) < std::min(K, E)) v.push_back(e);
    }
    while (steps < max_steps) {
      int h = static_cast<int>(std::max_element(L_.begin(), L_.end()) - L_.begin());
      double Lh = L_[static_cast<std::size_t>(h)];
      if (Lh <= T) break;
      // The lightest GPUs (of h's node under the group rule).
      order_.clear();
      for (int g = 0; g < G; ++g)
        if (!grouped() || node_of_gpu(g) == node_of_gpu(h)) order_.push_back(g);
      int k_gpus = std::min(K, static_cast<int>(order_.size()));
      std::partial_sort(order_.begin(), order_.begin() + k_gpus, order_.end(), [&](int a, int b) {
        return L_[static_cast<std::size_t>(a)] < L_[static_cast<std::size_t>(b)] ||
               (L_[static_cast<std::size_t>(a)] == L_[static_cast<std::size_t>(b)] && a < b);
      });
      Best best;
      auto consider = [&](Move const& m, double newmax, int dcost) {
        if (!(newmax < Lh)) return;
        if (capped && copies + dcost > o.max_copies_per_layer && dcost > 0) return;
        double gain = Lh - std::max(T, newmax);
        if (gain <= 0) return;
        double score = gain / (std::max(dcost, 0) + 0.1);
        if (score > best.score || (score == best.score && newmax < best.newmax)) best = {m, score, newmax, dcost};
      };
      // Swaps between h and the lightest GPUs.
      for (int i = h * S; i < (h + 1) * S; ++i) {
        int a = slot_[static_cast<std::size_t>(i)];
        double ua = per_copy(a);
        for (int k = 0; k < k_gpus; ++k) {
          int l = order_[static_cast<std::size_t>(k)];
          if (l == h) continue;
          double Ll = L_[static_cast<std::size_t>(l)];
          for (int j = l * S; j < (l + 1) * S; ++j) {
            int b = slot_[static_cast<std::size_t>(j)];
            if (b == a) continue;
            double d = ua - per_copy(b);
            if (d <= 0) continue;
            double nm = std::max(Lh - d, Ll + d);
            int dc = put_cost(h, b) - put_cost(h, a) + put_cost(l, a) - put_cost(l, b);
            consider(Move{Move::swap, i, j, 0}, nm, dc);
          }
        }
      }
      // Replace a slot of h (the expert keeps another copy) by a former or a light expert.
      auto const& lightest = lightest_by_node_[static_cast<std::size_t>(grouped() ? node_of_gpu(h) : 0)];
      light_.assign(lightest.begin(), lightest.end());
      for (int p = h * S; p < (h + 1) * S; ++p)
        if (old[p] >= 0 && allowed(old[p], h)) light_.push_back(old[p]);
      for (int i = h * S; i < (h + 1) * S; ++i) {
        int a = slot_[static_cast<std::size_t>(i)];
        if (cnt_[static_cast<std::size_t>(a)] < 2) continue;
        for (int b : light_) {
          if (b == a) continue;
          double nm = eval_replace(i, b, h);
          if (nm < 0) continue;
          consider(Move{Move::replace, i, -1, b}, nm, put_cost(h, b) - put_cost(h, a));
        }
      }
      // Add a copy of one of h's heaviest experts (by load per copy) on one of the lightest GPUs.
      hot_.clear();
      for (int i = h * S; i < (h + 1) * S; ++i) {
        int b = slot_[static_cast<std::size_t>(i)];
        if (std::find(hot_.begin(), hot_.end(), b) == hot_.end()) hot_.push_back(b);
      }
      {
        auto nh = std::min<std::size_t>(hot_.size(), static_cast<std::size_t>(o.hot_experts));
        std::partial_sort(hot_.begin(), hot_.begin() + static_cast<long>(nh), hot_.end(),
                          [&](int a, int b) { return per_copy(a) > per_copy(b) || (per_copy(a) == per_copy(b) && a < b); });
        hot_.resize(nh);
      }
      for (int k = 0; k < k_gpus; ++k) {
        int l = order_[static_cast<std::size_t>(k)];
        if (l == h) continue;
        for (int j = l * S; j < (l + 1) * S; ++j) {
          int d = slot_[static_cast<std::size_t>(j)];
          if (cnt_[static_cast<std::size_t>(d)] < 2) continue;
          for (int b : hot_) {
            if (b == d) continue;
            double nm = eval_replace(j, b, h);
            if (nm < 0) continue;
            consider(Move{Move::replace, j, -1, b}, nm, put_cost(l, b) - put_cost(l, d));
          }
        }
      }
      if (best.score <= 0) break;
      apply(best.move);
      copies += best.dcost;
      ++steps;
    }
    Attempt a;
    a.slots = slot_;
    a.max_load = max_of(L_);
    a.copies = copies;
    a.steps = steps;
    return a;
  }

  struct Move {
    enum Kind { swap, replace } kind = swap;
    int i = -1, j = -1, b = -1;
  };
  struct Best {
    Move move;
    double score = 0, newmax = 0;
    int dcost = 0;
  };

  [[nodiscard]] double per_copy(int e) const { return u_[static_cast<std::size_t>(e)]; }
  void refresh(int e) { u_[static_cast<std::size_t>(e)] = w_[static_cast<std::size_t>(e)] / cnt_[static_cast<std::size_t>(e)]; }
  /// 1 when GPU g held no copy of e in the old layout (an empty slot held nothing).
  [[nodiscard]] int put_cost(int g, int e) const {
    return oldm_[static_cast<std::size_t>(g) * static_cast<std::size_t>(E_) + static_cast<std::size_t>(e)] == 0 ? 1 : 0;
  }
  static double max_of(std::vector<double> const& v) { return *std::max_element(v.begin(), v.end()); }
  std::vector<double> load_of(int const* row) {
    return gpu_loads(std::span<float const>(wtmp(), static_cast<std::size_t>(E_)),
                     std::span<int const>(row, static_cast<std::size_t>(P_)), G_);
  }
  float const* wtmp() {
    wf_.assign(w_.begin(), w_.end());
    return wf_.data();
  }
  void rebuild() {
    cnt_.assign(static_cast<std::size_t>(E_), 0);
    pos_.resize(static_cast<std::size_t>(E_));
    for (auto& v : pos_) v.clear();
    for (int p = 0; p < P_; ++p) {
      int e = slot_[static_cast<std::size_t>(p)];
      ++cnt_[static_cast<std::size_t>(e)];
      pos_[static_cast<std::size_t>(e)].push_back(p);
    }
    u_.resize(static_cast<std::size_t>(E_));
    for (int e = 0; e < E_; ++e) u_[static_cast<std::size_t>(e)] = cnt_[static_cast<std::size_t>(e)] > 0 ? w_[static_cast<std::size_t>(e)] / cnt_[static_cast<std::size_t>(e)] : 0.0;
    L_.assign(static_cast<std::size_t>(G_), 0.0);
    for (int p = 0; p < P_; ++p) L_[static_cast<std::size_t>(p / S_)] += per_copy(slot_[static_cast<std::size_t>(p)]);
    dL_.assign(static_cast<std::size_t>(G_), 0.0);
  }
  /// Largest new load among the GPUs touched by putting expert b into slot j, or -1 when h's load
  /// would not drop.
  double eval_replace(int j, int b, int h) {
    int a = slot_[static_cast<std::size_t>(j)], g = j / S_;
    double wa = w_[static_cast<std::size_t>(a)], wb = w_[static_cast<std::size_t>(b)];
    int ca = cnt_[static_cast<std::size_t>(a)], cb = cnt_[static_cast<std::size_t>(b)];
    double da = wa / (ca - 1) - wa / ca, db = wb / (cb + 1) - wb / cb;
    touched_.clear();
    auto add = [&](int gpu, double x) {
      if (dL_[static_cast<std::size_t>(gpu)] == 0.0) touched_.push_back(gpu);
      dL_[static_cast<std::size_t>(gpu)] += x;
      if (dL_[static_cast<std::size_t>(gpu)] == 0.0) dL_[static_cast<std::size_t>(gpu)] = 1e-300;  // stays touched
    };
    for (int p : pos_[static_cast<std::size_t>(a)]) add(p / S_, da);
    add(g, -wa / (ca - 1));
    for (int p : pos_[static_cast<std::size_t>(b)]) add(p / S_, db);
    add(g, wb / (cb + 1));
    double nm = 0;
    bool h_drops = false;
    for (int t : touched_) {
      double x = L_[static_cast<std::size_t>(t)] + dL_[static_cast<std::size_t>(t)];
      nm = std::max(nm, x);
      if (t == h) h_drops = dL_[static_cast<std::size_t>(t)] < 0;
      dL_[static_cast<std::size_t>(t)] = 0.0;
    }
    return h_drops ? nm : -1.0;
  }
  void remove_pos(int e, int p) {
    auto& v = pos_[static_cast<std::size_t>(e)];
    v.erase(std::find(v.begin(), v.end(), p));
  }
  void apply(Move const& m) {
    if (m.kind == Move::swap) {
      int a = slot_[static_cast<std::size_t>(m.i)], b = slot_[static_cast<std::size_t>(m.j)];
      double d = per_copy(a) - per_copy(b);
      L_[static_cast<std::size_t>(m.i / S_)] -= d;
      L_[static_cast<std::size_t>(m.j / S_)] += d;
      std::swap(slot_[static_cast<std::size_t>(m.i)], slot_[static_cast<std::size_t>(m.j)]);
      remove_pos(a, m.i);
      remove_pos(b, m.j);
      pos_[static_cast<std::size_t>(a)].push_back(m.j);
      pos_[static_cast<std::size_t>(b)].push_back(m.i);
    } else {
      int a = slot_[static_cast<std::size_t>(m.i)], b = m.b;
      // Loads change on every GPU holding a or b: subtract their old shares, add the new ones.
      auto shift = [&](int e, int sign) {
        for (int p : pos_[static_cast<std::size_t>(e)]) L_[static_cast<std::size_t>(p / S_)] += sign * per_copy(e);
      };
      shift(a, -1);
      shift(b, -1);
      remove_pos(a, m.i);
      --cnt_[static_cast<std::size_t>(a)];
      slot_[static_cast<std::size_t>(m.i)] = b;
      pos_[static_cast<std::size_t>(b)].push_back(m.i);
      ++cnt_[static_cast<std::size_t>(b)];
      refresh(a);
      refresh(b);
      shift(a, +1);
      shift(b, +1);
    }
  }
  /// Inside each GPU: experts present before keep their old slots, the others fill the rest in order.
  void keep_slots(int const* old, int* out) {
    for (int g = 0; g < G_; ++g) {
      int* o = out + g * S_;
      int const* before = old + g * S_;
      tmp_.assign(o, o + S_);
      placed_.assign(static_cast<std::size_t>(S_), -1);
      used_.assign(static_cast<std::size_t>(S_), 0);
      for (int q = 0; q < S_; ++q)
        for (int r = 0; r < S_; ++r)
          if (!used_[static_cast<std::size_t>(r)] && tmp_[static_cast<std::size_t>(r)] == before[q]) {
            placed_[static_cast<std::size_t>(q)] = tmp_[static_cast<std::size_t>(r)];
            used_[static_cast<std::size_t>(r)] = 1;
            break;
          }
      int r = 0;
      for (int q = 0; q < S_; ++q) {
        if (placed_[static_cast<std::size_t>(q)] >= 0) continue;
        while (used_[static_cast<std::size_t>(r)]) ++r;
        placed_[static_cast<std::size_t>(q)] = tmp_[static_cast<std::size_t>(r)];
        used_[static_cast<std::size_t>(r)] = 1;
      }
      std::copy(placed_.begin(), placed_.end(), o);
    }
  }

  int E_ = 0, G_ = 0, S_ = 0, P_ = 0;
  std::vector<double> w_, u_, L_, dL_;
  std::vector<float> wf_;
  int gpn_ = 1;  ///< GPUs per node under the group rule
  std::vector<int> oldm_, hot_, slot_, cnt_, order_, cand_, light_, touched_, tmp_, placed_, used_, node_of_, missing_;
  std::vector<std::vector<int>> pos_, lightest_by_node_;
};

}  // namespace detail

/// Checks an old layout: layers x P_old, entries in [-1, experts) (-1: an empty slot), every expert
/// in every layer somewhere (on a GPU that stays or on one that leaves).
inline void check_layout(eplb::Matrix<int> const& old, int layers, int experts, int slots, char const* what) {
  check(old.rows == layers && old.cols == slots, what, " is ", old.rows, " x ", old.cols, ", expected layers x slots = ",
        layers, " x ", slots);
  std::vector<char> seen(static_cast<std::size_t>(experts));
  for (int l = 0; l < layers; ++l) {
    std::fill(seen.begin(), seen.end(), 0);
    for (int p = 0; p < slots; ++p) {
      int e = old(l, p);
      check(e >= -1 && e < experts, what, ": layer ", l, " slot ", p, " holds expert ", e, ", outside [0, ", experts,
            ") (-1 marks an empty slot)");
      if (e >= 0) seen[static_cast<std::size_t>(e)] = 1;
    }
    for (int e = 0; e < experts; ++e)
      check(seen[static_cast<std::size_t>(e)], what, ": layer ", l, " has no slot for expert ", e);
  }
}

/// Whether EPLB would use its hierarchical policy (eplb.py: num_groups % num_nodes == 0).
inline bool hierarchical(int groups, int nodes) { return groups > 0 && nodes > 0 && groups % nodes == 0; }

/// EPLB's plan on the new loads (the reference), with eplb.py's choice of policy.
inline eplb::Result eplb_reference(eplb::Matrix<float> const& weight, int slots, int groups, int nodes, int gpus) {
  check(weight.rows > 0 && weight.cols > 0, "migration: empty weight matrix");
  for (float x : weight.v) check(std::isfinite(x) && x >= 0, "migration: load ", x, " is negative or not finite");
  check(groups > 0 && nodes > 0, "migration: groups (", groups, ") and nodes (", nodes, ") must be positive");
  return hierarchical(groups, nodes) ? eplb::rebalance_experts_hierarchical(weight, slots, groups, nodes, gpus)
                                     : eplb::rebalance_experts_hierarchical(weight, slots, 1, 1, gpus);
}

/// Expert groups of one layer's slot row whose copies sit on more than one node (GPU g on node
/// g / (gpus / nodes); expert e in group e / (E / groups)). 0 when the shape has no such rule.
inline int scattered_groups(std::span<int const> row, int experts, int groups, int nodes, int gpus) {
  int P = static_cast<int>(row.size());
  if (groups <= 0 || nodes <= 1 || experts % groups != 0 || gpus % nodes != 0 || P % gpus != 0) return 0;
  int S = P / gpus, gpn = gpus / nodes, gsize = experts / groups;
  std::vector<int> node(static_cast<std::size_t>(groups), -1);
  std::vector<char> split(static_cast<std::size_t>(groups), 0);
  for (int p = 0; p < P; ++p) {
    int e = row[static_cast<std::size_t>(p)];
    if (e < 0) continue;
    auto k = static_cast<std::size_t>(e / gsize);
    int n = (p / S) / gpn;
    if (node[k] < 0) node[k] = n;
    else if (node[k] != n) split[k] = 1;
  }
  int c = 0;
  for (char x : split) c += x;
  return c;
}

/// The minimal-move rebalance of every layer (see the header comment). weight: layers x experts;
/// old_phy2log: layers x P_old, the current layout in slots of S = P / gpus per GPU, P =
/// o.num_replicas (0: P_old). Elastic expert parallelism as vLLM passes it: P_old > P (scale-down)
/// means GPUs [gpus, P_old / S) leave, their experts are re-homed and they may still send; -1
/// entries (scale-up: a new GPU's slots) are empty and filled with copies.
inline Result rebalance(eplb::Matrix<float> const& weight, eplb::Matrix<int> const& old_phy2log, int gpus,
                        Options const& o = {}) {
  int L = weight.rows, E = weight.cols, Pold = old_phy2log.cols;
  check(gpus > 0, "migration: GPUs must be positive, got ", gpus);
  check(o.num_replicas >= 0, "migration: num_replicas must be >= 0 (0: the old placement's width), got ", o.num_replicas);
  int P = o.num_replicas > 0 ? o.num_replicas : Pold;
  check(P > 0 && P % gpus == 0, "migration: ", P, " slots do not split over ", gpus, " GPUs");
  int S = P / gpus;
  check(Pold > 0 && Pold % S == 0, "migration: the old placement's ", Pold, " slots per layer are not whole GPUs of ", S,
        " slots (", P, " new slots over ", gpus, " GPUs)");
  int Gold = Pold / S;
  check(std::isfinite(o.tolerance) && o.tolerance >= 0, "migration: tolerance must be >= 0 and finite, got ", o.tolerance);
  check(o.candidate_gpus > 0, "migration: candidate_gpus must be positive, got ", o.candidate_gpus);
  check(o.num_nodes > 0 && o.num_groups > 0, "migration: groups (", o.num_groups, ") and nodes (", o.num_nodes,
        ") must be positive");
  bool hier = hierarchical(o.num_groups, o.num_nodes);
  // eplb.py needs GPUs to split over nodes only for its hierarchical policy; otherwise nodes only
  // pick transfer sources, and a cluster that does not split is taken as one node.
  if (hier) check(gpus % o.num_nodes == 0, "migration: ", gpus, " GPUs do not split over ", o.num_nodes, " nodes");
  int nodes = gpus % o.num_nodes == 0 ? o.num_nodes : 1;
  auto ref = eplb_reference(weight, P, o.num_groups, o.num_nodes, gpus);
  check_layout(old_phy2log, L, E, Pold, "old placement");
  int per_node = gpus / nodes;
  detail::Grouping grp{o.num_groups, o.num_nodes};
  bool rule = hier && o.num_nodes > 1;
  Result r{eplb::Matrix<int>(L, P), eplb::Matrix<int>(L, E, 0), {}, {}, gpus};
  r.group_rule = rule;
  r.old_gpus = Gold;
  r.layers.resize(static_cast<std::size_t>(L));
  detail::LayerSearch search;
  std::vector<int> sends(static_cast<std::size_t>(std::max(gpus, Gold))), first, fill, holders, mine(static_cast<std::size_t>(P));
  for (int l = 0; l < L; ++l) {
    auto const* w = weight.v.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(E);
    auto const* old = old_phy2log.v.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(Pold);
    auto* out = r.phy2log.v.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(P);
    // The new GPUs' slots as they were: GPU g < min(gpus, Gold) keeps its index; the rest are empty.
    for (int p = 0; p < P; ++p) mine[static_cast<std::size_t>(p)] = p < Pold ? old[p] : -1;
    auto& st = r.layers[static_cast<std::size_t>(l)];
    st = search.run(w, E, gpus, S, mine.data(), ref.phy2log.v.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(P), o,
                    out, rule ? &grp : nullptr);
    st.scattered_groups = scattered_groups(std::span<int const>(out, static_cast<std::size_t>(P)), E, o.num_groups, o.num_nodes, gpus);
    for (int p = 0; p < P; ++p) ++r.logcnt(l, out[p]);
    // Transfers: each slot whose expert its GPU did not hold receives it from a GPU that did (one
    // that leaves included).
    std::fill(sends.begin(), sends.end(), 0);
    first.assign(static_cast<std::size_t>(E) + 1, 0);  // old slots of each expert, bucketed
    for (int q = 0; q < Pold; ++q)
      if (old[q] >= 0) ++first[static_cast<std::size_t>(old[q]) + 1];
    for (int e = 0; e < E; ++e) first[static_cast<std::size_t>(e) + 1] += first[static_cast<std::size_t>(e)];
    holders.resize(static_cast<std::size_t>(Pold));
    fill = first;
    for (int q = 0; q < Pold; ++q)
      if (old[q] >= 0) holders[static_cast<std::size_t>(fill[static_cast<std::size_t>(old[q])]++)] = q;
    for (int p = 0; p < P; ++p) {
      int g = p / S, e = out[p];
      bool had = false;
      for (int q = g * S; q < (g + 1) * S && !had; ++q) had = mine[static_cast<std::size_t>(q)] == e;
      if (had) continue;
      int src = -1;
      for (int k = first[static_cast<std::size_t>(e)]; k < first[static_cast<std::size_t>(e) + 1]; ++k) {
        int c = holders[static_cast<std::size_t>(k)] / S;
        auto better = [&](int x, int y) {  // is source x better than y?
          bool nx = x / per_node == g / per_node, ny = y / per_node == g / per_node;
          if (nx != ny) return nx;
          return sends[static_cast<std::size_t>(x)] < sends[static_cast<std::size_t>(y)];
        };
        if (src < 0 || better(c, src)) src = c;
      }
      check(src >= 0, "migration: layer ", l, " expert ", e, " has no source");  // check_layout rules it out
      ++sends[static_cast<std::size_t>(src)];
      r.transfers.push_back({l, p, e, src, g});
    }
  }
  return r;
}

/// Modelled duration of the transfers on a topology (see the header comment): per layer, seconds.
struct TransferTime {
  std::vector<double> layer_seconds;
  double seconds = 0;      ///< sum over layers
  double bytes = 0;        ///< all bytes moved
  double inter_node_bytes = 0;  ///< bytes that left their server
};

inline TransferTime transfer_time(topology::TrafficModel const& model, std::span<Transfer const> transfers, int layers,
                                  double expert_bytes) {
  check(layers >= 0, "transfer_time: negative layer count ", layers);
  check(std::isfinite(expert_bytes) && expert_bytes > 0, "transfer_time: expert bytes must be positive, got ", expert_bytes);
  TransferTime t;
  t.layer_seconds.assign(static_cast<std::size_t>(layers), 0.0);
  std::vector<double> link_bytes(static_cast<std::size_t>(model.links()));
  std::size_t i = 0;
  for (int l = 0; l < layers; ++l) {
    std::fill(link_bytes.begin(), link_bytes.end(), 0.0);
    double lat = 0;
    for (; i < transfers.size() && transfers[i].layer == l; ++i) {
      auto const& x = transfers[i];
      check(x.src >= 0 && x.src < model.gpus() && x.dst >= 0 && x.dst < model.gpus(), "transfer_time: transfer from GPU ",
            x.src, " to ", x.dst, " outside the topology's ", model.gpus(), " GPUs");
      if (x.src == x.dst) continue;
      for (auto [link, f] : model.shares(x.src, x.dst)) link_bytes[static_cast<std::size_t>(link)] += f * expert_bytes;
      lat = std::max(lat, model.path_latency(x.src, x.dst));
      t.bytes += expert_bytes;
      if (model.hops(x.src, x.dst) > 0) t.inter_node_bytes += expert_bytes;
    }
    check(i == transfers.size() || transfers[i].layer > l, "transfer_time: transfers are not sorted by layer");
    double worst = 0;
    for (int k = 0; k < model.links(); ++k) worst = std::max(worst, link_bytes[static_cast<std::size_t>(k)] / model.link(k).bandwidth);
    t.layer_seconds[static_cast<std::size_t>(l)] = worst > 0 ? worst + lat : 0.0;
    t.seconds += t.layer_seconds[static_cast<std::size_t>(l)];
  }
  check(i == transfers.size(), "transfer_time: a transfer names a layer outside [0, ", layers, ")");
  return t;
}

}  // namespace moe::replication::migration
