// Re-planning while serving on the device path (moe/layer/live.hpp) through collective::Nccl, 2 and
// 4 ranks with one device each: a drifting serving loop whose every pass equals the host reference
// while the layer counts loads on the device, re-plans and migrates expert weights with NCCL
// all-to-all-v of device memory; a fault planted at each migration step on one rank. The same loop
// and faults with every rank on one device, through a collective staged in host memory
// (staged_collective.cuh), so that one GPU runs the live path's device code too (NCCL refuses two
// ranks on one device). The device disaggregated layer (FinDEP and PPPipe) the same way: attention
// ranks hold the tokens, plans and moves are over the expert ranks.
// Under ThreadSanitizer only the cases with the most threads at once per pass are compiled (and so
// run): tests/emu/cuda.cmake says which.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "cuda_test_support.cuh"
#include "layer_test_support.cuh"
#include "moe/collective/in_process.hpp"
#include "moe/collective/nccl.hpp"
#include "moe/layer/paths/device.cuh"
#include "moe/moe.hpp"
#include "staged_collective.cuh"

namespace {

using Model = moe::models::Reduced<moe::models::OLMoE_1B_7B, 32, 16, moe::DType::f32>;
using T = float;
template <class Comm, class Replicas = moe::replication::Table>
using L = moe::Layer<Model, moe::router::SoftmaxTopK, moe::placement::Table, Replicas, moe::schedule::Sequential, Comm>;

/// The first plan's replica policy: the copy list itself, or the per-batch split over it (rank r
/// on server r / 2).
template <class Replicas>
Replicas replicas_of(std::vector<std::vector<int>> const& copies, int n) {
  if constexpr (std::is_same_v<Replicas, moe::replication::BatchSplit>) {
    std::vector<int> servers(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) servers[static_cast<std::size_t>(r)] = r / 2;
    return Replicas(copies, servers);
  } else {
    return Replicas(copies);
  }
}
constexpr moe::ShapeSpec s = Model::spec;
constexpr int tokens = 8;  // per rank and pass
constexpr auto h = static_cast<std::size_t>(s.hidden);

/// The first plan on n ranks: expert e on e % n and, with `copies`, experts 0-15 also on (e + 1) % n
/// (without, a plan can balance only by moving experts).
std::vector<std::vector<int>> first_copies(int n, bool copies) {
  std::vector<std::vector<int>> c(64);
  for (int e = 0; e < 64; ++e) {
    auto& x = c[static_cast<std::size_t>(e)];
    x = {e % n};
    if (copies && e < 16) x.push_back((e + 1) % n);
    std::sort(x.begin(), x.end());
  }
  return c;
}

/// Pass p's global batch: N(0, 1) plus 2 x hidden x the router rows of 4 of the pass's 6 hot
/// experts (all even, so on 2 ranks they crowd rank 0; the set moves by 8 every 25 passes), so
/// that half of all pairs go to hot experts and a plan must move some (seeded).
/// From hot 0-10, which the first plan's copies serve, the re-plans before passes 20 and 40 move no
/// weights; the first to move any starts before pass 60. So the shorter loops under a sanitizer
/// start the drift later: under AddressSanitizer where the plain build's is at pass 25 (hot 8-18),
/// so that the re-plan before pass 20 moves none and the one before pass 40 (hot 16-26, which have
/// no second copy) moves some; under ThreadSanitizer at pass 50, so that the first re-plan moves.
constexpr int drift_start = moe::test::thread_sanitized ? 2 : moe::test::full_or(0, 1);  // in steps of 25 passes
std::vector<T> batch(moe::RandomLayerWeights<T> const& w, int n, int pass) {
  int count = n * tokens;
  auto x = moe::test::random_tokens<T>(count, s.hidden, 9000 + static_cast<std::uint64_t>(pass));
  auto router = w.view().router;
  for (int t = 0; t < count; ++t)
    for (int j = 0; j < 4; ++j) {
      int hot = ((pass / 25 + drift_start) * 8 + 2 * ((t + j) % 6)) % 64;
      for (std::size_t i = 0; i < h; ++i)
        x[static_cast<std::size_t>(t) * h + i] +=
            2.0f * static_cast<float>(h) * router[static_cast<std::size_t>(hot) * h + i];
    }
  return x;
}

/// `tokens` rows of a global batch from element `first`: one rank's tokens.
std::vector<T> rows_of(std::vector<T> const& x, std::size_t first) {
  return {x.begin() + static_cast<std::ptrdiff_t>(first), x.begin() + static_cast<std::ptrdiff_t>(first + tokens * h)};
}

/// Pass p's global batch on `ranks` ranks of `tokens` tokens, the reference's output and routes.
struct ReferencePass {
  std::vector<T> x, ref;
  std::vector<int> ids;
};
ReferencePass reference_pass(moe::RandomLayerWeights<T> const& w, int ranks, int pass) {
  ReferencePass b{batch(w, ranks, pass), {}, {}};
  int count = ranks * tokens;
  b.ref.resize(b.x.size());
  b.ids.resize(static_cast<std::size_t>(count) * s.top_k);
  std::vector<float> gw(b.ids.size());
  moe::reference_forward<moe::router::SoftmaxTopK>(s, w.view(), count, b.x.data(), b.ref.data(), b.ids, gw);
  return b;
}

long long added_copies(moe::live::Plan const& from, moe::live::Plan const& to) {
  long long n = 0;
  for (std::size_t e = 0; e < to.copies.size(); ++e)
    for (int r : to.copies[e]) n += std::find(from.copies[e].begin(), from.copies[e].end(), r) == from.copies[e].end();
  return n;
}

struct RankRun {
  std::string failure;               // anything thrown outside run()
  std::vector<std::string> errors;   // what run() threw
  double worst = 0;                  // worst per-token error over stable tokens, every pass
  bool finite = true;
  long long bytes = 0, expected = 0;  // migration bytes sent; added copies x slot bytes (adopted plans)
  long long plan_bytes = 0;          // plan layouts sent (live.plan_rank)
  int adopted = 0;
  int changed = 0, changed_stat = 0;  // adoptions that changed layer.plan(); the layer's plans_changed
  bool window_ok = true;             // the window's last counts equal the reference's routes of the pass
  bool same_plan = true;             // fault runs: the plan after the fault is the one before
  bool ag_sent = false;              // disaggregated: an attention rank sent migration bytes
  double after = -1;                 // fault runs: the error of the pass after the fault
#if defined(MOE_CUDA_EMULATOR)
  emu::Resources held_before, held_after;  // allocation faults, rank 0: what the process held before
                                           // the re-plan and after the pass after the fault
#endif
};

/// A rank's output `y` (`tokens` rows from element `first` of the global batch `x`) against the
/// reference's same rows; tokens whose route is fragile are exempt from the per-token bound.
auto rank_errors(std::vector<T> const& y, std::vector<T> const& x, std::vector<T> const& ref,
                 moe::RandomLayerWeights<T> const& weights, std::size_t first) {
  auto fragile = moe::test::fragile_tokens<moe::router::SoftmaxTopK>(s, weights.view(), rows_of(x, first), tokens, 1e-5f);
  return moe::test::token_errors(y, rows_of(ref, first), fragile, tokens, s.hidden);
}

/// One pass; what it throws goes to `r.errors`. Whether it ran.
template <class Layer>
bool try_pass(Layer& layer, typename Layer::Arguments const& a, moe::test::Device<std::byte>& ws, RankRun& r) {
  try {
    layer.run(a, ws.bytes());
    return true;
  } catch (moe::Error const& e) {
    r.errors.emplace_back(e.what());
    return false;
  }
}

/// A checked pass's output errors: the worst before a fault, the pass after it.
void record_output(RankRun& r, moe::test::TokenErrors const& err) {
  r.finite = r.finite && err.finite;
  if (r.errors.empty()) r.worst = std::max(r.worst, err.worst_stable);
  else r.after = err.worst_stable;
}

/// What a pass that ran left in the layer: its migration and plan bytes, the window's newest
/// counts against the reference's routes `ids`, and a newly adopted plan (the bytes of the copies
/// it added, whether it changed the plan `before`, which it replaces).
template <class Layer>
void record_pass(Layer& layer, std::vector<int> const& ids, moe::live::Plan& before, RankRun& r) {
  r.bytes += static_cast<long long>(layer.stats().migration_bytes);
  r.plan_bytes += static_cast<long long>(layer.stats().plan_bytes);
  // The window ends with this pass: load_window() waits for its counts (the next pass would read
  // them after its agreement, without a synchronisation of its own).
  auto const& w = layer.load_window();
  auto got = w.experts(w.size() - 1);
  std::vector<long long> want_counts(64, 0);
  for (int e : ids) ++want_counts[static_cast<std::size_t>(e)];
  r.window_ok = r.window_ok && std::equal(got.begin(), got.end(), want_counts.begin());
  if (layer.stats().plans_adopted > r.adopted) {
    auto now = layer.plan();
    r.expected += added_copies(before, now) * static_cast<long long>(moe::live::slot_bytes<T>(s));
    r.changed += now != before;  // plan() lists each expert's copies in rank order
    before = now;
    r.adopted = layer.stats().plans_adopted;
  }
  r.changed_stat = layer.stats().plans_changed;
}

/// A barrier whose wait gives up (throws) after `limit`: ranks out of step fail the test at once
/// instead of waiting for CTest's timeout.
class TimedBarrier {
public:
  explicit TimedBarrier(int n, std::chrono::seconds limit = std::chrono::seconds(60)) : n_(n), limit_(limit) {}
  [[maybe_unused]] void arrive_and_wait() {  // the emulated ranks only
    std::unique_lock lock(m_);
    auto generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, limit_, [&] { return generation_ != generation; }))
      throw std::runtime_error("a rank waited " + std::to_string(limit_.count()) +
                               " s for the others at the test's barrier: the ranks are out of step");
  }

