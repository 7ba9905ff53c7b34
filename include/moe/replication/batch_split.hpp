#pragma once
// Per-batch replica split: `replication::BatchSplit`, and the computation under it
// (`replication::split`), shared by the host and the device (moe/kernels/batch_split.cuh runs the
// same code in one CUDA thread block).
//
// The question. Each expert e has copies on the ranks of its copy list (one slot per copy). A batch
// brings n(r, e) token-expert pairs of expert e from source rank r. A split says, for every
// (source rank r, slot c of expert e), how many of r's pairs of e go to copy c. A rank receives the
// pairs of every slot it holds. The split minimises, in this order:
//   1. the largest number of pairs any rank receives (the integer optimum, which is the LP optimum
//      with fractional splits rounded up: the problem is a flow with integer capacities);
//   2. the pairs that leave their own rank (maximise the pairs served by a copy on their source);
//   3. the pairs that leave their own server (NVLink domain);
// the pairs that still cross the network are matched to copies in a fixed order.
//
// How. Experts with one copy have no choice; their pairs are the fixed load F(g) of each rank. For
// the others only the amount y(c) each copy receives decides 1-3: the local pairs are
// sum min(y(c), n(rank of c, e)), and, once y is fixed, the most pairs that can stay on their server
// is sum over (e, server s) of min(Y(e, s), N(e, s)) (Y: what copies of e on s receive; N: what
// ranks of s send to e), reached by matching own-rank pairs first, then own-server pairs. Both
// terms are concave in y, so 2-3 are a separable convex-cost flow on a graph of ranks:
// moving one pair of e from copy c (rank g) to copy d (rank h) is an arc g -> h whose cost is the
// change of  A x local + B x same-server  (A > B x all pairs: lexicographic).
//   - Start: every expert on its own, at its cheapest: local pairs on their copy, then each server's
//     pairs on its own copies, the rest (sources on servers without a copy) levelled over the
//     copies' rank loads. This start has no negative cycle (each expert alone is optimal and the
//     costs of two experts do not interact).
//   - The max load T: from the lower bound max(max F, ceil(all pairs / ranks), and for each set S of
//     the ranks of one expert's copies or of one server, ceil(what must land in S / |S|)) (set_bound),
//     pairs of ranks above T move along residual arcs (breadth-first) to ranks below T: every rank
//     below T that a search reaches takes its tree path, then each side arc into such a rank one
//     more path (max_load_step). When none can be reached, the reached ranks U hold every copy of every
//     expert they serve, so any split loads them with at least their present total: T rises to
//     ceil(load(U) / |U|) (a Newton step of the parametric flow). It ends at the least feasible T.
//   - The tie-breaks: from the same start, successive shortest paths (Bellman-Ford on the rank
//     graph, all ranks above T as sources; the path to a rank is, among its shortest ones, one with
//     the fewest arcs, and of those the one whose last arc is lowest: each rank's label is the
//     least (distance, arcs, last arc), which does not depend on the order of the relaxations) move
//     each rank's excess over T at least cost, so the result is the least-cost split among those
//     with max load T. A search serves every rank below T at its least distance by its tree path,
//     then by each side arc into it, as long as the path is still a shortest one once the paths
//     before it have moved their pairs (tie_break_step).
//   - The order (decide): the tie-breaks run first at the lower bound, which is the least max load
//     in most batches; if they end, it was, and their split is the answer. If a search reaches no
//     rank below it (CostEnd::stuck), the bound is too low: T is searched from the start as above
//     and the tie-breaks run again from the start at T. The same split either way.
// Every step is integer and visits ranks, experts and slots in index order, so every rank computes
// the same split from the same counts, and the device equals the host bit for bit.
//
// Cost: linear in ranks x experts for the counts, then work on the experts with copies only: 15 to
// 27 us per layer for DeepSeek-V3 at EP32 on one (shared) core, against 0.1 to 9 ms for Reactive
// (benchmarks/planners/bench_batch_split.cpp, docs/results/batch-balance.md). The decision part
// grows with ranks x arcs per shortest path: at 256 ranks with experts of 16 copies it takes ms.
//
// Stages (so that a CUDA block can share them): count_servers (the block: count_servers_block), decide
// (its pieces: decide_begin, expert_totals and expert_arcs over the experts, start_expert per
// expert, the breadth-first and shortest-path rounds over the arcs, augment; decide() runs them on
// one thread), gather_sources (any split of the rows), match (any split of the experts with
// copies); solve() runs them in order.

#include <algorithm>
#include <bit>
#include <cstdint>
#include <span>
#include <vector>

#include "moe/config.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/topology/topology.hpp"

namespace moe::replication {

namespace split {

/// The layer's copies and topology, as flat arrays (the device form holds the same in device memory).
struct Layout {
  int ranks = 0, experts = 0, slots = 0, servers = 0;
  int const* first = nullptr;   ///< experts + 1: the slots of expert e are first[e] .. first[e + 1]
  int const* rank = nullptr;    ///< slots: the rank holding each copy
  int const* server = nullptr;  ///< ranks: the server of each rank
  int arcs = 0;                 ///< sum over experts with k >= 2 copies of k (k - 1): see arc_count
  /// Balance slack, in thousandths of the mean rank load: 0 (the default) splits at the least max
  /// load; s > 0 lets the tie-breaks (own rank, own server) use every rank up to
  /// max(least max load, ceil(mean x (1000 + s) / 1000)), which keeps more pairs off the network at
  /// the price of balance (no longer within the bound of the file comment).
  int slack_permille = 0;
};

/// Arcs of the rank graph: one per ordered pair of copies of an expert with two copies or more.
MOE_HOST_DEVICE inline int arc_count(int experts, int const* first) {
  int a = 0;
  for (int e = 0; e < experts; ++e) {
    int k = first[e + 1] - first[e];
    if (k >= 2) a += k * (k - 1);
  }
  return a;
}

/// 64-bit words of workspace solve() needs.
MOE_HOST_DEVICE inline long long workspace_words(Layout const& L) {
  return 8LL * L.ranks + 3LL * L.experts + 6LL * L.slots + static_cast<long long>(L.servers + 2) * (L.experts + 1) +
         static_cast<long long>(L.slots - L.experts + 1) * L.ranks + 8 + L.slots + 3LL * L.ranks + L.arcs +
         (static_cast<long long>(L.servers) * L.experts + 1) / 2 +
         2LL * L.arcs + (L.arcs + 31) / 32 + (L.ranks + 31) / 32 + (L.ranks + 1) / 2;
}

/// What solve() reports besides the split.
struct Outcome {
  long long max_load = 0;       ///< the largest pairs any rank receives
  long long local = 0;          ///< pairs served on their source rank
  long long same_server = 0;    ///< pairs served on their source server (local ones included)
  int bad = 0;  ///< 0; 1: a negative count (nothing written); 2: an internal fault (a bug: report it)
};

namespace detail {

MOE_HOST_DEVICE inline long long lmin(long long a, long long b) { return a < b ? a : b; }
MOE_HOST_DEVICE inline long long lmax(long long a, long long b) { return a > b ? a : b; }

/// The lowest set bit of a non-zero word.
MOE_HOST_DEVICE inline int lowest_bit(std::uint32_t m) {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(m)) - 1;
#else
  return std::countr_zero(m);
#endif
}

/// The ranks of expert e's copies as bits (ranks < 64).
MOE_HOST_DEVICE inline unsigned long long copy_bits(Layout const& L, int e) {
  unsigned long long m = 0;
  MOE_NO_UNROLL
  for (int c = L.first[e]; c < L.first[e + 1]; ++c) m |= 1ULL << L.rank[c];
  return m;
}

/// The first i in [from, n) that is marked, or n. The marks are bits, 32 to a word (item i is bit
/// i % 32 of bits[i / 32]; bits past n are zero), set at a search by a CUDA team with one ballot per
/// 32 items, so that the one thread that walks them reads a word per 32 items and visits only the
/// marked ones. With bits == nullptr, marked(i) is asked instead.
template <class Marked>
MOE_HOST_DEVICE inline int next_marked(long long const* bits, int from, int n, Marked marked) {
  if (bits == nullptr) {
    MOE_NO_UNROLL
    for (int i = from; i < n; ++i)
      if (marked(i)) return i;
    return n;
  }
  MOE_NO_UNROLL
  for (int w = from / 32; w * 32 < n; ++w) {
    auto m = static_cast<std::uint32_t>(bits[w]);
    if (w == from / 32) m &= ~0u << (from % 32);
    if (m != 0) return w * 32 + lowest_bit(m);
  }
  return n;
}

/// The workspace, carved from one array of 64-bit words.
struct Work {
  long long *N, *load, *y, *loc, *srvN, *sexp, *P, *dist, *pred, *path, *rem, *arc_c, *arc_d, *multi, *mark,
      *need, *srank, *sfirst, *mc, *supply, *hdr, *P32, *y0, *load_s, *ndist, *hop, *cost;
  long long *arc_bits, *rank_bits;  ///< a search's marks for one thread's paths (next_marked)
  long long* claim;                 ///< room for `ranks` ints (a CUDA team's breadth-first claims)
  int n_multi = 0, n_arcs = 0;

