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
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"
#include "moe/core/shape.hpp"
#include "moe/core/weights.hpp"
#include "moe/core/workspace.hpp"
#include "moe/kernels/gemm_path.hpp"
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
};

/// The device disaggregated path's own options (LayerOptions::device).
struct DisaggregatedOptions {
  kernels::cuda::GemmPath gemm = kernels::cuda::GemmPath::automatic;  ///< as DeviceOptions::gemm
  std::size_t cublas_workspace = std::size_t{8} << 20;               ///< as DeviceOptions
  int max_chunks = 64;  ///< most r1 * r2 of a run (sizes the event pool)
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
};

template <class Schedule>
struct LayerOptions<Schedule, void> {
  int max_tokens = 0;       ///< most tokens one rank passes to run(); sizes the workspace
  bool deduplicate = true;  ///< one record per (token, rank); false sends one per (token, expert)
  Schedule schedule{};      ///< the schedule's value (see above)
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

/// One rank's verdict on a pass, exchanged before any data moves (256 bytes): whether its
/// arguments passed, why not, and the settings every rank must share.
struct Vote {
  std::int32_t ok = 0;
  std::int32_t settings[7] = {};  ///< max_tokens, deduplicate, pipeline, order, r1, r2, 0
  char message[224] = {};
};
static_assert(sizeof(Vote) == 256);

/// Throws the same moe::Error on every rank that holds the same `votes`: the reason of the first
/// rank that rejected its arguments, else the first rank whose settings differ from rank 0's.
inline void decide(std::span<Vote const> votes, char const* who) {
  for (std::size_t r = 0; r < votes.size(); ++r)
    if (!votes[r].ok)
      fail(who, ": rank ", r, " rejected its arguments, so every rank stops: ",
           std::string(votes[r].message, strnlen(votes[r].message, sizeof(votes[r].message))));
  auto describe = [](Vote const& v) {
    return concat("max_tokens ", v.settings[0], ", deduplicate ", v.settings[1], ", schedule ", v.settings[2], "/",
                  v.settings[3], "/", v.settings[4], "/", v.settings[5], " (pipeline/order/r1/r2)");
  };
  for (std::size_t r = 1; r < votes.size(); ++r)
    check(std::equal(std::begin(votes[r].settings), std::end(votes[r].settings), std::begin(votes[0].settings)), who,
          ": every rank must build its layer with the same options: rank 0 has ", describe(votes[0]), ", rank ", r,
          " has ", describe(votes[r]));
}

/// All ranks' votes through a host-memory collective (one all-gather of 256 bytes per rank).
template <class Comm>
void gather_votes(Comm& comm, Vote const& mine, std::span<Vote> votes) {
  std::vector<std::size_t> bytes(votes.size(), sizeof(Vote));
  comm.all_gather_v(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(votes), bytes);
}

/// Which executor runs a path; each path's header (moe/layer/paths/) specialises it.
template <ExecutionPath P, class Model, class Router, class Placement, class Replicas, class Schedule, class Comm>
struct executor_of {
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
  using Executor = typename detail::executor_of<path, Model, Router, Placement, Replicas, Schedule, Comm>::type;

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
        exec_(comm, std::move(placement), std::move(replicas), weights, options_) {}

  /// The device disaggregated path: two communicators over the same ranks, `a2e` for the tokens to
  /// the experts, `e2a` for the partial results back (the one-communicator form duplicates it).
  Layer(Comm& a2e, Comm& e2a, Placement placement, Replicas replicas, LayerWeights<T> weights, Options options)
    requires(path == ExecutionPath::device_disaggregated)
      : comm_(&a2e), options_(checked(options, a2e.size())),
        exec_(a2e, e2a, std::move(placement), std::move(replicas), weights, options_) {}

  /// Bytes of caller-owned workspace run() needs on this rank (host or device memory, as the
  /// collective's; the disaggregated paths' attention and expert ranks differ).
  [[nodiscard]] std::size_t workspace_size() const {
    core::Carver c;
    typename Executor::Buffers b;
    exec_.carve(c, b);
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
  /// rejected, or the ranks were built with different options, every rank throws the same
  /// moe::Error naming that rank and the reason, before any data moves. On one rank, and on a
  /// device stream being captured into a CUDA graph (where the host cannot wait for the votes),
  /// the rank checks alone.
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
    stats_ = {};
    stats_.agreement_bytes = sent() - before;
    exec_.run(a, b, stats_);
  }

  /// What the last run() did on this rank (see LayerStats and the path's executor).
  [[nodiscard]] LayerStats const& stats() const { return stats_; }
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
    if (comm_->size() > 1) {
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
      votes_.resize(static_cast<std::size_t>(comm_->size()));
      if (exec_.gather_votes(a, mine, votes_)) {
        detail::decide(votes_, "moe::Layer");
        return;
      }
    }
    check(st.ok, st.message);
  }

  Comm* comm_;
  Options options_;
  Executor exec_;
  LayerStats stats_;
  std::vector<detail::Vote> votes_;
};

}  // namespace moe
