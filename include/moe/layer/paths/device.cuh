#pragma once
// The device execution path of moe::Layer (moe/layer/layer.hpp; nvcc only): a device-memory
// collective (collective::SingleGpu, collective::Nccl) and schedule::Sequential, built from the kernels in
// moe/kernels/*.cuh. Same protocol as the host path (moe/layer/host.hpp):
//
//   using L = moe::Layer<Model, Router, placement::Table, replication::None, schedule::Sequential, collective::SingleGpu>;
//   L layer(gpu, placement, replicas, device_weights, {.max_tokens = 4096});
//   void* ws; cudaMalloc(&ws, layer.workspace_size());             // caller-owned device scratch
//   layer.run({.tokens = n, .x = x, .y = y, .stream = s}, {static_cast<std::byte*>(ws), bytes});
//
// Policies: any router::Policy with a device form (kernels::cuda::DeviceRouter, gate.cuh; the three
// routers of router/router.hpp have one) and any replication::Policy with a device form
// (kernels::cuda::DeviceReplicas, dispatch.cuh; None and Table have one). A user specialises the
// trait for their own policy; a policy without one is a compile-time error naming the trait.
// replication::BatchSplit, the per-batch split, is dealt from each pass's split instead (see
// plan_split: counts, an all-gather on the device, kernels::cuda::DeviceSplit, a stable sort of the
// pairs by expert, the deal), with no host synchronisation.
//
// Weights, x and y are device pointers (LayerWeights as for the host layer, PyTorch layout).
// Results follow the host reference: same routes (ties to the lower index), same record format and
// de-duplication, fp32 accumulation, SwiGLU intermediate rounded to storage precision. Two
// roundings differ from the host Layer: a routed expert's output is stored in storage precision
// before the weighted sum of a record (the host keeps it in fp32), and sums run in another order.
//
// Collectives (by capability, collective/concept.hpp):
//   a Communicator without collective::Exchange (collective::SingleGpu): world size 1, no
//                         communication: the send buffer is the receive buffer, and records carry
//                         metadata only (the experts read the token rows from x).
//   collective::Exchange + StreamOrdered (collective::Nccl), with one of two exchanges
//                         (Options::device.exchange):
//     Exchange::exact     counts first (a fixed-size all_to_all on the device), then ONE host
//                         synchronisation: the counts are copied to pinned host memory and the
//                         stream is synchronised, because all_to_all_v needs byte counts on the host.
//                         Then records and partials move with all_to_all_v of exactly their size.
//                         This is the only host sync in a forward pass; it makes run() not
//                         graph-capturable.
//     Exchange::padded    no host synchronisation, graph-capturable: every rank sends every peer a
//                         fixed region of worst-case size (max_tokens records with de-duplication,
//                         max_tokens * min(top_k, most experts one rank holds) without) with a
//                         plain all_to_all; the real counts travel
//                         in a separate 8-byte-per-peer all_to_all and only the device reads them.
//                         Costs bandwidth: each region is sent whole. So the host never learns the
//                         counts during a pass, and LayerStats' record counts and local_assignments
//                         stay 0; with Options::device.count_records each pass keeps them on the
//                         device and Layer::read_record_counts() reads them afterwards (the exact
//                         exchange reads them with its counts; on one GPU every pair is local).
//
// Everything the kernels need is carved from the caller's workspace (worst case from
// max_tokens); the layer itself owns only small tables uploaded at construction (expert weight
// pointers, replica lists, the served-expert mask), a cuBLAS handle, an error word, a pinned
// count buffer, and (for shapes with shared experts) a second stream with two events: the shared
// experts run there, forked from the caller's stream at the start of run() and joined back before
// the final sum, so they overlap routing, dispatch and the routed experts (graph capture follows
// the fork and join). With replication::BatchSplit a third stream and two events do the same for
// the sort of this rank's pairs by expert, which needs only the routing: it overlaps the count
// exchange and the split kernel, and the deal waits for both.
//
// The ranks' agreement on a pass (moe::Layer::run): every rank's 256-byte vote goes through the
// collective's all_gather_v on device memory, is copied to pinned host memory and read after one
// stream synchronisation, before anything of the pass is enqueued. On one GPU, and while the
// stream is being captured into a CUDA graph, there is no agreement step (nothing to wait for, or
// the host cannot wait): the rank checks alone.

#include <cublas_v2.h>

#include <algorithm>
#include <concepts>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/core/workspace.hpp"
#include "moe/kernels/batch_split.cuh"
#include "moe/kernels/combine.cuh"
#include "moe/kernels/cuda_common.cuh"
#include "moe/kernels/dispatch.cuh"
#include "moe/kernels/gate.cuh"
#include "moe/kernels/grouped_gemm.cuh"
#include "moe/layer/expert_ffn.cuh"
#include "moe/layer/layer.hpp"
#include "moe/kernels/records.hpp"

