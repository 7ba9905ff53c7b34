#pragma once
// Re-planning while serving (LayerOptions::live, moe/layer/live.hpp) on 4 ranks: OLMoE's routing
// shape (64 experts, top-8) at reduced width, with routing that drifts (seeded: each pass's tokens
// lean towards a few "hot" experts, and the hot set moves every 25 passes). Every pass is checked
// against the single-process reference on all tokens; the bytes the migrations send are checked
// against the plans the layer switched to (each (expert, rank) pair a plan adds is one expert's
// weights crossing ranks). Shared by the in-process and the MPI tests.

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "layer_check.hpp"
#include "moe/layer/live.hpp"
#include "moe/schedule/disaggregated.hpp"
#include "sanitized.hpp"

namespace moe::test {

using LiveModel = models::Reduced<models::OLMoE_1B_7B, 32, 16, DType::f32>;
constexpr int live_ranks = 4;
constexpr int live_tokens = 8;  // per rank and pass

// Passes of the host drifting loops (test_live_layer.cpp, test_live_disaggregated.cpp), and the
// plans they adopt at least. Under a sanitizer 60 (sanitized.hpp): the re-plans started before
// passes 20 and 40 are adopted by pass 45, each after its moves, so 2 plans, the second moving from
// a plan that is not the first, with 15 passes to spare.
constexpr int loop_passes = full_or(200, 60);
constexpr int loop_adopted = full_or(3, 2);
/// Their serving options: a re-plan every 20 passes from a window of 20, 3 spare slots, 4 KiB of
/// expert weights moved per pass.
constexpr live::Options serving{.window = 20, .replan_every = 20, .spare_slots = 3, .migration_bytes_per_pass = 4096};

/// The first plan: expert e on rank e % 4, experts 0-15 also on rank (e + 1) % 4 (20 per rank).
inline std::vector<std::vector<int>> live_copies() {
  std::vector<std::vector<int>> c(64);
  for (int e = 0; e < 64; ++e) {
    c[static_cast<std::size_t>(e)] = {e % 4};
    if (e < 16) c[static_cast<std::size_t>(e)].push_back((e + 1) % 4);
    std::sort(c[static_cast<std::size_t>(e)].begin(), c[static_cast<std::size_t>(e)].end());
  }
  return c;
}
inline std::vector<int> live_primary() {
  std::vector<int> p(64);
  for (int e = 0; e < 64; ++e) p[static_cast<std::size_t>(e)] = e % 4;
  return p;
}

/// The global batch of pass p (all ranks' tokens, seeded): N(0, 1) plus 3x the router row of one
/// of the pass's hot experts (6 of them, moving by 7 every 25 passes), so the hot experts are chosen
/// far more often than the rest.
inline std::vector<float> live_batch(RandomLayerWeights<float> const& w, int pass) {
  constexpr int h = LiveModel::spec.hidden, n = live_ranks * live_tokens;
  auto x = random_tokens<float>(n, h, 5000 + static_cast<std::uint64_t>(pass));
  auto view = w.view();
  for (int t = 0; t < n; ++t) {
    int hot = ((pass / 25) * 7 + t % 6) % 64;
    for (int i = 0; i < h; ++i)
      x[static_cast<std::size_t>(t * h + i)] += 3.0f * static_cast<float>(h) *
                                                view.router[static_cast<std::size_t>(hot * h + i)];
  }
  return x;
}

/// (expert, rank) pairs a plan holds that the previous one did not.
inline long long added_copies(live::Plan const& from, live::Plan const& to) {
  long long n = 0;
  for (std::size_t e = 0; e < to.copies.size(); ++e)
    for (int r : to.copies[e]) n += std::find(from.copies[e].begin(), from.copies[e].end(), r) == from.copies[e].end();
  return n;
}

struct LiveRun {
  double worst_error = 0;       // over every pass
  long long bytes_sent = 0;     // migration bytes this rank sent
  long long plan_bytes = 0;     // bytes of plan layouts this rank sent (live.plan_rank)
  long long expected_bytes = 0;  // expert bytes of the copies the adopted plans added (all ranks)
  int adopted = 0;
  int changed = 0;              // adoptions after which layer.plan() differs from the plan before
  int changed_stat = 0;         // the layer's stats().plans_changed after the last pass
  int passes_moving = 0;        // passes during which a migration was under way
  bool window_counts_ok = true;  // the window's per-expert pairs equal the reference's routes
  std::vector<std::string> errors;  // what run() threw, per pass that threw
};

/// One rank's live layer over the drifting routing. Schedule::Sequential: every rank holds tokens
/// (live_tokens) and experts. A disaggregated schedule (schedule::FinDep, PPPipe): ranks [0, ag)
/// hold the pass's tokens (live_ranks x live_tokens, split evenly), ranks [ag, ag + live_ranks)
/// the experts, with the same plans over EG indices.
template <class Comm, class Replicas = replication::Table, class Schedule = schedule::Sequential>
struct LiveHarness {
  using L = Layer<LiveModel, router::SoftmaxTopK, placement::Table, Replicas, Schedule, Comm>;
  static constexpr ShapeSpec s = LiveModel::spec;
  static constexpr auto h = static_cast<std::size_t>(s.hidden);
  static constexpr bool disaggregated = schedule::DisaggregatedPolicy<Schedule>;

