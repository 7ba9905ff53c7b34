// Re-planning while serving on 4 in-process ranks (moe/layer/live.hpp): a drifting serving loop
// whose every pass equals the single-process reference while the layer re-plans and migrates
// expert weights; a fault planted at each step of a migration on one rank; plans that must be
// refused before any byte moves.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <filesystem>
#include <numeric>
#include <thread>

#if defined(__linux__)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

#include "live_layer_case.hpp"
#include "sanitized.hpp"

using namespace moe;
using namespace moe::test;

namespace {

/// In a layout of 4 ranks x 20 slots: rank r's slot holding `from` holds `to` instead.
void replace_on(std::vector<int>& layout, int r, int from, int to) {
  auto first = layout.begin() + 20 * r, last = first + 20;
  auto it = std::find(first, last, from);
  REQUIRE(it != last);
  *it = to;
}

// Recorded from the emulated NCCL test (test_live_cuda, 2 ranks, 40 slots each, 3 spare).
std::vector<float> const recorded_loads = {0,   0, 92,  2, 0, 36, 3,  2,  57, 0,   22, 114, 13, 10, 1,   0,
                                           211, 0, 0,   53, 2, 4,  1,  44, 7,  4,   10, 0,   93, 0,  9,   21,
                                           201, 3, 200, 4, 209, 0, 228, 4, 209, 0, 187, 34, 54, 0, 9,  43,
                                           0,   0, 229, 0, 0,  0,  2,  76, 0,  0,   0,  5,   0,  52, 0,   0};
std::vector<int> const recorded_layout = {
    0,  1,  2,  3,  5,  6,  7,  8,  12, 15, 16, 18, 20, 26, 30, 32, 34, 36, 38, 42,
    44, 46, 48, 50, 52, 54, 56, 58, 60, 62, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    4,  7,  9,  10, 11, 13, 14, 17, 19, 21, 22, 23, 24, 25, 26, 27, 28, 29, 31, 33,
    35, 37, 39, 40, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63, -1, -1, -1, -1};

// Passes served after a re-plan started between two passes (replan_between): its moves (at most
// spare_slots = 3 experts of 6 KiB, at 4 KiB a pass) end within a few passes; under a sanitizer 15.
constexpr int after_replan = full_or(40, 15);

template <class Replicas>
std::array<LiveRun, 4> serve_loop(Replicas (*make)(), int passes, live::Options o = serving) {
  std::array<LiveRun, 4> out;
  collective::run_in_process<4>([&](auto& comm) {
    LiveHarness<std::remove_reference_t<decltype(comm)>, Replicas> hx(comm, make(), o);
    out[static_cast<std::size_t>(comm.rank())] = hx.serve(0, passes);
  });
  return out;
}

void check_loop(std::array<LiveRun, 4> const& runs, int min_adopted = loop_adopted) {
  check_live_loop(runs, min_adopted);
}

}  // namespace

TEST_CASE("live layer: drifting passes (200), a re-plan every 20, every pass equals the reference",
          "[layer][live]") {
  check_loop(serve_loop(+[] { return live_table(); }, loop_passes));
}

TEST_CASE("live layer with the per-batch split: every pass equals the reference", "[layer][live][batch-split]") {
  check_loop(serve_loop(+[] { return live_split(); }, loop_passes));
}

TEST_CASE("live layer with the split-aware re-planner: every pass equals the reference",
          "[layer][live][batch-split]") {
  auto o = serving;
  o.planner = live::Planner::split_balance;
  o.tolerance_permille = 5;  // the least gain of a moved copy, in thousandths of max/mean
  check_loop(serve_loop(+[] { return live_split(); }, loop_passes, o));
}

namespace {

/// The drifting loop with live.plan_rank = 2: rank 2 alone runs the planner and sends its layout
/// to the others. Each rank's count of planner runs (its fault hook sees Step::plan in the
/// planner's job, once per plan made on that rank) comes back in `planned`.
template <class Replicas>
std::array<LiveRun, 4> serve_loop_one_planner(Replicas (*make)(), live::Options o, std::array<int, 4>& planned) {
  std::array<LiveRun, 4> out;
  std::array<std::atomic<int>, 4> made{};  // outlive the layers, whose planner thread calls the hooks
  collective::run_in_process<4>([&](auto& comm) {
    LiveHarness<std::remove_reference_t<decltype(comm)>, Replicas> hx(comm, make(), o);
    auto& mine = made[static_cast<std::size_t>(comm.rank())];
    hx.layer.set_fault_hook([&mine](live::Step s) {
      if (s == live::Step::plan) ++mine;
    });
    out[static_cast<std::size_t>(comm.rank())] = hx.serve(0, loop_passes);
  });
  for (std::size_t r = 0; r < 4; ++r) planned[r] = made[r].load();
  return out;
}

}  // namespace

