#pragma once
// FinDEP / PPPipe on CUDA streams and events (nvcc only): schedule::FinDepCudaExecutor runs the
// stream/event plan of a schedule (stream_plan.hpp) for one MoE layer, with one CUDA stream per
// resource of the schedule and one cudaEvent_t per plan event. Its Link policy says where the
// attention group (AG: tokens, router, shared experts) and the expert group (EG: routed experts)
// run and how the A2E and E2A links carry bytes between them:
//
//   CoLocated           AG and EG on one GPU; each link is a device-to-device cudaMemcpyAsync on
//                       its own stream, so the overlap of the schedule is real and its result can be
//                       checked on one GPU
//   PointToPoint<Comm>  AG ranks [0, ag) and EG ranks [ag, size), one GPU each; the links are the
//                       communicators' send / recv (ncclSend / ncclRecv with collective::Nccl); the
//                       executor of the device disaggregated moe::Layer (paths/device_disaggregated.cuh)
//
// Both run the same plan walk, kernels and messages; a co-located executor is a world of one AG
// and one EG that happen to be the same GPU:
//   AG stream   A(i)   gate logits (cuBLAS) + top-k routing of micro-batch i        (kernels/gate.cuh)
//               S(i)   shared experts of micro-batch i, fp32 sum               (kernels/grouped_gemm.cuh)
//   A2E stream  D(i,j) AG: chunk j's records (metadata + token row), one region of `chunk` records
//                      per EG rank (kernels/dispatch.cuh); the link carries each EG rank an 8-byte
//                      record count and its region. EG (point to point): the receiving half.
//   EG stream   E(i,j) the routed experts on chunk j's records from every AG rank: grouping by
//                      expert, SwiGLU grouped GEMMs, weighted combine (expert_ffn.cuh, RoutedExperts),
//                      one partial row per record
//   E2A stream  C(i,j) EG: the link carries each AG rank its `chunk` partial rows. AG (point to
//                      point): the receiving half.
// then, on the AG stream after both links are done, y = shared + partials per token (finish_tokens).
// The fixed regions make every message size a function of the token count, so nothing waits for a
// count on the host; the EG reads only the counted records. The waits between streams are exactly
// the plan's (section 3.2 dependencies; FinDEP releases the A2E after A, PPPipe after S); a rank
// drops the waits on operations of the other group, which the messages themselves order. Each
// micro-batch and chunk has its own region of every buffer that crosses streams, so the plan's
// dependencies are the only ordering needed; scratch a stream reuses from one operation to the next
// (logits, grouping, GEMM intermediates) is touched by that stream only. The one exception: an AG
// rank with a per-micro-batch split sorts the micro-batch's pairs on a fifth stream of its own,
// forked from the A2E stream and joined back before the deal (split_micro_batch).
//
// Results: the function of the sequential device moe::Layer (same kernels and roundings per token;
// partials stored in storage precision, the shared sum fp32). The gate GEMM runs per micro-batch,
// so cuBLAS may sum the logits in another order than for the whole batch: tokens within rounding
// of a routing tie may pick another expert (as between the GPU and the host reference).
//
// Streams and ordering: run() records an event on the caller's stream that the four resource
// streams wait on, and the caller's stream waits on the last operation of each of them, so run()
// is ordered with the caller's other work like a kernel on that stream and the workspace may be
// reused by the next run(). run() allocates nothing on the device and never synchronises the host;
// the plan (host vectors) is rebuilt only when the configuration changes. Events come from a pool
// created at construction for up to `max_chunks` chunks (r1 * r2) per run.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/collective/pairwise.hpp"
#include "moe/config.hpp"
#include "moe/core/shape.hpp"
#include "moe/core/weights.hpp"
#include "moe/core/workspace.hpp"
#include "moe/kernels/batch_split.cuh"
#include "moe/kernels/combine.cuh"
#include "moe/kernels/cuda_common.cuh"
#include "moe/kernels/dispatch.cuh"
#include "moe/kernels/gate.cuh"
#include "moe/kernels/grouped_gemm.cuh"
#include "moe/kernels/records.hpp"
#include "moe/layer/expert_ffn.cuh"
#include "moe/layer/layer.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/replication/batch_split.hpp"
#include "moe/router/router.hpp"
#include "moe/schedule/problem.hpp"
#include "moe/schedule/stream_plan.hpp"

namespace moe::schedule {

namespace detail_cuda {

/// A(i): gate logits (cuBLAS) and top-k routing of `tokens` rows of x into ids / weights.
template <ShapeSpec S, class Router, class T>
void findep_attention(cublasHandle_t cublas, cudaStream_t s, std::span<std::byte> cublas_ws, LayerWeights<T> const& w,
                      T const* x, int tokens, float* logits, int* ids, float* gate_w) {
  kernels::cuda::gate_logits<T>(cublas, s, cublas_ws.data(), cublas_ws.size(), x, tokens, S.hidden, w.router,
                                S.experts, logits);
  kernels::cuda::route<S, Router>(s, logits, w.router_bias, tokens, ids, gate_w);
}

/// The resource streams of an executor (one per Resource, non-blocking) and its event pool,
/// destroyed with it.
struct StreamPool {
  std::array<cudaStream_t, resource_count> streams{};  ///< indexed by Resource
  std::vector<cudaEvent_t> events;

  StreamPool() = default;
  StreamPool(StreamPool const&) = delete;
  StreamPool& operator=(StreamPool const&) = delete;
  ~StreamPool() {
    for (auto e : events)
      if (e) cudaEventDestroy(e);
    for (auto s : streams)
      if (s) cudaStreamDestroy(s);
  }

  void create(std::size_t event_count) {
    namespace kc = kernels::cuda;
    for (auto& s : streams)
      kc::check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    events.resize(event_count);
    for (auto& e : events) kc::check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  }

  /// Every resource stream starts after the work already on `caller` (through pool event `event`).
  void fork(cudaStream_t caller, std::size_t event) const {
    namespace kc = kernels::cuda;
    kc::check_cuda(cudaEventRecord(events[event], caller), "cudaEventRecord (fork)");
    for (auto s : streams) kc::check_cuda(cudaStreamWaitEvent(s, events[event], 0), "cudaStreamWaitEvent (fork)");
  }

  /// `caller` continues after the last operation of every resource stream, each joined directly
  /// (as stream capture into a CUDA graph requires), through events [first, first + resource_count).
  void join(cudaStream_t caller, std::size_t first) const {
    namespace kc = kernels::cuda;
    for (std::size_t q = 0; q < resource_count; ++q) {
      kc::check_cuda(cudaEventRecord(events[first + q], streams[q]), "cudaEventRecord (join)");
      kc::check_cuda(cudaStreamWaitEvent(caller, events[first + q], 0), "cudaStreamWaitEvent (join)");
    }
  }
};

/// The checks of a schedule both executors share: r1 and r2, the pipeline and order, the event
/// pool (max_chunks) and the split of `tokens` into micro-batches and chunks.
inline Status check_schedule(char const* who, int tokens, Config const& c, int max_chunks) {
  using moe::detail::concat;
  if (c.r1 < 1) return {false, concat(who, ": r1 (micro-batches) must be at least 1, got ", c.r1)};
  if (c.r2 < 1) return {false, concat(who, ": r2 (token chunks) must be at least 1, got ", c.r2)};
  if (c.pipeline == Pipeline::pppipe && c.r2 != 1)
    return {false, concat(who, ": PPPipe has no token chunks; r2 must be 1, got ", c.r2)};
  if (c.pipeline != Pipeline::findep && c.pipeline != Pipeline::pppipe)
    return {false, concat(who, ": unknown pipeline ", static_cast<int>(c.pipeline))};
  if (c.order != Order::aass && c.order != Order::asas)
    return {false, concat(who, ": unknown order ", static_cast<int>(c.order))};
  if (static_cast<long long>(c.r1) * c.r2 > max_chunks)
    return {false, concat(who, ": r1 * r2 = ", c.r1, " * ", c.r2, " chunks exceed max_chunks = ", max_chunks,
                          " (FinDepCudaOptions::max_chunks sizes the event pool)")};
  if (tokens % c.r1 != 0) return {false, concat(who, ": r1 = ", c.r1, " does not divide the ", tokens, " tokens")};
  if ((tokens / c.r1) % c.r2 != 0)
    return {false, concat(who, ": r2 = ", c.r2, " does not divide the ", tokens / c.r1, " tokens of a micro-batch (",
                          tokens, " tokens, r1 = ", c.r1, ")")};
  return {};
}

/// The stream plan of the last configuration an executor ran, rebuilt only when it changes.
struct PlanCache {
  StreamPlan plan;
  bool valid = false;

