#pragma once
// The device disaggregated execution path of moe::Layer (moe/layer/layer.hpp; nvcc only): a device
// collective (collective::Nccl) and FinDEP or PPPipe with the attention group (AG) and the expert
// group (EG) on different GPUs. The same policy slots and protocol as the host disaggregated path
// (moe/layer/host_disaggregated.hpp), so an engine moves a disaggregated layer to GPUs by changing
// the Collective:
//
//   using L = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None,
//                        moe::schedule::FinDep, moe::collective::Nccl>;
//   L layer(nccl, on_eg, {}, device_weights,
//           {.max_tokens = 4096, .schedule = {.ag = 2, .order = moe::schedule::Order::aass, .r1 = 4, .r2 = 2}});
//   void* ws; cudaMalloc(&ws, layer.workspace_size());                  // AG and EG ranks differ
//   layer.run({.tokens = n, .x = x, .y = y, .stream = s}, {static_cast<std::byte*>(ws), bytes});
//
// The work is schedule::FinDepCudaExecutor's with the PointToPoint link (moe/layer/findep_cuda_executor.cuh): the plan's operations
// on one CUDA stream per resource, the A2E and E2A links as send / recv on two communicators (NCCL
// runs one communicator's operations in issue order, so one communicator per link stream). The
// one-communicator constructor makes the second with `comm.duplicate()` (Nccl: ncclCommSplit), a
// collective call, so every rank constructs its layer at the same point; the two-communicator
// constructor takes both from the engine.
//
// Differences from the host disaggregated path, all because nothing here synchronises the host:
// - EG ranks pass the token count of an AG rank (every AG rank has the same) and no x / y: the
//   message sizes of every chunk follow from it, so no count has to be waited for. AG ranks pass
//   their tokens, x and y (device memory, 16-byte aligned).
// - Options: max_tokens, schedule, and device = {gemm, cublas_workspace, max_chunks}; max_chunks
//   must hold the schedule's r1 * r2 (checked at construction).
// - The ranks' agreement on a pass goes over the A2E communicator's device memory, with one host
//   synchronisation (moe/layer/paths/device.cuh); under stream capture a rank checks alone.
// - stats(): tokens and assignments on AG ranks, and the bytes this rank's link communicator sent
//   (an AG rank's are all dispatch, an EG rank's all combine). The record counts stay on the
//   device: with Options::device.count_records each pass keeps them there (one memset and one
//   small kernel, captured with the pass) and Layer::read_record_counts() reads them afterwards
//   (an AG rank's in records_remote, an EG rank's in records_received, as on the host path).
// - live.window: the load window (moe/layer/live.hpp). Each AG rank counts its pairs per expert and
//   per EG rank with a kernel after the pass; the rows are gathered on the A2E communicator and
//   reach the host on the next pass. Re-planning (live.replan_every, replan(), migrate_to()) with a
//   placement::Table and replication::Table or BatchSplit is the host disaggregated path's: plans
//   over EG indices, the EG ranks' experts in a device arena, each migration chunk an all-to-all-v
//   on the A2E communicator on the caller's stream (detail::DeviceMigration), the AG ranks with no
//   arena and no bytes. FinDepCudaExecutor::prepare_tables builds the next plan's device tables
//   before the switch; with a load window (the layer may switch plans: re-planning, or
//   Layer::migrate_to without spare slots) the workspace holds any plan the arena allows.
// Replicas: any replica policy with fixed copies over EG indices, with the host path's rule (token
// t of AG rank p uses copy (p + t) mod n of an expert's n copies); or replication::BatchSplit over
// EG indices: each micro-batch split over the copies on the device (FinDepCudaExecutor; the AG
// ranks' count swaps are in stats().control_bytes, not dispatch_bytes).

#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"
#include "moe/layer/layer.hpp"
#include "moe/layer/live.hpp"
#include "moe/layer/paths/device.cuh"
#include "moe/kernels/records.hpp"
#include "moe/schedule/disaggregated.hpp"
#include "moe/layer/findep_cuda_executor.cuh"

