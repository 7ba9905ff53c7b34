// Stream/event plan of a FinDEP / PPPipe schedule against the simulator's task graph (the
// independent reference: build_tasks() encodes the dependencies of section 3.2 on its own):
//   (a) every dependency of the task graph is enforced by a wait, directly or through stream order
//   (b) no wait refers to an event recorded later in its own stream or forms a cycle: a CPU
//       stream/event machine runs the plan to completion, and the host enqueue order records every
//       event before a wait on it is enqueued
//   (c) each stream runs the simulator's per-resource order
//   (d) the machine, with the simulator's durations, starts every operation when the simulator
//       starts its task, so the makespans agree (also against schedule::simulate(problem, ...))
// for both pipelines, both orders, with and without shared experts, r1 and r2 in 1..4, 1-3 layers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>

#include "moe/models/models.hpp"
#include "moe/schedule/perf_model.hpp"
#include "moe/schedule/simulator.hpp"
#include "moe/schedule/stream_plan.hpp"

using namespace moe::schedule;

namespace {

using Key = std::tuple<int, int, int, int>;  // kind, layer, mb, chunk
Key key_of(Task const& t) { return {static_cast<int>(t.kind), t.layer, t.mb, t.chunk}; }
Key key_of(PlanOp const& o) { return {static_cast<int>(o.kind), o.layer, o.mb, o.chunk}; }

/// Flat numbering of the plan's operations.
struct Nodes {
  std::array<int, resource_count> base{};
  int n = 0;
  explicit Nodes(StreamPlan const& p) {
    for (std::size_t r = 0; r < resource_count; ++r) {
      base[r] = n;
      n += static_cast<int>(p.ops[r].size());
    }
  }
  int id(Resource r, int index) const { return base[static_cast<std::size_t>(r)] + index; }
};

/// Happens-before of the plan: reach[u][v] when operation u finishes before v starts, through
/// stream order and event waits (computed by graph search, independent of the plan's clocks).
std::vector<std::vector<char>> happens_before(StreamPlan const& p) {
  Nodes nodes(p);
  std::vector<std::vector<int>> next(static_cast<std::size_t>(nodes.n));
  for (std::size_t r = 0; r < resource_count; ++r) {
    auto const& ops = p.ops[r];
    for (std::size_t i = 0; i < ops.size(); ++i) {
      int v = nodes.id(static_cast<Resource>(r), static_cast<int>(i));
      if (i > 0) next[static_cast<std::size_t>(v - 1)].push_back(v);
      for (int w : ops[i].waits) {
        PlanEvent e = p.events.at(static_cast<std::size_t>(w));
        next[static_cast<std::size_t>(nodes.id(e.stream, e.index))].push_back(v);
      }
    }
  }
  std::vector<std::vector<char>> reach(static_cast<std::size_t>(nodes.n),
                                       std::vector<char>(static_cast<std::size_t>(nodes.n), 0));
  for (int s = 0; s < nodes.n; ++s) {
    std::vector<int> stack{s};
    auto& row = reach[static_cast<std::size_t>(s)];
    while (!stack.empty()) {
      int u = stack.back();
      stack.pop_back();
      for (int v : next[static_cast<std::size_t>(u)])
        if (!row[static_cast<std::size_t>(v)]) {
          row[static_cast<std::size_t>(v)] = 1;
          stack.push_back(v);
        }
    }
  }
  return reach;
}

/// CPU stream/event machine: each stream runs its operations in order; an operation starts when
/// its stream is free and every event it waits on has been recorded (at the end of the recording
/// operation). Streams advance independently, not in the plan's launch order.
struct MachineRun {
  bool completed = false;
  double makespan = 0;
  std::map<Key, double> start;
};

double duration(StageTimes const& t, TaskKind k) {
  switch (k) {
    case TaskKind::attention: return t.attention;
    case TaskKind::shared: return t.shared;
    case TaskKind::a2e: return t.a2e;
    case TaskKind::experts: return t.experts;
    case TaskKind::e2a: return t.e2a;
  }
  return 0;
}

MachineRun run_machine(StreamPlan const& p, StageTimes const& t) {
  std::vector<double> recorded(p.events.size(), -1.0);
  std::array<std::size_t, resource_count> head{};
  std::array<double, resource_count> free{};
  MachineRun m;
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t r = 0; r < resource_count; ++r) {
      auto const& ops = p.ops[r];
      while (head[r] < ops.size()) {
        PlanOp const& o = ops[head[r]];
        double start = free[r];
        bool ready = true;
        for (int w : o.waits) {
          double at = recorded.at(static_cast<std::size_t>(w));
          if (at < 0) ready = false;
          start = std::max(start, at);
        }
        if (!ready) break;
        double end = start + duration(t, o.kind);
        free[r] = end;
        if (o.record >= 0) recorded[static_cast<std::size_t>(o.record)] = end;
        m.start[key_of(o)] = start;
        m.makespan = std::max(m.makespan, end);
        ++head[r];
        progress = true;
      }
    }
  }
  m.completed = true;
  for (std::size_t r = 0; r < resource_count; ++r) m.completed &= head[r] == p.ops[r].size();
  return m;
}

