#pragma once
// Re-planning while serving (moe::Layer with LayerOptions::live): the load window, the re-planner
// and the weight migration, as the layer front (moe/layer/layer.hpp) runs them on every pass.
//
//   L layer(comm, placement::Table(...), replication::Table(...), weights,
//           {.max_tokens = 512, .live = {.window = 100, .replan_every = 500, .spare_slots = 2,
//                                        .migration_bytes_per_pass = 64 << 20}});
//   std::vector<T> arena(layer.arena_elements());   // caller-owned expert slots (held + spare)
//   layer.attach_arena(arena);                      // this rank's experts move into it
//   std::vector<std::byte> ws(layer.workspace_size());
//   for (...) layer.run(args, ws);                  // serves, counts, re-plans, migrates, switches
//
// What happens, per pass, on every rank (all decisions are taken from the same gathered data, so
// every rank takes the same one):
//  1. The ranks' agreement (one 256-byte vote each, as on every pass) carries each rank's re-plan
//     state: idle, planning, plan ready (with a hash of the plan), moving, moved (every incoming
//     expert received and the next tables built), or failed (with the reason).
//  2. From the votes: any failure aborts the migration on every rank (staged slots are dropped,
//     every rank keeps the old plan and the old weights) and every rank throws the same moe::Error
//     before any data of the pass moves; the next pass runs on the old plan. When every rank has
//     the same plan ready, the moves start; when every rank has moved, every rank switches to the
//     new plan before the pass (pointer swaps, nothing that can fail), and the slots its departed
//     experts held become its spare ones.
//  3. The pass itself (the executor), which also counts the pairs of each expert and the pairs
//     sent to each rank.
//  4. The window: one all-gather of (experts + ranks) int32 per rank; every rank then holds the
//     same per-expert loads and per-rank loads of the pass (LayerStats::rank_load_max / _mean).
//  5. One chunk of the moves: one all-to-all-v of at most `migration_bytes_per_pass` bytes sent and
//     received per rank, copied into the receiving rank's spare slots. A failure while packing or
//     unpacking is caught, the rank still takes part in the exchange, and it votes failed on the
//     next pass.
// A re-plan starts every `replan_every` passes (or when the caller calls Layer::replan() on every
// rank between the same two passes); it runs on a host thread, not the caller's: the planner
// (replication::migration::rebalance, minimal moves at EPLB's balance within `tolerance_permille`;
// or, for layers that split every batch, replication::split_planner, the fewest moves that lower
// the split's balance over the window's passes)
// takes milliseconds to seconds for large layers, which the serving thread must not wait for, and
// the caller's thread has no idle time between passes to lend. The planner threads (PlannerPool:
// one unless set_planner_threads asks for more) are the process's, shared by every layer and
// in-process rank, made when the first layer that can re-plan is built, and run as batch threads
// (Linux SCHED_BATCH: they never preempt a serving thread on waking): starting a re-plan only
// queues it. The rank's passes go on; the plan is used when every rank reports it ready.
// With Options::plan_rank = r only rank r queues the plan; the others stay planning. When the
// votes show r ready and every other rank planning, r's layout is all-gathered after that pass
// (before the chunk of step 5, which has none yet) and the others prepare it, so every rank is
// ready at the next vote and the hashes are compared as before.
//
// On the device paths (moe/layer/paths/device.cuh, device_disaggregated.cuh; collective::Nccl) the
// counts are made by a kernel and gathered on the device; a copy to pinned memory on the pass's
// stream is read on the next pass, after the agreement's synchronisation, so counting adds no host
// round trip to a pass. A caller who asks for the window (Layer::load_window) before the next pass
// waits for that copy instead. The chunks move with the collective's all-to-all-v of device
// memory, the arena is device memory, and the switch swaps device expert tables built before it.
//
// On the disaggregated paths (host and device) every AG rank counts the pairs it routed, per expert
// and per EG rank, and all ranks gather the rows. They re-plan over the expert group
// (Layer::plan_ranks(): plans, layouts and moves count EG indices; the AG ranks hold no arena and
// move no weights but vote and take part in each chunk's exchange).
//
// fork(): a child process inherits the layers but not the planner threads. The first re-plan a
// child starts, or a plan the parent had queued or running at the fork, runs on a pool of the
// child's own (made then); the parent's objects that the child cannot use (the threads, their
// queue, a plan in flight) are left alone in the child's memory, never locked or destroyed there.
// The locks the planner threads take between jobs (the plan memo's) are held across fork() by a
// pthread_atfork handler, so a child never inherits one locked.
//
// Memory: the caller owns the expert slots (the arena: arena_slots() = the most experts a rank
// holds + spare_slots, each slot_elements() elements: gate | up | down) and the workspace, which
// grows by 2 x migration_bytes_per_pass (the chunk's send and receive buffers) and the window's
// gather (ranks x (experts + ranks) int32). The peak extra memory of re-planning per rank is
// therefore spare_slots x slot bytes + 2 x migration_bytes_per_pass; the re-planner never gives
// a rank more new experts than it has spare slots.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>
#endif

