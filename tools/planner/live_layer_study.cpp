// live_layer_study: the host moe::Layer serving a drifting stream of real routing while it
// re-balances, four strategies side by side (issue 36, item 5, the host-layer half; the
// planners'-model half for DeepSeek-V3 is serving_loop). docs/results/serving-loop-layer.md.
//
// The layer is the real one (moe::Layer, host path, collective::InProcess<N> threads, or
// collective::Mpi processes in the live_layer_study_mpi build with --mpi), at a reduced width:
//   olmoe    OLMoE-1B-7B layer 7 routing (64 experts, top-8), hidden 64, expert_ffn 32, fp32
//   mixtral  Mixtral-8x7B layer 7 routing (8 experts, top-2, renormalised), hidden 16, expert_ffn 32
// Tokens: each rank draws its tokens of a pass from the real token -> expert counts of
// tests/data/olmoe-routing/<model>/<domain> (profile::TokenSampler, seeded per pass and rank).
// The domain drifts over the P passes: arxiv until P/3, a linear crossfade to github until P/2
// (each token is github with probability (p - P/3 + 1) / (P/2 - P/3)), github until 2P/3, a
// crossfade to book until 5P/6, then book. The layer's own router picks exactly the drawn
// experts: router row e is the unit vector on coordinate e (hidden >= experts), and token t's
// input holds 4 - 2j/k on the coordinate of its j-th drawn expert plus uniform noise of +-0.005
// on every coordinate; the single-process reference routes every token and the tool counts the
// tokens whose chosen set differs from the drawn one (must be 0).
//
// The first plan, shared by every strategy: EPLB (replication::eplb, one node) on the loads of the
// first `window` passes' tokens, experts + ranks slots (one extra per rank). Strategies:
//   static   that plan for ever (the layer counts loads only: LayerOptions::live.window)
//   full     engine-style: every R passes EPLB from scratch on the window's loads, handed to the
//            layer with migrate_to(); spare slots = the full width and a chunk of the full width,
//            so everything moves in one pass (stop-the-world, as vLLM's default)
//   minimal  the layer's own re-planner (LayerOptions::live: replan_every = R, spare_slots,
//            migration_bytes_per_pass = chunk experts' bytes), replica choice by the fixed rule
//   split    the same with replication::BatchSplit as the replica policy (per-batch balance)
//   splitplan  per-batch balance re-planned by the split's own score (live::Planner::split_balance:
//            the fewest copies that lower the window's mean split max/mean by --split-gain-permille
//            each); not in the default list
//
// Every pass on every rank: the outputs against moe::reference_forward on the rank's tokens (all
// passes by default, --check-every), the layer's load window against the drawn routes. The ranks
// meet at a barrier before and after each timed run(), so the checks never share the cores with
// a pass being timed. Bytes: the layer's LayerStats::migration_bytes summed over ranks and
// passes, which must equal the expert copies the adopted plans added (each a (rank, expert) pair
// the rank did not hold) x slot bytes.
// Real-model bytes scale those copies by the real expert size (models.hpp, bf16).
//
// --ag N: the disaggregated layer instead (host FinDEP, schedule::FinDep AASS with r1 = 2
// micro-batches of r2 = 2 chunks): ranks [0, N) draw the tokens and run attention, the other
// ranks hold the experts; the first plan, the re-plans, the balance and the moves are over those
// expert ranks (Layer::plan_ranks()), which must split the experts evenly.
//
//   live_layer_study [--models olmoe,mixtral] [--ranks 8|4] [--passes 2000] [--tokens 64]
//                    [--window 100] [--replan-every 100] [--spare-slots 2] [--chunk-experts 1]
//                    [--tolerance-permille 10] [--strategies static,full,minimal,split[,splitplan]]
//                    [--split-gain-permille -1]   (-1: the layer's default, 80 / ranks permille)
//                    [--plan-rank -1]   (r: rank r alone plans and shares its plans, live.plan_rank)
//                    [--ag 0]           (N: N attention ranks, the rest expert ranks: FinDEP)
//                    [--check-every 1] [--seed 1] [--pass-log FILE] [--data-dir DIR]
//   mpirun -np 4 live_layer_study_mpi --mpi [same options but --ranks]
// Exit status 1 when a check fails (router mismatch, output error, bytes, a pass that threw).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "moe/moe.hpp"
#include "moe/layer/reference.hpp"
#include "moe/replication/batch_split.hpp"
#include "moe/replication/eplb.hpp"
#include "moe_tools/cli.hpp"
#ifdef MOE_LIVE_STUDY_MPI
#include "moe/collective/mpi.hpp"
#endif

using namespace moe;

