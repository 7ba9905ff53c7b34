#pragma once
// The per-batch replica split on the device: the split of replication::BatchSplit
// (moe/replication/batch_split.hpp) computed by one thread block from device-resident counts, so
// that a layer pass can go from the count exchange to the dispatch with no host round trip. The
// block runs the host's pieces of split::solve (the pieces of decide, gather_sources; the counts,
// the start and the matching in block and warp forms of their own) and spreads them over its
// threads wherever the result does not depend on the order of the work, so the result equals the
// host's bit for bit:
//   - the counts per server, the experts' totals and fixed loads (integer sums, atomic where shared);
//   - the lists of experts with copies and their arcs, in expert order (block prefix sums);
//   - the start of the flow, wave by wave (experts of a wave share no rank; an expert starts after
//     every earlier expert on one of its ranks, as in the host's expert order; DeviceSplit makes
//     the waves from the copy lists once), each expert on a warp, a lane per copy;
//   - the breadth-first rounds of the least max load (a rank is claimed by its lowest arc, as the
//     host's arc loop claims it);
//   - the tie-breaks (successive shortest paths on the rank graph): each search's Bellman-Ford
//     rounds over the threads on whole labels (distance, arcs, last arc) packed in a 64-bit word, so
//     that one atomicMin per arc finds the distances and the shortest-path tree together (a batch
//     too large for the word takes the distances' rounds, then the tree's), its end ranks and side
//     arcs marked over the threads (a ballot per 32, so that thread 0 reads a bit each and visits
//     only the marked ones), its paths (to every rank below T at the least distance, by its tree
//     path and its side arcs, while still shortest: split::tie_break_step) on thread 0; then the
//     matching, each expert on a warp (a lane per copy, then 32 ranks at a time).
// One expert per warp, not per thread: the lanes of a warp that take paths of different lengths
// run one after the other, so 25 experts on the first 25 threads cost the sum of their paths.
// The rounds of the last two are rank-sized (tens of ranks and arcs at EP32) and many: by default
// (DeviceSplit::Rounds) they run on the block's first warp, whose barriers and reductions are a
// warp's, while the other warps gather the matching's sources; a large layout runs them on the
// whole block. The ranks of each server are the layout's and are uploaded once.
// The workspace and the copy lists sit in shared memory when they fit (past 48 KiB the constructor
// opts the kernel in, up to what the device allows), else the workspace is the caller's.
//
//   DeviceSplit split(policy.layout());        // once: uploads the copy lists and the servers
//   split.run(d_counts, d_take, d_load, d_outcome, d_work, stream);   // per layer and batch
//   split.view(d_take).dealt(e, r, m)          // __device__: rank r's m-th pair of expert e
//
// Memory is the caller's (CUB style): take (ranks x slots int32), load (ranks int64), one
// split::Outcome, and workspace_bytes() of workspace (none when it fits in the block's shared
// memory: shared_bytes() > 0). run() launches one kernel on `stream` and never synchronises, so a
// pass that calls it can be captured in a CUDA graph. A negative count leaves take and load as they
// were and sets outcome.bad = 1 on the device; an internal fault (outcome.bad = 2, a bug) leaves
// load as it was but may have cleared the take entries of experts with copies.
//
// deal(): one rank's pairs (tokens x k expert ids, token order) -> the rank serving each, as the
// host's BatchSplit::deal; one block, one thread per expert (a reference for the layer, which may
// instead use the pair's rank among its expert's pairs from its own permutation with dealt()).

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "moe/config.hpp"
#include "moe/kernels/cuda_common.cuh"
#include "moe/kernels/dispatch.cuh"
#include "moe/replication/batch_split.hpp"

namespace moe::kernels::cuda {

/// What the dispatch needs from a split: the copies and the per-(source rank, slot) counts.
struct SplitView {
  replication::split::Layout layout;  ///< device pointers
  std::int32_t const* take = nullptr;

  /// The rank serving source rank r's m-th pair of expert e in token order.
  __device__ int dealt(int e, int r, long long m) const { return replication::split::dealt(layout, take, e, r, m); }
};

namespace detail {

/// The sums of the expert stage, shared by the block's threads (split::expert_totals' `add`): the
/// header's three sums (split::detail::kTotal, kLocal, kSame) in registers, added to the header
/// once per warp by flush(); the rank loads by 64-bit atomic additions (two's complement, so the
/// unsigned form adds signed values exactly). One atomic site for the loads and one for the header
/// (on a workspace that may be shared or global memory, each is a test of the address space, a
/// compare-and-swap loop for shared memory and a global atomic).
struct BlockAdd {
  static_assert(replication::split::detail::kTotal == 1 && replication::split::detail::kLocal == 2 &&
                replication::split::detail::kSame == 3);
  long long* hdr;
  long long s1 = 0, s2 = 0, s3 = 0;  // header words 1, 2, 3
  template <int K>
  __device__ void sum(long long v) {
    static_assert(K >= 1 && K <= 3);
    (K == 1 ? s1 : K == 2 ? s2 : s3) += v;
  }
  __device__ void load(long long* p, long long v) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  }
  /// Every thread of the block calls it.
  __device__ void flush() {
#pragma unroll 1
    for (int k = 1; k <= 3; ++k) {
      long long v = k == 1 ? s1 : k == 2 ? s2 : s3;
      for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, static_cast<unsigned>(o));
      if ((threadIdx.x & 31) == 0 && v != 0)
        atomicAdd(reinterpret_cast<unsigned long long*>(hdr + k), static_cast<unsigned long long>(v));
    }
  }
};

