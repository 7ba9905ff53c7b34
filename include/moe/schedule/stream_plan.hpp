#pragma once
// Stream/event plan of a FinDEP or PPPipe schedule: for a Config (pipeline, order, r1, r2) the
// ordered list of operations of each resource stream (AG compute, A2E link, EG compute, E2A link),
// each with the events it waits on before it starts and the event it records when it ends. A CUDA
// executor maps each resource to one cudaStream_t and each plan event to one cudaEvent_t
// (moe/layer/findep_cuda_executor.cuh, both links); any other stream/event runtime can run the same plan.
//
// The operations and their dependencies are those of section 3.2 of the FinDEP paper, as the
// simulator (simulator.hpp, build_tasks) and the host executor (findep_executor.hpp) use them:
//   A(l,i)    attention / router of micro-batch i in layer l   AG    after E2A(l-1,i,*) and S(l-1,i)
//   S(l,i)    shared experts of micro-batch i                  AG    after A(l,i)
//   D(l,i,j)  A2E of chunk j of micro-batch i                  A2E   after A(l,i) (FinDEP) or S(l,i) (PPPipe)
//   E(l,i,j)  routed experts of that chunk                     EG    after D(l,i,j)
//   C(l,i,j)  E2A of that chunk                                E2A   after E(l,i,j)
// AG order per layer: AASS (A.. S..) or ASAS (A S A S ..); PPPipe always alternates; without shared
// experts there are no S operations. The links and the EG run in (layer, micro-batch, chunk) order.
//
// Waits. A stream runs its operations in order, so a dependency on an earlier operation of the
// same stream needs no event, and neither does one that an earlier wait already implies. The plan
// keeps a vector clock per operation (for each stream, the last operation known to have finished
// before it starts) and adds a wait only for a dependency the clock does not cover. E.g. A(l,i)
// waits only on C(l-1,i,r2-1): the E2A stream ran C(l-1,i,0..r2-2) before it.
//
// `launch` is an order in which a host can enqueue the operations so that every event is recorded
// before any wait on it is enqueued (a CUDA stream ignores a wait on an event not yet recorded):
// the order in which the plan was generated, which is topological.

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "moe/config.hpp"
#include "moe/schedule/problem.hpp"
#include "moe/schedule/simulator.hpp"

namespace moe::schedule {

/// One operation of a resource stream.
struct PlanOp {
  TaskKind kind = TaskKind::attention;
  Resource stream = Resource::ag;
  int layer = 0, mb = 0, chunk = 0;  ///< chunk is 0 for A and S
  std::vector<int> waits;            ///< events to wait on before this operation starts
  int record = -1;                   ///< event recorded when it ends, or -1
};

/// Where an event is recorded: after operation `index` of stream `stream`.
struct PlanEvent {
  Resource stream = Resource::ag;
  int index = 0;
};

/// One step of the host's enqueue order: operation `index` of stream `stream`.
struct LaunchStep {
  Resource stream = Resource::ag;
  int index = 0;
};

struct StreamPlan {
  Config config{};
  bool has_shared = false;
  int layers = 1;
  std::array<std::vector<PlanOp>, resource_count> ops;  ///< indexed by Resource
  std::vector<PlanEvent> events;                        ///< indexed by event id
  std::vector<LaunchStep> launch;                       ///< every operation once, in enqueue order