namespace moe {

namespace layer {

/// The device disaggregated path's executor: schedule::FinDepCudaExecutor (PointToPoint) behind the front.
template <ModelShape Model, router::Policy Router, placement::Policy Placement, replication::Policy Replicas,
          schedule::Policy Schedule, collective::Communicator Comm>
class DeviceDisaggregatedExecutor : public detail::DeviceMigration<Comm> {
  using Executor = schedule::FinDepCudaExecutor<Model, Router, schedule::PointToPoint<Comm>>;
  using detail::DeviceMigration<Comm>::stream_;

public:
  static constexpr ShapeSpec shape = Model::spec;
  using T = typename Executor::element_type;
  using DeviceOptions = cuda::DisaggregatedOptions;
  using Options = LayerOptions<Schedule, DeviceOptions>;
  static constexpr bool supports_no_dedup = false;

  static_assert(collective::PointToPoint<Comm> && collective::Exchange<Comm> &&
                    collective::StreamOrdered<Comm, cudaStream_t>,
                "moe::Layer (device disaggregated): the collective needs send / recv (collective::PointToPoint), "
                "all_gather_v (collective::Exchange) and set_stream (collective::StreamOrdered)");
  static_assert(!replication::BatchPolicy<Replicas> || std::is_same_v<Replicas, replication::BatchSplit>,
                "moe::Layer (device disaggregated): of the batch-aware replica policies this path takes "
                "replication::BatchSplit (each micro-batch split over the copies); give it that or a policy "
                "with fixed copies (replication::Table, None)");

  struct Arguments {
    int tokens = 0;        ///< AG ranks: their tokens; EG ranks: the token count of an AG rank
    T const* x = nullptr;  ///< AG ranks: device, tokens x hidden, 16-byte aligned; EG ranks: unused
    T* y = nullptr;        ///< AG ranks: device, tokens x hidden, written; EG ranks: unused
    cudaStream_t stream = nullptr;
  };
  struct Buffers {
    std::span<std::byte> workspace;       // the executor carves it (AG and EG ranks differ)
    std::span<std::int32_t> load_counts;  // E + ranks: the load window's row of this rank
                                          // (LayerOptions::live.window > 0; FinDepCudaExecutor::count_loads)
  };

  /// One communicator; the E2A link gets `comm.duplicate()` (a collective call on every rank).
  DeviceDisaggregatedExecutor(Comm& comm, Placement const& placement, Replicas const& replicas, LayerWeights<T> weights,
                              Options const& options)
    requires collective::Duplicable<Comm>
      : DeviceDisaggregatedExecutor(duplicate(comm, placement, options), comm, nullptr, placement, replicas, weights,
                                    options) {}

  /// Two communicators over the same ranks: `a2e` for the tokens to the experts, `e2a` back.
  DeviceDisaggregatedExecutor(Comm& a2e, Comm& e2a, Placement const& placement, Replicas const& replicas,
                              LayerWeights<T> weights, Options const& options)
      : DeviceDisaggregatedExecutor(nullptr, a2e, &e2a, placement, replicas, weights, options) {}

  void carve(core::Carver& c, Buffers& b) const {
    b.workspace = c.take<std::byte>(executor_.workspace_size());
    if (window_) b.load_counts = c.take<std::int32_t>(static_cast<std::size_t>(shape.experts + a2e_->size()));
  }

  [[nodiscard]] Status check_pass(Arguments const& a) const {
    if (window_)
      if (Status st = detail::DeviceLoadRows::check_not_captured("moe::Layer (device disaggregated)", a.stream); !st.ok)
        return st;
    return executor_.can_implement(executor_args(a), schedule_.config());
  }
  [[nodiscard]] bool holds_tokens() const { return executor_.is_ag(); }

  bool gather_votes(Arguments const& a, detail::Vote const& mine, std::span<detail::Vote> votes) {
    return detail::gather_votes_device(*a2e_, a.stream, mine, votes, votes_.dev.get(), votes_.host.get());
  }