private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, arrived_ = 0;
  long long generation_ = 0;
  std::chrono::seconds limit_;
};

/// An allocation fault (emulator only): the `nth` cudaMalloc that rank 1 makes from its switch's
/// preparation on fails as if out of memory; `meet` makes the ranks measure the process's
/// allocations together (rank 0 records them).
struct AllocFault {
  int nth = 0;
  TimedBarrier* meet = nullptr;
};

/// What every rank's loop shares: the weights, the first plan and the primaries, and a layout
/// the ranks migrate to before pass 2 (Layer::migrate_to; none when empty).
struct World {
  moe::RandomLayerWeights<T> weights{s, 77};
  std::vector<std::vector<int>> copies;
  std::vector<int> primary = std::vector<int>(64);
  std::vector<int> layout;
  World(int n, bool with_copies) : copies(first_copies(n, with_copies)) {
    for (int e = 0; e < 64; ++e) primary[static_cast<std::size_t>(e)] = e % n;
  }
  /// A first plan whose last plan rank holds experts 0 and 1 only, fewer than top_k = 8 (the
  /// others one each of the rest), and a layout that also gives that rank experts 2-7: a rank
  /// that grows past what it first served, within the first plan's most (no spare slots needed).
  static World growing(int n) {
    World w(n, false);
    int width = (62 + n - 2) / (n - 1);
    w.layout.assign(static_cast<std::size_t>(n * width), -1);
    std::vector<int> used(static_cast<std::size_t>(n), 0);
    auto put = [&](int r, int e) { w.layout[static_cast<std::size_t>(r * width + used[static_cast<std::size_t>(r)]++)] = e; };
    for (int e = 0; e < 64; ++e) {
      int r = e < 2 ? n - 1 : (e - 2) % (n - 1);
      w.primary[static_cast<std::size_t>(e)] = r;
      w.copies[static_cast<std::size_t>(e)] = {r};
      put(r, e);
    }
    for (int e = 2; e < 8; ++e) put(n - 1, e);
    return w;
  }
};

