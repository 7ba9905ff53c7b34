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
// Every execution path has this surface: the same constructor, one Options type (LayerOptions
// below, the schedule's value inside it), can_implement, workspace_size, run and stats. The
// policies pick the path:
//
//   Collective memory   Schedule                      path                   header
//   host                schedule::Sequential          host                   moe/layer/host.hpp
//   host                FinDep, PPPipe                host disaggregated     moe/layer/host_disaggregated.hpp
//   device              schedule::Sequential          device                 moe/layer/device.cuh (nvcc)
//   device              FinDep, PPPipe                device disaggregated   moe/layer/device_disaggregated.cuh (nvcc)
//
// moe/moe.hpp includes the host paths, and the device paths too when nvcc compiles the translation
// unit. Each path's header holds a partial specialisation of the class declared here; the primary
// template only says which header is missing.
//
// Arguments differ by path where the memory does: the device paths take a stream, and the
// disaggregated paths' expert-group ranks pass no tokens of their own (see each header).

#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"
#include "moe/core/shape.hpp"
#include "moe/core/weights.hpp"
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
/// How the device path's dispatch records cross ranks (see moe/layer/device.cuh).
///   exact   counts first, one host synchronisation, then records of exactly their size
///   padded  fixed worst-case regions, no host synchronisation, graph-capturable
enum class Exchange { exact, padded };
}  // namespace cuda

/// The options of every execution path. Fields a path does not use are ignored by it.
template <class Schedule = schedule::Sequential>
struct LayerOptions {
  int max_tokens = 0;       ///< most tokens one rank passes to run(); sizes the workspace
  bool deduplicate = true;  ///< one record per (token, rank); false sends one per (token, expert)
                            ///< (the disaggregated paths always de-duplicate)
  /// The schedule's value: for FinDep / PPPipe the attention-group size and the solved
  /// configuration (order, r1, r2); schedule::Sequential carries nothing.
  Schedule schedule{};
  // The device paths:
  /// Kernel of the expert GEMMs: automatic (the Hopper wgmma kernel for bf16 where it can run,
  /// else the portable one), portable, or hopper (an error at construction where it cannot run).
  kernels::cuda::GemmPath gemm = kernels::cuda::GemmPath::automatic;
  std::size_t cublas_workspace = std::size_t{8} << 20;  ///< bytes handed to cuBLAS for the gate GEMM
  cuda::Exchange exchange = cuda::Exchange::exact;      ///< device path: how records cross ranks
  int max_chunks = 64;  ///< device disaggregated path: most r1 * r2 of a run (sizes its event pool)
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

  [[nodiscard]] double local_activation_rate() const {
    return assignments ? static_cast<double>(local_assignments) / static_cast<double>(assignments) : 0.0;
  }
};

namespace detail {

template <class>
inline constexpr bool missing_path = false;

/// The checks every sequential execution path makes when it is built: the shape, the tables against
/// the ranks, the options, and that this rank has the weights of every expert it serves. Returns
/// the primary rank of each expert. `who` names the layer type in the messages.
template <class T, placement::Policy Placement, replication::Policy Replicas>
std::vector<int> check_layer_setup(char const* who, ShapeSpec const& s, int ranks, int rank, Placement const& placement,
                                   Replicas const& replicas, LayerWeights<T> const& weights, int max_tokens) {
  validate(s);
  placement.validate(s.experts, ranks);
  std::vector<int> primary(static_cast<std::size_t>(s.experts));
  for (int e = 0; e < s.experts; ++e) primary[static_cast<std::size_t>(e)] = placement.rank_of(e);
  replicas.validate(s.experts, ranks, primary);
  check(max_tokens > 0, who, ": max_tokens must be positive, got ", max_tokens);
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

/// The per-call checks every sequential execution path makes on run()'s token count and pointers.
inline Status check_run_arguments(char const* who, char const* options_name, int tokens, int max_tokens,
                                  void const* x, void const* y, long long first_token = 0) {
  if (tokens < 0) return {false, concat(who, ": negative token count ", tokens)};
  if (first_token < 0)
    return {false, concat(who, ": first_token (the global index of this rank's first token) must not be "
                               "negative, got ", first_token)};
  if (tokens > max_tokens)
    return {false, concat(who, ": ", tokens, " tokens exceed the ", max_tokens, " the workspace was sized for (",
                          options_name, "::max_tokens)")};
  if (tokens > 0 && (x == nullptr || y == nullptr)) return {false, concat(who, ": input or output pointer is null")};
  return {};
}

/// The construction-time checks of a disaggregated schedule on `ranks` ranks (both backends).
template <schedule::DisaggregatedPolicy Schedule>
void check_disaggregated_schedule(Schedule const& s, int ranks) {
  check(s.ag >= 1 && s.ag < ranks, "moe::Layer (disaggregated): the attention group must hold between 1 and ",
        ranks - 1, " of the ", ranks, " ranks (the rest form the expert group), got ag = ", s.ag);
  check(s.r1 >= 1 && s.r2 >= 1, "moe::Layer (disaggregated): r1 and r2 must be at least 1, got r1 = ", s.r1,
        ", r2 = ", s.r2);
  check(Schedule::pipeline != schedule::Pipeline::pppipe || s.r2 == 1,
        "moe::Layer (disaggregated): PPPipe has no token chunks; r2 must be 1, got r2 = ", s.r2);
}

/// Replica policies the disaggregated paths take: replication::None, or a replication::Table over
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

/// The replica table as the executors take it (empty: one copy per expert).
template <class Replicas>
replication::Table expert_group_copies(Replicas const& replicas) {
  if constexpr (std::is_same_v<Replicas, replication::Table>)
    return replicas;
  else
    return {};
}

}  // namespace detail

/// The layer. Each execution path is a partial specialisation in its own header (table above);
/// this primary template is what a translation unit gets when that header is not included.
template <ModelShape Model, router::Policy Router, placement::Policy Placement, replication::Policy Replicas,
          schedule::Policy Schedule, collective::Communicator Comm>
class Layer {
  static constexpr ExecutionPath path = execution_path<Schedule, Comm>;
  static_assert(detail::missing_path<Schedule> || path != ExecutionPath::host,
                "moe::Layer: the host path (a host collective, schedule::Sequential) is in "
                "<moe/layer/host.hpp>; include it or <moe/moe.hpp>");
  static_assert(detail::missing_path<Schedule> || path != ExecutionPath::host_disaggregated,
                "moe::Layer: the host disaggregated path (a host collective, FinDep or PPPipe) is in "
                "<moe/layer/host_disaggregated.hpp>; include it or <moe/moe.hpp>");
  static_assert(detail::missing_path<Schedule> || path != ExecutionPath::device,
                "moe::Layer: the device path (a device collective, schedule::Sequential) is in "
                "<moe/layer/device.cuh>, compiled by nvcc; include it or <moe/moe.hpp> in a .cu file");
  static_assert(detail::missing_path<Schedule> || path != ExecutionPath::device_disaggregated,
                "moe::Layer: the device disaggregated path (a device collective, FinDep or PPPipe) is in "
                "<moe/layer/device_disaggregated.cuh>, compiled by nvcc; include it or <moe/moe.hpp> in a .cu file");
};

}  // namespace moe