#include "moe/config.hpp"
#include "moe/core/weights.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/replication/batch_split.hpp"
#include "moe/replication/migration.hpp"
#include "moe/replication/split_planner.hpp"

namespace moe::live {

/// What the re-planner computes.
///   minimal_move  replication::migration::rebalance: EPLB's max load (within the tolerance) with the
///                 fewest experts moved from the current layout (the default)
///   eplb          replication::eplb from scratch, as the engines re-plan (a full reshuffle: the
///                 baseline; needs spare_slots as large as the number of experts a rank holds)
///   split_balance replication::split_planner: the fewest copies that lower the mean of the per-batch
///                 split's max/mean over the window's passes (for replication::BatchSplit layers;
///                 tolerance_permille is then the least gain, in thousandths, a moved copy must bring;
///                 by default split_planner::automatic_gain_permille: 10 at 8 ranks, 2 at 32)
enum class Planner : std::int32_t { minimal_move = 0, eplb = 1, split_balance = 2 };

/// LayerOptions::live: the load window and re-planning. All zero: the layer keeps its plan and
/// counts nothing.
struct Options {
  int window = 0;        ///< passes of per-expert loads kept (0: none; re-planning needs a window)
  int replan_every = 0;  ///< start a re-plan every this many passes (0: only on Layer::replan())
  int spare_slots = 0;   ///< expert slots of spare memory per rank (the most experts a rank receives per re-plan)
  std::size_t migration_bytes_per_pass = 0;  ///< most weight bytes a rank sends, and receives, per pass
  /// minimal_move: the re-plan's max rank load is within (1 + this / 1000) of EPLB's; split_balance:
  /// the least gain of a moved copy. -1: 10 for minimal_move, split_planner::automatic_gain_permille
  /// (80 / ranks, at least 1) for split_balance (live::tolerance_of).
  int tolerance_permille = -1;
  int nodes = 1;                ///< nodes the ranks split into (rank r on node r / (ranks / nodes)): sources
                                ///< of moves prefer the receiver's node
  Planner planner = Planner::minimal_move;  ///< what a re-plan computes
  /// Who plans: -1, every rank for itself (each from the same window, so the plans agree); r >= 0,
  /// rank r alone, which then sends its layout to the others (an all-gather of plan ranks x width int32
  /// after a pass, staged through the migration buffers, so migration_bytes_per_pass must hold it).
  /// A model whose layers set plan_rank = layer % ranks spreads its planning over the processes.
  int plan_rank = -1;
};

/// The tolerance (or least gain) a re-plan of `ranks` ranks uses: Options::tolerance_permille, or
/// its default for the planner when that is -1.
inline int tolerance_of(Options const& o, int ranks) {
  if (o.tolerance_permille >= 0) return o.tolerance_permille;
  return o.planner == Planner::split_balance ? replication::split_planner::automatic_gain_permille(ranks) : 10;
}

/// The step of a migration a fault-injection hook is called at (Layer::set_fault_hook).
enum class Step { plan, pack, unpack, prepare_switch };

inline char const* step_name(Step s) {
  switch (s) {
    case Step::plan: return "plan";
    case Step::pack: return "pack";
    case Step::unpack: return "unpack";
    case Step::prepare_switch: return "prepare_switch";
  }
  return "?";
}

/// The last `capacity` passes' loads, the same on every rank: pairs per expert and pairs each rank
/// received, summed over the ranks.
class LoadWindow {
public:
  LoadWindow() = default;
  LoadWindow(int passes, int experts, int ranks)
      : cap_(passes), E_(experts), R_(ranks),
        data_(static_cast<std::size_t>(passes) * static_cast<std::size_t>(experts + ranks)) {}

  /// Adds one pass: `gathered` holds every rank's row of (experts + ranks) int32 (its pairs per
  /// expert, then its pairs sent to each rank), rank-major.
  void push(std::span<std::int32_t const> gathered) {
    if (cap_ == 0) return;
    auto w = static_cast<std::size_t>(E_ + R_);
    check(gathered.size() == w * static_cast<std::size_t>(R_), "load window: ", gathered.size(), " counts, expected ",
          R_, " ranks x ", w);
    auto* row = data_.data() + static_cast<std::size_t>(pushed_ % cap_) * w;
    std::fill(row, row + w, 0);
    for (std::size_t r = 0; r < static_cast<std::size_t>(R_); ++r)
      for (std::size_t i = 0; i < w; ++i) row[i] += gathered[r * w + i];
    ++pushed_;
  }

