#pragma once
// moe::Layer: one expert-parallel MoE layer composed from policies, declared once.
//
//   using L = moe::Layer<Model, Router, Placement, Replicas, Schedule, Collective>;
//   L layer(comm, placement, replicas, weights, {.max_tokens = 512});     // options: L::Options
//   if (auto s = layer.can_implement(args); !s.ok) ...                    // optional: why not
//   std::vector<std::byte> ws(layer.workspace_size());                    // caller-owned scratch
//   layer.run(args, ws);                                                  // may be called many times
//   layer.stats();                                                        // what the last run did
//
// The class below is the one front of every execution path: it owns the compile-time checks, the
// options and their validation, can_implement, workspace_size, run, stats and the agreement of the
// ranks on every pass (one rank's bad arguments make every rank throw the same moe::Error; none is
// left waiting for a message that will not come). It delegates the pass to the executor of its
// path (moe/layer/paths/), which supplies its Arguments, its buffers (carve), its own checks and
// run(args, buffers, stats). The policies pick the path:
//
//   Collective memory   Schedule                      path                   header
//   host                schedule::Sequential          host                   moe/layer/paths/host.hpp
//   host                FinDep, PPPipe                host disaggregated     moe/layer/paths/host_disaggregated.hpp
//   device              schedule::Sequential          device                 moe/layer/paths/device.cuh (nvcc)
//   device              FinDep, PPPipe                device disaggregated   moe/layer/paths/device_disaggregated.cuh (nvcc)
//
// moe/moe.hpp includes the host paths, and the device paths too when nvcc compiles the translation
// unit; without the path's header the layer type says which one is missing.
//
// Arguments differ by path where the memory does: the device paths take a stream, and the
// disaggregated paths' expert-group ranks pass no tokens of their own (see each executor). Options
// differ only by a sub-struct: `device` on the device paths (moe::cuda::DeviceOptions,
// moe::cuda::DisaggregatedOptions); the host paths have none, so a device field there is a
// compile error rather than a setting that is silently ignored.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"
#include "moe/core/shape.hpp"
#include "moe/core/weights.hpp"
#include "moe/core/workspace.hpp"
#include "moe/kernels/gemm_path.hpp"
#include "moe/layer/live.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/router/router.hpp"
#include "moe/schedule/disaggregated.hpp"
#include "moe/schedule/sequential.hpp"

namespace moe {

/// Storage type of a shape: float or bf16.
template <ShapeSpec S>
using storage_t = std::conditional_t<S.dtype == DType::f32, float, bf16>;

/// The four ways a layer can run; the Collective's memory and the Schedule decide.
enum class ExecutionPath { host, host_disaggregated, device, device_disaggregated };

template <class Schedule, class Comm>
inline constexpr ExecutionPath execution_path =
    Comm::memory == collective::Memory::device
        ? (schedule::DisaggregatedPolicy<Schedule> ? ExecutionPath::device_disaggregated : ExecutionPath::device)
        : (schedule::DisaggregatedPolicy<Schedule> ? ExecutionPath::host_disaggregated : ExecutionPath::host);

namespace cuda {
/// How the device path's dispatch records cross ranks (see moe/layer/paths/device.cuh).
///   exact   counts first, one host synchronisation, then records of exactly their size
///   padded  fixed worst-case regions, no host synchronisation, graph-capturable
enum class Exchange { exact, padded };

/// The device path's own options (LayerOptions::device).
struct DeviceOptions {
  /// Kernel of the expert GEMMs: automatic (the Hopper wgmma kernel for bf16 where it can run,
  /// else the portable one), portable, or hopper (an error at construction where it cannot run).
  kernels::cuda::GemmPath gemm = kernels::cuda::GemmPath::automatic;
  std::size_t cublas_workspace = std::size_t{8} << 20;  ///< bytes handed to cuBLAS for the gate GEMM
  Exchange exchange = Exchange::exact;                  ///< how records cross ranks
  /// Exchange::padded: keep each pass's record counts and local assignments on the device, where
  /// Layer::read_record_counts() finds them (one small kernel and one device-to-device copy of
  /// 8 x (2 ranks + 1) bytes per pass; no host synchronisation, so a pass stays capturable). The
  /// exact exchange, and one GPU, have these counts in stats() anyway.
  bool count_records = false;
};

/// The device disaggregated path's own options (LayerOptions::device).
struct DisaggregatedOptions {
  kernels::cuda::GemmPath gemm = kernels::cuda::GemmPath::automatic;  ///< as DeviceOptions::gemm
  std::size_t cublas_workspace = std::size_t{8} << 20;               ///< as DeviceOptions
  int max_chunks = 64;  ///< most r1 * r2 of a run (sizes the event pool)
  /// Keep each pass's record counts on the device, where Layer::read_record_counts() finds them:
  /// an AG rank's records sent (records_remote), an EG rank's received (records_received). One
  /// memset and one single-block kernel per pass; no host synchronisation, so a pass stays
  /// capturable.
  bool count_records = false;
};
}  // namespace cuda

/// The options of a layer: what every path takes, and (device paths) the path's own sub-struct.
/// `Device` is void on the host paths, which then have no `device` member.
template <class Schedule = schedule::Sequential, class Device = void>
struct LayerOptions {
  int max_tokens = 0;       ///< most tokens one rank passes to run(); sizes the workspace
  bool deduplicate = true;  ///< one record per (token, rank); false sends one per (token, expert)
                            ///< (the disaggregated paths reject false, see Layer)
  /// The schedule's value: for FinDep / PPPipe the attention-group size and the solved
  /// configuration (order, r1, r2); schedule::Sequential carries nothing.
  Schedule schedule{};
  Device device{};  ///< the path's own options
  live::Options live{};  ///< load window (every path), re-planning (Layer::can_replan): layer/live.hpp
};

template <class Schedule>
struct LayerOptions<Schedule, void> {
  int max_tokens = 0;       ///< most tokens one rank passes to run(); sizes the workspace
  bool deduplicate = true;  ///< one record per (token, rank); false sends one per (token, expert)
  Schedule schedule{};      ///< the schedule's value (see above)
  live::Options live{};     ///< load window (every path), re-planning (Layer::can_replan): layer/live.hpp
};

/// What one run() did on this rank: assignment and record counts, and the bytes its communication
/// sent. On the disaggregated paths an attention-group rank sends only dispatch bytes and an
/// expert-group rank only combine bytes; counts a path cannot know without synchronising the host
/// stay 0 (see each path's header).
struct LayerStats {
  long long tokens = 0;          ///< tokens this rank passed in
  long long assignments = 0;     ///< token-expert assignments (tokens x top_k)
  long long local_assignments = 0;  ///< of those, served on this rank
  long long records_remote = 0;  ///< dispatch records sent to other ranks
  long long records_local = 0;   ///< dispatch records kept on this rank
  long long records_received = 0;  ///< dispatch records received (own included)
  std::size_t record_bytes = 0;  ///< bytes of one dispatch record
  std::size_t meta_bytes = 0;    ///< of which metadata
  std::size_t dispatch_bytes = 0;  ///< bytes the dispatch sent to other ranks
  std::size_t combine_bytes = 0;   ///< bytes the combine sent to other ranks
  std::size_t control_bytes = 0;   ///< bytes of the record-count exchange (and, with batch-aware
                                   ///< replicas, of the per-expert count all-gather)
  std::size_t agreement_bytes = 0;  ///< bytes of the ranks' agreement on the pass (moe::Layer::run:
                                    ///< one 256-byte vote to every other rank; 0 on one rank)
  // With a load window (LayerOptions::live.window > 0; moe/layer/live.hpp):
  // rank_load_max / _mean describe the newest pass in the window: this pass on the host paths; on
  // the device paths the one before, until Layer::load_window() waits for this pass's counts.
  long long rank_load_max = 0;     ///< most token-expert pairs any rank received in that pass
  double rank_load_mean = 0;       ///< pairs received per rank in that pass, averaged over the ranks
                                   ///< that hold experts (Layer::plan_ranks(): the EG if disaggregated)
  std::size_t window_bytes = 0;    ///< bytes of the window's all-gather of per-expert and per-rank counts
  std::size_t migration_bytes = 0;  ///< expert weight bytes this rank sent to others for a migration
  std::size_t plan_bytes = 0;       ///< bytes of a new plan's layout this rank sent (live.plan_rank:
                                    ///< the planning rank, on the pass it shares its plan)
  double migration_seconds = 0;    ///< host time of this pass's migration chunk (pack, exchange, unpack)
  int plans_adopted = 0;           ///< plans switched to since the layer was built
  int plans_changed = 0;           ///< of those, plans whose layout (primaries or copies) differs from
                                   ///< the one before; a re-plan that keeps the layout is adopted
                                   ///< (every rank switches at the same pass) but not counted here

