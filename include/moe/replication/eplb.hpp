#pragma once
// A C++ port of DeepSeek's Expert Parallelism Load Balancer (EPLB, github.com/deepseek-ai/EPLB,
// eplb.py): balanced_packing, replicate_experts, the hierarchical policy (groups packed to nodes,
// replicas made inside each node, physical experts packed to GPUs) and the global policy (the
// same with one group and one node), and rebalance_experts which picks between them.
//
// The port follows the reference step by step, including its arithmetic in 32-bit floats, its
// tie-breaking (torch's unstable CPU sort, reproduced by sorting the same (value, index) pairs
// with std::sort; the first of equal minima / maxima) and its fast path when every pack receives
// exactly one item. tests/planners/test_eplb_torch.cpp checks phy2log, log2phy and logcnt against
// 96 cases recorded from eplb.py under torch (many with tied loads): all identical. The tie order
// is that of libstdc++'s introsort (torch's CPU builds use it), replayed by detail::IntroSort, so
// it does not depend on the standard library the port is compiled with.
//
// Result for each layer: phy2log (physical slot -> logical expert; slot p lives on GPU
// p / (num_replicas / num_gpus)), log2phy (logical expert -> its slots, -1 padded) and logcnt
// (copies per logical expert).

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "moe/config.hpp"
#include "moe/plan/slot_map.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/plan/replica_table.hpp"

namespace moe::replication::eplb {

/// Row-major matrix of `rows` x `cols`.
template <class T>
struct Matrix {
  int rows = 0, cols = 0;
  std::vector<T> v;
  Matrix() = default;
  Matrix(int r, int c, T fill = T{}) : rows(r), cols(c), v(static_cast<std::size_t>(r) * static_cast<std::size_t>(c), fill) {}
  T& operator()(int r, int c) { return v[static_cast<std::size_t>(r) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c)]; }
  T const& operator()(int r, int c) const {
    return v[static_cast<std::size_t>(r) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c)];
  }
  [[nodiscard]] std::vector<T> row(int r) const {
    return std::vector<T>(v.begin() + static_cast<long>(r) * cols, v.begin() + static_cast<long>(r + 1) * cols);
  }
};

namespace detail {

/// libstdc++'s std::sort (introsort: median-of-three quicksort down to runs of 16, heapsort past
/// 2 log2(n) levels, then one insertion sort), written out so that the order of equal keys does
/// not depend on the standard library this is compiled against. `less(a, b)` compares elements.
template <class T, class Less>
class IntroSort {
public:
  IntroSort(std::vector<T>& v, Less less) : v_(v), less_(less) {}
  void run() {
    long n = static_cast<long>(v_.size());
    if (n < 2) return;
    long depth = 0;
    for (long k = n; k > 1; k >>= 1) ++depth;
    loop(0, n, 2 * depth);
    if (n > kThreshold) {
      insertion(0, kThreshold);
      for (long i = kThreshold; i < n; ++i) linear_insert(i);
    } else {
      insertion(0, n);
    }
  }

private:
  static constexpr long kThreshold = 16;
  T& at(long i) { return v_[static_cast<std::size_t>(i)]; }
  bool less(long a, long b) { return less_(at(a), at(b)); }

