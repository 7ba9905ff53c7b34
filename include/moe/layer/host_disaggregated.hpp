#pragma once
// The host disaggregated execution path of moe::Layer (moe/layer/layer.hpp): a host-memory
// collective (collective::InProcess, collective::Mpi) and a disaggregated schedule (schedule::FinDep
// or schedule::PPPipe, schedule/disaggregated.hpp), whose type picks the pipeline and whose value,
// in the options, carries the attention-group size and the solved configuration (order, r1, r2).
//
//   using L = moe::Layer<Model, Router, Placement, moe::replication::None, moe::schedule::FinDep, Comm>;
//   L layer(comm, on_eg, {}, weights,
//           {.max_tokens = 512, .schedule = {.ag = 2, .order = moe::schedule::Order::aass, .r1 = 3, .r2 = 2}});
//   std::vector<std::byte> ws(layer.workspace_size());   // caller-owned scratch (AG and EG differ)
//   layer.run({.tokens = n, .x = x, .y = y}, ws);          // every rank; EG ranks pass no tokens
//
// Ranks [0, ag) form the attention group: they hold the tokens, the router and the shared experts.
// Ranks [ag, size) form the expert group: `placement` maps each routed expert to an EG index in
// [0, size - ag), and an EG rank needs only its own experts' weights. The output on each AG rank is
// the sequential layer's (moe/layer/host.hpp, moe::reference_forward) up to summation order. The
// work is done by schedule::FinDepExecutor (moe/layer/findep_executor.hpp: host threads over the
// collective's send / recv; see docs/findep.md); with collective::Mpi the MPI library must grant
// MPI_THREAD_MULTIPLE.
//
// Replicas: replication::None (one copy per expert, on the placement's EG index) or a
// replication::Table over EG indices (e.g. a CRAFT or EPLB plan for the expert group; the
// placement's EG index must be among each expert's copies). Token t of AG rank p uses copy
// (p + t) mod n of the n copies the table lists for an expert; an EG rank needs the weights of
// every expert it holds a copy of.
//
// Options: max_tokens and schedule; deduplicate = false is refused (a token always goes once to
// each EG rank that serves one of its experts); the device fields are ignored.
// stats(): tokens and assignments on AG ranks; the bytes this rank sent (an AG rank's are all
// dispatch, an EG rank's all combine) and those of the agreement step (control); no record counts.

#include <span>
#include <type_traits>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"
#include "moe/core/shape.hpp"
#include "moe/core/weights.hpp"
#include "moe/layer/findep_executor.hpp"
#include "moe/layer/layer.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/router/router.hpp"
#include "moe/schedule/disaggregated.hpp"

namespace moe {

template <ModelShape Model, router::Policy Router, placement::Policy Placement, replication::Policy Replicas,
          schedule::Policy Schedule, collective::Communicator Comm>
  requires(execution_path<Schedule, Comm> == ExecutionPath::host_disaggregated)
class Layer<Model, Router, Placement, Replicas, Schedule, Comm> {
public:
  static constexpr ShapeSpec shape = Model::spec;
  using element_type = storage_t<shape>;
  using T = element_type;
  using Options = LayerOptions<Schedule>;
  static constexpr ExecutionPath path = ExecutionPath::host_disaggregated;

  static_assert(shape.hidden > 0 && shape.experts > 0 && shape.top_k > 0 && shape.top_k <= shape.experts,
                "moe::Layer (disaggregated): the model shape needs positive sizes and top_k <= experts");
  static_assert(Router::fits(shape), "moe::Layer (disaggregated): this Router policy does not fit the model's scoring "
                                     "and grouping (see router::ForModel<Model>)");
  static_assert(collective::Collective<Comm>,
                "moe::Layer (disaggregated): the host path needs a full collective::Collective");
  static_assert(detail::expert_group_replicas<Replicas>,
                "moe::Layer (disaggregated): the Replicas policy must be replication::None or a replication::Table "
                "over the expert group's indices");

  struct Arguments {
    int tokens = 0;        ///< tokens on this rank (AG ranks; EG ranks pass 0)
    T const* x = nullptr;  ///< tokens x hidden
    T* y = nullptr;        ///< tokens x hidden, written
  };