  [[nodiscard]] double local_activation_rate() const {
    return assignments ? static_cast<double>(local_assignments) / static_cast<double>(assignments) : 0.0;
  }
};

namespace detail {

/// The checks every sequential execution path makes when it is built: the tables against the
/// ranks and that this rank has the weights of every expert it serves. Returns the primary rank of
/// each expert. `who` names the layer type in the messages.
template <class T, placement::Policy Placement, replication::Policy Replicas>
std::vector<int> check_layer_setup(char const* who, ShapeSpec const& s, int ranks, int rank, Placement const& placement,
                                   Replicas const& replicas, LayerWeights<T> const& weights) {
  placement.validate(s.experts, ranks);
  std::vector<int> primary(static_cast<std::size_t>(s.experts));
  for (int e = 0; e < s.experts; ++e) primary[static_cast<std::size_t>(e)] = placement.rank_of(e);
  replicas.validate(s.experts, ranks, primary);
  check(weights.router != nullptr, who, ": router weights are missing");
  check(static_cast<int>(weights.experts.size()) == s.experts, who, ": weights list ", weights.experts.size(),
        " experts, the shape has ", s.experts);
  check(static_cast<int>(weights.shared.size()) == s.shared_experts, who, ": weights list ", weights.shared.size(),
        " shared experts, the shape has ", s.shared_experts);
  for (int e = 0; e < s.experts; ++e) {
    bool mine = replicas.holds(e, primary[static_cast<std::size_t>(e)], rank);
    check(!mine || weights.experts[static_cast<std::size_t>(e)].present(), who, ": rank ", rank, " serves expert ", e,
          " but its weights are missing");
  }
  for (int e = 0; e < s.shared_experts; ++e)
    check(weights.shared[static_cast<std::size_t>(e)].present(), who, ": shared expert ", e, " has no weights");
  return primary;
}

/// The per-call checks of a token count and its pointers (the front's, and the FinDEP CUDA
/// executors' own). `options_name` names the options type in the message.
inline Status check_run_arguments(char const* who, char const* options_name, int tokens, int max_tokens,
                                  void const* x, void const* y, bool needs_rows = true) {
  if (tokens < 0) return {false, concat(who, ": negative token count ", tokens)};
  if (tokens > max_tokens)
    return {false, concat(who, ": ", tokens, " tokens exceed the ", max_tokens, " the workspace was sized for (",
                          options_name, "::max_tokens)")};
  if (needs_rows && tokens > 0 && (x == nullptr || y == nullptr))
    return {false, concat(who, ": input or output pointer is null")};
  return {};
}

/// The checks of a pass's first_token on the sequential paths: not negative, and every token index
/// of the pass plus the ranks fits in a long long (the replica choice adds the source rank to a
/// token's index: replication::Table's (rank + token) % copies, the device's plan_records).
inline Status check_first_token(char const* who, long long first_token, int max_tokens, int ranks) {
  if (first_token < 0)
    return {false, concat(who, ": first_token (the global index of this rank's first token) must not be negative, "
                               "got ", first_token)};
  if (first_token > std::numeric_limits<long long>::max() - max_tokens - ranks)
    return {false, concat(who, ": first_token (the global index of this rank's first token) is too large: ",
                          first_token, " + max_tokens + ranks exceeds the largest long long")};
  return {};
}

/// Any Placement policy as the disaggregated executors' table of expert -> expert-group index,
/// validated against the `eg` expert-group ranks.
template <placement::Policy Placement>
placement::Table expert_group_table(Placement const& p, int experts, int eg) {
  p.validate(experts, eg);
  std::vector<int> t(static_cast<std::size_t>(experts));
  for (int e = 0; e < experts; ++e) t[static_cast<std::size_t>(e)] = p.rank_of(e);
  return placement::Table(std::move(t));
}

/// Any replica policy as the disaggregated executors' copy lists over expert-group indices: the
/// policy is validated against the `eg` ranks and asked which of them hold each expert (its
/// `holds`); replication::None gives the empty table (one copy, the placement's).
template <replication::Policy Replicas>
replication::Table expert_group_copies(Replicas const& replicas, placement::Table const& on_eg, int eg) {
  replicas.validate(static_cast<int>(on_eg.ranks().size()), eg, on_eg.ranks());
  if constexpr (std::is_same_v<Replicas, replication::None>) {
    return {};
  } else {
    replication::CopyLists lists = replication::copy_lists(on_eg.ranks(), replicas, eg);
    std::vector<std::vector<int>> copies(on_eg.ranks().size());
    for (std::size_t e = 0; e < copies.size(); ++e)
      for (int i = lists.first[e]; i < lists.first[e + 1]; ++i)
        copies[e].push_back(lists.ranks[static_cast<std::size_t>(i)]);
    return replication::Table(std::move(copies));
  }
}

/// One plan as both disaggregated executors take it: the placement over the `eg` expert-group
/// indices, the copy lists over them, and the policy itself where it is a replication::BatchSplit
/// (null otherwise; it points into `replicas`).
struct ExpertGroupPlan {
  placement::Table on_eg;
  replication::Table copies;
  replication::BatchSplit const* split = nullptr;
};
template <placement::Policy Placement, replication::Policy Replicas>
ExpertGroupPlan expert_group_plan(Placement const& placement, Replicas const& replicas, int experts, int eg) {
  ExpertGroupPlan p{expert_group_table(placement, experts, eg), {}, nullptr};
  p.copies = expert_group_copies(replicas, p.on_eg, eg);
  if constexpr (std::is_same_v<Replicas, replication::BatchSplit>) p.split = &replicas;
  return p;
}

/// One rank's verdict on a pass, exchanged before any data moves (256 bytes): whether its
/// arguments passed, why not, and the settings and tables every rank must share.
struct Vote {
  std::int32_t ok = 0;
  std::int32_t settings[12] = {};  ///< max_tokens, deduplicate, pipeline, order, r1, r2, then live::Options:
                                   ///< window, replan_every, spare_slots, bytes/pass (KiB), tolerance, nodes
  std::int32_t live_state = 0;     ///< the re-plan's LiveState (see Layer)
  std::int32_t replans = 0;        ///< re-plans started
  std::int32_t live_options = 0;   ///< live.migration_bytes_per_pass's low 10 bits, live.planner, live.plan_rank + 1
  std::uint64_t plan = 0;          ///< hash of the last plan prepared (live::hash_layout)
  std::uint64_t tables = 0;        ///< hash of the placement and replica tables in use (hash_tables)
  char message[176] = {};
};
static_assert(sizeof(Vote) == 256 && offsetof(Vote, plan) == 64);

/// live::Fnv1a with a length-prefixed list: what the agreement compares of the tables a layer routes with.
struct TablesHash : live::Fnv1a {
  using live::Fnv1a::mix;
  void mix(std::span<int const> v) {
    mix(static_cast<std::uint32_t>(v.size()));
    for (int x : v) mix(static_cast<std::uint32_t>(x));
  }
};

/// The tables of a layer as the agreement hashes them: for each of `experts` experts its primary
/// rank `primary(e)`, then the ranks r of [0, ranks) with `holds(e, r)`, ascending (so two copy
/// lists with the same ranks in another order hash the same: the fixed rule serves either). Ranks
/// built from different plans (another placement file, another replica list) differ here, and the
/// agreement stops them before a pair goes to a rank that would not serve it.
template <class Primary, class Holds>
std::uint64_t hash_tables(int experts, int ranks, Primary const& primary, Holds const& holds) {
  TablesHash h;
  for (int e = 0; e < experts; ++e) {
    h.mix(static_cast<std::uint32_t>(primary(e)));
    for (int r = 0; r < ranks; ++r)
      if (holds(e, r)) h.mix(static_cast<std::uint32_t>(r));
    h.mix(0xffffffffu);  // the end of expert e's list (no rank has this number)
  }
  return h.h;
}

/// Throws the same moe::Error on every rank that holds the same `votes`: the reason of the first
/// rank that rejected its arguments, else the first rank whose settings differ from rank 0's.
inline void decide(std::span<Vote const> votes, char const* who) {
  for (std::size_t r = 0; r < votes.size(); ++r)
    if (!votes[r].ok)
      fail(who, ": rank ", r, " rejected its arguments, so every rank stops: ",
           std::string(votes[r].message, strnlen(votes[r].message, sizeof(votes[r].message))));
  auto describe = [](Vote const& v) {
    return concat("max_tokens ", v.settings[0], ", deduplicate ", v.settings[1], ", schedule ", v.settings[2], "/",
                  v.settings[3], "/", v.settings[4], "/", v.settings[5], " (pipeline/order/r1/r2), live ",
                  v.settings[6], "/", v.settings[7], "/", v.settings[8], "/", v.settings[9], "/", v.settings[10], "/",
                  v.settings[11], " (window/replan_every/spare_slots/KiB per pass/tolerance/nodes)");
  };
  for (std::size_t r = 1; r < votes.size(); ++r)
    check(std::equal(std::begin(votes[r].settings), std::end(votes[r].settings), std::begin(votes[0].settings)), who,
          ": every rank must build its layer with the same options: rank 0 has ", describe(votes[0]), ", rank ", r,
          " has ", describe(votes[r]));
  for (std::size_t r = 1; r < votes.size(); ++r)
    check(votes[r].tables == votes[0].tables, who,
          ": every rank must build its layer with the same placement and replica tables: rank ", r,
          "'s differ from rank 0's (hash ", votes[r].tables, " against ", votes[0].tables,
          "; did every rank load the same plan?)");
}

/// All ranks' votes through a host-memory collective (one all-gather of 256 bytes per rank).
template <class Comm>
void gather_votes(Comm& comm, Vote const& mine, std::span<Vote> votes) {
  std::vector<std::size_t> bytes(votes.size(), sizeof(Vote));
  comm.all_gather_v(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(votes), bytes);
}

/// The host paths' load-window gather: every rank's row of this pass (its `load_counts`) into
/// `gathered` (ranks x row) through one all-gather; ready when it returns.
template <class Comm>
std::span<std::int32_t const> gather_load_rows(Comm& comm, std::span<std::int32_t const> row,
                                               std::span<std::int32_t> gathered) {
  std::vector<std::size_t> bytes(static_cast<std::size_t>(comm.size()), row.size() * sizeof(std::int32_t));
  comm.all_gather_v(std::as_bytes(row), std::as_writable_bytes(gathered), bytes);
  return gathered;
}

/// What the front's re-planning asks of a path whose weights and collective live in host memory
/// (the host paths' executors derive from it): byte copies into the arena and the migration
/// buffers, one all-to-all-v per migration chunk, one all-gather of the planning rank's layout.
template <class Comm>
class HostMigration {
public:
  void copy_bytes(std::byte* to, std::byte const* from, std::size_t n) { std::memcpy(to, from, n); }
  template <class T>
  void copy_in(T* to, T const* from, std::size_t n) {
    std::copy(from, from + n, to);
  }
  /// One chunk: every rank of the collective takes part (one that moves nothing with no bytes).
  void exchange_bytes(std::span<std::byte const> send, std::span<std::size_t const> send_bytes,
                      std::span<std::byte> recv, std::span<std::size_t const> recv_bytes) {
    comm_->all_to_all_v(send, send_bytes, recv, recv_bytes);
  }
  /// Every rank's `bytes[r]` bytes (`mine` from this rank) into `out`, in rank order (the staging
  /// buffers a device path needs are not used).
  void gather_bytes(std::span<std::byte const> mine, std::span<std::size_t const> bytes, std::span<std::byte> out,
                    std::span<std::byte>, std::span<std::byte>) {
    comm_->all_gather_v(mine, out, bytes);
  }

protected:
  explicit HostMigration(Comm& comm) : comm_(&comm) {}

private:
  Comm* comm_;
};

/// Which executor runs a path: each path's header (moe/layer/paths/) specialises it with a member
/// template `type` over the six policies. Left unspecialised (the path's header not included),
/// `type` is void and the front's static_assert says which header to include.
template <ExecutionPath P>
struct path_executor {
  template <class... Policies>
  using type = void;
};

template <ExecutionPath P>
inline constexpr char const* path_header =
    P == ExecutionPath::host                 ? "<moe/layer/paths/host.hpp>"
    : P == ExecutionPath::host_disaggregated ? "<moe/layer/paths/host_disaggregated.hpp>"
    : P == ExecutionPath::device             ? "<moe/layer/paths/device.cuh> (nvcc)"
                                             : "<moe/layer/paths/device_disaggregated.cuh> (nvcc)";

}  // namespace detail

/// What an executor gives the front (moe/layer/paths/): its arguments (tokens, x, y at least), its
/// buffers carved from the caller's workspace, its own checks of a pass, whether this rank passes
/// token rows, the pass itself, and the transport of the ranks' agreement (false: none now, the
/// rank checks alone).
template <class E>
concept PathExecutor = requires(E& e, E const& ce, typename E::Arguments const& a, typename E::Buffers& b,
                                core::Carver& c, LayerStats& st, detail::Vote const& v, std::span<detail::Vote> votes) {
  { a.tokens } -> std::convertible_to<int>;
  a.x;
  a.y;
  { E::supports_no_dedup } -> std::convertible_to<bool>;
  ce.carve(c, b);
  { ce.check_pass(a) } -> std::same_as<Status>;
  { ce.holds_tokens() } -> std::same_as<bool>;  // false: this rank passes no rows (x, y unused)
  { e.gather_votes(a, v, votes) } -> std::same_as<bool>;
  e.run(a, b, st);
};

/// The layer: one class for every path.
template <ModelShape Model, router::Policy Router, placement::Policy Placement, replication::Policy Replicas,
          schedule::Policy Schedule, collective::Communicator Comm>
class Layer {
public:
  static constexpr ShapeSpec shape = Model::spec;
  static constexpr ExecutionPath path = execution_path<Schedule, Comm>;
  using Executor =
      typename detail::path_executor<path>::template type<Model, Router, Placement, Replicas, Schedule, Comm>;

