#pragma once
// FinDEP / PPPipe executor on CUDA streams and events (nvcc only): runs the stream/event plan of a
// schedule (stream_plan.hpp) for one MoE layer on one GPU, with one CUDA stream per resource of the
// schedule and one cudaEvent_t per plan event.
//
//   using Ex = moe::schedule::FinDepCudaExecutor<Model, Router>;
//   Ex ex(device_weights, {.max_tokens = 4096});           // all experts on this GPU
//   void* ws; cudaMalloc(&ws, ex.workspace_size());        // caller-owned device scratch
//   ex.run({.tokens = n, .x = x, .y = y, .stream = s}, config, {static_cast<std::byte*>(ws), bytes});
//
// Mode: co-located. The attention-group (AG) and expert-group (EG) roles share the device; the
// A2E and E2A "links" are device-to-device cudaMemcpyAsync on their own streams, so the overlap of
// the schedule (AG compute, A2E, EG compute, E2A) is real and its result can be checked on one GPU:
//   AG stream   A(i)  gate logits (cuBLAS) + top-k routing of micro-batch i   (kernels/gate.cuh)
//               S(i)  shared experts of micro-batch i, fp32 sum              (kernels/grouped_gemm.cuh)
//   A2E stream  D(i,j) copies chunk j's token rows, expert ids and gate weights to the EG buffers
//   EG stream   E(i,j) records, grouping by expert, SwiGLU grouped GEMMs, weighted combine of chunk j
//               (kernels/dispatch.cuh, grouped_gemm.cuh, combine.cuh), one partial row per token
//   E2A stream  C(i,j) copies chunk j's partial rows back to the AG buffers
// then, on the AG stream after the last E2A, y = shared + partial per token (finish_tokens). The
// waits between streams are exactly the plan's (section 3.2 dependencies; FinDEP releases the A2E
// after A, PPPipe after S). Each micro-batch and chunk has its own region of every buffer that
// crosses streams (indexed by token), so the plan's dependencies are the only ordering needed; the
// scratch a stream reuses from one operation to the next (logits, grouping, GEMM intermediates)
// is touched by that stream only.
//
// The result is the function of the sequential moe::CudaLayer<..., cuda::SingleGpu>: the same
// kernels and roundings per token (records carry metadata only, the experts read the token rows
// from the EG's copy, partials are stored in storage precision, the shared sum stays fp32). The
// gate GEMM runs per micro-batch, so cuBLAS may sum the logits in another order than for the whole
// batch: tokens within rounding of a routing tie may pick another expert (as between the GPU and
// the host reference).
//
// Streams and ordering: run() records an event on the caller's stream that the four resource
// streams wait on, and the caller's stream waits on the last operation of each of them, so
// run() is ordered with the caller's other work like a kernel on that stream and the workspace may
// be reused by the next run(). run() allocates nothing on the device and never synchronises the
// host; the plan (host vectors) is rebuilt only when the configuration changes. Events come from a
// pool created at construction for up to `max_chunks` chunks (r1 * r2) per run.
//
// FinDepCudaP2PExecutor (below) runs the same plan with the AG and the EG on different ranks, the
// link streams calling the communicators' send / recv (ncclSend / ncclRecv with collective::Nccl).
// It has only been compiled, never run.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"
#include "moe/core/shape.hpp"
#include "moe/core/workspace.hpp"
#include "moe/kernels/combine.cuh"
#include "moe/kernels/cuda_common.cuh"
#include "moe/kernels/dispatch.cuh"
#include "moe/kernels/gate.cuh"
#include "moe/kernels/grouped_gemm.cuh"
#include "moe/layer/expert_ffn.cuh"
#include "moe/layer/layer.hpp"
#include "moe/core/weights.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/plan/replica_table.hpp"
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

/// Bytes of a dispatch record's metadata: [int32 token, int32 count, int32 expert[k], float
/// weight[k]], padded to 16 bytes (the CUDA kernels' record format).
constexpr std::size_t findep_meta_bytes(int top_k) {
  return (2 * sizeof(std::int32_t) + static_cast<std::size_t>(top_k) * (sizeof(std::int32_t) + sizeof(float)) + 15) /
         16 * 16;
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

/// Reads an executor's device error word after synchronising the device (the resource streams are
/// non-blocking, so a plain cudaMemcpy would not wait for them): a diagnostic, not for the hot path.
inline unsigned read_error_word(kernels::cuda::DeviceArray<unsigned> const& word) {
  kernels::cuda::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (errors)");
  unsigned v = 0;
  kernels::cuda::check_cuda(cudaMemcpy(&v, word.get(), sizeof(v), cudaMemcpyDeviceToHost), "cudaMemcpy (errors)");
  return v;
}

}  // namespace detail_cuda

/// Largest FinDepCudaOptions::max_chunks: the event pool holds about 5 events per chunk, created
/// at construction (solved schedules use a few hundred chunks at most).
inline constexpr int max_cuda_chunks = 4096;

struct FinDepCudaOptions {
  int max_tokens = 0;  ///< most tokens one run() takes; sizes the workspace
  int max_chunks = 64;  ///< most r1 * r2 of a run(); sizes the event pool (at most max_cuda_chunks)
  std::size_t cublas_workspace = std::size_t{8} << 20;  ///< bytes handed to cuBLAS for the gate GEMM
  /// Kernel of the expert GEMMs (as CudaLayerOptions::gemm).
  kernels::cuda::GemmPath gemm = kernels::cuda::GemmPath::automatic;
};

