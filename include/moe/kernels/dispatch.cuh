#pragma once
// Token permutation on the GPU (nvcc only): which rank serves each assignment, how many dispatch
// records go to each rank, the de-duplicated packing of the send buffer in the host Layer's record
// format, and on the receiving side the grouping of (record, slot) pairs by expert.
//
// Send side (tokens t < T, ranks d < R, records grouped by destination, tokens in order within a
// destination; the same order as the host Layer):
//   plan_records   one thread per token: dest[t][j] from the replica policy; rec_count[d][t] = the
//                  records token t sends to rank d (0/1 with de-duplication, else one per assignment)
//   exclusive_sum  CUB scan of rec_count laid out d-major, so rec_pos[d][t] - rec_pos[d][0] is the
//                  token's first record among those for rank d
//   send_layout    per destination: records, first record in the send buffer (back to back, or a
//                  fixed stride `cap` per destination for the padded exchange)
//   pack_records   one block per token: its records in the format of kernels/records.hpp (the
//                  metadata padded to 16 bytes, then the hidden vector in 16-byte vectors)
//
// Receive side (records back to back per source rank, or one fixed-stride region per rank):
//   recv_layout    per source: first record and count, from the exchanged counts (on the device)
//   sort_items     key = expert of each (record, slot) pair, value = record * k + slot; pairs that
//                  are not valid records get the key `experts` (sorted last). A CUB radix sort
//                  (stable) groups them by expert, records in arrival order within an expert
//   expert_offsets row range of each expert in the sorted order; tile_starts for the grouped GEMM
//   inverse        position of each (record, slot) pair in the sorted order (for the combine)
//
// Nothing here synchronises the host; every size comes from the caller's worst case.

#include <algorithm>

#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <concepts>

#include "moe/kernels/cuda_common.cuh"
#include "moe/kernels/records.hpp"
#include "moe/plan/replica_table.hpp"

namespace moe::kernels::cuda {

/// A layer's copy lists on the device: the copies of expert e are ranks[offsets[e] .. offsets[e+1])
/// (a replica table's order; ascending for other policies); primary[e] is the placement's rank.
struct DeviceCopyTable {
  int const* offsets = nullptr;
  int const* ranks = nullptr;
  int const* primary = nullptr;
};

/// The replica table on the device. Mirrors replication::Table::choose (and replication::None when
/// every expert has exactly one copy).
struct ReplicaView {
  int const* offsets = nullptr;
  int const* ranks = nullptr;
  int const* primary = nullptr;
  /// The EP layer: a copy on the token's own rank serves it. False where the source rank is not
  /// a destination (a FinDEP AG rank sending to EG indices).
  bool prefer_source = true;