namespace {

constexpr int kLayer = 7;
constexpr char const* kProgram = "live_layer_study";
constexpr std::array<char const*, 3> kDomains{"arxiv", "github", "book"};

using OlmoeSmall = models::Reduced<models::OLMoE_1B_7B, 64, 32, DType::f32>;
using MixtralSmall = models::Reduced<models::Mixtral8x7B, 16, 32, DType::f32>;

enum class Strategy { static_plan, full, minimal, split, split_planner };

char const* name_of(Strategy s) {
  switch (s) {
    case Strategy::static_plan: return "static";
    case Strategy::full: return "full-reshuffle";
    case Strategy::minimal: return "minimal-move";
    case Strategy::split: return "minimal+split";
    case Strategy::split_planner: return "split-planner";
  }
  return "?";
}

struct Study {
  int ranks = 8, passes = 2000, tokens = 64, window = 100, replan_every = 100, spare = 2, chunk = 1;
  int tolerance = 10, check_every = 1, split_gain = -1, plan_rank = -1;
  int ag = 0;  ///< --ag: attention ranks of a disaggregated layer (FinDEP); 0: the sequential layer
  /// The ranks whose tokens the layer serves (all, or the attention group) and the ranks a plan
  /// places experts on (all, or the expert group).
  [[nodiscard]] int token_ranks() const { return ag > 0 ? ag : ranks; }
  [[nodiscard]] int plan_ranks() const { return ranks - ag; }
  bool probe = false, help = false;
  std::uint64_t seed = 1;
  std::vector<Strategy> strategies;
  std::vector<std::string> models;
  std::string pass_log, data_dir;
  bool mpi = false;
};

/// The routing of one model: the three domains' token samplers.
struct Routing {
  std::string name;
  int experts = 0, top_k = 0;
  long long real_expert_bytes = 0;
  std::vector<profile::RouteProfile> domains;
  std::vector<std::unique_ptr<profile::TokenSampler>> samplers;
};

Routing load_routing(std::string const& name, std::string const& data_dir) {
  Routing r;
  r.name = name;
  std::string dir;
  if (name == "olmoe") {
    r.experts = 64, r.top_k = 8, dir = "olmoe-1b-7b";
    r.real_expert_bytes = models::OLMoE_1B_7B::spec.expert_bytes();
  } else if (name == "mixtral") {
    r.experts = 8, r.top_k = 2, dir = "mixtral-8x7b";
    r.real_expert_bytes = models::Mixtral8x7B::spec.expert_bytes();
  } else {
    fail("--models: unknown model '", name, "' (olmoe, mixtral)");
  }
  r.domains.reserve(kDomains.size());
  for (auto const* d : kDomains) {
    profile::RouteRecorder rec(r.experts, r.top_k);
    core::TsvReader in(data_dir + "/olmoe-routing/" + dir + "/" + d + "/token_expert_counts.tsv");
    profile::load_token_expert_counts(in, rec, [](int l) { return l == kLayer; });
    r.domains.push_back(rec.profile());
  }
  for (auto const& p : r.domains) r.samplers.push_back(std::make_unique<profile::TokenSampler>(p, kLayer));
  return r;
}

/// The domain of a token of pass p drawn with uniform u (see the header comment).
int domain_of(int p, int passes, double u) {
  int a = passes / 3, b = passes / 2, c = 2 * passes / 3, d = 5 * passes / 6;
  if (p < a) return 0;
  if (p < b) return u < static_cast<double>(p - a + 1) / static_cast<double>(b - a) ? 1 : 0;
  if (p < c) return 1;
  if (p < d) return u < static_cast<double>(p - c + 1) / static_cast<double>(d - c) ? 2 : 1;
  return 2;
}

/// The drawn experts of rank `rank`'s tokens in pass p (tokens x top_k), the same in every process.
void draw(Routing const& m, Study const& st, int pass, int rank, std::vector<int>& ids) {
  ids.clear();
  profile::Rng rng(st.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(pass) * 4099u +
                   static_cast<std::uint64_t>(rank) * 131u + 17u);
  for (int t = 0; t < st.tokens; ++t) {
    int d = domain_of(pass, st.passes, rng.uniform());
    m.samplers[static_cast<std::size_t>(d)]->sample(1, rng, ids);
  }
}

/// The first plan: EPLB on the first window's tokens, experts + plan ranks slots over the plan ranks.
struct FirstPlan {
  std::vector<int> primary;
  std::vector<std::vector<int>> copies;
  int slots = 0;
};

FirstPlan first_plan(Routing const& m, Study const& st) {
  std::vector<double> loads(static_cast<std::size_t>(m.experts), 0.0);
  std::vector<int> ids;
  for (int p = 0; p < std::min(st.window, st.passes); ++p)
    for (int r = 0; r < st.token_ranks(); ++r) {
      draw(m, st, p, r, ids);
      for (int e : ids) loads[static_cast<std::size_t>(e)] += 1;
    }
  FirstPlan f;
  f.slots = m.experts + st.plan_ranks();
  auto er = replication::eplb::rebalance_experts(loads, 1, m.experts, f.slots, 1, 1, st.plan_ranks());
  auto lt = replication::eplb::layer_tables(er, 0);
  f.primary = lt.placement.ranks();
  f.copies = lt.replicas.replicas();
  return f;
}

/// What one rank saw in one pass (plain data: gathered as bytes).
struct PassRecord {
  double wall = 0, migration_seconds = 0, error = 0, load_mean = 0;
  long long load_max = 0, migration_bytes = 0;
  double probe = 0;  ///< --probe: one all-to-all-v of a chunk's bytes to the next rank, after a barrier
  int mismatches = 0, window_ok = 1, adopted = 0, threw = 0, checked = 0, pad = 0;
};
static_assert(std::is_trivially_copyable_v<PassRecord>);

struct RankResult {
  std::vector<PassRecord> passes;
  long long copies_added = 0;     // (rank, expert) pairs the adopted plans added
  long long full_copies = 0;      // full reshuffle: the same, counted from EPLB's layouts (vLLM's way)
  int refused = 0;                // full reshuffle: layouts the layer could not take
  std::string first_error;
};

/// (expert, rank) pairs `to` holds that `from` did not.
long long added_copies(live::Plan const& from, live::Plan const& to) {
  long long n = 0;
  for (std::size_t e = 0; e < to.copies.size(); ++e)
    for (int r : to.copies[e]) n += std::find(from.copies[e].begin(), from.copies[e].end(), r) == from.copies[e].end();
  return n;
}

double max_relative_error(std::vector<float> const& a, std::vector<float> const& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

/// One strategy on this rank: `passes` passes of the drifting stream. Schedule: Sequential (every
/// rank holds tokens and experts) or FinDep (--ag: ranks [0, ag) hold the tokens, the others the
/// experts; plans are over those, numbered from 0).
template <class Model, class Schedule, class Replicas, class Comm>
RankResult serve(Comm& comm, Routing const& m, Study const& st, FirstPlan const& fp, Strategy strategy,
                 Replicas replicas) {
  using L = Layer<Model, router::SoftmaxTopK, placement::Table, Replicas, Schedule, Comm>;
  constexpr bool disaggregated = schedule::DisaggregatedPolicy<Schedule>;
  constexpr ShapeSpec s = Model::spec;
  constexpr auto h = static_cast<std::size_t>(s.hidden);
  static_assert(s.hidden >= s.experts, "the router picks the drawn experts by coordinate: hidden >= experts");
  check(s.experts == m.experts && s.top_k == m.top_k, "live_layer_study: model shape and routing disagree");
  int R = comm.size(), me = comm.rank();
  int const G = st.plan_ranks(), g = me - (R - G);  // plan ranks; this rank's index among them (< 0: AG)
  bool const has_tokens = me < st.token_ranks();
  int const tokens = has_tokens ? st.tokens : 0;
  RankResult out;

  RandomLayerWeights<float> weights(s, 77);
  std::vector<float> router(static_cast<std::size_t>(s.experts) * h, 0.0f);
  for (std::size_t e = 0; e < static_cast<std::size_t>(s.experts); ++e) router[e * h + e] = 1.0f;
  LayerWeights<float> full = weights.view();
  full.router = router.data();
  auto local = weights.experts_where([&](int e) { return g >= 0 && replicas.holds(e, 0, g); });
  LayerWeights<float> mine = full;
  mine.experts = local;

  std::size_t slot_bytes = live::slot_bytes<float>(s);
  live::Options lo{.window = st.window};
  int width = 0;
  for (int r = 0; r < G; ++r) {
    int n = 0;
    for (auto const& c : fp.copies) n += std::find(c.begin(), c.end(), r) != c.end();
    width = std::max(width, n);
  }
  if (strategy == Strategy::full) {
    lo.spare_slots = width;
    lo.migration_bytes_per_pass = static_cast<std::size_t>(width) * slot_bytes;
  } else if (strategy == Strategy::minimal || strategy == Strategy::split || strategy == Strategy::split_planner) {
    lo.replan_every = st.replan_every;
    lo.spare_slots = st.spare;
    lo.migration_bytes_per_pass = static_cast<std::size_t>(st.chunk) * slot_bytes;
    lo.tolerance_permille = st.tolerance;
    if (strategy == Strategy::split_planner) {
      lo.planner = live::Planner::split_balance;
      lo.tolerance_permille = st.split_gain;
    }
    lo.plan_rank = st.plan_rank;
  }
  typename L::Options options{.max_tokens = st.tokens, .live = lo};
  if constexpr (disaggregated) options.schedule = Schedule{st.ag, schedule::Order::aass, 2, 2};
  L layer(comm, placement::Table(fp.primary), std::move(replicas), mine, options);
  std::vector<float> arena;
  if (strategy != Strategy::static_plan) {
    arena.resize(layer.arena_elements());
    layer.attach_arena(arena);
  }
  std::vector<std::byte> ws(layer.workspace_size());

  std::vector<int> ids, ref_ids(static_cast<std::size_t>(tokens * s.top_k)), other;
  std::vector<float> gw(ref_ids.size()), x(static_cast<std::size_t>(tokens) * h), y(x.size()), ref(x.size());
  live::Plan before = layer.plan();
  int adopted = 0;
  std::vector<std::byte> probe_out, probe_in;
  out.passes.resize(static_cast<std::size_t>(st.passes));
  for (int p = 0; p < st.passes; ++p) {
    auto& rec = out.passes[static_cast<std::size_t>(p)];
    if (has_tokens) draw(m, st, p, me, ids);
    profile::Rng noise(st.seed * 7919u + static_cast<std::uint64_t>(p) * 65537u + static_cast<std::uint64_t>(me));
    for (auto& v : x) v = static_cast<float>(0.01 * (noise.uniform() - 0.5));
    for (int t = 0; t < tokens; ++t)
      for (int j = 0; j < s.top_k; ++j)
        x[static_cast<std::size_t>(t) * h + static_cast<std::size_t>(ids[static_cast<std::size_t>(t * s.top_k + j)])] +=
            4.0f - 2.0f * static_cast<float>(j) / static_cast<float>(s.top_k);
    // The ranks meet before and after the timed pass, so that a rank still computing its checks
    // of the last pass (or already computing this pass's) does not take the cores from ranks
    // inside run(): on a machine with fewer cores than ranks, that wait would otherwise land in
    // whichever collective of the pass comes last (a migration chunk, when there is one).
    comm.barrier();
    auto t0 = std::chrono::steady_clock::now();
    try {
      if constexpr (disaggregated)
        layer.run({.tokens = tokens, .x = x.data(), .y = y.data()}, ws);
      else
        layer.run({.tokens = st.tokens, .x = x.data(), .y = y.data(),
                   .first_token = static_cast<long long>(p) * R * st.tokens + me * st.tokens},
                  ws);
    } catch (Error const& e) {
      rec.threw = 1;
      if (out.first_error.empty()) out.first_error = detail::concat("pass ", p, ": ", e.what());
    }
    rec.wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    comm.barrier();
    auto const& stats = layer.stats();
    rec.migration_seconds = stats.migration_seconds;
    rec.migration_bytes = static_cast<long long>(stats.migration_bytes);
    rec.load_max = stats.rank_load_max;
    rec.load_mean = stats.rank_load_mean;
    rec.adopted = stats.plans_adopted;
    if (!rec.threw && has_tokens && (p % st.check_every == 0 || p == st.passes - 1)) {
      rec.checked = 1;
      reference_forward<router::SoftmaxTopK>(s, full, tokens, x.data(), ref.data(), ref_ids, gw);
      rec.error = max_relative_error(y, ref);
      for (int t = 0; t < tokens; ++t) {
        auto k = static_cast<std::ptrdiff_t>(s.top_k);
        std::set<int> want(ids.begin() + t * k, ids.begin() + (t + 1) * k),
            got(ref_ids.begin() + t * k, ref_ids.begin() + (t + 1) * k);
        rec.mismatches += want != got;
      }
      // The window's newest pass against every rank's drawn routes (rank 0 checks: the window is
      // the same on every rank).
      if (me == 0) {
        std::vector<long long> pairs(static_cast<std::size_t>(s.experts), 0);
        for (int r = 0; r < st.token_ranks(); ++r) {
          draw(m, st, p, r, other);
          for (int e : other) ++pairs[static_cast<std::size_t>(e)];
        }
        auto const& w = layer.load_window();
        auto got = w.experts(w.size() - 1);
        rec.window_ok = std::equal(got.begin(), got.end(), pairs.begin());
      }
    }
    if (st.probe) {
      // What one collective round with a chunk's bytes costs here, outside the layer: the ranks
      // meet at a barrier (as the window's all-gather leaves them before a chunk), then each sends
      // a chunk to the next rank.
      std::size_t n = lo.migration_bytes_per_pass > 0 ? lo.migration_bytes_per_pass
                                                      : static_cast<std::size_t>(st.chunk) * slot_bytes;
      std::vector<std::size_t> send(static_cast<std::size_t>(R), 0), recv(send);
      send[static_cast<std::size_t>((me + 1) % R)] = n;
      recv[static_cast<std::size_t>((me + R - 1) % R)] = n;
      probe_out.resize(n);
      probe_in.resize(n);
      comm.barrier();
      auto q0 = std::chrono::steady_clock::now();
      comm.all_to_all_v(probe_out, send, probe_in, recv);
      rec.probe = std::chrono::duration<double>(std::chrono::steady_clock::now() - q0).count();
    }
    if (stats.plans_adopted > adopted) {
      live::Plan now = layer.plan();
      out.copies_added += added_copies(before, now);
      before = std::move(now);
      adopted = stats.plans_adopted;
    }
    // Engine-style: EPLB from scratch every R passes, the whole layout handed over.
    if (strategy == Strategy::full && (p + 1) % st.replan_every == 0 && p + 1 < st.passes && !layer.migrating() &&
        !rec.threw) {
      auto loads = layer.load_window().expert_loads();
      std::vector<double> w(loads.begin(), loads.end());
      auto er = replication::eplb::rebalance_experts(w, 1, s.experts, fp.slots, 1, 1, G);
      auto const& layout = er.phy2log.v;
      int per = fp.slots / G;
      // vLLM's count: a (GPU, expert) the new layout has that the GPU did not hold.
      live::Plan cur = layer.plan();
      std::vector<int> distinct(static_cast<std::size_t>(G), 0);
      for (int r = 0; r < G; ++r) {
        std::set<int> held;
        for (int i = 0; i < per; ++i) held.insert(layout[static_cast<std::size_t>(r * per + i)]);
        distinct[static_cast<std::size_t>(r)] = static_cast<int>(held.size());
        for (int e : held) {
          auto const& c = cur.copies[static_cast<std::size_t>(e)];
          out.full_copies += std::find(c.begin(), c.end(), r) == c.end();
        }
      }
      if (*std::max_element(distinct.begin(), distinct.end()) > width) {
        ++out.refused;  // a rank would hold more distinct experts than the arena's width
      } else {
        layer.migrate_to(layout);
      }
    }
  }
  return out;
}

/// Every rank's records, gathered (rank-major).
template <class Comm>
std::vector<PassRecord> gather(Comm& comm, std::vector<PassRecord> const& mine) {
  auto R = static_cast<std::size_t>(comm.size());
  std::vector<PassRecord> all(R * mine.size());
  std::vector<std::size_t> sizes(R, mine.size() * sizeof(PassRecord));
  comm.all_gather_v(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)), sizes);
  return all;
}