  /// One forward pass, enqueued on a.stream; agreed by the front.
  void run(Arguments const& a, Buffers const& b, LayerStats& stats) {
    bool ag = executor_.is_ag();
    collective::Counters const& link = ag ? a2e_->counters() : e2a_->counters();
    std::size_t before = link.bytes_sent();
    executor_.run(executor_args(a), schedule_.config(), b.workspace);
    std::size_t split = a.tokens > 0 ? executor_.split_bytes(schedule_.config().r1) : 0;  // on the A2E link too
    stats.control_bytes = split;
    stats.tokens = ag ? a.tokens : 0;
    stats.assignments = static_cast<long long>(stats.tokens) * shape.top_k;
    stats.meta_bytes = detail::record_meta_bytes(shape.top_k);
    stats.record_bytes = stats.meta_bytes + static_cast<std::size_t>(shape.hidden) * sizeof(T);
    (ag ? stats.dispatch_bytes : stats.combine_bytes) = link.bytes_sent() - before - split;
    stream_ = a.stream;
    if (!b.load_counts.empty()) executor_.count_loads(b.workspace, a.tokens, b.load_counts.data(), a.stream);
    if (kept_counts_.get()) executor_.count_records(b.workspace, a.tokens, schedule_.config(), kept_counts_.get(), a.stream);
  }

  /// Layer::read_record_counts(): the counts the newest pass with Options::device.count_records
  /// kept on the device, into `st` (nothing without that option). Call it once that pass, or the
  /// replay of a CUDA graph that captured one, has finished (its stream synchronised).
  void read_record_counts(LayerStats& st) {
    if (!kept_counts_.get()) return;
    std::uint64_t got[2] = {0, 0};
    kernels::cuda::check_cuda(cudaMemcpy(got, kept_counts_.get(), sizeof got, cudaMemcpyDeviceToHost),
                              "cudaMemcpy (record counts)");
    st.records_local = 0;  // an AG rank serves no expert; an EG rank's records all come from AG ranks
    st.records_remote = static_cast<long long>(got[0]);
    st.records_received = static_cast<long long>(got[1]);
  }

  /// The load window (LayerOptions::live.window): this pass's rows of every rank, gathered on the
  /// A2E communicator; the front takes them on the next pass or when the caller asks for the
  /// window (detail::DeviceLoadRows).
  std::span<std::int32_t const> gather_loads(Buffers const& b, std::span<std::int32_t> gathered) {
    loads_.gather(*a2e_, stream_, b.load_counts, gathered);
    return {};
  }
  std::span<std::int32_t const> take_loads() { return loads_.take(); }

  // ---- What the front's re-planning (moe/layer/live.hpp) asks of a path: with a placement::Table
  // and replication::Table or replication::BatchSplit, whose plans are over the expert group. The
  // moves go over the A2E communicator on the caller's stream (detail::DeviceMigration) ----

  static constexpr bool replannable = live::Replannable<Placement, Replicas>;
  /// Each expert's EG index in the placement (also what the agreement hashes, on any placement).
  [[nodiscard]] std::vector<int> primary_ranks() const {
    std::vector<int> p(static_cast<std::size_t>(shape.experts));
    for (std::size_t e = 0; e < p.size(); ++e) p[e] = placement_.rank_of(static_cast<int>(e));
    return p;
  }
  /// The replica policy over EG indices (its copies are the executor's).
  [[nodiscard]] Replicas const& replicas() const { return replicas_; }
  [[nodiscard]] std::span<ExpertWeights<T> const> expert_weights() const { return executor_.expert_weights(); }
  /// A plan's device tables, built, uploaded and checked before the switch, so that adopt() cannot fail.
  struct NextPlan {
    typename Executor::Tables tables;
    Placement placement;
    Replicas replicas;
  };
  NextPlan prepare_plan(Placement placement, Replicas replicas, std::span<ExpertWeights<T> const> experts) const
    requires replannable
  {
    return prepare(std::move(placement), std::move(replicas), experts, true);
  }
  void adopt(NextPlan&& next, std::span<ExpertWeights<T> const> experts) noexcept {
    executor_.adopt(std::move(next.tables), experts);
    placement_ = std::move(next.placement);
    replicas_ = std::move(next.replicas);
  }
  /// The experts now live in the front's arena: the weight tables are rebuilt (same copies).
  void set_expert_weights(std::span<ExpertWeights<T> const> experts)
    requires replannable
  {
    adopt(prepare(placement_, replicas_, experts, false), experts);
  }