/// Exclusive prefix sum of v over the block's threads in thread order; the block's total in *total.
/// Every thread calls it (it synchronises). `warp_sums`: Threads / 32 + 1 shared words. The split
/// scans two counts at once, packed in the halves of a long long (the low one's sum fits 32 bits).
template <int Threads>
__device__ long long block_exclusive_scan(long long v, long long* warp_sums, long long* total) {
  static_assert(Threads % 32 == 0);
  int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  long long x = v;
  for (int o = 1; o < 32; o <<= 1) {
    long long y = __shfl_up_sync(0xffffffffu, x, static_cast<unsigned>(o));
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (tid == 0) {
    long long run = 0;
#pragma unroll 1
    for (int w = 0; w < Threads / 32; ++w) {
      long long t = warp_sums[w];
      warp_sums[w] = run;
      run += t;
    }
    warp_sums[Threads / 32] = run;
  }
  __syncthreads();
  long long out = warp_sums[warp] + x - v;
  *total = warp_sums[Threads / 32];
  __syncthreads();  // warp_sums may be reused at once
  return out;
}

/// The teams that run the rank-sized rounds of the split (the least max load and the tie-breaks):
/// the whole block, or its first warp while the other warps gather the sources. Both give the same
/// results (the rounds are written once over a team); they differ in what a round's barrier and
/// its reductions cost. Every member calls every member function (the team's control is uniform).
///   sync()    a barrier of the team (shared memory written before it is seen after it)
///   min(v)    a barrier and the least v over the members (an int: one warp reduction, REDUX)
///   from0(v)  a barrier and member 0's v
struct WarpTeam {
  static constexpr int size = 32;
  int rank;
  __device__ WarpTeam(int lane, long long*) : rank(lane) {}
  __device__ void sync() const { __syncwarp(); }
  __device__ long long min(long long v) const {
    __syncwarp();
    for (int o = 16; o > 0; o >>= 1) {
      long long w = __shfl_xor_sync(0xffffffffu, v, o);
      v = w < v ? w : v;
    }
    return v;
  }
  __device__ int min(int v) const {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // REDUX (sm_80 on; the emulator has it too)
    __syncwarp();
    return __reduce_min_sync(0xffffffffu, v);
#else
    return static_cast<int>(min(static_cast<long long>(v)));
#endif
  }
  __device__ long long from0(long long v) const {
    __syncwarp();
    return __shfl_sync(0xffffffffu, v, 0);
  }
};

/// The block as a team: a reduction is a warp's shuffles, one shared atomic per warp and one
/// barrier. Its three shared slots rotate: the slot of call i is reset during call i - 1 (before
/// that call's barrier), after every member read it in call i - 3 (before the barrier of call i - 2).
template <int Threads>
struct BlockTeam {
  static constexpr int size = Threads;
  static constexpr long long identity = 0x7fffffffffffffffLL;
  int rank;
  long long* slot;  ///< 3 shared words; slot[0] = identity before the first call
  int k = 0;
  __device__ BlockTeam(int tid, long long* s) : rank(tid), slot(s) {}
  __device__ void sync() const { __syncthreads(); }
  __device__ long long min(long long v) {
    for (int o = 16; o > 0; o >>= 1) {
      long long w = __shfl_xor_sync(0xffffffffu, v, o);
      v = w < v ? w : v;
    }
    long long* here = slot + k;
    k = k == 2 ? 0 : k + 1;
    if ((rank & 31) == 0 && v != identity) atomicMin(here, v);
    if (rank == 0) slot[k] = identity;
    __syncthreads();
    return *here;
  }
  __device__ int min(int v) { return static_cast<int>(min(static_cast<long long>(v))); }
  __device__ long long from0(long long v) {
    long long* here = slot + k;
    k = k == 2 ? 0 : k + 1;
    if (rank == 0) *here = v, slot[k] = identity;
    __syncthreads();
    return *here;
  }
};

/// Stage 1 (split::count_servers) on the block, a (server, expert) pair per thread at a time: the
/// sum of the expert's column over the server's ranks (W.sfirst: the server's positions in the ranks
/// in server order), 8 rows' loads in flight, one store per pair, where the host's form adds every
/// row into shared memory. Integer sums, so equal to the host's. Returns the OR of the counts read
/// (negative when one of them is). `rows`: the layout's offset of each position's rank row in the
/// counts (G ints: rank x experts; DeviceSplit makes them).
/// The loop body is a few hundred bytes of code, which each thread runs for its pairs of every
/// server: the code a thread runs once is what this kernel's time follows
/// (docs/results/batch-balance.md, "The kernel's code"). A pass of a thread over all rows of its
/// expert, 32 rows unrolled with a loop over the servers for each, was 57 KB of code.
__device__ __forceinline__ std::int32_t count_servers_block(replication::split::Layout const& L,
                                                            std::int32_t const* __restrict__ counts, int const* rows,
                                                            replication::split::detail::Work& W, int part, int parts) {
  constexpr int batch = 8;
  int const S = L.servers, E = L.experts;
  std::int32_t sign = 0;
#pragma unroll 1
  for (int v = 0; v < S; ++v) {
    int const lo = static_cast<int>(W.sfirst[v]), hi = static_cast<int>(W.sfirst[v + 1]);
#pragma unroll 1
    for (int e = part; e < E; e += parts) {
      long long sum = 0;
#pragma unroll 1
      for (int p = lo; p < hi; p += batch) {
        std::int32_t x[batch];
#pragma unroll
        for (int j = 0; j < batch; ++j) x[j] = p + j < hi ? counts[rows[p + j] + e] : 0;
#pragma unroll
        for (int j = 0; j < batch; ++j) sum += x[j], sign |= x[j];
      }
      W.P[v * E + e] = sum;  // int offsets: DeviceSplit checks that they fit
    }
  }
  return sign;
}

/// split::detail::level on one warp, a lane per copy: lanes with `on` and the same `group` are one
/// call's slots, and `amount` (the same on every lane of a group) is spread over them by raising the
/// lowest rank loads first, the remainder one pair each to the lowest slots at the final level. `l`
/// and `y`: the lane's rank load and its copy's take. The host sorts the slots by (load, slot) and
/// walks up the levels; here each lane finds its place p in that order and the cost of raising the
/// p slots below it to its load (p l - the sum of their loads). That cost grows with p, so the slots
/// raised are those whose cost is at most `amount`, and the lowest always: the same slots, level
/// and remainder as the host's walk. Lanes from k on have no copy; every lane calls it.
__device__ __forceinline__ void level_warp(long long& l, long long& y, bool on, int group, long long amount, int k,
                                           int lane) {
  int p = 0;
  long long below = 0;  // loads of the group's slots before this one in (load, slot) order
#pragma unroll 1
  for (int j = 0; j < k; ++j) {
    long long lj = __shfl_sync(0xffffffffu, l, j);
    int gj = __shfl_sync(0xffffffffu, group, j);
    if (gj == group && (lj < l || (lj == l && j < lane))) ++p, below += lj;
  }
  bool in = on && amount > 0 && (p == 0 || p * l - below <= amount);
  unsigned raised = __ballot_sync(0xffffffffu, in);
  long long n = 0, sum = 0, top = 0;  // the group's raised slots: how many, their loads, the highest
  int before = 0;                     // raised slots of the group at lower lanes (slot order)
#pragma unroll 1
  for (int j = 0; j < k; ++j) {
    long long lj = __shfl_sync(0xffffffffu, l, j);
    int gj = __shfl_sync(0xffffffffu, group, j);
    if (gj != group || !((raised >> j) & 1u)) continue;
    ++n, sum += lj, top = n == 1 || lj > top ? lj : top;
    before += j < lane;
  }
  if (!in) return;
  long long spent = n * top - sum;  // raising them all to the highest
  long long q = (amount - spent) / n, extra = amount - spent - q * n;
  long long add = top + q - l + (before < extra ? 1 : 0);
  y += add, l += add;
}

/// split::detail::start_expert on one warp, a lane per copy (an expert of up to 32 copies; more
/// run on lane 0 with the host's code). An expert's copies are on distinct ranks (BatchSplit checks
/// it), so each lane owns its copy's rank load, and the levels of different servers touch disjoint
/// ranks: they run at once where the host runs them in slot order. Writes what the host's writes
/// (y and the loads of the copies' ranks), not its scratch (mark, need).
__device__ __forceinline__ void start_expert_warp(replication::split::Layout const& L,
                                                  replication::split::detail::Work& W, int e, int lane) {
  int lo = L.first[e], k = L.first[e + 1] - lo;
  if (k > 32) {
    if (lane == 0) replication::split::detail::start_expert(L, W, e);
    __syncwarp();
    return;
  }
  bool on = lane < k;
  int c = lo + (on ? lane : 0);
  int g = L.rank[c], srv = L.server[g];
  long long loc = on ? W.loc[c] : 0;
  long long y = loc, l = on ? W.load[g] + loc : 0;  // own-rank pairs on their copy
  // each server's pairs on its own copies: the group of a copy is the first copy on its server
  int lead = lane;
  long long local = 0;
#pragma unroll 1
  for (int j = 0; j < k; ++j) {
    int sj = __shfl_sync(0xffffffffu, srv, j);
    long long lj = __shfl_sync(0xffffffffu, loc, j);
    if (sj == srv) lead = j < lead ? j : lead, local += lj;
  }
  long long amount = on ? W.srvN[c] - local : 0;
  long long placed = loc + (on && lead == lane ? amount : 0);
  for (int o = 16; o > 0; o >>= 1) placed += __shfl_xor_sync(0xffffffffu, placed, o);
  // then the rest over every copy (one group): one call in a loop, so that its code is there once
  long long const rest = W.N[e] - placed;
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) level_warp(l, y, on, pass == 0 ? lead : 0, pass == 0 ? amount : rest, k, lane);
  if (on) W.y[c] = y, W.load[g] = l;
}

