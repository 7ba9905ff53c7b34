// serving_loop: the planners' model of a serving loop whose routing drifts (issue 36, item 5;
// docs/results/serving-loop.md). Over P passes (default 2,000) of one MoE layer whose batches drift
// arxiv -> github -> book (moe_tools/serving_loop.hpp), four strategies start from the same EPLB
// plan, made from the loads of the first window (passes [0, W)):
//
//   static        that plan for every pass; each pair goes to the copy replication::Table::choose
//                 picks (own rank if it holds one, else a rotation over the copies).
//   full          engine style (vLLM's default policy): every R passes, EPLB from scratch on the
//                 loads of the last W passes, its packs on the GPUs of the same index (vLLM's
//                 preserve_intragpu_slots only reorders slots inside a GPU, which moves nothing
//                 between GPUs). Every slot whose GPU held no copy of its new expert is copied from
//                 a GPU that held one (the count vLLM's rearrangement receives at its communicator,
//                 tests/engines/vllm_rearrange.py). Stop the world: the pass after the re-plan
//                 waits for the whole transfer (migration::transfer_time on the preset).
//   minimal       every R passes, replication::migration::rebalance from the current layout on the
//                 same window; its copies travel in chunks while the old plan keeps serving, and
//                 all ranks switch after the pass that carries the last chunk. A re-plan due while
//                 a migration is still in flight is skipped (counted).
//   minimal+split as minimal, and every batch's pairs are split over the copies by
//                 replication::BatchSplit (the least possible max rank load) instead of the fixed
//                 rule; the pass pays the all-gather of the per-expert counts.
//   split-planner every batch split as minimal+split, re-planned by replication::split_planner (the
//                 split's mean max/mean over the window's passes; a moved copy must lower it by
//                 --split-gain permille, at most --spare new experts per rank and re-plan; under
//                 the group rule, new copies stay on the node that holds the expert).
//
// Chunks: an expert of X bytes travels as n = ceil(X / B) equal pieces (B = --chunk-mib); in one
// pass a rank sends at most floor(B / piece) pieces and receives at most as many, taken in
// transfer order. A chunk's time is migration::transfer_time of that pass's pieces on the preset's
// traffic model; it overlaps the pass, so the pass is held up by max(0, chunk time - pass time).
// Link sharing between the chunk and the pass's all-to-all is not modelled.
//
// Pass time (modelled): the dispatch + combine all-to-all of the pass's pairs as routed
// (topology::TrafficModel::evaluate_policy on the preset, bf16 activations of the model's hidden
// size), plus the routed-expert compute of the busiest rank with FinDEP's H100-class reference
// model (schedule::h100_cluster_reference, op experts: 35 us + 6 x pairs x hidden x expert_ffn
// flop at 450 TFLOP/s), plus, for minimal+split, the count all-gather.
//
// Output: one summary row per (model, strategy) on stdout; --per-pass FILE writes every pass.
// --verify recounts every pass and every re-plan against brute-force references (rank loads from
// the slot table and the batch, copies and bytes from the two layouts) and exits 1 on a mismatch.
//
//   serving_loop [--models olmoe,mixtral,dsv3-h800,dsv3-dgx] [--passes 2000] [--tokens 256]
//                [--period 100] [--window 100] [--chunk-mib 64] [--tolerance 0.01] [--seed 1]
//                [--dsv3-groups 8] [--per-pass FILE] [--verify]
#include <algorithm>
#include <array>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moe/replication/batch_split.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/replication/migration.hpp"
#include "moe/replication/reactive.hpp"
#include "moe/replication/split_planner.hpp"
#include "moe/schedule/perf_model.hpp"
#include "moe/topology/presets.hpp"
#include "moe/topology/traffic.hpp"
#include "moe_tools/cli.hpp"
#include "moe_tools/dealt_routes.hpp"
#include "moe_tools/reactive_study.hpp"
#include "moe_tools/serving_loop.hpp"