  /// The plan of `c`, whose events must fit the `plan_events` the executor's pool keeps for plans.
  StreamPlan const& get(Config const& c, bool shared_experts, std::size_t plan_events, char const* who) {
    if (!valid || plan.config.pipeline != c.pipeline || plan.config.order != c.order || plan.config.r1 != c.r1 ||
        plan.config.r2 != c.r2) {
      plan = build_stream_plan(c, shared_experts, 1);
      valid = true;
    }
    plan.config = c;  // the same plan; keep the configuration the caller ran (m_a may differ)
    check(plan.events.size() <= plan_events, who, ": internal error: the plan needs ", plan.events.size(),
          " events, the pool holds ", plan_events);
    return plan;
  }
};


/// Adds one micro-batch's split to a run's totals: acc[g] += load[g] for the n EG indices, and
/// acc[n] += the split's max load.
__global__ void add_split_loads_kernel(long long const* load, int n, replication::split::Outcome const* outcome,
                                              long long* acc) {
  for (int g = static_cast<int>(threadIdx.x); g < n; g += static_cast<int>(blockDim.x)) acc[g] += load[g];
  if (threadIdx.x == 0) acc[n] += outcome->max_load;
}

/// out[0] += the sum of `sent[0, n_sent)`, out[1] += the sum of `received[0, n_received)` (one
/// block; either array may be empty): a run's record counts (FinDepCudaExecutor::count_records).
__global__ void sum_record_counts_kernel(std::uint64_t const* __restrict__ sent, long long n_sent,
                                         std::uint64_t const* __restrict__ received, long long n_received,
                                         unsigned long long* __restrict__ out) {
  unsigned long long a = 0, b = 0;
  for (long long i = threadIdx.x; i < n_sent; i += blockDim.x) a += sent[i];
  for (long long i = threadIdx.x; i < n_received; i += blockDim.x) b += received[i];
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  if ((threadIdx.x & 31) == 0) {
    if (a != 0) atomicAdd(&out[0], a);
    if (b != 0) atomicAdd(&out[1], b);
  }
}

/// A device-memory communicator with point-to-point messages on a settable stream
/// (collective::Nccl; tests use a staged stand-in): the capabilities of moe/collective/concept.hpp.
template <class C>
concept PointToPointDevice = collective::PointToPoint<C> && collective::StreamOrdered<C, cudaStream_t> &&
                             C::memory == collective::Memory::device;
}  // namespace detail_cuda

/// Largest FinDepCudaOptions::max_chunks: the event pool holds about 5 events per chunk, created
/// at construction (solved schedules use a few hundred chunks at most).
inline constexpr int max_cuda_chunks = 4096;

struct FinDepCudaOptions {
  int max_tokens = 0;  ///< most tokens one run() takes; sizes the workspace
  int max_chunks = 64;  ///< most r1 * r2 of a run(); sizes the event pool (at most max_cuda_chunks)
  std::size_t cublas_workspace = std::size_t{8} << 20;  ///< bytes handed to cuBLAS for the gate GEMM
  /// Kernel of the expert GEMMs (as LayerOptions::gemm).
  kernels::cuda::GemmPath gemm = kernels::cuda::GemmPath::automatic;
  /// The executor will switch plans (prepare_tables, adopt): its workspace is then sized for any
  /// plan whose EG ranks hold at most as many experts as the busiest EG rank of the first plan
  /// (false: for the first plan only, which may be smaller on an EG rank that holds fewer).
  bool replans = false;
};


/// Link policy: the AG and the EG on one GPU; the links are device-to-device copies.
struct CoLocated {};

/// Link policy: the AG and the EG on different ranks of `Comm` (a device-memory communicator with
/// send / recv and set_stream, e.g. collective::Nccl), one GPU each; the links are its messages.
template <class Comm>
struct PointToPoint {};

namespace detail_cuda {
/// The communicator type of a link policy (none for CoLocated).
template <class Link>
struct LinkComm {
  static_assert(sizeof(Link) == 0, "FinDepCudaExecutor: the Link policy must be schedule::CoLocated or "
                                   "schedule::PointToPoint<Comm>");
};
template <>
struct LinkComm<CoLocated> {
  struct None {};
  using type = None;
  static constexpr bool colocated = true;
};
template <class Comm>
struct LinkComm<PointToPoint<Comm>> {
  static_assert(PointToPointDevice<Comm>,
                "FinDepCudaExecutor: PointToPoint<Comm> needs a device-memory communicator with send, recv and "
                "set_stream(cudaStream_t) (e.g. collective::Nccl)");
  using type = Comm;
  static constexpr bool colocated = false;
};
}  // namespace detail_cuda

/// One MoE layer under a FinDEP or PPPipe schedule on CUDA streams (the file comment).
///
///   // co-located: every routed and shared expert on this GPU
///   FinDepCudaExecutor<Model, Router> ex(device_weights, {.max_tokens = 4096});
///   ex.run({.tokens = n, .x = x, .y = y, .stream = s}, config, workspace);
///
///   // point to point: ranks [0, ag) AG, [ag, size) EG; on_eg: expert -> EG index
///   FinDepCudaExecutor<Model, Router, PointToPoint<collective::Nccl>> ex(a2e_comm, e2a_comm, ag, on_eg,
///                                                                         device_weights, options);
///   ex.run({.tokens = n, .x = x, .y = y, .stream = s}, config, workspace);   // AG ranks
///   ex.run({.tokens = n, .stream = s}, config, workspace);                    // EG ranks: same n, no x / y
///
/// Point to point, per chunk and (AG, EG) pair, the A2E carries an 8-byte record count and a fixed
/// region of `chunk` records (worst case: every token of the chunk has an expert on that EG rank);
/// the E2A carries `chunk` partial rows back. Requirements: two communicators over the same ranks,
/// one per link stream (NCCL runs the operations of one communicator in the order they were
/// issued, so sends of chunk c + 1 on the A2E stream and receives of chunk c on the E2A stream would
/// wait on each other); every rank calls run() with the same tokens (per AG rank) and
/// configuration; the GPU must be able to run the A2E and E2A communication kernels concurrently
/// (NCCL's usual caveat for several communicators).
///
/// Replicated experts (point to point; optional `replicas`, a replication::Table over EG indices)
/// follow the host executor's rule (schedule/findep_executor.hpp): token t of AG rank p uses copy
/// (p + t) mod n of the n copies the table lists for an expert, and an EG rank serves every expert
/// it holds a copy of. With `split` (a replication::BatchSplit over EG indices, the same copies)
/// each micro-batch's pairs are split instead, as the host executor does, all on the A2E stream
/// before the micro-batch's first chunk: the pairs counted per expert, the counts swapped with the
/// other AG ranks over the A2E communicator (pair by pair in one order, the lower rank sending
/// first), the split kernel (kernels::cuda::DeviceSplit) on the counts of every AG rank, and this
/// rank's pairs dealt in token order within each expert. No host synchronisation; EG ranks take no
/// part (their message regions are sized for the worst case already).
template <ModelShape Model, router::Policy Router, class Link = CoLocated>
class FinDepCudaExecutor {
  using Traits = detail_cuda::LinkComm<Link>;
  static constexpr bool colocated = Traits::colocated;

public:
  using Comm = typename Traits::type;  ///< the link's communicator (an empty stand-in for CoLocated)
  static constexpr ShapeSpec shape = Model::spec;
  using element_type = storage_t<shape>;
  using T = element_type;

