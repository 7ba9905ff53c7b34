#pragma once
// moe::DisaggregatedLayer with a device communicator (collective::Nccl; nvcc only): FinDEP or PPPipe
// with the attention group (AG) and the expert group (EG) on different GPUs. The same policy slots
// and protocol as the host DisaggregatedLayer (layer/disaggregated.hpp), so an engine moves a
// disaggregated layer to GPUs by changing the Collective:
//
//   using L = moe::DisaggregatedLayer<Model, Router, moe::placement::Table, moe::replication::None,
//                                     moe::schedule::FinDep, moe::collective::Nccl>;
//   L layer(nccl, on_eg, {}, device_weights, {.ag = 2, .order = moe::schedule::Order::aass, .r1 = 4, .r2 = 2},
//           {.max_tokens = 4096});
//   void* ws; cudaMalloc(&ws, layer.workspace_size());                  // AG and EG ranks differ
//   layer.run({.tokens = n, .x = x, .y = y, .stream = s}, {static_cast<std::byte*>(ws), bytes});
//
// The work is schedule::FinDepCudaP2PExecutor's (schedule/findep_cuda.cuh): the plan's operations
// on one CUDA stream per resource, the A2E and E2A links as send / recv on two communicators (NCCL
// runs one communicator's operations in issue order, so one communicator per link stream). The
// one-communicator constructor makes the second with `comm.duplicate()` (Nccl: ncclCommSplit), a
// collective call, so every rank constructs its layer at the same point; the two-communicator
// constructor takes both from the engine.
//
// Differences from the host layer, all because nothing here synchronises the host:
// - EG ranks pass the token count of an AG rank (every AG rank has the same) and no x / y: the
//   message sizes of every chunk follow from it, so no count has to be waited for. AG ranks pass
//   their tokens, x and y (device memory, 16-byte aligned).
// - Options are schedule::FinDepCudaOptions (max_tokens, the GEMM kernel, cuBLAS workspace); its
//   max_chunks must hold the schedule's r1 * r2 (checked at construction).
// - A rank whose arguments are rejected throws alone (the host layer first agrees with its peers
//   over the collective): call can_implement() on every rank, agree, then run().
// Replicas: replication::None, or a replication::Table over EG indices with the host layer's rule
// (token t of AG rank p uses copy (p + t) mod n of an expert's n listed copies).
// moe::Layer with a disaggregated schedule and a device communicator is this type as well.

#include <memory>
#include <span>
#include <type_traits>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"
#include "moe/layer/disaggregated.hpp"
#include "moe/schedule/disaggregated.hpp"
#include "moe/layer/findep_cuda.cuh"

namespace moe {

namespace detail {
/// A communicator that can make a second one over the same ranks (collective::Nccl::duplicate).
template <class C>
concept DuplicableComm = requires(C const& c) {
  { c.duplicate() } -> std::same_as<C>;
};
}  // namespace detail

template <ModelShape Model, router::Policy Router, placement::Policy Placement, replication::Policy Replicas,
          schedule::DisaggregatedPolicy Schedule, collective::Collective Comm>
  requires(Comm::memory == collective::Memory::device)
class DisaggregatedLayer<Model, Router, Placement, Replicas, Schedule, Comm> {
  using Executor = schedule::FinDepCudaP2PExecutor<Model, Router, Comm>;

public:
  static constexpr ShapeSpec shape = Model::spec;
  using element_type = typename Executor::element_type;
  using T = element_type;

  static_assert(detail::expert_group_replicas<Replicas>,
                "moe::DisaggregatedLayer: the Replicas policy must be replication::None or a replication::Table "
                "over the expert group's indices");

  struct Arguments {
    int tokens = 0;        ///< AG ranks: their tokens; EG ranks: the token count of an AG rank
    T const* x = nullptr;  ///< AG ranks: device, tokens x hidden, 16-byte aligned; EG ranks: unused
    T* y = nullptr;        ///< AG ranks: device, tokens x hidden, written; EG ranks: unused
    cudaStream_t stream = nullptr;
  };