/// Inclusive prefix sum over the warp's lanes.
__device__ __forceinline__ long long warp_inclusive_sum(long long v, int lane) {
  for (int o = 1; o < 32; o <<= 1) {
    long long u = __shfl_up_sync(0xffffffffu, v, static_cast<unsigned>(o));
    if (lane >= o) v += u;
  }
  return v;
}

/// One greedy pass of split::match on one warp: copies (the lanes below k with `mine`) take, in slot
/// order, what the ranks order[0..count) (order == nullptr: ranks 0..count) hold (`rem`), in that
/// order; each copy needs `need`. The host
/// walks both lists with two cursors; that gives every (rank, copy) the overlap of the rank's span
/// [R, R + rem) in the ranks' running sum with the copy's span [C, C + need) in the copies'. Here the
/// lanes take 32 ranks at a time and write the non-zero overlaps. Lowers `need` and the ranks' rem;
/// returns (on every lane) the pairs taken.
__device__ __forceinline__ long long match_pass(replication::split::Layout const& L, std::int32_t* take, long long* rem,
                                                long long const* order, int count, int lo, int k, bool mine,
                                                long long& need, int lane) {
  long long wanted = mine ? need : 0;
  long long before = warp_inclusive_sum(wanted, lane) - wanted;  // C: the needs of the copies before
  long long total = __shfl_sync(0xffffffffu, before + wanted, 31);
  long long held = 0;  // R of this chunk's first rank
  for (int base = 0; base < count && held < total; base += 32) {
    int r = base + lane >= count ? -1 : order ? static_cast<int>(order[base + lane]) : base + lane;
    long long has = r >= 0 ? rem[r] : 0;
    long long upto = warp_inclusive_sum(has, lane), from = upto - has;
    upto += held, from += held;
#pragma unroll 1
    for (int j = 0; j < k; ++j) {
      long long cj = __shfl_sync(0xffffffffu, before, j), nj = __shfl_sync(0xffffffffu, wanted, j);
      long long a = from > cj ? from : cj, b = upto < cj + nj ? upto : cj + nj;
      if (b > a) take[static_cast<long long>(r) * L.slots + lo + j] = static_cast<std::int32_t>(b - a), has -= b - a;
    }
    if (r >= 0) rem[r] = has;
    held = __shfl_sync(0xffffffffu, upto, 31);
  }
  // each copy took the part of its span below the ranks' total
  long long got = held - before;
  got = got < 0 ? 0 : got < wanted ? got : wanted;
  need -= got;
  for (int o = 16; o > 0; o >>= 1) got += __shfl_xor_sync(0xffffffffu, got, o);
  return got;
}

/// split::match for the expert of W.mc[i] on one warp (an expert of up to 32 copies; more run on lane
/// 0 with the host's code). Own rank first (a lane per copy: the copies' ranks are distinct), then
/// each server's ranks to its copies, then every rank to every copy, each pass in the host's order
/// (match_pass). Adds the lane's share of the pairs kept on their rank and server to *local and
/// *same_server (the sums over the warp are the host's).
__device__ __forceinline__ void match_expert_warp(replication::split::Layout const& L, std::int32_t* take,
                                                  long long* work, replication::split::detail::Work& W, long long i,
                                                  int lane, long long* local, long long* same_server) {
  int e = static_cast<int>(W.mc[i]);
  int lo = L.first[e], k = L.first[e + 1] - lo, G = L.ranks;
  if (W.N[e] == 0) return;
  if (k > 32) {
    long long n_mc = W.hdr[replication::split::detail::kMc];
    if (lane == 0)
      replication::split::match(L, take, work, static_cast<int>(i), static_cast<int>(n_mc), local, same_server);
    __syncwarp();
    return;
  }
  long long* rem = W.supply + i * G;
  bool on = lane < k;
  int c = lo + (on ? lane : 0), g = L.rank[c], srv = L.server[g];
  long long need = 0;
  if (on) {
    long long m = rem[g] < W.y[c] ? rem[g] : W.y[c];
    take[static_cast<long long>(g) * L.slots + c] = static_cast<std::int32_t>(m);
    rem[g] -= m, need = W.y[c] - m;
    *local += m, *same_server += m;
  }
  __syncwarp();
  // each server's ranks to its copies: one pass per server, its copies in slot order; then the rest,
  // every rank in order (one call of match_pass in the loop, so that its code is there once)
  unsigned left = __ballot_sync(0xffffffffu, on && need > 0);
#pragma unroll 1
  while (true) {
    bool const rest = left == 0;
    if (rest && !__any_sync(0xffffffffu, on && need > 0)) break;
    int v = rest ? 0 : __shfl_sync(0xffffffffu, srv, __ffs(left) - 1);
    bool mine = on && (rest || srv == v);
    if (!rest) left &= ~__ballot_sync(0xffffffffu, mine);
    int first = rest ? 0 : static_cast<int>(W.sfirst[v]);
    int count = rest ? G : static_cast<int>(W.sfirst[v + 1]) - first;
    long long got = match_pass(L, take, rem, rest ? nullptr : W.srank + first, count, lo, k, mine, need, lane);
    if (!rest && lane == 0) *same_server += got;
    __syncwarp();
    if (rest) break;
  }
}

/// A search's marks for member 0 (split::detail::next_marked): bit i % 32 of bits[i / 32] is
/// marked(i), for i in [0, n), one ballot per 32 items. Every member of the team calls it (a team is
/// whole warps, so its members' ranks mod 32 are their lanes); the caller synchronises after.
template <int TeamSize, class Marked>
__device__ __forceinline__ void mark_bits(int member, int n, long long* bits, Marked marked) {
  int const lane = member & 31;
#pragma unroll 1
  for (int base = member - lane; base < n; base += TeamSize) {
    unsigned m = __ballot_sync(0xffffffffu, base + lane < n && marked(base + lane));
    if (lane == 0) bits[base / 32] = m;
  }
}

/// 2e. The least max load from T (the lower bound), on the team: breadth-first rounds over the
/// arcs from the ranks above T, a rank claimed by its lowest arc (as the host's arc loop claims it),
/// then split::max_load_step on member 0 (the paths to the reached ranks below T and through the
/// side arcs, both marked by the team, or a Newton step on T when none was reached). Returns the least max load; every member gets it. `searches`,
/// `rounds`: incremented per search and per breadth-first round (the profile's tallies).
template <class Team>
__device__ __forceinline__ long long least_max_rounds(replication::split::Layout const& L, replication::split::detail::Work& W,
                                      int n_arcs, long long T, Team& team, int& searches, int& rounds) {
  namespace split = replication::split;
  constexpr int none = INT_MAX;
  int* claim = reinterpret_cast<int*>(W.claim);  // a rank's lowest arc this round (32-bit: a native atomicMin)
  int const G = L.ranks;
  for (;;) {
    bool above = false;
#pragma unroll 1
    for (int g = team.rank; g < G; g += team.size) {
      W.dist[g] = W.load[g] > T ? 0 : -1;
      W.pred[g] = -1;
      claim[g] = none;
      above |= W.load[g] > T;
    }
    if (team.min(above ? 0 : 1) != 0) return T;
    ++searches;
    int end = G;
    long long last = 0;
    for (long long round = 0;; ++round) {
      ++rounds;
#pragma unroll 1
      for (int a = team.rank; a < n_arcs; a += team.size) {
        int h = L.rank[W.arc_d[a]];
        if (W.dist[h] < 0 && split::bfs_arc(L, W, a, round)) atomicMin(&claim[h], a);
      }
      team.sync();
      // one reduction for both: the lowest reached rank below T (< G), something reached (G), nothing (G + 1)
      int mine = G + 1;
#pragma unroll 1
      for (int h = team.rank; h < G; h += team.size) {
        if (claim[h] == none) continue;
        W.dist[h] = round + 1, W.pred[h] = claim[h], claim[h] = none;
        if (W.load[h] < T && h < mine) mine = h;
        else if (mine > G) mine = G;
      }
      int r = team.min(mine);
      if (r < G) end = r, last = round + 1;
      if (r != G) break;
    }
    // the ranks below T reached in the last round and the side arcs of the search, marked by the team
    if (end < G) {
      mark_bits<Team::size>(team.rank, G, W.rank_bits, [&](int h) { return split::side_rank(W, h, T, last); });
      mark_bits<Team::size>(team.rank, n_arcs, W.arc_bits, [&](int a) { return split::side_arc(L, W, a, last); });
      team.sync();
    }
    if (team.rank == 0) T = split::max_load_step(L, W, T, end == G ? -1 : end, last, n_arcs, true);
    T = team.from0(T);
  }
}