  static_assert(!std::is_void_v<Executor>, "moe::Layer: the header of this execution path is not included; include "
                                           "<moe/moe.hpp> (device paths: in a translation unit nvcc compiles) or the "
                                           "path's header under moe/layer/paths/ (see moe/layer/layer.hpp)");
  static_assert(shape.hidden > 0 && shape.experts > 0 && shape.top_k > 0 && shape.top_k <= shape.experts,
                "moe::Layer: the model shape needs positive sizes and top_k <= experts");
  static_assert(Router::fits(shape), "moe::Layer: this Router policy does not fit the model's scoring and "
                                     "grouping (see router::ForModel<Model>)");

  using element_type = storage_t<shape>;
  using T = element_type;
  using Arguments = typename Executor::Arguments;
  using Options = LayerOptions<Schedule, typename Executor::DeviceOptions>;

  /// Every rank of `comm` builds its layer with the same options (checked on every pass).
  Layer(Comm& comm, Placement placement, Replicas replicas, LayerWeights<T> weights, Options options)
      : comm_(&comm), options_(checked(options, comm.size())),
        exec_(comm, std::move(placement), std::move(replicas), weights, options_) {
    tables_ = tables_in_use();
    start_live();
  }

  /// The device disaggregated path: two communicators over the same ranks, `a2e` for the tokens to
  /// the experts, `e2a` for the partial results back (the one-communicator form duplicates it).
  Layer(Comm& a2e, Comm& e2a, Placement placement, Replicas replicas, LayerWeights<T> weights, Options options)
    requires(path == ExecutionPath::device_disaggregated)
      : comm_(&a2e), options_(checked(options, a2e.size())),
        exec_(a2e, e2a, std::move(placement), std::move(replicas), weights, options_) {
    tables_ = tables_in_use();
    start_live();
  }

  /// Bytes of caller-owned workspace run() needs on this rank (host or device memory, as the
  /// collective's; the disaggregated paths' attention and expert ranks differ).
  [[nodiscard]] std::size_t workspace_size() const {
    core::Carver c;
    typename Executor::Buffers b;
    exec_.carve(c, b);
    LiveBuffers lb;
    carve_live(c, lb);
    return c.used();
  }