template <ModelShape Model, router::Policy Router>
class FinDepCudaExecutor {
public:
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
    int tokens = 0;        ///< tokens of this run (may be 0)
    T const* x = nullptr;  ///< device, tokens x hidden, 16-byte aligned
    T* y = nullptr;        ///< device, tokens x hidden, written
    cudaStream_t stream = nullptr;
  };

  /// `weights`: device pointers, every routed and shared expert present (co-located mode).
  FinDepCudaExecutor(LayerWeights<T> weights, FinDepCudaOptions options) : weights_(weights), options_(options) {
    namespace kc = kernels::cuda;
    moe::detail::keep_shared_list(weights_, shared_);  // run() reads the shared list
    moe::detail::prepare_gemm_path<T>("moe::schedule::FinDepCudaExecutor", options_.gemm);  // probes before any capture
    (void)moe::detail::check_layer_setup("moe::schedule::FinDepCudaExecutor", shape, 1, 0,
                                         placement::Table::contiguous(shape.experts, 1), replication::None{}, weights_,
                                         options_.max_tokens);
    check(options_.max_chunks >= 1, "moe::schedule::FinDepCudaExecutor: max_chunks must be at least 1, got ",
          options_.max_chunks);
    check(options_.max_chunks <= max_cuda_chunks, "moe::schedule::FinDepCudaExecutor: max_chunks = ",
          options_.max_chunks, " is above the limit of ", max_cuda_chunks, " (about 5 CUDA events per chunk)");
    std::vector<T const*> gate(E), up(E), down(E);
    for (int e = 0; e < shape.experts; ++e) {
      auto const& w = weights_.experts[static_cast<std::size_t>(e)];
      check_aligned(w.gate, "gate", e);
      check_aligned(w.up, "up", e);
      check_aligned(w.down, "down", e);
      gate[static_cast<std::size_t>(e)] = w.gate;
      up[static_cast<std::size_t>(e)] = w.up;
      down[static_cast<std::size_t>(e)] = w.down;
    }
    for (int e = 0; e < shape.shared_experts; ++e) {
      auto const& w = weights_.shared[static_cast<std::size_t>(e)];
      check_aligned(w.gate, "shared gate", e);
      check_aligned(w.up, "shared up", e);
      check_aligned(w.down, "shared down", e);
    }
    // One copy of every expert, on this device (rank 0 of 1).
    std::vector<int> offsets(E + 1), zeros(E, 0);
    for (std::size_t e = 0; e <= E; ++e) offsets[e] = static_cast<int>(e);
    std::vector<unsigned char> served(E, 1);
    auto m = static_cast<std::size_t>(options_.max_tokens);
    std::vector<int> ones(m, 1), iota(m);
    for (std::size_t t = 0; t < m; ++t) iota[t] = static_cast<int>(t);
    long long zero_base = 0;
    replica_offsets_ = kc::DeviceArray<int>(E + 1);
    replica_offsets_.upload(offsets.data(), E + 1);
    replica_ranks_ = kc::DeviceArray<int>(E);
    replica_ranks_.upload(zeros.data(), E);
    primary_ = kc::DeviceArray<int>(E);
    primary_.upload(zeros.data(), E);
    served_ = kc::DeviceArray<unsigned char>(E);
    served_.upload(served.data(), E);
    gate_ = kc::DeviceArray<T const*>(E);
    gate_.upload(gate.data(), E);
    up_ = kc::DeviceArray<T const*>(E);
    up_.upload(up.data(), E);
    down_ = kc::DeviceArray<T const*>(E);
    down_.upload(down.data(), E);
    // The final sum reads one partial per token: record count 1, position t, base 0.
    one_record_ = kc::DeviceArray<int>(m);
    one_record_.upload(ones.data(), m);
    token_pos_ = kc::DeviceArray<int>(m);
    token_pos_.upload(iota.data(), m);
    zero_base_ = kc::DeviceArray<long long>(1);
    zero_base_.upload(&zero_base, 1);
    errors_ = kc::DeviceArray<unsigned>(1);
    kc::check_cuda(cudaMemset(errors_.get(), 0, sizeof(unsigned)), "cudaMemset");
    scan_bytes_ = kc::exclusive_sum_bytes(static_cast<long long>(m));
    sort_bytes_ = kc::sort_items_bytes(static_cast<long long>(m * k), shape.experts);

    // A plan with r1 * r2 <= max_chunks has at most 2 r1 + 3 r1 r2 <= 5 max_chunks events; then
    // those of the run itself: fork, E2A done, and one join per resource stream.
    pool_.create(static_cast<std::size_t>(max_plan_events(options_.max_chunks, 1, true)) + run_events);
    kc::check_cublas(cublasCreate(&cublas_), "cublasCreate");  // last: nothing after it throws
  }

  FinDepCudaExecutor(FinDepCudaExecutor const&) = delete;
  FinDepCudaExecutor& operator=(FinDepCudaExecutor const&) = delete;
  ~FinDepCudaExecutor() {
    if (cublas_) cublasDestroy(cublas_);
  }

  /// Bytes of caller-owned device workspace run() needs.
  [[nodiscard]] std::size_t workspace_size() const {
    core::Carver c;
    Buffers b;
    carve(c, b);
    return c.used();
  }

  /// Checks the arguments and the configuration without enqueuing anything.
  [[nodiscard]] Status can_implement(Arguments const& a, Config const& c) const {
    char const* who = "moe::schedule::FinDepCudaExecutor";
    Status st = moe::detail::check_run_arguments(who, "FinDepCudaOptions", a.tokens, options_.max_tokens, a.x, a.y);
    if (!st.ok) return st;
    if (reinterpret_cast<std::uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<std::uintptr_t>(a.y) % 16 != 0)
      return {false, moe::detail::concat(who, ": x and y must be 16-byte aligned")};
    return detail_cuda::check_schedule(who, a.tokens, c, options_.max_chunks);
  }

  /// One forward pass under schedule `c` (pipeline, order, r1, r2; m_a is not used: a micro-batch
  /// holds tokens / r1 tokens), enqueued on a.stream.
  void run(Arguments const& a, Config const& c, std::span<std::byte> workspace) {
    namespace kc = kernels::cuda;
    Status st = can_implement(a, c);
    check(st.ok, st.message);
    core::check_workspace("moe::schedule::FinDepCudaExecutor", workspace.size(), workspace_size());
    if (a.tokens == 0) return;
    StreamPlan const& plan = plans_.get(c, shape.shared_experts > 0, pool_.events.size() - run_events,
                                        "moe::schedule::FinDepCudaExecutor");
    core::Carver carver(workspace);
    Buffers b;
    carve(carver, b);
    Run r{a, b, a.tokens / c.r1, a.tokens / c.r1 / c.r2};

    // Fork: every resource stream starts after the work already on the caller's stream.
    std::size_t own = pool_.events.size() - run_events;  // fork, E2A done, joins
    cudaEvent_t e2a_done = pool_.events[own + 1];
    pool_.fork(a.stream, own);
    kc::check_cuda(cudaMemsetAsync(errors_.get(), 0, sizeof(unsigned), stream(Resource::eg)), "cudaMemsetAsync");

    for (LaunchStep step : plan.launch) {
      PlanOp const& o = plan.op(step);
      cudaStream_t s = stream(o.stream);
      for (int w : o.waits)
        kc::check_cuda(cudaStreamWaitEvent(s, pool_.events[static_cast<std::size_t>(w)], 0), "cudaStreamWaitEvent");
      switch (o.kind) {
        case TaskKind::attention: attention(r, o.mb); break;
        case TaskKind::shared: shared_experts(r, o.mb); break;
        case TaskKind::a2e: to_experts(r, o.mb, o.chunk); break;
        case TaskKind::experts: experts(r, o.mb, o.chunk); break;
        case TaskKind::e2a: to_attention(r, o.mb, o.chunk); break;
      }
      if (o.record >= 0)
        kc::check_cuda(cudaEventRecord(pool_.events[static_cast<std::size_t>(o.record)], s), "cudaEventRecord");
    }

    // Final sum on the AG stream after the last E2A (which follows every A2E and EG operation),
    // then join: the caller's stream continues after the last operation of every resource stream
    // (each joined directly, as stream capture into a CUDA graph requires).
    cudaStream_t ag = stream(Resource::ag);
    kc::check_cuda(cudaEventRecord(e2a_done, stream(Resource::e2a)), "cudaEventRecord (E2A done)");
    kc::check_cuda(cudaStreamWaitEvent(ag, e2a_done, 0), "cudaStreamWaitEvent (E2A done)");
    kc::finish_tokens<T>(ag, a.tokens, shape.hidden, 1, one_record_.get(), token_pos_.get(), zero_base_.get(),
                         b.returned.data(), shape.shared_experts > 0 ? b.shared_acc.data() : nullptr, a.y);
    pool_.join(a.stream, own + 2);
  }

  /// Error bits (kernels::cuda::DeviceError) raised by the last run(). Synchronises the device
  /// (the resource streams are non-blocking, so a plain cudaMemcpy would not wait for them): a
  /// diagnostic for tests and debugging, not for the hot path.
  [[nodiscard]] unsigned errors() const { return detail_cuda::read_error_word(errors_); }

  /// The plan of the last run() (empty before the first).
  [[nodiscard]] StreamPlan const& plan() const { return plans_.plan; }
  [[nodiscard]] FinDepCudaOptions const& options() const { return options_; }
  /// The stream of one resource (e.g. to time it or to inspect a capture).
  [[nodiscard]] cudaStream_t stream(Resource r) const { return pool_.streams[static_cast<std::size_t>(r)]; }

