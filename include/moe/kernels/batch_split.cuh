#pragma once
// The per-batch replica split on the device: the split of replication::BatchSplit
// (moe/replication/batch_split.hpp) computed by one thread block from device-resident counts, so
// that a layer pass can go from the count exchange to the dispatch with no host round trip. The
// block runs the host's own pieces of split::solve (count_servers, the pieces of decide,
// gather_sources, match) and spreads them over its threads wherever the result does not depend on
// the order of the work, so the result equals the host's bit for bit:
//   - the counts per server, the experts' totals and fixed loads (integer sums, atomic where shared);
//   - the lists of experts with copies and their arcs, in expert order (block prefix sums);
//   - the start of the flow, wave by wave (experts of a wave share no rank; an expert starts after
//     every earlier expert on one of its ranks, as in the host's expert order; DeviceSplit makes
//     the waves from the copy lists once);
//   - the breadth-first rounds of the least max load (a rank is claimed by its lowest arc, as the
//     host's arc loop claims it);
//   - the tie-breaks (successive shortest paths on the rank graph): each path's Bellman-Ford rounds
//     and its shortest-path tree (breadth-first over the tight arcs, a rank claimed by its lowest
//     arc) over the threads, its augmentation on thread 0; then the matching over the threads.
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
// were and sets outcome.bad = 1 on the device.
//
// deal(): one rank's pairs (tokens x k expert ids, token order) -> the rank serving each, as the
// host's BatchSplit::deal; one block, one thread per expert (a reference for the layer, which may
// instead use the pair's rank among its expert's pairs from its own permutation with dealt()).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
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

/// The sums of the expert stage, shared by the block's threads: the header's sums in registers
/// (added to the header once per warp by flush()), the rank loads by 64-bit atomic additions (two's
/// complement, so the unsigned form adds signed values exactly).
struct BlockAdd {
  long long* hdr;
  long long sum[4] = {0, 0, 0, 0};
  __device__ void operator()(long long* p, long long v) {
    auto i = p - hdr;
    if (i >= 0 && i < 4) sum[i] += v;
    else atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  }
  /// Every thread of the block calls it.
  __device__ void flush() {
    for (int k = 0; k < 4; ++k) {
      long long v = sum[k];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, static_cast<unsigned>(o));
      if ((threadIdx.x & 31) == 0 && v != 0)
        atomicAdd(reinterpret_cast<unsigned long long*>(hdr + k), static_cast<unsigned long long>(v));
    }
  }
};

/// Exclusive prefix sum of v over the block's threads in thread order; the block's total in *total.
/// Every thread calls it (it synchronises). `warp_sums`: Threads / 32 + 1 shared ints.
template <int Threads>
__device__ int block_exclusive_scan(int v, int* warp_sums, int* total) {
  static_assert(Threads % 32 == 0);
  int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    int y = __shfl_up_sync(0xffffffffu, x, static_cast<unsigned>(o));
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (tid == 0) {
    int run = 0;
    for (int w = 0; w < Threads / 32; ++w) {
      int t = warp_sums[w];
      warp_sums[w] = run;
      run += t;
    }
    warp_sums[Threads / 32] = run;
  }
  __syncthreads();
  int out = warp_sums[warp] + x - v;
  *total = warp_sums[Threads / 32];
  __syncthreads();  // warp_sums may be reused at once
  return out;
}