  void loop(long first, long last, long depth) {
    while (last - first > kThreshold) {
      if (depth == 0) {
        heap_sort(first, last);
        return;
      }
      --depth;
      long cut = partition_pivot(first, last);
      loop(cut, last, depth);
      last = cut;
    }
  }
  void median_to_first(long result, long a, long b, long c) {
    if (less(a, b)) {
      if (less(b, c)) std::swap(at(result), at(b));
      else if (less(a, c)) std::swap(at(result), at(c));
      else std::swap(at(result), at(a));
    } else if (less(a, c)) {
      std::swap(at(result), at(a));
    } else if (less(b, c)) {
      std::swap(at(result), at(c));
    } else {
      std::swap(at(result), at(b));
    }
  }
  long partition_pivot(long first, long last) {
    long mid = first + (last - first) / 2;
    median_to_first(first, first + 1, mid, last - 1);
    long lo = first + 1, hi = last, pivot = first;
    while (true) {
      while (less(lo, pivot)) ++lo;
      --hi;
      while (less(pivot, hi)) --hi;
      if (!(lo < hi)) return lo;
      std::swap(at(lo), at(hi));
      ++lo;
    }
  }
  void insertion(long first, long last) {
    if (first == last) return;
    for (long i = first + 1; i != last; ++i) {
      if (less(i, first)) {
        T value = std::move(at(i));
        for (long j = i; j > first; --j) at(j) = std::move(at(j - 1));
        at(first) = std::move(value);
      } else {
        linear_insert(i);
      }
    }
  }
  void linear_insert(long last) {
    T value = std::move(at(last));
    long next = last - 1;
    while (less_(value, at(next))) {
      at(last) = std::move(at(next));
      last = next;
      --next;
    }
    at(last) = std::move(value);
  }
  // Heapsort of [first, last) as std::__partial_sort(first, last, last): make_heap, then pop_heap
  // from the back.
  void adjust_heap(long first, long hole, long len, T value) {
    long top = hole, child = hole;
    while (child < (len - 1) / 2) {
      child = 2 * (child + 1);
      if (less(first + child, first + (child - 1))) --child;
      at(first + hole) = std::move(at(first + child));
      hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
      child = 2 * (child + 1);
      at(first + hole) = std::move(at(first + (child - 1)));
      hole = child - 1;
    }
    long parent = (hole - 1) / 2;
    while (hole > top && less_(at(first + parent), value)) {
      at(first + hole) = std::move(at(first + parent));
      hole = parent;
      parent = (hole - 1) / 2;
    }
    at(first + hole) = std::move(value);
  }
  void heap_sort(long first, long last) {
    long len = last - first;
    if (len >= 2)
      for (long parent = (len - 2) / 2;; --parent) {
        adjust_heap(first, parent, len, std::move(at(first + parent)));
        if (parent == 0) break;
      }
    while (last - first > 1) {
      --last;
      T value = std::move(at(last));
      at(last) = std::move(at(first));
      adjust_heap(first, 0, last - first, std::move(value));
    }
  }

  std::vector<T>& v_;
  Less less_;
};

/// The order torch.sort(descending=True) gives on CPU (eplb.py's `weight.sort(-1, descending=True)`):
/// torch sorts (value, index) pairs with std::sort and a value-only comparison, which is not
/// stable, so equal loads (every copy of one expert has the same per-copy load) come out in
/// introsort's order, not index order. IntroSort replays that algorithm step by step.
inline void torch_sort_descending(Matrix<float> const& weight, int row, std::vector<int>& order) {
  std::vector<std::pair<float, int>> kv(static_cast<std::size_t>(weight.cols));
  for (int j = 0; j < weight.cols; ++j) kv[static_cast<std::size_t>(j)] = {weight(row, j), j};
  auto greater = [](std::pair<float, int> const& a, std::pair<float, int> const& b) { return a.first > b.first; };
  IntroSort<std::pair<float, int>, decltype(greater)>(kv, greater).run();
  for (int j = 0; j < weight.cols; ++j) order[static_cast<std::size_t>(j)] = kv[static_cast<std::size_t>(j)].second;
}
}  // namespace detail

struct Packing {
  Matrix<int> pack_index, rank_in_pack;
};