/// The tie-breaks' label of a rank (split::least_cost: the least (distance, arcs, last arc) over
/// the paths to it) in one 64-bit word whose order is the labels' order: distance + bias, then the
/// arcs, then the last arc, from the high bits down. One atomicMin per arc and round then finds the
/// distances and the shortest-path tree together. It fits when the batch's bounds leave room: a
/// label of round r is a walk of at most r + 1 <= G + 1 arcs (the rounds stop after G + 1), each
/// of cost at most A + 1 in size (split::detail::move_cost), so |distance| <= (G + 1)(A + 1).
struct PackedLabels {
  static constexpr long long none = 0x7fffffffffffffffLL;
  int arc_bits = 1, hop_bits = 1;
  long long bias = 0;
  bool fits = false;

  MOE_HOST_DEVICE PackedLabels(int G, int n_arcs, long long A) {
    while ((1LL << arc_bits) < n_arcs) ++arc_bits;
    while ((1LL << hop_bits) <= G + 2) ++hop_bits;
    int dist_bits = 62 - arc_bits - hop_bits;  // distance + bias in [0, 2 bias] < 2^(dist_bits + 1)
    if (dist_bits < 2) return;
    long long most = (1LL << dist_bits) / (G + 2);
    if (A + 1 >= most) return;
    bias = (G + 2) * (A + 1);
    fits = true;
  }
  MOE_HOST_DEVICE long long pack(long long dist, long long hops, int arc) const {
    return ((dist + bias) << (hop_bits + arc_bits)) | (hops << arc_bits) | arc;
  }
  MOE_HOST_DEVICE long long dist(long long key) const { return (key >> (hop_bits + arc_bits)) - bias; }
  MOE_HOST_DEVICE long long hops(long long key) const { return (key >> arc_bits) & ((1LL << hop_bits) - 1); }
  MOE_HOST_DEVICE long long arc(long long key) const { return key & ((1LL << arc_bits) - 1); }
};

/// 2f. The tie-breaks at max load T from the start, on the team (split::least_cost says what they
/// compute): each search's rounds from the last round's labels, the cheapest rank below T by two
/// reductions, the other ranks below T at that distance and its side arcs (split::tie_side_arc)
/// marked by the team, its paths on member 0 (split::tie_break_step). With `packed`
/// and a batch whose labels fit in a word (PackedLabels), a round relaxes whole labels; otherwise
/// the distances' rounds first, then the tree's (breadth-first over the tight arcs, a rank claimed
/// by its lowest arc): the same labels in about twice the rounds. Returns how they ended, as
/// split::least_cost does (`stuck`: a search reached no rank below T). `searches`, `rounds`:
/// incremented per shortest-path search and per round of either form (the profile's tallies).
template <class Team>
__device__ __forceinline__ replication::split::CostEnd least_cost_rounds(replication::split::Layout const& L,
                                                                        replication::split::detail::Work& W, int n_arcs,
                                                                        long long T, long long A, bool packed,
                                                                        Team& team, int& searches, int& rounds) {
  namespace split = replication::split;
  constexpr long long none = 0x7fffffffffffffffLL, inf = split::detail::inf;
  int* claim = reinterpret_cast<int*>(W.claim);  // the tree's rounds: a rank's lowest tight arc
  int const G = L.ranks;
  PackedLabels const P(G, n_arcs, A);
  packed = packed && P.fits;
  long long* key = W.rem;  // the packed labels
  for (;;) {
    bool above = false;
#pragma unroll 1
    for (int g = team.rank; g < G; g += team.size) {
      bool excess = W.load[g] > T;
      if (packed) {
        key[g] = W.ndist[g] = excess ? P.pack(0, 0, 0) : none;  // dist is written after the rounds
      } else {
        W.dist[g] = W.ndist[g] = excess ? 0 : inf;
        claim[g] = INT_MAX;
      }
      W.pred[g] = -1;
      above |= excess;
    }
#pragma unroll 1
    for (int a = team.rank; a < n_arcs; a += team.size) W.cost[a] = split::arc_cost(L, W, a, A);
    if (team.min(above ? 0 : 1) != 0) return split::CostEnd::done;
    ++searches;
    if (packed) {
      // the labels: dist, hop and pred together (ndist holds the next round's keys)
      for (int round = 0;; ++round) {
        ++rounds;
#pragma unroll 1
        for (int a = team.rank; a < n_arcs; a += team.size) {
          long long k = W.cost[a], from = key[L.rank[W.arc_c[a]]];
          if (k != inf && from != none)
            atomicMin(&W.ndist[L.rank[W.arc_d[a]]], P.pack(P.dist(from) + k, P.hops(from) + 1, a));
        }
        team.sync();
        bool changed = false;
#pragma unroll 1
        for (int g = team.rank; g < G; g += team.size)
          if (W.ndist[g] < key[g]) key[g] = W.ndist[g], changed = true;
        if (team.min(changed ? 0 : 1) != 0) break;
        if (round == G) return split::CostEnd::fault;  // still changing after G + 1 rounds: a negative cycle
      }
#pragma unroll 1
      for (int g = team.rank; g < G; g += team.size) {
        long long x = key[g];
        bool reached = x != none;
        W.dist[g] = reached ? P.dist(x) : inf;
        W.hop[g] = reached ? P.hops(x) : -1;
        W.pred[g] = reached && P.hops(x) > 0 ? P.arc(x) : -1;
      }
    } else {
      // the shortest distances
      for (int round = 0;; ++round) {
        ++rounds;
#pragma unroll 1
        for (int a = team.rank; a < n_arcs; a += team.size) {
          long long r = split::relaxed(L, W, a);
          if (r != inf) atomicMin(&W.ndist[L.rank[W.arc_d[a]]], r);
        }
        team.sync();
        bool changed = false;
#pragma unroll 1
        for (int g = team.rank; g < G; g += team.size)
          if (W.ndist[g] < W.dist[g]) W.dist[g] = W.ndist[g], changed = true;
        if (team.min(changed ? 0 : 1) != 0) break;
        if (round == G) return split::CostEnd::fault;  // still changing after G + 1 rounds: a negative cycle
      }
      // the shortest-path tree
#pragma unroll 1
      for (int g = team.rank; g < G; g += team.size) W.hop[g] = W.load[g] > T && W.dist[g] == 0 ? 0 : -1;
      team.sync();
      for (long long round = 0;; ++round) {
        ++rounds;
#pragma unroll 1
        for (int a = team.rank; a < n_arcs; a += team.size) {
          int h = L.rank[W.arc_d[a]];
          if (W.hop[h] < 0 && split::tree_arc(L, W, a, round)) atomicMin(&claim[h], a);
        }
        team.sync();
        bool grew = false;
#pragma unroll 1
        for (int h = team.rank; h < G; h += team.size) {
          if (claim[h] == INT_MAX) continue;
          W.hop[h] = round + 1, W.pred[h] = claim[h], claim[h] = INT_MAX;
          grew = true;
        }
        if (team.min(grew ? 0 : 1) != 0) break;
      }
    }
    // the cheapest rank below T, the lowest on a tie
    long long best = inf;
    int at = G;
#pragma unroll 1
    for (int h = team.rank; h < G; h += team.size)
      if (W.load[h] < T && W.dist[h] < best) best = W.dist[h], at = h;
    long long least = team.min(best);
    int end = team.min(best == least ? at : G);
    if (end == G) return split::CostEnd::stuck;  // no rank below T reached: T is below the least max load
    // the ranks below T at the least distance and the side arcs of the search, marked by the team
    // (also when the first path turns out to end the step: knowing that first would cost member 0's
    // path walk and a broadcast before the marks, in every search)
    mark_bits<Team::size>(team.rank, G, W.rank_bits, [&](int h) { return split::tie_side_rank(W, h, T, least); });
    mark_bits<Team::size>(team.rank, n_arcs, W.arc_bits, [&](int a) { return split::tie_side_arc(L, W, T, least, a); });
    team.sync();
    bool ok = true;
    if (team.rank == 0) ok = W.hop[end] > 0 && split::tie_break_step(L, W, T, A, end, n_arcs, true);
    if (team.from0(ok ? 1 : 0) == 0) return split::CostEnd::fault;
  }
}