  Comm& comm;
  int ag = 0;           // ranks that hold tokens but no experts (disaggregated)
  int token_ranks = 0;  // ranks that hold tokens
  int tokens = 0;       // per token rank and pass
  RandomLayerWeights<float> weights{s, 77};
  std::vector<ExpertWeights<float>> local;
  std::vector<float> arena;
  std::vector<std::byte> ws;
  L layer;

  LiveHarness(Comm& c, Replicas replicas, live::Options o, Schedule sched = {})
      : comm(c), ag(ag_of(sched)), token_ranks(ag > 0 ? ag : live_ranks), tokens(live_ranks * live_tokens / token_ranks),
        local(weights.experts_where([&](int e) { return c.rank() >= ag && replicas.holds(e, 0, c.rank() - ag); })),
        layer(c, placement::Table(live_primary()), std::move(replicas), with_local(weights.view()),
              {.max_tokens = tokens, .schedule = sched, .live = o}) {
    arena.resize(layer.arena_elements());
    layer.attach_arena(arena);
    local.clear();  // the layer reads its experts from the arena now
    ws.resize(layer.workspace_size());
  }

  static int ag_of(Schedule const& sched) {
    if constexpr (disaggregated)
      return sched.ag;
    else
      return 0;
  }

  LayerWeights<float> with_local(LayerWeights<float> v) const {
    v.experts = local;
    return v;
  }

  /// One pass; returns the error against the reference (0 on a rank without tokens), or -1 if
  /// run() threw (message kept).
  double pass(int p, LiveRun& out) {
    auto x = live_batch(weights, p);
    int n = live_ranks * live_tokens;
    std::vector<float> ref(x.size());
    std::vector<int> ids(static_cast<std::size_t>(n * s.top_k));
    std::vector<float> gw(ids.size());
    reference_forward<router::SoftmaxTopK>(s, weights.view(), n, x.data(), ref.data(), ids, gw);
    bool holds = comm.rank() < token_ranks;
    int mine_tokens = holds ? tokens : 0;
    std::size_t first = holds ? static_cast<std::size_t>(comm.rank() * tokens) * h : 0;
    std::vector<float> y(static_cast<std::size_t>(mine_tokens) * h);
    try {
      float const* in = holds ? x.data() + first : nullptr;
      float* to = holds ? y.data() : nullptr;
      if constexpr (disaggregated)
        layer.run({.tokens = mine_tokens, .x = in, .y = to}, ws);
      else
        layer.run({.tokens = mine_tokens, .x = in, .y = to, .first_token = comm.rank() * tokens}, ws);
    } catch (Error const& e) {
      out.errors.emplace_back(e.what());
      return -1;
    }
    std::vector<float> mine(ref.begin() + static_cast<std::ptrdiff_t>(first),
                            ref.begin() + static_cast<std::ptrdiff_t>(first + y.size()));
    double err = holds ? max_relative_error(y, mine) : 0.0;
    out.worst_error = std::max(out.worst_error, err);
    out.bytes_sent += static_cast<long long>(layer.stats().migration_bytes);
    out.plan_bytes += static_cast<long long>(layer.stats().plan_bytes);
    // The window's newest pass: the pairs of each expert, as the reference routed them.
    auto const& w = layer.load_window();
    auto got = w.experts(w.size() - 1);
    std::vector<long long> want(static_cast<std::size_t>(s.experts), 0);
    for (int e : ids) ++want[static_cast<std::size_t>(e)];
    out.window_counts_ok = out.window_counts_ok && std::equal(got.begin(), got.end(), want.begin());
    return err;
  }