TEST_CASE("live layer: one rank plans (live.plan_rank) and the others take its layout", "[layer][live]") {
  for (auto planner : {live::Planner::minimal_move, live::Planner::split_balance}) {
    INFO("planner " << static_cast<int>(planner));
    auto o = serving;
    o.plan_rank = 2;
    o.planner = planner;
    if (planner == live::Planner::split_balance) o.tolerance_permille = 5;
    std::array<int, 4> planned{};
    auto runs = planner == live::Planner::split_balance
                    ? serve_loop_one_planner(+[] { return live_split(); }, o, planned)
                    : serve_loop_one_planner(+[] { return live_table(); }, o, planned);
    check_loop(runs);
    // Only rank 2 planned, once per plan the ranks adopted or are still moving to (at most one).
    CHECK(planned[0] == 0);
    CHECK(planned[1] == 0);
    CHECK(planned[3] == 0);
    CHECK(planned[2] >= runs[0].adopted);
    CHECK(planned[2] <= runs[0].adopted + 1);
    // Rank 2 sent each plan it shared (4 ranks x 20 slots int32) to the 3 others; they sent none.
    constexpr long long share = 3 * 4 * 20 * 4;
    CHECK(runs[0].plan_bytes + runs[1].plan_bytes + runs[3].plan_bytes == 0);
    CHECK(runs[2].plan_bytes % share == 0);
    CHECK(runs[2].plan_bytes / share >= runs[0].adopted);
    CHECK(runs[2].plan_bytes / share <= planned[2]);
  }
}

TEST_CASE("live layer: ranks built with different plan_rank stop at their first pass", "[layer][live]") {
  // Rank 3 built with another live.plan_rank: every rank's first pass throws the same error.
  std::array<std::string, 4> what;
  collective::run_in_process<4>([&](auto& comm) {
    auto o = serving;
    o.plan_rank = comm.rank() == 3 ? 0 : 1;
    LiveHarness<std::remove_reference_t<decltype(comm)>, replication::Table> hx(comm, live_table(), o);
    LiveRun run;
    hx.pass(0, run);
    if (!run.errors.empty()) what[static_cast<std::size_t>(comm.rank())] = run.errors[0];
  });
  for (auto const& w : what) {
    CHECK(w == what[0]);
    CHECK_THAT(w, Catch::Contains("live.plan_rank"));
  }
}

TEST_CASE("live layer: a fault at any step of a migration leaves every rank on the old plan", "[layer][live]") {
  // The last case: rank 1 is the one planning rank (live.plan_rank), and its planner fails.
  for (auto [step, plan_rank] : {std::pair{live::Step::plan, -1}, {live::Step::pack, -1}, {live::Step::unpack, -1},
                                 {live::Step::prepare_switch, -1}, {live::Step::plan, 1}}) {
    INFO("fault at " << live::step_name(step) << ", plan_rank " << plan_rank);
    auto o = serving;
    o.plan_rank = plan_rank;
    check_fault(fault_loop<4>(step, 1, o), 1);
  }
}

namespace {

/// 4 in-process ranks serve `before` passes, call `between(comm, layer)` on every rank (which
/// starts a re-plan), then serve `after_replan` passes more; each rank's plans adopted.
template <class Between>
std::array<int, 4> replan_between(int before, Between&& between) {
  std::array<int, 4> adopted{};
  collective::run_in_process<4>([&](auto& comm) {
    auto o = serving;
    o.replan_every = 0;
    LiveHarness<std::remove_reference_t<decltype(comm)>, replication::Table> hx(comm, live_table(), o);
    LiveRun run;
    for (int p = 0; p < before; ++p) hx.pass(p, run);
    between(comm, hx.layer);
    for (int p = before; p < before + after_replan; ++p) hx.pass(p, run);
    adopted[static_cast<std::size_t>(comm.rank())] = hx.layer.stats().plans_adopted;
    CHECK(run.errors.empty());
    CHECK(run.worst_error <= 1e-5);
  });
  return adopted;
}

}  // namespace