private:
  static constexpr auto h = static_cast<std::size_t>(shape.hidden);
  static constexpr int k = shape.top_k;
  static constexpr auto uk = static_cast<std::size_t>(shape.top_k);
  static constexpr auto E = static_cast<std::size_t>(shape.experts);
  static constexpr std::size_t run_events = 2 + resource_count;  // fork, E2A done, one join per stream
  static constexpr std::size_t meta_bytes = detail_cuda::findep_meta_bytes(shape.top_k);

  static void check_aligned(T const* p, char const* what, int e) {
    check(reinterpret_cast<std::uintptr_t>(p) % 16 == 0, "moe::schedule::FinDepCudaExecutor: ", what,
          " weights of expert ", e, " are not 16-byte aligned");
  }

  struct Buffers {
    // AG side. logits and shared_inter are AG-stream scratch; ids, gate_w, shared_acc, returned
    // have one region per token.
    std::span<float> logits;     // max_tokens x E
    std::span<int> ids;          // max_tokens x k
    std::span<float> gate_w;     // max_tokens x k
    std::span<T> shared_inter;   // max_tokens x shared_ffn
    std::span<float> shared_acc;  // max_tokens x h
    std::span<T> returned;       // max_tokens x h: partials after E2A
    std::span<std::byte> cublas;
    // EG side. eg_x, eg_ids, eg_w (written by A2E) and back (read by E2A) have one region per
    // token; the rest is EG-stream scratch sized for the largest chunk (max_tokens).
    std::span<T> eg_x;           // max_tokens x h
    std::span<int> eg_ids;       // max_tokens x k
    std::span<float> eg_w;       // max_tokens x k
    std::span<T> back;           // max_tokens x h
    std::span<int> dest;         // chunk x k
    std::span<int> rec_count, rec_pos;  // chunk
    std::span<std::byte> scan_temp;
    std::span<std::uint64_t> count;
    std::span<long long> send_base, recv_base;
    std::span<int> recv_n;
    std::span<std::byte> records;  // chunk x meta_bytes
    std::span<int> keys, values, sorted_keys, sorted_values, position;  // chunk x k
    std::span<std::byte> sort_temp;
    std::span<int> offsets, tile_starts;  // E + 1
    std::span<T> inter;                   // chunk x k x expert_ffn
    std::span<T> expert_out;              // chunk x k x hidden
  };

  void carve(core::Carver& c, Buffers& b) const {
    auto m = static_cast<std::size_t>(options_.max_tokens);
    bool shared = shape.shared_experts > 0;
    b.logits = c.take<float>(m * E);
    b.ids = c.take<int>(m * uk);
    b.gate_w = c.take<float>(m * uk);
    b.shared_inter = c.take<T>(shared ? m * static_cast<std::size_t>(shape.shared_ffn) : 0);
    b.shared_acc = c.take<float>(shared ? m * h : 0);
    b.returned = c.take<T>(m * h);
    b.cublas = c.take<std::byte>(options_.cublas_workspace);
    b.eg_x = c.take<T>(m * h);
    b.eg_ids = c.take<int>(m * uk);
    b.eg_w = c.take<float>(m * uk);
    b.back = c.take<T>(m * h);
    b.dest = c.take<int>(m * uk);
    b.rec_count = c.take<int>(m);
    b.rec_pos = c.take<int>(m);
    b.scan_temp = c.take<std::byte>(scan_bytes_);
    b.count = c.take<std::uint64_t>(1);
    b.send_base = c.take<long long>(1);
    b.recv_base = c.take<long long>(1);
    b.recv_n = c.take<int>(1);
    b.records = c.take<std::byte>(m * meta_bytes);
    b.keys = c.take<int>(m * uk);
    b.values = c.take<int>(m * uk);
    b.sorted_keys = c.take<int>(m * uk);
    b.sorted_values = c.take<int>(m * uk);
    b.position = c.take<int>(m * uk);
    b.sort_temp = c.take<std::byte>(sort_bytes_);
    b.offsets = c.take<int>(E + 1);
    b.tile_starts = c.take<int>(E + 1);
    b.inter = c.take<T>(m * uk * static_cast<std::size_t>(shape.expert_ffn));
    b.expert_out = c.take<T>(m * uk * h);
  }

  struct Run {
    Arguments const& a;
    Buffers const& b;
    int mb;     // tokens per micro-batch
    int chunk;  // tokens per chunk
  };

  // A(i): gate logits and routing of micro-batch i (AG stream).
  void attention(Run const& r, int i) const {
    auto first = static_cast<std::size_t>(i) * static_cast<std::size_t>(r.mb);
    detail_cuda::findep_attention<shape, Router>(cublas_, stream(Resource::ag), r.b.cublas, weights_, r.a.x + first * h,
                                            r.mb, r.b.logits.data(), r.b.ids.data() + first * uk,
                                            r.b.gate_w.data() + first * uk);
  }

  // S(i): fp32 sum of the shared experts of micro-batch i (AG stream).
  void shared_experts(Run const& r, int i) const {
    auto first = static_cast<std::size_t>(i) * static_cast<std::size_t>(r.mb);
    moe::detail::shared_experts<shape>(stream(Resource::ag), weights_.shared, r.a.x + first * h, r.mb,
                                       r.b.shared_inter.data(), r.b.shared_acc.data() + first * h, options_.gemm);
  }

  [[nodiscard]] static std::size_t chunk_first(Run const& r, int i, int j) {
    return static_cast<std::size_t>(i) * static_cast<std::size_t>(r.mb) +
           static_cast<std::size_t>(j) * static_cast<std::size_t>(r.chunk);
  }

  // D(i,j): token rows, expert ids and gate weights of chunk j to the EG (A2E stream).
  void to_experts(Run const& r, int i, int j) const {
    namespace kc = kernels::cuda;
    cudaStream_t s = stream(Resource::a2e);
    std::size_t t0 = chunk_first(r, i, j), n = static_cast<std::size_t>(r.chunk);
    kc::check_cuda(cudaMemcpyAsync(r.b.eg_x.data() + t0 * h, r.a.x + t0 * h, n * h * sizeof(T),
                                   cudaMemcpyDeviceToDevice, s),
                   "cudaMemcpyAsync (A2E tokens)");
    kc::check_cuda(cudaMemcpyAsync(r.b.eg_ids.data() + t0 * uk, r.b.ids.data() + t0 * uk, n * uk * sizeof(int),
                                   cudaMemcpyDeviceToDevice, s),
                   "cudaMemcpyAsync (A2E expert ids)");
    kc::check_cuda(cudaMemcpyAsync(r.b.eg_w.data() + t0 * uk, r.b.gate_w.data() + t0 * uk, n * uk * sizeof(float),
                                   cudaMemcpyDeviceToDevice, s),
                   "cudaMemcpyAsync (A2E gate weights)");
  }

  // E(i,j): the routed experts of chunk j, one weighted partial row per token (EG stream). The
  // steps of CudaLayer's single-GPU path on the chunk's tokens.
  void experts(Run const& r, int i, int j) const {
    namespace kc = kernels::cuda;
    cudaStream_t s = stream(Resource::eg);
    Buffers const& b = r.b;
    std::size_t t0 = chunk_first(r, i, j);
    int n = r.chunk;
    T const* x = b.eg_x.data() + t0 * h;
    int const* ids = b.eg_ids.data() + t0 * uk;
    float const* w = b.eg_w.data() + t0 * uk;
    kc::ReplicaView view{replica_offsets_.get(), replica_ranks_.get(), primary_.get()};
    kc::plan_records<k>(s, ids, n, 1, view, 0, static_cast<long long>(t0), true, b.dest.data(), b.rec_count.data());
    kc::exclusive_sum(s, b.scan_temp.data(), b.scan_temp.size(), b.rec_count.data(), b.rec_pos.data(), n);
    kc::send_layout(s, b.rec_count.data(), b.rec_pos.data(), n, 1, 0, b.count.data(), b.send_base.data());
    kc::pack_records<T, k>(s, x, n, shape.hidden, ids, w, b.dest.data(), b.rec_pos.data(), b.send_base.data(), true,
                           b.records.data(), meta_bytes, meta_bytes, false);
    kc::recv_layout(s, b.count.data(), 1, 0, b.recv_base.data(), b.recv_n.data());
    moe::detail::RoutedExperts<shape, T> pass;
    pass.records = b.records.data();
    pass.record_bytes = meta_bytes;
    pass.slots = n;
    pass.recv_base = b.recv_base.data();
    pass.recv_n = b.recv_n.data();
    pass.sources = 1;
    pass.a = reinterpret_cast<std::byte const*>(x);  // record = the chunk's token
    pass.a_stride = h * sizeof(T);
    pass.served = served_.get();
    pass.gate = gate_.get();
    pass.up = up_.get();
    pass.down = down_.get();
    pass.grouping = {b.keys.data(),     b.values.data(),  b.sorted_keys.data(), b.sorted_values.data(),
                     b.position.data(), b.offsets.data(), b.tile_starts.data(), b.sort_temp.data(),
                     b.sort_temp.size()};
    pass.inter = b.inter.data();
    pass.expert_out = b.expert_out.data();
    pass.back = b.back.data() + t0 * h;
    pass.errors = errors_.get();
    pass.path = options_.gemm;
    pass.enqueue(s);
  }

  // C(i,j): chunk j's partial rows back to the AG (E2A stream).
  void to_attention(Run const& r, int i, int j) const {
    std::size_t t0 = chunk_first(r, i, j), n = static_cast<std::size_t>(r.chunk);
    kernels::cuda::check_cuda(cudaMemcpyAsync(r.b.returned.data() + t0 * h, r.b.back.data() + t0 * h,
                                              n * h * sizeof(T), cudaMemcpyDeviceToDevice, stream(Resource::e2a)),
                              "cudaMemcpyAsync (E2A partials)");
  }

  LayerWeights<T> weights_;
  std::vector<ExpertWeights<T>> shared_;  // weights_.shared points here (detail::keep_shared_list)
  FinDepCudaOptions options_;
  kernels::cuda::DeviceArray<int> replica_offsets_, replica_ranks_, primary_;
  kernels::cuda::DeviceArray<unsigned char> served_;
  kernels::cuda::DeviceArray<T const*> gate_, up_, down_;
  kernels::cuda::DeviceArray<int> one_record_, token_pos_;
  kernels::cuda::DeviceArray<long long> zero_base_;
  kernels::cuda::DeviceArray<unsigned> errors_;
  std::size_t scan_bytes_ = 0, sort_bytes_ = 0;
  cublasHandle_t cublas_ = nullptr;
  detail_cuda::StreamPool pool_;  // plan events, then fork, E2A done, joins
  detail_cuda::PlanCache plans_;
};