  MOE_HOST_DEVICE Work(Layout const& L, long long* w) {
    long long* p = w;
    auto take = [&p](long long n) {
      long long* q = p;
      p += n;
      return q;
    };
    N = take(L.experts);
    multi = take(L.experts);
    load = take(L.ranks);
    dist = take(L.ranks);
    pred = take(L.ranks);
    path = take(L.ranks + L.servers + 1);  // the arcs of a shortest path; also a cursor per server
    rem = take(L.ranks);
    srank = take(L.ranks);
    sfirst = take(L.servers + 1);
    mc = take(L.experts);
    hdr = take(8);
    P32 = take((static_cast<long long>(L.servers) * L.experts + 1) / 2);  // 32-bit sums (host stage 1)
    supply = take(static_cast<long long>(L.slots - L.experts + 1) * L.ranks);
    y = take(L.slots);
    loc = take(L.slots);
    srvN = take(L.slots);
    sexp = take(L.slots);
    mark = take(L.slots);
    need = take(L.slots);
    P = take(static_cast<long long>(L.servers) * L.experts);
    arc_c = take(L.arcs);
    arc_d = take(L.arcs);
    y0 = take(L.slots);
    load_s = take(L.ranks);
    ndist = take(L.ranks);
    hop = take(L.ranks);
    cost = take(L.arcs);
    arc_bits = take((L.arcs + 31) / 32);
    rank_bits = take((L.ranks + 31) / 32);
    claim = take((L.ranks + 1) / 2);
  }
};

/// The walk of a search's step over the paths it serves: f(lead, -2) first when lead >= 0; then
/// f(h, -1) for each marked rank h in [from, ranks), in rank order; then f(h, a) for each marked arc
/// a in [0, n_arcs), in arc order, h its head (next_marked says how the marks are read). f returns
/// whether to go on. One call of f, so that a CUDA thread's code holds f's paths once, not once per
/// kind (each path walk inlines the arcs' costs).
template <class RankMarked, class ArcMarked, class F>
MOE_HOST_DEVICE inline void for_each_side(Layout const& L, Work const& W, int lead, long long const* rank_bits, int from,
                                          RankMarked rank_marked, long long const* arc_bits, int n_arcs,
                                          ArcMarked arc_marked, F f) {
  int r = from, x = 0, h = lead, a = -2;
  MOE_NO_UNROLL
  for (;;) {
    if (h < 0) {  // the next marked rank, else the next marked arc
      if (r < L.ranks) r = next_marked(rank_bits, r, L.ranks, rank_marked);
      if (r < L.ranks) {
        h = r++, a = -1;
      } else {
        x = next_marked(arc_bits, x, n_arcs, arc_marked);
        if (x >= n_arcs) return;
        a = x++, h = L.rank[W.arc_d[a]];
      }
    }
    if (!f(h, a)) return;
    h = -1;
  }
}

/// Words of Work::hdr: the experts with copies (for the matching stages), the sums of decide()'s
/// expert stage, and the counts of its lists (so that the threads of a block can share them).
enum Header : int { kMc = 0, kTotal = 1, kLocal = 2, kSame = 3, kArcs = 4 };

/// The sums of the expert stage on the host: plain additions (a CUDA block adds atomically).
/// sum<K>(v): header word K += v; load(p, v): a rank's load *p += v.
struct PlainAdd {
  long long* hdr;
  template <int K>
  MOE_HOST_DEVICE void sum(long long v) const {
    hdr[K] += v;
  }
  MOE_HOST_DEVICE void load(long long* p, long long v) const { *p += v; }
};

/// What the copies of expert e on server s0 receive, into *Y0, and on server s1 != s0, into *Y1
/// (s1 = -1: none), in one pass over the expert's copies.
MOE_HOST_DEVICE inline void server_takes(Layout const& L, Work const& W, int e, int s0, int s1, long long* Y0,
                                         long long* Y1) {
  long long a = 0, b = 0;
  MOE_NO_UNROLL
  for (int d = L.first[e]; d < L.first[e + 1]; ++d) {
    int s = L.server[L.rank[d]];
    if (s == s0) a += W.y[d];
    else if (s == s1) b += W.y[d];
  }
  *Y0 = a, *Y1 = b;
}

/// Y(e, server of slot c): what the copies of c's expert on c's server receive.
MOE_HOST_DEVICE inline long long server_take(Layout const& L, Work const& W, int e, int c) {
  long long Y = 0, none = 0;
  server_takes(L, W, e, L.server[L.rank[c]], -1, &Y, &none);
  return Y;
}

/// Spreads `amount` pairs of one expert over its slots c with mark[c] == tag, raising the lowest rank
/// loads first (water-filling; the remainder one pair each to the lowest slots at the final level).
MOE_HOST_DEVICE inline void level(Layout const& L, Work& W, int e, long long tag, long long amount) {
  if (amount <= 0) return;
  // the slots, in order of rank load then slot (insertion sort: an expert has few copies)
  int k = 0;
  long long* ord = W.need;  // scratch: the first k entries from first[e]
  long long* o = ord + L.first[e];
  MOE_NO_UNROLL
  for (int c = L.first[e]; c < L.first[e + 1]; ++c) {
    if (W.mark[c] != tag) continue;
    int i = k++;
    MOE_NO_UNROLL
    while (i > 0) {
      long long prev = o[i - 1];
      long long lp = W.load[L.rank[prev]], lc = W.load[L.rank[c]];
      if (lp < lc || (lp == lc && prev < c)) break;
      o[i] = prev;
      --i;
    }
    o[i] = c;
  }
  // the level: the largest h with sum over the j lowest of (h - load) <= amount
  long long sum = 0;
  int j = 1;
  long long h = W.load[L.rank[o[0]]];
  for (;;) {
    long long next = j < k ? W.load[L.rank[o[j]]] : -1;
    if (j < k && sum + (next - h) * j <= amount) {
      sum += (next - h) * j;
      h = next;
      ++j;
      continue;
    }
    long long q = (amount - sum) / j;
    h += q;
    sum += q * j;
    break;
  }
  long long extra = amount - sum;  // < j: one more to the lowest slots (slot order) among the j
  MOE_NO_UNROLL
  for (int c = L.first[e]; c < L.first[e + 1]; ++c) {
    bool in = false;
    MOE_NO_UNROLL
    for (int i = 0; i < j; ++i) in |= o[i] == c;
    if (!in) continue;
    long long add = h - W.load[L.rank[c]];
    if (extra > 0) ++add, --extra;
    W.y[c] += add;
    W.load[L.rank[c]] += add;
  }
}

/// The start of one expert with copies and pairs, alone at its cheapest: its local pairs on their
/// copy, then each server's pairs on its own copies, the rest levelled over the copies' rank loads.
/// Reads and raises the loads of its copies' ranks only, so experts on disjoint ranks may start at
/// the same time (a CUDA block starts them in waves, moe/kernels/batch_split.cuh); experts that
/// share a rank start in expert order.
MOE_HOST_DEVICE inline void start_expert(Layout const& L, Work& W, int e) {
  long long placed = 0;
  MOE_NO_UNROLL
  for (int c = L.first[e]; c < L.first[e + 1]; ++c) {
    W.y[c] = W.loc[c];
    W.load[L.rank[c]] += W.loc[c];
    placed += W.loc[c];
  }
  MOE_NO_UNROLL
  for (int c = L.first[e]; c < L.first[e + 1]; ++c) {
    int s = L.server[L.rank[c]];
    bool first_on_server = true;
    MOE_NO_UNROLL
    for (int d = L.first[e]; d < c; ++d) first_on_server &= L.server[L.rank[d]] != s;
    if (!first_on_server) continue;
    long long local = 0;
    MOE_NO_UNROLL
    for (int d = L.first[e]; d < L.first[e + 1]; ++d)
      if (L.server[L.rank[d]] == s) W.mark[d] = c, local += W.loc[d];
    level(L, W, e, c, W.srvN[c] - local);
    placed += W.srvN[c] - local;
  }
  MOE_NO_UNROLL
  for (int c = L.first[e]; c < L.first[e + 1]; ++c) W.mark[c] = -2;
  level(L, W, e, -2, W.N[e] - placed);
}

/// The cheapest start: every expert with copies alone, in expert order (see start_expert).
MOE_HOST_DEVICE inline void start(Layout const& L, Work& W) {
  for (int c = 0; c < L.slots; ++c) W.y[c] = 0, W.mark[c] = -1;
  for (int i = 0; i < W.n_multi; ++i) start_expert(L, W, static_cast<int>(W.multi[i]));
}

/// Cost change (A x lost local + B x lost same-server) of moving one pair of an expert from slot c
/// to slot d, and how many pairs can move before it changes (or c runs out).
MOE_HOST_DEVICE inline long long move_cost(Layout const& L, Work const& W, int e, int c, int d, long long A,
                                           long long* room) {
  long long cost = 0, r = W.y[c];
  if (W.y[c] <= W.loc[c]) cost += A;
  else r = lmin(r, W.y[c] - W.loc[c]);
  if (W.y[d] < W.loc[d]) cost -= A, r = lmin(r, W.loc[d] - W.y[d]);
  int const sc = L.server[L.rank[c]], sd = L.server[L.rank[d]];
  if (sc != sd) {
    long long Yc = 0, Yd = 0;  // server_take of c and of d
    server_takes(L, W, e, sc, sd, &Yc, &Yd);
    if (Yc <= W.srvN[c]) cost += 1;
    else r = lmin(r, Yc - W.srvN[c]);
    if (Yd < W.srvN[d]) cost -= 1, r = lmin(r, W.srvN[d] - Yd);
  }
  *room = r;
  return cost;
}

constexpr long long inf = 0x3fffffffffffffffLL;

}  // namespace detail

/// Stage 1 of solve(): the pairs per (source server, expert), row by row (contiguous), in 32-bit sums
/// when no sum can reach 2^31. Returns the bitwise OR of the counts it read (negative when one of them
/// is). The CUDA block has its own form of it (count_servers_block in moe/kernels/batch_split.cuh).
MOE_HOST_DEVICE inline std::int32_t count_servers(Layout const& L, std::int32_t const* counts, long long* work) {
  detail::Work W(L, work);
  std::int32_t sign = 0;
  long long const n = static_cast<long long>(L.servers) * L.experts;
  auto* P32 = reinterpret_cast<std::uint32_t*>(W.P32);
  for (long long i = 0; i < n; ++i) P32[i] = 0;
  for (int r = 0; r < L.ranks; ++r) {
    std::int32_t const* row = counts + static_cast<long long>(r) * L.experts;
    std::uint32_t* acc = P32 + static_cast<long long>(L.server[r]) * L.experts;
    for (int e = 0; e < L.experts; ++e) acc[e] += static_cast<std::uint32_t>(row[e]), sign |= row[e];
  }
  if (sign < 0) return sign;
  if (sign <= 0x7fffffff / (L.ranks > 0 ? L.ranks : 1)) {  // every count <= sign: no sum wrapped
    for (long long i = 0; i < n; ++i) W.P[i] = static_cast<long long>(P32[i]);
    return sign;
  }
  for (long long i = 0; i < n; ++i) W.P[i] = 0;  // large counts: 64-bit sums
  for (int r = 0; r < L.ranks; ++r) {
    std::int32_t const* row = counts + static_cast<long long>(r) * L.experts;
    long long* acc = W.P + static_cast<long long>(L.server[r]) * L.experts;
    for (int e = 0; e < L.experts; ++e) acc[e] += row[e];
  }
  return sign;
}

/// Stage 2 of solve(), in pieces that the threads of a CUDA block can share
/// (moe/kernels/batch_split.cuh); decide() runs them in order on one thread.
///
/// The ranks of each server, in rank order: server v's are srank[sfirst[v] .. sfirst[v + 1]].
/// `cursor`: servers words of scratch. They depend on the layout alone (DeviceSplit makes them once).
template <class I>
MOE_HOST_DEVICE inline void server_ranks(Layout const& L, I* sfirst, I* srank, I* cursor) {
  for (int v = 0; v <= L.servers; ++v) sfirst[v] = 0;
  for (int r = 0; r < L.ranks; ++r) ++sfirst[L.server[r] + 1];
  for (int v = 0; v < L.servers; ++v) sfirst[v + 1] += sfirst[v];
  for (int v = 0; v < L.servers; ++v) cursor[v] = sfirst[v];
  for (int r = 0; r < L.ranks; ++r) srank[cursor[L.server[r]]++] = r;
}

/// 2a (one thread): the ranks of each server (server_ranks); the loads and the header sums zeroed.
MOE_HOST_DEVICE inline void decide_begin(Layout const& L, detail::Work& W) {
  server_ranks(L, W.sfirst, W.srank, W.path);
  for (int g = 0; g < L.ranks; ++g) W.load[g] = 0;
  for (int i = 0; i < 8; ++i) W.hdr[i] = 0;
}

/// 2b (any split of the experts): expert e's pairs N[e], added to the total; an expert with one
/// copy adds them to its rank's fixed load, and what stays on its rank and server to the header's
/// sums. `add`: `sum<K>(v)` adds v to header word K, `load(p, v)` to a rank's load *p (each
/// atomically where threads share them; PlainAdd on one thread). Returns whether e has copies and
/// pairs (an expert the flow decides).
template <class Add>
MOE_HOST_DEVICE inline bool expert_totals(Layout const& L, std::int32_t const* counts, detail::Work& W, int e,
                                          Add& add) {
  using namespace detail;
  int E = L.experts;
  long long n = 0;
  MOE_NO_UNROLL
  for (int v = 0; v < L.servers; ++v) n += W.P[static_cast<long long>(v) * E + e];
  W.N[e] = n;
  add.template sum<kTotal>(n);
  if (L.first[e + 1] - L.first[e] > 1) return n > 0;
  int g = L.rank[L.first[e]];
  add.load(&W.load[g], n);
  add.template sum<kLocal>(counts[static_cast<long long>(g) * E + e]);
  add.template sum<kSame>(W.P[static_cast<long long>(L.server[g]) * E + e]);
  return false;
}

/// 2c (any split of the experts with copies and pairs): the local and same-server sources of expert
/// e's copies, and its arcs, from arc index a0 (its k (k - 1) arcs follow those of the experts before
/// it in W.multi).
MOE_HOST_DEVICE inline void expert_arcs(Layout const& L, std::int32_t const* counts, detail::Work& W, int e,
                                        int a0) {
  int E = L.experts;
  MOE_NO_UNROLL
  for (int c = L.first[e]; c < L.first[e + 1]; ++c) {
    W.loc[c] = counts[static_cast<long long>(L.rank[c]) * E + e];
    W.srvN[c] = W.P[static_cast<long long>(L.server[L.rank[c]]) * E + e];
    MOE_NO_UNROLL
    for (int d = L.first[e]; d < L.first[e + 1]; ++d)
      if (d != c) W.arc_c[a0] = c, W.arc_d[a0] = d, ++a0;
  }
}

/// Arcs of one expert in the rank graph (k copies: k (k - 1)).
MOE_HOST_DEVICE inline int expert_arc_count(Layout const& L, int e) {
  int k = L.first[e + 1] - L.first[e];
  return k >= 2 ? k * (k - 1) : 0;
}

/// The least max load the flow starts from: the largest fixed load and the mean, rounded up.
MOE_HOST_DEVICE inline long long lower_bound(long long max_fixed, long long total, int ranks) {
  return detail::lmax(max_fixed, ranks > 0 ? (total + ranks - 1) / ranks : 0);
}
MOE_HOST_DEVICE inline long long lower_bound(Layout const& L, detail::Work const& W) {
  long long T = 0;
  for (int g = 0; g < L.ranks; ++g) T = detail::lmax(T, W.load[g]);
  return lower_bound(T, W.hdr[detail::kTotal], L.ranks);
}

/// A tighter lower bound from one set S of ranks: every pair of an expert whose copies all lie in S
/// is served in S, so some rank of S receives at least ceil(need / |S|), need = the fixed loads of
/// S's ranks (W.load before the start) plus the pairs of the experts with copies that lie in S.
/// The sets: i < n_list, the ranks of the copies of expert list[i] (up to 64 ranks; past that it
/// returns 0); i = n_list + v, the ranks of server v. `list`: the experts with copies (W.multi on
/// the host: those with pairs; one without pairs adds nothing), in any order.
/// Starting the least max load from the largest of these (set_bounds) skips the searches and
/// Newton steps that would lift T to it, and changes nothing else: the least max load is the least
/// feasible T from any lower bound, and its flow is not kept (the tie-breaks start again).
MOE_HOST_DEVICE inline long long set_bound(Layout const& L, detail::Work const& W, long long const* list, int n_list,
                                           int i, long long const* bits_of_list = nullptr) {
  int lo, hi;  // the set: L.rank[c] for c in [lo, hi), or W.srank[j] for j in [lo, hi)
  bool const server = i >= n_list;
  if (server) lo = static_cast<int>(W.sfirst[i - n_list]), hi = static_cast<int>(W.sfirst[i - n_list + 1]);
  else lo = L.first[list[i]], hi = L.first[list[i] + 1];
  // up to 64 ranks, sets are words of bits and "inside" is one AND; past that only the servers'
  // sets are tried (each expert's would cost the experts squared)
  bool const bits = L.ranks <= 64;
  if (hi <= lo || (!bits && !server)) return 0;
  auto member = [&](int j) { return server ? static_cast<int>(W.srank[j]) : L.rank[j]; };
  unsigned long long in = 0;
  long long need = 0;
  MOE_NO_UNROLL
  for (int j = lo; j < hi; ++j) {
    need += W.load[member(j)];
    if (bits) in |= 1ULL << member(j);
  }
  MOE_NO_UNROLL
  for (int x = 0; x < n_list; ++x) {
    int e = static_cast<int>(list[x]);
    bool inside = true;
    if (bits) {
      auto m = bits_of_list != nullptr ? static_cast<unsigned long long>(bits_of_list[x]) : detail::copy_bits(L, e);
      inside = (m & ~in) == 0;
    } else {
      MOE_NO_UNROLL
      for (int d = L.first[e]; d < L.first[e + 1] && inside; ++d) inside = L.server[L.rank[d]] == i - n_list;
    }
    if (inside) need += W.N[e];
  }
  return (need + (hi - lo) - 1) / (hi - lo);
}

/// The largest set_bound over its sets (one thread). `scratch`: n_list words (the copies of each
/// listed expert as bits, made once when the ranks fit a word).
MOE_HOST_DEVICE inline long long set_bounds(Layout const& L, detail::Work const& W, long long const* list, int n_list,
                                            long long* scratch) {
  if (L.ranks <= 64) {
    MOE_NO_UNROLL
    for (int x = 0; x < n_list; ++x)
      scratch[x] = static_cast<long long>(detail::copy_bits(L, static_cast<int>(list[x])));
  }
  long long T = 0;
  MOE_NO_UNROLL
  for (int i = 0; i < n_list + L.servers; ++i)
    T = detail::lmax(T, set_bound(L, W, list, n_list, i, L.ranks <= 64 ? scratch : nullptr));
  return T;
}

/// The max load the tie-breaks may use: the least max load T, or with a balance slack
/// (Layout::slack_permille) the mean raised by the slack, rounded up, when that is higher.
MOE_HOST_DEVICE inline long long tie_break_cap(Layout const& L, long long T, long long total) {
  if (L.slack_permille <= 0 || L.ranks <= 0) return T;
  // ceil(total x f / den), without the product (total reaches 2^31 x ranks x experts, f 10^6):
  // total = q den + r, so it is q f + ceil(r f / den)
  long long den = 1000LL * L.ranks, f = 1000LL + L.slack_permille, q = total / den, r = total % den;
  return detail::lmax(T, q * f + (r * f + den - 1) / den);
}

/// Whether arc a may carry the breadth-first search of round `round` (its tail was reached in that
/// round and its copy has pairs to give). The first such arc in index order claims an unreached head.
MOE_HOST_DEVICE inline bool bfs_arc(Layout const& L, detail::Work const& W, int a, long long round) {
  int c = static_cast<int>(W.arc_c[a]);
  return W.dist[L.rank[c]] == round && W.y[c] > 0;
}

/// Whether arc a can carry one more path of a breadth-first search that first reached a rank below
/// T in round `last`: its head was first reached in that round, its tail in the round before, and
/// it is not the head's tree arc (pred). Whether the path can carry anything is take_path's matter.
MOE_HOST_DEVICE inline bool side_arc(Layout const& L, detail::Work const& W, int a, long long last) {
  int h = L.rank[W.arc_d[a]];
  return W.dist[h] == last && W.pred[h] != a && W.dist[L.rank[W.arc_c[a]]] == last - 1;
}

/// Whether rank h is one the least max load's step serves after a search that first reached a rank
/// below T in round `last`: first reached in that round and still below T.
MOE_HOST_DEVICE inline bool side_rank(detail::Work const& W, int h, long long T, long long last) {
  return W.dist[h] == last && W.load[h] < T;
}

namespace detail {
/// Moves what the search's path to `end` (a reached rank below T) can carry now from its origin to
/// `end`: at most T - load[end], the origin's excess over T and every copy's take along the path.
/// The path is the tree path (pred) to `end`, or with an arc `via` into `end`, the tree path to
/// its tail and then `via`.
MOE_HOST_DEVICE inline void take_path(Layout const& L, Work& W, long long T, int end, int via = -1) {
  long long amount = T - W.load[end];
  int const first = via >= 0 ? L.rank[W.arc_c[via]] : end;
  if (via >= 0) amount = lmin(amount, W.y[W.arc_c[via]]);
  int g = first;
  MOE_NO_UNROLL
  while (W.dist[g] > 0) {
    int a = static_cast<int>(W.pred[g]);
    amount = lmin(amount, W.y[W.arc_c[a]]);
    g = L.rank[W.arc_c[a]];
  }
  amount = lmin(amount, W.load[g] - T);
  if (amount <= 0) return;  // an earlier path of the same search took what this one could carry
  if (via >= 0) W.y[W.arc_c[via]] -= amount, W.y[W.arc_d[via]] += amount;
  g = first;
  MOE_NO_UNROLL
  while (W.dist[g] > 0) {
    int a = static_cast<int>(W.pred[g]);
    W.y[W.arc_c[a]] -= amount, W.y[W.arc_d[a]] += amount;
    g = L.rank[W.arc_c[a]];
  }
  W.load[end] += amount, W.load[g] -= amount;
}
}  // namespace detail

/// One step of the least max load after a breadth-first search (dist, pred) from the ranks above T.
/// With `end` (the lowest reached rank below T, first reached in round `last`): each rank below T
/// reached in that round, in rank order, takes what its tree path can carry now
/// (detail::take_path); then, in arc order, each side arc (side_arc: into such a rank from the
/// round before, not its tree arc) takes what the tree path to its tail and the arc carry now, so
/// that one search can bring a rank below T the excess of several origins. With `marked`, the
/// search's marks hold which ranks and arcs to walk (W.rank_bits: reached in round `last` and below
/// T; W.arc_bits: side_arc; a CUDA team sets them in parallel), else they are asked here.
/// The paths share arcs and origins, so a later one may carry less than the search saw, or
/// nothing; none passes through another's end (a search stops at the first round that reaches a
/// rank below T). The least max load reached is the same as with one path per search, in fewer
/// searches: 7 -> 3 at 64 tokens per rank on the benchmark's scenario
/// (benchmarks/planners/batch_split_scenario.hpp), 4 -> 2 at 256, 2 -> 1 at 4096. With end = -1
/// (none reached): the reached ranks hold every copy of every expert they serve, so T rises to
/// their mean (a Newton step). `n_arcs`: the arcs of the batch. Returns the new T.
MOE_HOST_DEVICE inline long long max_load_step(Layout const& L, detail::Work& W, long long T, int end, long long last,
                                               int n_arcs, bool marked = false) {
  using namespace detail;
  if (end < 0) {
    long long sum = 0, n = 0;
    MOE_NO_UNROLL
    for (int g = 0; g < L.ranks; ++g)
      if (W.dist[g] >= 0) sum += W.load[g], ++n;
    return lmax(T + 1, (sum + n - 1) / n);
  }
  // a rank's load only rises towards T here, and an origin's falls to T at most
  for_each_side(
      L, W, -1, marked ? W.rank_bits : nullptr, end, [&](int h) { return side_rank(W, h, T, last); },
      marked ? W.arc_bits : nullptr, n_arcs, [&](int a) { return side_arc(L, W, a, last); },
      [&](int h, int a) {
        if (W.load[h] < T) take_path(L, W, T, h, a);
        return true;
      });
  return T;
}

/// The tie-breaks' arc costs for the present split: arc a's cost (move_cost), or `inf` when its copy
/// has no pair to give. The split does not change while a shortest path is searched.
MOE_HOST_DEVICE inline long long arc_cost(Layout const& L, detail::Work const& W, int a, long long A) {
  int c = static_cast<int>(W.arc_c[a]), d = static_cast<int>(W.arc_d[a]);
  if (W.y[c] <= 0) return detail::inf;
  long long room = 0;
  return detail::move_cost(L, W, static_cast<int>(W.sexp[c]), c, d, A, &room);
}

/// Arc a's relaxation in a Bellman-Ford round: the distance its head may take through it from its
/// tail's distance of the last round, or `inf`.
MOE_HOST_DEVICE inline long long relaxed(Layout const& L, detail::Work const& W, int a) {
  long long dg = W.dist[L.rank[W.arc_c[a]]], k = W.cost[a];
  return dg == detail::inf || k == detail::inf ? detail::inf : dg + k;
}

/// Whether arc a is on a shortest path (tight) and its tail was reached in breadth-first round
/// `round` of the shortest-path tree over the tight arcs (a rank claimed by its lowest arc): the
/// device's other form of least_cost's labels, which finds the distances first and the tree after
/// (the same tree: a rank's round is its fewest arcs among its shortest paths).
MOE_HOST_DEVICE inline bool tree_arc(Layout const& L, detail::Work const& W, int a, long long round) {
  int g = L.rank[W.arc_c[a]];
  long long r = relaxed(L, W, a);
  return W.hop[g] == round && r != detail::inf && r == W.dist[L.rank[W.arc_d[a]]];
}

/// A path that moves an expert twice moves one pair at a time (augment: the costs of its two moves
/// interact); the next path is then the same one for as long as no rank crosses T and no arc's
/// cost changes. How many pairs more than one keep that so (arc_cost reads, of each copy, whether
/// it has pairs and how they compare with its local pairs, and how its server's share of its
/// expert compares with that server's pairs): augment moves them at once, as that many one-pair
/// paths would, so that the number of paths does not grow with the counts.
MOE_HOST_DEVICE inline long long repeat_more(Layout const& L, detail::Work const& W, long long T, int end, int origin,
                                             int len) {
  using namespace detail;
  long long more = lmin(T - W.load[end], W.load[origin] - T) - 1;  // end stays below T, origin above
  MOE_NO_UNROLL
  for (int i = 0; i < len && more > 0; ++i) {
    MOE_NO_UNROLL
    for (int side = 0; side < 2 && more > 0; ++side) {
      int x = static_cast<int>(side == 0 ? W.arc_c[W.path[i]] : W.arc_d[W.path[i]]);
      long long e = W.sexp[x];
      int s = L.server[L.rank[x]];
      long long dy = 0, dY = 0;  // per pair: the change of y[x], and of its expert's take on x's server
      MOE_NO_UNROLL
      for (int j = 0; j < len; ++j) {
        int c = static_cast<int>(W.arc_c[W.path[j]]), d = static_cast<int>(W.arc_d[W.path[j]]);
        dy += (d == x) - (c == x);
        if (W.sexp[c] == e) dY += (L.server[L.rank[d]] == s) - (L.server[L.rank[c]] == s);
      }
      long long y = W.y[x], loc = W.loc[x];
      if (dy < 0) {
        more = lmin(more, y - 1);                          // keeps a pair
        if (y == loc) more = 0;                            // would drop below its local pairs
        else if (y > loc) more = lmin(more, y - loc - 1);  // stays above them
      } else if (dy > 0) {
        if (y == 0 || y == loc) more = 0;                  // would get its first pair / pass its local ones
        else if (y < loc) more = lmin(more, loc - y - 1);  // stays below them
      }
      long long Y = server_take(L, W, static_cast<int>(e), x), N = W.srvN[x];
      if (dY < 0) {
        if (Y == N) more = 0;
        else if (Y > N) more = lmin(more, (Y - N - 1) / -dY);
      } else if (dY > 0) {
        if (Y == N) more = 0;
        else if (Y < N) more = lmin(more, (N - Y - 1) / dY);
      }
    }
  }
  return lmax(more, 0);
}

namespace detail {

/// Whether the path in W.path[0, len) moves an expert twice (two of its arcs leave copies of one
/// expert): the costs of those two moves interact (augment_path, still_shortest).
MOE_HOST_DEVICE inline bool path_repeats(Work const& W, int len) {
  MOE_NO_UNROLL
  for (int i = 1; i < len; ++i) {
    MOE_NO_UNROLL
    for (int j = 0; j < i; ++j)
      if (W.sexp[W.arc_c[W.path[j]]] == W.sexp[W.arc_c[W.path[i]]]) return true;
  }
  return false;
}

}  // namespace detail

/// Moves the excess of the path in W.path[0, len) (arcs from rank `end` back to rank `origin`)
/// along it: at most what `end` lacks and `origin` has over T, what each move can take before its
/// cost changes; when the path moves an expert twice (the costs of the two moves would interact),
/// the pairs that one-pair paths would move along it before anything changes (repeat_more).
/// Returns whether the path moves an expert twice.
MOE_HOST_DEVICE inline bool augment_path(Layout const& L, detail::Work& W, long long T, long long A, int end,
                                         int origin, int len) {
  using namespace detail;
  long long amount = lmin(T - W.load[end], W.load[origin] - T);
  MOE_NO_UNROLL
  for (int i = 0; i < len; ++i) {
    int c = static_cast<int>(W.arc_c[W.path[i]]), d = static_cast<int>(W.arc_d[W.path[i]]);
    long long room = 0;
    move_cost(L, W, static_cast<int>(W.sexp[c]), c, d, A, &room);
    amount = lmin(amount, room);
  }
  bool const repeat = path_repeats(W, len);
  if (repeat) amount = 1 + repeat_more(L, W, T, end, origin, len);
  MOE_NO_UNROLL
  for (int i = 0; i < len; ++i) W.y[W.arc_c[W.path[i]]] -= amount, W.y[W.arc_d[W.path[i]]] += amount;
  W.load[end] += amount, W.load[origin] -= amount;
  return repeat;
}

/// The search's tree path to rank `end` (pred, tree arcs back to an excess rank), for augment_path:
/// its arcs in W.path[0, *len) and its first rank in *origin. Returns false on an internal fault (a
/// path longer than the ranks).
MOE_HOST_DEVICE inline bool tree_path(Layout const& L, detail::Work& W, int end, int* origin, int* len) {
  int G = L.ranks, n = 0, g = end;
  MOE_NO_UNROLL
  while (W.pred[g] >= 0 && n <= G) {
    W.path[n++] = W.pred[g];
    g = L.rank[W.arc_c[W.pred[g]]];
  }
  *origin = g, *len = n;
  return n <= G;
}

namespace detail {

/// Walks from rank g along arc `first` into g when first >= 0, then back along the search's tree
/// (pred), appending the arcs to W.path from index *n and adding their present costs (arc_cost) to
/// *sum, until a rank without a tree arc, rank `stop`, or L.ranks arcs in all. Returns the rank it
/// stopped at, or -1 at an arc whose copy has nothing to give (its cost is inf).
MOE_HOST_DEVICE inline int walk_tree(Layout const& L, Work& W, long long A, int g, int first, int stop, int* n,
                                     long long* sum) {
  int a = first;
  MOE_NO_UNROLL
  for (;;) {
    if (a < 0) {
      if (W.pred[g] < 0 || g == stop || *n >= L.ranks) return g;
      a = static_cast<int>(W.pred[g]);
    }
    long long k = arc_cost(L, W, a, A);
    if (k == inf) return -1;
    *sum += k;
    W.path[(*n)++] = a;
    g = L.rank[W.arc_c[a]];
    a = -1;
  }
}

}  // namespace detail

/// Whether the search's tree path to rank h (pred), or with an arc `via` >= 0 into h the tree path
/// to via's tail and then via, is at the present split still a shortest path from a rank above T to
/// a rank below T, whose least distance the search found to be D: it passes h once, its origin is
/// still above T, it moves no expert twice, and its arcs' present costs add up to D. Leaves the
/// path in W.path[0, *len) and its first rank in *origin, for augment_path.
MOE_HOST_DEVICE inline bool still_shortest(Layout const& L, detail::Work& W, long long T, long long A, int h,
                                           int via, long long D, int* origin, int* len) {
  long long sum = 0;
  int n = 0, g = detail::walk_tree(L, W, A, h, via, via >= 0 ? h : -1, &n, &sum);
  if (g < 0) return false;
  *origin = g, *len = n;
  return n > 0 && g != h && W.pred[g] < 0 && W.load[g] > T && sum == D && !detail::path_repeats(W, n);
}

/// Whether rank h is one a tie-break search whose least distance to a rank below T is D serves
/// after its first path: below T at distance D.
MOE_HOST_DEVICE inline bool tie_side_rank(detail::Work const& W, int h, long long T, long long D) {
  return W.load[h] < T && W.dist[h] == D;
}

/// Whether arc a is a side arc of a tie-break search whose least distance to a rank below T is D:
/// into a rank below T at distance D, not that rank's tree arc, and tight at the search's costs
/// (W.cost: its tail's distance plus its cost is D). Whether its path is still a shortest one is
/// still_shortest's matter.
MOE_HOST_DEVICE inline bool tie_side_arc(Layout const& L, detail::Work const& W, long long T, long long D, int a) {
  int h = L.rank[W.arc_d[a]];
  long long from = W.dist[L.rank[W.arc_c[a]]], k = W.cost[a];
  return tie_side_rank(W, h, T, D) && W.pred[h] != a && from != detail::inf && k != detail::inf &&
         from + k == D;
}

/// One step of the tie-breaks after a shortest-path search (dist, pred: the labels of least_cost)
/// whose cheapest rank below T is `end`, at distance D: the path to `end`; then, in rank order, the
/// path to every other rank below T at distance D that is still a shortest path (still_shortest)
/// after the paths before it moved their pairs; then, in arc order, the path of each side arc
/// (tie_side_arc: a tight arc into such a rank other than its tree arc, after the tree path to its
/// tail) that is still a shortest path (still_shortest), so that one search can bring a rank
/// the excess of several origins. With `marked`, the search's marks hold which ranks and arcs to
/// walk (W.rank_bits: below T at distance D, `end` left out; W.arc_bits: tie_side_arc; a CUDA team
/// sets them in parallel); else they are asked here, which gives the same answer (the paths change
/// no distance, and a rank at or above T never falls below it). `n_arcs`: the arcs of the batch.
/// Why those are shortest paths of the present split: the search's distances stay a lower bound on
/// the cost of every path from a rank above T. The split's cost is separable and convex over a
/// graph of experts, (expert, server) pairs, copies and ranks, whose paths between ranks are the
/// rank graph's arcs; each move stops where an arc's cost would change (move_cost's room), so it
/// leaves no arc cheaper than its distances allow (the reverse of a move costs what the move saved,
/// and the move's own cost can only rise). A path from a rank above T whose present cost is D then
/// reaches a rank below T at the least cost any path can, and moving pairs along it is the step
/// successive shortest paths would take next. A path that moves an expert twice (its one-pair moves
/// interact) is taken only as the first, and then ends the step, which leaves the rest to the next
/// search. Returns false on an internal fault.
MOE_HOST_DEVICE inline bool tie_break_step(Layout const& L, detail::Work& W, long long T, long long A, int end,
                                           int n_arcs, bool marked = false) {
  long long const D = W.dist[end];
  bool fault = false;
  // the path to `end` (a = -2), then the side ranks (a = -1) and arcs: one walk, one augment_path
  detail::for_each_side(
      L, W, end, marked ? W.rank_bits : nullptr, end + 1, [&](int h) { return tie_side_rank(W, h, T, D); },
      marked ? W.arc_bits : nullptr, n_arcs, [&](int a) { return tie_side_arc(L, W, T, D, a); },
      [&](int h, int a) {
        int origin = 0, len = 0;
        bool const first = a == -2;
        if (first ? !tree_path(L, W, h, &origin, &len)
                  : !(W.load[h] < T && still_shortest(L, W, T, A, h, a, D, &origin, &len))) {
          fault = first;
          return !first;
        }
        // the first path may move an expert twice (a path still_shortest accepts never does):
        // then it ends the step
        return !augment_path(L, W, T, A, h, origin, len) || !first;
      });
  return !fault;
}

/// How least_cost ended: `done`, every rank at or below T; `stuck`, a search from the ranks above T
/// reached no rank below it (T is below the least max load: no split reaches it); `fault`, an
/// internal fault (a negative cycle, or a path the search did not leave).
enum class CostEnd : int { done = 0, stuck = 1, fault = 2 };

/// 2d (one thread), from the start: the least-cost split at T (the tie-breaks) by successive
/// shortest paths; see the file comment. Each search: every rank's label, the least (distance,
/// arcs, last arc) over the paths to it from the excess ranks (Bellman-Ford on those triples,
/// compared in that order: dist, hop, pred), then the path to the cheapest rank below T (the lowest
/// such rank on a tie) and to the others at that distance that are still shortest (tie_break_step).
/// The least labels do not depend on the order of the relaxations, so one thread relaxes in place
/// (fewer rounds) and a CUDA block from the last round's labels. From a T at or above the least max
/// load it ends `done` (a search always finds a way out then); below it, `stuck`.
MOE_HOST_DEVICE inline CostEnd least_cost(Layout const& L, detail::Work& W, long long T, long long A) {
  using namespace detail;
  W.n_arcs = static_cast<int>(W.hdr[kArcs]);
  int G = L.ranks;
  for (;;) {
    bool any = false;
    for (int g = 0; g < G; ++g) {
      bool excess = W.load[g] > T;
      W.dist[g] = excess ? 0 : inf;
      W.hop[g] = excess ? 0 : -1;
      W.pred[g] = -1;
      any |= excess;
    }
    if (!any) return CostEnd::done;
    for (int a = 0; a < W.n_arcs; ++a) W.cost[a] = arc_cost(L, W, a, A);
    bool changed = true;
    for (int round = 0; changed && round <= G; ++round) {
      changed = false;
      for (int a = 0; a < W.n_arcs; ++a) {
        long long r = relaxed(L, W, a);
        if (r == inf) continue;
        int h = L.rank[W.arc_d[a]];
        long long k = W.hop[L.rank[W.arc_c[a]]] + 1;
        if (r < W.dist[h] || (r == W.dist[h] && (k < W.hop[h] || (k == W.hop[h] && a < W.pred[h]))))
          W.dist[h] = r, W.hop[h] = k, W.pred[h] = a, changed = true;
      }
    }
    if (changed) return CostEnd::fault;
    int end = -1;
    for (int h = 0; h < G; ++h)
      if (W.load[h] < T && W.dist[h] != inf && (end < 0 || W.dist[h] < W.dist[end])) end = h;
    if (end < 0) return CostEnd::stuck;
    if (W.hop[end] <= 0 || !tie_break_step(L, W, T, A, end, W.n_arcs)) return CostEnd::fault;
  }
}

/// 2e (one thread): the loads out, the max load, the header's sums into the outcome, and the list
/// of the experts with copies for the matching stages (its length in the header).
MOE_HOST_DEVICE inline void decide_end(Layout const& L, long long* load, detail::Work& W, Outcome* out) {
  using namespace detail;
  out->max_load = 0;
  for (int g = 0; g < L.ranks; ++g) load[g] = W.load[g], out->max_load = lmax(out->max_load, W.load[g]);
  out->local = W.hdr[kLocal];
  out->same_server = W.hdr[kSame];
  long long n_mc = 0;
  for (int e = 0; e < L.experts; ++e)
    if (L.first[e + 1] - L.first[e] > 1) W.mc[n_mc++] = e;
  W.hdr[kMc] = n_mc;
}

/// Stage 2, its first part (one thread), after count_servers(): the expert totals, the lists and the
/// start, which it leaves in W.y / W.load and in W.y0 / W.load_s (for the stages after it). Returns
/// the lower bound of the max load (lower_bound and set_bounds).
MOE_HOST_DEVICE inline long long least_max_begin(Layout const& L, std::int32_t const* counts, detail::Work& W) {
  using namespace detail;
  int G = L.ranks, E = L.experts;
  decide_begin(L, W);
  W.n_multi = 0;
  PlainAdd add{W.hdr};
  for (int e = 0; e < E; ++e)
    if (expert_totals(L, counts, W, e, add)) W.multi[W.n_multi++] = e;
  long long T = detail::lmax(lower_bound(L, W), set_bounds(L, W, W.multi, W.n_multi, W.y));  // y: free until the start
  W.n_arcs = 0;
  for (int i = 0; i < W.n_multi; ++i) {
    int e = static_cast<int>(W.multi[i]);
    expert_arcs(L, counts, W, e, W.n_arcs);
    W.n_arcs += expert_arc_count(L, e);
  }
  W.hdr[kArcs] = W.n_arcs;
  for (int e = 0; e < E; ++e)
    for (int c = L.first[e]; c < L.first[e + 1]; ++c) W.sexp[c] = e;
  start(L, W);
  for (int c = 0; c < L.slots; ++c) W.y0[c] = W.y[c];  // the start, for the stages after this one
  for (int g = 0; g < G; ++g) W.load_s[g] = W.load[g];
  return T;
}

/// W.y / W.load := the start (W.y0 / W.load_s), the entries part, part + parts, ... (a CUDA team
/// shares it; one thread: 0, 1).
MOE_HOST_DEVICE inline void restore_start(Layout const& L, detail::Work& W, int part = 0, int parts = 1) {
  MOE_NO_UNROLL
  for (int c = part; c < L.slots; c += parts) W.y[c] = W.y0[c];
  MOE_NO_UNROLL
  for (int g = part; g < L.ranks; g += parts) W.load[g] = W.load_s[g];
}

/// The least max load from a lower bound T and a split with max load at least T (W.y / W.load; the
/// start): breadth-first augmentation with Newton steps on T (part 1 of the file comment). Returns
/// it; leaves a split at it in W.y / W.load.
MOE_HOST_DEVICE inline long long least_max_search(Layout const& L, detail::Work& W, long long T) {
  using namespace detail;
  int G = L.ranks;
  for (;;) {
    bool any = false;
    for (int g = 0; g < G; ++g) {
      W.dist[g] = W.load[g] > T ? 0 : -1;
      W.pred[g] = -1;
      any |= W.load[g] > T;
    }
    if (!any) break;
    // breadth-first over arcs with pairs to move (rounds over the arc list: the graph is small)
    int end = -1;
    long long last = 0;
    for (long long round = 0; end < 0; ++round) {
      bool grew = false;
      for (int a = 0; a < W.n_arcs; ++a) {
        int h = L.rank[W.arc_d[a]];
        if (W.dist[h] >= 0 || !bfs_arc(L, W, a, round)) continue;
        W.dist[h] = round + 1, W.pred[h] = a, grew = true;
      }
      for (int h = 0; h < G && end < 0; ++h)
        if (W.dist[h] == round + 1 && W.load[h] < T) end = h, last = round + 1;
      if (!grew) break;
    }
    T = max_load_step(L, W, T, end, last, W.n_arcs);
  }
  return T;
}

/// The least max load T over every split (part 1 of the file comment), after count_servers(): the
/// start, then the search from the lower bound. Leaves the start in W.y0 / W.load_s.
MOE_HOST_DEVICE inline long long least_max(Layout const& L, std::int32_t const* counts, detail::Work& W) {
  return least_max_search(L, W, least_max_begin(L, counts, W));
}

/// Stage 2 of solve(), one thread: the loads and the amount each copy receives, after
/// count_servers() (or the block's form of it) and `sign` the OR of the counts it returned. The
/// outcome's local and same_server count the single-copy experts only; match() adds the others.
MOE_HOST_DEVICE inline Outcome decide(Layout const& L, std::int32_t const* counts, long long* load, long long* work,
                                      std::int32_t sign) {
  using namespace detail;
  Outcome out;
  Work W(L, work);
  if (sign < 0) {
    out.bad = 1;
    return out;
  }
  long long const T0 = least_max_begin(L, counts, W);  // the lower bound; W.y / W.load: the start
  long long total = W.hdr[kTotal];
  long long A = total + 1;  // one local pair outweighs every same-server pair

  // --- 1-3. the least-cost split at the least max load T (or the slack's cap): successive shortest
  // paths from the start. The lower bound is often T itself (in 99 of the benchmark series' 130
  // batches), so the tie-breaks try it first. If they end, it was feasible, so T is the bound and
  // the split is the one the tie-breaks would make at T. If they get stuck, the bound is below T:
  // the least max load is searched from the start, and the tie-breaks run again from the start.
  CostEnd end = least_cost(L, W, tie_break_cap(L, T0, total), A);
  if (end == CostEnd::stuck) {
    restore_start(L, W);
    long long const T = least_max_search(L, W, T0);
    restore_start(L, W);
    end = least_cost(L, W, tie_break_cap(L, T, total), A);
  }
  if (end != CostEnd::done) {
    out.bad = 2;
    return out;
  }
  decide_end(L, load, W, &out);
  return out;
}
/// Stage 3 (the (expert with copies, row) pairs p = part, part + parts, ...): the sources' pairs of
/// the experts with copies, expert-major, and their take entries cleared (one copy: all its pairs go
/// there, take is not written). After decide().
MOE_HOST_DEVICE inline void gather_sources(Layout const& L, std::int32_t const* counts, std::int32_t* take,
                                           long long* work, int part, int parts) {
  detail::Work W(L, work);
  int G = L.ranks, E = L.experts;
  long long n_mc = W.hdr[detail::kMc];
  for (long long p = part; p < n_mc * G; p += parts) {
    long long i = p / G;
    int r = static_cast<int>(p - i * G);
    int e = static_cast<int>(W.mc[i]);
    W.supply[p] = counts[static_cast<long long>(r) * E + e];
    std::int32_t* trow = take + static_cast<long long>(r) * L.slots;
    MOE_NO_UNROLL
    for (int c = L.first[e]; c < L.first[e + 1]; ++c) trow[c] = 0;
  }
}

/// Stage 4 (the experts with copies i = part, part + parts, ...): the split per (source rank, slot)
/// of each: own rank first, then own server, then the rest, each in rank order. Adds the pairs kept
/// on their rank and server to `local` and `same_server`. After gather_sources() for every row.
/// Each (rank, slot) entry gets at most one non-zero amount (after an entry's amount, its rank has
/// no pair left or its copy needs none), so the entries are stored, never added to: a GPU thread
/// does not wait for them.
MOE_HOST_DEVICE inline void match(Layout const& L, std::int32_t* take, long long* work, int part, int parts,
                                  long long* local, long long* same_server) {
  using namespace detail;
  Work W(L, work);
  int G = L.ranks;
  long long n_mc = W.hdr[kMc], loc = 0, same = 0;
  for (long long i = part; i < n_mc; i += parts) {
    int e = static_cast<int>(W.mc[i]);
    int lo = L.first[e], hi = L.first[e + 1];
    if (W.N[e] == 0) continue;
    long long* rem = W.supply + i * G;
    MOE_NO_UNROLL
    for (int c = lo; c < hi; ++c) {
      int r = L.rank[c];
      long long m = lmin(rem[r], W.y[c]);
      take[static_cast<long long>(r) * L.slots + c] = static_cast<std::int32_t>(m);
      rem[r] -= m, W.need[c] = W.y[c] - m;
      loc += m, same += m;
    }
    MOE_NO_UNROLL
    for (int c = lo; c < hi; ++c) {  // the ranks of c's server, in order, skipping the used up
      int v = L.server[L.rank[c]];
      MOE_NO_UNROLL
      for (long long at = W.sfirst[v]; W.need[c] > 0 && at < W.sfirst[v + 1]; ++at) {
        int r = static_cast<int>(W.srank[at]);
        long long m = lmin(rem[r], W.need[c]);
        if (m == 0) continue;
        take[static_cast<long long>(r) * L.slots + c] = static_cast<std::int32_t>(m);
        rem[r] -= m, W.need[c] -= m, same += m;
      }
    }
    MOE_NO_UNROLL
    for (int c = lo, r = 0; c < hi; ++c)
      MOE_NO_UNROLL
      while (W.need[c] > 0 && r < G) {
        long long m = lmin(rem[r], W.need[c]);
        if (m == 0) {
          ++r;
          continue;
        }
        take[static_cast<long long>(r) * L.slots + c] = static_cast<std::int32_t>(m);
        rem[r] -= m, W.need[c] -= m;
      }
  }
  *local += loc, *same_server += same;
}

/// Computes the split of one batch. `counts`: ranks x experts, rank-major, pairs of each (source
/// rank, expert). `take`: ranks x slots, pairs of each (source rank, slot), written for the slots of
/// experts with two copies or more (an expert with one copy sends every pair to it; its entries are
/// left as they are, and dealt() does not read them). `load`: ranks, written: pairs each rank
/// receives. `work`: workspace_words(L) words. Returns the outcome; on a negative count it writes
/// nothing and returns bad = 1 (the host wrapper names the entry).
MOE_HOST_DEVICE inline Outcome solve(Layout const& L, std::int32_t const* counts, std::int32_t* take, long long* load,
                                     long long* work) {
  Outcome out = decide(L, counts, load, work, count_servers(L, counts, work));
  if (out.bad) return out;
  gather_sources(L, counts, take, work, 0, 1);
  match(L, take, work, 0, 1, &out.local, &out.same_server);
  return out;
}

/// The copy of a (source rank, expert) pair: source rank r's m-th pair of expert e, in token order,
/// given the split `take` (ranks x slots). Pairs past the split's count go to the last copy.
MOE_HOST_DEVICE inline int dealt(Layout const& L, std::int32_t const* take, int e, int r, long long m) {
  int lo = L.first[e], hi = L.first[e + 1];
  if (hi - lo == 1) return L.rank[lo];
  std::int32_t const* row = take + static_cast<long long>(r) * L.slots;
  long long cum = 0;
  for (int c = lo; c < hi; ++c) {
    cum += row[c];
    if (m < cum) return L.rank[c];
  }
  return L.rank[hi - 1];
}

}  // namespace split