  /// Whether run(a) would accept these arguments on this rank, and why not.
  [[nodiscard]] Status can_implement(Arguments const& a) const {
    Status st = detail::check_run_arguments("moe::Layer", "Options", a.tokens, options_.max_tokens, a.x, a.y,
                                            exec_.holds_tokens());
    return st.ok ? exec_.check_pass(a) : st;
  }

  /// One forward pass of this rank's tokens. Every rank of the collective calls it. The ranks
  /// first agree (one all-gather of 256 bytes per rank): if one rank's arguments or workspace are
  /// rejected, or the ranks were built with different options or different placement and replica
  /// tables, every rank throws the same moe::Error naming that rank and the reason, before any
  /// data moves. On one rank, and on a device stream being captured into a CUDA graph (where the
  /// host cannot wait for the votes), the rank checks alone.
  void run(Arguments const& a, std::span<std::byte> workspace) {
    Status st = can_implement(a);
    if (st.ok && workspace.size() < workspace_size())
      st = {false, detail::concat("moe::Layer: the workspace holds ", workspace.size(), " bytes, run() needs ",
                                  workspace_size(), " (workspace_size())")};
    std::size_t before = sent();
    agree(a, st);
    core::Carver c(workspace);
    typename Executor::Buffers b;
    exec_.carve(c, b);
    LiveBuffers lb;
    carve_live(c, lb);
    // stats() goes on describing the newest pass the window holds until a newer one arrives.
    auto const newest_max = stats_.rank_load_max;
    auto const newest_mean = stats_.rank_load_mean;
    stats_ = {};
    stats_.agreement_bytes = sent() - before;
    stats_.rank_load_max = newest_max;
    stats_.rank_load_mean = newest_mean;
    if constexpr (counts_loads) {
      if (live_) {
        // Device: the last pass's counts arrive now (push_loads reports them).
        if (auto late = exec_.take_loads(); !late.empty()) push_loads(late);
      }
    }
    exec_.run(a, b, stats_);
    if constexpr (counts_loads) {
      if (live_) after_pass(b, lb);
    }
  }

  // ---- Re-planning while serving (LayerOptions::live; moe/layer/live.hpp) ----

  /// Whether this layer type counts loads (every path does) and can re-plan (every path's executor
  /// can switch plans, when the placement is a placement::Table and the replicas a copy list:
  /// replication::Table or replication::BatchSplit).
  static constexpr bool counts_loads = requires(typename Executor::Buffers const& b) { b.load_counts; };
  static constexpr bool can_replan =
      counts_loads && live::Replannable<Placement, Replicas> && requires(Executor const& e) { e.primary_ranks(); };

  /// The ranks a plan places experts on: every rank of the collective, or on the disaggregated
  /// paths the expert group, which is the last plan_ranks() ranks. plan(), the layouts of
  /// migrate_to() and the planners' ranks are these, numbered from 0 (EG indices).
  [[nodiscard]] int plan_ranks() const {
    if constexpr (schedule::DisaggregatedPolicy<Schedule>)
      return comm_->size() - options_.schedule.ag;
    else
      return comm_->size();
  }

  /// The last LayerOptions::live.window passes' loads (the same on every rank), the last run()'s
  /// pass included. The device paths copy a pass's counts to the host on the pass's stream and
  /// read them on the next pass, after the agreement's synchronisation; when the caller asks for
  /// the window first, this waits for the copy (one host synchronisation on that stream), and
  /// stats() then reports that pass's rank loads too.
  [[nodiscard]] live::LoadWindow const& load_window()
    requires counts_loads
  {
    check(live_ != nullptr, "moe::Layer: no load window (LayerOptions::live.window is 0)");
    if (auto late = exec_.take_loads(); !late.empty()) push_loads(late);
    return live_->window;
  }
  /// The plan the layer serves with now.
  [[nodiscard]] live::Plan plan() const
    requires can_replan
  {
    live::Plan p;
    p.primary = exec_.primary_ranks();
    p.copies.resize(p.primary.size());
    for (std::size_t e = 0; e < p.primary.size(); ++e)
      for (int r = 0; r < plan_ranks(); ++r)
        if (exec_.replicas().holds(static_cast<int>(e), p.primary[e], r)) p.copies[e].push_back(r);
    return p;
  }
  /// Elements (T) of one expert slot in the arena: gate | up | down.
  [[nodiscard]] static constexpr std::size_t slot_elements() {
    return 3 * static_cast<std::size_t>(shape.expert_ffn) * static_cast<std::size_t>(shape.hidden);
  }
  /// Slots of the arena on every rank that holds experts: the most experts a rank holds in the
  /// first plan, plus LayerOptions::live.spare_slots (none on a disaggregated path's AG ranks).
  [[nodiscard]] int arena_slots() const
    requires can_replan
  {
    return live_ && plan_index() >= 0 ? live_->width + options_.live.spare_slots : 0;
  }
  [[nodiscard]] std::size_t arena_elements() const
    requires can_replan
  {
    return static_cast<std::size_t>(arena_slots()) * slot_elements();
  }
  /// Hands the layer the caller-owned expert slots (arena_elements() elements, alive as long as
  /// the layer). This rank's experts move into it (an expert whose weights already lie in a slot,
  /// as gate | up | down, stays there and is not copied); from now on the layer reads them there
  /// and migrations write into its free slots. Weights given for experts this rank does not hold
  /// are dropped (the layer no longer refers to them). Call it once, before the first migration.
  void attach_arena(std::span<T> arena)
    requires can_replan
  {
    check(live_ != nullptr, "moe::Layer: attach_arena needs LayerOptions::live.window > 0");
    check(live_->arena.empty(), "moe::Layer: the arena is already attached");
    check(live_->state == LiveState::idle, "moe::Layer: attach_arena during a re-plan");
    check(arena.size() >= arena_elements(), "moe::Layer: the arena holds ", arena.size(), " elements, ",
          arena_slots(), " slots need ", arena_elements(), " (arena_elements())");
    auto& L = *live_;
    auto current = exec_.expert_weights();
    std::vector<ExpertWeights<T>> experts(current.begin(), current.end());
    // Only the experts this rank holds in the current plan take a slot: a caller may have passed
    // every expert's weights to every rank.
    auto const primary = exec_.primary_ranks();
    int const me = plan_index();
    for (std::size_t e = 0; e < experts.size(); ++e)
      if (me < 0 || !exec_.replicas().holds(static_cast<int>(e), primary[e], me)) experts[e] = {};
    std::size_t per = slot_elements() / 3;
    auto const* base = arena.data();
    auto slots = static_cast<std::size_t>(arena_slots());
    std::vector<int> slot_of(experts.size(), -1), owner(slots, -1);
    auto in_arena = [&](T const* p) { return p >= base && p < base + slots * slot_elements(); };
    // One part of `per` elements from p shares memory with the arena (not only its first element).
    auto overlaps = [&](T const* p) { return p < base + slots * slot_elements() && p + per > base; };
    // Experts already in a slot stay; others must not overlap the arena.
    for (std::size_t e = 0; e < experts.size(); ++e) {
      auto const& w = experts[e];
      if (!w.present()) continue;
      bool any = overlaps(w.gate) || overlaps(w.up) || overlaps(w.down);
      if (!any) continue;
      // The slot is gate's: gate must lie in the arena for its offset to name one.
      bool slotted = in_arena(w.gate);
      auto off = slotted ? static_cast<std::size_t>(w.gate - base) : std::size_t{0};
      slotted = slotted && off % slot_elements() == 0 && w.up == w.gate + per && w.down == w.gate + 2 * per;
      check(slotted && owner[off / slot_elements()] < 0, "moe::Layer: expert ", e, "'s weights lie in the arena but "
            "not as one slot (gate | up | down at a multiple of slot_elements())");
      slot_of[e] = static_cast<int>(off / slot_elements());
      owner[off / slot_elements()] = static_cast<int>(e);
    }
    std::size_t next = 0;
    for (std::size_t e = 0; e < experts.size(); ++e) {
      auto const& w = experts[e];
      if (!w.present() || slot_of[e] >= 0) continue;
      while (next < slots && owner[next] >= 0) ++next;
      check(next < slots, "moe::Layer: rank ", comm_->rank(), " holds more experts than the arena's ", slots, " slots");
      T* dst = arena.data() + next * slot_elements();
      exec_.copy_in(dst, w.gate, per);
      exec_.copy_in(dst + per, w.up, per);
      exec_.copy_in(dst + 2 * per, w.down, per);
      slot_of[e] = static_cast<int>(next);
      owner[next] = static_cast<int>(e);
    }
    for (std::size_t e = 0; e < experts.size(); ++e)
      if (slot_of[e] >= 0) {
        T const* at = arena.data() + static_cast<std::size_t>(slot_of[e]) * slot_elements();
        experts[e] = {at, at + per, at + 2 * per};
      }
    L.experts = std::move(experts);
    try {
      exec_.set_expert_weights(L.experts);  // the device path uploads new pointer tables: may fail
    } catch (...) {
      L.experts.clear();  // the layer goes on reading the caller's weights
      throw;
    }
    L.arena = arena;
    L.slot_of = std::move(slot_of);
  }
  /// Starts a re-plan from the load window now (as LayerOptions::live.replan_every does). Every
  /// rank calls it between the same two passes (the ranks compare how many re-plans they started).
  void replan()
    requires can_replan
  {
    check(live_ != nullptr && options_.live.spare_slots > 0, "moe::Layer: replan() needs LayerOptions::live.window "
          "and live.spare_slots > 0");
    check(live_->state == LiveState::idle, "moe::Layer: replan() while a re-plan or migration is under way");
    check(live_->window.size() > 0, "moe::Layer: replan() before any pass filled the load window");
    auto& L = *live_;
    ++L.started;
    L.state = LiveState::planning;
    // With live.plan_rank set, the other ranks wait for that rank's layout (share_plan).
    if (options_.live.plan_rank >= 0 && options_.live.plan_rank != comm_->rank()) return;
    int const P = plan_ranks();
    L.replanner.start(L.window.expert_loads(), live::planning_layout(plan(), P, L.width), P,
                      options_.live.spare_slots, live::tolerance_of(options_.live, P), options_.live.nodes,
                      options_.live.planner, L.hook,
                      options_.live.planner == live::Planner::split_balance ? L.window.expert_rows()
                                                                            : std::vector<long long>{});
  }
  /// Migrates to a plan made elsewhere: a slot layout of plan_ranks() x w (w <= the first plan's
  /// width), -1 empty. Every rank calls it with the same layout between the same two passes. A layout that
  /// names an expert outside the model, leaves one on no rank or gives a rank more new experts than
  /// it has free slots is refused before any byte moves: every rank's next run() throws the same
  /// moe::Error naming it, and the layer keeps its plan.
  void migrate_to(std::span<int const> layout)
    requires can_replan
  {
    check(live_ != nullptr, "moe::Layer: migrate_to needs LayerOptions::live.window > 0");
    check(live_->state == LiveState::idle, "moe::Layer: migrate_to while a re-plan or migration is under way");
    ++live_->started;
    prepare(std::vector<int>(layout.begin(), layout.end()));
  }
  /// Whether a re-plan or migration is under way on this rank.
  [[nodiscard]] bool migrating() const { return live_ && live_->state != LiveState::idle; }
  /// Test seam: called at each step of a migration on this rank (a throw there is a fault there).
  void set_fault_hook(std::function<void(live::Step)> hook)
    requires can_replan
  {
    check(live_ != nullptr, "moe::Layer: fault hooks need LayerOptions::live.window > 0");
    live_->hook = std::move(hook);
  }