namespace detail_cuda {
/// A device-memory communicator with point-to-point messages on a settable stream
/// (collective::Nccl; tests use a staged stand-in).
template <class C>
concept PointToPointDevice = C::memory == collective::Memory::device &&
                             requires(C& c, std::span<std::byte const> in, std::span<std::byte> out, cudaStream_t s) {
                               { c.rank() } -> std::same_as<int>;
                               { c.size() } -> std::same_as<int>;
                               c.set_stream(s);
                               c.send(in, 0, 0);
                               c.recv(out, 0, 0);
                             };
}  // namespace detail_cuda

/// The same schedule with the attention group and the expert group on different ranks (one GPU
/// each): ranks [0, ag) are AG ranks (tokens, router, shared experts), ranks [ag, size) EG ranks
/// (the routed experts, expert -> EG index by `on_eg`). The A2E and E2A link streams call the
/// communicators' send / recv (ncclSend / ncclRecv with collective::Nccl); everything else is the
/// co-located executor's. Per chunk and (AG, EG) pair, the A2E carries an 8-byte record count and
/// a fixed region of `chunk` records (worst case: every token of the chunk has an expert on that EG
/// rank), so no host synchronisation is needed; the EG reads only the counted records. The E2A
/// carries `chunk` partial rows back.
///
/// Replicated experts (optional `replicas`, a replication::Table over EG indices) follow the host
/// executor's rule (schedule/findep_executor.hpp): token t of AG rank p uses copy (p + t) mod n of
/// the n copies the table lists for an expert, and an EG rank serves every expert it holds a copy of.
///
///   FinDepCudaP2PExecutor<Model, Router, collective::Nccl> ex(a2e_comm, e2a_comm, ag, on_eg, weights, options);
///   ex.run({.tokens = n, .x = x, .y = y, .stream = s}, config, workspace);   // AG ranks
///   ex.run({.tokens = n, .stream = s}, config, workspace);                    // EG ranks: same n, no x / y
///
/// Requirements: two communicators over the same ranks, one per link stream (NCCL runs the
/// operations of one communicator in the order they were issued, so sends of chunk c + 1 on the
/// A2E stream and receives of chunk c on the E2A stream would wait on each other); every rank calls
/// run() with the same tokens (per AG rank) and configuration; the GPU must be able to run the A2E
/// and E2A communication kernels concurrently (NCCL's usual caveat for several communicators).
/// On an AG rank the plan's waits on EG operations (and on an EG rank those on AG operations) are
/// satisfied by the messages themselves and dropped.
///
/// Never run on a GPU; it runs on the CUDA emulator (tests/cuda/test_findep_cuda.cu, over the staged
/// communicator and the emulator's in-process NCCL; its workspace in test_workspace_exact_cuda.cu).
template <ModelShape Model, router::Policy Router, class Comm>
class FinDepCudaP2PExecutor {
public:
  static constexpr ShapeSpec shape = Model::spec;
  using element_type = storage_t<shape>;
  using T = element_type;