/// Replica policy that balances each batch: from every rank's per-expert pair counts (the all-gather
/// the layer makes: ranks x experts int32), the split of split::solve, the same on every rank; each
/// rank then deals its own pairs of an expert in token order (dealt). A BatchPolicy, like Reactive.
class BatchSplit {
public:
  BatchSplit() = default;
  /// `copies`: the ranks holding each expert (as replication::Table); `topo`: one rank per GPU.
  /// `slack_permille`: see split::Layout (0: the least max load).
  BatchSplit(std::vector<std::vector<int>> copies, topology::Topology const& topo, int slack_permille = 0)
      : table_(copies) {
    check(topo.finalized(), "batch split: the topology is not finalized");
    int G = topo.gpus();
    for (int g = 0; g < G; ++g) server_.push_back(topo.server_of(g));
    init(copies, G, topo.servers(), slack_permille);
  }
  /// The same from the server of each rank (ranks = server_of_rank.size()).
  BatchSplit(std::vector<std::vector<int>> copies, std::vector<int> server_of_rank, int slack_permille = 0)
      : table_(copies) {
    server_ = std::move(server_of_rank);
    int S = 0;
    for (std::size_t g = 0; g < server_.size(); ++g) {
      check(server_[g] >= 0, "batch split: rank ", g, " is on server ", server_[g]);
      S = std::max(S, server_[g] + 1);
    }
    init(copies, static_cast<int>(server_.size()), S, slack_permille);
  }