/// Packs the n weighted items of each row into num_packs packs of exactly n / num_packs items,
/// heaviest item first into the lightest pack that still has room. PackSum: the type the pack
/// weights are summed in: float as eplb.py (torch float32 scalars); double as SGLang's copy of it
/// (sglang/srt/eplb/eplb_algorithms/deepseek.py, 0.5.23, sums `weight.tolist()` in Python floats),
/// whose choices differ where float32 rounding ties two packs that double tells apart.
template <class PackSum = float>
inline Packing balanced_packing(Matrix<float> const& weight, int num_packs) {
  int X = weight.rows, n = weight.cols;
  check(num_packs > 0 && n % num_packs == 0, "eplb balanced_packing: ", n, " items do not split into ",
        num_packs, " equal packs");
  int per_pack = n / num_packs;
  Packing out{Matrix<int>(X, n, -1), Matrix<int>(X, n, -1)};
  if (per_pack == 1) {
    for (int i = 0; i < X; ++i)
      for (int g = 0; g < n; ++g) {
        out.pack_index(i, g) = g;
        out.rank_in_pack(i, g) = 0;
      }
    return out;
  }
  std::vector<int> order(static_cast<std::size_t>(n));
  std::vector<PackSum> pack_w(static_cast<std::size_t>(num_packs));
  std::vector<int> pack_n(static_cast<std::size_t>(num_packs));
  for (int i = 0; i < X; ++i) {
    detail::torch_sort_descending(weight, i, order);
    std::fill(pack_w.begin(), pack_w.end(), PackSum{0});
    std::fill(pack_n.begin(), pack_n.end(), 0);
    for (int g : order) {
      int best = -1;
      for (int p = 0; p < num_packs; ++p)
        if (pack_n[static_cast<std::size_t>(p)] < per_pack &&
            (best < 0 || pack_w[static_cast<std::size_t>(p)] < pack_w[static_cast<std::size_t>(best)]))
          best = p;
      out.pack_index(i, g) = best;
      out.rank_in_pack(i, g) = pack_n[static_cast<std::size_t>(best)];
      pack_w[static_cast<std::size_t>(best)] += static_cast<PackSum>(weight(i, g));
      ++pack_n[static_cast<std::size_t>(best)];
    }
  }
  return out;
}

struct Replication {
  Matrix<int> phy2log, rank, logcnt;
};

/// Adds num_phy - num_log redundant copies per row, each to the expert with the largest load per
/// copy at that moment.
inline Replication replicate_experts(Matrix<float> const& weight, int num_phy) {
  int n = weight.rows, num_log = weight.cols;
  check(num_phy >= num_log, "eplb replicate_experts: ", num_phy, " physical slots cannot hold ", num_log,
        " logical experts");
  Replication r{Matrix<int>(n, num_phy), Matrix<int>(n, num_phy, 0), Matrix<int>(n, num_log, 1)};
  for (int i = 0; i < n; ++i) {
    for (int p = 0; p < num_phy; ++p) r.phy2log(i, p) = p < num_log ? p : 0;
    for (int p = num_log; p < num_phy; ++p) {
      int best = 0;
      float best_v = weight(i, 0) / static_cast<float>(r.logcnt(i, 0));
      for (int e = 1; e < num_log; ++e) {
        float v = weight(i, e) / static_cast<float>(r.logcnt(i, e));
        if (v > best_v) {
          best_v = v;
          best = e;
        }
      }
      r.phy2log(i, p) = best;
      r.rank(i, p) = r.logcnt(i, best);
      ++r.logcnt(i, best);
    }
  }
  return r;
}

struct Result {
  Matrix<int> phy2log;  ///< layers x num_replicas
  Matrix<int> phyrank;  ///< layers x num_replicas: which copy of its expert the slot holds
  Matrix<int> logcnt;   ///< layers x experts
  std::vector<std::vector<std::vector<int>>> log2phy;  ///< [layer][expert] -> slots (no padding)
  int num_gpus = 0;
  [[nodiscard]] int slots_per_gpu() const { return phy2log.cols / num_gpus; }
};

namespace detail {
inline Matrix<int> inverse(Matrix<int> const& perm) {
  Matrix<int> inv(perm.rows, perm.cols);
  for (int i = 0; i < perm.rows; ++i)
    for (int j = 0; j < perm.cols; ++j) inv(i, perm(i, j)) = j;
  return inv;
}
}  // namespace detail