/// The split in one block. The stages of split::solve, spread over the threads where their result
/// does not depend on the order of the work (every sum is an integer sum; every list keeps expert
/// order through prefix sums; the start runs its experts in waves of experts on disjoint ranks, each
/// wave after every earlier expert that shares a rank; the breadth-first rounds let the lowest arc
/// index claim a rank, as the host's arc loop does; the shortest distances do not depend on the
/// order of the relaxations). Paths are augmented on one thread. `WarpRounds`: the rank-sized rounds
/// on the first warp while the others gather the sources, else on the whole block. `wave_first` /
/// `wave_expert`: the waves of the start; `sfirst` / `srank`: the ranks of each server, then the rows
/// of count_servers_block (srank + G: G ints; DeviceSplit).
/// One block per launch, so `__launch_bounds__(Threads, 1)`: without the 1, ptxas (CUDA 13, sm_90a)
/// held the warp form to 80 registers and spilled; with it neither form spills.
template <int Threads, bool WarpRounds>
__global__ void __launch_bounds__(Threads, 1)
    batch_split_kernel(replication::split::Layout L, std::int32_t const* __restrict__ counts, std::int32_t* take,
                       long long* load, replication::split::Outcome* outcome, long long* global_work, int use_shared,
                       int waves, int wave_experts, int const* __restrict__ wave_first,
                       int const* __restrict__ wave_expert, int const* __restrict__ sfirst,
                       int const* __restrict__ srank, int flags, long long* stamps) {
  static_assert(Threads % 32 == 0 && (!WarpRounds || Threads >= 64), "whole warps; a warp beside the rounds");
  namespace split = replication::split;
  using split::detail::Work;
  MOE_EXTERN_SHARED(long long, smem);
  __shared__ int negative;
  __shared__ long long warp_sums[Threads / 32 + 1];
  __shared__ long long team_slots[3];
  static_assert(alignof(split::Outcome) <= alignof(long long));
  __shared__ long long out_raw[(sizeof(split::Outcome) + sizeof(long long) - 1) / sizeof(long long)];
  auto& out = *reinterpret_cast<split::Outcome*>(out_raw);
  __shared__ unsigned long long local, same_server;
  __shared__ long long set_max;  // split::set_bounds, over the threads
  int tid = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  // profiling (DeviceSplit::run's `stamps`): thread 0's clock64 at the start and after each stage,
  // then the rounds' tallies
  auto stamp = [&](int k) {
    if (stamps != nullptr && tid == 0) stamps[k] = clock64();
  };
  stamp(0);
  long long* work = global_work;
  int const* count_rows = srank + L.ranks;
  if (use_shared) {  // the workspace, then the copy lists, servers and the start's waves, in shared memory
    work = smem;
    auto* lay = reinterpret_cast<int*>(smem + split::workspace_words(L));
    int* first = lay;
    int* rank = first + L.experts + 1;
    int* server = rank + L.slots;
    int* wfirst = server + L.ranks;
    int* wexpert = wfirst + waves + 1;
    int* rows = wexpert + wave_experts;
#pragma unroll 1
    for (int i = tid; i <= L.experts; i += n) first[i] = L.first[i];
#pragma unroll 1
    for (int i = tid; i < L.slots; i += n) rank[i] = L.rank[i];
#pragma unroll 1
    for (int i = tid; i < L.ranks; i += n) server[i] = L.server[i];
#pragma unroll 1
    for (int i = tid; i <= waves; i += n) wfirst[i] = wave_first[i];
#pragma unroll 1
    for (int i = tid; i < wave_experts; i += n) wexpert[i] = wave_expert[i];
#pragma unroll 1
    for (int i = tid; i < L.ranks; i += n) rows[i] = srank[L.ranks + i];
    L.first = first, L.rank = rank, L.server = server;
    wave_first = wfirst, wave_expert = wexpert;
    count_rows = rows;
  }
  Work W(L, work);
  int G = L.ranks, E = L.experts;
  if (tid == 0) negative = 0, local = 0, same_server = 0, set_max = 0, team_slots[0] = BlockTeam<Threads>::identity;
  // what split::decide_begin makes, in parallel: the ranks of each server (the layout's, uploaded
  // once), the loads and the header zeroed
#pragma unroll 1
  for (int v = tid; v <= L.servers; v += n) W.sfirst[v] = sfirst[v];
#pragma unroll 1
  for (int g = tid; g < G; g += n) W.srank[g] = srank[g], W.load[g] = 0;
#pragma unroll 1
  for (int i = tid; i < 8; i += n) W.hdr[i] = 0;
  __syncthreads();  // the copy lists in shared memory are read by every thread from here
  // 1. pairs per (source server, expert): every thread, a stride of experts
  if (detail::count_servers_block(L, counts, count_rows, W, tid, n) < 0) atomicOr(&negative, 1);
  __syncthreads();
  stamp(1);
  if (negative) {
    if (tid == 0) {
      out = split::Outcome{};
      out.bad = 1;
      *outcome = out;
    }
    return;
  }
  // 2b. every expert's totals (a stride of experts)
  {
    BlockAdd add{W.hdr};
#pragma unroll 1
    for (int e = tid; e < E; e += n) split::expert_totals(L, counts, W, e, add);
    add.flush();
  }
  __syncthreads();
  // the team of the rank-sized rounds, and the lower bound of the max load on it (from the fixed
  // loads, before the start)
  bool const in_team = !WarpRounds || tid < 32;
  using Team = std::conditional_t<WarpRounds, WarpTeam, BlockTeam<Threads>>;
  Team team(tid, team_slots);
  long long T = 0;
  long long const total = W.hdr[split::detail::kTotal];
  if (in_team) {
    long long m = 0;
#pragma unroll 1
    for (int g = team.rank; g < G; g += team.size) m = split::detail::lmax(m, W.load[g]);
    T = split::lower_bound(-team.min(-m), total, G);
  }
  stamp(2);
  // 2c. the lists in expert order: each thread a run of experts, placed by prefix sums
  int chunk = (E + n - 1) / n, lo = tid * chunk, hi = lo + chunk < E ? lo + chunk : E;
  int my_arcs = 0, my_mc = 0;
#pragma unroll 1
  for (int e = lo; e < hi; ++e) {
    bool copies = L.first[e + 1] - L.first[e] > 1;
    my_mc += copies;
    if (copies && W.N[e] > 0) my_arcs += split::expert_arc_count(L, e);
  }
  // one scan for both: arcs in the high half, experts with copies (at most E) in the low
  long long both = 0, at = block_exclusive_scan<Threads>(static_cast<long long>(my_arcs) << 32 | my_mc, warp_sums, &both);
  int const n_arcs = static_cast<int>(both >> 32), n_mc = static_cast<int>(both & 0xffffffffLL);
  int at_arcs = static_cast<int>(at >> 32), at_mc = static_cast<int>(at & 0xffffffffLL);
#pragma unroll 1
  for (int e = lo; e < hi; ++e) {
#pragma unroll 1
    for (int c = L.first[e]; c < L.first[e + 1]; ++c) W.sexp[c] = e;
    if (L.first[e + 1] - L.first[e] == 1) continue;
    W.mc[at_mc++] = e;
    if (W.N[e] == 0) continue;
    split::expert_arcs(L, counts, W, e, at_arcs);
    at_arcs += split::expert_arc_count(L, e);
  }
  if (tid == 0) W.hdr[split::detail::kArcs] = n_arcs, W.hdr[split::detail::kMc] = n_mc;
#pragma unroll 1
  for (int c = tid; c < L.slots; c += n) W.y[c] = 0, W.mark[c] = -1;
  __syncthreads();
  // the sets' lower bound (split::set_bounds: the copies of each expert with copies and pairs, each
  // server), a set per thread, from the fixed loads (before the start changes the loads)
  {
    long long b = 0;
#pragma unroll 1
    for (int i = tid; i < n_mc + L.servers; i += n)
      if (i >= n_mc || W.N[W.mc[i]] > 0) b = split::detail::lmax(b, split::set_bound(L, W, W.mc, n_mc, i));
    if (b > 0) atomicMax(&set_max, b);
  }
  __syncthreads();
  if (in_team) T = split::detail::lmax(T, set_max);
  stamp(3);
  // 2d. the start, wave by wave, an expert per warp
  for (int w = 0; w < waves; ++w) {
#pragma unroll 1
    for (int i = wave_first[w] + (tid >> 5); i < wave_first[w + 1]; i += n >> 5) {
      int e = wave_expert[i];
      if (W.N[e] > 0) detail::start_expert_warp(L, W, e, tid & 31);
    }
    __syncthreads();
  }
  stamp(4);
#pragma unroll 1
  for (int c = tid; c < L.slots; c += n) W.y0[c] = W.y[c];
#pragma unroll 1
  for (int g = tid; g < G; g += n) W.load_s[g] = W.load[g];
  __syncthreads();
  // 2e-f on the team; with a warp team, the other warps gather the sources meanwhile (stage 3: it
  // reads the counts and the list of experts with copies, and writes only its own rows)
  if (in_team) {
    // the profile's tallies
    int searches = 0, max_rounds = 0, tb_searches = 0, tb_rounds = 0, fallbacks = 0;
    // DeviceSplit::Order::bound_first (split::decide's order): the tie-breaks at the lower bound T
    // first; when they end, T was the least max load; when they get stuck, the least max load is
    // searched from the start and the tie-breaks run again from the start at it. least_max_first:
    // the least max load, then the tie-breaks. The same split either way.
    bool const packed = (flags & 1) != 0;
    bool search = (flags & 2) != 0;  // the least max load's search before the next tie-breaks
    long long const A = total + 1;
    bool ok = false;
#pragma unroll 1
    for (int attempt = 0;; ++attempt) {  // one call of each stage in the loop, so that its code is there once
      if (search) {
#pragma unroll 1
        for (int pass = 0; pass < 2; ++pass) {  // each from the start
          split::restore_start(L, W, team.rank, team.size);
          team.sync();
          if (pass == 0) T = least_max_rounds(L, W, n_arcs, T, team, searches, max_rounds);
        }
        if (attempt == 0) stamp(5);
      }
      auto const end = least_cost_rounds(L, W, n_arcs, split::tie_break_cap(L, T, total), A, packed, team,
                                         tb_searches, tb_rounds);
      if (attempt == 0 && !search) stamp(5);
      ok = end == split::CostEnd::done;
      if (end != split::CostEnd::stuck || search) break;
      search = true, fallbacks = 1;
    }
    stamp(6);
    if (stamps != nullptr && tid == 0)
      stamps[9] = searches, stamps[10] = max_rounds, stamps[11] = tb_searches, stamps[12] = tb_rounds,
      stamps[13] = fallbacks;
    long long m = 0;
#pragma unroll 1
    for (int g = team.rank; g < G; g += team.size) m = split::detail::lmax(m, W.load[g]);
    m = -team.min(-m);
    if (team.rank == 0) {
      out = split::Outcome{};
      out.bad = ok ? 0 : 2;
      out.local = W.hdr[split::detail::kLocal];
      out.same_server = W.hdr[split::detail::kSame];
      out.max_load = m;
    }
  }
  if (WarpRounds ? !in_team : true)
    split::gather_sources(L, counts, take, work, WarpRounds ? tid - 32 : tid, WarpRounds ? n - 32 : n);
  __syncthreads();
  stamp(7);
  if (out.bad) {
    if (tid == 0) *outcome = out;
    return;
  }
#pragma unroll 1
  for (int g = tid; g < G; g += n) load[g] = W.load[g];
  // 4. the matching, an expert per warp; integer sums, so the order of the atomics does not
  // change them
  long long l = 0, s = 0;
#pragma unroll 1
  for (long long i = tid >> 5, n_mc = W.hdr[split::detail::kMc]; i < n_mc; i += n >> 5)
    detail::match_expert_warp(L, take, work, W, i, tid & 31, &l, &s);
  // warp sums first: 64-bit shared atomics on one word from every thread would serialise
  for (int o = 16; o > 0; o >>= 1) {
    l += __shfl_down_sync(0xffffffffu, l, static_cast<unsigned>(o));
    s += __shfl_down_sync(0xffffffffu, s, static_cast<unsigned>(o));
  }
  if ((tid & 31) == 0 && (l != 0 || s != 0)) {
    atomicAdd(&local, static_cast<unsigned long long>(l));
    atomicAdd(&same_server, static_cast<unsigned long long>(s));
  }
  __syncthreads();
  if (tid == 0) {
    out.local += static_cast<long long>(local);
    out.same_server += static_cast<long long>(same_server);
    *outcome = out;
  }
  stamp(8);
}