/// The split in one block. The stages of split::solve, spread over the threads where their result
/// does not depend on the order of the work (every sum is an integer sum; every list keeps expert
/// order through prefix sums; the start runs its experts in waves of experts on disjoint ranks, each
/// wave after every earlier expert that shares a rank; the breadth-first rounds let the lowest arc
/// index claim a rank, as the host's arc loop does; the shortest distances do not depend on the
/// order of the relaxations). Paths are augmented on thread 0. `wave_first` / `wave_expert`: the
/// waves of the start (DeviceSplit).
template <int Threads>
__global__ void __launch_bounds__(Threads)
    batch_split_kernel(replication::split::Layout L, std::int32_t const* __restrict__ counts, std::int32_t* take,
                       long long* load, replication::split::Outcome* outcome, long long* global_work, int use_shared,
                       int waves, int const* __restrict__ wave_first, int const* __restrict__ wave_expert,
                       long long* stamps) {
  namespace split = replication::split;
  using split::detail::Work;
  MOE_EXTERN_SHARED(long long, smem);
  __shared__ int negative, grew, end, go, changed, fault;
  __shared__ long long T_s, best;
  __shared__ int warp_sums[Threads / 32 + 1];
  static_assert(alignof(split::Outcome) <= alignof(long long));
  __shared__ long long out_raw[(sizeof(split::Outcome) + sizeof(long long) - 1) / sizeof(long long)];
  auto& out = *reinterpret_cast<split::Outcome*>(out_raw);
  __shared__ unsigned long long local, same_server;
  int tid = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  // profiling (DeviceSplit::run's `stamps`): thread 0's clock64 at the start and after each stage
  auto stamp = [&](int k) {
    if (stamps != nullptr && tid == 0) stamps[k] = clock64();
  };
  stamp(0);
  long long* work = global_work;
  if (use_shared) {  // the workspace, then the copy lists and servers, in shared memory
    work = smem;
    auto* lay = reinterpret_cast<int*>(smem + split::workspace_words(L));
    int* first = lay;
    int* rank = first + L.experts + 1;
    int* server = rank + L.slots;
    for (int i = tid; i <= L.experts; i += n) first[i] = L.first[i];
    for (int i = tid; i < L.slots; i += n) rank[i] = L.rank[i];
    for (int i = tid; i < L.ranks; i += n) server[i] = L.server[i];
    L.first = first, L.rank = rank, L.server = server;
  }
  if (tid == 0) negative = 0, local = 0, same_server = 0;
  __syncthreads();
  Work W(L, work);
  int G = L.ranks, E = L.experts;
  // 1. pairs per (source server, expert): every thread, a stride of experts
  if (split::count_servers(L, counts, work, tid, n) < 0) atomicOr(&negative, 1);
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
  // 2a-b. the ranks of each server (thread 0), then every expert's totals (a stride of experts)
  if (tid == 0) split::decide_begin(L, W);
  __syncthreads();
  {
    BlockAdd add{W.hdr};
    for (int e = tid; e < E; e += n) split::expert_totals(L, counts, W, e, add);
    add.flush();
  }
  __syncthreads();
  if (tid == 0) T_s = split::lower_bound(L, W);  // from the fixed loads, before the start
  stamp(2);
  // 2c. the lists in expert order: each thread a run of experts, placed by prefix sums
  int chunk = (E + n - 1) / n, lo = tid * chunk, hi = lo + chunk < E ? lo + chunk : E;
  int my_arcs = 0, my_mc = 0;
  for (int e = lo; e < hi; ++e) {
    bool copies = L.first[e + 1] - L.first[e] > 1;
    my_mc += copies;
    if (copies && W.N[e] > 0) my_arcs += split::expert_arc_count(L, e);
  }
  int n_arcs = 0, n_mc = 0;
  int at_arcs = block_exclusive_scan<Threads>(my_arcs, warp_sums, &n_arcs);
  int at_mc = block_exclusive_scan<Threads>(my_mc, warp_sums, &n_mc);
  for (int e = lo; e < hi; ++e) {
    for (int c = L.first[e]; c < L.first[e + 1]; ++c) W.sexp[c] = e;
    if (L.first[e + 1] - L.first[e] == 1) continue;
    W.mc[at_mc++] = e;
    if (W.N[e] == 0) continue;
    split::expert_arcs(L, counts, W, e, at_arcs);
    at_arcs += split::expert_arc_count(L, e);
  }
  if (tid == 0) W.hdr[split::detail::kArcs] = n_arcs, W.hdr[split::detail::kMc] = n_mc;
  for (int c = tid; c < L.slots; c += n) W.y[c] = 0, W.mark[c] = -1;
  __syncthreads();
  stamp(3);
  // 2d. the start, wave by wave
  for (int w = 0; w < waves; ++w) {
    for (int i = wave_first[w] + tid; i < wave_first[w + 1]; i += n) {
      int e = wave_expert[i];
      if (W.N[e] > 0) split::detail::start_expert(L, W, e);
    }
    __syncthreads();
  }
  stamp(4);
  for (int c = tid; c < L.slots; c += n) W.y0[c] = W.y[c];
  for (int g = tid; g < G; g += n) W.load_s[g] = W.load[g];
  __syncthreads();
  // 2e. the least max load: breadth-first rounds over the arcs, a rank claimed by its lowest arc
  constexpr long long none = 0x7fffffffffffffffLL;
  long long* claim = W.rem;
  for (;;) {
    long long T = T_s;
    if (tid == 0) go = 0, end = G;
    __syncthreads();
    int any = 0;
    for (int g = tid; g < G; g += n) {
      W.dist[g] = W.load[g] > T ? 0 : -1;
      W.pred[g] = -1;
      claim[g] = none;
      any |= W.load[g] > T;
    }
    if (any) atomicOr(&go, 1);
    __syncthreads();
    if (!go) break;
    for (long long round = 0;; ++round) {
      if (tid == 0) grew = 0;
      for (int a = tid; a < n_arcs; a += n) {
        int h = L.rank[W.arc_d[a]];
        if (W.dist[h] < 0 && split::bfs_arc(L, W, a, round)) atomicMin(&claim[h], static_cast<long long>(a));
      }
      __syncthreads();
      for (int h = tid; h < G; h += n) {
        if (claim[h] == none) continue;
        W.dist[h] = round + 1, W.pred[h] = claim[h], claim[h] = none;
        atomicOr(&grew, 1);
        if (W.load[h] < T) atomicMin(&end, h);
      }
      __syncthreads();
      if (end < G || !grew) break;
      __syncthreads();  // grew is reset for the next round after every thread has read it
    }
    if (tid == 0) T_s = split::max_load_step(L, W, T, end == G ? -1 : end);
    __syncthreads();
  }
  stamp(5);
  // 2f. the tie-breaks from the same start: successive shortest paths, each path's rounds over the
  // threads (split::least_cost says what they compute), its augmentation on thread 0
  for (int c = tid; c < L.slots; c += n) W.y[c] = W.y0[c];
  for (int g = tid; g < G; g += n) W.load[g] = W.load_s[g];
  long long const total = W.hdr[split::detail::kTotal], A = total + 1;
  if (tid == 0) {
    if (L.slack_permille > 0 && G > 0) {
      long long den = 1000LL * G;
      T_s = split::detail::lmax(T_s, (total * (1000LL + L.slack_permille) + den - 1) / den);
    }
    fault = 0;
  }
  __syncthreads();
  constexpr long long inf = split::detail::inf;
  for (long long const T = T_s;;) {
    if (tid == 0) go = 0, end = G, best = inf;
    __syncthreads();
    int any = 0;
    for (int g = tid; g < G; g += n) {
      W.dist[g] = W.ndist[g] = W.load[g] > T ? 0 : inf;
      W.pred[g] = -1;
      claim[g] = none;
      any |= W.load[g] > T;
    }
    for (int a = tid; a < n_arcs; a += n) W.cost[a] = split::arc_cost(L, W, a, A);
    if (any) atomicOr(&go, 1);
    __syncthreads();
    if (!go) break;
    // the shortest distances: Bellman-Ford rounds, each from the last round's distances
    for (int round = 0;; ++round) {
      if (tid == 0) changed = 0;
      for (int a = tid; a < n_arcs; a += n) {
        long long r = split::relaxed(L, W, a);
        if (r != inf) atomicMin(&W.ndist[L.rank[W.arc_d[a]]], r);
      }
      __syncthreads();
      for (int g = tid; g < G; g += n)
        if (W.ndist[g] < W.dist[g]) W.dist[g] = W.ndist[g], atomicOr(&changed, 1);
      __syncthreads();
      if (!changed) break;
      if (round == G) {  // still changing after G + 1 rounds: a negative cycle
        if (tid == 0) fault = 1;
        break;
      }
      __syncthreads();
    }
    if (fault) break;
    // the shortest-path tree: breadth-first over the tight arcs, a rank claimed by its lowest arc
    for (int g = tid; g < G; g += n) W.hop[g] = W.load[g] > T && W.dist[g] == 0 ? 0 : -1;
    __syncthreads();
    for (long long round = 0;; ++round) {
      if (tid == 0) grew = 0;
      for (int a = tid; a < n_arcs; a += n) {
        int h = L.rank[W.arc_d[a]];
        if (W.hop[h] < 0 && split::tree_arc(L, W, a, round)) atomicMin(&claim[h], static_cast<long long>(a));
      }
      __syncthreads();
      for (int h = tid; h < G; h += n) {
        if (claim[h] == none) continue;
        W.hop[h] = round + 1, W.pred[h] = claim[h], claim[h] = none;
        atomicOr(&grew, 1);
      }
      __syncthreads();
      if (!grew) break;
      __syncthreads();
    }
    // the cheapest rank below T (the lowest on a tie), then the augmentation on thread 0
    for (int h = tid; h < G; h += n)
      if (W.load[h] < T && W.dist[h] != inf) atomicMin(&best, W.dist[h]);
    __syncthreads();
    for (int h = tid; h < G; h += n)
      if (W.load[h] < T && W.dist[h] != inf && W.dist[h] == best) atomicMin(&end, h);
    __syncthreads();
    if (tid == 0 && (end == G || W.hop[end] <= 0 || !split::augment(L, W, T, A, end))) fault = 1;
    __syncthreads();
    if (fault) break;
  }
  if (tid == 0) {
    out = split::Outcome{};
    out.bad = fault ? 2 : 0;
    out.local = W.hdr[split::detail::kLocal];
    out.same_server = W.hdr[split::detail::kSame];
    for (int g = 0; g < G; ++g) out.max_load = split::detail::lmax(out.max_load, W.load[g]);
  }
  __syncthreads();
  stamp(6);
  if (out.bad) {
    if (tid == 0) *outcome = out;
    return;
  }
  for (int g = tid; g < G; g += n) load[g] = W.load[g];
  // 3-4. the sources of the experts with copies (a stride of rows), then their matching (a stride
  // of experts); integer sums, so the order of the atomics does not change them
  split::gather_sources(L, counts, take, work, tid, n);
  __syncthreads();
  stamp(7);
  long long l = 0, s = 0;
  split::match(L, take, work, tid, n, &l, &s);
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
  /// Entries of run()'s `stamps`.
  static constexpr int stamps_size = 9;
  /// Shared memory a block may use without an opt-in on every CUDA GPU.
  static constexpr std::size_t max_shared = 48 * 1024;

  /// `host`: the layout of a replication::BatchSplit (host pointers); copies it to the device, with
  /// the waves of the split's start. `shared_limit`: the most dynamic shared memory the kernel may
  /// use (0: what the current device allows a block with an opt-in); past 48 KiB the constructor
  /// opts the kernel in. A split whose workspace and copy lists do not fit runs from global memory.
  explicit DeviceSplit(replication::split::Layout const& host, std::size_t shared_limit = 0)
      : layout_(host),
        first_(static_cast<std::size_t>(host.experts) + 1),
        rank_(static_cast<std::size_t>(host.slots)),
        server_(static_cast<std::size_t>(host.ranks)) {
    first_.upload(host.first, first_.size());
    rank_.upload(host.rank, rank_.size());
    server_.upload(host.server, server_.size());
    layout_.first = first_.get();
    layout_.rank = rank_.get();
    layout_.server = server_.get();
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
    std::vector<int> first(static_cast<std::size_t>(waves) + 1, 0), order;
    for (int w = 0; w < waves; ++w) {
      for (int e = 0; e < host.experts; ++e)
        if (wave_of[static_cast<std::size_t>(e)] == w) order.push_back(e);
      first[static_cast<std::size_t>(w) + 1] = static_cast<int>(order.size());
    }
    waves_ = waves;
    wave_first_ = DeviceArray<int>(first.size());
    wave_first_.upload(first.data(), first.size());
    wave_expert_ = DeviceArray<int>(std::max<std::size_t>(order.size(), 1));
    if (!order.empty()) wave_expert_.upload(order.data(), order.size());
    // shared memory: the workspace, then the copy lists and servers (int)
    std::size_t lists = (static_cast<std::size_t>(host.experts) + 1 + static_cast<std::size_t>(host.slots) +
                         static_cast<std::size_t>(host.ranks)) * sizeof(int);
    std::size_t need = work_bytes() + (lists + sizeof(long long) - 1) / sizeof(long long) * sizeof(long long);
    if (shared_limit == 0) {
      int dev = 0, optin = 0;
      check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
      check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                 "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
      // leave room for the kernel's static shared variables
      shared_limit = static_cast<std::size_t>(optin) > 1024 ? static_cast<std::size_t>(optin) - 1024 : 0;
    }
    if (need <= shared_limit) {
      shared_ = need;
      if (need > max_shared)
        check_cuda(cudaFuncSetAttribute(detail::batch_split_kernel<threads>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(need)),
                   "cudaFuncSetAttribute(batch_split_kernel, MaxDynamicSharedMemorySize)");
    }
  }

  /// The number of waves the split's start runs in (the longest chain of experts with copies that
  /// share ranks, in expert order): the start's serial depth.
  [[nodiscard]] int start_waves() const { return waves_; }
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
  /// `stamps` (profiling, normally null): device memory for `stamps_size` clock64 values of thread 0,
  /// at the kernel's start and after each stage (counts, expert totals, lists, start, least max
  /// load, tie-breaks, sources, matching).
  void run(std::int32_t const* counts, std::int32_t* take, long long* load, replication::split::Outcome* outcome,
           void* workspace, cudaStream_t stream, long long* stamps = nullptr) const {
    bool shared = shared_bytes() > 0;
    check(shared || workspace != nullptr, "device batch split: the workspace (", work_bytes(),
          " bytes) does not fit in shared memory and none was given");
    launch(detail::batch_split_kernel<threads>, dim3(1), dim3(threads), shared_bytes(), stream, layout_, counts, take,
           load, outcome, static_cast<long long*>(workspace), shared ? 1 : 0, waves_, wave_first_.get(),
           wave_expert_.get(), stamps);
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
  replication::split::Layout layout_;
  DeviceArray<int> first_, rank_, server_, wave_first_, wave_expert_;
  int waves_ = 0;
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