/// The device weights of the experts plan index g holds a copy of in the first plan (the others
/// empty; none for g < 0).
std::vector<moe::ExpertWeights<T>> held_weights(World const& world, moe::test::DeviceWeights<T> const& dw, int g) {
  std::vector<moe::ExpertWeights<T>> mine(dw.experts.size());
  for (int e = 0; e < 64; ++e)
    for (int c : world.copies[static_cast<std::size_t>(e)])
      if (c == g) mine[static_cast<std::size_t>(e)] = dw.experts[static_cast<std::size_t>(e)];
  return mine;
}

/// One rank's `passes` passes through `comm` on stream `st` (made on this rank's thread and
/// device). With `fault` (and a first plan without copies), rank 1 throws at that step of the first
/// migration, a re-plan is asked for before pass 55 (5 under a sanitizer) and the run stops after
/// the pass that threw (plus one more, checked).
template <class Replicas, class Comm>
void serve_rank(Comm& comm, moe::test::Stream& st, int rank, int n, int passes, moe::live::Options o,
                std::optional<moe::live::Step> fault, World const& world, RankRun& r, AllocFault alloc = {}) {
  auto const& weights = world.weights;
  auto const& primary = world.primary;
  moe::test::DeviceWeights<T> dw(s, weights.view());
  bool fired = false;  // outlives the layer, whose re-planner thread may call the hook
  auto view = dw.view();
  auto mine = held_weights(world, dw, rank);
  view.experts = mine;
  L<Comm, Replicas> layer(comm, moe::placement::Table(primary), replicas_of<Replicas>(world.copies, n), view,
                {.max_tokens = tokens, .live = o});
  moe::test::Device<T> arena(layer.arena_elements());
  layer.attach_arena({arena.get(), arena.size()});
  mine.clear();
  moe::test::Device<std::byte> ws(layer.workspace_size());
  if (fault && rank == 1)
    layer.set_fault_hook([&](moe::live::Step step) {
      if (step == *fault && !fired) {
        fired = true;
#if defined(MOE_CUDA_EMULATOR)
        if (alloc.nth > 0) {
          int device = 0;
          moe::kernels::cuda::check_cuda(cudaGetDevice(&device), "cudaGetDevice");
          emu::fail_nth_call_on_device("cudaMalloc", device, alloc.nth);
          return;
        }
#endif
        throw moe::Error("planted fault");
      }
    });
#if defined(MOE_CUDA_EMULATOR)
  // Every rank measures the process's allocations at the same point (rank 0 records them).
  auto measure = [&](emu::Resources& into) {
    if (!alloc.meet) return;
    st.synchronize("measure");
    alloc.meet->arrive_and_wait();
    if (rank == 0) into = emu::live_resources();
    alloc.meet->arrive_and_wait();
  };
#endif
  // Under a sanitizer the planted faults re-plan before pass 5, 50 passes sooner: there too the
  // hot experts, all even and without a second copy, crowd rank 0.
  int replan_at = alloc.nth > 0 || moe::test::sanitized ? 5 : 55;
  moe::test::Device<T> dx(static_cast<std::size_t>(tokens) * h), dy(static_cast<std::size_t>(tokens) * h);
  auto before = layer.plan();
  int last = passes;  // this rank's: a fault run stops early
  for (int p = 0; p < last; ++p) {
    auto [x, ref, ids] = reference_pass(weights, n, p);
    auto first = static_cast<std::size_t>(rank * tokens) * h;
    dx.upload(rows_of(x, first));
    dy.poison();
    if (!world.layout.empty() && p == 2) layer.migrate_to(world.layout);
    // At 55 hot: 16, 18, ..., 26, one copy each, on rank 0; at 5: 0, 2, ..., 10 (under a sanitizer
    // 8, ..., 18 or 16, ..., 26: drift_start).
    if (fault && p == replan_at) {
#if defined(MOE_CUDA_EMULATOR)
      measure(r.held_before);
#endif
      layer.replan();
    }
    bool threw = !try_pass(layer, {.tokens = tokens, .x = dx.get(), .y = dy.get(), .first_token = rank * tokens,
                                   .stream = st}, ws, r);
    if (!threw) {
      st.synchronize("pass");
      record_output(r, rank_errors(dy.download(tokens * h), x, ref, weights, first));
      record_pass(layer, ids, before, r);
    }
    if (fault && threw) {
      r.same_plan = layer.plan() == before && !layer.migrating();
      last = std::min(last, p + 2);  // one more pass, checked
    }
  }
#if defined(MOE_CUDA_EMULATOR)
  measure(r.held_after);
#endif
}

