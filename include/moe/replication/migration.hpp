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
// The knob: `tolerance` trades balance for moves (0: EPLB's max load; larger: fewer copies);
// `max_copies_per_layer` >= 0 caps the copies per layer instead (best balance within the cap; no
// fallback). Transfers: every slot that needs a copy receives it from a GPU that held the expert
// before: one in the same node if any, else the one with the fewest sends so far in this layer,
// then the lowest index. transfer_time() models their duration on a topology with the link-level
// traffic model (moe/topology/traffic.hpp): per layer, the busiest directed link's bytes over its
// bandwidth plus the largest path latency used; layers move one after another.

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "moe/config.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/topology/topology.hpp"
#include "moe/topology/traffic.hpp"

namespace moe::replication::migration {

struct Options {
  double tolerance = 0.01;            ///< target max GPU load <= (1 + tolerance) x EPLB's, per layer
  long long max_copies_per_layer = -1;  ///< >= 0: at most this many slots needing a copy per layer
  int num_groups = 1;                 ///< EPLB reference: expert groups
  int num_nodes = 1;                  ///< EPLB reference and sources: nodes (GPU g on node g / (G / nodes))
  int candidate_gpus = 3;             ///< lightest GPUs (and experts) a move may use
  int hot_experts = 2;                ///< heaviest experts of the busiest GPU an `add` move may copy
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
};

struct Result {
  eplb::Matrix<int> phy2log;  ///< layers x slots
  eplb::Matrix<int> logcnt;   ///< layers x experts
  std::vector<Transfer> transfers;
  std::vector<LayerStats> layers;
  int num_gpus = 0;
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

/// Minimum-cost perfect assignment of an n x n cost matrix (row-major): assign[row] = column.
/// The Hungarian method with potentials, O(n^3).
inline std::vector<int> hungarian(std::vector<long long> const& cost, int n) {
  constexpr long long inf = std::numeric_limits<long long>::max() / 4;
  std::vector<long long> u(static_cast<std::size_t>(n) + 1, 0), v(static_cast<std::size_t>(n) + 1, 0);
  std::vector<int> p(static_cast<std::size_t>(n) + 1, 0), way(static_cast<std::size_t>(n) + 1, 0);
  std::vector<long long> minv(static_cast<std::size_t>(n) + 1);
  std::vector<char> used(static_cast<std::size_t>(n) + 1);
  auto at = [&](int i, int j) { return cost[static_cast<std::size_t>(i - 1) * static_cast<std::size_t>(n) + static_cast<std::size_t>(j - 1)]; };
  for (int i = 1; i <= n; ++i) {
    p[0] = i;
    int j0 = 0;
    std::fill(minv.begin(), minv.end(), inf);
    std::fill(used.begin(), used.end(), 0);
    do {
      used[static_cast<std::size_t>(j0)] = 1;
      int i0 = p[static_cast<std::size_t>(j0)], j1 = 0;
      long long delta = inf;
      for (int j = 1; j <= n; ++j)
        if (!used[static_cast<std::size_t>(j)]) {
          long long cur = at(i0, j) - u[static_cast<std::size_t>(i0)] - v[static_cast<std::size_t>(j)];
          if (cur < minv[static_cast<std::size_t>(j)]) {
            minv[static_cast<std::size_t>(j)] = cur;
            way[static_cast<std::size_t>(j)] = j0;
          }
          if (minv[static_cast<std::size_t>(j)] < delta) {
            delta = minv[static_cast<std::size_t>(j)];
            j1 = j;
          }
        }
      for (int j = 0; j <= n; ++j) {
        if (used[static_cast<std::size_t>(j)]) {
          u[static_cast<std::size_t>(p[static_cast<std::size_t>(j)])] += delta;
          v[static_cast<std::size_t>(j)] -= delta;
        } else {
          minv[static_cast<std::size_t>(j)] -= delta;
        }
      }
      j0 = j1;
    } while (p[static_cast<std::size_t>(j0)] != 0);
    do {
      int j1 = way[static_cast<std::size_t>(j0)];
      p[static_cast<std::size_t>(j0)] = p[static_cast<std::size_t>(j1)];
      j0 = j1;
    } while (j0);
  }
  std::vector<int> assign(static_cast<std::size_t>(n), -1);
  for (int j = 1; j <= n; ++j) assign[static_cast<std::size_t>(p[static_cast<std::size_t>(j)] - 1)] = j - 1;
  return assign;
}

/// The search state of one layer; its buffers are reused from layer to layer.
class LayerSearch {
 public:
  /// old, eplb_row: P slots; out: P slots. Returns the layer's statistics.
  LayerStats run(float const* wf, int E, int G, int S, int const* old, int const* eplb_row, Options const& o, int* out) {
    E_ = E, G_ = G, S_ = S, P_ = G * S;
    auto uE = static_cast<std::size_t>(E), uG = static_cast<std::size_t>(G), uP = static_cast<std::size_t>(P_);
    w_.assign(wf, wf + E);
    oldm_.assign(uG * uE, 0);
    for (int p = 0; p < P_; ++p) ++oldm_[static_cast<std::size_t>(p / S) * uE + static_cast<std::size_t>(old[p])];
    LayerStats st;
    double total = 0;
    for (double x : w_) total += x;
    st.mean_load = total / G;
    st.eplb_max_load = max_of(load_of(eplb_row));
    double T = (1.0 + o.tolerance) * st.eplb_max_load;

    slot_.assign(old, old + P_);
    rebuild();
    st.old_max_load = *std::max_element(L_.begin(), L_.end());
    long long copies = 0;
    bool capped = o.max_copies_per_layer >= 0;
    int K = std::max(1, std::min(o.candidate_gpus, G));
    int max_steps = 4 * P_ + 16;
    order_.resize(uG);
    // The experts with the least load per copy after one more copy (taken once per layer).
    cand_.resize(uE);
    std::iota(cand_.begin(), cand_.end(), 0);
    int KE = std::min(K, E);
    std::partial_sort(cand_.begin(), cand_.begin() + KE, cand_.end(), [&](int a, int b) {
      double x = w_[static_cast<std::size_t>(a)] / (cnt_[static_cast<std::size_t>(a)] + 1);
      double y = w_[static_cast<std::size_t>(b)] / (cnt_[static_cast<std::size_t>(b)] + 1);
      return x < y || (x == y && a < b);
    });
    lightest_.assign(cand_.begin(), cand_.begin() + KE);
    while (st.steps < max_steps) {
      int h = static_cast<int>(std::max_element(L_.begin(), L_.end()) - L_.begin());
      double Lh = L_[static_cast<std::size_t>(h)];
      if (Lh <= T) break;
      std::iota(order_.begin(), order_.end(), 0);
      std::partial_sort(order_.begin(), order_.begin() + K, order_.end(), [&](int a, int b) {
        return L_[static_cast<std::size_t>(a)] < L_[static_cast<std::size_t>(b)] ||
               (L_[static_cast<std::size_t>(a)] == L_[static_cast<std::size_t>(b)] && a < b);
      });
      Best best;
      auto consider = [&](Move const& m, double newmax, int dcost) {
        if (!(newmax < Lh)) return;
        if (capped && copies + dcost > o.max_copies_per_layer) return;
        double gain = Lh - std::max(T, newmax);
        if (gain <= 0) return;
        double score = gain / (std::max(dcost, 0) + 0.1);
        if (score > best.score || (score == best.score && newmax < best.newmax)) best = {m, score, newmax, dcost};
      };
      // Swaps between h and the lightest GPUs.
      for (int i = h * S; i < (h + 1) * S; ++i) {
        int a = slot_[static_cast<std::size_t>(i)];
        double ua = per_copy(a);
        for (int k = 0; k < K; ++k) {
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
      light_.assign(lightest_.begin(), lightest_.end());
      for (int p = h * S; p < (h + 1) * S; ++p) light_.push_back(old[p]);
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
      for (int k = 0; k < K; ++k) {
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
      ++st.steps;
    }
    st.max_load = max_of(L_);
    st.copies = static_cast<int>(copies);
    std::copy(slot_.begin(), slot_.end(), out);

    if (!capped && (st.max_load > T || copies > P_ / 3)) {
      // EPLB's plan, its GPU packs relabelled to the GPUs that hold most of them already.
      std::vector<long long> cost(uG * uG, 0);
      for (int k = 0; k < G; ++k)
        for (int g = 0; g < G; ++g) {
          long long c = 0;
          for (int p = k * S; p < (k + 1) * S; ++p) c += put_cost(g, eplb_row[p]);
          cost[static_cast<std::size_t>(k) * uG + static_cast<std::size_t>(g)] = c;
        }
      auto assign = hungarian(cost, G);
      long long fc = 0;
      for (int k = 0; k < G; ++k) fc += cost[static_cast<std::size_t>(k) * uG + static_cast<std::size_t>(assign[static_cast<std::size_t>(k)])];
      if (st.max_load > T || fc < copies) {
        for (int k = 0; k < G; ++k) {
          int g = assign[static_cast<std::size_t>(k)];
          for (int q = 0; q < S; ++q) out[g * S + q] = eplb_row[k * S + q];
        }
        st.fallback = true;
        st.copies = static_cast<int>(fc);
        st.max_load = st.eplb_max_load;
      }
    }
    (void)uP;
    keep_slots(old, out);
    return st;
  }

 private:
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
  /// 1 when GPU g held no copy of e in the old layout.
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
  std::vector<int> oldm_, hot_, lightest_, slot_, cnt_, order_, cand_, light_, touched_, tmp_, placed_, used_;
  std::vector<std::vector<int>> pos_;
};

}  // namespace detail

/// Checks an old layout: layers x P with P = slots of the new plan, entries in [0, experts), every
/// expert in every layer.
inline void check_layout(eplb::Matrix<int> const& old, int layers, int experts, int slots, char const* what) {
  check(old.rows == layers && old.cols == slots, what, " is ", old.rows, " x ", old.cols, ", expected layers x slots = ",
        layers, " x ", slots);
  std::vector<char> seen(static_cast<std::size_t>(experts));
  for (int l = 0; l < layers; ++l) {
    std::fill(seen.begin(), seen.end(), 0);
    for (int p = 0; p < slots; ++p) {
      int e = old(l, p);
      check(e >= 0 && e < experts, what, ": layer ", l, " slot ", p, " holds expert ", e, ", outside [0, ", experts, ")");
      seen[static_cast<std::size_t>(e)] = 1;
    }
    for (int e = 0; e < experts; ++e)
      check(seen[static_cast<std::size_t>(e)], what, ": layer ", l, " has no slot for expert ", e);
  }
}

/// EPLB's plan on the new loads (the reference), with eplb.py's choice of policy.
inline eplb::Result eplb_reference(eplb::Matrix<float> const& weight, int slots, int groups, int nodes, int gpus) {
  check(weight.rows > 0 && weight.cols > 0, "migration: empty weight matrix");
  for (float x : weight.v) check(std::isfinite(x) && x >= 0, "migration: load ", x, " is negative or not finite");
  check(groups > 0 && nodes > 0, "migration: groups (", groups, ") and nodes (", nodes, ") must be positive");
  return groups % nodes == 0 ? eplb::rebalance_experts_hierarchical(weight, slots, groups, nodes, gpus)
                             : eplb::rebalance_experts_hierarchical(weight, slots, 1, 1, gpus);
}

/// The minimal-move rebalance of every layer (see the header comment). weight: layers x experts;
/// old_phy2log: layers x slots, slots = gpus x S.
inline Result rebalance(eplb::Matrix<float> const& weight, eplb::Matrix<int> const& old_phy2log, int gpus,
                        Options const& o = {}) {
  int L = weight.rows, E = weight.cols, P = old_phy2log.cols;
  check(gpus > 0, "migration: GPUs must be positive, got ", gpus);
  check(P > 0 && P % gpus == 0, "migration: ", P, " slots do not split over ", gpus, " GPUs");
  check(std::isfinite(o.tolerance) && o.tolerance >= 0, "migration: tolerance must be >= 0 and finite, got ", o.tolerance);
  check(o.candidate_gpus > 0, "migration: candidate_gpus must be positive, got ", o.candidate_gpus);
  check(o.num_nodes > 0 && gpus % o.num_nodes == 0, "migration: ", gpus, " GPUs do not split over ", o.num_nodes, " nodes");
  auto ref = eplb_reference(weight, P, o.num_groups, o.num_nodes, gpus);
  check_layout(old_phy2log, L, E, P, "old placement");
  int S = P / gpus, per_node = gpus / o.num_nodes;
  Result r{eplb::Matrix<int>(L, P), eplb::Matrix<int>(L, E, 0), {}, {}, gpus};
  r.layers.resize(static_cast<std::size_t>(L));
  detail::LayerSearch search;
  std::vector<int> sends(static_cast<std::size_t>(gpus)), first, fill, holders;
  for (int l = 0; l < L; ++l) {
    auto const* w = weight.v.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(E);
    auto const* old = old_phy2log.v.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(P);
    auto* out = r.phy2log.v.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(P);
    r.layers[static_cast<std::size_t>(l)] =
        search.run(w, E, gpus, S, old, ref.phy2log.v.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(P), o, out);
    for (int p = 0; p < P; ++p) ++r.logcnt(l, out[p]);
    // Transfers: each slot whose expert its GPU did not hold receives it from a GPU that did.
    std::fill(sends.begin(), sends.end(), 0);
    first.assign(static_cast<std::size_t>(E) + 1, 0);  // old slots of each expert, bucketed
    for (int q = 0; q < P; ++q) ++first[static_cast<std::size_t>(old[q]) + 1];
    for (int e = 0; e < E; ++e) first[static_cast<std::size_t>(e) + 1] += first[static_cast<std::size_t>(e)];
    holders.resize(static_cast<std::size_t>(P));
    fill = first;
    for (int q = 0; q < P; ++q) holders[static_cast<std::size_t>(fill[static_cast<std::size_t>(old[q])]++)] = q;
    for (int p = 0; p < P; ++p) {
      int g = p / S, e = out[p];
      bool had = false;
      for (int q = g * S; q < (g + 1) * S && !had; ++q) had = old[q] == e;
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
