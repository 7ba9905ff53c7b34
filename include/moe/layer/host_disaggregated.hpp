#pragma once
// moe::DisaggregatedLayer: one MoE layer on disaggregated ranks (FinDEP, PPPipe), composed from the
// same policies as moe::Layer. The Schedule policy is schedule::FinDep or schedule::PPPipe
// (schedule/disaggregated.hpp): its type picks the pipeline, its value carries the AG size and the
// solved configuration (order, r1, r2).
//
//   using L = moe::DisaggregatedLayer<Model, Router, Placement, moe::replication::None,
//                                     moe::schedule::FinDep, Comm>;
//   L layer(comm, on_eg, {}, weights, {.ag = 2, .order = moe::schedule::Order::aass, .r1 = 3, .r2 = 2},
//           {.max_tokens = 512});
//   std::vector<std::byte> ws(layer.workspace_size());   // caller-owned scratch (AG and EG differ)
//   layer.run({.tokens = n, .x = x, .y = y}, ws);          // every rank; EG ranks pass no tokens
//
// Ranks [0, ag) form the attention group: they hold the tokens, the router and the shared experts.
// Ranks [ag, size) form the expert group: `placement` maps each routed expert to an EG index in
// [0, size - ag), and an EG rank needs only its own experts' weights. The output on each AG rank is
// the sequential layer's (moe::Layer, moe::reference_forward) up to summation order. The work is
// done by schedule::FinDepExecutor (host threads over the collective's send / recv; see
// docs/findep.md); with collective::Mpi the MPI library must grant MPI_THREAD_MULTIPLE.
//
// Replicas: replication::None (one copy per expert, on the placement's EG index) or a
// replication::Table over EG indices (e.g. a CRAFT or EPLB plan for the expert group; the
// placement's EG index must be among each expert's copies). Token t of AG rank p uses copy
// (p + t) mod n of the n copies the table lists for an expert; an EG rank needs the weights of
// every expert it holds a copy of.
//
// Not supported (constructor error): LayerOptions::deduplicate = false (a token always goes once
// to each EG rank that serves one of its experts). With a device communicator (collective::Nccl)
// the same type is the GPU layer of include/moe/layer/cuda_disaggregated.cuh (same replica rule).
//
// moe::Layer with a disaggregated schedule policy is this type (the specialisation at the end of
// this file), so the design's composition moe::Layer<Model, Router, Placement, Replicas,
// schedule::FinDep, Comm> names it; its constructor takes the schedule's value as well.

#include <span>
#include <type_traits>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"
#include "moe/core/shape.hpp"
#include "moe/layer/layer.hpp"
#include "moe/core/weights.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/router/router.hpp"
#include "moe/schedule/disaggregated.hpp"
#include "moe/layer/findep_executor.hpp"

namespace moe {

namespace detail {
/// The construction-time checks of a disaggregated schedule on `ranks` ranks (both backends).
template <schedule::DisaggregatedPolicy Schedule>
void check_disaggregated_schedule(Schedule const& s, int ranks) {
  check(s.ag >= 1 && s.ag < ranks, "moe::DisaggregatedLayer: the attention group must hold between 1 and ", ranks - 1,
        " of the ", ranks, " ranks (the rest form the expert group), got ag = ", s.ag);
  check(s.r1 >= 1 && s.r2 >= 1, "moe::DisaggregatedLayer: r1 and r2 must be at least 1, got r1 = ", s.r1,
        ", r2 = ", s.r2);
  check(Schedule::pipeline != schedule::Pipeline::pppipe || s.r2 == 1,
        "moe::DisaggregatedLayer: PPPipe has no token chunks; r2 must be 1, got r2 = ", s.r2);
}

/// Replica policies a disaggregated layer takes: replication::None, or a replication::Table over
/// the expert group's indices.
template <class Replicas>
inline constexpr bool expert_group_replicas =
    std::is_same_v<Replicas, replication::None> || std::is_same_v<Replicas, replication::Table>;

/// Any Placement policy as the executors' table of expert -> expert-group index, validated against
/// the `eg` expert-group ranks, and the replica table checked against it (every placement index
/// among the expert's copies, every copy inside the expert group).
template <placement::Policy Placement, class Replicas>
placement::Table expert_group_table(Placement const& p, Replicas const& replicas, int experts, int eg) {
  p.validate(experts, eg);
  std::vector<int> t(static_cast<std::size_t>(experts));
  for (int e = 0; e < experts; ++e) t[static_cast<std::size_t>(e)] = p.rank_of(e);
  if constexpr (std::is_same_v<Replicas, replication::Table>) replicas.validate(experts, eg, t);
  return placement::Table(std::move(t));
}

/// The replica table as the host executor takes it (empty: one copy per expert).
template <class Replicas>
replication::Table expert_group_copies(Replicas const& replicas) {
  if constexpr (std::is_same_v<Replicas, replication::Table>)
    return replicas;
  else
    return {};
}
}  // namespace detail

template <ModelShape Model, router::Policy Router, placement::Policy Placement, replication::Policy Replicas,
          schedule::DisaggregatedPolicy Schedule, collective::Collective Comm>
class DisaggregatedLayer {
public:
  static constexpr ShapeSpec shape = Model::spec;
  using element_type = storage_t<shape>;
  using T = element_type;