  [[nodiscard]] int capacity() const { return cap_; }
  [[nodiscard]] int size() const { return static_cast<int>(std::min<long long>(pushed_, cap_)); }
  [[nodiscard]] long long pushed() const { return pushed_; }
  /// Pass i of those held, 0 the oldest.
  [[nodiscard]] std::span<long long const> experts(int i) const { return {row(i), static_cast<std::size_t>(E_)}; }
  [[nodiscard]] std::span<long long const> rank_loads(int i) const {
    return {row(i) + E_, static_cast<std::size_t>(R_)};
  }
  /// Pairs per expert of every pass held, oldest first: size() x experts.
  [[nodiscard]] std::vector<long long> expert_rows() const {
    std::vector<long long> out;
    out.reserve(static_cast<std::size_t>(size()) * static_cast<std::size_t>(E_));
    for (int i = 0; i < size(); ++i) out.insert(out.end(), experts(i).begin(), experts(i).end());
    return out;
  }
  /// Pairs per expert over the passes held.
  [[nodiscard]] std::vector<float> expert_loads() const {
    std::vector<float> out(static_cast<std::size_t>(E_), 0.0f);
    for (int i = 0; i < size(); ++i)
      for (std::size_t e = 0; e < out.size(); ++e) out[e] += static_cast<float>(experts(i)[e]);
    return out;
  }

private:
  [[nodiscard]] long long const* row(int i) const {
    check(i >= 0 && i < size(), "load window: pass ", i, " outside the ", size(), " held");
    long long first = pushed_ - size();
    return data_.data() + static_cast<std::size_t>((first + i) % cap_) * static_cast<std::size_t>(E_ + R_);
  }
  int cap_ = 0, E_ = 0, R_ = 0;
  long long pushed_ = 0;
  std::vector<long long> data_;
};

/// A serving plan: the primary rank of each expert and the ranks holding a copy (ascending, the
/// primary among them).
struct Plan {
  std::vector<int> primary;
  std::vector<std::vector<int>> copies;
  friend bool operator==(Plan const&, Plan const&) = default;
};

/// The most experts one rank holds.
inline int width_of(Plan const& p, int ranks) {
  std::vector<int> held(static_cast<std::size_t>(ranks), 0);
  for (auto const& c : p.copies)
    for (int r : c) ++held[static_cast<std::size_t>(r)];
  return held.empty() ? 0 : *std::max_element(held.begin(), held.end());
}

/// The plan as a slot layout (replication::migration's phy2log): ranks x width, each rank's
/// experts ascending, then -1 (empty).
inline std::vector<int> layout_of(Plan const& p, int ranks, int width) {
  std::vector<int> out(static_cast<std::size_t>(ranks) * static_cast<std::size_t>(width), -1);
  std::vector<int> fill(static_cast<std::size_t>(ranks), 0);
  for (std::size_t e = 0; e < p.copies.size(); ++e)
    for (int r : p.copies[e]) {
      int& f = fill[static_cast<std::size_t>(r)];
      check(f < width, "live: rank ", r, " holds more than ", width, " experts");
      out[static_cast<std::size_t>(r) * static_cast<std::size_t>(width) + static_cast<std::size_t>(f++)] =
          static_cast<int>(e);
    }
  return out;
}

/// The layout the re-planner starts from: layout_of, with each rank's empty slots holding second
/// copies of its own experts (in turn) rather than -1. The planner fills -1 slots with new
/// experts before its capped search, which could give a rank more new experts than its spare
/// slots; a second copy on the same rank moves nothing, and the search may replace it.
inline std::vector<int> planning_layout(Plan const& p, int ranks, int width) {
  auto out = layout_of(p, ranks, width);
  auto w = static_cast<std::size_t>(width);
  for (std::size_t r = 0; r < static_cast<std::size_t>(ranks); ++r) {
    std::size_t held = 0;
    while (held < w && out[r * w + held] >= 0) ++held;
    for (std::size_t i = held; i < w && held > 0; ++i) out[r * w + i] = out[r * w + (i - held) % held];
  }
  return out;
}

/// The plan of a slot layout (ranks x width, -1 empty; a rank listing an expert twice holds it
/// once). The primary of an expert stays where it was if that rank still holds it, else it is the
/// lowest rank holding it. Throws moe::Error, naming the slot, for an expert outside [0, experts)
/// and, naming the expert, for an expert no rank holds.
inline Plan plan_of(std::span<int const> layout, int ranks, int experts, std::span<int const> old_primary) {
  check(ranks > 0 && !layout.empty() && layout.size() % static_cast<std::size_t>(ranks) == 0, "live: a layout of ",
        layout.size(), " slots does not split over ", ranks, " ranks");
  auto width = layout.size() / static_cast<std::size_t>(ranks);
  Plan p;
  p.copies.resize(static_cast<std::size_t>(experts));
  for (std::size_t i = 0; i < layout.size(); ++i) {
    int e = layout[i];
    if (e == -1) continue;
    check(e >= 0 && e < experts, "live: the plan's slot ", i % width, " of rank ", i / width, " names expert ", e,
          ", outside [0, ", experts, ")");
    auto& c = p.copies[static_cast<std::size_t>(e)];
    int r = static_cast<int>(i / width);
    if (std::find(c.begin(), c.end(), r) == c.end()) c.push_back(r);
  }
  p.primary.resize(static_cast<std::size_t>(experts));
  for (std::size_t e = 0; e < p.copies.size(); ++e) {
    auto& c = p.copies[e];
    check(!c.empty(), "live: the plan leaves expert ", e, " on no rank");
    std::sort(c.begin(), c.end());
    int keep = e < old_primary.size() ? old_primary[e] : -1;
    p.primary[e] = std::find(c.begin(), c.end(), keep) != c.end() ? keep : c.front();
  }
  return p;
}

/// One expert copied to a rank that did not hold it: from `src`, which did.
struct Move {
  int expert = 0, src = 0, dst = 0;
  friend bool operator==(Move const&, Move const&) = default;
};

/// The moves from one plan to the next, by expert then receiving rank. The source is a holder in
/// the receiver's node if there is one, else the holder with the fewest sends so far, then the
/// lowest rank.
inline std::vector<Move> moves_between(Plan const& from, Plan const& to, int ranks, int nodes) {
  check(from.copies.size() == to.copies.size(), "live: plans of ", from.copies.size(), " and ", to.copies.size(),
        " experts");
  int per_node = nodes > 0 && ranks % nodes == 0 ? ranks / nodes : ranks;
  std::vector<int> sends(static_cast<std::size_t>(ranks), 0);
  std::vector<Move> out;
  for (std::size_t e = 0; e < to.copies.size(); ++e) {
    auto const& had = from.copies[e];
    for (int d : to.copies[e]) {
      if (std::find(had.begin(), had.end(), d) != had.end()) continue;
      int src = -1;
      for (int s : had) {
        auto better = [&](int x, int y) {
          bool nx = x / per_node == d / per_node, ny = y / per_node == d / per_node;
          if (nx != ny) return nx;
          return sends[static_cast<std::size_t>(x)] < sends[static_cast<std::size_t>(y)];
        };
        if (src < 0 || better(s, src)) src = s;
      }
      check(src >= 0, "live: expert ", e, " has no holder to copy it from");
      ++sends[static_cast<std::size_t>(src)];
      out.push_back({static_cast<int>(e), src, d});
    }
  }
  return out;
}

/// Which bytes of which move each pass carries: moves in order, each pass at most `budget` bytes
/// sent and at most `budget` received per rank. Greedy and deterministic: in pass p every move
/// with bytes left takes as many as its sender and receiver still have room for this pass.
class ChunkSchedule {
public:
  struct Piece {
    int move = 0;
    std::size_t offset = 0, bytes = 0;
  };