/// The hierarchical policy (the global one is this with one group and one node). PackSum: as for
/// balanced_packing (double: SGLang's deepseek.py).
template <class PackSum = float>
inline Result rebalance_experts_hierarchical(Matrix<float> const& weight, int num_physical, int num_groups,
                                             int num_nodes, int num_gpus) {
  int L = weight.rows, E = weight.cols;
  check(num_groups > 0 && E % num_groups == 0, "eplb: ", E, " experts do not split into ", num_groups, " groups");
  int group_size = E / num_groups;
  check(num_nodes > 0 && num_groups % num_nodes == 0, "eplb: ", num_groups, " groups do not split over ",
        num_nodes, " nodes");
  int groups_per_node = num_groups / num_nodes;
  check(num_gpus > 0 && num_gpus % num_nodes == 0, "eplb: ", num_gpus, " GPUs do not split over ", num_nodes,
        " nodes");
  check(num_physical % num_gpus == 0, "eplb: ", num_physical, " physical experts do not split over ", num_gpus,
        " GPUs");
  check(num_physical >= E, "eplb: ", num_physical, " physical experts cannot hold ", E, " logical experts");
  int phy_per_gpu = num_physical / num_gpus;
  int log_per_node = E / num_nodes, phy_per_node = num_physical / num_nodes;
  check(phy_per_node >= log_per_node, "eplb: a node's ", phy_per_node, " slots cannot hold its ",
        log_per_node, " experts");

  // Step 1: pack groups to nodes.
  Matrix<float> tokens_per_group(L, num_groups, 0.0f);
  for (int l = 0; l < L; ++l)
    for (int g = 0; g < num_groups; ++g) {
      float s = 0.0f;
      for (int j = 0; j < group_size; ++j) s += weight(l, g * group_size + j);
      tokens_per_group(l, g) = s;
    }
  Packing gp = balanced_packing<PackSum>(tokens_per_group, num_nodes);
  Matrix<int> log2mlog(L, E);
  for (int l = 0; l < L; ++l)
    for (int g = 0; g < num_groups; ++g)
      for (int j = 0; j < group_size; ++j)
        log2mlog(l, g * group_size + j) =
            (gp.pack_index(l, g) * groups_per_node + gp.rank_in_pack(l, g)) * group_size + j;
  Matrix<int> mlog2log = detail::inverse(log2mlog);

  // Step 2: replicate experts inside each node.
  Matrix<float> tokens_per_mlog(L * num_nodes, log_per_node);
  for (int l = 0; l < L; ++l)
    for (int nd = 0; nd < num_nodes; ++nd)
      for (int k = 0; k < log_per_node; ++k)
        tokens_per_mlog(l * num_nodes + nd, k) = weight(l, mlog2log(l, nd * log_per_node + k));
  Replication rep = replicate_experts(tokens_per_mlog, phy_per_node);

  // Step 3: pack physical experts to the GPUs of each node.
  Matrix<float> tokens_per_phy(L * num_nodes, phy_per_node);
  for (int i = 0; i < L * num_nodes; ++i)
    for (int p = 0; p < phy_per_node; ++p) {
      int m = rep.phy2log(i, p);
      tokens_per_phy(i, p) = tokens_per_mlog(i, m) / static_cast<float>(rep.logcnt(i, m));
    }
  Packing pp = balanced_packing<PackSum>(tokens_per_phy, num_gpus / num_nodes);
  Matrix<int> phy2pphy(L * num_nodes, phy_per_node);
  for (int i = 0; i < L * num_nodes; ++i)
    for (int p = 0; p < phy_per_node; ++p) phy2pphy(i, p) = pp.pack_index(i, p) * phy_per_gpu + pp.rank_in_pack(i, p);
  Matrix<int> pphy2phy = detail::inverse(phy2pphy);

  Result res{Matrix<int>(L, num_physical), Matrix<int>(L, num_physical), Matrix<int>(L, E), {}, num_gpus};
  for (int l = 0; l < L; ++l)
    for (int nd = 0; nd < num_nodes; ++nd) {
      int i = l * num_nodes + nd;
      for (int q = 0; q < phy_per_node; ++q) {
        int phy = pphy2phy(i, q);
        int mlog = rep.phy2log(i, phy) + nd * log_per_node;
        res.phy2log(l, nd * phy_per_node + q) = mlog2log(l, mlog);
        res.phyrank(l, nd * phy_per_node + q) = rep.rank(i, phy);
      }
    }
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < E; ++e) {
      int m = log2mlog(l, e);
      res.logcnt(l, e) = rep.logcnt(l * num_nodes + m / log_per_node, m % log_per_node);
    }
  return res;
}