  static_assert(shape.hidden > 0 && shape.experts > 0 && shape.top_k > 0 && shape.top_k <= shape.experts,
                "moe::DisaggregatedLayer: the model shape needs positive sizes and top_k <= experts");
  static_assert(Router::fits(shape), "moe::DisaggregatedLayer: this Router policy does not fit the model's scoring "
                                     "and grouping (see router::ForModel<Model>)");
  static_assert(Comm::memory == collective::Memory::host,
                "moe::DisaggregatedLayer: a device communicator (Nccl) needs #include "
                "<moe/layer/cuda_disaggregated.cuh>, compiled by nvcc");
  static_assert(detail::expert_group_replicas<Replicas>,
                "moe::DisaggregatedLayer: the Replicas policy must be replication::None or a replication::Table "
                "over the expert group's indices");

  struct Arguments {
    int tokens = 0;        ///< tokens on this rank (AG ranks; EG ranks pass 0)
    T const* x = nullptr;  ///< tokens x hidden
    T* y = nullptr;        ///< tokens x hidden, written
  };

  /// `placement` maps experts to EG ranks [0, size - schedule.ag).
  DisaggregatedLayer(Comm& comm, Placement const& placement, Replicas const& replicas, LayerWeights<T> weights,
                     Schedule schedule, LayerOptions options)
      : schedule_(checked(schedule, options, comm.size())),
        executor_(comm, shape, schedule.ag,
                  detail::expert_group_table(placement, replicas, shape.experts, comm.size() - schedule.ag), weights,
                  options.max_tokens, detail::expert_group_copies(replicas)) {}

  /// Bytes of caller-owned workspace run() needs on this rank.
  [[nodiscard]] std::size_t workspace_size() const { return executor_.workspace_size(); }

  [[nodiscard]] Status can_implement(Arguments const& a) const {
    if (a.tokens < 0) return {false, detail::concat("moe::DisaggregatedLayer: negative token count ", a.tokens)};
    if (!executor_.is_ag() && a.tokens != 0)
      return {false, detail::concat("moe::DisaggregatedLayer: rank ", executor_.attention_ranks() + executor_.eg_index(),
                                    " is an expert-group rank and was given ", a.tokens,
                                    " tokens; tokens live on the attention-group ranks")};
    if (a.tokens > executor_.max_tokens())
      return {false, detail::concat("moe::DisaggregatedLayer: ", a.tokens, " tokens exceed the ", executor_.max_tokens(),
                                    " the workspace was sized for (LayerOptions::max_tokens)")};
    if (a.tokens > 0 && (a.x == nullptr || a.y == nullptr))
      return {false, "moe::DisaggregatedLayer: input or output pointer is null"};
    if (a.tokens % schedule_.r1 != 0)
      return {false, detail::concat("moe::DisaggregatedLayer: r1 = ", schedule_.r1, " does not divide the ", a.tokens,
                                    " tokens of this attention-group rank")};
    if ((a.tokens / schedule_.r1) % schedule_.r2 != 0)
      return {false, detail::concat("moe::DisaggregatedLayer: r2 = ", schedule_.r2, " does not divide the ",
                                    a.tokens / schedule_.r1, " tokens of a micro-batch")};
    return {};
  }

  /// One forward pass. Every rank of the collective must call it (EG ranks with no tokens).
  /// A rank whose arguments can_implement() rejects does not throw alone: the executor first
  /// agrees with the other ranks, and then every rank throws with that rank's reason (a rank
  /// throwing alone would leave its MPI peers waiting for its messages).
  void run(Arguments const& a, std::span<std::byte> workspace) {
    executor_.run({a.tokens, a.x, a.y}, schedule_.config(), workspace, can_implement(a));
  }

  [[nodiscard]] bool is_attention_rank() const { return executor_.is_ag(); }
  [[nodiscard]] Schedule const& schedule() const { return schedule_; }

private:
  static Schedule checked(Schedule s, LayerOptions const& o, int ranks) {
    detail::check_disaggregated_schedule(s, ranks);
    check(o.max_tokens > 0, "moe::DisaggregatedLayer: LayerOptions::max_tokens must be positive, got ", o.max_tokens);
    check(o.deduplicate, "moe::DisaggregatedLayer: LayerOptions::deduplicate = false is not supported (a token goes "
                         "once to each expert-group rank that serves one of its experts)");
    return s;
  }

  Schedule schedule_;
  schedule::FinDepExecutor<Router, T, Comm> executor_;
};

/// moe::Layer with a disaggregated schedule policy (schedule::FinDep, schedule::PPPipe) is the
/// DisaggregatedLayer of the same policies: constructed as
/// Layer(comm, placement, replicas, weights, schedule, options), otherwise the same type.
template <ModelShape Model, router::Policy Router, placement::Policy Placement, replication::Policy Replicas,
          schedule::Policy Schedule, collective::Communicator Comm>
  requires schedule::DisaggregatedPolicy<Schedule>
class Layer<Model, Router, Placement, Replicas, Schedule, Comm>
    : public DisaggregatedLayer<Model, Router, Placement, Replicas, Schedule, Comm> {
public:
  using DisaggregatedLayer<Model, Router, Placement, Replicas, Schedule, Comm>::DisaggregatedLayer;
};

}  // namespace moe
