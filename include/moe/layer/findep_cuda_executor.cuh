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
// The result is the function of the sequential device moe::Layer<..., schedule::Sequential, collective::SingleGpu>: the same
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
// FinDepCudaP2PExecutor (findep_cuda_p2p.cuh) runs the same plan with the AG and the EG on
// different ranks, the link streams calling the communicators' send / recv.

#include "moe/layer/findep_cuda_common.cuh"

namespace moe::schedule {

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
    check(options_.max_tokens > 0, "moe::schedule::FinDepCudaExecutor: max_tokens must be positive, got ",
          options_.max_tokens);
    (void)moe::detail::check_layer_setup("moe::schedule::FinDepCudaExecutor", shape, 1, 0,
                                         placement::Table::contiguous(shape.experts, 1), replication::None{}, weights_);
    check(options_.max_chunks >= 1, "moe::schedule::FinDepCudaExecutor: max_chunks must be at least 1, got ",
          options_.max_chunks);
    check(options_.max_chunks <= max_cuda_chunks, "moe::schedule::FinDepCudaExecutor: max_chunks = ",
          options_.max_chunks, " is above the limit of ", max_cuda_chunks, " (about 5 CUDA events per chunk)");
    // One copy of every expert, on this device (rank 0 of 1): the layer's expert tables.
    std::vector<int> zeros(E, 0);
    experts_ = moe::detail::DeviceExpertTable<T>(replication::copy_lists(zeros, replication::None{}), zeros, true, 0,
                                                 weights_.experts, "moe::schedule::FinDepCudaExecutor");
    for (int e = 0; e < shape.shared_experts; ++e)
      moe::detail::check_expert_alignment("moe::schedule::FinDepCudaExecutor", weights_.shared[static_cast<std::size_t>(e)],
                                          "shared ", e);
    auto m = static_cast<std::size_t>(options_.max_tokens);
    std::vector<int> ones(m, 1), iota(m);
    for (std::size_t t = 0; t < m; ++t) iota[t] = static_cast<int>(t);
    long long zero_base = 0;
    // The final sum reads one partial per token: record count 1, position t, base 0.
    one_record_ = kc::DeviceArray<int>(m);
    one_record_.upload(ones.data(), m);
    token_pos_ = kc::DeviceArray<int>(m);
    token_pos_.upload(iota.data(), m);
    zero_base_ = kc::DeviceArray<long long>(1);
    zero_base_.upload(&zero_base, 1);
    scan_bytes_ = kc::exclusive_sum_bytes(static_cast<long long>(m));
    sort_bytes_ = kc::sort_items_bytes(static_cast<long long>(m * k), shape.experts);

    // A plan with r1 * r2 <= max_chunks has at most 2 r1 + 3 r1 r2 <= 5 max_chunks events; then
    // those of the run itself: fork, E2A done, and one join per resource stream.
    pool_.create(static_cast<std::size_t>(max_plan_events(options_.max_chunks, 1, true)) + run_events);
    cublas_ = kc::make_cublas();
  }

  FinDepCudaExecutor(FinDepCudaExecutor const&) = delete;
  FinDepCudaExecutor& operator=(FinDepCudaExecutor const&) = delete;

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
    kc::check_cuda(cudaMemsetAsync(experts_.errors(), 0, sizeof(unsigned), stream(Resource::eg)), "cudaMemsetAsync");

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
  [[nodiscard]] unsigned errors() const { return experts_.read_errors(); }

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
    detail_cuda::findep_attention<shape, Router>(cublas_.get(), stream(Resource::ag), r.b.cublas, weights_, r.a.x + first * h,
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
  // steps of the device Layer's single-GPU path on the chunk's tokens.
  void experts(Run const& r, int i, int j) const {
    namespace kc = kernels::cuda;
    cudaStream_t s = stream(Resource::eg);
    Buffers const& b = r.b;
    std::size_t t0 = chunk_first(r, i, j);
    int n = r.chunk;
    T const* x = b.eg_x.data() + t0 * h;
    int const* ids = b.eg_ids.data() + t0 * uk;
    float const* w = b.eg_w.data() + t0 * uk;
    kc::ReplicaView view = experts_.replica_view();
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
    pass.served = experts_.served();
    pass.gate = experts_.gate();
    pass.up = experts_.up();
    pass.down = experts_.down();
    pass.grouping = {b.keys.data(),     b.values.data(),  b.sorted_keys.data(), b.sorted_values.data(),
                     b.position.data(), b.offsets.data(), b.tile_starts.data(), b.sort_temp.data(),
                     b.sort_temp.size()};
    pass.inter = b.inter.data();
    pass.expert_out = b.expert_out.data();
    pass.back = b.back.data() + t0 * h;
    pass.errors = experts_.errors();
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
  moe::detail::DeviceExpertTable<T> experts_;  // copy lists, served experts, error word
  kernels::cuda::DeviceArray<int> one_record_, token_pos_;
  kernels::cuda::DeviceArray<long long> zero_base_;
  std::size_t scan_bytes_ = 0, sort_bytes_ = 0;
  kernels::cuda::OwnedCublas cublas_;
  detail_cuda::StreamPool pool_;  // plan events, then fork, E2A done, joins
  detail_cuda::PlanCache plans_;
};

}  // namespace moe::schedule