__global__ void expert_counts_kernel(int const* __restrict__ ids, long long pairs, std::int32_t* __restrict__ counts) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < pairs;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    atomicAdd(&counts[ids[i]], 1);
}

__global__ void deal_sorted_kernel(SplitView v, int rank, int const* __restrict__ sorted_keys,
                                   int const* __restrict__ sorted_values, int const* __restrict__ offsets, long long n,
                                   int* __restrict__ dest) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    int e = sorted_keys[i];
    dest[sorted_values[i]] = v.dealt(e, rank, i - offsets[e]);
  }
}

template <int Threads>
__global__ void __launch_bounds__(Threads)
    batch_split_deal_kernel(SplitView v, int rank, int const* __restrict__ ids, long long pairs, int* dest) {
  auto const& L = v.layout;
  std::int32_t const* row = v.take + static_cast<long long>(rank) * L.slots;
  for (int e = static_cast<int>(threadIdx.x); e < L.experts; e += Threads) {
    int slot = L.first[e], last = L.first[e + 1] - 1;
    long long left = slot == last ? -1 : row[slot];
    for (long long p = 0; p < pairs; ++p) {
      if (ids[p] != e) continue;
      if (left >= 0) {
        while (left == 0 && slot < last) left = row[++slot];
        if (left > 0) --left;
      }
      dest[p] = L.rank[slot];
    }
  }
}

}  // namespace detail