/// (a): every dependency of the task graph is enforced in the plan. Returns the first violation.
std::string missing_dependency(StreamPlan const& p, TaskGraph const& g) {
  Nodes nodes(p);
  std::map<Key, int> node_of;
  for (std::size_t r = 0; r < resource_count; ++r)
    for (std::size_t i = 0; i < p.ops[r].size(); ++i)
      node_of[key_of(p.ops[r][i])] = nodes.id(static_cast<Resource>(r), static_cast<int>(i));
  auto reach = happens_before(p);
  for (Task const& v : g.tasks)
    for (int d : v.deps) {
      Task const& u = g.tasks[static_cast<std::size_t>(d)];
      if (!node_of.count(key_of(u)) || !node_of.count(key_of(v))) return "task missing from the plan";
      if (!reach[static_cast<std::size_t>(node_of[key_of(u)])][static_cast<std::size_t>(node_of[key_of(v)])])
        return describe(v) + " may start before " + describe(u);
    }
  return {};
}

/// (b), enqueue side: the launch order lists every operation once, and each wait's event is
/// recorded by an operation enqueued earlier. Also: the recording operation of an event is the one
/// the event table names, and no wait names its own stream's later operation.
std::string bad_launch_order(StreamPlan const& p) {
  Nodes nodes(p);
  std::vector<char> launched(static_cast<std::size_t>(nodes.n), 0);
  if (p.launch.size() != static_cast<std::size_t>(nodes.n)) return "launch order does not list every operation";
  for (std::size_t e = 0; e < p.events.size(); ++e)
    if (p.op({p.events[e].stream, p.events[e].index}).record != static_cast<int>(e))
      return "event table and recording operation disagree";
  for (LaunchStep s : p.launch) {
    int id = nodes.id(s.stream, s.index);
    if (launched[static_cast<std::size_t>(id)]) return "operation launched twice";
    if (s.index > 0 && !launched[static_cast<std::size_t>(id - 1)]) return "stream order not kept";
    for (int w : p.op(s).waits) {
      PlanEvent e = p.events.at(static_cast<std::size_t>(w));
      if (e.stream == s.stream && e.index >= s.index) return "wait on an event recorded later in its own stream";
      if (!launched[static_cast<std::size_t>(nodes.id(e.stream, e.index))])
        return "wait enqueued before its event is recorded";
    }
    launched[static_cast<std::size_t>(id)] = 1;
  }
  return {};
}

StageTimes random_times(std::mt19937& rng, bool shared) {
  std::uniform_real_distribution<double> u(0.5, 20.0);
  StageTimes t;
  t.attention = u(rng);
  t.has_shared = shared;
  t.shared = shared ? u(rng) : 0;
  t.a2e = u(rng);
  t.experts = u(rng);
  t.e2a = u(rng);
  return t;
}