  // layout_ points into this object's own vectors: a copy or a move points it at its own.
  BatchSplit(BatchSplit const& o) : BatchSplit(o, 0) {}
  BatchSplit(BatchSplit&& o) noexcept : BatchSplit(std::move(o), 0) {}
  BatchSplit& operator=(BatchSplit const& o) {
    if (this != &o) *this = BatchSplit(o);
    return *this;
  }
  BatchSplit& operator=(BatchSplit&& o) noexcept {
    table_ = std::move(o.table_);
    server_ = std::move(o.server_);
    lists_ = std::move(o.lists_);
    layout_ = o.layout_;
    work_ = std::move(o.work_);
    take_ = std::move(o.take_);
    load_ = std::move(o.load_);
    last_ = o.last_;
    relink();
    return *this;
  }
  ~BatchSplit() = default;

  // Policy: choose() is replication::Table's fixed rule (for callers that see one token at a time).
  [[nodiscard]] int choose(int expert, int primary, int source_rank, long long token) const {
    return table_.choose(expert, primary, source_rank, token);
  }
  [[nodiscard]] bool holds(int expert, int primary, int rank) const { return table_.holds(expert, primary, rank); }
  void validate(int experts, int ranks, std::span<int const> placement) const {
    check(ranks == layout_.ranks, "batch split: built for ", layout_.ranks, " ranks, the layer has ", ranks);
    table_.validate(experts, ranks, placement);
  }
  [[nodiscard]] Table const& table() const { return table_; }
  [[nodiscard]] split::Layout const& layout() const { return layout_; }
  /// The server of each rank and the copy lists, as split::Layout points to them.
  [[nodiscard]] std::vector<int> const& servers() const { return server_; }
  [[nodiscard]] CopyLists const& copy_lists() const { return lists_; }