  [[nodiscard]] std::vector<PlanOp> const& stream(Resource r) const { return ops[static_cast<std::size_t>(r)]; }
  [[nodiscard]] PlanOp const& op(LaunchStep s) const {
    return ops[static_cast<std::size_t>(s.stream)][static_cast<std::size_t>(s.index)];
  }
  [[nodiscard]] std::size_t op_count() const {
    std::size_t n = 0;
    for (auto const& o : ops) n += o.size();
    return n;
  }
  [[nodiscard]] std::size_t wait_count() const {
    std::size_t n = 0;
    for (auto const& o : ops)
      for (auto const& p : o) n += p.waits.size();
    return n;
  }
};

/// Largest r1 * r2 * layers a plan is built for (a guard against sizes that overflow).
inline constexpr long long max_plan_chunks = 1LL << 22;

/// Most events a plan of (r1, r2, layers) can use: at most one per operation.
[[nodiscard]] constexpr long long max_plan_events(int r1, int r2, bool has_shared, int layers = 1) {
  return static_cast<long long>(layers) * r1 * ((has_shared ? 2 : 1) + 3LL * r2);
}

/// Throws moe::Error naming the first problem with (c, layers) as input of a stream plan.
inline void validate_plan_input(Config const& c, int layers) {
  check(c.r1 >= 1, "stream plan: r1 (micro-batches) must be at least 1, got ", c.r1);
  check(c.r2 >= 1, "stream plan: r2 (token chunks) must be at least 1, got ", c.r2);
  check(c.pipeline == Pipeline::findep || c.pipeline == Pipeline::pppipe, "stream plan: unknown pipeline ",
        static_cast<int>(c.pipeline));
  check(c.order == Order::aass || c.order == Order::asas, "stream plan: unknown order ", static_cast<int>(c.order));
  check(c.pipeline == Pipeline::findep || c.r2 == 1, "stream plan: PPPipe has no token chunks; r2 must be 1, got ",
        c.r2);
  check(layers >= 1, "stream plan: layers must be at least 1, got ", layers);
  check(static_cast<long long>(c.r1) * c.r2 * layers <= max_plan_chunks, "stream plan: r1 * r2 * layers = ", c.r1,
        " * ", c.r2, " * ", layers, " chunks is above the limit of ", max_plan_chunks);
}

/// Builds the plan of `c` over `layers` layers; `has_shared` says whether the model has shared
/// experts (S operations). m_a is not used.
[[nodiscard]] inline StreamPlan build_stream_plan(Config const& c, bool has_shared, int layers = 1) {
  validate_plan_input(c, layers);
  StreamPlan p;
  p.config = c;
  p.has_shared = has_shared;
  p.layers = layers;
  using Clock = std::array<int, resource_count>;  // last finished index per stream, -1 = none
  std::array<std::vector<Clock>, resource_count> after;  // clock once the operation has finished
  std::array<Clock, resource_count> tail;                 // clock after the last operation of each stream
  for (auto& t : tail) t.fill(-1);

  auto event_of = [&](LaunchStep s) {
    PlanOp& o = p.ops[static_cast<std::size_t>(s.stream)][static_cast<std::size_t>(s.index)];
    if (o.record < 0) {
      o.record = static_cast<int>(p.events.size());
      p.events.push_back({s.stream, s.index});
    }
    return o.record;
  };
  // Appends an operation that depends on `deps` (earlier operations); returns where it is.
  auto add = [&](TaskKind kind, Resource r, int l, int i, int j, std::vector<LaunchStep> const& deps) {
    auto ur = static_cast<std::size_t>(r);
    PlanOp o{kind, r, l, i, j, {}, -1};
    Clock clock = tail[ur];  // stream order: everything before on this stream has finished
    auto index = static_cast<int>(p.ops[ur].size());
    for (LaunchStep d : deps) {
      auto ud = static_cast<std::size_t>(d.stream);
      check(d.index < static_cast<int>(p.ops[ud].size()), "stream plan: internal error, dependency not yet built");
      if (clock[ud] >= d.index) continue;  // implied by stream order or an earlier wait
      o.waits.push_back(event_of(d));
      Clock const& dc = after[ud][static_cast<std::size_t>(d.index)];
      for (std::size_t q = 0; q < resource_count; ++q) clock[q] = std::max(clock[q], dc[q]);
    }
    clock[ur] = index;
    after[ur].push_back(clock);
    tail[ur] = clock;
    p.ops[ur].push_back(std::move(o));
    p.launch.push_back({r, index});
    return LaunchStep{r, index};
  };

  auto r1 = static_cast<std::size_t>(c.r1);
  bool pppipe = c.pipeline == Pipeline::pppipe;
  bool alternate = c.order == Order::asas || pppipe;
  std::vector<LaunchStep> A(r1), S(r1), lastC(r1);
  std::vector<char> have_prev(r1, 0);
  for (int l = 0; l < layers; ++l) {
    auto attention = [&](std::size_t i) {
      std::vector<LaunchStep> deps;
      if (have_prev[i]) {
        deps.push_back(lastC[i]);            // E2A(l-1, i, last chunk): the others precede it
        if (has_shared) deps.push_back(S[i]);  // S(l-1, i), same stream
      }
      A[i] = add(TaskKind::attention, Resource::ag, l, static_cast<int>(i), 0, deps);
    };
    auto shared = [&](std::size_t i) {
      S[i] = add(TaskKind::shared, Resource::ag, l, static_cast<int>(i), 0, {A[i]});
    };
    if (!has_shared) {
      for (std::size_t i = 0; i < r1; ++i) attention(i);
    } else if (alternate) {
      for (std::size_t i = 0; i < r1; ++i) {
        attention(i);
        shared(i);
      }
    } else {
      for (std::size_t i = 0; i < r1; ++i) attention(i);
      for (std::size_t i = 0; i < r1; ++i) shared(i);
    }
    for (std::size_t i = 0; i < r1; ++i) {
      LaunchStep release = (pppipe && has_shared) ? S[i] : A[i];
      for (int j = 0; j < c.r2; ++j) {
        int mb = static_cast<int>(i);
        LaunchStep d = add(TaskKind::a2e, Resource::a2e, l, mb, j, {release});
        LaunchStep e = add(TaskKind::experts, Resource::eg, l, mb, j, {d});
        lastC[i] = add(TaskKind::e2a, Resource::e2a, l, mb, j, {e});
      }
      have_prev[i] = 1;
    }
  }
  return p;
}

/// "A(l0,mb1)" etc.
[[nodiscard]] inline std::string describe(PlanOp const& o) {
  std::string s = moe::detail::concat(task_kind_name(o.kind), "(l", o.layer, ",mb", o.mb);
  if (o.kind == TaskKind::a2e || o.kind == TaskKind::experts || o.kind == TaskKind::e2a)
    s += moe::detail::concat(",c", o.chunk);
  return s + ")";
}

/// One line per stream: its operations in order, "[wait e3]" before and "->e5" after an operation.
[[nodiscard]] inline std::string format_plan(StreamPlan const& p) {
  std::string out;
  constexpr std::array<Resource, resource_count> shown{Resource::ag, Resource::a2e, Resource::eg, Resource::e2a};
  for (Resource r : shown) {
    out += moe::detail::concat(resource_name(r), ":");
    for (PlanOp const& o : p.stream(r)) {
      out += " ";
      for (int w : o.waits) out += moe::detail::concat("[wait e", w, "] ");
      out += describe(o);
      if (o.record >= 0) out += moe::detail::concat("->e", o.record);
    }
    out += "\n";
  }
  return out;
}

}  // namespace moe::schedule