  __device__ __forceinline__ int choose(int e, int source_rank, long long token) const {
    int first = offsets[e], n = offsets[e + 1] - first;
    if (n == 1) return primary[e];
    if (prefer_source)
      for (int i = 0; i < n; ++i)
        if (ranks[first + i] == source_rank) return source_rank;
    return ranks[first + static_cast<int>((source_rank + token) % n)];
  }
};

/// The device form of a replica policy (the device path of moe::Layer takes any policy that has
/// one). Specialise it for your own replication::Policy R:
///
///   template <> struct moe::kernels::cuda::DeviceReplicas<R> {
///     struct View {   // trivially copyable; passed to the dispatch kernel by value
///       __device__ int choose(int expert, int source_rank, long long token) const;
///     };
///     static View view(R const& policy, DeviceCopyTable const& copies);
///   };
///
/// `choose` must return the rank R::choose(expert, primary, source_rank, token) returns on the host.
/// The layer uploads the copy lists (replication::copy_lists: from R::holds) and hands them to
/// view(); a View may carry further values of the policy (not host pointers).
template <class Replicas>
struct DeviceReplicas;

template <>
struct DeviceReplicas<replication::Table> {
  using View = ReplicaView;
  static View view(replication::Table const&, DeviceCopyTable const& t) { return {t.offsets, t.ranks, t.primary}; }
};
template <>
struct DeviceReplicas<replication::None> {
  using View = ReplicaView;
  static View view(replication::None const&, DeviceCopyTable const& t) { return {t.offsets, t.ranks, t.primary}; }
};

/// A replica policy the device path can run: a replication::Policy with a DeviceReplicas form.
template <class R>
concept DeviceReplicaPolicy = replication::Policy<R> && requires(R const& r, DeviceCopyTable const& t) {
  typename DeviceReplicas<R>::View;
  { DeviceReplicas<R>::view(r, t) } -> std::same_as<typename DeviceReplicas<R>::View>;
};

/// Error bits the receive side raises instead of crashing (read with the device Layer's errors()).
enum DeviceError : unsigned {
  error_bad_count = 1u,   ///< a record with a count outside [1, k]
  error_bad_expert = 2u,  ///< a record naming an expert out of range or not served on this rank
};

namespace detail {

/// Token t's records per rank from the ranks serving its K assignments (d_of).
template <int K>
__device__ void token_records(int const* d_of, int t, int tokens, int ranks, bool deduplicate,
                              int* __restrict__ rec_count) {
  for (int d = 0; d < ranks; ++d) rec_count[static_cast<std::size_t>(d) * tokens + t] = 0;
#pragma unroll
  for (int j = 0; j < K; ++j) {
    bool seen = false;
    for (int q = 0; q < j; ++q) seen |= d_of[q] == d_of[j];
    if (!deduplicate || !seen) ++rec_count[static_cast<std::size_t>(d_of[j]) * tokens + t];
  }
}

template <int K, class View>
__global__ void plan_records_kernel(int const* __restrict__ ids, int tokens, int ranks, View replicas,
                                    int source_rank, long long first_token, bool deduplicate, int* __restrict__ dest,
                                    int* __restrict__ rec_count) {
  int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= tokens) return;
  int d_of[K];
#pragma unroll
  for (int j = 0; j < K; ++j) {
    d_of[j] = replicas.choose(ids[static_cast<std::size_t>(t) * K + j], source_rank, first_token + t);
    dest[static_cast<std::size_t>(t) * K + j] = d_of[j];
  }
  token_records<K>(d_of, t, tokens, ranks, deduplicate, rec_count);
}

/// rec_count from destinations chosen elsewhere (a per-batch split).
template <int K>
__global__ void count_records_kernel(int const* __restrict__ dest, int tokens, int ranks, bool deduplicate,
                                     int* __restrict__ rec_count) {
  int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= tokens) return;
  int d_of[K];
#pragma unroll
  for (int j = 0; j < K; ++j) d_of[j] = dest[static_cast<std::size_t>(t) * K + j];
  token_records<K>(d_of, t, tokens, ranks, deduplicate, rec_count);
}

__global__ void pair_index_kernel(int* __restrict__ v, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    v[i] = static_cast<int>(i);
}

__global__ void send_layout_kernel(int const* __restrict__ rec_count, int const* __restrict__ rec_pos, int tokens,
                                   int ranks, long long cap, std::uint64_t* __restrict__ send_count,
                                   long long* __restrict__ send_base) {
  int d = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (d >= ranks) return;
  long long n = 0, first = 0;
  if (tokens > 0) {
    std::size_t a = static_cast<std::size_t>(d) * tokens, z = a + tokens - 1;
    first = rec_pos[a];
    n = static_cast<long long>(rec_pos[z]) + rec_count[z] - first;
  }
  send_count[d] = static_cast<std::uint64_t>(n);
  send_base[d] = cap > 0 ? d * cap : first;
}