  /// The same copies and servers with `sources` more ranks, numbered after this split's ranks, that
  /// send pairs and hold no copy, each on a server of its own: the split a disaggregated layer
  /// solves, whose attention ranks send every pair to the expert ranks (an attention rank p's
  /// counts go in row ranks + p, and its pairs are dealt with deal(ranks + p, ...)).
  [[nodiscard]] BatchSplit with_sources(int sources) const {
    check(sources >= 1, "batch split: with_sources needs at least one source rank, got ", sources);
    std::vector<int> server = server_;
    int servers = 0;
    for (int v : server_) servers = std::max(servers, v + 1);
    for (int p = 0; p < sources; ++p) server.push_back(servers + p);
    return BatchSplit(table_.replicas(), std::move(server), layout_.slack_permille);
  }

  /// Splits the batch whose pairs per (rank, expert) are `counts` (ranks x experts, rank-major).
  /// Throws moe::Error on a count array of the wrong size or a negative count, or on a split built
  /// from nothing (default-constructed).
  split::Outcome plan_batch(std::span<std::int32_t const> counts) {
    check_counts(counts);
    auto out = split::solve(layout_, counts.data(), take_.data(), load_.data(), work_.data());
    if (out.bad == 1) refuse_negative(counts);
    check(out.bad == 0, "batch split: internal fault (no way to move a rank's excess); please report it");
    last_ = out;
    return out;
  }

