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
// Replicas: any replica policy over EG indices with fixed copies (replication::None: one copy per
// expert, on the placement's EG index; replication::Table, e.g. a CRAFT or EPLB plan for the expert
// group; a user policy: its holds() is asked once, at construction). The placement's EG index must
// be among each expert's copies. Token t of AG rank p uses copy (p + t) mod n of the n copies of an
// expert; an EG rank needs the weights of every expert it holds a copy of. replication::BatchSplit
// (over EG indices, with the servers of the EG ranks) instead splits each micro-batch's pairs so that
// the busiest EG rank receives the fewest (FinDepExecutor::split_each_micro_batch: the AG ranks
// exchange experts x int32 counts per micro-batch, in stats().control_bytes).
//
// Options: max_tokens, schedule and live (the load window: every AG rank counts the pairs it routed
// per expert and per EG rank, and the ranks gather the rows after the pass); deduplicate = false is
// refused by the front (a token always goes once to each EG rank that serves one of its experts).
// Re-planning while serving (live.replan_every, replan(), migrate_to()), with a placement::Table and
// replication::Table or replication::BatchSplit: plans are over the expert group (EG indices; the
// layout is EG ranks x width), the experts' weights move between EG ranks through the front's
// arena (attach_arena: the EG ranks' slots; an AG rank's arena is empty), and every rank takes part
// in the votes and in each migration chunk's all-to-all (an AG rank with no bytes). The
// split-aware planner (live::Planner::split_balance) scores a layout by each pass's least max load
// over the EG ranks, which depends on the experts' totals only, not on which ranks sent the pairs.
// stats(): tokens and assignments on AG ranks; the bytes this rank sent (an AG rank's are all
// dispatch, an EG rank's all combine) and those of the executor's own control messages; the
// dispatch records an AG rank sent (records_remote: an AG rank serves no expert, so none is local)
// and those an EG rank received (records_received). The agreement of the front is not in stats().

#include <span>
#include <type_traits>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"
#include "moe/core/shape.hpp"
#include "moe/core/weights.hpp"
#include "moe/layer/findep_executor.hpp"
#include "moe/layer/layer.hpp"
#include "moe/layer/live.hpp"
#include "moe/kernels/records.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/router/router.hpp"
#include "moe/schedule/disaggregated.hpp"

namespace moe {

namespace layer {

/// The host disaggregated path's executor: schedule::FinDepExecutor behind the front.
template <ModelShape Model, router::Policy Router, placement::Policy Placement, replication::Policy Replicas,
          schedule::Policy Schedule, collective::Communicator Comm>
class HostDisaggregatedExecutor : public detail::HostMigration<Comm> {
public:
  static constexpr ShapeSpec shape = Model::spec;
  using T = storage_t<shape>;
  using Executor = schedule::FinDepExecutor<Router, T, Comm>;
  using DeviceOptions = void;
  using Options = LayerOptions<Schedule>;
  static constexpr bool supports_no_dedup = false;

  static_assert(collective::PointToPoint<Comm> && collective::Exchange<Comm>,
                "moe::Layer (host disaggregated): the collective needs send / recv (collective::PointToPoint) "
                "and all_gather_v (collective::Exchange)");
  static_assert(!replication::BatchPolicy<Replicas> || std::is_same_v<Replicas, replication::BatchSplit>,
                "moe::Layer (host disaggregated): of the batch-aware replica policies this path takes "
                "replication::BatchSplit (each micro-batch split over the copies); give it that or a policy "
                "with fixed copies (replication::Table, None)");

  struct Arguments {
    int tokens = 0;        ///< tokens on this rank (AG ranks; EG ranks pass 0)
    T const* x = nullptr;  ///< tokens x hidden
    T* y = nullptr;        ///< tokens x hidden, written
  };
  struct Buffers {
    std::span<std::byte> workspace;       // the executor carves it (AG and EG ranks differ)
    std::span<std::int32_t> load_counts;  // E + ranks: the load window's row of this rank
                                          // (LayerOptions::live.window > 0; FinDepExecutor::count_loads)
  };

  /// `placement` maps experts to EG ranks [0, size - options.schedule.ag); `replicas` any policy
  /// over EG indices (its copies are asked once, here).
  HostDisaggregatedExecutor(Comm& comm, Placement const& placement, Replicas const& replicas, LayerWeights<T> weights,
                            Options const& options)
      : detail::HostMigration<Comm>(comm), comm_(&comm), schedule_(options.schedule), window_(options.live.window > 0),
        replicas_(replicas), executor_(make_executor(comm, schedule_.ag, placement, replicas, weights, options.max_tokens)) {
    check(static_cast<long long>(schedule_.r1) * schedule_.r2 <= options.max_tokens, "moe::Layer (disaggregated): r1 * r2 = ",
          schedule_.r1, " * ", schedule_.r2, " chunks exceed max_tokens = ", options.max_tokens,
          " (a chunk holds at least one token of a full batch)");
  }

  void carve(core::Carver& c, Buffers& b) const {
    b.workspace = c.take<std::byte>(executor_.workspace_size());
    if (window_) b.load_counts = c.take<std::int32_t>(static_cast<std::size_t>(shape.experts + comm_->size()));
  }