  static_assert(shape.hidden > 0 && shape.experts > 0 && shape.top_k > 0 && shape.top_k <= shape.experts,
                "FinDepCudaExecutor: the model shape needs positive sizes and top_k <= experts");
  static_assert(Router::fits(shape), "FinDepCudaExecutor: this Router policy does not fit the model's scoring and "
                                     "grouping (see router::ForModel<Model>)");
  static_assert(shape.hidden % kernels::cuda::vec_elems<T> == 0 && shape.expert_ffn % kernels::cuda::vec_elems<T> == 0 &&
                    shape.shared_ffn % kernels::cuda::vec_elems<T> == 0,
                "FinDepCudaExecutor: hidden and FFN widths must be multiples of 16 bytes of the storage type");

  struct Arguments {
    int tokens = 0;        ///< tokens of this run; point to point: per AG rank (EG ranks pass the same number)
    T const* x = nullptr;  ///< AG: device, tokens x hidden, 16-byte aligned; EG ranks: unused
    T* y = nullptr;        ///< AG: device, tokens x hidden, written; EG ranks: unused
    cudaStream_t stream = nullptr;
  };

  static constexpr int a2e_tag = 0;
  static constexpr int e2a_tag = 1;

  /// Co-located: `weights` are device pointers, every routed and shared expert present.
  FinDepCudaExecutor(LayerWeights<T> weights, FinDepCudaOptions options)
    requires colocated
      : FinDepCudaExecutor(nullptr, nullptr, 0, 1, 1, placement::Table::contiguous(shape.experts, 1), weights, options,
                           {}, nullptr) {}

  /// Point to point over two communicators of the same ranks, `ag` AG ranks first; `on_eg` places
  /// every expert on an EG index, `replicas` (optional) adds copies, `split` (optional, the same
  /// copies) splits each micro-batch over them.
  FinDepCudaExecutor(Comm& a2e, Comm& e2a, int ag, placement::Table on_eg, LayerWeights<T> weights,
                     FinDepCudaOptions options, replication::Table const& replicas = {},
                     replication::BatchSplit const* split = nullptr)
    requires(!colocated)
      : FinDepCudaExecutor(&a2e, &e2a, a2e.rank(), a2e.size(), ag, std::move(on_eg), weights, options, replicas,
                           split) {}

  FinDepCudaExecutor(FinDepCudaExecutor const&) = delete;
  FinDepCudaExecutor& operator=(FinDepCudaExecutor const&) = delete;

  [[nodiscard]] int rank() const { return rank_; }
  /// Whether this rank runs the AG's operations (A, S, and the AG halves of the links).
  [[nodiscard]] bool is_ag() const { return colocated || rank_ < ag_; }
  /// Whether this rank runs the EG's operations (E, and the EG halves of the links).
  [[nodiscard]] bool is_eg() const { return colocated || rank_ >= ag_; }
  [[nodiscard]] int attention_ranks() const { return ag_; }
  [[nodiscard]] int expert_ranks() const { return eg_; }

  /// Bytes of caller-owned device workspace run() needs on this rank (AG and EG ranks differ).
  [[nodiscard]] std::size_t workspace_size() const {
    core::Carver c;
    Buffers b;
    carve(c, b);
    return c.used();
  }

  /// Checks the arguments and the configuration without enqueuing anything.
  [[nodiscard]] Status can_implement(Arguments const& a, Config const& c) const {
    using moe::detail::concat;
    if (is_ag()) {
      Status st = moe::detail::check_run_arguments(who, "FinDepCudaOptions", a.tokens, options_.max_tokens, a.x, a.y);
      if (!st.ok) return st;
      if (reinterpret_cast<std::uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<std::uintptr_t>(a.y) % 16 != 0)
        return {false, concat(who, ": x and y must be 16-byte aligned")};
    } else {
      if (a.tokens < 0) return {false, concat(who, ": negative token count ", a.tokens)};
      if (a.tokens > options_.max_tokens)
        return {false, concat(who, ": ", a.tokens, " tokens per AG rank exceed the ", options_.max_tokens,
                              " the workspace was sized for (FinDepCudaOptions::max_tokens)")};
    }
    return detail_cuda::check_schedule(who, a.tokens, c, options_.max_chunks);
  }

  /// One forward pass under schedule `c` (pipeline, order, r1, r2; m_a is not used: a micro-batch
  /// holds tokens / r1 tokens), enqueued on a.stream. Point to point: every rank calls it with the
  /// same tokens (per AG rank) and configuration.
  void run(Arguments const& a, Config const& c, std::span<std::byte> workspace) {
    namespace kc = kernels::cuda;
    Status st = can_implement(a, c);
    check(st.ok, st.message);
    core::check_workspace(who, workspace.size(), workspace_size());
    if (a.tokens == 0) return;  // every rank sees the same count, so no rank waits for a message
    StreamPlan const& plan = plans_.get(c, shape.shared_experts > 0, pool_.events.size() - run_events, who);
    core::Carver carver(workspace);
    Buffers b;
    carve(carver, b);
    Run r{a, b, a.tokens / c.r1 / c.r2, c.r2};

    std::size_t own = pool_.events.size() - run_events;  // fork, A2E done, E2A done, joins
    pool_.fork(a.stream, own);
    if (is_eg())
      kc::check_cuda(cudaMemsetAsync(experts_.errors(), 0, sizeof(unsigned), stream(Resource::eg)), "cudaMemsetAsync");

    for (LaunchStep step : plan.launch) {
      PlanOp const& o = plan.op(step);
      if (!here(o.kind)) continue;
      cudaStream_t s = stream(o.stream);
      for (int w : o.waits) {
        PlanEvent ev = plan.events[static_cast<std::size_t>(w)];
        if (!here(plan.op({ev.stream, ev.index}).kind)) continue;  // the message itself orders it
        kc::check_cuda(cudaStreamWaitEvent(s, pool_.events[static_cast<std::size_t>(w)], 0), "cudaStreamWaitEvent");
      }
      int chunk = o.mb * c.r2 + o.chunk;
      switch (o.kind) {
        case TaskKind::attention: attention(r, o.mb); break;
        case TaskKind::shared: shared_experts(r, o.mb); break;
        case TaskKind::a2e: is_ag() ? send_chunk(r, chunk) : receive_chunk(r, chunk); break;
        case TaskKind::experts: experts(r, chunk); break;
        case TaskKind::e2a: is_eg() ? send_partials(r, chunk) : receive_partials(r, chunk); break;
      }
      if (o.record >= 0)
        kc::check_cuda(cudaEventRecord(pool_.events[static_cast<std::size_t>(o.record)], s), "cudaEventRecord");
    }

    if (is_ag()) {
      // After every send (the record layout the sum reads) and every receive: y per chunk.
      cudaStream_t ag = stream(Resource::ag);
      for (Resource link : {Resource::a2e, Resource::e2a}) {
        cudaEvent_t done = pool_.events[own + (link == Resource::a2e ? 1 : 2)];
        kc::check_cuda(cudaEventRecord(done, stream(link)), "cudaEventRecord (link done)");
        kc::check_cuda(cudaStreamWaitEvent(ag, done, 0), "cudaStreamWaitEvent (link done)");
      }
      auto n = static_cast<std::size_t>(r.chunk);
      for (int q = 0; q < c.r1 * c.r2; ++q) {
        auto uq = static_cast<std::size_t>(q);
        std::size_t t0 = uq * n;
        kc::finish_tokens<T>(ag, r.chunk, shape.hidden, eg_, b.rec_count.data() + uq * count_stride(r),
                             b.rec_pos.data() + uq * count_stride(r), b.send_base.data() + uq * ueg(),
                             b.returned.data() + ueg() * t0 * h,
                             shape.shared_experts > 0 ? b.shared_acc.data() + t0 * h : nullptr, a.y + t0 * h);
      }
    }
    pool_.join(a.stream, own + 3);
    if constexpr (!colocated) {
      // The link streams are the executor's own: leave the communicators on the caller's stream, so
      // a collective the engine issues next without set_stream is ordered after this layer.
      a2e_->set_stream(a.stream);
      e2a_->set_stream(a.stream);
    }
  }