  /// What the last run() did on this rank (see LayerStats and the path's executor).
  [[nodiscard]] LayerStats const& stats() const { return stats_; }
  /// Device path, Exchange::padded with LayerOptions::device.count_records: stats() completed with
  /// the record counts and local assignments that the last pass left on the device (a synchronous
  /// copy of 8 x (2 ranks + 1) bytes). Call it once that pass, or the replay of a CUDA graph that
  /// captured one, has finished (its stream synchronised): the counts are those of the newest pass
  /// the device ran. Elsewhere stats() has these counts already and is returned as it is.
  LayerStats const& read_record_counts()
    requires requires(Executor& e, LayerStats& st) { e.read_record_counts(st); }
  {
    exec_.read_record_counts(stats_);
    return stats_;
  }
  [[nodiscard]] Options const& options() const { return options_; }
  [[nodiscard]] Comm& comm() const { return *comm_; }
  [[nodiscard]] Schedule const& schedule() const { return options_.schedule; }
  /// Disaggregated paths: whether this rank is in the attention group (holds tokens).
  [[nodiscard]] bool is_attention_rank() const
    requires schedule::DisaggregatedPolicy<Schedule>
  {
    return exec_.is_attention_rank();
  }
  /// Device paths: the error bits (kernels::cuda::DeviceError) of the last run(). Synchronises the
  /// device: a diagnostic for tests and debugging, not for the hot path.
  [[nodiscard]] unsigned errors() const
    requires(Comm::memory == collective::Memory::device)
  {
    return exec_.errors();
  }
  /// The path's executor: what only one path has (the device error word, the attention-group
  /// role of a disaggregated rank, the primary ranks of the host path).
  [[nodiscard]] Executor const& executor() const { return exec_; }
  [[nodiscard]] Executor& executor() { return exec_; }

private:
  static Options checked(Options const& o, int ranks) {
    int plan_ranks = ranks;  // the ranks that hold experts
    if constexpr (schedule::DisaggregatedPolicy<Schedule>)
      if (o.schedule.ag >= 1 && o.schedule.ag < ranks) plan_ranks = ranks - o.schedule.ag;  // else refused below
    check_live(o.live, ranks, plan_ranks);
    check(o.max_tokens > 0, "moe::Layer: Options::max_tokens must be positive, got ", o.max_tokens);
    check(o.deduplicate || Executor::supports_no_dedup, "moe::Layer: Options::deduplicate = false is not supported on "
          "the disaggregated paths (a token goes once to each expert-group rank that serves one of its experts)");
    if constexpr (schedule::DisaggregatedPolicy<Schedule>) {
      Schedule const& s = o.schedule;
      check(s.ag >= 1 && s.ag < ranks, "moe::Layer (disaggregated): the attention group must hold between 1 and ",
            ranks - 1, " of the ", ranks, " ranks (the rest form the expert group), got ag = ", s.ag);
      check(s.r1 >= 1 && s.r2 >= 1, "moe::Layer (disaggregated): r1 and r2 must be at least 1, got r1 = ", s.r1,
            ", r2 = ", s.r2);
      check(Schedule::pipeline != schedule::Pipeline::pppipe || s.r2 == 1,
            "moe::Layer (disaggregated): PPPipe has no token chunks; r2 must be 1, got r2 = ", s.r2);
    }
    return o;
  }

  /// Bytes this rank's collective has sent so far (0 for one that cannot exchange).
  [[nodiscard]] std::size_t sent() const {
    if constexpr (collective::Exchange<Comm>)
      return comm_->counters().bytes_sent();
    else
      return 0;
  }

  void agree(Arguments const& a, Status const& st) {
    detail::Vote mine;
    mine.ok = st.ok ? 1 : 0;
    std::memcpy(mine.message, st.message.data(), std::min(st.message.size(), sizeof(mine.message) - 1));
    mine.settings[0] = options_.max_tokens;
    mine.settings[1] = options_.deduplicate ? 1 : 0;
    if constexpr (schedule::DisaggregatedPolicy<Schedule>) {
      schedule::Config c = options_.schedule.config();
      mine.settings[2] = static_cast<std::int32_t>(c.pipeline);
      mine.settings[3] = static_cast<std::int32_t>(c.order);
      mine.settings[4] = c.r1;
      mine.settings[5] = c.r2;
    }
    live::Options const& lo = options_.live;
    mine.settings[6] = lo.window;
    mine.settings[7] = lo.replan_every;
    mine.settings[8] = lo.spare_slots;
    mine.settings[9] = static_cast<std::int32_t>(lo.migration_bytes_per_pass >> 10);
    mine.settings[10] = lo.tolerance_permille;
    mine.settings[11] = lo.nodes;
    if (!tables_) tables_ = tables_in_use();  // after a re-plan's switch
    mine.tables = *tables_;
    if constexpr (counts_loads) {
      if (live_) live_vote(mine);
    }
    if (comm_->size() > 1) {
      votes_.resize(static_cast<std::size_t>(comm_->size()));
      if (exec_.gather_votes(a, mine, votes_)) {
        detail::decide(votes_, "moe::Layer");
        if constexpr (counts_loads) {
          if (live_) decide_live(votes_);
        }
        return;
      }
    }
    check(st.ok, st.message);
    if constexpr (counts_loads) {
      if (live_) decide_live(std::span<detail::Vote const>(&mine, 1));
    }
  }