  static_assert(detail_cuda::PointToPointDevice<Comm>,
                "FinDepCudaP2PExecutor: Comm must be a device-memory communicator with send, recv and "
                "set_stream(cudaStream_t) (e.g. collective::Nccl)");
  static_assert(shape.hidden > 0 && shape.experts > 0 && shape.top_k > 0 && shape.top_k <= shape.experts,
                "FinDepCudaP2PExecutor: the model shape needs positive sizes and top_k <= experts");
  static_assert(Router::fits(shape), "FinDepCudaP2PExecutor: this Router policy does not fit the model");
  static_assert(shape.hidden % kernels::cuda::vec_elems<T> == 0 && shape.expert_ffn % kernels::cuda::vec_elems<T> == 0 &&
                    shape.shared_ffn % kernels::cuda::vec_elems<T> == 0,
                "FinDepCudaP2PExecutor: hidden and FFN widths must be multiples of 16 bytes of the storage type");

  struct Arguments {
    int tokens = 0;        ///< tokens per AG rank (EG ranks pass the same number)
    T const* x = nullptr;  ///< AG ranks: device, tokens x hidden, 16-byte aligned; EG ranks: unused
    T* y = nullptr;        ///< AG ranks: device, tokens x hidden, written; EG ranks: unused
    cudaStream_t stream = nullptr;
  };