  /// Error bits (kernels::cuda::DeviceError) the EG raised in the last run() (0 on an AG-only
  /// rank). Synchronises the device (the resource streams are non-blocking, so a plain cudaMemcpy
  /// would not wait for them): a diagnostic for tests and debugging, not for the hot path.
  [[nodiscard]] unsigned errors() const { return experts_.read_errors(); }
  /// Whether this executor splits each micro-batch (the `split` constructor argument).
  [[nodiscard]] bool splits() const { return split_.has_value(); }
  /// Bytes of split counts an AG rank sends in a run of `r1` micro-batches (they travel on the A2E
  /// communicator beside the records).
  [[nodiscard]] std::size_t split_bytes(int r1) const {
    return splits() && is_ag() ? static_cast<std::size_t>(r1) * (uag() - 1) * E * sizeof(std::int32_t) : 0;
  }
  /// The load window's row of this rank (moe/layer/live.hpp) for the run() of `tokens` tokens
  /// with `workspace`, enqueued on `stream` after that run: `counts` (device, experts + ranks
  /// int32, ranks = ag + eg) gets, on an AG rank, its pairs per expert and then the pairs it sent
  /// to each rank (EG index g is rank ag + g); an EG rank's row is zero, since every pair is counted
  /// once, by the AG rank that routed it.
  void count_loads(std::span<std::byte const> workspace, int tokens, std::int32_t* counts, cudaStream_t stream) const {
    int ranks = ag_ + eg_;
    if (!is_ag() || tokens == 0) {
      kernels::cuda::check_cuda(cudaMemsetAsync(counts, 0, (E + static_cast<std::size_t>(ranks)) * sizeof(std::int32_t), stream),
                                "cudaMemsetAsync (load counts)");
      return;
    }
    Buffers b = carved(workspace);
    kernels::cuda::count_loads(stream, b.ids.data(), b.dest.data(), static_cast<long long>(tokens) * shape.top_k,
                               shape.experts, ranks, counts, ag_);
  }
  /// The dispatch records of the run() of `tokens` tokens under `c` with `workspace`, enqueued on
  /// `stream` after that run: out[0] (device) gets the records this rank sent as an AG rank (to
  /// every EG rank, summed over the run's chunks), out[1] those it received as an EG rank (from
  /// every AG rank). A role the rank does not have, and a run of no tokens, count 0. One memset
  /// and one single-block kernel; no host synchronisation, so it can be captured with the run.
  void count_records(std::span<std::byte const> workspace, int tokens, Config const& c, std::uint64_t* out,
                     cudaStream_t stream) const {
    static_assert(sizeof(std::uint64_t) == sizeof(unsigned long long));
    namespace kc = kernels::cuda;
    kc::check_cuda(cudaMemsetAsync(out, 0, 2 * sizeof(std::uint64_t), stream), "cudaMemsetAsync (record counts)");
    if (tokens == 0) return;
    Buffers b = carved(workspace);
    long long chunks = static_cast<long long>(c.r1) * c.r2;
    long long n_sent = is_ag() ? chunks * eg_ : 0, n_received = is_eg() ? chunks * ag_ : 0;
    kc::launch(detail_cuda::sum_record_counts_kernel, 1, 256, 0, stream, b.send_count.data(), n_sent,
               b.counts.data(), n_received, reinterpret_cast<unsigned long long*>(out));
    kc::check_launch("sum_record_counts_kernel");
  }
  /// AG rank, after its last run() of `tokens` tokens (reads that run's workspace; synchronises the
  /// device; for tests): the EG index each (token, slot) pair was sent to.
  [[nodiscard]] std::vector<int> destinations(std::span<std::byte const> workspace, int tokens) const {
    check(is_ag() && tokens >= 0 && tokens <= options_.max_tokens, who,
          ": destinations on an EG rank or for a bad token count");
    Buffers b = carved(workspace);
    kernels::cuda::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (destinations)");
    std::vector<int> out(static_cast<std::size_t>(tokens) * uk);
    kernels::cuda::check_cuda(cudaMemcpy(out.data(), b.dest.data(), out.size() * sizeof(int), cudaMemcpyDeviceToHost),
                              "cudaMemcpy (destinations)");
    return out;
  }
  /// AG rank with a split, after its last run() (reads that run's workspace; synchronises the
  /// device; for tests): the pairs each EG index received by the splits, summed over the
  /// micro-batches, then the sum over micro-batches of the busiest EG index's pairs.
  [[nodiscard]] std::vector<long long> split_loads(std::span<std::byte const> workspace) const {
    check(splits() && is_ag(), who, ": split_loads on a rank without a split");
    Buffers b = carved(workspace);
    kernels::cuda::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (split loads)");
    std::vector<long long> out(ueg() + 1);
    kernels::cuda::check_cuda(cudaMemcpy(out.data(), b.split_acc.data(), out.size() * sizeof(long long),
                                         cudaMemcpyDeviceToHost),
                              "cudaMemcpy (split loads)");
    return out;
  }
  /// The plan of the last run() (empty before the first).
  [[nodiscard]] StreamPlan const& plan() const { return plans_.plan; }
  [[nodiscard]] FinDepCudaOptions const& options() const { return options_; }
  /// The stream of one resource (e.g. to time it or to inspect a capture).
  [[nodiscard]] cudaStream_t stream(Resource r) const { return pool_.streams[static_cast<std::size_t>(r)]; }

  // ---- Switching plans while serving (point to point; moe::Layer with LayerOptions::live) ----