#if defined(__linux__)
TEST_CASE("live layer: starting a re-plan starts no thread", "[layer][live]") {
  // The layers share one planner thread, made when they are built: a thread started in a pass
  // took the core from the rank that started it (docs/results/serving-loop-layer.md). The count
  // of the process's threads (/proc/self/task) stays the same across replan() on every rank.
  auto threads = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/task"), std::filesystem::directory_iterator{});
  };
  std::ptrdiff_t before = -1, after = -1;
  auto adopted = replan_between(20, [&](auto& comm, auto& layer) {
    comm.barrier();
    if (comm.rank() == 0) before = threads();
    comm.barrier();
    layer.replan();
    comm.barrier();
    if (comm.rank() == 0) after = threads();
  });
  CHECK(before > 4);
  CHECK(after == before);
  for (int a : adopted) CHECK(a == 1);  // and the plan was made and used
}
#endif

TEST_CASE("live layer: in-process ranks with the same window plan once", "[layer][live]") {
  // The 4 ranks queue the same job; the planner thread computes it once and the other 3 ranks take
  // a copy. Each rank's plan is still its own job: the ranks compare the plans' hashes before any
  // byte moves, and here adopt them.
  auto& memo = live::PlanMemo<live::Replanner::Result>::process();
  long long made = memo.made(), reused = memo.reused();
  // 27 passes: a window no other case plans from.
  auto adopted = replan_between(27, [](auto&, auto& layer) { layer.replan(); });
  for (int a : adopted) CHECK(a == 1);
  CHECK(memo.made() - made == 1);
  CHECK(memo.reused() - reused == 3);
}

TEST_CASE("live layer: a re-plan started on one rank only is refused once, then the layer serves on",
          "[layer][live]") {
  // Rank 0 alone calls replan(): the next pass throws the same error on every rank, which keeps its
  // plan. The layer must then serve again, and re-plan when every rank asks. Before, the ranks'
  // counts of re-plans started stayed apart, so every later pass threw the same error.
  std::array<LiveRun, 4> runs;
  std::array<int, 4> adopted{};
  collective::run_in_process<4>([&](auto& comm) {
    auto o = serving;
    o.replan_every = 0;
    LiveHarness<std::remove_reference_t<decltype(comm)>, replication::Table> hx(comm, live_table(), o);
    auto& run = runs[static_cast<std::size_t>(comm.rank())];
    for (int p = 0; p < 20; ++p) hx.pass(p, run);
    if (comm.rank() == 0) hx.layer.replan();
    for (int p = 20; p < 25; ++p) hx.pass(p, run);  // the first of these throws
    hx.layer.replan();  // every rank now
    for (int p = 25; p < 25 + after_replan; ++p) hx.pass(p, run);
    adopted[static_cast<std::size_t>(comm.rank())] = hx.layer.stats().plans_adopted;
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    auto const& x = runs[static_cast<std::size_t>(r)];
    REQUIRE(x.errors.size() == 1);
    CHECK(x.errors[0] == runs[0].errors[0]);
    CHECK_THAT(x.errors[0], Catch::Contains("rank 0 has started 1 re-plans, rank 1 0"));
    CHECK(x.worst_error <= 1e-5);
    CHECK(x.window_counts_ok);
    CHECK(adopted[static_cast<std::size_t>(r)] == 1);
  }
}

TEST_CASE("live layer: a bad plan is refused on every rank before any byte moves", "[layer][live]") {
  struct Case {
    char const* what;
    std::function<void(std::vector<int>&)> edit;
  };
  std::vector<Case> cases = {
      {"names expert 99", [](std::vector<int>& l) { l[3] = 99; }},
      {"leaves expert 5 on no rank", [](std::vector<int>& l) { std::replace(l.begin(), l.end(), 5, 6); }},
      {"new experts; it has 3 free slots", [](std::vector<int>& l) {
         // rank 0 takes experts 1, 2, 5, 6 (four new ones) in place of its second copies of 3, 7,
         // 11, 15 (which stay on rank 3)
         int from[] = {3, 7, 11, 15}, to[] = {1, 2, 5, 6};
         for (int i = 0; i < 4; ++i) replace_on(l, 0, from[i], to[i]);
       }},
  };
  for (auto const& c : cases) {
    INFO(c.what);
    std::array<LiveRun, 4> runs;
    std::array<bool, 4> same_plan{};
    std::array<long long, 4> bytes{};
    collective::run_in_process<4>([&](auto& comm) {
      auto o = serving;
      o.replan_every = 0;
      LiveHarness<std::remove_reference_t<decltype(comm)>, replication::Table> hx(comm, live_table(), o);
      auto& run = runs[static_cast<std::size_t>(comm.rank())];
      hx.pass(0, run);
      live::Plan before = hx.layer.plan();
      auto layout = live::layout_of(before, 4, 20);
      c.edit(layout);
      hx.layer.migrate_to(layout);
      hx.pass(1, run);  // throws on every rank
      hx.pass(2, run);
      same_plan[static_cast<std::size_t>(comm.rank())] = hx.layer.plan() == before;
      bytes[static_cast<std::size_t>(comm.rank())] = run.bytes_sent;
    });
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      auto const& x = runs[static_cast<std::size_t>(r)];
      REQUIRE(x.errors.size() == 1);
      CHECK(x.errors[0] == runs[0].errors[0]);
      CHECK_THAT(x.errors[0], Catch::Contains(c.what));
      CHECK(x.worst_error <= 1e-5);
      CHECK(same_plan[static_cast<std::size_t>(r)]);
      CHECK(bytes[static_cast<std::size_t>(r)] == 0);
    }
  }
}