  /// `passes` passes; plans the layer switches to are compared with the one before.
  LiveRun serve(int first, int passes) {
    LiveRun out;
    live::Plan before = layer.plan();
    for (int p = first; p < first + passes; ++p) {
      out.passes_moving += layer.migrating();
      pass(p, out);
      if (layer.stats().plans_adopted > out.adopted) {
        live::Plan now = layer.plan();
        out.expected_bytes += added_copies(before, now) * static_cast<long long>(live::slot_bytes<float>(s));
        out.changed += now != before;  // plan() lists each expert's copies in rank order
        before = std::move(now);
        out.adopted = layer.stats().plans_adopted;
      }
    }
    out.changed_stat = layer.stats().plans_changed;
    return out;
  }
};

/// The drifting loop's checks over every rank's run: no error, every pass at the reference, the
/// window's counts, the same plans adopted everywhere, at least `min_adopted` of them, each migrated
/// over several passes, and the migration bytes of all ranks equal to the copies the plans added.
/// Ranks [0, ag) (a disaggregated layer's attention ranks) must have sent no weights.
inline void check_live_loop(std::span<LiveRun const> runs, int min_adopted, int ag = 0) {
  long long sent = 0;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    INFO("rank " << r);
    auto const& x = runs[r];
    CHECK(x.errors.empty());
    CHECK(x.worst_error <= 1e-5);
    CHECK(x.window_counts_ok);
    CHECK(x.adopted == runs[0].adopted);
    CHECK(x.changed == runs[0].changed);
    CHECK(x.changed_stat == x.changed);
    CHECK(x.expected_bytes == runs[0].expected_bytes);
    if (static_cast<int>(r) < ag) CHECK(x.bytes_sent == 0);
    sent += x.bytes_sent;
  }
  // The drift makes the re-planner move experts several times, over several passes each.
  CHECK(runs[0].adopted >= min_adopted);
  CHECK(runs[0].passes_moving > 2 * runs[0].adopted);
  CHECK(sent == runs[0].expected_bytes);
  CHECK(sent > 0);
}

/// One process's run of the drifting loop (MPI tests): no error, every pass at the reference, the
/// window's counts, at least `min_adopted` plans; every rank's migration bytes, all-gathered over
/// `comm` (returned, by rank), sum to the copies the plans added.
template <class Comm>
std::vector<long long> check_process_run(Comm& comm, LiveRun const& run, int min_adopted) {
  CHECK(run.errors.empty());
  CHECK(run.worst_error <= 1e-5);
  CHECK(run.window_counts_ok);
  CHECK(run.adopted >= min_adopted);
  std::vector<long long> all(static_cast<std::size_t>(comm.size()));
  std::vector<std::size_t> sizes(all.size(), sizeof(long long));
  comm.all_gather_v(std::as_bytes(std::span(&run.bytes_sent, 1)), std::as_writable_bytes(std::span(all)), sizes);
  long long sent = 0;
  for (long long b : all) sent += b;
  CHECK(sent == run.expected_bytes);
  CHECK(sent > 0);
  return all;
}