template <class Comm>
long long sum_over_ranks(Comm& comm, long long v) {
  auto R = static_cast<std::size_t>(comm.size());
  std::vector<long long> all(R);
  std::vector<std::size_t> sizes(R, sizeof(long long));
  comm.all_gather_v(std::as_bytes(std::span(&v, 1)), std::as_writable_bytes(std::span(all)), sizes);
  long long s = 0;
  for (long long x : all) s += x;
  return s;
}

struct Summary {
  std::string model, comm, strategy;
  std::string ranks;  ///< "8", or "2+6" for 2 attention and 6 expert ranks (--ag)
  int passes = 0, plans = 0, failures = 0, refused = 0;
  double mean_imbalance = 0, p99_imbalance = 0, mean_last_third = 0;
  long long copies = 0, full_copies = 0, bytes_sent = 0, bytes_expected = 0, mismatches = 0, window_bad = 0;
  double real_gib = 0, held_fraction = 0, worst_hold = 0, median_hold = 0, mean_pass_ms = 0, worst_error = 0;
  double median_chunk_ms = 0, median_probe_ms = 0, median_pass_ms = 0;
  long long checked = 0;
  std::string first_error;
};

Summary summarise(std::vector<PassRecord> const& all, int R, int P) {
  Summary s;
  s.passes = P;
  std::vector<double> imb, holds, chunks, probes, walls;
  double wall_sum = 0;
  long long held = 0;
  for (int p = 0; p < P; ++p) {
    double wall = 0, mig = 0, probe = 0;
    long long bytes = 0;
    bool threw = false;
    for (int r = 0; r < R; ++r) {
      auto const& x = all[static_cast<std::size_t>(r * P + p)];
      wall = std::max(wall, x.wall), mig = std::max(mig, x.migration_seconds), probe = std::max(probe, x.probe);
      bytes += x.migration_bytes;
      threw |= x.threw != 0;
      s.bytes_sent += x.migration_bytes;
      s.mismatches += x.mismatches;
      s.window_bad += x.checked && !x.window_ok;
      s.checked += x.checked;
      s.worst_error = std::max(s.worst_error, x.error);
    }
    s.failures += threw;
    auto const& r0 = all[static_cast<std::size_t>(p)];
    if (!threw) imb.push_back(r0.load_mean > 0 ? static_cast<double>(r0.load_max) / r0.load_mean : 1.0);
    wall_sum += wall;
    walls.push_back(wall);
    if (probe > 0) probes.push_back(probe);
    if (bytes > 0) chunks.push_back(mig);
    if (mig > 0) {
      ++held;
      holds.push_back(mig / std::max(wall - mig, 1e-9));
      s.worst_hold = std::max(s.worst_hold, holds.back());
    }
    s.plans = all[static_cast<std::size_t>(p)].adopted;
  }
  if (!imb.empty()) {
    double sum = 0;
    for (double v : imb) sum += v;
    s.mean_imbalance = sum / static_cast<double>(imb.size());
    auto third = imb.size() * 2 / 3;
    double tail = 0;
    for (std::size_t i = third; i < imb.size(); ++i) tail += imb[i];
    s.mean_last_third = tail / static_cast<double>(imb.size() - third);
    std::sort(imb.begin(), imb.end());
    s.p99_imbalance = imb[std::min(imb.size() - 1, static_cast<std::size_t>(std::ceil(0.99 * imb.size())) - 1)];
  }
  if (!holds.empty()) {
    std::sort(holds.begin(), holds.end());
    s.median_hold = holds[holds.size() / 2];
  }
  auto median_ms = [](std::vector<double>& v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return 1e3 * v[v.size() / 2];
  };
  s.median_chunk_ms = median_ms(chunks);
  s.median_probe_ms = median_ms(probes);
  s.median_pass_ms = median_ms(walls);
  s.held_fraction = static_cast<double>(held) / P;
  s.mean_pass_ms = 1e3 * wall_sum / P;
  return s;
}