TEST_CASE("live layer: a plan from elsewhere is migrated to, bytes as its added copies", "[layer][live]") {
  std::array<LiveRun, 4> runs;
  std::array<live::Plan, 4> plans;
  collective::run_in_process<4>([&](auto& comm) {
    auto o = serving;
    o.replan_every = 0;
    LiveHarness<std::remove_reference_t<decltype(comm)>, replication::Table> hx(comm, live_table(), o);
    auto& run = runs[static_cast<std::size_t>(comm.rank())];
    hx.pass(0, run);
    auto layout = live::layout_of(hx.layer.plan(), 4, 20);
    // rank 0 takes expert 2 for its copy of 4, rank 2 expert 4 for 2 (4 stays on rank 1, 2 on
    // rank 3); ranks 2 and 3 swap experts 18 and 19 (one copy each)
    replace_on(layout, 0, 4, 2);
    replace_on(layout, 2, 2, 4);
    replace_on(layout, 2, 18, 19);
    replace_on(layout, 3, 19, 18);
    hx.layer.migrate_to(layout);
    live::Plan before = hx.layer.plan();
    for (int p = 1; p < 12; ++p) hx.pass(p, run);
    plans[static_cast<std::size_t>(comm.rank())] = hx.layer.plan();
    run.expected_bytes = added_copies(before, hx.layer.plan()) * static_cast<long long>(live::slot_bytes<float>(LiveModel::spec));
  });
  long long sent = 0;
  for (int r = 0; r < 4; ++r) {
    auto const& x = runs[static_cast<std::size_t>(r)];
    CHECK(x.errors.empty());
    CHECK(x.worst_error <= 1e-5);
    CHECK(plans[static_cast<std::size_t>(r)] == plans[0]);
    sent += x.bytes_sent;
  }
  // four copies added, each 6 KiB, sent at 4 KiB a pass per rank
  CHECK(runs[0].expected_bytes == 4 * 3 * 16 * 32 * 4);
  CHECK(sent == runs[0].expected_bytes);
  CHECK(plans[0].copies[4] == std::vector<int>{1, 2});
  CHECK(plans[0].copies[2] == std::vector<int>{0, 3});
  CHECK(plans[0].copies[18] == std::vector<int>{3});
  CHECK(plans[0].copies[19] == std::vector<int>{2});
}