template <class T, int K>
__global__ void pack_records_kernel(T const* __restrict__ x, int tokens, int hidden, int const* __restrict__ ids,
                                    float const* __restrict__ weights, int const* __restrict__ dest,
                                    int const* __restrict__ rec_pos, long long const* __restrict__ send_base,
                                    bool deduplicate, std::byte* __restrict__ send, std::size_t record_bytes,
                                    std::size_t meta_bytes, bool with_payload) {
  __shared__ long long rec_s[K];
  __shared__ int nrec_s;
  int t = static_cast<int>(blockIdx.x);
  if (threadIdx.x == 0) {
    int const* dt = dest + static_cast<std::size_t>(t) * K;
    int n = 0;
    for (int j = 0; j < K; ++j) {
      int d = dt[j];
      int before = 0;  // earlier assignments of this token to the same destination
      for (int q = 0; q < j; ++q) before += dt[q] == d;
      if (deduplicate && before > 0) continue;
      std::size_t row0 = static_cast<std::size_t>(d) * tokens;
      long long r = send_base[d] + (rec_pos[row0 + t] - rec_pos[row0]) + (deduplicate ? 0 : before);
      std::byte* out = send + static_cast<std::size_t>(r) * record_bytes;
      auto* words = reinterpret_cast<std::int32_t*>(out);
      for (std::size_t w = 0; w < meta_bytes / 4; ++w) words[w] = 0;
      std::int32_t* eid = moe::detail::record_experts(out);
      float* ew = moe::detail::record_weights(out, K);
      int c = 0;
      for (int q = j; q < K; ++q) {
        if (dt[q] != d || (!deduplicate && q != j)) continue;
        eid[c] = ids[static_cast<std::size_t>(t) * K + q];
        ew[c] = weights[static_cast<std::size_t>(t) * K + q];
        ++c;
      }
      *moe::detail::record_header(out) = {t, c};
      rec_s[n++] = r;
    }
    nrec_s = n;
  }
  __syncthreads();
  if (!with_payload) return;
  constexpr int V = vec_elems<T>;
  int vecs = hidden / V;
  auto const* src = reinterpret_cast<uint4 const*>(x + static_cast<std::size_t>(t) * hidden);
  for (int i = static_cast<int>(threadIdx.x); i < vecs; i += static_cast<int>(blockDim.x)) {
    uint4 v = src[i];
    for (int q = 0; q < nrec_s; ++q)
      reinterpret_cast<uint4*>(send + static_cast<std::size_t>(rec_s[q]) * record_bytes + meta_bytes)[i] = v;
  }
}

__global__ void recv_layout_kernel(std::uint64_t const* __restrict__ recv_count, int ranks, long long cap,
                                   long long* __restrict__ recv_base, int* __restrict__ recv_n,
                                   unsigned* __restrict__ errors) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  long long at = 0;
  for (int p = 0; p < ranks; ++p) {
    long long n = static_cast<long long>(recv_count[p]);
    if (cap > 0) {
      recv_base[p] = p * cap;
      if (n > cap) {  // a peer cannot fill more than its region: it was built with other sizes
        if (errors) atomicOr(errors, error_bad_count);
        n = cap;
      }
    } else {
      recv_base[p] = at;
    }
    recv_n[p] = static_cast<int>(n);
    at += n;
  }
}

/// Whether received record slot r holds a record: its region's first slot <= r < first + count.
__device__ __forceinline__ bool slot_valid(long long r, long long const* recv_base, int const* recv_n, int ranks) {
  int lo = 0, hi = ranks;  // last p with recv_base[p] <= r
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (recv_base[mid] <= r) lo = mid; else hi = mid;
  }
  return r >= recv_base[lo] && r < recv_base[lo] + recv_n[lo];
}

template <int K>
__global__ void sort_items_kernel(std::byte const* __restrict__ recv, std::size_t record_bytes, long long slots,
                                  long long const* __restrict__ recv_base, int const* __restrict__ recv_n, int ranks,
                                  int experts, unsigned char const* __restrict__ served, int max_count,
                                  int* __restrict__ keys, int* __restrict__ values, unsigned* __restrict__ errors) {
  long long item = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= slots * K) return;
  long long r = item / K;
  int i = static_cast<int>(item % K);
  int key = experts;
  if (slot_valid(r, recv_base, recv_n, ranks)) {
    std::byte const* rec = recv + static_cast<std::size_t>(r) * record_bytes;
    int count = moe::detail::record_header(rec)->count;
    if (count < 1 || count > max_count) {  // max_count <= K
      if (i == 0) atomicOr(errors, error_bad_count);
    } else if (i < count) {
      int e = moe::detail::record_experts(rec)[i];
      if (e >= 0 && e < experts && served[e]) {
        key = e;
      } else {
        atomicOr(errors, error_bad_expert);
      }
    }
  }
  keys[item] = key;
  values[item] = static_cast<int>(item);
}

__global__ void expert_offsets_kernel(int const* __restrict__ sorted_keys, long long n, int experts,
                                      int* __restrict__ offsets) {
  int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (e > experts) return;
  long long lo = 0, hi = n;  // first index with key >= e
  while (lo < hi) {
    long long mid = (lo + hi) / 2;
    if (sorted_keys[mid] < e) lo = mid + 1; else hi = mid;
  }
  offsets[e] = static_cast<int>(lo);
}