  /// The device tables of one plan: the copy lists (AG), the served experts' weight tables (EG),
  /// the error word, and on an AG rank that splits, the split of the plan's copies.
  struct Tables {
    moe::detail::DeviceExpertTable<T> experts;
    std::optional<kernels::cuda::DeviceSplit> split;
    replication::CopyLists copies;  // what they were built from (EG indices)
  };
  /// Builds and checks another plan's tables as the constructor checks the first: `on_eg` and
  /// `replicas` over EG indices, `experts` the weights this rank serves in that plan, `split` the
  /// plan's BatchSplit on an executor that splits (null: the same copies, the current split kept;
  /// other copies without their split are refused on a splitting AG rank).
  /// No EG rank may hold more experts than the busiest of the first plan, and without
  /// FinDepCudaOptions::replans none more than it held in the first plan (the workspace's bounds).
  /// Throws moe::Error naming the problem; the executor is not changed.
  [[nodiscard]] Tables prepare_tables(placement::Table const& on_eg, replication::Table const& replicas,
                                      std::span<ExpertWeights<T> const> experts,
                                      replication::BatchSplit const* split) const
    requires(!colocated)
  {
    check(static_cast<int>(experts.size()) == shape.experts, who, ": weights list ", experts.size(),
          " experts, the shape has ", shape.experts);
    check(split == nullptr || splits() || !is_ag(), who, ": a batch split for an executor built without one");
    replication::CopyLists copies = copy_lists_of(on_eg, replicas);
    check(split != nullptr || !splits() || !is_ag() || (copies.first == copies_.first && copies.ranks == copies_.ranks),
          who, ": new copies without their batch split (the split in use deals pairs over the copies it was built for)");
    for (int g = 0; g < eg_; ++g) {
      int held = held_by(copies, g);
      check(held <= held_bound_, who, ": the plan gives EG index ", g, " ", held,
            " experts; a plan may give an EG rank at most ", held_bound_, " (the first plan's most)");
      if (is_eg() && g == eg_index())
        check(held <= served_bound_, who, ": the plan gives EG index ", g, " ", held,
              " experts; its workspace was sized for ", served_bound_,
              " (FinDepCudaOptions::replans sizes it for any plan)");
    }
    Tables t = make_tables(on_eg, copies, experts, split);
    if (t.split)
      check(t.split->take_size() <= split_take_bound_ && t.split->workspace_bytes() <= split_work_bound_, who,
            ": the plan's split needs ", t.split->take_size(), " take entries and ", t.split->workspace_bytes(),
            " workspace bytes; the workspace holds ", split_take_bound_, " and ", split_work_bound_);
    return t;
  }
  /// Switches to tables from prepare_tables() between runs (after the last run's work: the caller
  /// has synchronised its stream); the EG serves `experts` from now on. Nothing here can fail.
  void adopt(Tables&& t, std::span<ExpertWeights<T> const> experts) noexcept {
    experts_ = std::move(t.experts);
    if (t.split) split_ = std::move(t.split);
    copies_ = std::move(t.copies);
    weights_.experts = experts;
  }
  /// The routed experts' weights the EG serves from.
  [[nodiscard]] std::span<ExpertWeights<T> const> expert_weights() const { return weights_.experts; }

private:
  static constexpr char const* who = "moe::schedule::FinDepCudaExecutor";
  static constexpr auto h = static_cast<std::size_t>(shape.hidden);
  static constexpr int k = shape.top_k;
  static constexpr auto uk = static_cast<std::size_t>(shape.top_k);
  static constexpr auto E = static_cast<std::size_t>(shape.experts);
  static constexpr std::size_t run_events = 3 + resource_count;  // fork, A2E done, E2A done, joins
  static constexpr std::size_t meta_bytes = moe::detail::record_meta_bytes(shape.top_k);  // kernels/records.hpp
  static constexpr std::size_t record_bytes = meta_bytes + h * sizeof(T);  // h * sizeof(T): a multiple of 16

  /// Both constructors end here; a2e / e2a are null for CoLocated.
  FinDepCudaExecutor(Comm* a2e, Comm* e2a, int rank, int size, int ag, placement::Table on_eg, LayerWeights<T> weights,
                     FinDepCudaOptions options, replication::Table const& replicas,
                     replication::BatchSplit const* split)
      : a2e_(a2e), e2a_(e2a), rank_(rank), ag_(ag), eg_(colocated ? 1 : size - ag), weights_(weights),
        options_(options) {
    namespace kc = kernels::cuda;
    moe::detail::keep_shared_list(weights_, shared_);  // run() reads the shared list
    moe::detail::prepare_gemm_path<T>(who, options_.gemm);  // probes before any capture
    if constexpr (!colocated) {
      check(a2e != e2a, who, ": the A2E and E2A streams need two communicators (one each); NCCL runs one "
                             "communicator's operations in issue order, so one shared by both links would deadlock");
      check(a2e->size() == e2a->size() && a2e->rank() == e2a->rank(), who, ": the two communicators differ (sizes ",
            a2e->size(), " and ", e2a->size(), ", ranks ", a2e->rank(), " and ", e2a->rank(), ")");
      check(ag_ >= 1, who, ": the attention group (AG) is empty; it needs at least one rank, got ag = ", ag_);
      check(eg_ >= 1, who, ": the expert group (EG) is empty: the communicator has ", size, " ranks and ", ag_,
            " of them are AG ranks");
    }
    check(options_.max_tokens >= 1, who, ": max_tokens must be positive, got ", options_.max_tokens);
    check(options_.max_chunks >= 1, who, ": max_chunks must be at least 1, got ", options_.max_chunks);
    check(options_.max_chunks <= max_cuda_chunks, who, ": max_chunks = ", options_.max_chunks,
          " is above the limit of ", max_cuda_chunks, " (about 5 CUDA events per chunk)");
    check(static_cast<int>(weights_.experts.size()) == shape.experts, who, ": weights list ", weights_.experts.size(),
          " experts, the shape has ", shape.experts);
    check(static_cast<int>(weights_.shared.size()) == shape.shared_experts, who, ": weights list ",
          weights_.shared.size(), " shared experts, the shape has ", shape.shared_experts);
    if (is_ag()) {
      check(weights_.router != nullptr, who, ": AG rank ", rank_, " has no router weights");
      for (int e = 0; e < shape.shared_experts; ++e) {
        auto const& w = weights_.shared[static_cast<std::size_t>(e)];
        check(w.present(), who, ": AG rank ", rank_, " misses the weights of shared expert ", e);
        moe::detail::check_expert_alignment(who, w, "shared ", e);
      }
      scan_bytes_ = kc::exclusive_sum_bytes(static_cast<long long>(eg_) * options_.max_tokens);
      count_ints_ = count_ints();
    }
    replication::CopyLists copies = copy_lists_of(on_eg, replicas);
    for (int g = 0; g < eg_; ++g) held_bound_ = std::max(held_bound_, held_by(copies, g));
    if (is_eg()) served_bound_ = options_.replans ? held_bound_ : held_by(copies, eg_index());
    Tables first = make_tables(on_eg, copies, weights_.experts, split);
    experts_ = std::move(first.experts);
    split_ = std::move(first.split);
    copies_ = std::move(first.copies);
    if (is_eg())
      eg_sort_bytes_ = kc::sort_items_bytes(static_cast<long long>(ag_) * options_.max_tokens * k, shape.experts);
    if (split_) {
      sort_ = kc::make_stream();
      sort_fork_ = kc::make_event();
      sort_join_ = kc::make_event();
      split_sort_bytes_ = kc::sort_items_bytes(static_cast<long long>(options_.max_tokens) * k, shape.experts);
      split_take_bound_ = split_->take_size();
      split_work_bound_ = split_->workspace_bytes();
      if (options_.replans) {
        // A plan whose EG ranks hold at most held_bound_ experts has at most eg x held_bound_
        // copies, and an expert at most eg of them, so at most copies x (eg - 1) arcs.
        replication::split::Layout most = split_->layout();
        most.slots = eg_ * held_bound_;
        most.arcs = most.slots * (eg_ - 1);
        split_take_bound_ = static_cast<std::size_t>(most.ranks) * static_cast<std::size_t>(most.slots);
        split_work_bound_ = static_cast<std::size_t>(replication::split::workspace_words(most)) * sizeof(long long);
      }
    }
    pool_.create(static_cast<std::size_t>(max_plan_events(options_.max_chunks, 1, true)) + run_events);
    if (is_ag()) cublas_ = kc::make_cublas();
  }