  static constexpr int a2e_tag = 0;
  static constexpr int e2a_tag = 1;

  FinDepCudaP2PExecutor(Comm& a2e, Comm& e2a, int ag, placement::Table on_eg, LayerWeights<T> weights,
                        FinDepCudaOptions options, replication::Table const& replicas = {})
      : a2e_(&a2e), e2a_(&e2a), ag_(ag), eg_(a2e.size() - ag), placement_(std::move(on_eg)), weights_(weights),
        options_(options) {
    namespace kc = kernels::cuda;
    moe::detail::keep_shared_list(weights_, shared_);  // run() reads the shared list
    char const* who = "moe::schedule::FinDepCudaP2PExecutor";
    moe::detail::prepare_gemm_path<T>(who, options_.gemm);  // probes before any capture
    validate(shape);
    check(&a2e != &e2a, who, ": the A2E and E2A streams need two communicators (one each); NCCL runs one "
                        "communicator's operations in issue order, so one shared by both links would deadlock");
    check(a2e.size() == e2a.size() && a2e.rank() == e2a.rank(), who, ": the two communicators differ (sizes ",
          a2e.size(), " and ", e2a.size(), ", ranks ", a2e.rank(), " and ", e2a.rank(), ")");
    check(ag_ >= 1, who, ": the attention group (AG) is empty; it needs at least one rank, got ag = ", ag_);
    check(eg_ >= 1, who, ": the expert group (EG) is empty: the communicator has ", a2e.size(), " ranks and ", ag_,
          " of them are AG ranks");
    check(options_.max_tokens >= 1, who, ": max_tokens must be positive, got ", options_.max_tokens);
    check(options_.max_chunks >= 1, who, ": max_chunks must be at least 1, got ", options_.max_chunks);
    check(options_.max_chunks <= max_cuda_chunks, who, ": max_chunks = ", options_.max_chunks,
          " is above the limit of ", max_cuda_chunks, " (about 5 CUDA events per chunk)");
    placement_.validate(shape.experts, eg_);
    check(static_cast<int>(weights_.experts.size()) == shape.experts, who, ": weights list ", weights_.experts.size(),
          " experts, the shape has ", shape.experts);
    check(static_cast<int>(weights_.shared.size()) == shape.shared_experts, who, ": weights list ",
          weights_.shared.size(), " shared experts, the shape has ", shape.shared_experts);
    // Each expert's copies (EG indices): the table's lists, or the placement's index.
    if (!replicas.replicas().empty()) replicas.validate(shape.experts, eg_, placement_.ranks());
    std::vector<int> const& eg_of = placement_.ranks();
    replication::CopyLists copies = replication::copy_lists(eg_of, replicas);
    if (is_ag()) {
      check(weights_.router != nullptr, who, ": AG rank ", rank(), " has no router weights");
      for (int e = 0; e < shape.shared_experts; ++e) {
        auto const& w = weights_.shared[static_cast<std::size_t>(e)];
        check(w.present(), who, ": AG rank ", rank(), " misses the weights of shared expert ", e);
        check_aligned(w.gate, "shared gate", e);
        check_aligned(w.up, "shared up", e);
        check_aligned(w.down, "shared down", e);
      }
      replica_offsets_ = kc::DeviceArray<int>(E + 1);
      replica_offsets_.upload(copies.first.data(), E + 1);
      replica_ranks_ = kc::DeviceArray<int>(copies.ranks.size());
      replica_ranks_.upload(copies.ranks.data(), copies.ranks.size());
      primary_ = kc::DeviceArray<int>(E);
      primary_.upload(eg_of.data(), E);
      scan_bytes_ = kc::exclusive_sum_bytes(static_cast<long long>(eg_) * options_.max_tokens);
      count_ints_ = count_ints();
    } else {
      std::vector<unsigned char> served(E, 0);
      std::vector<T const*> gate(E, nullptr), up(E, nullptr), down(E, nullptr);
      for (int e = 0; e < shape.experts; ++e) {
        auto ue = static_cast<std::size_t>(e);
        if (!copies.holds(e, rank() - ag_)) continue;
        auto const& w = weights_.experts[ue];
        check(w.present(), who, ": EG rank ", rank(), " serves expert ", e, " but its weights are missing");
        check_aligned(w.gate, "gate", e);
        check_aligned(w.up, "up", e);
        check_aligned(w.down, "down", e);
        served[ue] = 1;
        ++served_count_;
        gate[ue] = w.gate;
        up[ue] = w.up;
        down[ue] = w.down;
      }
      served_ = kc::DeviceArray<unsigned char>(E);
      served_.upload(served.data(), E);
      gate_ = kc::DeviceArray<T const*>(E);
      gate_.upload(gate.data(), E);
      up_ = kc::DeviceArray<T const*>(E);
      up_.upload(up.data(), E);
      down_ = kc::DeviceArray<T const*>(E);
      down_.upload(down.data(), E);
      sort_bytes_ = kc::sort_items_bytes(static_cast<long long>(ag_) * options_.max_tokens * k, shape.experts);
    }
    errors_ = kc::DeviceArray<unsigned>(1);
    kc::check_cuda(cudaMemset(errors_.get(), 0, sizeof(unsigned)), "cudaMemset");
    pool_.create(static_cast<std::size_t>(max_plan_events(options_.max_chunks, 1, true)) + run_events);
    if (is_ag()) kc::check_cublas(cublasCreate(&cublas_), "cublasCreate");  // last: nothing after it throws
  }