TEST_CASE("live layer: options that cannot work are refused at construction", "[layer][live]") {
  collective::run_in_process<1>([&](auto& comm) {
    using C = std::remove_reference_t<decltype(comm)>;
    using Plain = Layer<LiveModel, router::SoftmaxTopK, placement::Table, replication::None, schedule::Sequential, C>;
    RandomLayerWeights<float> w(LiveModel::spec, 1);
    auto make = [&](live::Options o) {
      Plain l(comm, placement::Table(std::vector<int>(64, 0)), {}, w.view(), {.max_tokens = 4, .live = o});
    };
    CHECK_NOTHROW(make({.window = 5}));
    CHECK_THROWS_WITH(make({.window = 5, .spare_slots = 2}),
                      Catch::Contains("re-planning needs a placement::Table and replication::Table or "
                                      "replication::BatchSplit"));
    CHECK_THROWS_WITH(make({.window = -1}), Catch::Contains("must not be negative"));
    CHECK_THROWS_WITH(make({.window = 5, .tolerance_permille = -2}), Catch::Contains("tolerance_permille -2"));
    CHECK_THROWS_WITH(make({.window = 5, .planner = live::Planner::split_balance}),
                      Catch::Contains("split_balance scores plans by the per-batch split: it needs "
                                      "replication::BatchSplit"));
    CHECK_THROWS_WITH(make({.window = 5, .plan_rank = 1}), Catch::Contains("live.plan_rank (1) must be -1"));
    CHECK_THROWS_WITH(make({.window = 5, .plan_rank = -2}), Catch::Contains("live.plan_rank (-2) must be -1"));
  });
  // The planning rank's layout (4 ranks x 20 slots, 320 bytes) must fit the migration buffers.
  std::array<std::string, 4> what;
  collective::run_in_process<4>([&](auto& comm) {
    try {
      LiveHarness<std::remove_reference_t<decltype(comm)>, replication::Table> hx(
          comm, live_table(), {.window = 5, .spare_slots = 3, .migration_bytes_per_pass = 319, .plan_rank = 0});
    } catch (Error const& e) {
      what[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  for (auto const& w : what)
    CHECK_THAT(w, Catch::Contains("the planning rank's layout (320 bytes") && Catch::Contains("is 319"));
}

namespace {

/// attach_arena on one rank holding every expert, with expert `x`'s weights given at `gate`, `up`
/// and `down` (offsets in elements from the arena's start, in one buffer whose arena part starts at
/// element `arena_at`); returns what attach_arena threw ("" if nothing), and whether the layer then
/// reads expert x's own weights.
template <class Model>
std::pair<std::string, bool> attach_overlapping(std::size_t x, std::size_t arena_at, std::ptrdiff_t gate,
                                                std::ptrdiff_t up, std::ptrdiff_t down) {
  std::pair<std::string, bool> out;
  collective::run_in_process<1>([&](auto& comm) {
    using C = std::remove_reference_t<decltype(comm)>;
    using L = Layer<Model, router::SoftmaxTopK, placement::Table, replication::Table, schedule::Sequential, C>;
    RandomLayerWeights<float> w(Model::spec, 3);
    std::vector<std::vector<int>> copies(64, std::vector<int>{0});
    constexpr std::size_t per = L::slot_elements() / 3;
    // 64 slots (every expert) + 1 spare
    std::vector<float> buffer(arena_at + 65 * L::slot_elements() + 3 * per);
    std::vector<ExpertWeights<float>> experts(w.view().experts.begin(), w.view().experts.end());
    auto const original = experts[x];
    float* at[3] = {buffer.data() + static_cast<std::ptrdiff_t>(arena_at) + gate,
                    buffer.data() + static_cast<std::ptrdiff_t>(arena_at) + up,
                    buffer.data() + static_cast<std::ptrdiff_t>(arena_at) + down};
    float const* from[3] = {original.gate, original.up, original.down};
    for (int i = 0; i < 3; ++i) std::copy(from[i], from[i] + per, at[i]);
    experts[x] = {at[0], at[1], at[2]};
    auto view = w.view();
    view.experts = experts;
    L layer(comm, placement::Table(std::vector<int>(64, 0)), replication::Table(copies), view,
            {.max_tokens = 4, .live = {.window = 1, .spare_slots = 1}});
    REQUIRE(layer.arena_elements() == 65 * L::slot_elements());
    std::span<float> arena(buffer.data() + arena_at, layer.arena_elements());
    try {
      layer.attach_arena(arena);
    } catch (Error const& e) {
      out.first = e.what();
    }
    auto const& now = layer.executor().expert_weights()[x];
    bool same = true;
    float const* got[3] = {now.gate, now.up, now.down};
    for (int i = 0; i < 3; ++i) same = same && std::equal(from[i], from[i] + per, got[i]);
    out.second = same;
  });
  return out;
}

}  // namespace

TEST_CASE("live layer: weights that overlap the arena but not as one slot are refused", "[layer][live]") {
  auto refused = [](int e) { return "expert " + std::to_string(e) + "'s weights lie in the arena but not as one slot"; };
  // Expert 0's gate just before the arena, its up and down the arena's first two parts. With parts
  // of 256 elements (a slot of 768), gate's offset from the arena, read as an unsigned number, is
  // a multiple of the slot: this read far outside the slot table (a crash) instead of refusing.
  using Quarter = models::Reduced<models::OLMoE_1B_7B, 32, 8, DType::f32>;
  auto a = attach_overlapping<Quarter>(0, 256, -256, 0, 256);
  CHECK_THAT(a.first, Catch::Contains(refused(0)));
  // Expert 1's gate starts 100 elements before the arena (its part reaches into the arena's first
  // slot), its up and down lie past the arena: none starts in the arena, so expert 0 was copied
  // into slot 0 over the tail of expert 1's gate, then expert 1 from there into slot 1, and the
  // layer served expert 1 with a corrupted gate.
  constexpr std::ptrdiff_t past = 65 * 3 * 512;
  auto b = attach_overlapping<LiveModel>(1, 512, -100, past, past + 512);
  CHECK_THAT(b.first, Catch::Contains(refused(1)));
  CHECK(b.second);  // refused: the layer still reads expert 1's own weights
}

TEST_CASE("live layer: the engines' full reshuffle (EPLB from scratch) moves far more than minimal moves",
          "[layer][live]") {
  // EPLB from scratch can give a rank any of its 20 slots' experts anew: 20 spare slots. Its plan,
  // many moves, is adopted at pass 42: 50 passes under a sanitizer, as before.
  auto o = serving;
  o.spare_slots = 20;
  constexpr int passes = full_or(100, 50);
  auto minimal = serve_loop(+[] { return live_table(); }, passes, o);
  o.planner = live::Planner::eplb;
  auto full = serve_loop(+[] { return live_table(); }, passes, o);
  check_loop(minimal, 1);
  check_loop(full, 1);
  long long a = 0, b = 0;
  for (int r = 0; r < 4; ++r) a += minimal[static_cast<std::size_t>(r)].bytes_sent, b += full[static_cast<std::size_t>(r)].bytes_sent;
  CHECK(b > 3 * a);
  // With 3 spare slots a from-scratch plan does not fit: refused on every rank, the plan kept.
  o.spare_slots = 3;
  std::array<LiveRun, 4> runs;
  collective::run_in_process<4>([&](auto& comm) {
    LiveHarness<std::remove_reference_t<decltype(comm)>, replication::Table> hx(comm, live_table(), o);
    runs[static_cast<std::size_t>(comm.rank())] = hx.serve(0, 30);
  });
  for (auto const& x : runs) {
    REQUIRE(x.errors.size() == 1);
    CHECK(x.errors[0] == runs[0].errors[0]);
    CHECK_THAT(x.errors[0], Catch::Contains("free slots (LayerOptions::live.spare_slots)"));
    CHECK(x.worst_error <= 1e-5);
    CHECK(x.adopted == 0);
  }
}

TEST_CASE("live re-planner: empty slots never give a rank more new experts than its spare slots",
          "[layer][live]") {
  // recorded_loads / recorded_layout, recorded after earlier plans had left rank 0 with 10 empty
  // slots: the planner fills empty slots before its capped search, so no cap fitted and the
  // re-planner looped for ever. Now it ends; and the layer hands it the ranks' empty slots as
  // second copies of their own experts (planning_layout).
  auto const& loads = recorded_loads;
  auto const& layout = recorded_layout;
  auto fresh = [](std::vector<int> const& from, std::vector<int> const& to, int g) {
    int n = 0;
    for (int i = 0; i < 40; ++i) {
      int e = to[static_cast<std::size_t>(40 * g + i)];
      auto first = from.begin() + 40 * g, last = first + 40;
      bool seen = std::find(to.begin() + 40 * g, to.begin() + 40 * g + i, e) != to.begin() + 40 * g + i;
      n += e >= 0 && std::find(first, last, e) == last && !seen;
    }
    return n;
  };
  auto r = live::Replanner::plan(loads, layout, 2, 3, 10, 1);
  for (int g = 0; g < 2; ++g) CHECK(fresh(layout, r.layout, g) <= 3);
  // The same plan as the layer starts it: empty slots as second copies; the plan then balances.
  live::Plan p = live::plan_of(layout, 2, 64, std::vector<int>(64, 0));
  auto start_from = live::planning_layout(p, 2, 40);
  CHECK(std::count(start_from.begin(), start_from.end(), -1) == 0);
  auto q = live::Replanner::plan(loads, start_from, 2, 3, 10, 1);
  for (int g = 0; g < 2; ++g) CHECK(fresh(start_from, q.layout, g) <= 3);
  CHECK(q.max_load < q.old_max_load);
}

#if defined(__linux__)
TEST_CASE("live re-planner: a fork()ed child plans on a thread of its own, the parent's plan in flight too",
          "[layer][live]") {
  // A child inherits the planner pool's objects but not its threads. Before, the child's plans
  // were queued on a thread it does not have (never ready), and dropping the last share of that
  // pool joined a thread that is not there. The plan here is held in its hook while the process
  // forks, so the child inherits it running.
  auto const want = live::Replanner::plan(recorded_loads, recorded_layout, 2, 3, 10, 1).layout;
  std::atomic<int> phase{0};  // 1: the parent's plan is in its hook; 2: let it go on
  live::Replanner r;
  r.start(recorded_loads, recorded_layout, 2, 3, 10, 1, live::Planner::minimal_move, [&](live::Step) {
    if (phase.load() == 2) return;
    phase = 1;
    while (phase.load() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (phase.load() != 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Exit codes: 0 both plans equal the planner's, 1 a plan never got ready, 2 one differs.
    phase = 2;
    auto wait = [](live::Replanner& p) {
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!p.ready() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return p.ready();
    };
    // r's first call here moves it to the child's pool, and the last share of the parent's goes:
    // before, that joined a thread the child does not have.
    int code = 0;
    {
      live::Replanner fresh;  // queued after the fork
      fresh.start(recorded_loads, recorded_layout, 2, 3, 10, 1, live::Planner::minimal_move, {});
      if (!wait(r) || !wait(fresh)) {
        code = 1;
      } else if (r.take().layout != want || fresh.take().layout != want) {
        code = 2;
      }
    }
    std::_Exit(code);
  }
  phase = 2;
  CHECK(r.take().layout == want);
  // A child stuck (joining a thread it does not have) is killed after a minute and fails here.
  int status = 0;
  pid_t waited = 0;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       (waited = ::waitpid(child, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (waited == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    FAIL("the fork()ed child did not exit within a minute");
  }
  REQUIRE(waited == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
#endif

TEST_CASE("live re-planner: with two planner threads, two plans run at once; twins are planned once",
          "[layer][live]") {
  // Each plan's hook waits (up to 10 s) until both plans are in their hooks and counts itself in
  // `met` if it saw the other: with one thread the first plan's hook never sees the second.
  live::set_planner_threads(2);
  std::atomic<int> in_hook{0}, met{0};
  auto meet = [&](live::Step) {
    ++in_hook;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (in_hook.load() % 2 != 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (in_hook.load() % 2 == 0) ++met;
  };
  auto other = recorded_loads;
  other[3] += 500;  // a second plan, not a twin
  {
    live::Replanner a, b;
    a.attach();
    CHECK(live::PlannerPool::existing()->threads() == 2);
    a.start(recorded_loads, recorded_layout, 2, 3, 7, 1, live::Planner::minimal_move, meet);
    b.start(other, recorded_layout, 2, 3, 7, 1, live::Planner::minimal_move, meet);
    CHECK(a.take().layout == live::Replanner::plan(recorded_loads, recorded_layout, 2, 3, 7, 1).layout);
    CHECK(b.take().layout == live::Replanner::plan(other, recorded_layout, 2, 3, 7, 1).layout);
    CHECK(met == 2);
  }
  {
    // Twins let go together: one is planned, the other waits for it (or takes it from memory).
    auto& memo = live::PlanMemo<live::Replanner::Result>::process();
    long long made = memo.made(), reused = memo.reused();
    live::Replanner a, b;
    auto twin = recorded_loads;
    twin[5] += 300;  // inputs no other case plans from
    a.start(twin, recorded_layout, 2, 3, 10, 1, live::Planner::minimal_move, meet);
    b.start(twin, recorded_layout, 2, 3, 10, 1, live::Planner::minimal_move, meet);
    auto const ra = a.take().layout, rb = b.take().layout;
    CHECK(ra == rb);
    CHECK(ra == live::Replanner::plan(twin, recorded_layout, 2, 3, 10, 1).layout);
    CHECK(memo.made() - made == 1);
    CHECK(memo.reused() - reused == 1);
  }
  live::set_planner_threads(1);  // the next pool has one thread again
  CHECK_THROWS_WITH(live::set_planner_threads(0), Catch::Contains("at least 1"));
}
