// The per-batch split over an engine's slots, on the device: for an engine (SGLang, vLLM, or a C++
// one) that keeps its own MoE layer and wants each batch's pairs spread over the expert copies its
// plan (phy2log) already holds, with no host round trip.
//
// Per layer and batch, on one stream, in the order an engine's forward pass has them:
//   count(ids)          this rank's row of counts (experts int32) from its top-k ids;
//   (the engine all-gathers the rows: gpus x experts int32, rank-major, e.g. torch.distributed's
//    all_gather_into_tensor)
//   plan(counts)        the split (kernels::cuda::DeviceSplit: one block), the same on every rank;
//   dispatch(ids, out)  each of this rank's pairs -> the physical slot (the engine's physical expert
//                       id, an index into phy2log) that serves it: the m-th pair of expert e in token
//                       order goes where the split sends this rank's m-th pair of e.
// None of them synchronises or copies to the host, so a pass can be captured in a CUDA graph.
// Ids outside [0, experts) are pairs of no expert (SGLang pads with -1): count() leaves them out
// and dispatch() writes -1 for them. The host binding (moe_compose.BatchSplit) does the same for
// -1 and refuses other ids with a message, as it refuses a dispatch whose ids do not match the
// counts planned; the device cannot report either without a synchronisation. In the latter case
// the pairs beyond a copy's share go to the expert's last copy (split::dealt), still a slot holding
// their expert.
//
// The result equals the host's replication::EngineSlots + BatchSplit (plan_batch, then deal and
// slot_of) bit for bit: tests/cuda/test_batch_split_cuda.cu, on the emulator in CI.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "moe/config.hpp"
#include "moe/kernels/batch_split.cuh"
#include "moe/kernels/cuda_common.cuh"
#include "moe/kernels/dispatch.cuh"
#include "moe/replication/engine_slots.hpp"

namespace moe::kernels::cuda {

namespace detail {

template <class Id>
__global__ void slot_counts_kernel(Id const* __restrict__ ids, long long n, int experts, std::int32_t* __restrict__ row) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    Id e = ids[i];
    if (e >= 0 && e < experts) atomicAdd(&row[static_cast<int>(e)], 1);
  }
}

/// keys[i] = ids[i] when it names an expert, else `experts` (sorted after every expert).
template <class Id>
__global__ void slot_keys_kernel(Id const* __restrict__ ids, long long n, int experts, int* __restrict__ keys) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    Id e = ids[i];
    keys[i] = e >= 0 && e < experts ? static_cast<int>(e) : experts;
  }
}

template <class Out>
__global__ void deal_slots_kernel(SplitView v, int rank, int const* __restrict__ sorted_keys,
                                  int const* __restrict__ sorted_values, int const* __restrict__ offsets, long long n,
                                  int const* __restrict__ slot_of, Out* __restrict__ out) {
  int const E = v.layout.experts, G = v.layout.ranks;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    int e = sorted_keys[i];
    int p = sorted_values[i];
    if (e >= E) {
      out[p] = static_cast<Out>(-1);
      continue;
    }
    int g = v.dealt(e, rank, i - offsets[e]);
    out[p] = static_cast<Out>(slot_of[static_cast<long long>(e) * G + g]);
  }
}

__global__ void outcome_words_kernel(replication::split::Outcome const* o, std::int64_t* words) {
  words[0] = o->max_load;
  words[1] = o->local;
  words[2] = o->same_server;
  words[3] = o->bad;
}

}  // namespace detail

/// One layer's split over an engine's slots, and its device buffers. Not for concurrent calls from
/// several streams: plan() and dispatch() share the object's scratch.
class DeviceSlotSplit {
public:
  /// `slots`: the layer's phy2log read by replication::EngineSlots. `max_pairs`: the most pairs
  /// (tokens x top-k, padding included) one dispatch() takes: the sort's buffers are sized for it
  /// here, once. `slack_permille`: split::Layout's balance slack (0: the least max load).
  DeviceSlotSplit(replication::EngineSlots const& slots, long long max_pairs, long long slack_permille = 0)
      : DeviceSlotSplit(slots, slots.split(slack_permille), max_pairs) {}

  [[nodiscard]] int gpus() const { return split_.layout().ranks; }
  [[nodiscard]] int experts() const { return split_.layout().experts; }
  [[nodiscard]] long long max_pairs() const { return max_pairs_; }
  /// The split kernel and its layout (device pointers).
  [[nodiscard]] DeviceSplit const& split() const { return split_; }

  /// This rank's row of the counts (experts int32, overwritten) from its `n` top-k ids (token-major;
  /// int32 or int64): the pairs of each expert, ids outside [0, experts) left out.
  template <class Id>
  void count(Id const* ids, long long n, std::int32_t* row, cudaStream_t stream) const {
    static_assert(std::is_same_v<Id, std::int32_t> || std::is_same_v<Id, std::int64_t>, "top-k ids are int32 or int64");
    check(n >= 0, "device slot split: count of ", n, " pairs");
    check_cuda(cudaMemsetAsync(row, 0, static_cast<std::size_t>(experts()) * sizeof(std::int32_t), stream),
               "cudaMemsetAsync (slot split counts)");
    if (n == 0) return;
    launch(detail::slot_counts_kernel<Id>, grid(n), 256, 0, stream, ids, n, experts(), row);
    check_launch("slot_counts_kernel");
  }