void check_plan(Config const& c, StageTimes const& t, int layers) {
  INFO(pipeline_name(c.pipeline) << " " << order_name(c.order) << " r1 " << c.r1 << " r2 " << c.r2 << " layers "
                                 << layers << " shared " << t.has_shared);
  StreamPlan p = build_stream_plan(c, t.has_shared, layers);
  TaskGraph g = build_tasks(t, c, layers);
  // (c) per-stream order = per-resource order.
  for (std::size_t r = 0; r < resource_count; ++r) {
    REQUIRE(p.ops[r].size() == g.order[r].size());
    for (std::size_t i = 0; i < p.ops[r].size(); ++i) {
      CHECK(p.ops[r][i].stream == static_cast<Resource>(r));
      CHECK(key_of(p.ops[r][i]) == key_of(g.tasks[static_cast<std::size_t>(g.order[r][i])]));
    }
  }
  // (a)
  CHECK(missing_dependency(p, g).empty());
  // (b)
  CHECK(bad_launch_order(p).empty());
  MachineRun m = run_machine(p, t);
  REQUIRE(m.completed);
  // (d) the same start for every operation, hence the same makespan.
  SimResult sim = simulate(g);
  CHECK(m.makespan == Approx(sim.makespan).epsilon(1e-12));
  for (Task const& task : g.tasks) CHECK(m.start.at(key_of(task)) == Approx(task.start).epsilon(1e-12));
  // Waits stay within the plan's own bound on events.
  CHECK(static_cast<long long>(p.events.size()) <= max_plan_events(c.r1, c.r2, t.has_shared, layers));
}

}  // namespace

TEST_CASE("stream plan enforces the simulator's dependencies and reproduces its schedule", "[schedule][plan]") {
  std::mt19937 rng(2026);
  for (Pipeline pipe : {Pipeline::findep, Pipeline::pppipe})
    for (Order order : {Order::aass, Order::asas})
      for (bool shared : {true, false})
        for (int layers = 1; layers <= 3; ++layers)
          for (int r1 = 1; r1 <= 4; ++r1)
            for (int r2 = 1; r2 <= 4; ++r2) {
              Config c{pipe, order, r1, 1, r2};
              if (pipe == Pipeline::pppipe && r2 > 1) {
                CHECK_THROWS_WITH(build_stream_plan(c, shared, layers), Catch::Contains("PPPipe has no token chunks"));
                continue;
              }
              check_plan(c, random_times(rng, shared), layers);
              // Equal durations make many ties: the machine must still match the simulator.
              StageTimes eq;
              eq.attention = eq.a2e = eq.experts = eq.e2a = 1.0;
              eq.has_shared = shared;
              eq.shared = shared ? 1.0 : 0.0;
              check_plan(c, eq, layers);
            }
}

TEST_CASE("stream plan makespan equals schedule::simulate on model problems", "[schedule][plan]") {
  PerfModels m = h100_cluster_reference();
  for (moe::ShapeSpec shape : {moe::models::DeepSeekV2::spec, moe::models::Mixtral8x7B::spec}) {
    Problem p;
    p.shape = shape;
    p.ag = 4;
    p.eg = 4;
    p.seq = 1536;  // divisible by r2 = 1..4
    p.memory_bytes = 200e9;
    p.layers = 2;
    for (Pipeline pipe : {Pipeline::findep, Pipeline::pppipe})
      for (Order order : {Order::aass, Order::asas})
        for (int r1 = 1; r1 <= 4; ++r1)
          for (int r2 = 1; r2 <= (pipe == Pipeline::findep ? 4 : 1); ++r2) {
            Config c{pipe, order, r1, 1, r2};
            INFO("shared experts " << shape.shared_experts << " " << pipeline_name(pipe) << " " << order_name(order) << " r1 " << r1 << " r2 " << r2);
            StageTimes t = stage_times(p, m, c);
            StreamPlan plan = build_stream_plan(c, t.has_shared, p.layers);
            MachineRun run = run_machine(plan, t);
            REQUIRE(run.completed);
            CHECK(run.makespan == Approx(simulate(p, m, c).makespan).epsilon(1e-12));
          }
  }
}