using namespace moe;
namespace sv = moe::tools::serving;
namespace mig = moe::replication::migration;
namespace eplb = moe::replication::eplb;

namespace {

char const* const kProgram = "serving_loop";

struct Options {
  std::vector<std::string> models;
  int passes = 2000, tokens = 256, period = 100, window = 100, spare = 2, split_gain = -1;  // -1: 80 / ranks
  double chunk_bytes = 64.0 * 1024 * 1024, tolerance = 0.01;
  std::uint64_t seed = 1;
  int dsv3_groups = 8;
  std::string per_pass;
  bool verify = false;
  bool split_swaps = false;  // split-planner: also try swaps (split_planner::Options::swaps)
};

enum class Kind { static_plan, full, minimal, minimal_split, split_planner };
constexpr std::array<Kind, 5> kKinds{Kind::static_plan, Kind::full, Kind::minimal, Kind::minimal_split,
                                     Kind::split_planner};
char const* kind_name(Kind k) {
  switch (k) {
    case Kind::static_plan: return "static";
    case Kind::full: return "full";
    case Kind::minimal: return "minimal";
    case Kind::minimal_split: return "minimal+split";
    case Kind::split_planner: return "split-planner";
  }
  return "?";
}

/// A failed recount: the message names the pass, the strategy and what differed.
struct VerifyError {
  std::string what;
};
template <class... Parts>
void expect(bool ok, Parts const&... parts) {
  if (!ok) throw VerifyError{detail::concat("verify: ", parts...)};
}

/// One piece of an expert's weights in flight.
struct Piece {
  int src = 0, dst = 0, slot = 0, expert = 0;
};

struct Strategy {
  Kind kind{};
  std::vector<int> row;  ///< the slot layout serving now (P slots)
  replication::Table table;
  std::vector<int> primary;
  std::optional<replication::BatchSplit> split;
  // a migration in flight (minimal strategies)
  bool migrating = false;
  std::vector<int> next_row;
  std::deque<Piece> pending;
  double migration_bytes_planned = 0, migration_bytes_sent = 0;
  int migration_start = 0;
  // totals
  double sum_ratio = 0, max_ratio = 0, bytes = 0, sum_pass_s = 0, worst_held_frac = 0, sum_held_s = 0;
  double worst_chunk_frac = 0;  ///< largest chunk time over its pass's time (1: the chunk just fits)
  int held_over_10 = 0, held_passes = 0, replans = 0, skipped = 0, migration_passes = 0, migrations = 0;
  double sum_rebalance_s = 0, max_rebalance_s = 0;  ///< per re-plan: one layer's transfers at once
  long long copies = 0;
};

void install(Strategy& s, std::vector<int> row, sv::Model const& m, topology::Topology const& topo) {
  s.row = std::move(row);
  auto copies = sv::copies_of(s.row, m.experts, topo.gpus());
  s.primary.resize(copies.size());
  for (std::size_t e = 0; e < copies.size(); ++e) s.primary[e] = copies[e].front();
  if (s.kind == Kind::minimal_split || s.kind == Kind::split_planner) s.split.emplace(copies, topo);
  s.table = replication::Table(std::move(copies));
}

std::string fixed2(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return buf;
}

double max_over_mean(std::vector<double> const& load) {
  double mx = 0, sum = 0;
  for (double x : load) mx = std::max(mx, x), sum += x;
  return sum > 0 ? mx / (sum / static_cast<double>(load.size())) : 1.0;
}

/// Brute force: the slots of `now` whose rank held no slot of the same expert in `old`.
long long count_new_copies(std::vector<int> const& old, std::vector<int> const& now, int S) {
  long long n = 0;
  for (std::size_t p = 0; p < now.size(); ++p) {
    std::size_t g = p / static_cast<std::size_t>(S);
    bool held = false;
    for (std::size_t q = g * static_cast<std::size_t>(S); q < (g + 1) * static_cast<std::size_t>(S); ++q)
      held = held || old[q] == now[p];
    n += held ? 0 : 1;
  }
  return n;
}

/// Brute force: rank loads of the fixed rule, from the slot row and the batch alone.
std::vector<double> recount_fixed(std::vector<int> const& row, topology::Batch const& b, int G) {
  int S = static_cast<int>(row.size()) / G;
  std::vector<double> load(static_cast<std::size_t>(G), 0.0);
  for (int t = 0; t < b.tokens(); ++t) {
    int src = b.source[static_cast<std::size_t>(t)];
    for (int j = 0; j < b.top_k; ++j) {
      int e = b.experts[static_cast<std::size_t>(t * b.top_k + j)];
      std::vector<int> holders;  // ranks with a slot of e, ascending
      for (int g = 0; g < G; ++g)
        for (int q = g * S; q < (g + 1) * S; ++q)
          if (row[static_cast<std::size_t>(q)] == e) {
            holders.push_back(g);
            break;
          }
      int dst = -1;
      for (int h : holders) dst = h == src ? h : dst;
      if (dst < 0) dst = holders[static_cast<std::size_t>((src + t) % static_cast<int>(holders.size()))];
      load[static_cast<std::size_t>(dst)] += 1;
    }
  }
  return load;
}

int run(Options const& o) {
  std::FILE* per_pass = nullptr;
  if (!o.per_pass.empty()) {
    per_pass = std::fopen(o.per_pass.c_str(), "w");
    check(per_pass != nullptr, "--per-pass: cannot write '", o.per_pass, "'");
    std::fprintf(per_pass, "model\tstrategy\tpass\tsecond_domain_share\tmax_over_mean\tpass_us\tbytes_moved\theld_us\theld_over_pass\n");
  }
  std::printf("# serving_loop: %d passes, %d tokens per rank per pass, re-plan every %d passes on a window of %d, "
              "chunks of %.0f MiB per rank per pass, tolerance %.3g, DeepSeek-V3 expert groups %d, seed %" PRIu64 "\n",
              o.passes, o.tokens, o.period, o.window, o.chunk_bytes / (1024.0 * 1024.0), o.tolerance, o.dsv3_groups,
              o.seed);
  std::printf("model\tstrategy\tranks\tslots\tmean_max_over_mean\tworst_max_over_mean\tbytes_moved_GB\tbytes_vs_full_pct\t"
              "replans\tskipped\tmean_migration_passes\tmean_pass_us\tworst_chunk_over_pass_pct\tworst_held_pct\t"
              "passes_held_over_10pct\t"
              "rebalance_all_layers_ms_mean\trebalance_all_layers_ms_max\n");
  long long verified_passes = 0, verified_replans = 0;
  auto experts_model = schedule::h100_cluster_reference()[schedule::Op::experts];
  for (auto const& name : o.models) {
    auto m = sv::make_model(name, MOE_DATA_DIR);
    if (m.experts == 256) m.groups = o.dsv3_groups;
    auto topo = topology::preset_topology(m.preset);
    int G = topo.gpus(), E = m.experts, P = m.slots, S = P / G;
    int per_server = G / topo.servers(), nodes = topo.servers();
    check(P % G == 0, name, ": ", P, " slots do not split over ", G, " ranks");
    topology::TrafficModel traffic(topo);
    topology::TrafficOptions to;
    to.hidden = m.hidden;
    double gather_s = study::count_allgather_us(traffic, E) * 1e-6;
    double compute_flop_per_pair = 6.0 * m.hidden * m.ffn;
    int pieces_per_expert = static_cast<int>(std::ceil(m.expert_bytes / o.chunk_bytes));
    double piece_bytes = m.expert_bytes / pieces_per_expert;
    int pieces_per_pass = std::max(1, static_cast<int>(std::floor(o.chunk_bytes / piece_bytes)));
    mig::Options mo;
    mo.tolerance = o.tolerance;
    mo.num_groups = m.groups;
    mo.num_nodes = nodes;

    // The window: pairs per expert of each of the last W passes.
    std::deque<std::vector<double>> window;
    auto window_loads = [&] {
      eplb::Matrix<float> w(1, E, 0.0f);
      std::vector<double> sum(static_cast<std::size_t>(E), 0.0);
      for (auto const& v : window)
        for (int e = 0; e < E; ++e) sum[static_cast<std::size_t>(e)] += v[static_cast<std::size_t>(e)];
      for (int e = 0; e < E; ++e) w(0, e) = static_cast<float>(sum[static_cast<std::size_t>(e)]);
      return w;
    };
    auto eplb_row = [&](eplb::Matrix<float> const& w) {
      return replication::eplb::rebalance_experts(w, P, m.groups, nodes, G).phy2log.row(0);
    };
    // The initial plan: EPLB on the first window (passes [0, W), drawn again in the loop).
    for (int p = 0; p < o.window; ++p) {
      std::vector<double> c(static_cast<std::size_t>(E), 0.0);
      sv::count_experts(sv::draw_pass(m, G, p, o.passes, o.tokens, o.seed), c);
      window.push_back(std::move(c));
    }
    auto initial = eplb_row(window_loads());
    window.clear();

    std::vector<std::unique_ptr<Strategy>> strategies;
    for (Kind k : kKinds) {
      auto s = std::make_unique<Strategy>();
      s->kind = k;
      install(*s, initial, m, topo);
      strategies.push_back(std::move(s));
    }
    auto rebalance_seconds = [&](std::vector<mig::Transfer> const& t) {
      return t.empty() ? 0.0 : mig::transfer_time(traffic, t, 1, m.expert_bytes).seconds;
    };
    // A re-plan of the chunked strategies: its transfers start moving (or, with none, it is adopted now).
    auto begin_migration = [&](Strategy& s, std::vector<int> row, std::vector<mig::Transfer> const& transfers,
                               int pass) {
      double secs = rebalance_seconds(transfers);
      s.copies += static_cast<long long>(transfers.size());
      s.sum_rebalance_s += secs, s.max_rebalance_s = std::max(s.max_rebalance_s, secs);
      ++s.replans;
      if (transfers.empty()) {
        install(s, std::move(row), m, topo);  // moves inside GPUs only: nothing to wait for
        return;
      }
      s.migrating = true;
      s.next_row = std::move(row);
      s.pending.clear();
      for (auto const& t : transfers)
        for (int k = 0; k < pieces_per_expert; ++k) s.pending.push_back({t.src, t.dst, t.slot, t.expert});
      s.migration_bytes_planned = static_cast<double>(transfers.size()) * m.expert_bytes;
      s.migration_bytes_sent = 0;
      s.migration_start = pass;
      ++s.migrations;
    };

    // The group rule (EPLB's hierarchical policy: whole expert groups on a node, groups / nodes
    // of them on each): no layout under it, whatever its copies and split, gets a pass's max/mean
    // below that of the best pairing of the pass's group loads onto the nodes.
    bool group_rule = m.groups > 1 && nodes > 1 && m.groups % nodes == 0;
    double sum_group_bound = 0;

    for (int pass = 0; pass < o.passes; ++pass) {
      auto batch = sv::draw_pass(m, G, pass, o.passes, o.tokens, o.seed);
      double group_bound = group_rule ? sv::group_rule_bound(batch, E, m.groups, nodes) : 1.0;
      sum_group_bound += group_bound;
      sv::Mix mix = sv::mix_at(pass, o.passes);
      bool replan = pass > 0 && pass % o.period == 0;
      std::optional<eplb::Matrix<float>> wl;
      if (replan) wl = window_loads();
      std::vector<std::int32_t> counts;
      for (auto& sp : strategies) {
        Strategy& s = *sp;
        double stall_s = 0, bytes_now = 0;
        // 1. The re-plan, at the boundary before this pass, from the passes [pass - W, pass).
        if (replan && s.kind == Kind::full) {
          auto row = eplb_row(*wl);
          auto t = sv::transfers_between(s.row, row, G, per_server);
          if (o.verify) {
            expect(count_new_copies(s.row, row, S) == static_cast<long long>(t.size()), name, " full pass ", pass,
                   ": ", t.size(), " transfers, brute force counts ", count_new_copies(s.row, row, S));
            ++verified_replans;
          }
          stall_s = rebalance_seconds(t);
          bytes_now = static_cast<double>(t.size()) * m.expert_bytes;
          s.copies += static_cast<long long>(t.size());
          s.sum_rebalance_s += stall_s, s.max_rebalance_s = std::max(s.max_rebalance_s, stall_s);
          ++s.replans;
          install(s, std::move(row), m, topo);
        } else if (replan && s.kind == Kind::split_planner && s.migrating) {
          ++s.skipped;
        } else if (replan && s.kind == Kind::split_planner) {
          std::vector<long long> rows;
          for (auto const& v : window)
            for (double x : v) rows.push_back(std::llround(x));
          replication::split_planner::Options so;
          so.spare = o.spare;
          so.min_gain_permille = o.split_gain;
          so.node_size = group_rule ? per_server : 0;
          so.swaps = o.split_swaps;
          auto row = replication::split_planner::plan(rows, E, s.row, G, so).layout;
          auto t = sv::transfers_between(s.row, row, G, per_server);
          if (o.verify) {
            long long brute = count_new_copies(s.row, row, S);
            expect(brute == static_cast<long long>(t.size()), name, " split-planner pass ", pass, ": ", t.size(),
                   " transfers, brute force counts ", brute);
            ++verified_replans;
          }
          begin_migration(s, std::move(row), t, pass);
        } else if (replan && (s.kind == Kind::minimal || s.kind == Kind::minimal_split)) {
          if (s.migrating) {
            ++s.skipped;
          } else {
            eplb::Matrix<int> old(1, P);
            old.v = s.row;
            auto r = mig::rebalance(*wl, old, G, mo);
            auto row = r.phy2log.row(0);
            if (o.verify) {
              long long brute = count_new_copies(s.row, row, S);
              expect(brute == static_cast<long long>(r.transfers.size()), name, " ", kind_name(s.kind), " pass ", pass,
                     ": rebalance lists ", r.transfers.size(), " transfers, brute force counts ", brute);
              auto mine = sv::transfers_between(s.row, row, G, per_server);
              expect(mine.size() == r.transfers.size(), name, " pass ", pass, ": transfers_between gives ", mine.size(),
                     ", rebalance ", r.transfers.size());
              for (std::size_t i = 0; i < mine.size(); ++i)
                expect(mine[i].slot == r.transfers[i].slot && mine[i].src == r.transfers[i].src &&
                           mine[i].dst == r.transfers[i].dst && mine[i].expert == r.transfers[i].expert,
                       name, " pass ", pass, ": transfer ", i, " differs from rebalance's");
              ++verified_replans;
            }
            begin_migration(s, std::move(row), r.transfers, pass);
          }
        }
        // 2. The pass, on the layout serving now.
        topology::TrafficReport rep;
        double extra_s = 0;
        if (s.kind == Kind::minimal_split || s.kind == Kind::split_planner) {
          if (counts.empty()) counts = replication::reactive::pair_counts(batch, G, E);
          auto out = s.split->plan_batch(counts);
          replication::reactive::PairRoutes routes{m.top_k, &batch.experts, tools::dealt_routes(*s.split, batch, G, E)};
          rep = traffic.evaluate_policy(routes, s.primary, batch, to);
          extra_s = gather_s;
          if (o.verify) {
            std::vector<double> load(static_cast<std::size_t>(G), 0.0);
            for (std::size_t i = 0; i < routes.gpu.size(); ++i) {
              int g = routes.gpu[i], e = batch.experts[i];
              bool holds = false;
              for (int q = g * S; q < (g + 1) * S; ++q) holds = holds || s.row[static_cast<std::size_t>(q)] == e;
              expect(holds, name, " split pass ", pass, ": pair ", i, " of expert ", e, " sent to rank ", g,
                     ", which holds no slot of it");
              load[static_cast<std::size_t>(g)] += 1;
            }
            long long mx = 0;
            for (int g = 0; g < G; ++g) {
              expect(load[static_cast<std::size_t>(g)] == rep.gpu_load[static_cast<std::size_t>(g)] &&
                         load[static_cast<std::size_t>(g)] == static_cast<double>(s.split->load()[static_cast<std::size_t>(g)]),
                     name, " split pass ", pass, ": rank ", g, " recounted ", load[static_cast<std::size_t>(g)],
                     ", reported ", rep.gpu_load[static_cast<std::size_t>(g)], " and ", s.split->load()[static_cast<std::size_t>(g)]);
              mx = std::max(mx, static_cast<long long>(load[static_cast<std::size_t>(g)]));
            }
            expect(mx == out.max_load, name, " split pass ", pass, ": recounted max ", mx, ", outcome ", out.max_load);
          }
        } else {
          rep = traffic.evaluate_policy(s.table, s.primary, batch, to);
          if (o.verify) {
            auto load = recount_fixed(s.row, batch, G);
            for (int g = 0; g < G; ++g)
              expect(load[static_cast<std::size_t>(g)] == rep.gpu_load[static_cast<std::size_t>(g)], name, " ",
                     kind_name(s.kind), " pass ", pass, ": rank ", g, " recounted ", load[static_cast<std::size_t>(g)],
                     ", reported ", rep.gpu_load[static_cast<std::size_t>(g)]);
          }
        }
        if (o.verify) {
          double sum = 0;
          for (double x : rep.gpu_load) sum += x;
          expect(sum == static_cast<double>(batch.experts.size()), name, " ", kind_name(s.kind), " pass ", pass,
                 ": ranks received ", sum, " pairs of ", batch.experts.size());
          ++verified_passes;
        }
        double ratio = max_over_mean(rep.gpu_load);
        // Every layout here keeps whole groups on nodes under the group rule, so none beats the bound.
        if (o.verify && group_rule)
          expect(ratio >= group_bound * (1 - 1e-12), name, " ", kind_name(s.kind), " pass ", pass, ": max/mean ", ratio,
                 " below the group rule's bound ", group_bound);
        double max_pairs = *std::max_element(rep.gpu_load.begin(), rep.gpu_load.end());
        double pass_s = rep.time() + experts_model(compute_flop_per_pair * max_pairs) * 1e-6 + extra_s;
        // 3. This pass's chunk of a migration in flight, overlapped with the pass.
        double held_s = stall_s;
        if (s.migrating) {
          std::vector<int> sent(static_cast<std::size_t>(G), 0), recv(static_cast<std::size_t>(G), 0);
          std::vector<mig::Transfer> now;
          for (auto it = s.pending.begin(); it != s.pending.end();) {
            auto& sd = sent[static_cast<std::size_t>(it->src)];
            auto& rv = recv[static_cast<std::size_t>(it->dst)];
            if (sd < pieces_per_pass && rv < pieces_per_pass) {
              ++sd, ++rv;
              now.push_back({0, it->slot, it->expert, it->src, it->dst});
              it = s.pending.erase(it);
            } else {
              ++it;
            }
          }
          double chunk_s = mig::transfer_time(traffic, now, 1, piece_bytes).seconds;
          held_s = std::max(0.0, chunk_s - pass_s);
          s.worst_chunk_frac = std::max(s.worst_chunk_frac, chunk_s / pass_s);
          bytes_now = static_cast<double>(now.size()) * piece_bytes;
          s.migration_bytes_sent += bytes_now;
          if (o.verify)
            expect(held_s >= 0 && held_s <= chunk_s, name, " pass ", pass, ": held ", held_s, " outside [0, ", chunk_s, "]");
          if (s.pending.empty()) {  // every rank holds its new experts: switch after this pass
            if (o.verify) {
              expect(std::abs(s.migration_bytes_sent - s.migration_bytes_planned) <= 1e-6 * s.migration_bytes_planned,
                     name, " ", kind_name(s.kind), " pass ", pass, ": chunks moved ", s.migration_bytes_sent,
                     " bytes, the plan's transfers ", s.migration_bytes_planned);
              ++verified_replans;
            }
            s.migration_passes += pass - s.migration_start + 1;
            s.migrating = false;
            install(s, std::move(s.next_row), m, topo);
          }
        }
        s.bytes += bytes_now;
        s.sum_ratio += ratio, s.max_ratio = std::max(s.max_ratio, ratio);
        s.sum_pass_s += pass_s;
        double frac = held_s / pass_s;
        s.worst_held_frac = std::max(s.worst_held_frac, frac);
        s.held_over_10 += frac > 0.10 ? 1 : 0;
        s.held_passes += held_s > 0 ? 1 : 0;
        s.sum_held_s += held_s;
        if (per_pass)
          std::fprintf(per_pass, "%s\t%s\t%d\t%.4f\t%.4f\t%.1f\t%.0f\t%.1f\t%.4f\n", name.c_str(), kind_name(s.kind), pass,
                       mix.w, ratio, pass_s * 1e6, bytes_now, held_s * 1e6, frac);
      }
      std::vector<double> c(static_cast<std::size_t>(E), 0.0);
      sv::count_experts(batch, c);
      window.push_back(std::move(c));
      if (static_cast<int>(window.size()) > o.window) window.pop_front();
    }
    if (group_rule)
      std::printf("# %s: %d expert groups on %d nodes: the least max/mean any layout keeping whole groups on nodes "
                  "can reach, mean over passes: %.4f\n",
                  name.c_str(), m.groups, nodes, sum_group_bound / o.passes);
    double full_bytes = strategies[1]->bytes;
    for (auto const& sp : strategies) {
      Strategy const& s = *sp;
      double n = o.passes;
      std::printf("%s\t%s\t%d\t%d\t%.4f\t%.4f\t%.2f\t%s\t%d\t%d\t%s\t%.1f\t%.1f\t%.1f\t%d\t%.1f\t%.1f\n", name.c_str(),
                  kind_name(s.kind), G, P, s.sum_ratio / n, s.max_ratio, s.bytes * 1e-9,
                  full_bytes > 0 ? fixed2(s.bytes / full_bytes * 100).c_str() : "n/a",
                  s.replans, s.skipped,
                  s.migrations > 0 ? fixed2(static_cast<double>(s.migration_passes) / s.migrations).c_str() : "-",
                  s.sum_pass_s / n * 1e6, s.worst_chunk_frac * 100, s.worst_held_frac * 100, s.held_over_10,
                  s.replans > 0 ? s.sum_rebalance_s / s.replans * m.moe_layers * 1e3 : 0.0,
                  s.max_rebalance_s * m.moe_layers * 1e3);
    }
    std::fflush(stdout);
  }
  if (per_pass) std::fclose(per_pass);
  if (o.verify)
    std::printf("# verify: %lld (pass, strategy) rank-load recounts and %lld re-plan and migration byte checks: ok\n",
                verified_passes, verified_replans);
  return tools::exit_ok;
}

void usage() {
  std::printf(
      "serving_loop: the serving-loop study (docs/results/serving-loop.md)\n"
      "  --models LIST     olmoe, mixtral, dsv3-h800, dsv3-dgx (default all four)\n"
      "  --passes N        passes simulated, 30..100000 (default 2000)\n"
      "  --tokens N        tokens per rank per pass, 1..65536 (default 256)\n"
      "  --period R        passes between re-plans, 1..passes (default 100)\n"
      "  --window W        passes of loads a re-plan sees, 1..passes (default 100)\n"
      "  --chunk-mib B     weight bytes a rank sends and receives per pass, MiB, > 0 (default 64)\n"
      "  --tolerance T     migration::rebalance's balance tolerance, 0..10 (default 0.01)\n"
      "  --spare N         split-planner: most new experts per rank and re-plan, 1..64 (default 2)\n"
      "  --split-gain G    split-planner: least gain of a moved copy, permille of max/mean, 0..1000, or -1\n"
      "                    for the planner's default, 80 / ranks, at least 1 (default -1: 10 at 8 ranks, 2 at 32)\n"
      "  --seed S          seed of the batches (default 1)\n"
      "  --dsv3-groups N   expert groups EPLB and the minimal-move rule see for DeepSeek-V3: 8 (the\n"
      "                    model's, as engines pass it; default) or 1, 2, 4 (1: EPLB's global policy)\n"
      "  --per-pass FILE   write one TSV row per (model, strategy, pass)\n"
      "  --split-swaps     split-planner: also try swaps of two ranks' experts (within a node under the\n"
      "                    group rule)\n"
      "  --verify          recount every pass and re-plan against brute-force references\n");
}

}  // namespace