/// DeepSeek's entry point: the hierarchical policy when the groups split evenly over the nodes,
/// otherwise the global policy. weight is layers x experts (loads); returns the plan.
inline Result rebalance_experts(Matrix<float> const& weight, int num_replicas, int num_groups, int num_nodes,
                                int num_gpus) {
  check(weight.rows > 0 && weight.cols > 0, "eplb: empty weight matrix");
  for (float w : weight.v) check(std::isfinite(w) && w >= 0, "eplb: load ", w, " is negative or not finite");
  check(num_groups > 0 && num_nodes > 0, "eplb: groups (", num_groups, ") and nodes (", num_nodes,
        ") must be positive");
  Result r = num_groups % num_nodes == 0
                 ? rebalance_experts_hierarchical(weight, num_replicas, num_groups, num_nodes, num_gpus)
                 : rebalance_experts_hierarchical(weight, num_replicas, 1, 1, num_gpus);
  int L = weight.rows, E = weight.cols;
  r.log2phy.assign(static_cast<std::size_t>(L), std::vector<std::vector<int>>(static_cast<std::size_t>(E)));
  for (int l = 0; l < L; ++l) {
    for (int e = 0; e < E; ++e) r.log2phy[static_cast<std::size_t>(l)][static_cast<std::size_t>(e)].assign(
        static_cast<std::size_t>(r.logcnt(l, e)), -1);
    for (int p = 0; p < num_replicas; ++p)
      r.log2phy[static_cast<std::size_t>(l)][static_cast<std::size_t>(r.phy2log(l, p))]
               [static_cast<std::size_t>(r.phyrank(l, p))] = p;
  }
  return r;
}

/// Convenience: weights given as doubles (layers x experts, row-major).
inline Result rebalance_experts(std::vector<double> const& weight, int layers, int experts, int num_replicas,
                                int num_groups, int num_nodes, int num_gpus) {
  check(weight.size() == static_cast<std::size_t>(layers) * static_cast<std::size_t>(experts),
        "eplb: weight has ", weight.size(), " entries, expected ", layers, "x", experts);
  Matrix<float> w(layers, experts);
  for (std::size_t i = 0; i < weight.size(); ++i) w.v[i] = static_cast<float>(weight[i]);
  return rebalance_experts(w, num_replicas, num_groups, num_nodes, num_gpus);
}

/// The layer tables of one EPLB layer: primary = GPU of the expert's copy 0; replicas = the GPUs
/// of all its copies (a GPU holding two copies of one expert is listed once).
struct LayerTables {
  placement::Table placement;
  replication::Table replicas;
};

inline LayerTables layer_tables(Result const& r, int layer) {
  check(layer >= 0 && static_cast<std::size_t>(layer) < r.log2phy.size(), "eplb: layer ", layer, " outside [0, ",
        r.log2phy.size(), ")");
  int E = r.logcnt.cols, per_gpu = r.slots_per_gpu();
  std::vector<int> primary(static_cast<std::size_t>(E));
  std::vector<std::vector<int>> copies(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e) {
    auto const& slots = r.log2phy[static_cast<std::size_t>(layer)][static_cast<std::size_t>(e)];
    primary[static_cast<std::size_t>(e)] = slots.front() / per_gpu;
    for (int s : slots) {
      int g = s / per_gpu;
      auto& c = copies[static_cast<std::size_t>(e)];
      if (std::find(c.begin(), c.end(), g) == c.end()) c.push_back(g);
    }
  }
  return {placement::Table(std::move(primary)), replication::Table(std::move(copies))};
}

/// EPLB's own slot layout (phy2log), as SGLang's and TensorRT-LLM's EPLB write it: slot p of a
/// layer on GPU p / slots_per_gpu, two copies of one expert possibly on one GPU.
inline placement::SlotMap slot_map(Result const& r) {
  placement::SlotMap m(r.phy2log.rows, r.num_gpus, r.slots_per_gpu(), r.logcnt.cols);
  for (int l = 0; l < r.phy2log.rows; ++l)
    for (int p = 0; p < r.phy2log.cols; ++p) m.at(l, p) = r.phy2log(l, p);
  m.validate();
  return m;
}

}  // namespace moe::replication::eplb
