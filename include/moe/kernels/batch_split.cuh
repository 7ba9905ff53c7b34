#pragma once
// The per-batch replica split on the device: the split of replication::BatchSplit
// (moe/replication/batch_split.hpp) computed by one thread block from device-resident counts, so
// that a layer pass can go from the count exchange to the dispatch with no host round trip. The
// block runs the host's own code in its four stages (split::count_servers over its threads,
// split::decide on thread 0, split::gather_sources and split::match over its threads), so the result
// equals the host's bit for bit.
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

#include <cstddef>
#include <cstdint>
#include <vector>

#include "moe/config.hpp"
#include "moe/kernels/cuda_common.cuh"
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

template <int Threads>
__global__ void __launch_bounds__(Threads)
    batch_split_kernel(replication::split::Layout L, std::int32_t const* __restrict__ counts, std::int32_t* take,
                       long long* load, replication::split::Outcome* outcome, long long* global_work, int use_shared) {
  namespace split = replication::split;
  MOE_EXTERN_SHARED(long long, smem);
  __shared__ int negative;
  // raw storage: a __shared__ variable may not have a constructor (Outcome has initialisers)
  static_assert(alignof(split::Outcome) <= alignof(long long));
  __shared__ long long out_raw[(sizeof(split::Outcome) + sizeof(long long) - 1) / sizeof(long long)];
  auto& out = *reinterpret_cast<split::Outcome*>(out_raw);
  __shared__ unsigned long long local, same_server;
  long long* work = use_shared ? smem : global_work;
  int tid = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  if (tid == 0) negative = 0, local = 0, same_server = 0;
  __syncthreads();
  // 1. pairs per (source server, expert): every thread, a stride of experts
  if (split::count_servers(L, counts, work, tid, n) < 0) atomicOr(&negative, 1);
  __syncthreads();
  // 2. the loads and what each copy receives: one thread (the host's own code)
  if (tid == 0) out = split::decide(L, counts, load, work, negative ? -1 : 0);
  __syncthreads();
  if (out.bad) {
    if (tid == 0) *outcome = out;
    return;
  }
  // 3-4. the sources of the experts with copies (a stride of rows), then their matching (a stride
  // of experts); integer sums, so the order of the atomics does not change them
  split::gather_sources(L, counts, take, work, tid, n);
  __syncthreads();
  long long l = 0, s = 0;
  split::match(L, take, work, tid, n, &l, &s);
  atomicAdd(&local, static_cast<unsigned long long>(l));
  atomicAdd(&same_server, static_cast<unsigned long long>(s));
  __syncthreads();
  if (tid == 0) {
    out.local += static_cast<long long>(local);
    out.same_server += static_cast<long long>(same_server);
    *outcome = out;
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
  /// Shared memory a block may use without an opt-in on every CUDA GPU.
  static constexpr std::size_t max_shared = 48 * 1024;

  /// `host`: the layout of a replication::BatchSplit (host pointers); copies it to the device.
  explicit DeviceSplit(replication::split::Layout const& host)
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
  }

  /// The layout with device pointers.
  [[nodiscard]] replication::split::Layout const& layout() const { return layout_; }
  /// Bytes of the per-block workspace the split needs.
  [[nodiscard]] std::size_t work_bytes() const {
    return static_cast<std::size_t>(replication::split::workspace_words(layout_)) * sizeof(long long);
  }
  /// Dynamic shared memory run() uses (the workspace, when it fits), else 0.
  [[nodiscard]] std::size_t shared_bytes() const { return work_bytes() <= max_shared ? work_bytes() : 0; }
  /// Global workspace run() needs: 0 when the workspace fits in shared memory.
  [[nodiscard]] std::size_t workspace_bytes() const { return shared_bytes() ? 0 : work_bytes(); }
  /// Sizes of the outputs, in elements: take (int32), load (int64).
  [[nodiscard]] std::size_t take_size() const {
    return static_cast<std::size_t>(layout_.ranks) * static_cast<std::size_t>(layout_.slots);
  }
  [[nodiscard]] std::size_t load_size() const { return static_cast<std::size_t>(layout_.ranks); }

  /// Splits the batch whose counts (ranks x experts int32, device) are in `counts`: one kernel on
  /// `stream`, no synchronisation. `workspace`: workspace_bytes() bytes (may be null when 0).
  void run(std::int32_t const* counts, std::int32_t* take, long long* load, replication::split::Outcome* outcome,
           void* workspace, cudaStream_t stream) const {
    bool shared = shared_bytes() > 0;
    check(shared || workspace != nullptr, "device batch split: the workspace (", work_bytes(),
          " bytes) does not fit in shared memory and none was given");
    launch(detail::batch_split_kernel<threads>, dim3(1), dim3(threads), shared_bytes(), stream, layout_, counts, take,
           load, outcome, static_cast<long long*>(workspace), shared ? 1 : 0);
    check_launch("batch_split_kernel");
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
  DeviceArray<int> first_, rank_, server_;
};

}  // namespace moe::kernels::cuda