inline constexpr int tile_starts_threads = 256;

/// starts[g] = sum over g' < g of ceil(rows of g' / tile_m); one block, chunks of 256 groups.
__global__ void __launch_bounds__(tile_starts_threads)
    tile_starts_kernel(int const* __restrict__ offsets, int groups, int tile_m, int* __restrict__ starts) {
  using Scan = cub::BlockScan<int, tile_starts_threads>;
  __shared__ typename Scan::TempStorage scratch;
  __shared__ int carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int base = 0; base < groups; base += tile_starts_threads) {
    int g = base + static_cast<int>(threadIdx.x);
    int tiles = g < groups ? (offsets[g + 1] - offsets[g] + tile_m - 1) / tile_m : 0;
    int before = 0, chunk = 0;
    Scan(scratch).ExclusiveSum(tiles, before, chunk);
    if (g < groups) starts[g] = carry + before;
    __syncthreads();  // every thread has read `carry`; `scratch` may be reused
    if (threadIdx.x == 0) carry += chunk;
    __syncthreads();
  }
  if (threadIdx.x == 0) starts[groups] = carry;
}

__global__ void inverse_kernel(int const* __restrict__ sorted_values, int const* __restrict__ offsets, int experts,
                               int* __restrict__ position) {
  int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= offsets[experts]) return;
  position[sorted_values[i]] = i;
}

}  // namespace detail

// -------------------------------------------------------------------------------------------------
// Host launchers. All take a stream and enqueue only; sizes in records unless named bytes.
// -------------------------------------------------------------------------------------------------

/// dest (T x K) and rec_count (R x T, d-major) for `tokens` routed tokens.
template <int K, class View = ReplicaView>
void plan_records(cudaStream_t s, int const* ids, int tokens, int ranks, View replicas, int source_rank,
                  long long first_token, bool deduplicate, int* dest, int* rec_count) {
  if (tokens == 0) return;
  launch(detail::plan_records_kernel<K, View>, static_cast<unsigned>(blocks_for(tokens, 128)), 128, 0, s, ids, tokens, ranks,
         replicas, source_rank, first_token, deduplicate, dest, rec_count);
  check_launch("plan_records_kernel");
}

/// rec_count (R x T, d-major) for `tokens` tokens whose destinations are already in dest (T x K).
template <int K>
void count_records(cudaStream_t s, int const* dest, int tokens, int ranks, bool deduplicate, int* rec_count) {
  if (tokens == 0) return;
  launch(detail::count_records_kernel<K>, static_cast<unsigned>(blocks_for(tokens, 128)), 128, 0, s, dest, tokens,
         ranks, deduplicate, rec_count);
  check_launch("count_records_kernel");
}

/// Bytes of CUB scratch exclusive_sum needs for up to n items.
inline std::size_t exclusive_sum_bytes(long long n) {
  std::size_t bytes = 0;
  check_cuda(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<int const*>(nullptr),
                                           static_cast<int*>(nullptr), static_cast<int>(n)),
             "cub::DeviceScan::ExclusiveSum (size query)");
  return bytes;
}

inline void exclusive_sum(cudaStream_t s, void* temp, std::size_t temp_bytes, int const* in, int* out, long long n) {
  if (n == 0) return;
  check_cuda(cub::DeviceScan::ExclusiveSum(temp, temp_bytes, in, out, static_cast<int>(n), s),
             "cub::DeviceScan::ExclusiveSum");
}

/// send_count[d] (records) and send_base[d] (first record) per destination. cap > 0: fixed stride.
inline void send_layout(cudaStream_t s, int const* rec_count, int const* rec_pos, int tokens, int ranks, long long cap,
                        std::uint64_t* send_count, long long* send_base) {
  launch(detail::send_layout_kernel, static_cast<unsigned>(blocks_for(ranks, 128)), 128, 0, s, rec_count, rec_pos,
         tokens, ranks, cap, send_count, send_base);
  check_launch("send_layout_kernel");
}