  /// Each expert's copies (EG indices): the table's lists, or the placement's index; both checked.
  [[nodiscard]] replication::CopyLists copy_lists_of(placement::Table const& on_eg,
                                                     replication::Table const& replicas) const {
    on_eg.validate(shape.experts, eg_);
    if (!replicas.replicas().empty()) replicas.validate(shape.experts, eg_, on_eg.ranks());
    return replication::copy_lists(on_eg.ranks(), replicas);
  }
  /// Experts EG index g holds a copy of.
  static int held_by(replication::CopyLists const& copies, int g) {
    int held = 0;
    for (int e = 0; e < shape.experts; ++e) held += copies.holds(e, g) ? 1 : 0;
    return held;
  }
  /// One plan's tables: senders (AG) read the copy lists, the EG serves the copies of its index,
  /// and an AG rank given a split solves it over the same copies (EG ranks take no part: the class
  /// comment; co-located never gets one).
  Tables make_tables(placement::Table const& on_eg, replication::CopyLists const& copies,
                     std::span<ExpertWeights<T> const> experts, replication::BatchSplit const* split) const {
    Tables t;
    t.experts = moe::detail::DeviceExpertTable<T>(copies, on_eg.ranks(), is_ag(), is_eg() ? eg_index() : -1, experts,
                                                  who, "EG index");
    if (split && is_ag()) {
      check(split->layout().ranks == eg_, who, ": the batch split is built for ", split->layout().ranks,
            " ranks, the expert group has ", eg_);
      auto const& listed = split->table().replicas();
      check(static_cast<int>(listed.size()) == shape.experts, who, ": the batch split lists ", listed.size(),
            " experts, the shape has ", shape.experts);
      for (std::size_t e = 0; e < listed.size(); ++e) {
        bool same = static_cast<int>(listed[e].size()) == copies.copies(static_cast<int>(e));
        for (int g : listed[e]) same = same && copies.holds(static_cast<int>(e), g);
        check(same, who, ": the batch split's copies of expert ", e, " are not the executor's");
      }
      t.split.emplace(split->with_sources(ag_).layout());  // EG indices, then the AG ranks
    }
    t.copies = copies;
    return t;
  }

  /// This rank's EG index (EG ranks; co-located: 0).
  [[nodiscard]] int eg_index() const { return colocated ? 0 : rank_ - ag_; }
  /// This rank's AG index (AG ranks; co-located: 0).
  [[nodiscard]] int ag_index() const { return rank_; }

  /// Whether this rank runs (its half of) an operation of the plan.
  [[nodiscard]] bool here(TaskKind kind) const {
    switch (kind) {
      case TaskKind::attention:
      case TaskKind::shared: return is_ag();
      case TaskKind::experts: return is_eg();
      default: return true;  // links: the sending or the receiving half
    }
  }

  [[nodiscard]] std::size_t ueg() const { return static_cast<std::size_t>(eg_); }
  [[nodiscard]] std::size_t uag() const { return static_cast<std::size_t>(ag_); }
  [[nodiscard]] std::size_t um() const { return static_cast<std::size_t>(options_.max_tokens); }
  /// Most chunks a run() can have: r1 * r2 <= max_chunks, and every chunk holds a token.
  [[nodiscard]] std::size_t uchunks() const {
    return std::min(static_cast<std::size_t>(options_.max_chunks), um());
  }

  struct Buffers {
    // AG. Per token: ids, gate_w, dest, shared_acc; per chunk: rec_count / rec_pos (a region of
    // count_stride ints, 256-byte aligned for the CUB scan), send_count / send_base (eg each), send
    // (eg x chunk records), returned (eg x chunk rows).
    std::span<float> logits;
    std::span<int> ids, dest;
    std::span<float> gate_w;
    std::span<T> shared_inter;
    std::span<float> shared_acc;
    std::span<std::byte> cublas;
    std::span<int> rec_count, rec_pos;
    std::span<std::byte> scan_temp;
    std::span<std::uint64_t> send_count;
    std::span<long long> send_base;
    std::span<std::byte> send;
    std::span<T> returned;
    // AG with a split: one micro-batch's counts of every rank (EG indices, then AG ranks), the
    // split's outputs and workspace, the run's totals (split_loads), and the pairs' expert order
    // (split_values .. split_sort_temp).
    std::span<std::int32_t> split_counts, split_take;
    std::span<long long> split_load, split_acc, split_work;
    std::span<replication::split::Outcome> split_outcome;
    std::span<int> split_values, split_sorted_keys, split_sorted_values, split_offsets;
    std::span<std::byte> split_sort_temp;
    // EG. Per chunk: counts (ag), recv (ag x chunk records), back (ag x chunk rows); the rest is
    // EG-stream scratch for the largest chunk.
    std::span<std::uint64_t> counts;
    std::span<std::byte> recv;
    std::span<T> back;
    std::span<long long> recv_base;
    std::span<int> recv_n;
    std::span<int> keys, values, sorted_keys, sorted_values, position;
    std::span<std::byte> sort_temp;
    std::span<int> offsets, tile_starts;
    std::span<T> inter, expert_out;
  };

  struct Run {
    Arguments const& a;
    Buffers const& b;
    int chunk;   // tokens per chunk
    int r2 = 1;  // chunks per micro-batch
  };

  /// Ints between two chunks' record-count regions: eg x chunk rounded up to 64 (256 bytes).
  [[nodiscard]] std::size_t count_stride(std::size_t chunk) const { return (ueg() * chunk + 63) / 64 * 64; }
  [[nodiscard]] std::size_t count_stride(Run const& r) const { return count_stride(static_cast<std::size_t>(r.chunk)); }

  /// Ints of the record-count regions (rec_count, rec_pos): the end of the last region over every
  /// run the options allow. A run of q chunks has at most max_tokens / q tokens per chunk (q divides
  /// its tokens), and its last region ends at (q - 1) x count_stride + eg x chunk.
  [[nodiscard]] std::size_t count_ints() const {
    std::size_t most = 0;
    for (std::size_t q = 1; q <= uchunks(); ++q) {
      std::size_t n = um() / q;
      most = std::max(most, (q - 1) * count_stride(n) + ueg() * n);
    }
    return most;
  }