  ChunkSchedule() = default;
  ChunkSchedule(std::vector<Move> moves, int ranks, std::size_t slot_bytes, std::size_t budget)
      : moves_(std::move(moves)) {
    check(budget > 0 || moves_.empty(), "live: moves need migration_bytes_per_pass > 0");
    std::vector<std::size_t> done(moves_.size(), 0), sent(static_cast<std::size_t>(ranks)),
        got(static_cast<std::size_t>(ranks));
    std::size_t left = moves_.size();
    while (left > 0) {
      std::fill(sent.begin(), sent.end(), 0);
      std::fill(got.begin(), got.end(), 0);
      first_.push_back(pieces_.size());
      for (std::size_t m = 0; m < moves_.size(); ++m) {
        if (done[m] == slot_bytes) continue;
        auto s = static_cast<std::size_t>(moves_[m].src), d = static_cast<std::size_t>(moves_[m].dst);
        std::size_t take = std::min({slot_bytes - done[m], budget - sent[s], budget - got[d]});
        if (take == 0) continue;
        pieces_.push_back({static_cast<int>(m), done[m], take});
        done[m] += take;
        sent[s] += take;
        got[d] += take;
        if (done[m] == slot_bytes) --left;
      }
    }
    first_.push_back(pieces_.size());
  }