namespace moe {

namespace detail {
/// The device agreement of moe::Layer (see the file comment): gathers `mine` from every rank into
/// `votes` through device memory (`dev`: ranks + 1 votes; `host`: pinned, ranks votes). Returns
/// false, gathering nothing, on one rank or while `s` is being captured.
template <class Comm>
bool gather_votes_device(Comm& comm, cudaStream_t s, Vote const& mine, std::span<Vote> votes, Vote* dev, Vote* host) {
  namespace kc = kernels::cuda;
  if constexpr (!collective::Exchange<Comm>) {
    return false;
  } else {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    kc::check_cuda(cudaStreamIsCapturing(s, &capturing), "cudaStreamIsCapturing");
    if (capturing != cudaStreamCaptureStatusNone) return false;
    auto n = votes.size();
    host[0] = mine;  // staged through the pinned buffer's first slot, overwritten by the gather
    kc::check_cuda(cudaMemcpyAsync(dev + n, host, sizeof(Vote), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (vote)");
    std::vector<std::size_t> bytes(n, sizeof(Vote));
    comm.set_stream(s);
    comm.all_gather_v(std::as_bytes(std::span<Vote const>(dev + n, 1)), std::as_writable_bytes(std::span(dev, n)),
                      bytes);
    kc::check_cuda(cudaMemcpyAsync(host, dev, n * sizeof(Vote), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync (votes)");
    kc::check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize (votes)");
    std::copy(host, host + n, votes.begin());
    return true;
  }
}

/// The device memory of the agreement: ranks + 1 votes on the device, ranks pinned on the host.
struct DeviceVotes {
  kernels::cuda::DeviceArray<Vote> dev;
  kernels::cuda::PinnedArray<Vote> host;
  explicit DeviceVotes(int ranks = 0) {
    if (ranks > 1) {
      dev = kernels::cuda::DeviceArray<Vote>(static_cast<std::size_t>(ranks) + 1);
      host = kernels::cuda::PinnedArray<Vote>(static_cast<std::size_t>(ranks));
    }
  }
};

/// The device paths' load window (moe/layer/live.hpp): each pass's rows of every rank are gathered
/// on the device and copied to pinned host memory on the pass's stream; take() waits for that copy
/// and hands the rows over once. The front takes them on the next pass, after the agreement's
/// synchronisation (no host round trip of its own), or when the caller asks for the window.
class DeviceLoadRows {
public:
  DeviceLoadRows() = default;
  /// `counts`: ranks x (experts + ranks), the gathered rows.
  explicit DeviceLoadRows(std::size_t counts) : host_(counts), ready_(kernels::cuda::make_event()) {}

  /// A pass with a load window cannot be captured into a CUDA graph: `who` names the layer.
  static Status check_not_captured(char const* who, cudaStream_t s) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    kernels::cuda::check_cuda(cudaStreamIsCapturing(s, &capturing), "cudaStreamIsCapturing");
    if (capturing == cudaStreamCaptureStatusNone) return {};
    return {false, detail::concat(who, ": load windows and re-planning (LayerOptions::live) need the ranks' agreement "
                                       "on every pass, which a CUDA graph capture skips; capture a layer without them")};
  }

  /// Gathers every rank's `mine` (device) into `gathered` (device) on `s`, then starts the copy to
  /// the host. Without collective::Exchange (one GPU) this rank's row is the gathered one.
  template <class Comm>
  void gather(Comm& comm, cudaStream_t s, std::span<std::int32_t const> mine, std::span<std::int32_t> gathered) {
    namespace kc = kernels::cuda;
    auto n = gathered.size();
    if constexpr (collective::Exchange<Comm>) {
      comm.set_stream(s);
      comm.all_gather_v(std::as_bytes(mine), std::as_writable_bytes(gathered),
                        std::vector<std::size_t>(static_cast<std::size_t>(comm.size()), mine.size_bytes()));
    } else {
      kc::check_cuda(cudaMemcpyAsync(gathered.data(), mine.data(), n * sizeof(std::int32_t), cudaMemcpyDeviceToDevice, s),
                     "cudaMemcpyAsync (load counts)");
    }
    kc::check_cuda(cudaMemcpyAsync(host_.get(), gathered.data(), n * sizeof(std::int32_t), cudaMemcpyDeviceToHost, s),
                   "cudaMemcpyAsync (load counts)");
    kc::check_cuda(cudaEventRecord(ready_.get(), s), "cudaEventRecord (load counts)");
    pending_ = n;
  }
  /// The rows of the last gather() not taken yet (waits for their copy), else none.
  std::span<std::int32_t const> take() {
    if (pending_ == 0) return {};
    kernels::cuda::check_cuda(cudaEventSynchronize(ready_.get()), "cudaEventSynchronize (load counts)");
    std::size_t n = pending_;
    pending_ = 0;
    return {host_.get(), n};
  }

private:
  kernels::cuda::PinnedArray<std::int32_t> host_;
  kernels::cuda::OwnedEvent ready_;  // the copy to host_ is complete
  std::size_t pending_ = 0;          // counts gathered and not taken yet
};
/// What the front's re-planning asks of a device path (both device executors derive from it): the
/// weights move in device memory on the stream of the last pass, after that pass's work, through
/// the collective (every rank of it takes part in each chunk, one that moves nothing with no
/// bytes). The executor sets `stream_` on every pass. A pass on another stream sees these copies
/// done only if the caller orders its passes (as the workspace needs them ordered anyway). Without
/// collective::Exchange (one GPU) the collective calls are no-ops: nothing crosses ranks.
template <class Comm>
class DeviceMigration {
public:
  /// Migration copies (device memory on both sides), on the stream of the last pass.
  void copy_bytes(std::byte* to, std::byte const* from, std::size_t n) {
    kernels::cuda::check_cuda(cudaMemcpyAsync(to, from, n, cudaMemcpyDeviceToDevice, stream_),
                              "cudaMemcpyAsync (migration)");
  }
  /// attach_arena: a rank's experts into the arena (outside any pass: synchronous).
  template <class T>
  void copy_in(T* to, T const* from, std::size_t n) {
    kernels::cuda::check_cuda(cudaMemcpy(to, from, n * sizeof(T), cudaMemcpyDeviceToDevice), "cudaMemcpy (arena)");
  }
  /// One chunk of the moves: one all-to-all-v of device memory.
  void exchange_bytes(std::span<std::byte const> send, std::span<std::size_t const> send_bytes,
                      std::span<std::byte> recv, std::span<std::size_t const> recv_bytes) {
    if constexpr (collective::Exchange<Comm>) {
      comm_->set_stream(stream_);
      comm_->all_to_all_v(send, send_bytes, recv, recv_bytes);
    }
  }
  /// Host memory in and out: every rank's `bytes[r]` bytes (`mine` from this rank) into `out`, in
  /// rank order, staged through the device buffers `stage_send` / `stage_recv` (the front's
  /// migration buffers) on the last pass's stream; synchronises it (the front's plan sharing, once
  /// per re-plan, in passes that cannot be captured).
  void gather_bytes(std::span<std::byte const> mine, std::span<std::size_t const> bytes, std::span<std::byte> out,
                    std::span<std::byte> stage_send, std::span<std::byte> stage_recv) {
    if constexpr (collective::Exchange<Comm>) {
      namespace kc = kernels::cuda;
      check(mine.size() <= stage_send.size() && out.size() <= stage_recv.size(), who_, ": gather_bytes: ",
            mine.size(), " and ", out.size(), " bytes do not fit the staging buffers of ", stage_send.size(), " and ",
            stage_recv.size());
      if (!mine.empty())
        kc::check_cuda(cudaMemcpyAsync(stage_send.data(), mine.data(), mine.size(), cudaMemcpyHostToDevice, stream_),
                       "cudaMemcpyAsync (plan layout up)");
      comm_->set_stream(stream_);
      comm_->all_gather_v(stage_send.first(mine.size()), stage_recv.first(out.size()), bytes);
      kc::check_cuda(cudaMemcpyAsync(out.data(), stage_recv.data(), out.size(), cudaMemcpyDeviceToHost, stream_),
                     "cudaMemcpyAsync (plan layout down)");
      kc::check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (plan layout)");
    } else {
      std::copy(mine.begin(), mine.end(), out.begin());
    }
  }

protected:
  /// `who`: the path, as its messages name it.
  DeviceMigration(Comm& comm, char const* who) : comm_(&comm), who_(who) {}
  cudaStream_t stream_ = nullptr;  // the stream of the last pass (the window's gather runs on it too)

private:
  Comm* comm_;
  char const* who_;
};
}  // namespace detail

namespace layer {

/// The device path's executor (see the file comment).
template <ModelShape Model, router::Policy Router, placement::Policy Placement, replication::Policy Replicas,
          schedule::Policy Schedule, collective::Communicator Comm>
class DeviceExecutor : public detail::DeviceMigration<Comm> {
  using detail::DeviceMigration<Comm>::stream_;

public:
  static constexpr ShapeSpec shape = Model::spec;
  using T = storage_t<shape>;
  using DeviceOptions = cuda::DeviceOptions;
  using Options = LayerOptions<Schedule, DeviceOptions>;
  static constexpr bool supports_no_dedup = true;
  /// No exchange capability: one GPU, every record stays on it.
  static constexpr bool local = !collective::Exchange<Comm>;
  struct Buffers;

  static_assert(local || collective::StreamOrdered<Comm, cudaStream_t>,
                "moe::Layer (device): a collective that exchanges needs set_stream(cudaStream_t) "
                "(collective::StreamOrdered) to enqueue on the caller's stream");
  static_assert(std::is_same_v<Schedule, schedule::Sequential>,
                "moe::Layer (device): the device path runs its phases in one fixed order and cannot honour this "
                "schedule; use schedule::Sequential (a schedule that reorders phases runs on the host path)");
  static_assert(kernels::cuda::DeviceRouterPolicy<Router, shape>,
                "moe::Layer (device): this Router has no device form; specialise "
                "moe::kernels::cuda::DeviceRouter<Router> (moe/kernels/gate.cuh)");
  static_assert(kernels::cuda::DeviceReplicaPolicy<Replicas>,
                "moe::Layer (device): this Replicas policy has no device form; specialise "
                "moe::kernels::cuda::DeviceReplicas<Replicas> (moe/kernels/dispatch.cuh)");
  /// A batch-aware replica policy: each pass is dealt from the split of that pass's counts.
  static constexpr bool batch = replication::BatchPolicy<Replicas>;
  static_assert(!batch || std::is_same_v<Replicas, replication::BatchSplit>,
                "moe::Layer (device): of the batch-aware replica policies only replication::BatchSplit runs on the "
                "device path (replication::Reactive runs on the host path)");
  static_assert(shape.hidden % kernels::cuda::vec_elems<T> == 0 && shape.expert_ffn % kernels::cuda::vec_elems<T> == 0 &&
                    shape.shared_ffn % kernels::cuda::vec_elems<T> == 0,
                "moe::Layer (device): hidden and FFN widths must be multiples of 16 bytes of the storage type");

  struct Arguments {
    int tokens = 0;             ///< tokens on this rank (may be 0)
    T const* x = nullptr;       ///< device, tokens x hidden, 16-byte aligned
    T* y = nullptr;             ///< device, tokens x hidden, written
    long long first_token = 0;  ///< global index of this rank's first token (spreads replica choice)
    cudaStream_t stream = nullptr;
  };

  DeviceExecutor(Comm& comm, Placement placement, Replicas replicas, LayerWeights<T> weights, Options const& options)
      : detail::DeviceMigration<Comm>(comm, "moe::Layer (device)"),
        comm_(&comm),
        placement_(std::move(placement)),
        replicas_(std::move(replicas)),
        weights_(weights),
        options_(options) {
    detail::keep_shared_list(weights_, shared_);  // run() reads the shared list; the routed go to tables
    int ranks = comm.size(), rank = comm.rank();
    std::vector<int> primary = detail::check_layer_setup("moe::Layer (device)", shape, ranks, rank, placement_, replicas_,
                                                         weights_);
    // Decide the grouped-GEMM kernel now (a one-time probe that synchronises), so that forward
    // passes, captured ones included, find the answer cached.
    detail::prepare_gemm_path<T>("moe::Layer (device)", options_.device.gemm);

    // Replica lists (CSR), the served mask and the weight pointer tables.
    replication::CopyLists copies = replication::copy_lists(primary, replicas_, ranks);
    experts_ = detail::DeviceExpertTable<T>(copies, primary, true, rank, weights_.experts, "moe::Layer (device)");
    for (int r = 0; r < ranks; ++r) {
      int held = 0;  // experts rank r holds a copy of
      for (int e = 0; e < shape.experts; ++e) held += copies.holds(e, r) ? 1 : 0;
      max_held_ = std::max(max_held_, held);
    }
    for (int e = 0; e < shape.shared_experts; ++e)
      detail::check_expert_alignment("moe::Layer (device)", weights_.shared[static_cast<std::size_t>(e)], "shared ", e);
    // Handles are owned (kernels::cuda::Owned): if a creation below throws, the ones made before it
    // are released with the members that hold them.
    cublas_ = kernels::cuda::make_cublas();
    if (shape.shared_experts > 0) {
      // The shared experts run on a second stream, forked from and joined back into the caller's.
      side_ = kernels::cuda::make_stream();
      fork_ = kernels::cuda::make_event();
      join_ = kernels::cuda::make_event();
    }
    if (!local) host_counts_ = kernels::cuda::PinnedArray<std::uint64_t>(2 * static_cast<std::size_t>(ranks) + 1);
    if (keeps_record_counts())
      kept_counts_ = kernels::cuda::DeviceArray<std::uint64_t>(2 * static_cast<std::size_t>(ranks) + 1);
    votes_ = detail::DeviceVotes(ranks);
    if constexpr (batch) {
      split_.emplace(replicas_.layout());
      split_bytes_.assign(static_cast<std::size_t>(ranks), E * sizeof(std::int32_t));
      sort_ = kernels::cuda::make_stream();
      sort_fork_ = kernels::cuda::make_event();
      sort_join_ = kernels::cuda::make_event();
    }
    if (options_.live.window > 0) {  // made here, so that no pass can fail half-way through making them
      loads_ = detail::DeviceLoadRows(static_cast<std::size_t>(ranks) * (E + static_cast<std::size_t>(ranks)));
    }
    meta_bytes_ = detail::record_meta_bytes(k);
    payload_bytes_ = detail::round16(h * sizeof(T));
  }

  DeviceExecutor(DeviceExecutor const&) = delete;
  DeviceExecutor& operator=(DeviceExecutor const&) = delete;
  ~DeviceExecutor() = default;

  /// The device path's own checks (the front checks tokens, max_tokens and pointers).
  [[nodiscard]] Status check_pass(Arguments const& a) const {
    if (Status st = detail::check_first_token("moe::Layer (device)", a.first_token, options_.max_tokens, comm_->size());
        !st.ok)
      return st;
    if (reinterpret_cast<std::uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<std::uintptr_t>(a.y) % 16 != 0)
      return {false, "moe::Layer (device): x and y must be 16-byte aligned"};
    if (options_.live.window > 0)
      if (Status st = detail::DeviceLoadRows::check_not_captured("moe::Layer (device)", a.stream); !st.ok) return st;
    if constexpr (!local) {
      // The exact exchange synchronises the host once per forward pass (all_to_all_v needs host
      // byte counts). Under stream capture that would fail deep inside the runtime; say why
      // instead, before anything is enqueued.
      if (!padded()) {
        cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
        kernels::cuda::check_cuda(cudaStreamIsCapturing(a.stream, &capturing), "cudaStreamIsCapturing");
        if (capturing != cudaStreamCaptureStatusNone)
          return {false, "moe::Layer (device): Exchange::exact synchronises the host once per forward pass and "
                         "cannot be captured in a CUDA graph; use Options::device.exchange = cuda::Exchange::padded"};
      }
    }
    return {};
  }

  [[nodiscard]] bool holds_tokens() const { return true; }

  bool gather_votes(Arguments const& a, detail::Vote const& mine, std::span<detail::Vote> votes) {
    return detail::gather_votes_device(*comm_, a.stream, mine, votes, votes_.dev.get(), votes_.host.get());
  }

  /// One forward pass of this rank's tokens, enqueued on a.stream; checked and agreed by the front.
  void run(Arguments const& a, Buffers const& b, LayerStats& stats_) {
    namespace kc = kernels::cuda;
    cudaStream_t s = a.stream;
    stream_ = s;
    int const ranks = comm_->size(), rank = comm_->rank(), t = a.tokens;
    std::size_t const rec = record_bytes();
    long long const cap = padded() ? per_peer() : 0;
    stats_.tokens = t;
    stats_.assignments = static_cast<long long>(t) * k;
    stats_.record_bytes = rec;
    stats_.meta_bytes = meta_bytes_;
    stats_.control_bytes = 0;
    if constexpr (local) stats_.local_assignments = stats_.assignments;  // one GPU serves every pair
    kc::check_cuda(cudaMemsetAsync(experts_.errors(), 0, sizeof(unsigned), s), "cudaMemsetAsync");

    // 0. Shared experts on the side stream, overlapping everything up to the final sum.
    float* shared_acc = nullptr;
    if (shape.shared_experts > 0 && t > 0) {
      shared_acc = b.shared_acc.data();
      cudaStream_t ss = side_.get();
      kc::check_cuda(cudaEventRecord(fork_.get(), s), "cudaEventRecord (fork)");
      kc::check_cuda(cudaStreamWaitEvent(ss, fork_.get(), 0), "cudaStreamWaitEvent (fork)");
      detail::shared_experts<shape>(ss, weights_.shared, a.x, t, b.shared_inter.data(), shared_acc, options_.device.gemm);
      kc::check_cuda(cudaEventRecord(join_.get(), ss), "cudaEventRecord (join)");
    }

    // 1. Gate, router, destinations, record layout, packing.
    if (t > 0) {
      kc::gate_logits<T>(cublas_.get(), s, b.cublas.data(), b.cublas.size(), a.x, t, shape.hidden, weights_.router,
                         shape.experts, b.logits.data());
      kc::route<shape, Router>(s, b.logits.data(), weights_.router_bias, t, b.ids.data(), b.weights.data());
    }
    if constexpr (batch) {
      plan_split(a, b, stats_);  // every rank, tokens or not: the counts are gathered from all
    } else if (t > 0) {
      auto view = kc::DeviceReplicas<Replicas>::view(replicas_, experts_.copy_table());
      kc::plan_records<k>(s, b.ids.data(), t, ranks, view, rank, a.first_token, options_.deduplicate, b.dest.data(),
                          b.rec_count.data());
    }
    if (t > 0)
      kc::exclusive_sum(s, b.scan_temp.data(), b.scan_temp.size(), b.rec_count.data(), b.rec_pos.data(),
                        static_cast<long long>(ranks) * t);
    if (!b.load_counts.empty())
      kc::count_loads(s, b.ids.data(), b.dest.data(), static_cast<long long>(t) * k, shape.experts, ranks,
                      b.load_counts.data());
    std::uint64_t* send_count = b.counts.data();
    std::uint64_t* recv_count = b.counts.data() + ranks;
    kc::send_layout(s, b.rec_count.data(), b.rec_pos.data(), t, ranks, cap, send_count, b.send_base.data());
    // One GPU: records carry metadata only; the expert GEMM reads the token rows from x.
    kc::pack_records<T, k>(s, a.x, t, shape.hidden, b.ids.data(), b.weights.data(), b.dest.data(), b.rec_pos.data(),
                           b.send_base.data(), options_.deduplicate, b.send.data(), rec, meta_bytes_, !local);

    // 2. Dispatch.
    std::byte const* recv = b.send.data();
    long long slots = static_cast<long long>(t) * (options_.deduplicate ? 1 : k);  // local: records <= this
    std::uint64_t const* counts_in = send_count;
    if constexpr (!local) {
      comm_->set_stream(s);
      auto before = comm_->counters();
      comm_->all_to_all(std::as_bytes(std::span(send_count, static_cast<std::size_t>(ranks))),
                        std::as_writable_bytes(std::span(recv_count, static_cast<std::size_t>(ranks))),
                        sizeof(std::uint64_t));
      auto middle = comm_->counters();
      if (padded()) {
        comm_->all_to_all(std::as_bytes(b.send), b.recv, static_cast<std::size_t>(cap) * rec);
        slots = static_cast<long long>(ranks) * cap;
        if (keeps_record_counts()) {
          // This pass's counts (send, received, local pairs) kept where read_record_counts() reads them.
          kc::count_rank(s, b.dest.data(), static_cast<long long>(t) * k, rank, b.counts.data() + 2 * ranks);
          kc::check_cuda(cudaMemcpyAsync(kept_counts_.get(), b.counts.data(), b.counts.size_bytes(),
                                         cudaMemcpyDeviceToDevice, s),
                         "cudaMemcpyAsync (record counts)");
        }
      } else {
        // The one host synchronisation of the exact exchange (not under capture: checked above). The
        // word after the counts: this rank's pairs served on this rank (stats only).
        kc::count_rank(s, b.dest.data(), static_cast<long long>(t) * k, rank, b.counts.data() + 2 * ranks);
        kc::check_cuda(cudaMemcpyAsync(host_counts_.get(), b.counts.data(),
                                       (2 * static_cast<std::size_t>(ranks) + 1) * sizeof(std::uint64_t),
                                       cudaMemcpyDeviceToHost, s),
                       "cudaMemcpyAsync (record counts)");
        kc::check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize (record counts)");
        record_counts(host_counts_.get(), stats_);
        host_bytes_.assign(4 * static_cast<std::size_t>(ranks), 0);
        for (int p = 0; p < ranks; ++p) {
          auto up = static_cast<std::size_t>(p);
          std::size_t sent = host_counts_.get()[up], got = host_counts_.get()[static_cast<std::size_t>(ranks) + up];
          host_bytes_[up] = sent * rec;
          host_bytes_[static_cast<std::size_t>(ranks) + up] = got * rec;
          host_bytes_[2 * static_cast<std::size_t>(ranks) + up] = got * h * sizeof(T);  // partials back
          host_bytes_[3 * static_cast<std::size_t>(ranks) + up] = sent * h * sizeof(T);
        }
        auto const total = static_cast<std::size_t>(stats_.records_received);
        check(total <= recv_capacity(), "moe::Layer (device): rank ", rank, " would receive ", total,
              " records but its workspace holds ", recv_capacity(),
              " (do all ranks use the same LayerOptions::max_tokens?)");
        auto hb = std::span<std::size_t const>(host_bytes_);
        comm_->all_to_all_v(std::as_bytes(b.send), hb.subspan(0, static_cast<std::size_t>(ranks)), b.recv,
                            hb.subspan(static_cast<std::size_t>(ranks), static_cast<std::size_t>(ranks)));
        slots = static_cast<long long>(total);
      }
      auto after = comm_->counters();
      stats_.control_bytes += middle.bytes_sent() - before.bytes_sent();
      stats_.dispatch_bytes = after.bytes_sent() - middle.bytes_sent();
      recv = b.recv.data();
      counts_in = recv_count;
    }
    kc::recv_layout(s, counts_in, ranks, cap, b.recv_base.data(), b.recv_n.data(), experts_.errors());

    // 3. Experts: group (record, slot) pairs by expert, gate+up with SwiGLU, down, weighted combine.
    auto experts = experts_.template routed<shape>(b, rows_per_record(), options_.device.gemm);
    experts.records = recv;
    experts.record_bytes = rec;
    experts.slots = slots;
    experts.recv_base = b.recv_base.data();
    experts.recv_n = b.recv_n.data();
    experts.sources = ranks;
    if constexpr (local) {
      // Records are in token order: record t (de-duplicated) or t * k + j (one per assignment).
      experts.a = reinterpret_cast<std::byte const*>(a.x);
      experts.a_stride = h * sizeof(T);
      experts.index_div = options_.deduplicate ? k : k * k;
    } else {
      experts.a = recv + meta_bytes_;  // the token row follows each record's metadata
      experts.a_stride = rec;
    }
    experts.back = b.back.data();
    experts.enqueue(s);

    // 4. Partials back, shared experts, sum in token order.
    T const* returned = b.back.data();
    if constexpr (!local) {
      auto before = comm_->counters();
      if (padded()) {
        comm_->all_to_all(std::as_bytes(b.back), std::as_writable_bytes(b.returned),
                          static_cast<std::size_t>(cap) * h * sizeof(T));
      } else {
        auto hb = std::span<std::size_t const>(host_bytes_);
        comm_->all_to_all_v(std::as_bytes(b.back), hb.subspan(2 * static_cast<std::size_t>(ranks), static_cast<std::size_t>(ranks)),
                            std::as_writable_bytes(b.returned),
                            hb.subspan(3 * static_cast<std::size_t>(ranks), static_cast<std::size_t>(ranks)));
      }
      stats_.combine_bytes = comm_->counters().bytes_sent() - before.bytes_sent();
      returned = b.returned.data();
    }
    if (shared_acc) kc::check_cuda(cudaStreamWaitEvent(s, join_.get(), 0), "cudaStreamWaitEvent (shared experts)");
    kc::finish_tokens<T>(s, t, shape.hidden, ranks, b.rec_count.data(), b.rec_pos.data(), b.send_base.data(), returned,
                         shared_acc, a.y);
  }

  // ---- What the front's re-planning (moe/layer/live.hpp) asks of a path ----

  /// The tables of a plan to switch to, built, uploaded and checked before the switch.
  struct NextPlan {
    Placement placement;
    Replicas replicas;
    detail::DeviceExpertTable<T> experts;
    std::optional<kernels::cuda::DeviceSplit> split;  // replication::BatchSplit: the new copies' split
  };
  /// The tables of a plan, checked; `new_copies` false (the same copies, other weight pointers)
  /// leaves the split out, and adopt() keeps the current one.
  NextPlan prepare_plan(Placement placement, Replicas replicas, std::span<ExpertWeights<T> const> experts,
                        bool new_copies = true) const {
    LayerWeights<T> w = weights_;
    w.experts = experts;
    int ranks = comm_->size(), rank = comm_->rank();
    auto primary = detail::check_layer_setup("moe::Layer (device)", shape, ranks, rank, placement, replicas, w);
    replication::CopyLists copies = replication::copy_lists(primary, replicas, ranks);
    for (int r = 0; r < ranks; ++r) {
      int held = 0;
      for (int e = 0; e < shape.experts; ++e) held += copies.holds(e, r) ? 1 : 0;
      check(held <= max_held_, "moe::Layer (device): the plan gives rank ", r, " ", held, " experts, the workspace "
            "was sized for ", max_held_);
    }
    detail::DeviceExpertTable<T> table(copies, primary, true, rank, experts, "moe::Layer (device)");
    std::optional<kernels::cuda::DeviceSplit> split;
    if constexpr (batch) {
      if (!new_copies) return {std::move(placement), std::move(replicas), std::move(table), std::nullopt};
      // The workspace holds the split of any plan whose ranks hold at most max_held_ experts.
      split.emplace(replicas.layout());
      check(split->take_size() <= split_take_bound() && split->workspace_bytes() <= split_work_bound(),
            "moe::Layer (device): the plan's split needs ", split->take_size(), " take entries and ",
            split->workspace_bytes(), " workspace bytes, the workspace holds ", split_take_bound(), " and ",
            split_work_bound());
    }
    return {std::move(placement), std::move(replicas), std::move(table), std::move(split)};
  }
  void adopt(NextPlan&& next, std::span<ExpertWeights<T> const> experts) noexcept {
    placement_ = std::move(next.placement);
    replicas_ = std::move(next.replicas);
    experts_ = std::move(next.experts);
    if constexpr (batch) {
      if (next.split) split_ = std::move(next.split);
    }
    weights_.experts = experts;
  }
  /// The experts now live in the front's arena: the pointer tables are rebuilt.
  void set_expert_weights(std::span<ExpertWeights<T> const> experts) {
    auto next = prepare_plan(placement_, replicas_, experts, false);
    adopt(std::move(next), experts);
  }
  [[nodiscard]] std::vector<int> primary_ranks() const {
    std::vector<int> p(E);
    for (std::size_t e = 0; e < E; ++e) p[e] = placement_.rank_of(static_cast<int>(e));
    return p;
  }
  [[nodiscard]] Replicas const& replicas() const { return replicas_; }
  [[nodiscard]] std::span<ExpertWeights<T> const> expert_weights() const { return weights_.experts; }
  /// The window's counts of this pass, gathered on the device; the front takes them on the next
  /// pass or when the caller asks for the window (detail::DeviceLoadRows).
  std::span<std::int32_t const> gather_loads(Buffers const& b, std::span<std::int32_t> gathered) {
    loads_.gather(*comm_, stream_, b.load_counts, gathered);
    return {};
  }
  std::span<std::int32_t const> take_loads() { return loads_.take(); }
  /// Layer::read_record_counts(): the counts a padded pass with Options::device.count_records kept
  /// on the device, into `st`. The exact exchange and one GPU filled them during the pass.
  void read_record_counts(LayerStats& st) {
    if (!keeps_record_counts()) return;
    int const ranks = comm_->size();
    kernels::cuda::check_cuda(cudaMemcpy(host_counts_.get(), kept_counts_.get(),
                                         (2 * static_cast<std::size_t>(ranks) + 1) * sizeof(std::uint64_t),
                                         cudaMemcpyDeviceToHost),
                              "cudaMemcpy (record counts)");
    record_counts(host_counts_.get(), st);
  }

  /// Error bits (kernels::cuda::DeviceError) raised by the last run(). Synchronises the device
  /// first (a plain cudaMemcpy would not wait for a non-blocking stream): a diagnostic for tests
  /// and debugging, not for the hot path.
  [[nodiscard]] unsigned errors() const { return experts_.read_errors(); }

  static constexpr auto h = static_cast<std::size_t>(shape.hidden);
  static constexpr int k = shape.top_k;
  static constexpr auto E = static_cast<std::size_t>(shape.experts);

  struct Buffers {
    std::span<float> logits;            // m x E
    std::span<int> ids, dest;           // m x k
    std::span<float> weights;           // m x k
    std::span<int> rec_count, rec_pos;  // ranks x m
    std::span<std::byte> scan_temp;
    std::span<std::uint64_t> counts;    // send (ranks), received (ranks), local assignments (1)
    std::span<long long> send_base, recv_base;
    std::span<int> recv_n;
    std::span<std::byte> send, recv;    // dispatch records
    std::span<int> keys, values, sorted_keys, sorted_values, position;  // recv slots x k
    std::span<std::byte> sort_temp;
    std::span<int> offsets, tile_starts;  // E + 1
    std::span<T> inter;                 // recv slots x rows_per_record() x expert_ffn
    std::span<T> expert_out;            // recv slots x rows_per_record() x hidden
    std::span<T> back;                  // recv slots x hidden
    std::span<T> returned;              // send records x hidden
    std::span<T> shared_inter;          // m x shared_ffn
    std::span<float> shared_acc;        // m x hidden
    std::span<std::byte> cublas;
    std::span<std::int32_t> load_counts;  // E + ranks: this pass's pairs per expert, then per serving rank
                                          // (load window, LayerOptions::live.window > 0)
    // replication::BatchSplit: this rank's pairs per expert, every rank's (ranks x E), the split
    // (take: ranks x slots; loads: ranks; outcome) and its workspace when it is not in shared memory
    std::span<std::int32_t> split_own, split_counts, split_take;
    std::span<long long> split_load;
    std::span<replication::split::Outcome> split_outcome;
    std::span<std::byte> split_work;
  };

  [[nodiscard]] bool padded() const { return !local && options_.device.exchange == cuda::Exchange::padded; }
  /// A padded pass that keeps its record counts on the device for read_record_counts().
  [[nodiscard]] bool keeps_record_counts() const { return padded() && options_.device.count_records; }
  /// Bytes of one dispatch record: metadata, then the token row, except on one GPU (metadata only).
  [[nodiscard]] std::size_t record_bytes() const { return local ? meta_bytes_ : meta_bytes_ + payload_bytes_; }
  /// Records one token sends one peer at most: 1 with de-duplication, else one per expert of the
  /// token that the peer holds.
  [[nodiscard]] static long long records_per_token(int experts_held, bool deduplicate) {
    return deduplicate ? 1 : std::max(1, std::min(k, experts_held));
  }
  /// Most records one rank can send one peer (the padded exchange's region): the peer holding the
  /// most experts bounds every peer, so that all ranks agree on the stride.
  [[nodiscard]] long long per_peer() const {
    return static_cast<long long>(options_.max_tokens) * records_per_token(max_held_, options_.deduplicate);
  }
  [[nodiscard]] std::size_t send_capacity() const {
    auto ranks = static_cast<long long>(comm_->size());
    if (padded()) return static_cast<std::size_t>(ranks * per_peer());
    long long per_token = options_.deduplicate ? std::min<long long>(k, ranks) : k;
    return static_cast<std::size_t>(options_.max_tokens) * static_cast<std::size_t>(per_token);
  }
  /// Most experts one received record names: 1 without de-duplication; with it, a record names
  /// distinct experts this rank serves. The expert GEMMs' rows are at most slots times this.
  [[nodiscard]] int rows_per_record() const {
    return options_.deduplicate ? std::max(1, std::min(k, served_bound())) : 1;
  }
  /// Whether this layer may switch plans: a load window on a layer that can re-plan (re-planning,
  /// or Layer::migrate_to, which needs no spare slots). The workspace then holds any plan whose
  /// ranks hold at most max_held_ experts (the first plan's most; Layer::migrate_to and the
  /// re-planner keep every plan within it), not only the first plan.
  [[nodiscard]] bool any_plan() const { return live::Replannable<Placement, Replicas> && options_.live.window > 0; }
  /// Experts this rank serves, as the workspace is sized for: its own count in the first plan, or
  /// when the layer may switch plans (any_plan) the most any rank held then, which bounds every later plan.
  [[nodiscard]] int served_bound() const { return any_plan() ? max_held_ : experts_.served_count(); }
  [[nodiscard]] std::size_t recv_capacity() const {
    if (local) return send_capacity();
    if (padded()) return static_cast<std::size_t>(comm_->size()) * static_cast<std::size_t>(per_peer());
    // Exact: each source sends this rank at most its own bound (the experts this rank holds).
    return static_cast<std::size_t>(comm_->size()) * static_cast<std::size_t>(options_.max_tokens) *
           static_cast<std::size_t>(records_per_token(served_bound(), options_.deduplicate));
  }

  void carve(core::Carver& c, Buffers& b) const {
    namespace kc = kernels::cuda;
    auto m = static_cast<std::size_t>(options_.max_tokens);
    auto ranks = static_cast<std::size_t>(comm_->size());
    std::size_t rec = record_bytes();
    std::size_t slots = recv_capacity(), items = slots * static_cast<std::size_t>(k);
    b.logits = c.take<float>(m * E);
    b.ids = c.take<int>(m * k);
    b.dest = c.take<int>(m * k);
    b.weights = c.take<float>(m * k);
    b.rec_count = c.take<int>(ranks * m);
    b.rec_pos = c.take<int>(ranks * m);
    b.scan_temp = c.take<std::byte>(scan_bytes_ ? scan_bytes_ : (scan_bytes_ = kc::exclusive_sum_bytes(static_cast<long long>(ranks * m))));
    // send, received, then (exact exchange, or padded with count_records) the local assignments;
    // one GPU receives no counts
    b.counts = c.take<std::uint64_t>(local ? ranks : 2 * ranks + (padded() && !keeps_record_counts() ? 0 : 1));
    b.send_base = c.take<long long>(ranks);
    b.recv_base = c.take<long long>(ranks);
    b.recv_n = c.take<int>(ranks);
    b.send = c.take<std::byte>(send_capacity() * rec);
    b.recv = c.take<std::byte>(local ? 0 : slots * rec);
    b.keys = c.take<int>(items);
    b.values = c.take<int>(items);
    b.sorted_keys = c.take<int>(items);
    b.sorted_values = c.take<int>(items);
    b.position = c.take<int>(items);
    b.sort_temp = c.take<std::byte>(sort_bytes_ ? sort_bytes_ : (sort_bytes_ = kc::sort_items_bytes(static_cast<long long>(items), shape.experts)));
    b.offsets = c.take<int>(E + 1);
    b.tile_starts = c.take<int>(E + 1);
    std::size_t rows = slots * static_cast<std::size_t>(rows_per_record());  // <= items
    b.inter = c.take<T>(rows * static_cast<std::size_t>(shape.expert_ffn));
    b.expert_out = c.take<T>(rows * h);
    b.back = c.take<T>(slots * h);
    b.returned = c.take<T>(local ? 0 : send_capacity() * h);
    b.shared_inter = c.take<T>(shape.shared_experts > 0 ? m * static_cast<std::size_t>(shape.shared_ffn) : 0);
    b.shared_acc = c.take<float>(shape.shared_experts > 0 ? m * h : 0);
    b.cublas = c.take<std::byte>(options_.device.cublas_workspace);
    if (options_.live.window > 0) b.load_counts = c.take<std::int32_t>(E + ranks);
    if constexpr (batch) {
      b.split_own = c.take<std::int32_t>(E);
      b.split_counts = c.take<std::int32_t>(ranks * E);
      b.split_take = c.take<std::int32_t>(split_take_bound());
      b.split_load = c.take<long long>(split_->load_size());
      b.split_outcome = c.take<replication::split::Outcome>(1);
      b.split_work = c.take<std::byte>(split_work_bound());
    }
  }

  /// replication::BatchSplit, the split's outputs and global workspace as the workspace holds
  /// them: this plan's; when the layer may switch plans (any_plan), any plan's whose ranks hold at most
  /// max_held_ experts each. Such a plan has at most ranks x max_held_ copies, and an expert has at
  /// most `ranks` of them, so the copy pairs (arcs) number at most copies x (ranks - 1).
  [[nodiscard]] std::size_t split_take_bound() const
    requires batch
  {
    if (!any_plan()) return split_->take_size();
    auto ranks = static_cast<std::size_t>(comm_->size());
    return ranks * ranks * static_cast<std::size_t>(max_held_);
  }
  [[nodiscard]] std::size_t split_work_bound() const
    requires batch
  {
    if (!any_plan()) return split_->workspace_bytes();
    replication::split::Layout most = split_->layout();
    most.slots = most.ranks * max_held_;
    most.arcs = most.slots * (most.ranks - 1);
    return static_cast<std::size_t>(replication::split::workspace_words(most)) * sizeof(long long);
  }

  /// replication::BatchSplit: this pass's pairs per expert from every rank (an all-gather on the
  /// device), the split of them (kernels::cuda::DeviceSplit), and this rank's pairs dealt from it
  /// in token order within each expert; then the records per (rank, token). The sort of this
  /// rank's pairs by expert needs only the routing, so it runs on the sort stream, forked from the
  /// caller's before the count exchange and joined back before the deal: the split kernel (one
  /// block) and the exchange no longer wait for it, nor it for them. No host synchronisation, so a
  /// padded pass stays capturable (the capture follows the fork and join).
  void plan_split(Arguments const& a, Buffers const& b, LayerStats& stats)
    requires batch
  {
    namespace kc = kernels::cuda;
    cudaStream_t s = a.stream;
    int const ranks = comm_->size(), rank = comm_->rank(), t = a.tokens;
    long long const n = static_cast<long long>(t) * k;
    if (t > 0) {
      cudaStream_t ss = sort_.get();
      kc::check_cuda(cudaEventRecord(sort_fork_.get(), s), "cudaEventRecord (sort fork)");
      kc::check_cuda(cudaStreamWaitEvent(ss, sort_fork_.get(), 0), "cudaStreamWaitEvent (sort fork)");
      kc::order_by_expert(ss, b.ids.data(), n, shape.experts, b.values.data(), b.sorted_keys.data(),
                          b.sorted_values.data(), b.offsets.data(), b.sort_temp.data(), b.sort_temp.size());
      kc::check_cuda(cudaEventRecord(sort_join_.get(), ss), "cudaEventRecord (sort join)");
    }
    split_->count(b.ids.data(), n, b.split_own.data(), s);
    if constexpr (local) {
      kc::check_cuda(cudaMemcpyAsync(b.split_counts.data(), b.split_own.data(), E * sizeof(std::int32_t),
                                     cudaMemcpyDeviceToDevice, s),
                     "cudaMemcpyAsync (split counts)");
    } else {
      comm_->set_stream(s);
      auto before = comm_->counters();
      comm_->all_gather_v(std::as_bytes(std::span<std::int32_t const>(b.split_own)),
                          std::as_writable_bytes(b.split_counts), split_bytes_);
      stats.control_bytes += comm_->counters().bytes_sent() - before.bytes_sent();
    }
    split_->run(b.split_counts.data(), b.split_take.data(), b.split_load.data(), b.split_outcome.data(),
                split_->workspace_bytes() == 0 ? nullptr : b.split_work.data(), s);
    if (t == 0) return;
    kc::check_cuda(cudaStreamWaitEvent(s, sort_join_.get(), 0), "cudaStreamWaitEvent (sort join)");
    split_->deal_sorted(b.split_take.data(), rank, b.sorted_keys.data(), b.sorted_values.data(), b.offsets.data(), n,
                        b.dest.data(), s);
    kc::count_records<k>(s, b.dest.data(), t, ranks, options_.deduplicate, b.rec_count.data());
  }

  /// The record stats from one pass's counts (send per peer, received per peer, local pairs).
  void record_counts(std::uint64_t const* counts, LayerStats& st) const {
    int const ranks = comm_->size(), rank = comm_->rank();
    st.records_local = st.records_remote = st.records_received = 0;
    for (int p = 0; p < ranks; ++p) {
      auto sent = static_cast<long long>(counts[p]);
      (p == rank ? st.records_local : st.records_remote) += sent;
      st.records_received += static_cast<long long>(counts[ranks + p]);
    }
    st.local_assignments = static_cast<long long>(counts[2 * ranks]);
  }

  Comm* comm_;
  Placement placement_;
  Replicas replicas_;
  LayerWeights<T> weights_;
  std::vector<ExpertWeights<T>> shared_;  // weights_.shared points here (detail::keep_shared_list)
  Options options_;
  detail::DeviceExpertTable<T> experts_;  // copy lists, this rank's served experts, error word
  int max_held_ = 0;                      // most experts any rank holds a copy of
  kernels::cuda::OwnedCublas cublas_;
  kernels::cuda::OwnedStream side_;  // shared experts (only when the shape has some)
  kernels::cuda::OwnedEvent fork_, join_;
  kernels::cuda::PinnedArray<std::uint64_t> host_counts_;  // send counts, received counts, local pairs
  kernels::cuda::DeviceArray<std::uint64_t> kept_counts_;  // padded + count_records: the last pass's, on the device
  std::vector<std::size_t> host_bytes_;   // exact exchange: send, recv, back, returned bytes per peer
  std::size_t meta_bytes_ = 0;
  std::size_t payload_bytes_ = 0;
  mutable std::size_t scan_bytes_ = 0;  // CUB scratch sizes, queried once
  mutable std::size_t sort_bytes_ = 0;
  detail::DeviceVotes votes_;
  detail::DeviceLoadRows loads_;                         // the window's gathered counts, on their way to the host
  std::optional<kernels::cuda::DeviceSplit> split_;      // replication::BatchSplit: the split kernel
  std::vector<std::size_t> split_bytes_;                 // ... and the bytes each rank's counts take
  kernels::cuda::OwnedStream sort_;                      // ... and the sort by expert beside the split
  kernels::cuda::OwnedEvent sort_fork_, sort_join_;
};

}  // namespace layer

template <>
struct detail::path_executor<ExecutionPath::device> {
  template <class... Policies>
  using type = layer::DeviceExecutor<Policies...>;
};

}  // namespace moe