/// Writes every record of every token into `send` (record_bytes apart, payload after meta_bytes).
/// `with_payload` false writes the metadata only (one GPU: the experts read the tokens from x).
template <class T, int K>
void pack_records(cudaStream_t s, T const* x, int tokens, int hidden, int const* ids, float const* weights,
                  int const* dest, int const* rec_pos, long long const* send_base, bool deduplicate, std::byte* send,
                  std::size_t record_bytes, std::size_t meta_bytes, bool with_payload = true) {
  if (tokens == 0) return;
  launch(detail::pack_records_kernel<T, K>, static_cast<unsigned>(tokens), 128, 0, s, x, tokens, hidden, ids, weights,
         dest, rec_pos, send_base, deduplicate, send, record_bytes, meta_bytes, with_payload);
  check_launch("pack_records_kernel");
}

/// recv_base and recv_n per source from the exchanged counts. cap > 0: fixed stride regions.
/// `errors` (optional): raises error_bad_count when a peer announces more records than its padded
/// region holds (cap > 0); the count is cut to the region either way.
inline void recv_layout(cudaStream_t s, std::uint64_t const* recv_count, int ranks, long long cap, long long* recv_base,
                        int* recv_n, unsigned* errors = nullptr) {
  launch(detail::recv_layout_kernel, 1, 1, 0, s, recv_count, ranks, cap, recv_base, recv_n, errors);
  check_launch("recv_layout_kernel");
}

/// Bits of the sort key for `experts` experts plus the sentinel `experts`.
constexpr int expert_key_bits(int experts) {
  int b = 1;
  while ((1 << b) <= experts) ++b;
  return b;
}

/// Bytes of CUB scratch for sorting up to n (record, slot) pairs.
inline std::size_t sort_items_bytes(long long n, int experts) {
  std::size_t bytes = 0;
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<int const*>(nullptr), static_cast<int*>(nullptr),
                                             static_cast<int const*>(nullptr), static_cast<int*>(nullptr),
                                             static_cast<int>(n), 0, expert_key_bits(experts)),
             "cub::DeviceRadixSort::SortPairs (size query)");
  return bytes;
}

/// Buffers of the receive-side grouping; each holds `slots * K` items (offsets: experts + 1,
/// tile_starts: experts + 1).
struct ExpertGrouping {
  int* keys = nullptr;
  int* values = nullptr;
  int* sorted_keys = nullptr;
  int* sorted_values = nullptr;  ///< (record * K + slot) in expert order: the grouped GEMM's rows
  int* position = nullptr;       ///< inverse of sorted_values
  int* offsets = nullptr;        ///< rows of expert e: [offsets[e], offsets[e+1])
  int* tile_starts = nullptr;    ///< first GEMM row tile of each expert
  void* temp = nullptr;
  std::size_t temp_bytes = 0;
};

/// Groups the (record, slot) pairs of `slots` received record slots by expert (see the file comment).
/// A record naming more than `max_count` (1..K) experts raises error_bad_count and is dropped, so
/// at most slots * max_count pairs are valid (the rows the expert GEMMs write).
template <int K>
void group_by_expert(cudaStream_t s, std::byte const* recv, std::size_t record_bytes, long long slots,
                     long long const* recv_base, int const* recv_n, int ranks, int experts,
                     unsigned char const* served, int tile_m, ExpertGrouping const& g, unsigned* errors,
                     int max_count = K) {
  check(max_count >= 1 && max_count <= K, "group_by_expert: max_count = ", max_count, " outside [1, ", K, "]");
  long long n = slots * K;
  if (n > 0) {
    launch(detail::sort_items_kernel<K>, static_cast<unsigned>(blocks_for(n, 256)), 256, 0, s, recv, record_bytes,
           slots, recv_base, recv_n, ranks, experts, served, max_count, g.keys, g.values, errors);
    check_launch("sort_items_kernel");
    std::size_t temp_bytes = g.temp_bytes;
    check_cuda(cub::DeviceRadixSort::SortPairs(g.temp, temp_bytes, g.keys, g.sorted_keys, g.values, g.sorted_values,
                                               static_cast<int>(n), 0, expert_key_bits(experts), s),
               "cub::DeviceRadixSort::SortPairs");
  }
  launch(detail::expert_offsets_kernel, static_cast<unsigned>(blocks_for(experts + 1, 128)), 128, 0, s, g.sorted_keys,
         n, experts, g.offsets);
  check_launch("expert_offsets_kernel");
  launch(detail::tile_starts_kernel, 1, detail::tile_starts_threads, 0, s, g.offsets, experts, tile_m, g.tile_starts);
  check_launch("tile_starts_kernel");
  if (n > 0) {
    launch(detail::inverse_kernel, static_cast<unsigned>(blocks_for(n, 256)), 256, 0, s, g.sorted_values, g.offsets,
           experts, g.position);
    check_launch("inverse_kernel");
  }
}