TEST_CASE("stream plan waits only where stream order does not already imply the dependency", "[schedule][plan]") {
  // FinDEP with shared experts: per layer and micro-batch, the first A2E chunk waits on A, each
  // chunk's experts on its A2E, each chunk's E2A on its experts; A of the next layer on the last
  // E2A chunk of the same micro-batch. Nothing else.
  for (Order order : {Order::aass, Order::asas})
    for (int r1 = 1; r1 <= 4; ++r1)
      for (int r2 = 1; r2 <= 4; ++r2)
        for (int layers = 1; layers <= 2; ++layers) {
          StreamPlan p = build_stream_plan({Pipeline::findep, order, r1, 1, r2}, true, layers);
          long long expect = static_cast<long long>(layers) * r1 * (1 + 2LL * r2) + static_cast<long long>(layers - 1) * r1;
          CHECK(static_cast<long long>(p.wait_count()) == expect);
          for (PlanOp const& o : p.stream(Resource::a2e)) CHECK(o.waits.size() == (o.chunk == 0 ? 1u : 0u));
          for (PlanOp const& o : p.stream(Resource::ag))
            if (o.kind == TaskKind::shared) CHECK(o.waits.empty());
        }
  // PPPipe: the A2E waits on S, not on A.
  StreamPlan pp = build_stream_plan({Pipeline::pppipe, Order::asas, 3, 1, 1}, true, 1);
  for (PlanOp const& o : pp.stream(Resource::a2e)) {
    REQUIRE(o.waits.size() == 1u);
    PlanEvent e = pp.events[static_cast<std::size_t>(o.waits[0])];
    CHECK(pp.op({e.stream, e.index}).kind == TaskKind::shared);
    CHECK(pp.op({e.stream, e.index}).mb == o.mb);
  }
  std::string text = format_plan(pp);
  CHECK(text.find("AG: A(l0,mb0)->e0 S(l0,mb0)") == std::string::npos);  // A is not waited on in PPPipe
  CHECK(text.find("A2E: [wait e0] D(l0,mb0,c0)") != std::string::npos);
}

TEST_CASE("the checks catch a broken plan", "[schedule][plan]") {
  // Guards against checks that cannot fail: drop one wait, or make a stream wait on itself.
  Config c{Pipeline::findep, Order::aass, 2, 1, 3};
  StageTimes t;
  t.attention = 3;
  t.shared = 2;
  t.has_shared = true;
  t.a2e = 1;
  t.experts = 4;
  t.e2a = 1;
  TaskGraph g = build_tasks(t, c, 2);
  StreamPlan p = build_stream_plan(c, true, 2);
  REQUIRE(missing_dependency(p, g).empty());
  StreamPlan dropped = p;
  auto& eg = dropped.ops[static_cast<std::size_t>(Resource::eg)];
  REQUIRE(!eg[4].waits.empty());
  eg[4].waits.clear();  // E(l0,mb1,c1) no longer waits for its A2E
  CHECK_FALSE(missing_dependency(dropped, g).empty());

  StreamPlan self = p;
  auto& ag = self.ops[static_cast<std::size_t>(Resource::ag)];
  int e = static_cast<int>(self.events.size());
  ag[1].record = e;  // A(l0,mb1) records a new event ...
  self.events.push_back({Resource::ag, 1});
  ag[0].waits.push_back(e);  // ... which A(l0,mb0), earlier on the same stream, waits for
  CHECK_FALSE(run_machine(self, t).completed);
  CHECK_FALSE(bad_launch_order(self).empty());
}

TEST_CASE("stream plan rejects bad input", "[schedule][plan][bad-input]") {
  CHECK_THROWS_WITH(build_stream_plan({Pipeline::findep, Order::asas, 0, 1, 1}, true),
                    Catch::Contains("r1 (micro-batches) must be at least 1, got 0"));
  CHECK_THROWS_WITH(build_stream_plan({Pipeline::findep, Order::asas, 2, 1, 0}, true),
                    Catch::Contains("r2 (token chunks) must be at least 1, got 0"));
  CHECK_THROWS_WITH(build_stream_plan({Pipeline::findep, Order::asas, 2, 1, -3}, false),
                    Catch::Contains("r2 (token chunks) must be at least 1, got -3"));
  CHECK_THROWS_WITH(build_stream_plan({Pipeline::pppipe, Order::aass, 2, 1, 2}, true),
                    Catch::Contains("PPPipe has no token chunks; r2 must be 1, got 2"));
  CHECK_THROWS_WITH(build_stream_plan({Pipeline::findep, Order::asas, 2, 1, 1}, true, 0),
                    Catch::Contains("layers must be at least 1, got 0"));
  CHECK_THROWS_WITH(build_stream_plan({Pipeline::findep, Order::asas, 1 << 12, 1, 1 << 11}, true),
                    Catch::Contains("above the limit"));
  CHECK_THROWS_WITH(build_stream_plan({static_cast<Pipeline>(7), Order::asas, 1, 1, 1}, true),
                    Catch::Contains("unknown pipeline"));
  CHECK_THROWS_WITH(build_stream_plan({Pipeline::findep, static_cast<Order>(5), 1, 1, 1}, true),
                    Catch::Contains("unknown order"));
}