  /// The least max load of the batch `counts` (ranks x experts) alone: what plan_batch() reports
  /// as max_load, without the tie-breaks and the matching (it does not depend on the source ranks,
  /// only on each expert's total): a cheap measure of what a copy layout allows. Leaves the last
  /// split as it was. Throws moe::Error as plan_batch() does.
  long long least_max_load(std::span<std::int32_t const> counts) {
    check_counts(counts);
    if (split::count_servers(layout_, counts.data(), work_.data()) < 0) refuse_negative(counts);
    split::detail::Work W(layout_, work_.data());
    return split::least_max(layout_, counts.data(), W);
  }

  /// The rank serving `rank`'s m-th pair of `expert` in token order (after plan_batch).
  [[nodiscard]] int dealt(int expert, int rank, int m) const {
    return split::dealt(layout_, take_.data(), expert, rank, m);
  }
  /// Deals one rank's pairs: `experts` (tokens x k, token-major) -> the serving rank of each pair.
  void deal(int rank, std::span<int const> experts, std::span<int> out) const {
    check(out.size() == experts.size(), "batch split: deal into ", out.size(), " entries, ", experts.size(),
          " pairs");
    check(rank >= 0 && rank < layout_.ranks, "batch split: deal for rank ", rank, ", outside [0, ", layout_.ranks, ")");
    // per expert: the slot being filled and the pairs it still takes (a cursor, so O(1) a pair)
    auto E = static_cast<std::size_t>(layout_.experts);
    slot_.assign(lists_.first.begin(), lists_.first.end() - 1);
    left_.resize(E);
    auto const* row = take_.data() + static_cast<std::size_t>(rank) * static_cast<std::size_t>(layout_.slots);
    for (std::size_t e = 0; e < E; ++e)
      left_[e] = lists_.first[e + 1] - lists_.first[e] == 1 ? -1 : row[slot_[e]];
    for (std::size_t i = 0; i < experts.size(); ++i) {
      int e = experts[i];
      check(e >= 0 && e < layout_.experts, "batch split: pair ", i, " names expert ", e);
      auto ue = static_cast<std::size_t>(e);
      if (left_[ue] < 0) {  // one copy
        out[i] = lists_.ranks[static_cast<std::size_t>(slot_[ue])];
        continue;
      }
      while (left_[ue] == 0 && slot_[ue] + 1 < lists_.first[ue + 1]) left_[ue] = row[++slot_[ue]];
      if (left_[ue] > 0) --left_[ue];
      out[i] = lists_.ranks[static_cast<std::size_t>(slot_[ue])];
    }
  }

