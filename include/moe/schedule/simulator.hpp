#pragma once
// Discrete-event simulator of a disaggregated MoE schedule on four resources: AG compute, EG
// compute, the A2E link and the E2A link (paper section 3.2). Each resource runs its tasks one at a
// time in a fixed order (like a CUDA stream): the head task of a resource starts as soon as the
// resource is free and every task it depends on has finished. Events are task completions, kept in
// a time-ordered queue.
//
// build_tasks() produces the task graph of a FinDEP or PPPipe configuration over several layers:
//   A(l,i)    attention of micro-batch i in layer l            AG    after E2A(l-1,i,*) and S(l-1,i)
//   S(l,i)    shared experts of micro-batch i                  AG    after A(l,i)
//   D(l,i,j)  A2E of chunk j of micro-batch i                  A2E   after A(l,i) (FinDEP) or S(l,i) (PPPipe)
//   E(l,i,j)  routed experts of that chunk                     EG    after D(l,i,j)
//   C(l,i,j)  E2A of that chunk                                E2A   after E(l,i,j)
// AG order per layer: AASS (A.. then S..) or ASAS (A S A S ..); the links and the EG take chunks in
// (layer, micro-batch, chunk) order. Without shared experts there are no S tasks.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "moe/config.hpp"
#include "moe/schedule/problem.hpp"

namespace moe::schedule {

enum class Resource : int { ag = 0, eg, a2e, e2a };
inline constexpr int resource_count = 4;
[[nodiscard]] constexpr std::string_view resource_name(Resource r) {
  constexpr std::array<std::string_view, resource_count> n{"AG", "EG", "A2E", "E2A"};
  return n[static_cast<std::size_t>(r)];
}

enum class TaskKind : int { attention = 0, shared, a2e, experts, e2a };
[[nodiscard]] constexpr std::string_view task_kind_name(TaskKind k) {
  constexpr std::array<std::string_view, 5> n{"A", "S", "D", "E", "C"};
  return n[static_cast<std::size_t>(k)];
}

struct Task {
  TaskKind kind = TaskKind::attention;
  Resource resource = Resource::ag;
  double duration = 0;
  std::vector<int> deps;  ///< tasks that must finish first
  int layer = 0, mb = 0, chunk = 0;
  double start = -1, end = -1;  ///< filled by simulate()
};

/// Tasks plus the order in which each resource runs its tasks.
struct TaskGraph {
  std::vector<Task> tasks;
  std::array<std::vector<int>, resource_count> order;