  /// One communicator; the E2A link gets `comm.duplicate()` (a collective call on every rank).
  /// `placement` maps each routed expert to an EG index in [0, size - schedule.ag).
  DisaggregatedLayer(Comm& comm, Placement const& placement, Replicas const& replicas, LayerWeights<T> weights,
                     Schedule schedule, schedule::FinDepCudaOptions options)
    requires detail::DuplicableComm<Comm>
      : DisaggregatedLayer(duplicate(comm, placement, replicas, schedule, options), comm, nullptr, placement, replicas,
                           weights, schedule, options) {}

  /// Two communicators over the same ranks: `a2e` for the tokens to the experts, `e2a` for the
  /// partial results back.
  DisaggregatedLayer(Comm& a2e, Comm& e2a, Placement const& placement, Replicas const& replicas,
                     LayerWeights<T> weights, Schedule schedule, schedule::FinDepCudaOptions options)
      : DisaggregatedLayer(nullptr, a2e, &e2a, placement, replicas, weights, schedule, options) {}

  /// Bytes of caller-owned device workspace run() needs on this rank (AG and EG ranks differ).
  [[nodiscard]] std::size_t workspace_size() const { return executor_.workspace_size(); }

  [[nodiscard]] Status can_implement(Arguments const& a) const {
    return executor_.can_implement(executor_args(a), schedule_.config());
  }

  /// One forward pass, enqueued on a.stream; every rank calls it (see the file comment).
  void run(Arguments const& a, std::span<std::byte> workspace) {
    executor_.run(executor_args(a), schedule_.config(), workspace);
  }

  [[nodiscard]] bool is_attention_rank() const { return executor_.is_ag(); }
  [[nodiscard]] Schedule const& schedule() const { return schedule_; }
  /// Error bits of the last run() on an EG rank (kernels::cuda::DeviceError). Synchronises the device.
  [[nodiscard]] unsigned errors() const { return executor_.errors(); }
  [[nodiscard]] Executor const& executor() const { return executor_; }

private:
  static Schedule checked(Schedule s, schedule::FinDepCudaOptions const& o, int ranks) {
    detail::check_disaggregated_schedule(s, ranks);
    check(static_cast<long long>(s.r1) * s.r2 <= o.max_chunks, "moe::DisaggregatedLayer: the schedule's r1 * r2 = ",
          static_cast<long long>(s.r1) * s.r2, " chunks exceed FinDepCudaOptions::max_chunks = ", o.max_chunks);
    return s;
  }

  static std::unique_ptr<Comm> duplicate(Comm const& comm, Placement const& placement, Replicas const& replicas,
                                         Schedule const& s, schedule::FinDepCudaOptions const& o) {
    // A bad schedule, placement or replica table fails before the collective call.
    (void)checked(s, o, comm.size());
    (void)detail::expert_group_table(placement, replicas, shape.experts, comm.size() - s.ag);
    return std::make_unique<Comm>(comm.duplicate());
  }

  /// e2a == nullptr: the link uses `owned`.
  DisaggregatedLayer(std::unique_ptr<Comm> owned, Comm& a2e, Comm* e2a, Placement const& placement,
                     Replicas const& replicas, LayerWeights<T> weights, Schedule schedule,
                     schedule::FinDepCudaOptions options)
      : owned_e2a_(std::move(owned)),
        schedule_(checked(schedule, options, a2e.size())),
        executor_(a2e, e2a ? *e2a : *owned_e2a_, schedule.ag,
                  detail::expert_group_table(placement, replicas, shape.experts, a2e.size() - schedule.ag), weights,
                  options, detail::expert_group_copies(replicas)) {}

  static typename Executor::Arguments executor_args(Arguments const& a) { return {a.tokens, a.x, a.y, a.stream}; }

  std::unique_ptr<Comm> owned_e2a_;  // the duplicate made by the one-communicator constructor
  Schedule schedule_;
  Executor executor_;
};

}  // namespace moe