  [[nodiscard]] int passes() const { return static_cast<int>(first_.size()) - 1 < 0 ? 0 : static_cast<int>(first_.size()) - 1; }
  [[nodiscard]] std::vector<Move> const& moves() const { return moves_; }
  /// The pieces pass p carries, in move order.
  [[nodiscard]] std::span<Piece const> pass(int p) const {
    return std::span<Piece const>(pieces_).subspan(first_[static_cast<std::size_t>(p)],
                                                   first_[static_cast<std::size_t>(p) + 1] - first_[static_cast<std::size_t>(p)]);
  }

private:
  std::vector<Move> moves_;
  std::vector<Piece> pieces_;
  std::vector<std::size_t> first_;
};

/// Bytes of one expert in a slot: gate | up | down.
template <class T>
constexpr std::size_t slot_bytes(ShapeSpec const& s) {
  return 3 * static_cast<std::size_t>(s.expert_ffn) * static_cast<std::size_t>(s.hidden) * sizeof(T);
}

/// Copies bytes [offset, offset + n) of an expert's slot image (gate | up | down) out of its
/// weights, wherever they are, with `copy(to, from, bytes)` (a memcpy on the host, an
/// asynchronous device copy on the device paths).
template <class T, class Copy>
void read_slot(ExpertWeights<T> const& w, std::size_t part_bytes, std::size_t offset, std::size_t n, std::byte* out,
               Copy&& copy) {
  T const* parts[3] = {w.gate, w.up, w.down};
  while (n > 0) {
    std::size_t p = offset / part_bytes, in = offset % part_bytes, take = std::min(n, part_bytes - in);
    copy(out, reinterpret_cast<std::byte const*>(parts[p]) + in, take);
    out += take, offset += take, n -= take;
  }
}

/// The replica policy of a new plan, with the old one's other settings (the servers and balance
/// slack of replication::BatchSplit).
inline replication::Table rebuilt(replication::Table const&, std::vector<std::vector<int>> copies) {
  return replication::Table(std::move(copies));
}
inline replication::BatchSplit rebuilt(replication::BatchSplit const& old, std::vector<std::vector<int>> copies) {
  return replication::BatchSplit(std::move(copies), old.servers(), old.layout().slack_permille);
}

/// The policies a live layer can re-plan: an expert -> rank table and a replica policy that is a
/// copy list (replication::Table, replication::BatchSplit).
template <class Placement, class Replicas>
concept Replannable = std::is_same_v<Placement, placement::Table> && requires(Replicas const& r) {
  { rebuilt(r, std::vector<std::vector<int>>{}) } -> std::same_as<Replicas>;
};

/// 64-bit FNV-1a over 32-bit words, low byte first: hash_layout's (the ranks compare their plans by
/// it), and the agreement's hash of the tables a layer routes with (moe::detail::hash_tables). Two
/// unrelated plans or tables hash the same with a chance of about 2^-64 (32-bit FNV-1a let two
/// tables of 8 experts on 3 ranks collide: tests/layer/test_layer_errors.cpp). FNV is no
/// cryptographic hash: this catches mistakes, not a rank that forges its tables.
struct Fnv1a {
  std::uint64_t h = 14695981039346656037ull;  // FNV's 64-bit offset basis
  void byte(std::uint8_t b) { h = (h ^ b) * 1099511628211ull; }  // FNV's 64-bit prime
  void mix(std::uint32_t u) {
    for (int b = 0; b < 4; ++b) byte(static_cast<std::uint8_t>(u >> (8 * b)));
  }
};

inline std::uint64_t hash_layout(std::span<int const> layout) {
  Fnv1a f;
  for (int v : layout) f.mix(static_cast<std::uint32_t>(v));
  return f.h;
}

/// This process's id (0 where there is no fork()): what tells an object made before a fork() from
/// one made in this process.
inline long process_id() noexcept {
#if defined(__linux__)
  return static_cast<long>(::getpid());
#else
  return 0;
#endif
}

/// Deletes `p` if it was made in this process; after a fork() the parent's object stays, unused:
/// its mutex may be held and its condition waited on by threads the child does not have, so
/// destroying it could block for ever (glibc's pthread_cond_destroy waits for the waiters).
template <class Object>
void delete_if_here(Object* p) noexcept {
  if (p->pid == process_id()) delete p;
}

/// Holds `mu` across every fork() of the process (pthread_atfork), so that a child never inherits
/// it locked by a thread it does not have. `mu` lives as long as the process (a function static).
template <std::mutex& (*Mutex)()>
void hold_across_fork() {
#if defined(__linux__)
  static int const once = ::pthread_atfork([] { Mutex().lock(); }, [] { Mutex().unlock(); }, [] { Mutex().unlock(); });
  (void)once;
#endif
}

/// The planner threads of the process (live::set_planner_threads; one unless set).
inline std::atomic<int>& planner_thread_count() {
  static std::atomic<int> n{1};
  return n;
}

/// The host threads that run the re-plans of every live layer of the process (every layer of a
/// model, and every rank of collective::InProcess), taking the jobs in the order they came: one
/// thread unless live::set_planner_threads() asks for more. The pool is made when the first layer
/// that can re-plan is built and ends when the last such layer goes, so no pass pays for starting
/// a thread: a thread started at the end of a pass cost that pass 0.1-1 ms on a machine with fewer
/// cores than ranks, as the new thread took the core from the rank that started it
/// (docs/results/serving-loop-layer.md). A pool for the process also keeps the re-plans of many
/// layers from taking every core at once.
class PlannerPool {
public:
  /// The process's pool (made on the first call after the last holder let it go, and in a
  /// fork()ed child on its first call there).
  static std::shared_ptr<PlannerPool> shared() {
    hold_across_fork<&made>();
    std::lock_guard lock(made());
    auto p = current().lock();
    if (!p || !p->here()) current() = p = std::shared_ptr<PlannerPool>(new PlannerPool, delete_if_here<PlannerPool>);
    return p;
  }
  /// The pool of this process if one is held now (for live::set_planner_threads).
  static std::shared_ptr<PlannerPool> existing() {
    hold_across_fork<&made>();
    std::lock_guard lock(made());
    auto p = current().lock();
    return p && p->here() ? p : nullptr;
  }
  /// Whether the threads run in this process (not so in a fork()ed child of the process that made them).
  [[nodiscard]] bool here() const noexcept { return pid == process_id(); }
  void post(std::function<void()> job) {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }
  /// Starts threads until the pool has `n` (it never shrinks).
  void grow(int n) {
    std::lock_guard lock(mu_);
    while (static_cast<int>(threads_.size()) < n) threads_.emplace_back([this] { loop(); });
  }
  [[nodiscard]] int threads() const {
    std::lock_guard lock(mu_);
    return static_cast<int>(threads_.size());
  }
  PlannerPool(PlannerPool const&) = delete;
  PlannerPool& operator=(PlannerPool const&) = delete;
  /// Runs the jobs still queued, then joins the threads.
  ~PlannerPool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

private:
  PlannerPool() { grow(std::max(1, planner_thread_count().load())); }
  void loop() {
#if defined(__linux__)
    // SCHED_BATCH (nice 19 where that is refused), set before the first job: a woken planner then
    // does not preempt a serving thread (one that lowered itself only once running had already
    // taken the core), yet keeps a fair share of a busy machine. SCHED_IDLE, which gives up even
    // that share, starved the plans of tests run beside two busy processes.
    sched_param batch{};
    if (pthread_setschedparam(pthread_self(), SCHED_BATCH, &batch) != 0)
      (void)setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
#endif
    for (;;) {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();  // a job catches its own errors
    }
  }
  static std::mutex& made() {
    static std::mutex m;
    return m;
  }
  static std::weak_ptr<PlannerPool>& current() {
    static std::weak_ptr<PlannerPool> one;
    return one;
  }

public:
  long const pid = process_id();  // the process whose threads these are

private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

/// How many threads plan for the live layers of this process (at least 1; 1 unless set). Plans
/// are independent, so n threads make the plans of a model whose layers re-plan together about
/// n times sooner, with up to n cores busy meanwhile. Call it outside the passes (it starts the
/// threads at once if the pool exists, else when the first layer that can re-plan is built); the
/// pool never shrinks while it lives.
inline void set_planner_threads(int n) {
  check(n >= 1, "live::set_planner_threads: ", n, " threads (at least 1)");
  planner_thread_count() = n;
  if (auto pool = PlannerPool::existing()) pool->grow(n);
}

/// The plans made lately in this process, by their inputs. The ranks of collective::InProcess
/// queue the same job on the planner pool (the window and the layout are the same on every rank,
/// and the planner is deterministic), so each distinct job is planned once and the other ranks take
/// a copy: 8 in-process ranks of a 58-layer model would otherwise plan every layer 8 times over.
/// A job whose twin is being planned on another thread of the pool waits for that plan. Holds the
/// last `capacity` plans (a few KB each at DeepSeek-V3's size).
template <class Result>
class PlanMemo {
public:
  struct Key {
    std::vector<float> loads;
    std::vector<long long> batches;
    std::vector<int> layout;
    int ranks = 0, spare = 0, tolerance_permille = 0, nodes = 0;
    Planner planner = Planner::minimal_move;
    friend bool operator==(Key const&, Key const&) = default;
  };
  static constexpr std::size_t capacity = 64;