/// The split's copy lists and servers in device memory, and its launches.
class DeviceSplit {
public:
  static constexpr int threads = 256;
  /// Entries of run()'s `stamps`: `stamp_clocks` clock values, then five tallies.
  static constexpr int stamp_clocks = 9, stamps_size = 14;
  /// Shared memory a block may use without an opt-in on every CUDA GPU.
  static constexpr std::size_t max_shared = 48 * 1024;
  /// Who runs the rank-sized rounds (the least max load and the tie-breaks): the block's first
  /// warp, while the other warps gather the sources (a round's barrier is a warp's), or the whole
  /// block (more threads over the arcs of a large layout). `automatic`: the warp when no pass over
  /// the ranks or the arcs gives a lane more than `warp_items` of them.
  enum class Rounds { automatic, warp, block };
  static constexpr int warp_items = 4;
  /// How the tie-breaks find each shortest path's labels (split::least_cost). `automatic`: a round
  /// relaxes whole labels (distance, arcs, last arc) packed in one 64-bit word, when the batch's
  /// bounds let them fit (detail::PackedLabels: under about 2^43 pairs with 32 ranks and 76 arcs), else as
  /// `two_stage`: the distances' rounds, then the tree's breadth-first rounds over the tight arcs,
  /// about twice the rounds. Both give the host's split bit for bit.
  enum class Paths { automatic, two_stage };
  /// The order of the rank-sized stages (the same split either way). `bound_first` (automatic, and
  /// split::decide's order): the tie-breaks at the lower bound, which is the least max load in most
  /// batches (99 of the benchmark series' 130); only when they get stuck, the least max load's
  /// search and the tie-breaks again. `least_max_first`: the search, then the tie-breaks.
  enum class Order { automatic, bound_first, least_max_first };