  /// `placement` maps experts to EG ranks [0, size - options.schedule.ag).
  Layer(Comm& comm, Placement const& placement, Replicas const& replicas, LayerWeights<T> weights, Options options)
      : comm_(&comm), schedule_(checked(options, comm.size())),
        executor_(comm, shape, schedule_.ag,
                  detail::expert_group_table(placement, replicas, shape.experts, comm.size() - schedule_.ag), weights,
                  options.max_tokens, detail::expert_group_copies(replicas)) {}

  /// Bytes of caller-owned workspace run() needs on this rank.
  [[nodiscard]] std::size_t workspace_size() const { return executor_.workspace_size(); }

  [[nodiscard]] Status can_implement(Arguments const& a) const {
    if (a.tokens < 0) return {false, detail::concat("moe::Layer (disaggregated): negative token count ", a.tokens)};
    if (!executor_.is_ag() && a.tokens != 0)
      return {false, detail::concat("moe::Layer (disaggregated): rank ", executor_.attention_ranks() + executor_.eg_index(),
                                    " is an expert-group rank and was given ", a.tokens,
                                    " tokens; tokens live on the attention-group ranks")};
    if (a.tokens > executor_.max_tokens())
      return {false, detail::concat("moe::Layer (disaggregated): ", a.tokens, " tokens exceed the ", executor_.max_tokens(),
                                    " the workspace was sized for (LayerOptions::max_tokens)")};
    if (a.tokens > 0 && (a.x == nullptr || a.y == nullptr))
      return {false, "moe::Layer (disaggregated): input or output pointer is null"};
    if (a.tokens % schedule_.r1 != 0)
      return {false, detail::concat("moe::Layer (disaggregated): r1 = ", schedule_.r1, " does not divide the ", a.tokens,
                                    " tokens of this attention-group rank")};
    if ((a.tokens / schedule_.r1) % schedule_.r2 != 0)
      return {false, detail::concat("moe::Layer (disaggregated): r2 = ", schedule_.r2, " does not divide the ",
                                    a.tokens / schedule_.r1, " tokens of a micro-batch")};
    return {};
  }

  /// One forward pass. Every rank of the collective must call it (EG ranks with no tokens).
  /// A rank whose arguments can_implement() rejects does not throw alone: the executor first
  /// agrees with the other ranks, and then every rank throws with that rank's reason (a rank
  /// throwing alone would leave its MPI peers waiting for its messages).
  void run(Arguments const& a, std::span<std::byte> workspace) {
    auto before = comm_->counters();
    executor_.run({a.tokens, a.x, a.y}, schedule_.config(), workspace, can_implement(a));
    auto const& after = comm_->counters();
    stats_ = {};
    stats_.tokens = a.tokens;
    stats_.assignments = static_cast<long long>(a.tokens) * shape.top_k;
    // The executor's A2E record: [int32 token, int32 count, int32 expert[k], float weight[k]], row.
    stats_.meta_bytes = 2 * sizeof(std::int32_t) + static_cast<std::size_t>(shape.top_k) *
                                                       (sizeof(std::int32_t) + sizeof(float));
    stats_.record_bytes = stats_.meta_bytes + static_cast<std::size_t>(shape.hidden) * sizeof(T);
    std::size_t sent = after[collective::Op::send] - before[collective::Op::send];
    (executor_.is_ag() ? stats_.dispatch_bytes : stats_.combine_bytes) = sent;
    stats_.control_bytes = after.bytes_sent() - before.bytes_sent() - sent;
  }

  [[nodiscard]] bool is_attention_rank() const { return executor_.is_ag(); }
  [[nodiscard]] Schedule const& schedule() const { return schedule_; }
  [[nodiscard]] LayerStats const& stats() const { return stats_; }

private:
  static Schedule checked(Options const& o, int ranks) {
    Schedule s = o.schedule;
    detail::check_disaggregated_schedule(s, ranks);
    check(o.max_tokens > 0, "moe::Layer (disaggregated): LayerOptions::max_tokens must be positive, got ", o.max_tokens);
    check(o.deduplicate, "moe::Layer (disaggregated): LayerOptions::deduplicate = false is not supported (a token goes "
                         "once to each expert-group rank that serves one of its experts)");
    return s;
  }

  Comm* comm_;
  Schedule schedule_;
  schedule::FinDepExecutor<Router, T, Comm> executor_;
  LayerStats stats_;
};

}  // namespace moe