  /// The last split: pairs per (source rank, slot), ranks x slots (slots in copy-list order); the
  /// slots of single-copy experts are not written (all of a rank's pairs of such an expert go there).
  [[nodiscard]] std::vector<std::int32_t> const& take() const { return take_; }
  /// The last split's pairs received per rank.
  [[nodiscard]] std::vector<long long> const& load() const { return load_; }
  [[nodiscard]] split::Outcome const& outcome() const { return last_; }

private:
  template <class O>
  BatchSplit(O&& o, int)
      : table_(std::forward<O>(o).table_), server_(std::forward<O>(o).server_), lists_(std::forward<O>(o).lists_),
        layout_(o.layout_), work_(std::forward<O>(o).work_), take_(std::forward<O>(o).take_),
        load_(std::forward<O>(o).load_), last_(o.last_) {
    relink();
  }
  /// A default-constructed (or moved-from) split has no ranks and no workspace to solve in.
  void check_built() const {
    check(layout_.ranks > 0 && !work_.empty(), "batch split: this BatchSplit has no copies and ranks (default-constructed "
          "or moved from); build it from a copy table");
  }
  /// What plan_batch() and least_max_load() refuse before they solve: a split built from nothing,
  /// and counts that are not ranks x experts.
  void check_counts(std::span<std::int32_t const> counts) const {
    check_built();
    auto G = static_cast<std::size_t>(layout_.ranks), E = static_cast<std::size_t>(layout_.experts);
    check(counts.size() == G * E, "batch split: ", counts.size(), " counts, expected ", G, " ranks x ", E, " experts");
  }
  /// Names the first negative count (the solvers only report that there is one).
  void refuse_negative(std::span<std::int32_t const> counts) const {
    auto E = static_cast<std::size_t>(layout_.experts);
    for (std::size_t i = 0; i < counts.size(); ++i)
      check(counts[i] >= 0, "batch split: rank ", i / E, " reports ", counts[i], " pairs of expert ", i % E);
  }
  void relink() {
    layout_.first = lists_.first.data();
    layout_.rank = lists_.ranks.data();
    layout_.server = server_.data();
  }