/// live.plan_rank = r: rank r alone sent layouts, each `share` bytes (one layout to every other rank).
inline void check_plan_bytes(LiveRun const& run, int rank, int plan_rank, long long share) {
  if (plan_rank < 0) return;
  if (rank == plan_rank) {
    CHECK(run.plan_bytes > 0);
    CHECK(run.plan_bytes % share == 0);
  } else {
    CHECK(run.plan_bytes == 0);
  }
}

/// Replicas of the first plan.
inline replication::Table live_table() { return replication::Table(live_copies()); }
inline replication::BatchSplit live_split() {
  return replication::BatchSplit(live_copies(), std::vector<int>{0, 0, 1, 1});
}

/// What every rank saw when a re-plan met a planted fault (fault_loop).
template <int N>
struct FaultOutcome {
  std::array<LiveRun, N> runs;         // the passes up to and including the one that threw
  std::array<bool, N> same_plan{};     // the plan after the fault is the one before the re-plan
  std::array<bool, N> still{};         // no migration under way, no plan adopted
  std::array<double, N> after{};       // the error of one more pass against the reference
};

/// N in-process ranks serve 20 passes, start a re-plan together, and serve on until run() throws
/// (at most 200 passes); rank `faulty` throws at its first `step` of the migration. Under a
/// sanitizer 10 passes first: the same hot experts, and a re-plan that still moves weights (after 5
/// passes it moves none, and a fault after the plan step never fires).
template <int N, class Schedule = schedule::Sequential>
FaultOutcome<N> fault_loop(live::Step step, int faulty, live::Options o, Schedule sched = {}) {
  FaultOutcome<N> out;
  o.replan_every = 0;
  collective::run_in_process<N>([&](auto& comm) {
    bool fired = false;  // outlives the layer, whose re-planner thread may call the hook
    LiveHarness<std::remove_reference_t<decltype(comm)>, replication::Table, Schedule> hx(comm, live_table(), o, sched);
    auto const r = static_cast<std::size_t>(comm.rank());
    auto& run = out.runs[r];
    if (comm.rank() == faulty)
      hx.layer.set_fault_hook([&fired, step](live::Step s) {
        if (s == step && !fired) {
          fired = true;
          throw Error("planted fault");
        }
      });
    int p = full_or(20, 10);
    for (int q = 0; q < p; ++q) hx.pass(q, run);
    live::Plan before = hx.layer.plan();
    hx.layer.replan();
    while (run.errors.empty() && p < 200) hx.pass(p++, run);
    out.same_plan[r] = hx.layer.plan() == before;
    out.still[r] = !hx.layer.migrating() && hx.layer.stats().plans_adopted == 0;
    LiveRun next;
    out.after[r] = hx.pass(p, next);
  });
  return out;
}

/// Every rank threw the same error once, naming rank `faulty`'s failed re-plan; the passes before
/// it and the one after equal the reference, on the old plan.
template <int N>
void check_fault(FaultOutcome<N> const& f, int faulty) {
  std::string const who = "rank " + std::to_string(faulty) + "'s re-plan failed";
  for (std::size_t r = 0; r < N; ++r) {
    INFO("rank " << r);
    auto const& x = f.runs[r];
    REQUIRE(x.errors.size() == 1);
    CHECK(x.errors[0] == f.runs[0].errors[0]);
    CHECK_THAT(x.errors[0], Catch::Contains(who) && Catch::Contains("planted fault"));
    CHECK(x.worst_error <= 1e-5);
    CHECK(f.same_plan[r]);
    CHECK(f.still[r]);
    CHECK(f.after[r] >= 0);
    CHECK(f.after[r] <= 1e-5);
  }
}

}  // namespace moe::test