  // ---- Re-planning while serving: the state of this rank (see moe/layer/live.hpp) ----

  enum class LiveState : std::int32_t { idle = 0, planning, ready, moving, moved, failed };

  template <class E>
  static auto next_tables_of() {
    if constexpr (requires { typename E::NextPlan; })
      return std::type_identity<typename E::NextPlan>{};
    else
      return std::type_identity<int>{};
  }
  using next_tables = typename decltype(next_tables_of<Executor>())::type;

  struct LiveData {
    live::LoadWindow window;
    live::Replanner replanner;
    std::function<void(live::Step)> hook;
    LiveState state = LiveState::idle;
    std::string failure;
    long long passes = 0;  ///< passes run
    int started = 0;       ///< re-plans started (every rank counts the same)
    int adopted = 0;       ///< plans switched to
    int changed = 0;       ///< of those, plans with another layout than the one before
    int width = 0;         ///< most experts a rank holds (the first plan's)
    // the expert slots
    std::span<T> arena;
    std::vector<int> slot_of;                ///< expert -> arena slot on this rank, -1
    std::vector<ExpertWeights<T>> experts;   ///< the weights the executor reads
    // the plan in flight
    live::Plan next;
    std::vector<int> next_layout;  ///< `next` as a plan ranks x width layout (what share_plan sends)
    bool share = false;            ///< live.plan_rank: its layout is gathered after this pass
    bool next_changes = false;  ///< `next` differs from the plan in use (set by prepare_switch)
    std::uint64_t hash = 0;
    live::ChunkSchedule schedule;
    std::vector<int> incoming_slot;  ///< per move: the arena slot it fills on this rank, -1
    int chunk = 0;                   ///< passes of the schedule done
    std::vector<ExpertWeights<T>> next_experts;
    std::vector<int> next_slot_of;
    std::optional<next_tables> next_exec;  ///< the executor's tables of the next plan, built and checked
  };

  /// The live buffers carved from the caller's workspace after the executor's.
  struct LiveBuffers {
    std::span<std::int32_t> gathered;  ///< ranks x (experts + ranks)
    std::span<std::byte> send, recv;   ///< one chunk each way
  };

  void carve_live(core::Carver& c, LiveBuffers& lb) const {
    if constexpr (counts_loads) {
      if (options_.live.window <= 0) return;
      auto R = static_cast<std::size_t>(comm_->size());
      lb.gathered = c.take<std::int32_t>(R * (static_cast<std::size_t>(shape.experts) + R));
      if (options_.live.migration_bytes_per_pass > 0) {
        lb.send = c.take<std::byte>(options_.live.migration_bytes_per_pass);
        lb.recv = c.take<std::byte>(options_.live.migration_bytes_per_pass);
      }
    } else {
      (void)c, (void)lb;
    }
  }

  static void check_live(live::Options const& o, int ranks, int plan_ranks) {
    check(o.window >= 0 && o.replan_every >= 0 && o.spare_slots >= 0 && o.tolerance_permille >= -1,
          "moe::Layer: LayerOptions::live fields must not be negative (window ", o.window, ", replan_every ",
          o.replan_every, ", spare_slots ", o.spare_slots, ", tolerance_permille ", o.tolerance_permille,
          "; -1: its default)");
    check(o.planner == live::Planner::minimal_move || o.planner == live::Planner::eplb ||
              o.planner == live::Planner::split_balance,
          "moe::Layer: LayerOptions::live.planner: unknown planner ", static_cast<int>(o.planner));
    check(o.planner != live::Planner::split_balance || std::is_same_v<Replicas, replication::BatchSplit>,
          "moe::Layer: LayerOptions::live.planner = split_balance scores plans by the per-batch split: it needs "
          "replication::BatchSplit replicas");
    check(o.nodes >= 1 && plan_ranks % o.nodes == 0, "moe::Layer: LayerOptions::live.nodes (", o.nodes,
          ") must divide the ", plan_ranks, plan_ranks == ranks ? " ranks" : " expert-group ranks");
    bool replanning = o.replan_every > 0 || o.spare_slots > 0 || o.migration_bytes_per_pass > 0;
    check(o.window == 0 || counts_loads, "moe::Layer: LayerOptions::live.window: this path's executor does not count "
          "loads (Buffers::load_counts)");
    check(!replanning || can_replan, "moe::Layer: LayerOptions::live: re-planning needs a placement::Table and "
          "replication::Table or replication::BatchSplit (the policies whose plans the re-planner rewrites)");
    check(!replanning || o.window > 0, "moe::Layer: LayerOptions::live: re-planning needs a load window (window > 0)");
    check(o.replan_every == 0 || (o.spare_slots > 0 && o.migration_bytes_per_pass > 0),
          "moe::Layer: LayerOptions::live.replan_every needs spare_slots > 0 and migration_bytes_per_pass > 0");
    check(o.migration_bytes_per_pass >> 10 <= 0x7fffffffu, "moe::Layer: LayerOptions::live.migration_bytes_per_pass (",
          o.migration_bytes_per_pass, ") is too large");
    // (plan_rank + 1) << 12 travels in an int32 of the vote
    check(o.plan_rank >= -1 && o.plan_rank < ranks && o.plan_rank < (1 << 18), "moe::Layer: LayerOptions::live.plan_rank (",
          o.plan_rank, ") must be -1 (every rank plans) or a rank of the ", ranks);
  }

  void start_live() {
    if constexpr (counts_loads) {
      if (options_.live.window <= 0) return;
      live_ = std::make_unique<LiveData>();
      live_->window = live::LoadWindow(options_.live.window, shape.experts, comm_->size());
      if constexpr (can_replan) {
        live_->width = live::width_of(plan(), plan_ranks());
        std::size_t layout_bytes = static_cast<std::size_t>(plan_ranks()) * static_cast<std::size_t>(live_->width) *
                                   sizeof(std::int32_t);
        check(options_.live.plan_rank < 0 || comm_->size() == 1 || options_.live.spare_slots == 0 ||
                  options_.live.migration_bytes_per_pass >= layout_bytes,
              "moe::Layer: LayerOptions::live.plan_rank: the planning rank's layout (", layout_bytes,
              " bytes: plan ranks x width int32) travels through the migration buffers, but migration_bytes_per_pass is ",
              options_.live.migration_bytes_per_pass);
        if (options_.live.spare_slots > 0) live_->replanner.attach();
      }
    }
  }

  void fail_live(std::string why) {
    live_->state = LiveState::failed;
    live_->failure = std::move(why);
  }

  /// Drops the plan in flight: every rank keeps the old plan and the old weights.
  void abort_live() noexcept {
    auto& L = *live_;
    L.replanner.drop();
    L.state = LiveState::idle;
    L.failure.clear();
    L.next = {};
    L.next_layout.clear();
    L.share = false;
    L.schedule = {};
    L.incoming_slot.clear();
    L.chunk = 0;
    L.next_experts.clear();
    L.next_slot_of.clear();
    L.next_exec.reset();
  }

  /// This rank's re-plan state in its vote (a finished re-plan is taken and prepared first).
  void live_vote(detail::Vote& mine) {
    auto& L = *live_;
    if constexpr (can_replan) {
      if (L.state == LiveState::planning && L.replanner.ready()) {
        try {
          prepare(L.replanner.take().layout);
        } catch (std::exception const& e) {
          fail_live(detail::concat("the re-planner failed: ", e.what()));
        }
      }
    }
    mine.live_state = static_cast<std::int32_t>(L.state);
    mine.plan = L.hash;
    mine.replans = L.started;
    mine.live_options = static_cast<std::int32_t>(options_.live.migration_bytes_per_pass & 1023u) |
                        static_cast<std::int32_t>(options_.live.planner) << 10 | (options_.live.plan_rank + 1) << 12;
    if (L.state == LiveState::failed && mine.ok) {
      std::memset(mine.message, 0, sizeof(mine.message));
      std::memcpy(mine.message, L.failure.data(), std::min(L.failure.size(), sizeof(mine.message) - 1));
    }
  }