/// Runs `body(comm, stream, rank, result)` on n NCCL ranks, one device and thread each; what a
/// rank throws goes to its result's `failure`.
template <class Body>
std::vector<RankRun> on_nccl_ranks(int n, Body&& body) {
  std::vector<RankRun> out(static_cast<std::size_t>(n));
  auto id = moe::collective::Nccl::unique_id();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank)
    threads.emplace_back([&, rank] {
      auto& r = out[static_cast<std::size_t>(rank)];
      try {
        moe::kernels::cuda::check_cuda(cudaSetDevice(rank), "cudaSetDevice");
        moe::test::Stream st;
        auto comm = moe::collective::Nccl::create(rank, n, id, st);
        body(comm, st, rank, r);
      } catch (std::exception const& e) {
        r.failure = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

/// The same with N in-process ranks on device 0: `body(host, stream, rank, result)`, where the
/// body builds its collectives over `host` (moe::test::StagedDevice exchanges through host memory).
template <int N, class Body>
std::vector<RankRun> on_staged_ranks(Body&& body) {
  std::vector<RankRun> out(static_cast<std::size_t>(N));
  moe::collective::run_in_process<N>([&](moe::collective::InProcess<N>& host) {
    auto& r = out[static_cast<std::size_t>(host.rank())];
    try {
      moe::kernels::cuda::check_cuda(cudaSetDevice(0), "cudaSetDevice");
      moe::test::Stream st;
      body(host, st, host.rank(), r);
    } catch (std::exception const& e) {
      r.failure = e.what();
    }
  });
  return out;
}

/// Runs `passes` passes on n NCCL ranks, one device each (see serve_rank). `alloc_nth` > 0 (with
/// `fault` at Step::prepare_switch, emulator only): rank 1's nth allocation from the switch's
/// preparation on fails instead of the planted throw.
template <class Replicas = moe::replication::Table>
std::vector<RankRun> serve(int n, int passes, moe::live::Options o, std::optional<moe::live::Step> fault = {},
                           int alloc_nth = 0) {
  World world(n, !fault);
  TimedBarrier meet(n);
  AllocFault alloc{alloc_nth, alloc_nth > 0 ? &meet : nullptr};
  auto out = on_nccl_ranks(n, [&](auto& comm, moe::test::Stream& st, int rank, RankRun& r) {
    serve_rank<Replicas>(comm, st, rank, n, passes, o, fault, world, r, alloc);
  });
#if defined(MOE_CUDA_EMULATOR)
  if (alloc_nth > 0) emu::fail_nth_call_on_device("cudaMalloc", 1, 0);  // armed past the last allocation
#endif
  return out;
}

/// The same with the N ranks on device 0, exchanging through host memory (StagedDevice).
template <int N, class Replicas = moe::replication::Table>
std::vector<RankRun> serve_staged(int passes, moe::live::Options o, std::optional<moe::live::Step> fault = {}) {
  World world(N, !fault);
  return on_staged_ranks<N>([&](moe::collective::InProcess<N>& host, moe::test::Stream& st, int rank, RankRun& r) {
    moe::test::StagedDevice<N> comm(host);
    serve_rank<Replicas>(comm, st, rank, N, passes, o, fault, world, r);
  });
}

constexpr moe::live::Options loop{.window = 20, .replan_every = 20, .spare_slots = 3, .migration_bytes_per_pass = 4096};

// Passes of the drifting loops under a sanitizer, and the plans they adopt: the re-plans started
// before passes 20 and 40 are adopted by pass 45 (their moves take a few passes at
// migration_bytes_per_pass), so 60 passes adopt 2 plans, the second one moving from a plan that is
// not the first, with 15 passes to spare. The plain build runs its full loops (200 or 100 passes).
constexpr int sanitized_passes = 60, sanitized_plans = 2;
constexpr int loop_passes(int full) { return moe::test::full_or(full, sanitized_passes); }
constexpr int loop_plans(int full) { return moe::test::full_or(full, sanitized_plans); }

/// The drifting loop's checks: every pass of every rank equals the reference, the window is exact,
/// every rank adopts the same plans, at least `plans` of them, and the migration sends exactly the
/// added copies' bytes.
void check_loop(std::vector<RankRun> const& runs, int plans) {
  long long sent = 0;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    INFO("rank " << r);
    auto const& x = runs[r];
    CHECK(x.failure.empty());
    UNSCOPED_INFO(x.failure);
    CHECK(x.errors.empty());
    CHECK(x.finite);
    CHECK(x.worst <= 1e-4);
    CHECK(x.window_ok);
    CHECK(x.adopted == runs[0].adopted);
    CHECK(x.changed == runs[0].changed);
    CHECK(x.changed_stat == x.changed);
    sent += x.bytes;
  }
  CHECK(runs[0].adopted >= plans);
  CHECK(sent == runs[0].expected);
  CHECK(sent > 0);
}

/// A fault run's checks: every rank throws the same error once, naming `cause` and the `faulty`
/// rank, keeps its plan, and the pass after it is correct again.
void check_fault(std::vector<RankRun> const& runs, std::string const& cause = "planted fault", int faulty = 1) {
  for (std::size_t r = 0; r < runs.size(); ++r) {
    INFO("rank " << r);
    auto const& x = runs[r];
    CHECK(x.failure.empty());
    UNSCOPED_INFO(x.failure);
    REQUIRE(x.errors.size() == 1);
    CHECK(x.errors[0] == runs[0].errors[0]);
    CHECK_THAT(x.errors[0], Catch::Contains("rank " + std::to_string(faulty) + "'s re-plan failed") &&
                                Catch::Contains(cause));
    CHECK(x.worst <= 1e-4);
    CHECK(x.same_plan);
    CHECK(x.adopted == 0);
    CHECK(x.after >= 0);
    CHECK(x.after <= 1e-4);
  }
}

// ---- The device disaggregated path: `ag` attention ranks hold the tokens, the other ranks the
// experts; plans, layouts and moves count EG indices (Layer::plan_ranks()) ----

namespace ms = moe::schedule;
template <class Comm, class Replicas, class Schedule = ms::FinDep>
using LD = moe::Layer<Model, moe::router::SoftmaxTopK, moe::placement::Table, Replicas, Schedule, Comm>;

/// The disaggregated runs' setup: `ag` AG ranks of `tokens` tokens, the first plan of World over the
/// N - ag EG ranks (with copies, on servers of two EG ranks for BatchSplit); the schedule.
template <class Schedule = ms::FinDep>
struct Disaggregated {
  int ag = 2;
  Schedule schedule = Schedule{2, ms::Order::aass, 2, 2};
  int fault_rank = -1;  // the rank whose migration throws at `fault` (AG or EG)
};

/// One rank's `passes` passes of the disaggregated layer (serve_rank's checks: every AG rank's
/// output against the reference, the window, the adopted plans and their bytes; with `fault`, a
/// re-plan before pass 5 and `d.fault_rank` throwing at that step of the migration).
template <class Replicas, class Schedule, class Comm>
void serve_disaggregated_rank(Comm& a2e, Comm* e2a, moe::test::Stream& st, int rank, int n, int passes,
                              moe::live::Options o, std::optional<moe::live::Step> fault, Disaggregated<Schedule> d,
                              World const& world, RankRun& r) {
  using Layer = LD<Comm, Replicas, Schedule>;
  int const ag = d.ag, eg = n - ag, g = rank - ag;  // g < 0 on an AG rank
  bool const is_ag = g < 0;
  auto const& weights = world.weights;
  bool fired = false;  // outlives the layer, whose re-planner thread may call the hook
  moe::test::DeviceWeights<T> dw(s, weights.view());
  auto mine = held_weights(world, dw, g);  // an EG rank's first experts; none on an AG rank
  auto view = dw.view();
  view.experts = mine;
  typename Layer::Options options{.max_tokens = tokens, .schedule = d.schedule, .live = o};
  std::optional<Layer> held;
  if (e2a)
    held.emplace(a2e, *e2a, moe::placement::Table(world.primary), replicas_of<Replicas>(world.copies, eg), view, options);
  else
    held.emplace(a2e, moe::placement::Table(world.primary), replicas_of<Replicas>(world.copies, eg), view, options);
  Layer& layer = *held;
  moe::test::Device<T> arena(layer.arena_elements());  // none on an AG rank
  layer.attach_arena({arena.get(), arena.size()});
  mine.clear();
  // From here on the layer reads the experts from the arena alone: their first copies are NaN.
  for (std::size_t i = 1; i <= 3 * dw.experts.size(); ++i) dw.store[i].poison();
  moe::test::Device<std::byte> ws(layer.workspace_size());
  if (fault && rank == d.fault_rank)
    layer.set_fault_hook([&](moe::live::Step step) {
      if (step == *fault && !fired) {
        fired = true;
        throw moe::Error("planted fault");
      }
    });
  moe::test::Device<T> dx(static_cast<std::size_t>(tokens) * h), dy(static_cast<std::size_t>(tokens) * h);
  auto before = layer.plan();
  int last = passes;
  for (int p = 0; p < last; ++p) {
    auto [x, ref, ids] = reference_pass(weights, ag, p);  // the AG ranks' tokens
    auto first = is_ag ? static_cast<std::size_t>(rank * tokens) * h : 0;
    if (is_ag) {
      dx.upload(rows_of(x, first));
      dy.poison();
    }
    if (!world.layout.empty() && p == 2) layer.migrate_to(world.layout);
    // Hot: 0, 2, ..., 10 (under a sanitizer 8, ..., 18 or 16, ..., 26), crowding EG index 0.
    if (fault && p == 5) layer.replan();
    bool threw = !try_pass(layer, {.tokens = tokens, .x = is_ag ? dx.get() : nullptr,
                                   .y = is_ag ? dy.get() : nullptr, .stream = st}, ws, r);
    if (!threw) {
      st.synchronize("pass");
      if (is_ag)
        record_output(r, rank_errors(dy.download(tokens * h), x, ref, weights, first));
      else if (!r.errors.empty())
        r.after = 0;  // an EG rank has no output of its own: its pass after the fault ran
      record_pass(layer, ids, before, r);
      if (is_ag && layer.stats().migration_bytes > 0) r.ag_sent = true;
    }
    if (fault && threw) {
      r.same_plan = layer.plan() == before && !layer.migrating();
      last = std::min(last, p + 2);
    }
  }
}

/// N staged ranks on device 0 (both links and the moves through host memory).
template <int N, class Replicas = moe::replication::Table, class Schedule = ms::FinDep>
std::vector<RankRun> serve_disaggregated_staged(int passes, moe::live::Options o, Disaggregated<Schedule> d = {},
                                                std::optional<moe::live::Step> fault = {}) {
  World world(N - d.ag, !fault);
  return on_staged_ranks<N>([&](moe::collective::InProcess<N>& host, moe::test::Stream& st, int rank, RankRun& r) {
    moe::test::StagedDevice<N> a2e(host), e2a(host);
    serve_disaggregated_rank<Replicas>(a2e, &e2a, st, rank, N, passes, o, fault, d, world, r);
  });
}

/// n NCCL ranks, one device each (the one-communicator layer: the E2A link is a duplicate).
template <class Replicas = moe::replication::Table>
std::vector<RankRun> serve_disaggregated_nccl(int n, int passes, moe::live::Options o, Disaggregated<> d = {}) {
  World world(n - d.ag, true);
  return on_nccl_ranks(n, [&](moe::collective::Nccl& comm, moe::test::Stream& st, int rank, RankRun& r) {
    serve_disaggregated_rank<Replicas>(comm, static_cast<moe::collective::Nccl*>(nullptr), st, rank, n, passes, o,
                                       std::nullopt, d, world, r);
  });
}

/// No attention rank sent weights (they hold none).
void check_ag_sent_nothing(std::vector<RankRun> const& runs, int ag) {
  for (int r = 0; r < ag; ++r) {
    INFO("AG rank " << r);
    CHECK_FALSE(runs[static_cast<std::size_t>(r)].ag_sent);
  }
}

constexpr moe::live::Step all_steps[] = {moe::live::Step::plan, moe::live::Step::pack, moe::live::Step::unpack,
                                         moe::live::Step::prepare_switch};

}  // namespace

#if !defined(MOE_TEST_TSAN)
TEST_CASE("device live layer: drifting passes through NCCL, a re-plan every 20, every pass equals the reference",
          "[cuda][layer][nccl][live]") {
  for (int n : {2, 4}) {
    if (!moe::test::has_devices(n)) continue;
    INFO(n << " ranks");
    check_loop(serve(n, loop_passes(200), loop), loop_plans(4));
  }
}
#endif

#if !defined(MOE_TEST_TSAN)
TEST_CASE("device live layer: a fault at any migration step leaves every rank on the old plan (NCCL)",
          "[cuda][layer][nccl][live]") {
  if (!moe::test::has_devices(2)) return;
  auto o = loop;
  o.replan_every = 0;
  for (auto step : all_steps) {
    INFO("fault at " << moe::live::step_name(step));
    check_fault(serve(2, 100, o, step));
  }
}
#endif

#if !defined(MOE_TEST_TSAN)
TEST_CASE("device live layer: one rank plans (live.plan_rank) and its layout goes through NCCL",
          "[cuda][layer][nccl][live]") {
  if (!moe::test::has_devices(4)) return;
  // Rank 1 alone plans; after a pass its layout (4 ranks x width int32) is all-gathered through
  // the device communicator, staged through the migration buffers, and the others prepare it.
  auto o = loop;
  o.plan_rank = 1;
  auto runs = serve(4, loop_passes(200), o);
  check_loop(runs, loop_plans(4));
  for (std::size_t r = 0; r < runs.size(); ++r) {
    INFO("rank " << r);
    if (r == 1) {
      CHECK(runs[r].plan_bytes > 0);
      CHECK(runs[r].plan_bytes % (3 * 4 * static_cast<long long>(sizeof(std::int32_t))) == 0);
    } else {
      CHECK(runs[r].plan_bytes == 0);
    }
  }
  // A fault in the planning rank's planner stops every rank, which keeps its plan.
  o.replan_every = 0;
  check_fault(serve(2, 100, o, moe::live::Step::plan));
}
#endif

#if defined(MOE_CUDA_EMULATOR)
TEST_CASE("device live layer: each allocation of the switch fails in turn on one NCCL rank, nothing leaks",
          "[cuda][layer][nccl][live][leaks]") {
  // Rank 1's switch builds its next device tables (cudaMalloc); the emulator fails its 1st, 2nd,
  // ... allocation from there on, counting only rank 1's device, until one run has no failure
  // left to make. Each failure must leave both ranks on the old plan with the same error, the
  // pass after it correct, and the process holding what it held before the re-plan.
  REQUIRE(moe::test::has_devices(2));  // the emulator has several
  auto o = loop;
  o.replan_every = 0;
  int failures = 0;
  // The plan of the re-plan before pass 5 switches by pass 11; a run with an allocation left to
  // fail stops 2 passes after it. Under a sanitizer the run past the last allocation serves 20
  // passes (9 or more on the new plan) instead of 40.
  int const passes = moe::test::full_or(40, 20);
  for (int nth = 1; nth <= 32; ++nth) {
    INFO("allocation " << nth << " of rank 1's switch fails");
    auto runs = serve(2, passes, o, moe::live::Step::prepare_switch, nth);
    if (runs[0].errors.empty() && runs[1].errors.empty()) {  // past the last allocation: the plan switches
      for (auto const& x : runs) {
        CHECK(x.failure.empty());
        CHECK(x.adopted == 1);
        CHECK(x.worst <= 1e-4);
      }
      break;
    }
    ++failures;
    check_fault(runs, "out of memory");
    CHECK(runs[0].held_after == runs[0].held_before);
  }
  CHECK(failures >= 8);  // the next tables: replica lists, primaries, mask, three pointer tables, error word
}
#endif

#if !defined(MOE_TEST_TSAN)
TEST_CASE("device live layer with replication::BatchSplit: re-plans, and each pass split over the new copies",
          "[cuda][layer][live][batch-split]") {
  // The split's device tables are rebuilt for every adopted plan; every pass must still equal the
  // reference, and the moves must send exactly the added copies.
  SECTION("2 staged ranks on one device, 200 passes") {
    check_loop(serve_staged<2, moe::replication::BatchSplit>(loop_passes(200), loop), loop_plans(4));
  }
  SECTION("4 staged ranks, 100 passes, the split-aware re-planner") {
    // live::Planner::split_balance (replication::split_planner) plans on the host thread from the
    // window the device counted; the device path runs its plans as any other
    auto o = loop;
    o.planner = moe::live::Planner::split_balance;
    o.tolerance_permille = 5;
    check_loop(serve_staged<4, moe::replication::BatchSplit>(loop_passes(100), o), 2);
  }
  SECTION("2 NCCL ranks, a fault at the switch") {
    if (!moe::test::has_devices(2)) return;
    auto o = loop;
    o.replan_every = 0;
    check_fault(serve<moe::replication::BatchSplit>(2, 100, o, moe::live::Step::prepare_switch));
  }
}
#endif

TEST_CASE("device layer with replication::BatchSplit: the sort's stream joins the pass before the deal",
          "[cuda][layer][batch-split][sort-stream]") {
  // The sort of a rank's pairs by expert runs on a stream of its own beside the count exchange and
  // the split kernel (paths/device.cuh, plan_split) and joins the pass's stream before the deal.
  // A few passes without re-plans, staged and over NCCL: every pass equals the reference, and
  // under ThreadSanitizer (tests/emu/cuda.cmake runs this case there) a missing join is a race.
  auto o = loop;
  o.replan_every = 0;
  auto check_runs = [](std::vector<RankRun> const& runs) {
    for (std::size_t r = 0; r < runs.size(); ++r) {
      INFO("rank " << r);
      CHECK(runs[r].failure.empty());
      UNSCOPED_INFO(runs[r].failure);
      CHECK(runs[r].errors.empty());
      CHECK(runs[r].finite);
      CHECK(runs[r].worst <= 1e-4);
    }
  };
  SECTION("2 staged ranks, 6 passes") { check_runs(serve_staged<2, moe::replication::BatchSplit>(6, o)); }
  SECTION("2 NCCL ranks, 6 passes") {
    if (!moe::test::has_devices(2)) return;
    check_runs(serve<moe::replication::BatchSplit>(2, 6, o));
  }
}

/// The live tests' model with one shared expert (OLMoE has none).
struct SharedModel {
  static constexpr std::string_view name = "olmoe-reduced+shared";
  static constexpr moe::ShapeSpec spec = [] {
    moe::ShapeSpec x = Model::spec;
    x.shared_experts = 1;
    x.shared_ffn = x.expert_ffn;
    return x;
  }();
};

TEST_CASE("device layer with shared experts: their stream joins the pass before the combine",
          "[cuda][layer][shared-stream]") {
  // The shared experts run on a stream of their own beside the routed ones and join the pass's
  // stream before the combine adds them (paths/device.cuh). One device, a few passes over one
  // workspace: every pass equals the reference, and under ThreadSanitizer (tests/emu/cuda.cmake
  // runs this case there) a missing join is a race (scripts/emu_mutations.py, stream-wait).
  using Router = moe::router::SoftmaxTopK;
  using LS = moe::Layer<SharedModel, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential,
                        moe::collective::SingleGpu>;
  constexpr moe::ShapeSpec ss = SharedModel::spec;
  constexpr int n = 24;
  moe::RandomLayerWeights<T> weights(ss, 41);
  auto x = moe::test::random_tokens<T>(n, ss.hidden, 42);
  std::vector<T> ref(x.size());
  moe::reference_forward<Router>(ss, weights.view(), n, x.data(), ref.data());
  auto fragile = moe::test::fragile_tokens<Router>(ss, weights.view(), x, n, 1e-5f);
  moe::test::DeviceWeights<T> dw(ss, weights.view());
  moe::collective::SingleGpu gpu;
  LS layer(gpu, moe::placement::Table::contiguous(ss.experts, 1), moe::replication::None{}, dw.view(),
           moe::LayerOptions<moe::schedule::Sequential, moe::cuda::DeviceOptions>{.max_tokens = n});
  moe::test::Device<std::byte> ws(layer.workspace_size());
  ws.poison();
  moe::test::Device<T> dx(x), dy(x.size());
  for (int pass = 0; pass < 3; ++pass) {
    INFO("pass " << pass);
    dy.poison();
    layer.run({.tokens = n, .x = dx.get(), .y = dy.get()}, ws.bytes());
    auto e = moe::test::token_errors(dy.download(x.size()), ref, fragile, n, ss.hidden);
    CHECK(layer.errors() == 0u);
    REQUIRE(e.finite);
    CHECK(e.worst_stable <= 1e-4);
    CHECK(e.fragile * 20 <= n);
  }
}

#if !defined(MOE_TEST_TSAN)
TEST_CASE("device live layer on one device: ranks through a staged collective, drifting passes and faults",
          "[cuda][layer][live]") {
  SECTION("2 ranks, 200 passes") {
    check_loop(serve_staged<2>(loop_passes(200), loop), loop_plans(4));
  }
  SECTION("4 ranks, 100 passes") { check_loop(serve_staged<4>(loop_passes(100), loop), 2); }
  SECTION("a fault at each migration step, 2 ranks") {
    auto o = loop;
    o.replan_every = 0;
    for (auto step : all_steps) {
      INFO("fault at " << moe::live::step_name(step));
      check_fault(serve_staged<2>(100, o, step));
    }
  }
}
#endif

TEST_CASE("device live layer: a pass captured into a CUDA graph is refused on every rank, the next one counts",
          "[cuda][layer][live][graph]") {
  // A load window needs the ranks' agreement on every pass, which a capture skips: each rank must
  // refuse the captured pass alone, count nothing, and serve the next pass as before. The padded
  // exchange, which can be captured, so that the window is the only reason to refuse.
  constexpr int N = 2;
  World world(N, true);
  std::vector<std::string> refused(N);
  std::vector<double> worst(N, 1.0);
  std::vector<int> window(N, -1);
  auto x = batch(world.weights, N, 0);
  std::vector<T> ref(x.size());
  moe::reference_forward<moe::router::SoftmaxTopK>(s, world.weights.view(), N * tokens, x.data(), ref.data());
  moe::collective::run_in_process<N>([&](moe::collective::InProcess<N>& host) {
    int rank = host.rank();
    auto r = static_cast<std::size_t>(rank);
    moe::kernels::cuda::check_cuda(cudaSetDevice(0), "cudaSetDevice");
    moe::test::Stream st;
    moe::test::StagedDevice<N> comm(host);
    moe::test::DeviceWeights<T> dw(s, world.weights.view());
    L<moe::test::StagedDevice<N>> layer(comm, moe::placement::Table(world.primary), moe::replication::Table(world.copies),
                                        dw.view(),
                                        {.max_tokens = tokens,
                                         .device = {.exchange = moe::cuda::Exchange::padded},  // capturable
                                         .live = {.window = 4}});
    moe::test::Device<std::byte> ws(layer.workspace_size());
    auto first = r * tokens * h;
    moe::test::Device<T> dx(std::vector<T>(x.begin() + static_cast<std::ptrdiff_t>(first),
                                           x.begin() + static_cast<std::ptrdiff_t>(first + tokens * h)));
    moe::test::Device<T> dy(tokens * h);
    auto pass = [&] {
      layer.run({.tokens = tokens, .x = dx.get(), .y = dy.get(), .first_token = rank * tokens, .stream = st},
                ws.bytes());
    };
    // The ranks share device 0: no rank copies through the legacy stream while another captures.
    host.barrier();
    refused[r] = moe::test::error_under_capture(st, pass);
    host.barrier();
    pass();
    st.synchronize("pass");
    auto err = rank_errors(dy.download(tokens * h), x, ref, world.weights, first);
    worst[r] = err.finite ? err.worst_stable : 1.0;
    window[r] = layer.load_window().size();
  });
  for (int r = 0; r < N; ++r) {
    INFO("rank " << r);
    CHECK_THAT(refused[static_cast<std::size_t>(r)],
               Catch::Contains("moe::Layer (device)") && Catch::Contains("CUDA graph capture"));
    CHECK(worst[static_cast<std::size_t>(r)] <= 1e-4);
    CHECK(window[static_cast<std::size_t>(r)] == 1);
  }
}

#if !defined(MOE_TEST_TSAN)
TEST_CASE("device disaggregated live layer: 2 AG + 2 EG re-plan over the expert group, every pass equals the reference",
          "[cuda][layer][findep][live]") {
  // Staged ranks on one device: the FinDEP pipeline's links and the moves through host memory.
  // Every AG pass against the reference; the window; the same plans adopted on every rank; the
  // moves' bytes = the added copies' weights, none from an AG rank.
  SECTION("FinDEP AASS r1 2 r2 2, replication::Table, a re-plan every 20 passes") {
    auto runs = serve_disaggregated_staged<4>(loop_passes(200), loop);
    check_loop(runs, loop_plans(4));
    check_ag_sent_nothing(runs, 2);
  }
  SECTION("replication::BatchSplit: each micro-batch split over the new copies, an AG rank plans (split-aware)") {
    auto o = loop;
    o.plan_rank = 0;  // an AG rank plans; its layout (2 EG ranks x width) goes to the others
    o.planner = moe::live::Planner::split_balance;  // from the window's expert totals
    o.tolerance_permille = 5;
    auto runs = serve_disaggregated_staged<4, moe::replication::BatchSplit>(loop_passes(100), o);
    check_loop(runs, 2);
    check_ag_sent_nothing(runs, 2);
    CHECK(runs[0].plan_bytes > 0);
  }
  SECTION("PPPipe, 1 AG + 3 EG") {
    Disaggregated<ms::PPPipe> d{.ag = 1, .schedule = ms::PPPipe{1, ms::Order::aass, 2, 1}};
    auto runs = serve_disaggregated_staged<4, moe::replication::Table, ms::PPPipe>(loop_passes(100), loop, d);
    check_loop(runs, 2);
    check_ag_sent_nothing(runs, 1);
  }
  SECTION("a fault at each migration step on EG rank 3 leaves every rank on the old plan") {
    auto o = loop;
    o.replan_every = 0;
    for (auto step : all_steps) {
      INFO("fault at " << moe::live::step_name(step));
      check_fault(serve_disaggregated_staged<4>(100, o, {.fault_rank = 3}, step), "planted fault", 3);
    }
  }
  SECTION("a fault at each step on AG rank 0, with replication::BatchSplit: the old split serves on") {
    // An AG rank moves no weights but plans, takes part in each chunk and builds the next plan's
    // split beside the one in use, which must still serve once the switch is dropped.
    auto o = loop;
    o.replan_every = 0;
    for (auto step : all_steps) {
      INFO("fault at " << moe::live::step_name(step));
      check_fault(serve_disaggregated_staged<4, moe::replication::BatchSplit>(100, o, {.fault_rank = 0}, step),
                  "planted fault", 0);
    }
  }
}
#endif

#if !defined(MOE_TEST_TSAN)
TEST_CASE("device live layers: migrate_to without spare slots grows a rank past what it first served",
          "[cuda][layer][findep][live][migrate]") {
  // The workspace of a layer with a load window holds any plan within the first plan's most
  // experts per rank, not only the first: here a rank that first served 2 experts (fewer than
  // top_k) serves 8 after Layer::migrate_to, with no spare slots. Every pass against the reference.
  constexpr moe::live::Options grow{.window = 4, .migration_bytes_per_pass = 4096};
  // 6 slots of 6 KiB at 4 KiB per pass, then the switch before pass 11; under a sanitizer 3 passes
  // on the new plan instead of 9.
  constexpr int passes = moe::test::full_or(20, 14);
  SECTION("sequential, 4 staged ranks, replication::Table and BatchSplit (the split of 70 copies, the first had 64)") {
    World world = World::growing(4);
    auto body = [&]<class Replicas>(Replicas*) {
      return on_staged_ranks<4>([&](moe::collective::InProcess<4>& host, moe::test::Stream& st, int rank, RankRun& r) {
        moe::test::StagedDevice<4> comm(host);
        serve_rank<Replicas>(comm, st, rank, 4, passes, grow, std::nullopt, world, r);
      });
    };
    for (auto const& runs : {body(static_cast<moe::replication::Table*>(nullptr)),
                             body(static_cast<moe::replication::BatchSplit*>(nullptr))})
      check_loop(runs, 1);
  }
  SECTION("sequential through collective::Nccl, 4 ranks with a device each (the chunks asynchronous)") {
    if (!moe::test::has_devices(4)) return;
    World world = World::growing(4);
    auto runs = on_nccl_ranks(4, [&](moe::collective::Nccl& comm, moe::test::Stream& st, int rank, RankRun& r) {
      serve_rank<moe::replication::Table>(comm, st, rank, 4, passes, grow, std::nullopt, world, r);
    });
    check_loop(runs, 1);
  }
  SECTION("disaggregated FinDEP, 2 AG + 2 EG staged, replication::Table and BatchSplit") {
    World world = World::growing(2);
    auto body = [&]<class Replicas>(Replicas*) {
      return on_staged_ranks<4>([&](moe::collective::InProcess<4>& host, moe::test::Stream& st, int rank, RankRun& r) {
        moe::test::StagedDevice<4> a2e(host), e2a(host);
        serve_disaggregated_rank<Replicas>(a2e, &e2a, st, rank, 4, passes, grow, std::nullopt, Disaggregated<>{},
                                           world, r);
      });
    };
    for (auto const& runs : {body(static_cast<moe::replication::Table*>(nullptr)),
                             body(static_cast<moe::replication::BatchSplit*>(nullptr))}) {
      check_loop(runs, 1);
      check_ag_sent_nothing(runs, 2);
    }
  }
}
#endif

TEST_CASE("device disaggregated live layer through collective::Nccl: 2 AG + 2 EG, one device each",
          "[cuda][layer][findep][nccl][live]") {
  if (!moe::test::has_devices(4)) return;
  // Under ThreadSanitizer (CI runs this case there for the migration's stream order) 35 passes: the
  // re-plan started before pass 20 is adopted by pass 25, one plan and 10 passes on it.
  constexpr bool tsan = moe::test::thread_sanitized;
  auto runs = serve_disaggregated_nccl(4, tsan ? 35 : loop_passes(200), loop);
  check_loop(runs, tsan ? 1 : loop_plans(4));
  check_ag_sent_nothing(runs, 2);
}