  /// Appends a task at the end of its resource's order; returns its id.
  int add(TaskKind kind, Resource r, double duration, std::vector<int> deps = {}, int layer = 0, int mb = 0,
          int chunk = 0) {
    check(duration >= 0 && std::isfinite(duration), "simulator: task duration must be finite and non-negative, got ",
          duration);
    int id = static_cast<int>(tasks.size());
    for (int d : deps)
      check(d >= 0 && d < id, "simulator: task ", id, " depends on unknown task ", d);
    tasks.push_back(Task{kind, r, duration, std::move(deps), layer, mb, chunk});
    order[static_cast<std::size_t>(r)].push_back(id);
    return id;
  }
};

/// Result of a simulation: the makespan and how long each resource was busy.
struct SimResult {
  double makespan = 0;
  std::array<double, resource_count> busy{};
};

[[nodiscard]] inline std::string describe(Task const& t) {
  return detail::concat(task_kind_name(t.kind), "(layer ", t.layer, ", mb ", t.mb, ", chunk ", t.chunk, ")");
}

/// Runs the graph; fills every task's start and end. Throws moe::Error when the resource orders
/// contradict the dependencies (the schedule would deadlock).
inline SimResult simulate(TaskGraph& g) {
  std::size_t n = g.tasks.size();
  std::vector<int> waiting(n, 0);
  std::vector<std::vector<int>> dependents(n);
  std::vector<char> listed(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    g.tasks[i].start = g.tasks[i].end = -1;
    // Tasks may be filled in directly (the fields are public), so add()'s checks are repeated here.
    double du = g.tasks[i].duration;
    check(du >= 0 && std::isfinite(du), "simulator: task ", i, " has duration ", du,
          "; it must be finite and non-negative");
    waiting[i] = static_cast<int>(g.tasks[i].deps.size());
    for (int d : g.tasks[i].deps) {
      check(d >= 0 && static_cast<std::size_t>(d) < n, "simulator: task ", i, " depends on unknown task ", d);
      dependents[static_cast<std::size_t>(d)].push_back(static_cast<int>(i));
    }
  }
  for (auto const& o : g.order)
    for (int id : o) {
      check(id >= 0 && static_cast<std::size_t>(id) < n && !listed[static_cast<std::size_t>(id)],
            "simulator: task ", id, " is missing or listed twice in the resource orders");
      listed[static_cast<std::size_t>(id)] = 1;
    }
  for (std::size_t i = 0; i < n; ++i)
    check(listed[i], "simulator: task ", i, " is on no resource");

  std::array<std::size_t, resource_count> head{};
  std::array<bool, resource_count> idle{true, true, true, true};
  using Event = std::pair<double, int>;  // (end time, task)
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  SimResult res;
  std::size_t done = 0;

  auto try_start = [&](int r, double now) {
    auto& o = g.order[static_cast<std::size_t>(r)];
    if (!idle[static_cast<std::size_t>(r)] || head[static_cast<std::size_t>(r)] >= o.size()) return;
    int id = o[head[static_cast<std::size_t>(r)]];
    if (waiting[static_cast<std::size_t>(id)] > 0) return;
    Task& t = g.tasks[static_cast<std::size_t>(id)];
    t.start = now;
    t.end = now + t.duration;
    idle[static_cast<std::size_t>(r)] = false;
    events.emplace(t.end, id);
  };
  for (int r = 0; r < resource_count; ++r) try_start(r, 0.0);
  while (!events.empty()) {
    auto [now, id] = events.top();
    events.pop();
    Task const& t = g.tasks[static_cast<std::size_t>(id)];
    auto r = static_cast<std::size_t>(t.resource);
    idle[r] = true;
    ++head[r];
    res.busy[r] += t.duration;
    res.makespan = std::max(res.makespan, now);
    ++done;
    for (int d : dependents[static_cast<std::size_t>(id)]) --waiting[static_cast<std::size_t>(d)];
    for (int q = 0; q < resource_count; ++q) try_start(q, now);
  }
  if (done != n) {
    std::string heads;
    for (int r = 0; r < resource_count; ++r) {
      auto& o = g.order[static_cast<std::size_t>(r)];
      if (head[static_cast<std::size_t>(r)] < o.size())
        heads += detail::concat(" ", resource_name(static_cast<Resource>(r)), " waits at ",
                                describe(g.tasks[static_cast<std::size_t>(o[head[static_cast<std::size_t>(r)]])]), ";");
    }
    fail("simulator: schedule deadlocks after ", done, " of ", n,
         " tasks: the resource orders contradict the dependencies:", heads);
  }
  return res;
}

/// Builds the task graph of `c` for `layers` layers with the given stage durations.
[[nodiscard]] inline TaskGraph build_tasks(StageTimes const& t, Config const& c, int layers) {
  check(layers >= 1, "simulator: layers must be at least 1, got ", layers);
  check(c.r1 >= 1 && c.r2 >= 1, "simulator: r1 and r2 must be at least 1, got ", c.r1, " and ", c.r2);
  check(c.pipeline == Pipeline::findep || c.r2 == 1, "simulator: PPPipe has no token chunks (r2 = ", c.r2, ")");
  TaskGraph g;
  auto r1 = static_cast<std::size_t>(c.r1);
  std::vector<int> A(r1), S(r1, -1), prevS(r1, -1);
  std::vector<std::vector<int>> prevC(r1);
  for (int l = 0; l < layers; ++l) {
    auto attention = [&](std::size_t i) {
      std::vector<int> deps = prevC[i];
      if (prevS[i] >= 0) deps.push_back(prevS[i]);
      A[i] = g.add(TaskKind::attention, Resource::ag, t.attention, std::move(deps), l, static_cast<int>(i));
    };
    auto shared = [&](std::size_t i) {
      S[i] = g.add(TaskKind::shared, Resource::ag, t.shared, {A[i]}, l, static_cast<int>(i));
    };
    // PPPipe runs the shared expert as part of attention, so AG order is always A S A S.
    bool alternate = c.order == Order::asas || c.pipeline == Pipeline::pppipe;
    if (!t.has_shared) {
      for (std::size_t i = 0; i < r1; ++i) attention(i);
    } else if (alternate) {
      for (std::size_t i = 0; i < r1; ++i) { attention(i); shared(i); }
    } else {
      for (std::size_t i = 0; i < r1; ++i) attention(i);
      for (std::size_t i = 0; i < r1; ++i) shared(i);
    }
    for (std::size_t i = 0; i < r1; ++i) {
      int release = (c.pipeline == Pipeline::pppipe && t.has_shared) ? S[i] : A[i];
      prevC[i].clear();
      for (int j = 0; j < c.r2; ++j) {
        int mb = static_cast<int>(i);
        int d = g.add(TaskKind::a2e, Resource::a2e, t.a2e, {release}, l, mb, j);
        int e = g.add(TaskKind::experts, Resource::eg, t.experts, {d}, l, mb, j);
        int x = g.add(TaskKind::e2a, Resource::e2a, t.e2a, {e}, l, mb, j);
        prevC[i].push_back(x);
      }
      prevS[i] = t.has_shared ? S[i] : -1;
    }
  }
  return g;
}

/// Simulates configuration `c` of problem `p` with models `m`; `layers` = 0 takes the problem's.
[[nodiscard]] inline SimResult simulate(Problem const& p, PerfModels const& m, Config const& c, int layers = 0) {
  validate(p, c);
  TaskGraph g = build_tasks(stage_times(p, m, c), c, layers > 0 ? layers : layers_of(p));
  return simulate(g);
}

}  // namespace moe::schedule
