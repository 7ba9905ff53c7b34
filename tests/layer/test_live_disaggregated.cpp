// Re-planning while serving on the host disaggregated path (schedule::FinDep, schedule::PPPipe): 2
// attention ranks hold the tokens, 4 expert ranks the experts, in process. The drifting loop of
// test_live_layer (the same routing, first plan and options, over EG indices): every pass of every
// AG rank equals the single-process reference while the expert group re-plans and moves weights;
// the AG ranks move nothing; a fault at each step on one EG rank leaves every rank on the old plan.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>

#include "live_layer_case.hpp"
#include "sanitized.hpp"

using namespace moe;
using namespace moe::test;

namespace {

constexpr int ag = 2, ranks = ag + live_ranks;

template <class Schedule, class Replicas>
std::array<LiveRun, ranks> serve_loop(Schedule sched, Replicas (*make)(), live::Options o) {
  std::array<LiveRun, ranks> out;
  collective::run_in_process<ranks>([&](auto& comm) {
    LiveHarness<std::remove_reference_t<decltype(comm)>, Replicas, Schedule> hx(comm, make(), o, sched);
    out[static_cast<std::size_t>(comm.rank())] = hx.serve(0, loop_passes);
  });
  return out;
}

void check_loop(std::array<LiveRun, ranks> const& runs) {
  check_live_loop(runs, loop_adopted, ag);
  CHECK(runs[0].changed >= 1);
}

}  // namespace

TEST_CASE("live disaggregated layer: drifting passes, the expert group re-plans, every pass equals the reference",
          "[layer][live][disaggregated]") {
  SECTION("FinDEP, ASAS, r1 = 2, r2 = 2") {
    check_loop(serve_loop(schedule::FinDep{.ag = ag, .order = schedule::Order::asas, .r1 = 2, .r2 = 2},
                          +[] { return live_table(); }, serving));
  }
  SECTION("PPPipe, r1 = 2") {
    check_loop(serve_loop(schedule::PPPipe{.ag = ag, .r1 = 2}, +[] { return live_table(); }, serving));
  }
  SECTION("FinDEP with the per-micro-batch split over the expert group") {
    check_loop(serve_loop(schedule::FinDep{.ag = ag, .order = schedule::Order::aass, .r1 = 2, .r2 = 1},
                          +[] { return live_split(); }, serving));
  }
  SECTION("FinDEP with the split, re-planned by the split-aware planner") {
    // live::Planner::split_balance scores a layout by each pass's least max load over the EG
    // ranks, from the window's expert totals (counted by the AG ranks)
    auto o = serving;
    o.planner = live::Planner::split_balance;
    o.tolerance_permille = 5;
    check_loop(serve_loop(schedule::FinDep{.ag = ag, .order = schedule::Order::aass, .r1 = 2, .r2 = 1},
                          +[] { return live_split(); }, o));
  }
  SECTION("FinDEP, an attention rank plans alone (live.plan_rank = 0)") {
    auto o = serving;
    o.plan_rank = 0;
    check_loop(serve_loop(schedule::FinDep{.ag = ag, .order = schedule::Order::asas, .r1 = 2, .r2 = 2},
                          +[] { return live_table(); }, o));
  }
}

TEST_CASE("live disaggregated layer: plans are over the expert group", "[layer][live][disaggregated]") {
  std::array<std::string, ranks> what;
  collective::run_in_process<ranks>([&](auto& comm) {
    using Comm = std::remove_reference_t<decltype(comm)>;
    LiveHarness<Comm, replication::Table, schedule::FinDep> hx(
        comm, live_table(), serving, schedule::FinDep{.ag = ag, .order = schedule::Order::asas, .r1 = 2, .r2 = 2});
    auto& layer = hx.layer;
    std::string& w = what[static_cast<std::size_t>(comm.rank())];
    // The first plan over EG indices; the AG ranks have no arena.
    if (layer.plan_ranks() != live_ranks) w += "plan_ranks; ";
    if (layer.plan().copies != live_copies()) w += "plan; ";
    if ((comm.rank() < ag) != (layer.arena_slots() == 0)) w += "arena; ";
    // A layout over the EG ranks (4 x 20 slots): EG index 1 trades its second copy of expert 0 for
    // one of expert 40 (whose only copy is on EG index 0). After the migration every AG rank serves
    // with it, and its passes equal the reference.
    auto layout = live::layout_of(layer.plan(), live_ranks, 20);
    std::replace(layout.begin() + 20, layout.begin() + 40, 0, 40);
    LiveRun run;
    layer.migrate_to(layout);
    for (int p = 0; p < 10; ++p) hx.pass(p, run);
    if (!run.errors.empty()) w += "error: " + run.errors[0] + "; ";
    if (run.worst_error > 1e-5) w += "reference; ";
    if (layer.stats().plans_adopted != 1) w += "not adopted; ";
    // the pass's 32 tokens x top-8 pairs over the 4 expert ranks (the AG ranks receive none)
    if (layer.stats().rank_load_mean != 32.0 * 8 / live_ranks) w += "rank_load_mean; ";
    auto now = layer.plan();
    if (now.copies[40] != std::vector<int>{0, 1} || now.copies[0] != std::vector<int>{0}) w += "copies; ";
    if (comm.rank() == ag + 1 && layer.stats().plans_adopted == 1 && run.bytes_sent != 0) w += "EG 1 sent; ";
    if (comm.rank() == ag && run.bytes_sent != static_cast<long long>(live::slot_bytes<float>(LiveModel::spec)))
      w += "EG 0 sent " + std::to_string(run.bytes_sent) + " bytes; ";
  });
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(what[static_cast<std::size_t>(r)].empty());
  }
}

TEST_CASE("live disaggregated layer: a fault at any step on an expert rank leaves every rank on the old plan",
          "[layer][live][disaggregated]") {
  for (auto step : {live::Step::plan, live::Step::pack, live::Step::unpack, live::Step::prepare_switch}) {
    INFO("fault at " << live::step_name(step));
    check_fault(fault_loop<ranks>(step, ag + 1, serving,
                                  schedule::FinDep{.ag = ag, .order = schedule::Order::asas, .r1 = 2, .r2 = 2}),
                ag + 1);
  }
}

TEST_CASE("live disaggregated layer: options that cannot work are refused at construction",
          "[layer][live][disaggregated]") {
  // Refused by the options' check, before the layer makes any collective call.
  std::array<std::string, ranks> what;
  collective::run_in_process<ranks>([&](auto& comm) {
    using Comm = std::remove_reference_t<decltype(comm)>;
    auto refusal = [&](live::Options o) -> std::string {
      try {
        LiveHarness<Comm, replication::BatchSplit, schedule::FinDep> hx(
            comm, live_split(), o, schedule::FinDep{.ag = ag, .order = schedule::Order::asas, .r1 = 2, .r2 = 2});
      } catch (Error const& e) {
        return e.what();
      }
      return "built";
    };
    auto o = serving;
    o.nodes = 3;  // divides the 6 ranks, not the 4 expert ranks
    what[static_cast<std::size_t>(comm.rank())] = refusal(o);
  });
  for (auto const& w : what) CHECK_THAT(w, Catch::Contains("live.nodes (3) must divide the 4 expert-group ranks"));
}