  [[nodiscard]] Status check_pass(Arguments const& a) const {
    if (!executor_.is_ag() && a.tokens != 0)
      return {false, detail::concat("moe::Layer (disaggregated): rank ", executor_.attention_ranks() + executor_.eg_index(),
                                    " is an expert-group rank and was given ", a.tokens,
                                    " tokens; tokens live on the attention-group ranks")};
    if (a.tokens % schedule_.r1 != 0)
      return {false, detail::concat("moe::Layer (disaggregated): r1 = ", schedule_.r1, " does not divide the ", a.tokens,
                                    " tokens of this attention-group rank")};
    if ((a.tokens / schedule_.r1) % schedule_.r2 != 0)
      return {false, detail::concat("moe::Layer (disaggregated): r2 = ", schedule_.r2, " does not divide the ",
                                    a.tokens / schedule_.r1, " tokens of a micro-batch")};
    return {};
  }

  [[nodiscard]] bool holds_tokens() const { return executor_.is_ag(); }

  bool gather_votes(Arguments const&, detail::Vote const& mine, std::span<detail::Vote> votes) {
    detail::gather_votes(*comm_, mine, votes);
    return true;
  }

  /// One pass, agreed by the front: the executor's threads over send / recv.
  void run(Arguments const& a, Buffers const& b, LayerStats& stats) {
    auto before = comm_->counters();
    executor_.run_agreed({a.tokens, a.x, a.y}, schedule_.config(), b.workspace);
    auto const& after = comm_->counters();
    stats.tokens = a.tokens;
    stats.assignments = static_cast<long long>(a.tokens) * shape.top_k;
    stats.meta_bytes = detail::record_meta_bytes_unpadded(shape.top_k);
    stats.record_bytes = stats.meta_bytes + static_cast<std::size_t>(shape.hidden) * sizeof(T);
    std::size_t split = executor_.split_bytes_sent();  // sent with send() too, but control, not records
    std::size_t sent = after[collective::Op::send] - before[collective::Op::send] - split;
    (executor_.is_ag() ? stats.dispatch_bytes : stats.combine_bytes) = sent;
    stats.records_local = 0;
    stats.records_remote = executor_.records_sent();
    stats.records_received = executor_.records_received();
    stats.control_bytes = after.bytes_sent() - before.bytes_sent() - sent;
    if (!b.load_counts.empty()) executor_.count_loads(b.workspace, a.tokens, b.load_counts);
  }

  /// The load window (LayerOptions::live.window): this pass's rows of every rank, gathered now.
  std::span<std::int32_t const> gather_loads(Buffers const& b, std::span<std::int32_t> gathered) {
    return detail::gather_load_rows(*comm_, std::span<std::int32_t const>(b.load_counts), gathered);
  }
  std::span<std::int32_t const> take_loads() { return {}; }

  // ---- What the front's re-planning (moe/layer/live.hpp) asks of a path: with a placement::Table
  // and replication::Table or replication::BatchSplit, whose plans are over the expert group ----

  static constexpr bool replannable = live::Replannable<Placement, Replicas>;
  /// Each expert's EG index in the placement (also what the agreement hashes, on any placement).
  [[nodiscard]] std::vector<int> const& primary_ranks() const {
    return executor_.placement().ranks();
  }
  /// The replica policy over EG indices (its copies are the executor's).
  [[nodiscard]] Replicas const& replicas() const { return replicas_; }
  [[nodiscard]] std::span<ExpertWeights<T> const> expert_weights() const { return executor_.expert_weights(); }
  /// A plan's tables, built and checked before the switch, so that adopt() cannot fail.
  struct NextPlan {
    typename Executor::Tables tables;
    Replicas replicas;
  };
  NextPlan prepare_plan(Placement placement, Replicas replicas, std::span<ExpertWeights<T> const> experts) const
    requires replannable
  {
    detail::ExpertGroupPlan p = detail::expert_group_plan(placement, replicas, shape.experts, executor_.expert_ranks());
    auto tables = executor_.prepare_tables(std::move(p.on_eg), p.copies, experts, p.split);
    return {std::move(tables), std::move(replicas)};
  }
  void adopt(NextPlan&& next, std::span<ExpertWeights<T> const> experts) noexcept {
    executor_.adopt(std::move(next.tables), experts);
    replicas_ = std::move(next.replicas);
  }
  /// The experts now live in the front's arena.
  void set_expert_weights(std::span<ExpertWeights<T> const> experts) { executor_.set_expert_weights(experts); }

  [[nodiscard]] bool is_attention_rank() const { return executor_.is_ag(); }
  /// The pipeline executor (its split's loads and the pairs an EG rank received, for tests).
  [[nodiscard]] Executor const& findep() const { return executor_; }

private:
  /// The pipeline executor over the plan's expert-group tables, splitting each micro-batch where
  /// `replicas` is a replication::BatchSplit (as prepare_plan builds the next plan's).
  static Executor make_executor(Comm& comm, int ag, Placement const& placement, Replicas const& replicas,
                                LayerWeights<T> weights, int max_tokens) {
    detail::ExpertGroupPlan p = detail::expert_group_plan(placement, replicas, shape.experts, comm.size() - ag);
    Executor executor(comm, shape, ag, std::move(p.on_eg), weights, max_tokens, p.copies);
    if (p.split) executor.split_each_micro_batch(*p.split);
    return executor;
  }

  Comm* comm_;
  Schedule schedule_;
  bool window_;  // LayerOptions::live.window > 0
  Replicas replicas_;  // over EG indices, as given (re-planning rebuilds it)
  Executor executor_;
};

}  // namespace layer

template <>
struct detail::path_executor<ExecutionPath::host_disaggregated> {
  template <class... Policies>
  using type = layer::HostDisaggregatedExecutor<Policies...>;
};

}  // namespace moe