template <class Model, class Comm>
std::vector<Summary> run_model(Comm& comm, Routing const& m, Study const& st, FirstPlan const& fp,
                               char const* comm_name, std::FILE* log) {
  std::vector<Summary> out;
  for (Strategy strategy : st.strategies) {
    RankResult mine;
    int R = comm.size();
    auto serve_with = [&]<class Replicas>(Replicas replicas) {
      if (st.ag > 0)
        return serve<Model, schedule::FinDep>(comm, m, st, fp, strategy, std::move(replicas));
      return serve<Model, schedule::Sequential>(comm, m, st, fp, strategy, std::move(replicas));
    };
    if (strategy == Strategy::split || strategy == Strategy::split_planner)
      mine = serve_with(replication::BatchSplit(fp.copies, std::vector<int>(static_cast<std::size_t>(st.plan_ranks()), 0)));
    else
      mine = serve_with(replication::Table(fp.copies));
    auto all = gather(comm, mine.passes);
    Summary s = summarise(all, R, st.passes);
    s.model = m.name, s.comm = comm_name, s.strategy = name_of(strategy);
    s.ranks = st.ag > 0 ? detail::concat(st.ag, "+", R - st.ag) : std::to_string(R);
    // Every rank tracks the same plans: rank 0's counts stand for all.
    s.copies = mine.copies_added;
    s.full_copies = mine.full_copies;
    s.refused = mine.refused;
    s.bytes_expected = mine.copies_added * static_cast<long long>(live::slot_bytes<float>(Model::spec));
    s.real_gib = static_cast<double>(mine.copies_added) * static_cast<double>(m.real_expert_bytes) / (1ull << 30);
    long long errors = sum_over_ranks(comm, mine.first_error.empty() ? 0 : 1);
    if (errors > 0) s.first_error = mine.first_error.empty() ? "(on another rank)" : mine.first_error;
    if (log != nullptr && comm.rank() == 0)
      for (int p = 0; p < st.passes; ++p) {
        double wall = 0, mig = 0;
        long long bytes = 0;
        for (int r = 0; r < R; ++r) {
          auto const& x = all[static_cast<std::size_t>(r * st.passes + p)];
          wall = std::max(wall, x.wall), mig = std::max(mig, x.migration_seconds), bytes += x.migration_bytes;
        }
        auto const& x = all[static_cast<std::size_t>(p)];
        std::fprintf(log, "%s\t%s\t%d\t%s\t%d\t%lld\t%.3f\t%lld\t%.6f\t%.6f\t%d\n", m.name.c_str(), comm_name, R,
                     s.strategy.c_str(), p, x.load_max, x.load_mean, bytes, mig, wall, x.adopted);
      }
    out.push_back(std::move(s));
  }
  return out;
}

