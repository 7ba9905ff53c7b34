#pragma once
// What the two FinDEP / PPPipe executors on CUDA streams share (nvcc only): the attention step
// A(i) (gate logits and routing), the record format, the resource streams and event pool, the
// schedule checks, the plan cache and the options. The executors are in findep_cuda_executor.cuh
// (co-located: AG and EG on one GPU) and findep_cuda_p2p.cuh (AG and EG on different GPUs).

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"
#include "moe/core/shape.hpp"
#include "moe/core/workspace.hpp"
#include "moe/kernels/combine.cuh"
#include "moe/kernels/cuda_common.cuh"
#include "moe/kernels/dispatch.cuh"
#include "moe/kernels/gate.cuh"
#include "moe/kernels/grouped_gemm.cuh"
#include "moe/layer/expert_ffn.cuh"
#include "moe/layer/layer.hpp"
#include "moe/core/weights.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/router/router.hpp"
#include "moe/schedule/problem.hpp"
#include "moe/schedule/stream_plan.hpp"

namespace moe::schedule {

namespace detail_cuda {

/// A(i): gate logits (cuBLAS) and top-k routing of `tokens` rows of x into ids / weights.
template <ShapeSpec S, class Router, class T>
void findep_attention(cublasHandle_t cublas, cudaStream_t s, std::span<std::byte> cublas_ws, LayerWeights<T> const& w,
                      T const* x, int tokens, float* logits, int* ids, float* gate_w) {
  kernels::cuda::gate_logits<T>(cublas, s, cublas_ws.data(), cublas_ws.size(), x, tokens, S.hidden, w.router,
                                S.experts, logits);
  kernels::cuda::route<S, Router>(s, logits, w.router_bias, tokens, ids, gate_w);
}

/// Bytes of a dispatch record's metadata: [int32 token, int32 count, int32 expert[k], float
/// weight[k]], padded to 16 bytes (the CUDA kernels' record format).
constexpr std::size_t findep_meta_bytes(int top_k) {
  return (2 * sizeof(std::int32_t) + static_cast<std::size_t>(top_k) * (sizeof(std::int32_t) + sizeof(float)) + 15) /
         16 * 16;
}

/// The resource streams of an executor (one per Resource, non-blocking) and its event pool,
/// destroyed with it.
struct StreamPool {
  std::array<cudaStream_t, resource_count> streams{};  ///< indexed by Resource
  std::vector<cudaEvent_t> events;

  StreamPool() = default;
  StreamPool(StreamPool const&) = delete;
  StreamPool& operator=(StreamPool const&) = delete;
  ~StreamPool() {
    for (auto e : events)
      if (e) cudaEventDestroy(e);
    for (auto s : streams)
      if (s) cudaStreamDestroy(s);
  }

  void create(std::size_t event_count) {
    namespace kc = kernels::cuda;
    for (auto& s : streams)
      kc::check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    events.resize(event_count);
    for (auto& e : events) kc::check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  }

  /// Every resource stream starts after the work already on `caller` (through pool event `event`).
  void fork(cudaStream_t caller, std::size_t event) const {
    namespace kc = kernels::cuda;
    kc::check_cuda(cudaEventRecord(events[event], caller), "cudaEventRecord (fork)");
    for (auto s : streams) kc::check_cuda(cudaStreamWaitEvent(s, events[event], 0), "cudaStreamWaitEvent (fork)");
  }

  /// `caller` continues after the last operation of every resource stream, each joined directly
  /// (as stream capture into a CUDA graph requires), through events [first, first + resource_count).
  void join(cudaStream_t caller, std::size_t first) const {
    namespace kc = kernels::cuda;
    for (std::size_t q = 0; q < resource_count; ++q) {
      kc::check_cuda(cudaEventRecord(events[first + q], streams[q]), "cudaEventRecord (join)");
      kc::check_cuda(cudaStreamWaitEvent(caller, events[first + q], 0), "cudaStreamWaitEvent (join)");
    }
  }
};

/// The checks of a schedule both executors share: r1 and r2, the pipeline and order, the event
/// pool (max_chunks) and the split of `tokens` into micro-batches and chunks.
inline Status check_schedule(char const* who, int tokens, Config const& c, int max_chunks) {
  using moe::detail::concat;
  if (c.r1 < 1) return {false, concat(who, ": r1 (micro-batches) must be at least 1, got ", c.r1)};
  if (c.r2 < 1) return {false, concat(who, ": r2 (token chunks) must be at least 1, got ", c.r2)};
  if (c.pipeline == Pipeline::pppipe && c.r2 != 1)
    return {false, concat(who, ": PPPipe has no token chunks; r2 must be 1, got ", c.r2)};
  if (c.pipeline != Pipeline::findep && c.pipeline != Pipeline::pppipe)
    return {false, concat(who, ": unknown pipeline ", static_cast<int>(c.pipeline))};
  if (c.order != Order::aass && c.order != Order::asas)
    return {false, concat(who, ": unknown order ", static_cast<int>(c.order))};
  if (static_cast<long long>(c.r1) * c.r2 > max_chunks)
    return {false, concat(who, ": r1 * r2 = ", c.r1, " * ", c.r2, " chunks exceed max_chunks = ", max_chunks,
                          " (FinDepCudaOptions::max_chunks sizes the event pool)")};
  if (tokens % c.r1 != 0) return {false, concat(who, ": r1 = ", c.r1, " does not divide the ", tokens, " tokens")};
  if ((tokens / c.r1) % c.r2 != 0)
    return {false, concat(who, ": r2 = ", c.r2, " does not divide the ", tokens / c.r1, " tokens of a micro-batch (",
                          tokens, " tokens, r1 = ", c.r1, ")")};
  return {};
}

/// The stream plan of the last configuration an executor ran, rebuilt only when it changes.
struct PlanCache {
  StreamPlan plan;
  bool valid = false;

  /// The plan of `c`, whose events must fit the `plan_events` the executor's pool keeps for plans.
  StreamPlan const& get(Config const& c, bool shared_experts, std::size_t plan_events, char const* who) {
    if (!valid || plan.config.pipeline != c.pipeline || plan.config.order != c.order || plan.config.r1 != c.r1 ||
        plan.config.r2 != c.r2) {
      plan = build_stream_plan(c, shared_experts, 1);
      valid = true;
    }
    plan.config = c;  // the same plan; keep the configuration the caller ran (m_a may differ)
    check(plan.events.size() <= plan_events, who, ": internal error: the plan needs ", plan.events.size(),
          " events, the pool holds ", plan_events);
    return plan;
  }
};

}  // namespace detail_cuda

/// Largest FinDepCudaOptions::max_chunks: the event pool holds about 5 events per chunk, created
/// at construction (solved schedules use a few hundred chunks at most).
inline constexpr int max_cuda_chunks = 4096;

struct FinDepCudaOptions {
  int max_tokens = 0;  ///< most tokens one run() takes; sizes the workspace
  int max_chunks = 64;  ///< most r1 * r2 of a run(); sizes the event pool (at most max_cuda_chunks)
  std::size_t cublas_workspace = std::size_t{8} << 20;  ///< bytes handed to cuBLAS for the gate GEMM
  /// Kernel of the expert GEMMs (as LayerOptions::gemm).
  kernels::cuda::GemmPath gemm = kernels::cuda::GemmPath::automatic;
};

}  // namespace moe::schedule