  /// `host`: the layout of a replication::BatchSplit (host pointers); copies it to the device, with
  /// the waves of the split's start. `shared_limit`: the most dynamic shared memory the kernel may
  /// use (0: what the current device allows a block with an opt-in); past 48 KiB the constructor
  /// opts the kernel in. A split whose workspace and copy lists do not fit runs from global memory.
  explicit DeviceSplit(replication::split::Layout const& host, std::size_t shared_limit = 0,
                       Rounds rounds = Rounds::automatic, Paths paths = Paths::automatic,
                       Order order = Order::automatic)
      : layout_(host),
        packed_paths_(paths == Paths::automatic),
        least_max_first_(order == Order::least_max_first),
        first_(static_cast<std::size_t>(host.experts) + 1),
        rank_(static_cast<std::size_t>(host.slots)),
        server_(static_cast<std::size_t>(host.ranks)) {
    first_.upload(host.first, first_.size());
    rank_.upload(host.rank, rank_.size());
    server_.upload(host.server, server_.size());
    layout_.first = first_.get();
    layout_.rank = rank_.get();
    layout_.server = server_.get();
    warp_rounds_ = rounds == Rounds::warp ||
                   (rounds == Rounds::automatic && std::max(host.ranks, host.arcs) <= warp_items * 32);
    // the ranks of each server (split::decide_begin's lists: the layout's alone)
    // then, for the counts pass (count_servers_block), each position's row in the counts
    check(static_cast<long long>(std::max(host.ranks, host.servers)) * host.experts <= INT_MAX,
          "device batch split: ", host.ranks, " ranks x ", host.experts, " experts of counts do not fit int offsets");
    auto G = static_cast<std::size_t>(host.ranks);
    std::vector<int> sfirst(static_cast<std::size_t>(host.servers) + 1), srank(2 * G),
        cursor(static_cast<std::size_t>(host.servers));
    replication::split::server_ranks(host, sfirst.data(), srank.data(), cursor.data());
    for (std::size_t p = 0; p < G; ++p) srank[G + p] = srank[p] * host.experts;
    sfirst_ = DeviceArray<int>(sfirst.size());
    sfirst_.upload(sfirst.data(), sfirst.size());
    srank_ = DeviceArray<int>(std::max<std::size_t>(srank.size(), 1));
    if (!srank.empty()) srank_.upload(srank.data(), srank.size());
    // The start's waves: an expert with copies starts one wave after the latest earlier expert with
    // copies on one of its ranks, so experts of one wave share no rank, and each starts after every
    // earlier expert it shares a rank with (the host's expert order, for what it can see).
    std::vector<int> wave_of_rank(static_cast<std::size_t>(host.ranks), 0), wave_of(static_cast<std::size_t>(host.experts), -1);
    int waves = 0;
    for (int e = 0; e < host.experts; ++e) {
      if (host.first[e + 1] - host.first[e] < 2) continue;
      int w = 0;
      for (int c = host.first[e]; c < host.first[e + 1]; ++c) w = std::max(w, wave_of_rank[static_cast<std::size_t>(host.rank[c])]);
      for (int c = host.first[e]; c < host.first[e + 1]; ++c) wave_of_rank[static_cast<std::size_t>(host.rank[c])] = w + 1;
      wave_of[static_cast<std::size_t>(e)] = w;
      waves = std::max(waves, w + 1);
    }
    std::vector<int> first(static_cast<std::size_t>(waves) + 1, 0), wave_list;
    for (int w = 0; w < waves; ++w) {
      for (int e = 0; e < host.experts; ++e)
        if (wave_of[static_cast<std::size_t>(e)] == w) wave_list.push_back(e);
      first[static_cast<std::size_t>(w) + 1] = static_cast<int>(wave_list.size());
    }
    waves_ = waves;
    wave_experts_ = static_cast<int>(wave_list.size());
    wave_first_ = DeviceArray<int>(first.size());
    wave_first_.upload(first.data(), first.size());
    wave_expert_ = DeviceArray<int>(std::max<std::size_t>(wave_list.size(), 1));
    if (!wave_list.empty()) wave_expert_.upload(wave_list.data(), wave_list.size());
    // shared memory: the workspace, then the copy lists, the servers, the start's waves and the
    // counts pass's rows (int)
    std::size_t lists = (static_cast<std::size_t>(host.experts) + 1 + static_cast<std::size_t>(host.slots) +
                         static_cast<std::size_t>(waves_) + 1 + static_cast<std::size_t>(wave_experts_) +
                         2 * static_cast<std::size_t>(host.ranks)) * sizeof(int);
    std::size_t need = work_bytes() + (lists + sizeof(long long) - 1) / sizeof(long long) * sizeof(long long);
    std::size_t device_limit = opt_in_limit(kernel());
    if (shared_limit == 0) shared_limit = device_limit;
    if (need <= std::min(shared_limit, device_limit)) {
      shared_ = need;
      // The limit belongs to the kernel (on this device), not to this split: every split opts it in
      // to the same most, so that no split lowers the limit another one runs under (a re-plan's
      // split built beside the one in use, or another layer's, in this process).
      if (need > max_shared)
        check_cuda(cudaFuncSetAttribute(kernel(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(device_limit)),
                   "cudaFuncSetAttribute(batch_split_kernel, MaxDynamicSharedMemorySize)");
    }
  }

  /// The number of waves the split's start runs in (the longest chain of experts with copies that
  /// share ranks, in expert order): the start's serial depth.
  [[nodiscard]] int start_waves() const { return waves_; }
  /// Whether the rank-sized rounds run on one warp (see Rounds).
  [[nodiscard]] bool warp_rounds() const { return warp_rounds_; }
  /// The layout with device pointers.
  [[nodiscard]] replication::split::Layout const& layout() const { return layout_; }
  /// Bytes of the per-block workspace the split needs.
  [[nodiscard]] std::size_t work_bytes() const {
    return static_cast<std::size_t>(replication::split::workspace_words(layout_)) * sizeof(long long);
  }
  /// Dynamic shared memory run() uses (the workspace and the copy lists, when they fit), else 0.
  [[nodiscard]] std::size_t shared_bytes() const { return shared_; }
  /// Global workspace run() needs: 0 when the workspace fits in shared memory.
  [[nodiscard]] std::size_t workspace_bytes() const { return shared_bytes() ? 0 : work_bytes(); }
  /// Sizes of the outputs, in elements: take (int32), load (int64).
  [[nodiscard]] std::size_t take_size() const {
    return static_cast<std::size_t>(layout_.ranks) * static_cast<std::size_t>(layout_.slots);
  }
  [[nodiscard]] std::size_t load_size() const { return static_cast<std::size_t>(layout_.ranks); }

  /// Splits the batch whose counts (ranks x experts int32, device) are in `counts`: one kernel on
  /// `stream`, no synchronisation. `workspace`: workspace_bytes() bytes (may be null when 0).
  /// `stamps` (profiling, normally null): device memory for `stamps_size` values: thread 0's
  /// clock64 at the kernel's start and after each stage (counts, expert totals, lists, start, the
  /// first rank-sized stage (Order::bound_first: the tie-breaks at the lower bound; least_max_first:
  /// the least max load), the rest of them (the fallback when the bound was below the least max
  /// load: its search and the tie-breaks again; the tie-breaks), sources, matching: entries 0-8),
  /// then the rounds' tallies: the least max load's searches and breadth-first rounds, the
  /// tie-breaks' searches and rounds (both runs), and whether the fallback ran (9-13).
  void run(std::int32_t const* counts, std::int32_t* take, long long* load, replication::split::Outcome* outcome,
           void* workspace, cudaStream_t stream, long long* stamps = nullptr) const {
    bool shared = shared_bytes() > 0;
    check(shared || workspace != nullptr, "device batch split: the workspace (", work_bytes(),
          " bytes) does not fit in shared memory and none was given");
    launch(kernel(), dim3(1), dim3(threads), shared_bytes(), stream, layout_, counts, take, load, outcome,
           static_cast<long long*>(workspace), shared ? 1 : 0, waves_, wave_experts_, wave_first_.get(), wave_expert_.get(),
           sfirst_.get(), srank_.get(), (packed_paths_ ? 1 : 0) | (least_max_first_ ? 2 : 0), stamps);
    check_launch("batch_split_kernel");
  }

  /// This rank's `pairs` pairs (expert ids) counted per expert into counts (experts int32, zeroed
  /// first): the row this rank contributes to run()'s counts.
  void count(int const* ids, long long pairs, std::int32_t* counts, cudaStream_t stream) const {
    check_cuda(cudaMemsetAsync(counts, 0, static_cast<std::size_t>(layout_.experts) * sizeof(std::int32_t), stream),
               "cudaMemsetAsync (split counts)");
    if (pairs == 0) return;
    launch(detail::expert_counts_kernel, static_cast<unsigned>(std::min<long long>(blocks_for(pairs, 256), 1024)), 256, 0,
           stream, ids, pairs, counts);
    check_launch("expert_counts_kernel");
  }

  /// Deals this rank's `n` pairs from their expert order (sorted_keys: experts, sorted_values: pair
  /// indices, offsets: where each expert's pairs start; kernels::cuda::order_by_expert): dest[pair]
  /// = the rank serving it, the m-th pair of its expert in token order going where the split says.
  void deal_sorted(std::int32_t const* take, int rank, int const* sorted_keys, int const* sorted_values,
                   int const* offsets, long long n, int* dest, cudaStream_t stream) const {
    check(rank >= 0 && rank < layout_.ranks, "device batch split: deal for rank ", rank, ", outside [0, ",
          layout_.ranks, ")");
    if (n == 0) return;
    launch(detail::deal_sorted_kernel, static_cast<unsigned>(std::min<long long>(blocks_for(n, 256), 1024)), 256, 0,
           stream, view(take), rank, sorted_keys, sorted_values, offsets, n, dest);
    check_launch("deal_sorted_kernel");
  }

  /// The view the dispatch reads (take: the array run() wrote).
  [[nodiscard]] SplitView view(std::int32_t const* take) const { return {layout_, take}; }

  /// Deals one rank's `pairs` expert ids (token order) to ranks, into dest (both device).
  void deal(std::int32_t const* take, int rank, int const* ids, long long pairs, int* dest, cudaStream_t stream) const {
    check(rank >= 0 && rank < layout_.ranks, "device batch split: deal for rank ", rank, ", outside [0, ",
          layout_.ranks, ")");
    launch(detail::batch_split_deal_kernel<threads>, dim3(1), dim3(threads), 0, stream, view(take), rank, ids, pairs,
           dest);
    check_launch("batch_split_deal_kernel");
  }

private:
  /// The most dynamic shared memory the current device lets kernel `k` take with an opt-in: the
  /// device's per-block most less the kernel's static shared variables.
  static std::size_t opt_in_limit(decltype(&detail::batch_split_kernel<threads, true>) k) {
    int dev = 0, optin = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
               "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
    cudaFuncAttributes a{};
    check_cuda(cudaFuncGetAttributes(&a, k), "cudaFuncGetAttributes(batch_split_kernel)");
    auto most = static_cast<std::size_t>(optin);
    return most > a.sharedSizeBytes ? most - a.sharedSizeBytes : 0;
  }
  /// The kernel of this split's rounds (see Rounds).
  [[nodiscard]] decltype(&detail::batch_split_kernel<threads, true>) kernel() const {
    return warp_rounds_ ? detail::batch_split_kernel<threads, true> : detail::batch_split_kernel<threads, false>;
  }

  replication::split::Layout layout_;
  bool packed_paths_ = true, least_max_first_ = false;
  DeviceArray<int> first_, rank_, server_, wave_first_, wave_expert_, sfirst_, srank_;
  int waves_ = 0, wave_experts_ = 0;
  bool warp_rounds_ = false;
  std::size_t shared_ = 0;
};

/// replication::BatchSplit's device form for the fixed rule it keeps for one token at a time
/// (BatchSplit::choose, replication::Table's). The device Layer does not route a batch with it: it
/// deals each pass's pairs from the split of that pass (DeviceSplit).
template <>
struct DeviceReplicas<replication::BatchSplit> {
  using View = ReplicaView;
  static View view(replication::BatchSplit const&, DeviceCopyTable const& t) { return {t.offsets, t.ranks, t.primary}; }
};

}  // namespace moe::kernels::cuda