  /// The AG pieces (on an AG rank), then the EG pieces (on an EG rank); co-located: both.
  void carve(core::Carver& c, Buffers& b) const {
    std::size_t m = um();
    if (is_ag()) {
      bool shared = shape.shared_experts > 0;
      b.logits = c.take<float>(m * E);
      b.ids = c.take<int>(m * uk);
      b.dest = c.take<int>(m * uk);
      b.gate_w = c.take<float>(m * uk);
      b.shared_inter = c.take<T>(shared ? m * static_cast<std::size_t>(shape.shared_ffn) : 0);
      b.shared_acc = c.take<float>(shared ? m * h : 0);
      b.cublas = c.take<std::byte>(options_.cublas_workspace);
      b.rec_count = c.take<int>(count_ints_);
      b.rec_pos = c.take<int>(count_ints_);
      b.scan_temp = c.take<std::byte>(scan_bytes_);
      b.send_count = c.take<std::uint64_t>(uchunks() * ueg());
      b.send_base = c.take<long long>(uchunks() * ueg());
      b.send = c.take<std::byte>(ueg() * m * record_bytes);
      b.returned = c.take<T>(ueg() * m * h);
      if (split_) {
        std::size_t items = m * uk;
        b.split_counts = c.take<std::int32_t>((ueg() + uag()) * E);
        b.split_take = c.take<std::int32_t>(split_take_bound_);
        b.split_load = c.take<long long>(split_->load_size());
        b.split_acc = c.take<long long>(ueg() + 1);
        b.split_work = c.take<long long>(split_work_bound_ / sizeof(long long));
        b.split_outcome = c.take<replication::split::Outcome>(1);
        b.split_values = c.take<int>(items);
        b.split_sorted_keys = c.take<int>(items);
        b.split_sorted_values = c.take<int>(items);
        b.split_offsets = c.take<int>(E + 1);
        b.split_sort_temp = c.take<std::byte>(split_sort_bytes_);
      }
    }
    if (is_eg()) {
      std::size_t slots = uag() * m, items = slots * uk;
      b.counts = c.take<std::uint64_t>(uchunks() * uag());
      b.recv = c.take<std::byte>(slots * record_bytes);
      b.back = c.take<T>(slots * h);
      b.recv_base = c.take<long long>(uag());
      b.recv_n = c.take<int>(uag());
      b.keys = c.take<int>(items);
      b.values = c.take<int>(items);
      b.sorted_keys = c.take<int>(items);
      b.sorted_values = c.take<int>(items);
      b.position = c.take<int>(items);
      b.sort_temp = c.take<std::byte>(eg_sort_bytes_);
      b.offsets = c.take<int>(E + 1);
      b.tile_starts = c.take<int>(E + 1);
      std::size_t rows = slots * rows_per_record();  // <= items
      b.inter = c.take<T>(rows * static_cast<std::size_t>(shape.expert_ffn));
      b.expert_out = c.take<T>(rows * h);
    }
  }

  /// The buffers of a workspace a run() used (for the test accessors).
  [[nodiscard]] Buffers carved(std::span<std::byte const> workspace) const {
    core::Carver carver(std::span<std::byte>(const_cast<std::byte*>(workspace.data()), workspace.size()));
    Buffers b;
    carve(carver, b);
    return b;
  }

  /// EG: most expert rows one record yields here (a record names the experts of its token that
  /// this rank serves, at most k), for every plan the executor may adopt.
  [[nodiscard]] std::size_t rows_per_record() const {
    return static_cast<std::size_t>(std::max(1, std::min(k, served_bound_)));
  }

  // A(i): gate logits and routing of micro-batch i (AG stream).
  void attention(Run const& r, int i) const {
    auto mb = static_cast<std::size_t>(r.chunk) * static_cast<std::size_t>(r.r2);
    auto first = static_cast<std::size_t>(i) * mb;
    detail_cuda::findep_attention<shape, Router>(cublas_.get(), stream(Resource::ag), r.b.cublas, weights_,
                                                 r.a.x + first * h, static_cast<int>(mb), r.b.logits.data(),
                                                 r.b.ids.data() + first * uk, r.b.gate_w.data() + first * uk);
  }

  // S(i): fp32 sum of the shared experts of micro-batch i (AG stream).
  void shared_experts(Run const& r, int i) const {
    auto mb = static_cast<std::size_t>(r.chunk) * static_cast<std::size_t>(r.r2);
    auto first = static_cast<std::size_t>(i) * mb;
    moe::detail::shared_experts<shape>(stream(Resource::ag), weights_.shared, r.a.x + first * h, static_cast<int>(mb),
                                       r.b.shared_inter.data(), r.b.shared_acc.data() + first * h, options_.gemm);
  }

  /// Enqueues a device-to-device copy of `bytes` on `s` (the co-located links).
  static void copy(void* to, void const* from, std::size_t bytes, cudaStream_t s, char const* what) {
    kernels::cuda::check_cuda(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, s), what);
  }

  // AG, A2E stream: records of chunk q (one region of `chunk` records per EG rank), then per EG
  // rank its record count and its region.
  void send_chunk(Run const& r, int q) const {
    namespace kc = kernels::cuda;
    cudaStream_t s = stream(Resource::a2e);
    Buffers const& b = r.b;
    auto uq = static_cast<std::size_t>(q), n = static_cast<std::size_t>(r.chunk);
    std::size_t t0 = uq * n;
    int* count = b.rec_count.data() + uq * count_stride(r);
    int* pos = b.rec_pos.data() + uq * count_stride(r);
    std::uint64_t* send_count = b.send_count.data() + uq * ueg();
    long long* send_base = b.send_base.data() + uq * ueg();
    std::byte* records = b.send.data() + ueg() * t0 * record_bytes;
    if (split_) {
      if (q % r.r2 == 0) split_micro_batch(r, q / r.r2);
      kc::count_records<k>(s, b.dest.data() + t0 * uk, r.chunk, eg_, true, count);
    } else {
      // Copy (p + t) mod n of an expert's n copies for token t of this AG rank p (no copy is local).
      kc::ReplicaView view = experts_.replica_view(false);
      kc::plan_records<k>(s, b.ids.data() + t0 * uk, r.chunk, eg_, view, ag_index(), static_cast<long long>(t0), true,
                          b.dest.data() + t0 * uk, count);
    }
    kc::exclusive_sum(s, b.scan_temp.data(), b.scan_temp.size(), count, pos, static_cast<long long>(ueg() * n));
    kc::send_layout(s, count, pos, r.chunk, eg_, static_cast<long long>(n), send_count, send_base);
    kc::pack_records<T, k>(s, r.a.x + t0 * h, r.chunk, shape.hidden, b.ids.data() + t0 * uk, b.gate_w.data() + t0 * uk,
                           b.dest.data() + t0 * uk, pos, send_base, true, records, record_bytes, meta_bytes, true);
    if constexpr (colocated) {
      // The one EG's count of chunk q and its region of records (receive_chunk's layout, ag = 1).
      copy(b.counts.data() + uq, send_count, sizeof(std::uint64_t), s, "cudaMemcpyAsync (A2E count)");
      copy(b.recv.data() + uq * n * record_bytes, records, n * record_bytes, s, "cudaMemcpyAsync (A2E records)");
    } else {
      a2e_->set_stream(s);
      for (int g = 0; g < eg_; ++g) {
        auto ug = static_cast<std::size_t>(g);
        a2e_->send(std::as_bytes(std::span(send_count + ug, 1)), ag_ + g, a2e_tag);
        a2e_->send(std::span<std::byte const>(records + ug * n * record_bytes, n * record_bytes), ag_ + g, a2e_tag);
      }
    }
  }