  /// Splits the batch of `counts` (gpus x experts int32, device, rank-major: every rank's row from
  /// count()). One kernel; the take, the loads and the outcome stay on the device (load(),
  /// outcome()) for dispatch() and for whoever wants to read them.
  void plan(std::int32_t const* counts, cudaStream_t stream) {
    split_.run(counts, take_.get(), load_.get(), outcome_.get(), work_.get(), stream);
  }

  /// This rank's `n` top-k ids (token-major, int32 or int64, at most max_pairs()) -> `physical`
  /// (n entries, int32 or int64): the slot serving each pair under the last plan(), -1 for ids
  /// outside [0, experts). `rank`: the row of the counts these ids were counted into.
  template <class Id, class Out>
  void dispatch(int rank, Id const* ids, long long n, Out* physical, cudaStream_t stream) {
    static_assert(std::is_same_v<Id, std::int32_t> || std::is_same_v<Id, std::int64_t>, "top-k ids are int32 or int64");
    static_assert(std::is_same_v<Out, std::int32_t> || std::is_same_v<Out, std::int64_t>,
                  "physical ids are int32 or int64");
    check(rank >= 0 && rank < gpus(), "device slot split: dispatch for rank ", rank, ", outside [0, ", gpus(), ")");
    check(n >= 0 && n <= max_pairs_, "device slot split: dispatch of ", n, " pairs; this split was built for at most ",
          max_pairs_);
    if (n == 0) return;
    int keys_experts = experts() + 1;  // the experts, then one key for the pairs of none
    launch(detail::slot_keys_kernel<Id>, grid(n), 256, 0, stream, ids, n, experts(), keys_.get());
    check_launch("slot_keys_kernel");
    order_by_expert(stream, keys_.get(), n, keys_experts, values_.get(), sorted_keys_.get(), sorted_values_.get(),
                    offsets_.get(), temp_.get(), temp_.size());
    launch(detail::deal_slots_kernel<Out>, grid(n), 256, 0, stream, split_.view(take_.get()), rank, sorted_keys_.get(),
           sorted_values_.get(), offsets_.get(), n, slot_of_.get(), physical);
    check_launch("deal_slots_kernel");
  }

  /// The last plan's pairs received per GPU (gpus int64, device).
  [[nodiscard]] long long const* load() const { return load_.get(); }
  /// The last plan's outcome (device): max_load, local, same_server; bad != 0 on negative counts.
  [[nodiscard]] replication::split::Outcome const* outcome() const { return outcome_.get(); }
  /// The last plan's outcome as four int64 words (max_load, local, same_server, bad) into `words`
  /// (device), on `stream`: for callers that do not share the Outcome struct's layout.
  void outcome_words(std::int64_t* words, cudaStream_t stream) const {
    launch(detail::outcome_words_kernel, 1, 1, 0, stream, outcome_.get(), words);
    check_launch("outcome_words_kernel");
  }
  /// The last plan's take (gpus x copy slots int32, device; split::dealt's form).
  [[nodiscard]] std::int32_t const* take() const { return take_.get(); }

private:
  DeviceSlotSplit(replication::EngineSlots const& slots, replication::BatchSplit const& host, long long max_pairs)
      : split_(host.layout()),
        max_pairs_(max_pairs),
        slot_of_(slots.slot_table().size()),
        take_(std::max<std::size_t>(split_.take_size(), 1)),
        load_(split_.load_size()),
        outcome_(1),
        work_(split_.workspace_bytes()) {
    check(max_pairs >= 1 && max_pairs <= INT_MAX, "device slot split: max_pairs must be in [1, ", INT_MAX, "], got ",
          max_pairs);
    slot_of_.upload(slots.slot_table().data(), slots.slot_table().size());
    auto n = static_cast<std::size_t>(max_pairs);
    keys_ = DeviceArray<int>(n);
    values_ = DeviceArray<int>(n);
    sorted_keys_ = DeviceArray<int>(n);
    sorted_values_ = DeviceArray<int>(n);
    offsets_ = DeviceArray<int>(static_cast<std::size_t>(experts()) + 2);
    temp_ = DeviceArray<unsigned char>(std::max<std::size_t>(sort_items_bytes(max_pairs, experts() + 1), 1));
  }
  static unsigned grid(long long n) { return static_cast<unsigned>(std::min<long long>(blocks_for(n, 256), 1024)); }

  DeviceSplit split_;
  long long max_pairs_ = 0;
  DeviceArray<int> slot_of_;
  DeviceArray<std::int32_t> take_;
  DeviceArray<long long> load_;
  DeviceArray<replication::split::Outcome> outcome_;
  DeviceArray<unsigned char> work_;
  DeviceArray<int> keys_, values_, sorted_keys_, sorted_values_, offsets_;
  DeviceArray<unsigned char> temp_;
};

}  // namespace moe::kernels::cuda
