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
// The work is schedule::FinDepCudaP2PExecutor's (moe/layer/findep_cuda_p2p.cuh): the plan's operations
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
// - Options: max_tokens, schedule, gemm, cublas_workspace and max_chunks, which must hold the
//   schedule's r1 * r2 (checked at construction).
// - A rank whose arguments are rejected throws alone (the host path first agrees with its peers
//   over the collective): call can_implement() on every rank, agree, then run().
// - stats(): tokens and assignments on AG ranks, and the bytes this rank's link communicator sent
//   (an AG rank's are all dispatch, an EG rank's all combine); no record counts.
// Replicas: replication::None, or a replication::Table over EG indices with the host path's rule
// (token t of AG rank p uses copy (p + t) mod n of an expert's n listed copies).

#include <memory>
#include <span>
#include <type_traits>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"
#include "moe/layer/layer.hpp"
#include "moe/schedule/disaggregated.hpp"
#include "moe/layer/findep_cuda_p2p.cuh"

namespace moe {

namespace detail {
/// A communicator that can make a second one over the same ranks (collective::Nccl::duplicate).
template <class C>
concept DuplicableComm = requires(C const& c) {
  { c.duplicate() } -> std::same_as<C>;
};
}  // namespace detail

template <ModelShape Model, router::Policy Router, placement::Policy Placement, replication::Policy Replicas,
          schedule::Policy Schedule, collective::Communicator Comm>
  requires(execution_path<Schedule, Comm> == ExecutionPath::device_disaggregated)
class Layer<Model, Router, Placement, Replicas, Schedule, Comm> {
  using Executor = schedule::FinDepCudaP2PExecutor<Model, Router, Comm>;

public:
  static constexpr ShapeSpec shape = Model::spec;
  using element_type = typename Executor::element_type;
  using T = element_type;
  using Options = LayerOptions<Schedule>;
  static constexpr ExecutionPath path = ExecutionPath::device_disaggregated;

  static_assert(collective::Collective<Comm>,
                "moe::Layer (device disaggregated): the collective needs send / recv (collective::Collective)");
  static_assert(detail::expert_group_replicas<Replicas>,
                "moe::Layer (device disaggregated): the Replicas policy must be replication::None or a replication::Table "
                "over the expert group's indices");

  struct Arguments {
    int tokens = 0;        ///< AG ranks: their tokens; EG ranks: the token count of an AG rank
    T const* x = nullptr;  ///< AG ranks: device, tokens x hidden, 16-byte aligned; EG ranks: unused
    T* y = nullptr;        ///< AG ranks: device, tokens x hidden, written; EG ranks: unused
    cudaStream_t stream = nullptr;
  };

  /// One communicator; the E2A link gets `comm.duplicate()` (a collective call on every rank).
  /// `placement` maps each routed expert to an EG index in [0, size - options.schedule.ag).
  Layer(Comm& comm, Placement const& placement, Replicas const& replicas, LayerWeights<T> weights, Options options)
    requires detail::DuplicableComm<Comm>
      : Layer(duplicate(comm, placement, replicas, options), comm, nullptr, placement, replicas, weights, options) {}

  /// Two communicators over the same ranks: `a2e` for the tokens to the experts, `e2a` for the
  /// partial results back.
  Layer(Comm& a2e, Comm& e2a, Placement const& placement, Replicas const& replicas, LayerWeights<T> weights,
        Options options)
      : Layer(nullptr, a2e, &e2a, placement, replicas, weights, options) {}

  /// Bytes of caller-owned device workspace run() needs on this rank (AG and EG ranks differ).
  [[nodiscard]] std::size_t workspace_size() const { return executor_.workspace_size(); }

  [[nodiscard]] Status can_implement(Arguments const& a) const {
    return executor_.can_implement(executor_args(a), schedule_.config());
  }

  /// One forward pass, enqueued on a.stream; every rank calls it (see the file comment).
  void run(Arguments const& a, std::span<std::byte> workspace) {
    bool ag = executor_.is_ag();
    collective::Counters const& link = ag ? a2e_->counters() : e2a_->counters();
    std::size_t before = link.bytes_sent();
    executor_.run(executor_args(a), schedule_.config(), workspace);
    stats_ = {};
    stats_.tokens = ag ? a.tokens : 0;
    stats_.assignments = static_cast<long long>(stats_.tokens) * shape.top_k;
    stats_.meta_bytes = schedule::detail_cuda::findep_meta_bytes(shape.top_k);
    stats_.record_bytes = stats_.meta_bytes + static_cast<std::size_t>(shape.hidden) * sizeof(T);
    (ag ? stats_.dispatch_bytes : stats_.combine_bytes) = link.bytes_sent() - before;
  }

  [[nodiscard]] LayerStats const& stats() const { return stats_; }

  [[nodiscard]] bool is_attention_rank() const { return executor_.is_ag(); }
  [[nodiscard]] Schedule const& schedule() const { return schedule_; }
  /// Error bits of the last run() on an EG rank (kernels::cuda::DeviceError). Synchronises the device.
  [[nodiscard]] unsigned errors() const { return executor_.errors(); }
  [[nodiscard]] Executor const& executor() const { return executor_; }

private:
  static Schedule checked(Options const& o, int ranks) {
    Schedule s = o.schedule;
    detail::check_disaggregated_schedule(s, ranks);
    check(static_cast<long long>(s.r1) * s.r2 <= o.max_chunks, "moe::Layer (device disaggregated): the schedule's "
          "r1 * r2 = ", static_cast<long long>(s.r1) * s.r2, " chunks exceed LayerOptions::max_chunks = ", o.max_chunks);
    return s;
  }

  static schedule::FinDepCudaOptions executor_options(Options const& o) {
    return {.max_tokens = o.max_tokens, .max_chunks = o.max_chunks, .cublas_workspace = o.cublas_workspace,
            .gemm = o.gemm};
  }

  static std::unique_ptr<Comm> duplicate(Comm const& comm, Placement const& placement, Replicas const& replicas,
                                         Options const& o) {
    // A bad schedule, placement or replica table fails before the collective call.
    (void)checked(o, comm.size());
    (void)detail::expert_group_table(placement, replicas, shape.experts, comm.size() - o.schedule.ag);
    return std::make_unique<Comm>(comm.duplicate());
  }

  /// e2a == nullptr: the link uses `owned`.
  Layer(std::unique_ptr<Comm> owned, Comm& a2e, Comm* e2a, Placement const& placement, Replicas const& replicas,
        LayerWeights<T> weights, Options const& options)
      : owned_e2a_(std::move(owned)),
        a2e_(&a2e),
        e2a_(e2a ? e2a : owned_e2a_.get()),
        schedule_(checked(options, a2e.size())),
        executor_(a2e, *e2a_, schedule_.ag,
                  detail::expert_group_table(placement, replicas, shape.experts, a2e.size() - schedule_.ag), weights,
                  executor_options(options), detail::expert_group_copies(replicas)) {}

  static typename Executor::Arguments executor_args(Arguments const& a) { return {a.tokens, a.x, a.y, a.stream}; }

  std::unique_ptr<Comm> owned_e2a_;  // the duplicate made by the one-communicator constructor
  Comm* a2e_;
  Comm* e2a_;
  Schedule schedule_;
  Executor executor_;
  LayerStats stats_;
};

}  // namespace moe