  /// The same decision on every rank, from the same votes: abort (and throw) on any failure or
  /// mismatch, start the moves when every rank has the same plan ready, switch when every rank
  /// has moved.
  void decide_live(std::span<detail::Vote const> votes) {
    auto& L = *live_;
    auto n = votes.size();
    for (std::size_t r = 1; r < n; ++r) {
      if (votes[r].replans != votes[0].replans) {
        abort_live();
        // Every rank is idle now; from the same votes every rank takes the same count, so the next
        // pass agrees again (left apart, the counts differed on every pass after this one).
        std::int32_t most = 0;
        for (auto const& v : votes) most = std::max(most, v.replans);
        L.started = most;
        fail("moe::Layer: rank 0 has started ", votes[0].replans, " re-plans, rank ", r, " ", votes[r].replans,
             " (replan() and migrate_to() must be called on every rank between the same two passes); every rank "
             "keeps its plan");
      }
      if (votes[r].live_options != votes[0].live_options) {
        abort_live();
        fail("moe::Layer: every rank must build its layer with the same LayerOptions::live.migration_bytes_per_pass, "
             "live.planner and live.plan_rank");
      }
    }
    for (std::size_t r = 0; r < n; ++r)
      if (votes[r].live_state == static_cast<std::int32_t>(LiveState::failed)) {
        abort_live();
        fail("moe::Layer: rank ", r, "'s re-plan failed, so every rank keeps the old plan and weights: ",
             std::string(votes[r].message, strnlen(votes[r].message, sizeof(votes[r].message))));
      }
    auto all = [&](LiveState s) {
      return std::all_of(votes.begin(), votes.end(),
                         [&](detail::Vote const& v) { return v.live_state == static_cast<std::int32_t>(s); });
    };
    if (int o = options_.live.plan_rank; o >= 0 && n > 1 &&
        votes[static_cast<std::size_t>(o)].live_state == static_cast<std::int32_t>(LiveState::ready)) {
      bool others_wait = true;
      for (std::size_t r = 0; r < n; ++r)
        others_wait = others_wait && (static_cast<int>(r) == o ||
                                      votes[r].live_state == static_cast<std::int32_t>(LiveState::planning));
      if (others_wait) L.share = true;  // after this pass, the planning rank's layout goes to every rank
    }
    if (all(LiveState::ready)) {
      for (std::size_t r = 1; r < n; ++r)
        if (votes[r].plan != votes[0].plan) {
          abort_live();
          fail("moe::Layer: the ranks made different plans (rank 0's and rank ", r, "'s differ); every rank keeps "
               "its plan (the re-planner is deterministic: do all ranks use the same options and window?)");
        }
      L.state = LiveState::moving;
      L.chunk = 0;
    } else if (all(LiveState::moved)) {
      if constexpr (can_replan) commit_live();
    }
  }

  /// Checks a new plan against this layer and prepares its moves; on success the rank is ready.
  void prepare(std::vector<int> const& layout)
    requires can_replan
  {
    auto& L = *live_;
    try {
      int R = plan_ranks(), me = plan_index();  // over the plan's ranks; me < 0 on an AG rank
      auto cur = plan();
      auto next = live::plan_of(layout, R, shape.experts, cur.primary);
      std::vector<int> held(static_cast<std::size_t>(R)), held_now(static_cast<std::size_t>(R)),
          incoming(static_cast<std::size_t>(R));
      for (auto const& c : next.copies)
        for (int r : c) ++held[static_cast<std::size_t>(r)];
      for (auto const& c : cur.copies)
        for (int r : c) ++held_now[static_cast<std::size_t>(r)];
      for (int r = 0; r < R; ++r)
        check(held[static_cast<std::size_t>(r)] <= L.width, "the plan gives rank ", r, " ",
              held[static_cast<std::size_t>(r)], " experts; a rank holds at most ", L.width, " (the first plan's)");
      auto moves = live::moves_between(cur, next, R, options_.live.nodes);
      for (auto const& m : moves) ++incoming[static_cast<std::size_t>(m.dst)];
      int slots = L.width + options_.live.spare_slots;
      for (int r = 0; r < R; ++r) {
        int free = slots - held_now[static_cast<std::size_t>(r)];
        check(incoming[static_cast<std::size_t>(r)] <= free, "the plan gives rank ", r, " ",
              incoming[static_cast<std::size_t>(r)], " new experts; it has ", free,
              " free slots (LayerOptions::live.spare_slots)");
      }
      check(me < 0 || incoming[static_cast<std::size_t>(me)] == 0 || !L.arena.empty(),
            "the plan moves experts to rank ", comm_->rank(), ", which has no arena for them (Layer::attach_arena)");
      live::ChunkSchedule sched(moves, R, slot_elements() * sizeof(T), options_.live.migration_bytes_per_pass);
      std::vector<int> taken(static_cast<std::size_t>(slots), 0), where(moves.size(), -1);
      for (int s : L.slot_of)
        if (s >= 0) taken[static_cast<std::size_t>(s)] = 1;
      std::size_t at = 0;
      for (std::size_t i = 0; i < moves.size(); ++i) {
        if (moves[i].dst != me) continue;
        while (taken[at]) ++at;
        taken[at] = 1;
        where[i] = static_cast<int>(at);
      }
      L.next_layout = live::layout_of(next, R, L.width);  // plan ranks x width, whatever width `layout` had
      L.hash = live::hash_layout(L.next_layout);
      L.next = std::move(next);
      L.schedule = std::move(sched);
      L.incoming_slot = std::move(where);
      L.chunk = 0;
      L.state = LiveState::ready;
    } catch (std::exception const& e) {
      fail_live(e.what());
    }
  }