  static PlanMemo& process() {
    static PlanMemo memo;
    hold_across_fork<&memo_mutex>();
    return memo;
  }
  /// The plan remembered for `key`, or the one another thread is making for it, else make()
  /// (remembered if it returns; its error reaches the threads that waited for it too).
  template <class Make>
  Result get(Key key, Make&& make) {
    std::shared_ptr<Pending> mine;
    std::shared_future<Result> theirs;
    {
      std::lock_guard lock(mu_);
      for (auto const& [k, r] : recent_)
        if (k == key) {
          ++reused_;
          return r;
        }
      // A twin made by a thread of a fork()'s parent never ends here: it is left alone.
      for (auto const& [k, p] : pending_)
        if (p->pid == process_id() && k == key) theirs = p->future;
      if (theirs.valid()) {
        ++reused_;
      } else {
        mine = std::make_shared<Pending>();
        pending_.emplace_back(key, mine);
      }
    }
    if (theirs.valid()) return theirs.get();
    std::exception_ptr error;
    Result r;
    try {
      r = make();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mu_);
      std::erase_if(pending_, [&](auto const& e) { return e.second == mine; });
      if (!error) {
        recent_.emplace_front(std::move(key), r);
        if (recent_.size() > capacity) recent_.pop_back();
        ++made_;
      }
    }
    if (error) {
      mine->promise.set_exception(error);
      std::rethrow_exception(error);
    }
    mine->promise.set_value(r);
    return r;
  }
  /// Plans computed and plans taken from memory since the process started.
  [[nodiscard]] long long made() const {
    std::lock_guard lock(mu_);
    return made_;
  }
  [[nodiscard]] long long reused() const {
    std::lock_guard lock(mu_);
    return reused_;
  }

private:
  struct Pending {
    long const pid = process_id();
    std::promise<Result> promise;
    std::shared_future<Result> future = promise.get_future().share();
  };
  static std::mutex& memo_mutex() { return process().mu_; }
  mutable std::mutex mu_;
  std::deque<std::pair<Key, Result>> recent_;
  std::vector<std::pair<Key, std::shared_ptr<Pending>>> pending_;  // being planned now
  long long made_ = 0, reused_ = 0;
};

/// The re-planner: a new slot layout from the window's loads and the current layout, computed on
/// the process's PlannerPool. The plan moves the fewest experts at EPLB's balance
/// (replication::migration::rebalance) and gives no rank more new experts than `spare` (if the
/// first plan does, the copies it may make are capped and it is planned again).
class Replanner {
public:
  struct Result {
    std::vector<int> layout;  ///< ranks x width
    long long copies = 0;     ///< slots that needed an expert from another rank (-1: not counted)
    /// The largest rank load of the new layout, of EPLB's, and of the old one; for
    /// Planner::split_balance the window's mean split max/mean of the new and old layouts (EPLB's 0).
    double max_load = 0, eplb_max_load = 0, old_max_load = 0;
  };