  // AG with a split, A2E stream: micro-batch i's pairs split over the copies, dealt into b.dest (EG
  // indices), and added to the run's totals (see the class comment).
  void split_micro_batch(Run const& r, int i) const {
    namespace kc = kernels::cuda;
    if constexpr (!colocated) {
      cudaStream_t s = stream(Resource::a2e);
      Buffers const& b = r.b;
      auto mb = static_cast<std::size_t>(r.chunk) * static_cast<std::size_t>(r.r2);
      std::size_t first = static_cast<std::size_t>(i) * mb * uk;
      long long n = static_cast<long long>(mb * uk);
      int me = ag_index();
      auto row = [&](int p) { return b.split_counts.subspan((ueg() + static_cast<std::size_t>(p)) * E, E); };
      if (i == 0) {
        kc::check_cuda(cudaMemsetAsync(b.split_counts.data(), 0, ueg() * E * sizeof(std::int32_t), s),
                       "cudaMemsetAsync (split counts)");  // the EG indices' rows stay zero
        kc::check_cuda(cudaMemsetAsync(b.split_acc.data(), 0, b.split_acc.size_bytes(), s),
                       "cudaMemsetAsync (split totals)");
      }
      // The sort by expert needs only the routing: on the sort stream, beside the count exchange
      // and the split kernel, joined before the deal. The next micro-batch's fork comes after this
      // deal on the A2E stream, so its sort cannot overwrite the sorted pairs being dealt.
      cudaStream_t ss = sort_.get();
      kc::check_cuda(cudaEventRecord(sort_fork_.get(), s), "cudaEventRecord (split sort fork)");
      kc::check_cuda(cudaStreamWaitEvent(ss, sort_fork_.get(), 0), "cudaStreamWaitEvent (split sort fork)");
      kc::order_by_expert(ss, b.ids.data() + first, n, shape.experts, b.split_values.data(),
                          b.split_sorted_keys.data(), b.split_sorted_values.data(), b.split_offsets.data(),
                          b.split_sort_temp.data(), b.split_sort_temp.size());
      kc::check_cuda(cudaEventRecord(sort_join_.get(), ss), "cudaEventRecord (split sort join)");
      split_->count(b.ids.data() + first, n, row(me).data(), s);
      a2e_->set_stream(s);
      collective::swap_rows_pairwise(*a2e_, me, ag_, row, a2e_tag);
      split_->run(b.split_counts.data(), b.split_take.data(), b.split_load.data(), b.split_outcome.data(),
                  split_->workspace_bytes() == 0 ? nullptr : b.split_work.data(), s);
      kc::check_cuda(cudaStreamWaitEvent(s, sort_join_.get(), 0), "cudaStreamWaitEvent (split sort join)");
      split_->deal_sorted(b.split_take.data(), eg_ + me, b.split_sorted_keys.data(), b.split_sorted_values.data(),
                          b.split_offsets.data(), n, b.dest.data() + first, s);
      kc::launch(detail_cuda::add_split_loads_kernel, 1, 32, 0, s, b.split_load.data(), eg_, b.split_outcome.data(),
                 b.split_acc.data());
      kc::check_launch("add_split_loads_kernel");
    }
  }

  // EG (point to point), A2E stream: chunk q's record count and region from every AG rank.
  void receive_chunk(Run const& r, int q) const {
    if constexpr (!colocated) {
      auto uq = static_cast<std::size_t>(q), n = static_cast<std::size_t>(r.chunk);
      std::byte* records = r.b.recv.data() + uag() * uq * n * record_bytes;
      a2e_->set_stream(stream(Resource::a2e));
      for (int p = 0; p < ag_; ++p) {
        auto up = static_cast<std::size_t>(p);
        a2e_->recv(std::as_writable_bytes(std::span(r.b.counts.data() + uq * uag() + up, 1)), p, a2e_tag);
        a2e_->recv(std::span<std::byte>(records + up * n * record_bytes, n * record_bytes), p, a2e_tag);
      }
    }
  }

  // EG, EG stream: this rank's experts on the records of chunk q from every AG rank.
  void experts(Run const& r, int q) const {
    namespace kc = kernels::cuda;
    cudaStream_t s = stream(Resource::eg);
    Buffers const& b = r.b;
    auto uq = static_cast<std::size_t>(q), n = static_cast<std::size_t>(r.chunk);
    std::byte const* records = b.recv.data() + uag() * uq * n * record_bytes;
    kc::recv_layout(s, b.counts.data() + uq * uag(), ag_, static_cast<long long>(n), b.recv_base.data(),
                    b.recv_n.data());
    auto pass = experts_.template routed<shape>(b, static_cast<int>(rows_per_record()), options_.gemm);
    pass.records = records;
    pass.record_bytes = record_bytes;
    pass.slots = static_cast<long long>(uag() * n);
    pass.recv_base = b.recv_base.data();
    pass.recv_n = b.recv_n.data();
    pass.sources = ag_;
    pass.a = records + meta_bytes;  // the token rows travel in the records
    pass.a_stride = record_bytes;
    pass.back = b.back.data() + uag() * uq * n * h;
    pass.enqueue(s);
  }

  // EG, E2A stream: chunk q's partial rows back to every AG rank (its region of `chunk` rows).
  void send_partials(Run const& r, int q) const {
    auto uq = static_cast<std::size_t>(q), n = static_cast<std::size_t>(r.chunk);
    T const* back = r.b.back.data() + uag() * uq * n * h;
    cudaStream_t s = stream(Resource::e2a);
    if constexpr (colocated) {
      // Into the one AG's region of chunk q from EG index 0 (receive_partials' layout, eg = 1).
      copy(r.b.returned.data() + uq * n * h, back, n * h * sizeof(T), s, "cudaMemcpyAsync (E2A partials)");
    } else {
      e2a_->set_stream(s);
      for (int p = 0; p < ag_; ++p)
        e2a_->send(std::as_bytes(std::span(back + static_cast<std::size_t>(p) * n * h, n * h)), p, e2a_tag);
    }
  }

  // AG (point to point), E2A stream: chunk q's partial rows from every EG rank.
  void receive_partials(Run const& r, int q) const {
    if constexpr (!colocated) {
      auto uq = static_cast<std::size_t>(q), n = static_cast<std::size_t>(r.chunk);
      T* returned = r.b.returned.data() + ueg() * uq * n * h;
      e2a_->set_stream(stream(Resource::e2a));
      for (int g = 0; g < eg_; ++g)
        e2a_->recv(std::as_writable_bytes(std::span(returned + static_cast<std::size_t>(g) * n * h, n * h)), ag_ + g,
                   e2a_tag);
    }
  }

  Comm* a2e_;  // null for CoLocated
  Comm* e2a_;
  int rank_, ag_, eg_;
  LayerWeights<T> weights_;
  std::vector<ExpertWeights<T>> shared_;  // weights_.shared points here (detail::keep_shared_list)
  FinDepCudaOptions options_;
  moe::detail::DeviceExpertTable<T> experts_;  // AG: copy lists; EG: served experts; error word
  std::size_t scan_bytes_ = 0, eg_sort_bytes_ = 0, split_sort_bytes_ = 0;
  std::size_t count_ints_ = 0;  // count_ints(), computed once (a loop over max_chunks)
  kernels::cuda::OwnedCublas cublas_;
  detail_cuda::StreamPool pool_;  // plan events, then fork, A2E done, E2A done, joins
  detail_cuda::PlanCache plans_;
  std::optional<kernels::cuda::DeviceSplit> split_;  // AG rank with a per-micro-batch split
  kernels::cuda::OwnedStream sort_;                  // ... the sort by expert beside its split
  kernels::cuda::OwnedEvent sort_fork_, sort_join_;
  replication::CopyLists copies_;                    // the copy lists of the tables in use (EG indices)
  int held_bound_ = 0;                 // the most experts an EG index holds in the first plan
  int served_bound_ = 0;               // EG: the most this rank may serve (replans: held_bound_)
  std::size_t split_take_bound_ = 0;   // split_: take entries and global workspace bytes the workspace
  std::size_t split_work_bound_ = 0;   // holds (this plan's, or with replans any plan's)
};

}  // namespace moe::schedule