  [[nodiscard]] bool is_attention_rank() const { return executor_.is_ag(); }
  /// Error bits of the last run() on an EG rank (kernels::cuda::DeviceError). Synchronises the device.
  [[nodiscard]] unsigned errors() const { return executor_.errors(); }
  [[nodiscard]] Executor const& executor() const { return executor_; }

private:
  static void check_chunks(Options const& o) {
    check(static_cast<long long>(o.schedule.r1) * o.schedule.r2 <= o.device.max_chunks,
          "moe::Layer (device disaggregated): the schedule's r1 * r2 = ",
          static_cast<long long>(o.schedule.r1) * o.schedule.r2, " chunks exceed Options::device.max_chunks = ",
          o.device.max_chunks);
  }

  static schedule::FinDepCudaOptions executor_options(Options const& o) {
    return {.max_tokens = o.max_tokens, .max_chunks = o.device.max_chunks,
            .cublas_workspace = o.device.cublas_workspace, .gemm = o.device.gemm,
            .replans = replannable && o.live.window > 0};  // the layer may switch plans
  }

  /// `new_copies` false: the same copies with other weights (the split is kept).
  NextPlan prepare(Placement placement, Replicas replicas, std::span<ExpertWeights<T> const> experts,
                   bool new_copies) const {
    detail::ExpertGroupPlan p = detail::expert_group_plan(placement, replicas, shape.experts, executor_.expert_ranks());
    auto tables = executor_.prepare_tables(p.on_eg, p.copies, experts, new_copies ? p.split : nullptr);
    return {std::move(tables), std::move(placement), std::move(replicas)};
  }

  static std::unique_ptr<Comm> duplicate(Comm const& comm, Placement const& placement, Options const& o) {
    // A bad schedule or placement fails before the collective call.
    check_chunks(o);
    (void)detail::expert_group_table(placement, shape.experts, comm.size() - o.schedule.ag);
    return std::make_unique<Comm>(comm.duplicate());
  }

  /// e2a == nullptr: the link uses `owned`.
  DeviceDisaggregatedExecutor(std::unique_ptr<Comm> owned, Comm& a2e, Comm* e2a, Placement const& placement,
                              Replicas const& replicas, LayerWeights<T> weights, Options const& options)
      : detail::DeviceMigration<Comm>(a2e, "moe::Layer (device disaggregated)"),
        owned_e2a_(std::move(owned)),
        a2e_(&a2e),
        e2a_(e2a ? e2a : owned_e2a_.get()),
        schedule_((check_chunks(options), options.schedule)),
        executor_(make_executor(a2e, *e2a_, schedule_.ag, placement, replicas, weights, options)),
        placement_(placement),
        replicas_(replicas),
        votes_(a2e.size()),
        window_(options.live.window > 0) {
    if (options.device.count_records) kept_counts_ = kernels::cuda::DeviceArray<std::uint64_t>(2);
    if (window_)
      loads_ = detail::DeviceLoadRows(static_cast<std::size_t>(a2e.size()) *
                                      static_cast<std::size_t>(shape.experts + a2e.size()));
  }

  static typename Executor::Arguments executor_args(Arguments const& a) { return {a.tokens, a.x, a.y, a.stream}; }
  /// The pipeline executor over the plan's expert-group tables and its split, as prepare() builds
  /// the next plan's (a prvalue: the executor is neither copied nor moved).
  static Executor make_executor(Comm& a2e, Comm& e2a, int ag, Placement const& placement, Replicas const& replicas,
                                LayerWeights<T> weights, Options const& options) {
    detail::ExpertGroupPlan p = detail::expert_group_plan(placement, replicas, shape.experts, a2e.size() - ag);
    return Executor(a2e, e2a, ag, std::move(p.on_eg), weights, executor_options(options), p.copies, p.split);
  }

  std::unique_ptr<Comm> owned_e2a_;  // the duplicate made by the one-communicator constructor
  Comm* a2e_;
  Comm* e2a_;
  Schedule schedule_;
  Executor executor_;
  Placement placement_;  // over EG indices, as given (re-planning rebuilds both)
  Replicas replicas_;
  detail::DeviceVotes votes_;
  bool window_;                    // LayerOptions::live.window > 0
  detail::DeviceLoadRows loads_;   // the window's gathered rows, on their way to the host
  kernels::cuda::DeviceArray<std::uint64_t> kept_counts_;  // count_records: sent, received (the newest pass)
};

}  // namespace layer

template <>
struct detail::path_executor<ExecutionPath::device_disaggregated> {
  template <class... Policies>
  using type = layer::DeviceDisaggregatedExecutor<Policies...>;
};

}  // namespace moe