  /// After the pass: the window's gather, then one chunk of the moves.
  void after_pass(typename Executor::Buffers const& b, LiveBuffers const& lb)
    requires counts_loads
  {
    auto& L = *live_;
    std::size_t before = sent();
    auto now = exec_.gather_loads(b, lb.gathered);
    stats_.window_bytes = sent() - before;
    if (!now.empty()) push_loads(now);
    if constexpr (can_replan) {
      if (L.share) share_plan(lb);
      if (L.state == LiveState::moving) {
        auto t0 = std::chrono::steady_clock::now();
        if (L.chunk < L.schedule.passes()) exchange_chunk(lb);
        if (L.state == LiveState::moving && L.chunk >= L.schedule.passes()) prepare_switch();
        stats_.migration_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      ++L.passes;
      if (options_.live.replan_every > 0 && L.passes % options_.live.replan_every == 0 && L.state == LiveState::idle)
        replan();
    } else {
      ++L.passes;
    }
    stats_.plans_adopted = L.adopted;
    stats_.plans_changed = L.changed;
  }

  /// Adds one pass's gathered counts to the window; stats() reports its rank loads.
  void push_loads(std::span<std::int32_t const> gathered) {
    live_->window.push(gathered);
    report_newest();
  }
  /// stats().rank_load_max / _mean: the rank loads of the newest pass the window holds.
  void report_newest() {
    auto const& w = live_->window;
    stats_.rank_load_max = 0;
    stats_.rank_load_mean = 0;
    if (w.size() == 0) return;
    auto loads = w.rank_loads(w.size() - 1).last(static_cast<std::size_t>(plan_ranks()));  // the ranks with experts
    long long sum = 0;
    for (long long v : loads) stats_.rank_load_max = std::max(stats_.rank_load_max, v), sum += v;
    stats_.rank_load_mean = static_cast<double>(sum) / static_cast<double>(loads.size());
  }

  /// live.plan_rank: the planning rank's layout (plan ranks x width int32, of the plan it
  /// prepared) to every rank, one all-gather staged through the migration buffers; the
  /// others prepare it (and are ready, or failed, in the next pass's votes). Its bytes are in
  /// stats().plan_bytes.
  void share_plan(LiveBuffers const& lb)
    requires can_replan
  {
    auto& L = *live_;
    L.share = false;
    int R = comm_->size(), me = comm_->rank(), o = options_.live.plan_rank;
    std::size_t n = static_cast<std::size_t>(plan_ranks()) * static_cast<std::size_t>(L.width);
    std::span<int const> mine;  // prepare() made next_layout plan ranks x width
    if (me == o) mine = L.next_layout;
    std::vector<int> all(n, -1);
    std::vector<std::size_t> bytes(static_cast<std::size_t>(R), 0);
    bytes[static_cast<std::size_t>(o)] = n * sizeof(int);
    std::size_t before = sent();
    exec_.gather_bytes(std::as_bytes(mine), bytes, std::as_writable_bytes(std::span(all)), lb.send, lb.recv);
    stats_.plan_bytes = sent() - before;
    if (me != o) prepare(all);
  }

  /// One pass of the schedule: pack this rank's pieces by receiver, one all-to-all-v, unpack what
  /// came into the arena. A fault is caught (the rank still takes part in the exchange) and voted
  /// on the next pass.
  void exchange_chunk(LiveBuffers const& lb)
    requires can_replan
  {
    auto& L = *live_;
    // moves are over the plan's ranks, the exchange over the collective's; me < 0: no experts here
    int R = comm_->size(), me = plan_index();
    auto pieces = L.schedule.pass(L.chunk);
    auto const& moves = L.schedule.moves();
    std::vector<std::size_t> send(static_cast<std::size_t>(R)), recv(static_cast<std::size_t>(R)),
        at(static_cast<std::size_t>(R));
    for (auto const& p : pieces) {
      auto const& m = moves[static_cast<std::size_t>(p.move)];
      if (m.src == me) send[static_cast<std::size_t>(comm_rank_of(m.dst))] += p.bytes;
      if (m.dst == me) recv[static_cast<std::size_t>(comm_rank_of(m.src))] += p.bytes;
    }
    std::size_t part = slot_elements() / 3 * sizeof(T);
    try {
      if (L.hook) L.hook(live::Step::pack);
      for (std::size_t d = 1; d < at.size(); ++d) at[d] = at[d - 1] + send[d - 1];
      auto current = exec_.expert_weights();
      for (auto const& p : pieces) {
        auto const& m = moves[static_cast<std::size_t>(p.move)];
        if (m.src != me) continue;
        auto& o = at[static_cast<std::size_t>(comm_rank_of(m.dst))];
        live::read_slot(current[static_cast<std::size_t>(m.expert)], part, p.offset, p.bytes, lb.send.data() + o,
                        [&](std::byte* to, std::byte const* from, std::size_t n) { exec_.copy_bytes(to, from, n); });
        o += p.bytes;
      }
    } catch (std::exception const& e) {
      fail_live(detail::concat("rank ", comm_->rank(), " could not pack its weights (chunk ", L.chunk, "): ", e.what()));
    }
    std::size_t before = sent();
    exec_.exchange_bytes(lb.send, send, lb.recv, recv);
    stats_.migration_bytes = sent() - before;
    if (L.state == LiveState::failed) return;
    try {
      if (L.hook) L.hook(live::Step::unpack);
      std::fill(at.begin(), at.end(), 0);
      for (std::size_t s = 1; s < at.size(); ++s) at[s] = at[s - 1] + recv[s - 1];
      auto* arena = reinterpret_cast<std::byte*>(L.arena.data());
      for (auto const& p : pieces) {
        auto const& m = moves[static_cast<std::size_t>(p.move)];
        if (m.dst != me) continue;
        auto slot = static_cast<std::size_t>(L.incoming_slot[static_cast<std::size_t>(p.move)]);
        auto& o = at[static_cast<std::size_t>(comm_rank_of(m.src))];
        exec_.copy_bytes(arena + slot * slot_elements() * sizeof(T) + p.offset, lb.recv.data() + o, p.bytes);
        o += p.bytes;
      }
      ++L.chunk;
    } catch (std::exception const& e) {
      fail_live(detail::concat("rank ", comm_->rank(), " could not unpack chunk ", L.chunk, ": ", e.what()));
    }
  }

  /// Every move received: the next tables and weight list, checked as the constructor checks.
  void prepare_switch()
    requires can_replan
  {
    auto& L = *live_;
    try {
      if (L.hook) L.hook(live::Step::prepare_switch);
      int me = plan_index();  // < 0: this rank holds no experts (an AG rank)
      auto E = static_cast<std::size_t>(shape.experts);
      std::size_t per = slot_elements() / 3;
      std::vector<int> slot_of(E, -1);
      std::vector<ExpertWeights<T>> experts(E);
      auto const& moves = L.schedule.moves();
      for (std::size_t i = 0; i < moves.size(); ++i)
        if (moves[i].dst == me) slot_of[static_cast<std::size_t>(moves[i].expert)] = L.incoming_slot[i];
      for (std::size_t e = 0; e < E; ++e) {
        auto const& c = L.next.copies[e];
        if (std::find(c.begin(), c.end(), me) == c.end()) {
          slot_of[e] = -1;
          continue;
        }
        if (slot_of[e] < 0) slot_of[e] = L.slot_of.empty() ? -1 : L.slot_of[e];
        if (slot_of[e] >= 0) {
          T const* w = L.arena.data() + static_cast<std::size_t>(slot_of[e]) * slot_elements();
          experts[e] = {w, w + per, w + 2 * per};
        } else {
          experts[e] = exec_.expert_weights()[e];  // no arena: nothing moved, the weights stay
        }
      }
      L.next_experts = std::move(experts);
      L.next_exec.emplace(exec_.prepare_plan(placement::Table(L.next.primary),
                                             live::rebuilt(exec_.replicas(), L.next.copies), L.next_experts));
      L.next_slot_of = std::move(slot_of);
      L.next_changes = plan() != L.next;  // both list each expert's copies in rank order
      L.state = LiveState::moved;
    } catch (std::exception const& e) {
      fail_live(detail::concat("rank ", me_rank(), " could not prepare the switch: ", e.what()));
    }
  }

  [[nodiscard]] int me_rank() const { return comm_->rank(); }
  /// This rank's index among the plan's ranks (plan_ranks()); negative on a rank that holds no
  /// experts (a disaggregated path's AG rank).
  [[nodiscard]] int plan_index() const { return comm_->rank() - (comm_->size() - plan_ranks()); }
  /// The collective's rank of the plan's rank g.
  [[nodiscard]] int comm_rank_of(int g) const { return g + (comm_->size() - plan_ranks()); }

  /// Every rank has moved: switch to the new plan (nothing here can fail).
  void commit_live() noexcept
    requires can_replan
  {
    auto& L = *live_;
    L.experts.swap(L.next_experts);
    if (!L.next_slot_of.empty() && !L.arena.empty()) L.slot_of = std::move(L.next_slot_of);
    exec_.adopt(std::move(*L.next_exec), L.experts);
    tables_.reset();  // hashed again on the next pass (commit_live cannot throw)
    ++L.adopted;
    L.changed += L.next_changes ? 1 : 0;
    L.next_changes = false;
    L.next_exec.reset();
    L.state = LiveState::idle;
    L.next = {};
    L.schedule = {};
    L.incoming_slot.clear();
    L.next_experts.clear();
    L.next_slot_of.clear();
    L.chunk = 0;
  }

  /// The hash of the placement and replica tables in use, as the agreement compares them. A
  /// replication::BatchSplit adds what its split depends on beyond who holds what: the order of
  /// each copy list (its tie-breaks follow it), the servers and the slack; every rank must solve
  /// the same split.
  [[nodiscard]] std::uint64_t tables_in_use() const {
    auto const primary = exec_.primary_ranks();
    auto const& replicas = exec_.replicas();
    detail::TablesHash h;
    h.h = detail::hash_tables(
        shape.experts, plan_ranks(), [&](int e) { return primary[static_cast<std::size_t>(e)]; },
        [&](int e, int r) { return replicas.holds(e, primary[static_cast<std::size_t>(e)], r); });
    if constexpr (std::is_same_v<Replicas, replication::BatchSplit>) {
      h.mix(replicas.copy_lists().first);
      h.mix(replicas.copy_lists().ranks);
      h.mix(replicas.servers());
      h.mix(static_cast<std::uint32_t>(replicas.layout().slack_permille));
    }
    return h.h;
  }

  Comm* comm_;
  Options options_;
  Executor exec_;
  std::optional<std::uint64_t> tables_;  ///< tables_in_use(); empty after a switch until the next pass
  LayerStats stats_;
  std::vector<detail::Vote> votes_;
  std::unique_ptr<LiveData> live_;
};

}  // namespace moe