  FinDepCudaP2PExecutor(FinDepCudaP2PExecutor const&) = delete;
  FinDepCudaP2PExecutor& operator=(FinDepCudaP2PExecutor const&) = delete;
  ~FinDepCudaP2PExecutor() {
    if (cublas_) cublasDestroy(cublas_);
  }

  [[nodiscard]] int rank() const { return a2e_->rank(); }
  [[nodiscard]] bool is_ag() const { return rank() < ag_; }
  [[nodiscard]] int attention_ranks() const { return ag_; }
  [[nodiscard]] int expert_ranks() const { return eg_; }

  /// Bytes of caller-owned device workspace run() needs on this rank (an AG and an EG rank differ).
  [[nodiscard]] std::size_t workspace_size() const {
    core::Carver c;
    Buffers b;
    carve(c, b);
    return c.used();
  }

  [[nodiscard]] Status can_implement(Arguments const& a, Config const& c) const {
    char const* who = "moe::schedule::FinDepCudaP2PExecutor";
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

  /// One forward pass; every rank calls it with the same tokens (per AG rank) and configuration.
  void run(Arguments const& a, Config const& c, std::span<std::byte> workspace) {
    namespace kc = kernels::cuda;
    Status st = can_implement(a, c);
    check(st.ok, st.message);
    core::check_workspace("moe::schedule::FinDepCudaP2PExecutor", workspace.size(), workspace_size());
    if (a.tokens == 0) return;  // every rank sees the same count, so no rank waits for a message
    StreamPlan const& plan = plans_.get(c, shape.shared_experts > 0, pool_.events.size() - run_events,
                                        "moe::schedule::FinDepCudaP2PExecutor");
    core::Carver carver(workspace);
    Buffers b;
    carve(carver, b);
    Run r{a, b, a.tokens / c.r1 / c.r2};

    std::size_t own = pool_.events.size() - run_events;  // fork, A2E done, E2A done, joins
    pool_.fork(a.stream, own);
    if (!is_ag())
      kc::check_cuda(cudaMemsetAsync(errors_.get(), 0, sizeof(unsigned), stream(Resource::eg)), "cudaMemsetAsync");

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
        case TaskKind::attention: attention(r, o.mb, c.r2); break;
        case TaskKind::shared: shared_experts(r, o.mb, c.r2); break;
        case TaskKind::a2e: is_ag() ? send_chunk(r, chunk) : receive_chunk(r, chunk); break;
        case TaskKind::experts: experts(r, chunk); break;
        case TaskKind::e2a: is_ag() ? receive_partials(r, chunk) : send_partials(r, chunk); break;
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
    // The link streams are the executor's own: leave the communicators on the caller's stream, so a
    // collective the engine issues next without set_stream is ordered after this layer.
    a2e_->set_stream(a.stream);
    e2a_->set_stream(a.stream);
  }

  /// Error bits of the last run() on an EG rank (kernels::cuda::DeviceError). Synchronises the device.
  [[nodiscard]] unsigned errors() const { return detail_cuda::read_error_word(errors_); }
  [[nodiscard]] StreamPlan const& plan() const { return plans_.plan; }
  [[nodiscard]] cudaStream_t stream(Resource r) const { return pool_.streams[static_cast<std::size_t>(r)]; }

private:
  static constexpr auto h = static_cast<std::size_t>(shape.hidden);
  static constexpr int k = shape.top_k;
  static constexpr auto uk = static_cast<std::size_t>(shape.top_k);
  static constexpr auto E = static_cast<std::size_t>(shape.experts);
  static constexpr std::size_t run_events = 3 + resource_count;  // fork, A2E done, E2A done, joins
  static constexpr std::size_t meta_bytes = detail_cuda::findep_meta_bytes(shape.top_k);
  static constexpr std::size_t record_bytes = meta_bytes + h * sizeof(T);  // h * sizeof(T): a multiple of 16

  static void check_aligned(T const* p, char const* what, int e) {
    check(reinterpret_cast<std::uintptr_t>(p) % 16 == 0, "moe::schedule::FinDepCudaP2PExecutor: ", what,
          " weights of expert ", e, " are not 16-byte aligned");
  }

  /// Whether this rank runs (its half of) an operation of the plan.
  [[nodiscard]] bool here(TaskKind kind) const {
    switch (kind) {
      case TaskKind::attention:
      case TaskKind::shared: return is_ag();
      case TaskKind::experts: return !is_ag();
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
    // AG rank. Per token: ids, gate_w, dest, shared_acc; per chunk: rec_count / rec_pos (a region
    // of count_stride ints, 256-byte aligned for the CUB scan), send_count / send_base (eg each),
    // send (eg x chunk records), returned (eg x chunk rows).
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
    // EG rank. Per chunk: counts (ag), recv (ag x chunk records), back (ag x chunk rows); the rest
    // is EG-stream scratch for the largest chunk.
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
    int chunk;  // tokens per chunk
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
    } else {
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
      b.sort_temp = c.take<std::byte>(sort_bytes_);
      b.offsets = c.take<int>(E + 1);
      b.tile_starts = c.take<int>(E + 1);
      std::size_t rows = slots * rows_per_record();  // <= items
      b.inter = c.take<T>(rows * static_cast<std::size_t>(shape.expert_ffn));
      b.expert_out = c.take<T>(rows * h);
    }
  }

  /// EG rank: most expert rows one record yields here (a record names the experts of its token
  /// that this rank serves, at most k).
  [[nodiscard]] std::size_t rows_per_record() const {
    return static_cast<std::size_t>(std::max(1, std::min(k, served_count_)));
  }

  void attention(Run const& r, int i, int r2) const {
    auto mb = r.chunk * r2;
    auto first = static_cast<std::size_t>(i) * static_cast<std::size_t>(mb);
    detail_cuda::findep_attention<shape, Router>(cublas_, stream(Resource::ag), r.b.cublas, weights_, r.a.x + first * h,
                                                 mb, r.b.logits.data(), r.b.ids.data() + first * uk,
                                                 r.b.gate_w.data() + first * uk);
  }

  void shared_experts(Run const& r, int i, int r2) const {
    auto mb = r.chunk * r2;
    auto first = static_cast<std::size_t>(i) * static_cast<std::size_t>(mb);
    moe::detail::shared_experts<shape>(stream(Resource::ag), weights_.shared, r.a.x + first * h, mb,
                                       r.b.shared_inter.data(), r.b.shared_acc.data() + first * h, options_.gemm);
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
    // Copy (p + t) mod n of an expert's n copies for token t of this AG rank p (no copy is local).
    kc::ReplicaView view{replica_offsets_.get(), replica_ranks_.get(), primary_.get(), false};
    kc::plan_records<k>(s, b.ids.data() + t0 * uk, r.chunk, eg_, view, rank(), static_cast<long long>(t0), true,
                        b.dest.data() + t0 * uk, count);
    kc::exclusive_sum(s, b.scan_temp.data(), b.scan_temp.size(), count, pos, static_cast<long long>(ueg() * n));
    kc::send_layout(s, count, pos, r.chunk, eg_, static_cast<long long>(n), send_count, send_base);
    kc::pack_records<T, k>(s, r.a.x + t0 * h, r.chunk, shape.hidden, b.ids.data() + t0 * uk, b.gate_w.data() + t0 * uk,
                           b.dest.data() + t0 * uk, pos, send_base, true, records, record_bytes, meta_bytes, true);
    a2e_->set_stream(s);
    for (int g = 0; g < eg_; ++g) {
      auto ug = static_cast<std::size_t>(g);
      a2e_->send(std::as_bytes(std::span(send_count + ug, 1)), ag_ + g, a2e_tag);
      a2e_->send(std::span<std::byte const>(records + ug * n * record_bytes, n * record_bytes), ag_ + g, a2e_tag);
    }
  }

  // EG, A2E stream: chunk q's record count and region from every AG rank.
  void receive_chunk(Run const& r, int q) const {
    auto uq = static_cast<std::size_t>(q), n = static_cast<std::size_t>(r.chunk);
    std::byte* records = r.b.recv.data() + uag() * uq * n * record_bytes;
    a2e_->set_stream(stream(Resource::a2e));
    for (int p = 0; p < ag_; ++p) {
      auto up = static_cast<std::size_t>(p);
      a2e_->recv(std::as_writable_bytes(std::span(r.b.counts.data() + uq * uag() + up, 1)), p, a2e_tag);
      a2e_->recv(std::span<std::byte>(records + up * n * record_bytes, n * record_bytes), p, a2e_tag);
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
    moe::detail::RoutedExperts<shape, T> pass;
    pass.records = records;
    pass.record_bytes = record_bytes;
    pass.slots = static_cast<long long>(uag() * n);
    pass.recv_base = b.recv_base.data();
    pass.recv_n = b.recv_n.data();
    pass.sources = ag_;
    pass.a = records + meta_bytes;  // the token rows travel in the records
    pass.a_stride = record_bytes;
    pass.served = served_.get();
    pass.max_count = static_cast<int>(rows_per_record());
    pass.gate = gate_.get();
    pass.up = up_.get();
    pass.down = down_.get();
    pass.grouping = {b.keys.data(),     b.values.data(),  b.sorted_keys.data(), b.sorted_values.data(),
                     b.position.data(), b.offsets.data(), b.tile_starts.data(), b.sort_temp.data(),
                     b.sort_temp.size()};
    pass.inter = b.inter.data();
    pass.expert_out = b.expert_out.data();
    pass.back = b.back.data() + uag() * uq * n * h;
    pass.errors = errors_.get();
    pass.path = options_.gemm;
    pass.enqueue(s);
  }

  // EG, E2A stream: chunk q's partial rows back to every AG rank (its region of `chunk` rows).
  void send_partials(Run const& r, int q) const {
    auto uq = static_cast<std::size_t>(q), n = static_cast<std::size_t>(r.chunk);
    T const* back = r.b.back.data() + uag() * uq * n * h;
    e2a_->set_stream(stream(Resource::e2a));
    for (int p = 0; p < ag_; ++p)
      e2a_->send(std::as_bytes(std::span(back + static_cast<std::size_t>(p) * n * h, n * h)), p, e2a_tag);
  }

  // AG, E2A stream: chunk q's partial rows from every EG rank.
  void receive_partials(Run const& r, int q) const {
    auto uq = static_cast<std::size_t>(q), n = static_cast<std::size_t>(r.chunk);
    T* returned = r.b.returned.data() + ueg() * uq * n * h;
    e2a_->set_stream(stream(Resource::e2a));
    for (int g = 0; g < eg_; ++g)
      e2a_->recv(std::as_writable_bytes(std::span(returned + static_cast<std::size_t>(g) * n * h, n * h)), ag_ + g,
                 e2a_tag);
  }

  Comm* a2e_;
  Comm* e2a_;
  int ag_, eg_;
  placement::Table placement_;
  LayerWeights<T> weights_;
  std::vector<ExpertWeights<T>> shared_;  // weights_.shared points here (detail::keep_shared_list)
  FinDepCudaOptions options_;
  kernels::cuda::DeviceArray<int> replica_offsets_, replica_ranks_, primary_;
  kernels::cuda::DeviceArray<unsigned char> served_;
  kernels::cuda::DeviceArray<T const*> gate_, up_, down_;
  kernels::cuda::DeviceArray<unsigned> errors_;
  std::size_t scan_bytes_ = 0, sort_bytes_ = 0;
  std::size_t count_ints_ = 0;  // count_ints(), computed once (a loop over max_chunks)
  int served_count_ = 0;        // EG rank: experts it serves
  cublasHandle_t cublas_ = nullptr;
  detail_cuda::StreamPool pool_;  // plan events, then fork, A2E done, E2A done, joins
  detail_cuda::PlanCache plans_;
};

}  // namespace moe::schedule