/// One rank's `n` pairs (expert ids, token-major) in expert order, token order within an expert
/// (a stable CUB radix sort of the pair indices by expert): sorted_keys / sorted_values (the pair
/// indices), and offsets (experts + 1) where each expert's pairs start. `values` is scratch of n;
/// temp: sort_items_bytes(n, experts) bytes.
inline void order_by_expert(cudaStream_t s, int const* ids, long long n, int experts, int* values, int* sorted_keys,
                            int* sorted_values, int* offsets, void* temp, std::size_t temp_bytes) {
  if (n > 0) {
    launch(detail::pair_index_kernel, static_cast<unsigned>(std::min<long long>(blocks_for(n, 256), 1024)), 256, 0, s,
           values, n);
    check_launch("pair_index_kernel");
    std::size_t bytes = temp_bytes;
    check_cuda(cub::DeviceRadixSort::SortPairs(temp, bytes, ids, sorted_keys, values, sorted_values,
                                               static_cast<int>(n), 0, expert_key_bits(experts), s),
               "cub::DeviceRadixSort::SortPairs (order_by_expert)");
  }
  launch(detail::expert_offsets_kernel, static_cast<unsigned>(blocks_for(experts + 1, 128)), 128, 0, s, sorted_keys, n,
         experts, offsets);
  check_launch("expert_offsets_kernel");
}

namespace detail {
__global__ void count_loads_kernel(int const* __restrict__ ids, int const* __restrict__ dest, long long pairs,
                                   int experts, int first_rank, int* __restrict__ counts) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < pairs;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    atomicAdd(&counts[ids[i]], 1);
    atomicAdd(&counts[experts + first_rank + dest[i]], 1);
  }
}
__global__ void count_rank_kernel(int const* __restrict__ dest, long long pairs, int rank,
                                  unsigned long long* __restrict__ out) {
  unsigned long long n = 0;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < pairs;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    n += dest[i] == rank;
  for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
  if ((threadIdx.x & 31) == 0 && n != 0) atomicAdd(out, n);
}
}  // namespace detail

/// *out = the pairs of `pairs` whose destination (dest) is `rank`: a layer pass's local assignments.
inline void count_rank(cudaStream_t s, int const* dest, long long pairs, int rank, std::uint64_t* out) {
  static_assert(sizeof(std::uint64_t) == sizeof(unsigned long long));
  check_cuda(cudaMemsetAsync(out, 0, sizeof(std::uint64_t), s), "cudaMemsetAsync");
  if (pairs == 0) return;
  int blocks = static_cast<int>(std::min<long long>((pairs + 255) / 256, 256));
  launch(detail::count_rank_kernel, static_cast<unsigned>(blocks), 256, 0, s, dest, pairs, rank,
         reinterpret_cast<unsigned long long*>(out));
  check_launch("count_rank_kernel");
}

/// The load window's counts of one pass (moe/layer/live.hpp): counts[e] = the pairs of expert e,
/// counts[experts + first_rank + d] = the pairs served by destination d, from the routes (ids) and
/// destinations (dest) of `pairs` token-expert pairs. `first_rank`: the rank of destination 0 (the
/// disaggregated paths' EG index 0 is rank ag). Zeroes the `experts + ranks` counters first.
inline void count_loads(cudaStream_t s, int const* ids, int const* dest, long long pairs, int experts, int ranks,
                        int* counts, int first_rank = 0) {
  check_cuda(cudaMemsetAsync(counts, 0, static_cast<std::size_t>(experts + ranks) * sizeof(int), s), "cudaMemsetAsync");
  if (pairs == 0) return;
  int blocks = static_cast<int>(std::min<long long>((pairs + 255) / 256, 1024));
  launch(detail::count_loads_kernel, static_cast<unsigned>(blocks), 256, 0, s, ids, dest, pairs, experts, first_rank,
         counts);
  check_launch("count_loads_kernel");
}

}  // namespace moe::kernels::cuda