  /// The plan (blocking): what the thread runs.
  /// `batches`: the window's passes x experts loads, read by Planner::split_balance only.
  static Result plan(std::vector<float> const& loads, std::vector<int> const& layout, int ranks, int spare,
                     int tolerance_permille, int nodes, Planner planner = Planner::minimal_move,
                     std::vector<long long> const& batches = {}) {
    check(spare > 0, "live: re-planning needs spare slots (live::Options::spare_slots > 0)");
    int E = static_cast<int>(loads.size()), P = static_cast<int>(layout.size());
    if (planner == Planner::split_balance) {
      replication::split_planner::Options o;
      o.spare = spare;
      o.min_gain_permille = tolerance_permille;
      auto r = replication::split_planner::plan(batches, E, layout, ranks, o);
      return {std::move(r.layout), r.copies, r.after, 0, r.before};
    }
    replication::eplb::Matrix<float> w(1, E);
    std::copy(loads.begin(), loads.end(), w.v.begin());
    if (planner == Planner::eplb) {
      // From scratch; the layer refuses the plan if a rank receives more experts than it has free slots.
      auto r = replication::eplb::rebalance_experts(w, P, 1, 1, ranks);
      return {r.phy2log.v, -1, 0, 0, 0};
    }
    replication::eplb::Matrix<int> old(1, P);
    std::copy(layout.begin(), layout.end(), old.v.begin());
    replication::migration::Options o;
    o.tolerance = tolerance_permille / 1000.0;
    o.num_nodes = nodes;
    auto width = static_cast<std::size_t>(P / ranks);
    auto most_new = [&](replication::eplb::Matrix<int> const& next) {
      int worst = 0;
      for (std::size_t r = 0; r < static_cast<std::size_t>(ranks); ++r) {
        int n = 0;
        for (std::size_t i = 0; i < width; ++i) {
          int e = next.v[r * width + i];
          bool had = false, seen = false;
          for (std::size_t j = 0; j < width; ++j) had |= layout[r * width + j] == e;
          for (std::size_t j = 0; j < i; ++j) seen |= next.v[r * width + j] == e;
          n += e >= 0 && !had && !seen;
        }
        worst = std::max(worst, n);
      }
      return worst;
    };
    auto r = replication::migration::rebalance(w, old, ranks, o);
    // Too many new experts on a rank: cap the copies and plan again, down to `spare` copies in all.
    // Empty slots (-1) are filled before the capped search, so even that cap may not fit: then the
    // layer keeps its plan (a re-plan that changes nothing). The cap falls on every round, so this
    // ends.
    while (most_new(r.phy2log) > spare) {
      if (o.max_copies_per_layer == spare) {
        auto const& st = r.layers[0];
        return {layout, 0, st.old_max_load, st.eplb_max_load, st.old_max_load};
      }
      long long was = o.max_copies_per_layer < 0 ? r.copies() : o.max_copies_per_layer;
      o.max_copies_per_layer = std::max<long long>(spare, was * 3 / 4);
      r = replication::migration::rebalance(w, old, ranks, o);
    }
    auto const& st = r.layers[0];
    return {r.phy2log.v, r.copies(), st.max_load, st.eplb_max_load, st.old_max_load};
  }