  void init(std::vector<std::vector<int>> const& copies, int G, int S, int slack_permille) {
    check(G > 0, "batch split: no ranks");
    check(slack_permille >= 0 && slack_permille <= 1000000, "batch split: the balance slack must be in [0, 1000000] "
          "thousandths, got ", slack_permille);
    layout_.slack_permille = slack_permille;
    for (std::size_t e = 0; e < copies.size(); ++e) {
      check(!copies[e].empty(), "batch split: expert ", e, " has no copy");
      for (std::size_t i = 0; i < copies[e].size(); ++i) {
        int g = copies[e][i];
        check(g >= 0 && g < G, "batch split: expert ", e, " has a copy on rank ", g, ", outside [0, ", G, ")");
        for (std::size_t j = 0; j < i; ++j)
          check(copies[e][j] != g, "batch split: expert ", e, " lists rank ", g, " twice");
        lists_.ranks.push_back(g);
      }
      lists_.first.push_back(static_cast<int>(lists_.ranks.size()));
    }
    layout_.ranks = G;
    layout_.experts = static_cast<int>(copies.size());
    layout_.slots = static_cast<int>(lists_.ranks.size());
    layout_.servers = S;
    layout_.first = lists_.first.data();
    layout_.rank = lists_.ranks.data();
    layout_.server = server_.data();
    layout_.arcs = split::arc_count(layout_.experts, layout_.first);
    work_.assign(static_cast<std::size_t>(split::workspace_words(layout_)), 0);
    take_.assign(static_cast<std::size_t>(G) * static_cast<std::size_t>(layout_.slots), 0);
    load_.assign(static_cast<std::size_t>(G), 0);
  }

  Table table_;
  std::vector<int> server_;
  CopyLists lists_;
  split::Layout layout_;
  std::vector<long long> work_;
  std::vector<std::int32_t> take_;
  std::vector<long long> load_;
  split::Outcome last_;
  mutable std::vector<int> slot_;
  mutable std::vector<std::int64_t> left_;
};

static_assert(BatchPolicy<BatchSplit>);

}  // namespace moe::replication