int main(int argc, char** argv) {
  return tools::guarded_main(kProgram, [&]() -> int {
    tools::Args a(argc, argv,
                  {{"models"}, {"passes"}, {"tokens"}, {"period"}, {"window"}, {"chunk-mib"}, {"tolerance"}, {"spare"}, {"split-gain"}, {"seed"},
                   {"dsv3-groups"}, {"per-pass"}, {"verify", true}, {"split-swaps", true}});
    if (a.help()) {
      usage();
      return tools::exit_ok;
    }
    Options o;
    o.models = a.list("models", "olmoe,mixtral,dsv3-h800,dsv3-dgx");
    for (auto const& n : o.models)
      check(std::find(sv::kModelNames.begin(), sv::kModelNames.end(), n) != sv::kModelNames.end(), "--models: unknown model '",
            n, "' (olmoe, mixtral, dsv3-h800, dsv3-dgx)");
    o.passes = static_cast<int>(a.integer("passes", 2000, 30, 100000));
    o.tokens = static_cast<int>(a.integer("tokens", 256, 1, 65536));
    o.period = static_cast<int>(a.integer("period", 100, 1, o.passes));
    o.window = static_cast<int>(a.integer("window", 100, 1, o.passes));
    o.chunk_bytes = a.number("chunk-mib", 64, 1.0 / 1024, 1 << 20) * 1024.0 * 1024.0;
    o.tolerance = a.number("tolerance", 0.01, 0, 10);
    o.spare = static_cast<int>(a.integer("spare", 2, 1, 64));
    o.split_gain = static_cast<int>(a.integer("split-gain", -1, -1, 1000));
    o.seed = static_cast<std::uint64_t>(a.integer("seed", 1, 0, std::numeric_limits<long long>::max()));
    o.dsv3_groups = static_cast<int>(a.integer("dsv3-groups", 8, 1, 8));
    check(o.dsv3_groups == 1 || o.dsv3_groups == 2 || o.dsv3_groups == 4 || o.dsv3_groups == 8, "--dsv3-groups: ",
          o.dsv3_groups, " does not divide DeepSeek-V3's 8 groups (1, 2, 4 or 8)");
    o.per_pass = a.text("per-pass");
    o.verify = a.has("verify");
    o.split_swaps = a.has("split-swaps");
    try {
      return run(o);
    } catch (VerifyError const& e) {
      std::fprintf(stderr, "%s: %s\n", kProgram, e.what.c_str());
      return tools::exit_check;
    }
  });
}