  /// Takes a share of the process's planner pool, so that start() does not make it in a pass.
  /// Layers that can re-plan call it when they are built.
  void attach() {
    if (!pool_ || !pool_->here()) pool_ = PlannerPool::shared();
  }
  /// Queues a plan on the planner pool; the caller goes on.
  void start(std::vector<float> loads, std::vector<int> layout, int ranks, int spare, int tolerance_permille, int nodes,
             Planner planner, std::function<void(Step)> const& hook, std::vector<long long> batches = {}) {
    check(!busy(), "live: a re-plan is already running");
    request_ = std::make_shared<Request const>(Request{std::move(loads), std::move(layout), std::move(batches), ranks,
                                                       spare, tolerance_permille, nodes, planner, hook});
    post();
  }
  [[nodiscard]] bool busy() const { return job_ != nullptr; }
  [[nodiscard]] bool ready() {
    if (!job_) return false;
    if (orphaned()) {
      post();  // made before a fork(): plan it again here
      return false;
    }
    std::lock_guard lock(job_->mu);
    return job_->state == Job::done;
  }
  /// The result of the plan (waits for it); rethrows the planner's error.
  Result take() {
    check(job_ != nullptr, "live: no re-plan to take");
    if (orphaned()) post();
    auto job = std::move(job_);
    request_.reset();
    std::unique_lock lock(job->mu);
    job->cv.wait(lock, [&] { return job->state == Job::done; });
    if (job->error) std::rethrow_exception(job->error);
    return std::move(job->result);
  }
  /// Drops the plan: one still queued never runs; one running is waited for (its hook may refer
  /// to the caller's objects), and its result and errors are dropped. One made before a fork() is
  /// the parent's, and never runs here.
  void drop() noexcept {
    if (!job_) return;
    auto job = std::move(job_);
    request_.reset();
    if (job->pid != process_id()) return;
    std::unique_lock lock(job->mu);
    if (job->state == Job::queued) {
      job->state = Job::dropped;
      return;
    }
    job->cv.wait(lock, [&] { return job->state == Job::done; });
  }
  Replanner() = default;
  Replanner(Replanner const&) = delete;
  Replanner& operator=(Replanner const&) = delete;
  ~Replanner() { drop(); }

private:
  /// What start() was given: kept until the result is taken, so that a fork()ed child can plan it again.
  struct Request {
    std::vector<float> loads;
    std::vector<int> layout;
    std::vector<long long> batches;
    int ranks, spare, tolerance_permille, nodes;
    Planner planner;
    std::function<void(Step)> hook;
  };
  struct Job {
    long const pid = process_id();  // the process whose planner pool runs it
    std::mutex mu;
    std::condition_variable cv;
    enum State { queued, running, done, dropped } state = queued;
    Result result;
    std::exception_ptr error;
  };

  /// The job in flight was queued by the parent of this fork()ed process: its thread is not here.
  [[nodiscard]] bool orphaned() const { return job_ && job_->pid != process_id(); }

  /// Queues request_ as a new job on this process's planner pool.
  void post() {
    attach();
    auto job = std::shared_ptr<Job>(new Job, delete_if_here<Job>);
    pool_->post([job, req = request_] {
      {
        std::lock_guard lock(job->mu);
        if (job->state == Job::dropped) return;
        job->state = Job::running;
      }
      Result r;
      std::exception_ptr error;
      try {
        if (req->hook) req->hook(Step::plan);
        r = PlanMemo<Result>::process().get(
            {req->loads, req->batches, req->layout, req->ranks, req->spare, req->tolerance_permille, req->nodes,
             req->planner},
            [&] {
              return plan(req->loads, req->layout, req->ranks, req->spare, req->tolerance_permille, req->nodes,
                          req->planner, req->batches);
            });
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(job->mu);
        job->result = std::move(r);
        job->error = error;
        job->state = Job::done;
      }
      job->cv.notify_all();
    });
    job_ = std::move(job);
  }

  std::shared_ptr<PlannerPool> pool_;
  std::shared_ptr<Request const> request_;
  std::shared_ptr<Job> job_;
};

}  // namespace moe::live