template <class Comm>
std::vector<Summary> run_all(Comm& comm, std::vector<Routing> const& models, Study const& st, char const* comm_name,
                             std::FILE* log) {
  std::vector<Summary> out;
  for (auto const& m : models) {
    FirstPlan fp = first_plan(m, st);
    auto part = m.name == "olmoe" ? run_model<OlmoeSmall>(comm, m, st, fp, comm_name, log)
                                  : run_model<MixtralSmall>(comm, m, st, fp, comm_name, log);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

/// Prints the table; returns whether every check passed.
bool report(std::vector<Summary> const& rows, Study const& st) {
  std::printf("model\tcomm\tranks\tstrategy\tpasses\tmean_max_over_mean\tp99_max_over_mean\tmean_last_third\tplans\t"
              "copies\treal_GiB_moved\tpct_of_full\theld_passes_pct\tmedian_hold_pct\tworst_hold_pct\tmean_pass_ms\t"
              "median_pass_ms\tmedian_chunk_ms\tmedian_probe_ms\tworst_error\trouter_mismatches\t"
              "window_mismatches\tchecked_rank_passes\tfailed_passes\tbytes_sent\tbytes_expected\n");
  bool ok = true;
  for (auto const& r : rows) {
    long long full = 0;
    for (auto const& q : rows)
      if (q.model == r.model && q.comm == r.comm && q.strategy == "full-reshuffle") full = q.copies;
    char pct_text[32] = "-";
    if (full > 0)
      std::snprintf(pct_text, sizeof pct_text, "%.2f", 100.0 * static_cast<double>(r.copies) / static_cast<double>(full));
    std::printf("%s\t%s\t%s\t%s\t%d\t%.4f\t%.4f\t%.4f\t%d\t%lld\t%.2f\t%s\t%.1f\t%.2f\t%.2f\t%.3f\t%.3f\t%.3f\t"
                "%.3f\t%.2e\t%lld\t%lld\t%lld\t%d\t%lld\t%lld\n",
                r.model.c_str(), r.comm.c_str(), r.ranks.c_str(), r.strategy.c_str(), r.passes, r.mean_imbalance,
                r.p99_imbalance, r.mean_last_third, r.plans, r.copies, r.real_gib, pct_text, 100.0 * r.held_fraction,
                100.0 * r.median_hold, 100.0 * r.worst_hold, r.mean_pass_ms, r.median_pass_ms, r.median_chunk_ms,
                r.median_probe_ms, r.worst_error, r.mismatches, r.window_bad, r.checked, r.failures, r.bytes_sent,
                r.bytes_expected);
    if (r.mismatches > 0 || r.window_bad > 0 || r.worst_error > 1e-4 || r.failures > 0 ||
        r.bytes_sent != r.bytes_expected || r.checked == 0) {
      ok = false;
      std::fprintf(stderr, "%s: check failed for %s %s: %lld router mismatches, %lld window mismatches, worst error "
                   "%.2e, %d failed passes%s%s, bytes sent %lld vs %lld expected\n", kProgram, r.model.c_str(),
                   r.strategy.c_str(), r.mismatches, r.window_bad, r.worst_error, r.failures,
                   r.first_error.empty() ? "" : " (", r.first_error.empty() ? "" : (r.first_error + ")").c_str(),
                   r.bytes_sent, r.bytes_expected);
    }
    if (r.strategy == "full-reshuffle" && r.full_copies != r.copies) {
      ok = false;
      std::fprintf(stderr, "%s: %s full reshuffle: %lld copies by vLLM's count, %lld adopted\n", kProgram,
                   r.model.c_str(), r.full_copies, r.copies);
    }
    if (r.refused > 0)
      tools::warn(kProgram, r.model, " full reshuffle: ", r.refused, " EPLB layouts gave a rank more distinct experts "
                  "than the first plan's width and were skipped");
  }
  // The three goals.
  for (auto const& r : rows) {
    if (r.strategy != "minimal+split" && r.strategy != "split-planner") continue;
    long long full = 0;
    double worst = r.worst_hold;
    for (auto const& q : rows)
      if (q.model == r.model && q.comm == r.comm && q.strategy == "full-reshuffle") full = q.copies;
    char pct[32] = "n/a";
    if (full > 0)
      std::snprintf(pct, sizeof pct, "%.2f %%", 100.0 * static_cast<double>(r.copies) / static_cast<double>(full));
    std::printf("# goal %s %s (%s, %s ranks): mean max/mean %.4f (<= 1.05: %s); moved %s of full reshuffle (<= 5 %%: %s); "
                "worst hold-up %.2f %% of its pass (<= 10 %%: %s)\n",
                r.strategy.c_str(), r.model.c_str(), r.comm.c_str(), r.ranks.c_str(), r.mean_imbalance, r.mean_imbalance <= 1.05 ? "met" : "NOT met",
                pct,
                full > 0 && r.copies * 20 <= full ? "met" : (full > 0 ? "NOT met" : "n/a"), 100.0 * worst,
                worst <= 0.10 ? "met" : "NOT met");
  }
  (void)st;
  return ok;
}

Study parse(int argc, char** argv) {
  tools::Args a(argc, argv,
                {{"models"}, {"ranks"}, {"passes"}, {"tokens"}, {"window"}, {"replan-every"}, {"spare-slots"},
                 {"chunk-experts"}, {"tolerance-permille"}, {"split-gain-permille"}, {"plan-rank"}, {"ag"},
                 {"strategies"}, {"check-every"}, {"seed"}, {"pass-log"},
                 {"data-dir"}, {"mpi", true}, {"probe", true}});
  Study st;
  if (a.help()) {
    st.help = true;
    return st;
  }
  st.mpi = a.has("mpi");
  st.probe = a.has("probe");
#ifdef MOE_LIVE_STUDY_MPI
  check(st.mpi, "this build runs under mpirun with --mpi; use live_layer_study for in-process ranks");
  check(!a.has("ranks"), "--ranks: under --mpi the ranks are mpirun's processes");
#else
  check(!st.mpi, "--mpi: this build has no MPI; run live_layer_study_mpi under mpirun");
#endif
  st.ranks = static_cast<int>(a.integer("ranks", 8, 1, 64));
  check(st.mpi || st.ranks == 4 || st.ranks == 8, "--ranks: in-process runs use 4 or 8 ranks, got ", st.ranks);
  st.passes = static_cast<int>(a.integer("passes", 2000, 6, 1000000));
  st.tokens = static_cast<int>(a.integer("tokens", 64, 1, 1 << 16));
  st.window = static_cast<int>(a.integer("window", 100, 1, 1000000));
  st.replan_every = static_cast<int>(a.integer("replan-every", 100, 1, 1000000));
  st.spare = static_cast<int>(a.integer("spare-slots", 2, 1, 1024));
  st.chunk = static_cast<int>(a.integer("chunk-experts", 1, 1, 1024));
  st.tolerance = static_cast<int>(a.integer("tolerance-permille", 10, 0, 1000));
  st.split_gain = static_cast<int>(a.integer("split-gain-permille", -1, -1, 1000));  // -1: 80 / ranks
  st.plan_rank = static_cast<int>(a.integer("plan-rank", -1, -1, 63));  // -1: every rank plans
  st.ag = static_cast<int>(a.integer("ag", 0, 0, 63));  // 0: the sequential layer
  st.check_every = static_cast<int>(a.integer("check-every", 1, 1, 1000000));
  st.seed = static_cast<std::uint64_t>(a.integer("seed", 1, 0, std::numeric_limits<int>::max()));
  st.pass_log = a.text("pass-log");
#ifdef MOE_DATA_DIR
  st.data_dir = a.text("data-dir", MOE_DATA_DIR);
#else
  st.data_dir = a.text("data-dir");
  check(!st.data_dir.empty(), "--data-dir: missing (the folder holding olmoe-routing/)");
#endif
  for (auto const& n : a.list("strategies", "static,full,minimal,split")) {
    Strategy s = n == "static" ? Strategy::static_plan
                 : n == "full"  ? Strategy::full
                 : n == "minimal" ? Strategy::minimal
                 : n == "split" ? Strategy::split
                 : n == "splitplan" ? Strategy::split_planner
                                : (fail("--strategies: unknown strategy '", n, "' (static, full, minimal, split, splitplan)"),
                                   Strategy::static_plan);
    check(std::find(st.strategies.begin(), st.strategies.end(), s) == st.strategies.end(), "--strategies: '", n,
          "' given twice");
    st.strategies.push_back(s);
  }
  for (auto const& n : a.list("models", "olmoe,mixtral")) {
    check(n == "olmoe" || n == "mixtral", "--models: unknown model '", n, "' (olmoe, mixtral)");
    check(std::find(st.models.begin(), st.models.end(), n) == st.models.end(), "--models: '", n, "' given twice");
    st.models.push_back(n);
  }
  return st;
}

int body(int argc, char** argv, int rank, int ranks_given, auto&& run) {
  Study st = parse(argc, argv);
  if (st.help) {
    if (rank == 0)
      std::printf("live_layer_study [--models olmoe,mixtral] [--ranks 8|4] [--passes 2000] [--tokens 64] [--window 100]\n"
                  "  [--replan-every 100] [--spare-slots 2] [--chunk-experts 1] [--tolerance-permille 10]\n"
                  "  [--split-gain-permille -1] [--plan-rank -1] [--ag 0] [--strategies static,full,minimal,split[,splitplan]]\n"
                  "  [--check-every 1] [--seed 1] [--pass-log FILE]\n"
                  "  [--data-dir DIR] [--probe] [--mpi (live_layer_study_mpi under mpirun)]\n");
    return tools::exit_ok;
  }
  if (ranks_given > 0) st.ranks = ranks_given;
  check(st.plan_rank < st.ranks, "--plan-rank: ", st.plan_rank, " is not one of the ", st.ranks, " ranks");
  if (st.ag > 0) {
    check(st.ag < st.ranks, "--ag: ", st.ag, " attention ranks leave none of the ", st.ranks, " for the experts");
    check(st.tokens % 4 == 0, "--ag: the FinDEP schedule (r1 = 2 micro-batches of r2 = 2 chunks) needs --tokens "
          "divisible by 4, got ", st.tokens);
  }
  std::vector<Routing> models;
  for (auto const& n : st.models) {
    models.push_back(load_routing(n, st.data_dir));
    check(models.back().experts % st.plan_ranks() == 0, st.ag > 0 ? "--ag: " : "--ranks: ", st.plan_ranks(),
          st.ag > 0 ? " expert ranks" : " ranks", " do not split the ", models.back().experts, " experts of ", n,
          " evenly");
  }
  std::FILE* log = nullptr;
  if (!st.pass_log.empty() && rank == 0) {
    log = std::fopen(st.pass_log.c_str(), "w");
    check(log != nullptr, "--pass-log: cannot write '", st.pass_log, "'");
    std::fprintf(log, "model\tcomm\tranks\tstrategy\tpass\tload_max\tload_mean\tmigration_bytes\tmigration_s\twall_s\tplans\n");
  }
  auto rows = run(models, st, log);
  if (log != nullptr) std::fclose(log);
  if (rank != 0) return tools::exit_ok;
  std::printf("# live_layer_study: %d passes, %d tokens per rank, window %d, re-plan every %d, spare slots %d, "
              "chunk %d expert(s) per pass, tolerance %d permille, seed %llu, %s%s\n",
              st.passes, st.tokens, st.window, st.replan_every, st.spare, st.chunk, st.tolerance,
              static_cast<unsigned long long>(st.seed),
              st.plan_rank < 0 ? "every rank plans" : ("rank " + std::to_string(st.plan_rank) + " plans").c_str(),
              st.ag > 0 ? detail::concat(", disaggregated: ", st.ag, " attention ranks (FinDEP AASS r1 2 r2 2), ",
                                         st.ranks - st.ag, " expert ranks")
                              .c_str()
                        : "");
  return report(rows, st) ? tools::exit_ok : tools::exit_check;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef MOE_LIVE_STUDY_MPI
  collective::MpiSession session(&argc, &argv);
  collective::Mpi comm;
  int rc = tools::guarded_main(comm.rank() == 0 ? kProgram : nullptr, [&] {
    return body(argc, argv, comm.rank(), comm.size(), [&](auto const& models, Study const& st, std::FILE* log) {
      return run_all(comm, models, st, "mpi", log);
    });
  });
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
#else
  return tools::guarded_main(kProgram, [&] {
    return body(argc, argv, 0, 0, [&](auto const& models, Study const& st, std::FILE* log) {
      std::vector<Summary> rows;
      auto go = [&](auto& comm) {
        auto r = run_all(comm, models, st, "in-process", log);
        if (comm.rank() == 0) rows = std::move(r);
      };
      if (st.ranks == 4)
        collective::run_in_process<4>(go);
      else
        collective::run_in_process<8>(go);
      return rows;
    });
  });
#endif
}
