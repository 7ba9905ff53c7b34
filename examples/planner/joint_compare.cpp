// joint_compare: every planner judged by the link-level traffic model on the same held-out batches
// (docs/planners.md, "The joint planner"). Per scenario: plans from the first batches of a profile
// (contiguous, EPLB, EPLB counts + the joint placement, CRAFT, ILPLoad, joint at equal replica
// memory), then, on the held-out batches,
// each layer's tokens routed as moe::Layer routes them with the plan's replica policy.
//
//   joint_compare                 all scenarios of the docs' table
//   joint_compare --scenario r1-fattree-256 --test-batches 2 --tokens 4096 --layers 8
//   joint_compare --scenario r1-fattree-256 --concentration 8000     (drift of the synthetic batches)
//   joint_compare --scenario r1-fattree-256 --reactive both --reactive-rounds 20   (routes from
//                 each batch's own counts: replication::Reactive, the host layer's greedy policy,
//                 and study rows by linear programs and by parallel rounds; reactive_study.hpp)
//
// Batches. Model shapes (R1, Qwen3, Kimi-K2): seeded Zipf-like marginals, per-batch loads drawn
// around them (seeded Dirichlet), and the tokens of a held-out batch draw their top-k experts without
// replacement in proportion to that batch's loads: synthetic, with no co-activation. OLMoE: the
// real arxiv token -> expert counts (layers 0, 7, 15 of tests/data/olmoe-routing), split in halves
// by occurrence (seeded); training and held-out batches are tokens drawn from their half
// (profile::TokenSampler: a token id by frequency, then its experts from the id's counts), so they
// carry the co-activation of real routing, and the joint planner gets the training batches'
// co-selection counts.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <numeric>
#include <span>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "moe/core/cli.hpp"
#include "moe/models/models.hpp"
#include "moe/placement/ilp.hpp"
#include "moe/placement/joint.hpp"
#include "moe/placement/metrics.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/profile/olmoe_tokens.hpp"
#include "moe/profile/route_split.hpp"
#include "moe/profile/token_batches.hpp"
#include "moe/replication/craft.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/replication/reactive.hpp"
#include "moe/replication/routed.hpp"
#include "moe/topology/traffic.hpp"
#include "reactive_study.hpp"

using namespace moe;

namespace {

struct Scenario {
  std::string name;
  int layers, experts, top_k, hidden, ffn, groups;
  topology::Topology topo;
  bool olmoe = false;
};

template <class M>
Scenario scenario(std::string name, topology::Topology t) {
  return {std::move(name), M::spec.moe_layers, M::spec.experts, M::spec.top_k, M::spec.hidden, M::spec.expert_ffn,
          M::spec.groups, std::move(t)};
}

std::vector<Scenario> all_scenarios() {
  std::vector<Scenario> s;
  s.push_back(scenario<models::DeepSeekR1>("r1-fattree-256", topology::paper_cluster(topology::Kind::fat_tree)));
  s.push_back(scenario<models::DeepSeekR1>("r1-dragonfly-256", topology::paper_cluster(topology::Kind::dragonfly)));
  s.push_back(scenario<models::Qwen3_235B_A22B>("qwen3-235b-64", topology::fat_tree(4, 2, 8)));
  s.push_back(scenario<models::KimiK2>("kimi-k2-128", topology::fat_tree(4, 4, 8)));
  for (int g : {8, 16, 32, 64}) {
    auto o = scenario<models::OLMoE_1B_7B>("olmoe-" + std::to_string(g), topology::fat_tree(std::max(1, g / 16), std::min(4, g / 4), 4));
    o.olmoe = true;
    o.layers = 3;
    s.push_back(std::move(o));
  }
  return s;
}

/// Tokens of one layer of a held-out batch: top-k experts without replacement, each token drawing
/// with probability proportional to the batch's loads (Gumbel top-k), sources spread over all GPUs.
topology::Batch sample_tokens(double const* load, int experts, int top_k, int tokens, int gpus, std::mt19937_64& rng) {
  topology::Batch b;
  b.top_k = top_k;
  std::vector<int> ranks(static_cast<std::size_t>(gpus));
  for (int g = 0; g < gpus; ++g) ranks[static_cast<std::size_t>(g)] = g;
  b.source = topology::spread_tokens(tokens, ranks);
  std::uniform_real_distribution<double> u(1e-300, 1.0);
  std::vector<std::pair<double, int>> key(static_cast<std::size_t>(experts));
  for (int t = 0; t < tokens; ++t) {
    for (int e = 0; e < experts; ++e)
      key[static_cast<std::size_t>(e)] = {load[e] > 0 ? std::log(load[e]) - std::log(-std::log(u(rng))) : -1e300, e};
    std::partial_sort(key.begin(), key.begin() + top_k, key.end(), std::greater<>());
    for (int j = 0; j < top_k; ++j) b.experts.push_back(key[static_cast<std::size_t>(j)].second);
  }
  return b;
}

struct Row {
  std::string policy;
  double time_us = 0, hop_gb = 0, balance = 0, dest = 0, replica_gib = 0, solve_s = 0;
  long long replicas = 0;
  std::map<std::string, int> bottleneck;  ///< level of the dispatch bottleneck link, counted
};

int run(int argc, char** argv) {
  std::map<std::string, std::string> opt;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    check(a.rfind("--", 0) == 0 && i + 1 < argc, "bad argument '", a, "' (options take a value)");
    opt[a.substr(2)] = argv[++i];
  }
  auto geti = [&](char const* k, long long d, long long lo, long long hi) {
    return opt.count(k) ? core::parse_int(opt[k], std::string("--") + k, lo, hi) : d;
  };
  int train_batches = static_cast<int>(geti("train-batches", 20, 1, 100000));
  int test_batches = static_cast<int>(geti("test-batches", 2, 1, 1000));
  int tokens = static_cast<int>(geti("tokens", 4096, 1, 1 << 20));
  int max_layers = static_cast<int>(geti("layers", 0, 0, core::limits::layers));
  // Batch-to-batch drift of the synthetic rows (profile::SampleOptions::concentration): larger is
  // closer to the marginals. The docs' table uses the default; other values are for sensitivity.
  double concentration = opt.count("concentration") ? core::parse_double(opt["concentration"], "--concentration", 1.0, 1e9)
                                                    : profile::SampleOptions{}.concentration;
  std::string only = opt.count("scenario") ? opt["scenario"] : "";
  // Study rows (docs/planners.md): the joint placement with routes computed from each held-out
  // batch's own counts, by a greedy rule, by linear programs (GLPK) or by N parallel rounds.
  std::string reactive = opt.count("reactive") ? opt["reactive"] : "off";
  check(reactive == "off" || reactive == "greedy" || reactive == "lp" || reactive == "both",
        "--reactive: expected off, greedy, lp or both, got '", reactive, "'");
  bool reactive_greedy = reactive == "greedy" || reactive == "both", reactive_lp = reactive == "lp" || reactive == "both";
  int reactive_rounds = static_cast<int>(geti("reactive-rounds", 0, 0, 1000));
  double reactive_rate = opt.count("reactive-rate") ? core::parse_double(opt["reactive-rate"], "--reactive-rate", 0.0, 1e6) : 3.0;
#ifndef MOE_JOINT_COMPARE_GLPK
  check(!reactive_lp, "--reactive lp and both need GLPK at build time (Debian libglpk-dev)");
#endif

  std::printf("scenario\tgpus\tpolicy\tbottleneck_us\thop_GB\tbalancedness\treplicas\treplica_GiB\tdest_per_token\tsolve_s\tbottleneck_levels\n");
  for (auto& sc : all_scenarios()) {
    if (!only.empty() && sc.name != only) continue;
    int G = sc.topo.gpus(), E = sc.experts;
    if (max_layers > 0 && !sc.olmoe) sc.layers = std::min(sc.layers, max_layers);
    int L = sc.layers;
    // Training loads (and co-selections) and the held-out batches, per batch and layer.
    profile::LoadProfile train;
    std::vector<std::vector<topology::Batch>> test;
    std::vector<double> coact;
    std::vector<int> ranks(static_cast<std::size_t>(G));
    std::iota(ranks.begin(), ranks.end(), 0);
    auto sources = topology::spread_tokens(tokens, ranks);
    if (sc.olmoe) {
      auto all = profile::olmoe::load(MOE_DATA_DIR, {"arxiv"});
      auto [fit, held] = profile::split_profile(all, 0.5, 5);
      auto layer_ids = all.layers();
      L = sc.layers = static_cast<int>(layer_ids.size());
      train = profile::LoadProfile(train_batches, L, E);
      coact.assign(static_cast<std::size_t>(L) * E * E, 0.0);
      profile::Rng rng(17);
      std::vector<int> chosen;
      for (int l = 0; l < L; ++l) {
        profile::TokenSampler fs(fit, layer_ids[static_cast<std::size_t>(l)]);
        for (int b = 0; b < train_batches; ++b) {
          chosen.clear();
          fs.sample(tokens, rng, chosen);
          for (int e : chosen) train.at(b, l, e) += 1;
          placement::joint::add_coactivation(chosen, sc.top_k, E,
                                             std::span(coact).subspan(static_cast<std::size_t>(l) * E * E, static_cast<std::size_t>(E) * E));
        }
      }
      test.assign(static_cast<std::size_t>(test_batches), std::vector<topology::Batch>(static_cast<std::size_t>(L)));
      for (int l = 0; l < L; ++l) {
        profile::TokenSampler hs(held, layer_ids[static_cast<std::size_t>(l)]);
        for (int b = 0; b < test_batches; ++b) {
          auto& batch = test[static_cast<std::size_t>(b)][static_cast<std::size_t>(l)];
          batch.top_k = sc.top_k;
          batch.source = sources;
          hs.sample(tokens, rng, batch.experts);
        }
      }
    } else {
      profile::SampleOptions so;
      so.batches = train_batches + test_batches;
      so.tokens_per_batch = tokens;
      so.top_k = sc.top_k;
      so.seed = 11;
      so.concentration = concentration;
      auto prof = profile::sample_profile(profile::zipf_marginals(L, E, 0.3, 0.8, 1), so);
      train = prof.slice(0, train_batches);
      auto held = prof.slice(train_batches, train_batches + test_batches);
      std::mt19937_64 rng(99);
      test.assign(static_cast<std::size_t>(test_batches), {});
      for (int b = 0; b < test_batches; ++b)
        for (int l = 0; l < L; ++l)
          test[static_cast<std::size_t>(b)].push_back(sample_tokens(held.row(b, l), E, sc.top_k, tokens, G, rng));
    }
    auto totals = train.totals();
    topology::TrafficModel model(sc.topo);
    topology::TrafficOptions to;
    to.hidden = sc.hidden;
    double expert_gib = 3.0 * sc.hidden * sc.ffn * 2 / (1024.0 * 1024.0 * 1024.0);

    // Joint first: its slot count sets the replica memory every replicating policy gets.
    placement::joint::Options jo;
    auto t0 = std::chrono::steady_clock::now();
    // Batch-to-batch spread of each expert's load in the training batches, in the units of totals.
    jo.load_sd = placement::joint::load_spread(train);
    jo.coact = coact;
    auto joint = placement::joint::plan(sc.topo, totals, L, E, jo);
    double joint_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!coact.empty()) {
      auto co = joint.co_location_totals();
      std::fprintf(stderr, "%s: joint co-locates in %d of %d layers; regrouping: %d swaps, co-located sends %.0f -> %.0f\n",
                   sc.name.c_str(), co.layers, L, co.swaps, co.saved_before, co.saved_after);
    }
    int extra = G * joint.slots_per_gpu - E;  // redundant slots per layer

    // Each policy: per layer a primary table and a replica policy; evaluated on the test batches.
    auto evaluate = [&](std::string const& name, double solve_s, long long replicas, auto const& layer_policy,
                        double extra_us = 0) {
      Row r;
      r.policy = name;
      r.solve_s = solve_s;
      r.replicas = replicas;
      r.replica_gib = static_cast<double>(replicas) * expert_gib;
      int n = 0;
      for (int b = 0; b < test_batches; ++b)
        for (int l = 0; l < L; ++l) {
          auto const& batch = test[static_cast<std::size_t>(b)][static_cast<std::size_t>(l)];
          auto rep = layer_policy(l, batch);
          r.time_us += (rep.dispatch_time + rep.combine_time) * 1e6 + extra_us;
          r.hop_gb += rep.hop_bytes / 1e9;
          r.dest += rep.destinations_per_token;
          double mx = *std::max_element(rep.gpu_load.begin(), rep.gpu_load.end());
          r.balance += mx > 0 ? (static_cast<double>(tokens) * sc.top_k / G) / mx : 1.0;
          if (rep.dispatch_bottleneck >= 0) ++r.bottleneck[topology::level_name(model.link(rep.dispatch_bottleneck).level)];
          ++n;
        }
      r.time_us /= n, r.hop_gb /= n, r.dest /= n, r.balance /= n;
      std::string where;
      for (auto const& [lv, cnt] : r.bottleneck) where += (where.empty() ? "" : ",") + lv + ":" + std::to_string(cnt);
      std::printf("%s\t%d\t%s\t%.1f\t%.3f\t%.4f\t%lld\t%.1f\t%.3f\t%.4f\t%s\n", sc.name.c_str(), G, r.policy.c_str(),
                  r.time_us, r.hop_gb, r.balance, r.replicas, r.replica_gib, r.dest, r.solve_s, where.c_str());
      std::fflush(stdout);
    };
    auto single = [&](std::vector<std::vector<int>> const& primary) {
      return [&, primary](int l, topology::Batch const& batch) {
        auto const& p = primary[static_cast<std::size_t>(l)];
        std::vector<std::vector<int>> c;
        for (int g : p) c.push_back({g});
        return model.evaluate_policy(replication::Table(std::move(c)), p, batch, to);
      };
    };

    // Contiguous (or round robin when E does not split over G).
    std::vector<std::vector<int>> contiguous(static_cast<std::size_t>(L));
    for (auto& p : contiguous)
      p = (E % G == 0 ? placement::Table::contiguous(E, G) : placement::Table::round_robin(E, G)).ranks();
    evaluate(E % G == 0 ? "contiguous" : "round-robin", 0.0, 0, single(contiguous));

    // EPLB with the same redundant slots per layer.
    t0 = std::chrono::steady_clock::now();
    int nodes = sc.topo.servers();  // EPLB falls back to its global policy when groups do not split over nodes
    auto er = replication::eplb::rebalance_experts(totals, L, E, E + extra, sc.groups, nodes, G);
    double eplb_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<replication::eplb::LayerTables> eplb_layers;
    for (int l = 0; l < L; ++l) eplb_layers.push_back(replication::eplb::layer_tables(er, l));
    evaluate("eplb", eplb_s, static_cast<long long>(extra) * L, [&](int l, topology::Batch const& batch) {
      auto const& lt = eplb_layers[static_cast<std::size_t>(l)];
      return model.evaluate_policy(lt.replicas, lt.placement.ranks(), batch, to);
    });

    // Two-step baseline: EPLB's copy counts, then the joint planner's placement (same per-GPU
    // load cap, same slots) and routing for those counts.
    {
      placement::joint::Options two = jo;
      two.coact.clear();  // the baseline places for the network and balance only
      two.slots_per_gpu = joint.slots_per_gpu;
      two.counts.assign(er.logcnt.v.begin(), er.logcnt.v.end());
      t0 = std::chrono::steady_clock::now();
      auto tp = placement::joint::plan(sc.topo, totals, L, E, two);
      double tp_s = eplb_s + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<replication::Routed> tr;
      long long treps = 0;
      for (int l = 0; l < L; ++l) {
        tr.push_back(tp.policy(l, sc.topo));
        treps += tp.stats[static_cast<std::size_t>(l)].replicas;
      }
      evaluate("eplb+place", tp_s, treps, [&](int l, topology::Batch const& batch) {
        return model.evaluate_policy(tr[static_cast<std::size_t>(l)], tp.plan[static_cast<std::size_t>(l)].placement.ranks(),
                                     batch, to);
      });
    }

    // CRAFT with the same total replica memory (replicas per GPU over all layers).
    if (E >= G) {
      replication::craft::Options co;
      co.replication_factor = std::max(1, extra * L / G);
      co.threads = 1;
      t0 = std::chrono::steady_clock::now();
      auto cp = replication::craft::plan(train, G, co);
      double craft_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      long long reps = 0;
      for (int x : cp.replicas) reps += x;
      evaluate("craft", craft_s, reps, [&](int l, topology::Batch const& batch) {
        return model.evaluate_policy(cp.tables[static_cast<std::size_t>(l)], cp.placement[static_cast<std::size_t>(l)].ranks(),
                                     batch, to);
      });
    }

    // ILPLoad (no replicas), c_layer = ceil(E / G).
    {
      int c_layer = (E + G - 1) / G;
      auto prob = placement::make_problem(sc.topo, L, E, c_layer, L * c_layer);
      t0 = std::chrono::steady_clock::now();
      auto il = placement::ilp_load(prob, totals);
      double il_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<std::vector<int>> prim;
      for (int l = 0; l < L; ++l) prim.push_back(il.assignment.table(l).ranks());
      evaluate("ilpload", il_s, 0, single(prim));
    }

    // Joint, with its routing.
    std::vector<replication::Routed> routed;
    long long jreps = 0;
    for (int l = 0; l < L; ++l) {
      routed.push_back(joint.policy(l, sc.topo));
      jreps += joint.stats[static_cast<std::size_t>(l)].replicas;
    }
    evaluate("joint", joint_s, jreps, [&](int l, topology::Batch const& batch) {
      return model.evaluate_policy(routed[static_cast<std::size_t>(l)],
                                   joint.plan[static_cast<std::size_t>(l)].placement.ranks(), batch, to);
    });
    if (reactive_greedy || reactive_lp || reactive_rounds > 0) {
      double exchange_us = study::count_allgather_us(model, E);
      // moe::Layer's record-count exchange (one 8-byte count per peer), which no row is charged.
      double record_counts_us = study::count_allgather_us(model, 2);
      std::fprintf(stderr,
                   "%s: reactive rows include %.1f us per layer for the all-gather of per-expert counts (the "
                   "layer's record-count all-to-all, charged to no row, would take %.1f us)\n",
                   sc.name.c_str(), exchange_us, record_counts_us);
      study::ServerPaths paths(sc.topo, model, to.token_bytes());
      auto reactive_row = [&](char const* name, auto const& solve) {
        double route_s = 0, columns = 0;  // computing the routes (counts to x); (server, copy) columns
        evaluate(name, joint_s, jreps, [&](int l, topology::Batch const& batch) {
          auto const& copies = routed[static_cast<std::size_t>(l)].table().replicas();
          auto t = std::chrono::steady_clock::now();
          study::RoutingProblem p(sc.topo, copies, batch);
          auto x = solve(p, l);
          columns += static_cast<double>(p.cols.size());
          route_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
          study::DealtRoutes dealt(sc.topo, p, x, batch);
          return model.evaluate_policy(dealt, joint.plan[static_cast<std::size_t>(l)].placement.ranks(), batch, to);
        }, exchange_us);
        double runs = static_cast<double>(L) * test_batches;
        std::fprintf(stderr,
                     "%s: %s computes the routes of a layer (%.0f (server, copy) columns) in %.3f ms (one core, "
                     "not charged in the row)\n",
                     sc.name.c_str(), name, columns / runs, 1e3 * route_s / runs);
      };
      if (reactive_greedy) {
        // The host layer's policy itself, one per layer on the joint plan's copies.
        std::vector<replication::Reactive> policies;
        for (int l = 0; l < L; ++l) policies.emplace_back(routed[static_cast<std::size_t>(l)].table().replicas(), sc.topo, jo.eps);
        double route_s = 0;
        evaluate("joint+reactive", joint_s, jreps, [&](int l, topology::Batch const& batch) {
          auto& policy = policies[static_cast<std::size_t>(l)];
          auto counts = replication::reactive::pair_counts(batch, G, E);
          auto t = std::chrono::steady_clock::now();
          policy.plan_batch(counts);
          route_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
          return model.evaluate_policy(policy.deal(batch), joint.plan[static_cast<std::size_t>(l)].placement.ranks(),
                                       batch, to);
        }, exchange_us);
        std::fprintf(stderr,
                     "%s: joint+reactive (replication::Reactive, greedy rule) computes the routes of a layer in "
                     "%.3f ms (one core, not charged in the row)\n",
                     sc.name.c_str(), 1e3 * route_s / (static_cast<double>(L) * test_batches));
      }
      if (reactive_rounds > 0)
        reactive_row(("joint+reactive-rounds" + std::to_string(reactive_rounds)).c_str(),
                     [&](study::RoutingProblem const& p, int l) {
                       // The start: the static routes' share of each column's copy (Routed keeps them
                       // cumulative, per source server).
                       auto const& plan_routes = routed[static_cast<std::size_t>(l)];
                       std::vector<double> start(p.cols.size(), 0.0);
                       for (std::size_t c = 0; c < p.cols.size(); ++c) {
                         double before = 0;
                         for (auto const& r : plan_routes.route(p.cols[c].e, paths.gpu_of(p.cols[c].s))) {
                           if (r.gpu == p.cols[c].g) start[c] = r.share - before;
                           before = r.share;
                         }
                       }
                       return study::round_routes(p, paths, start, jo.eps, reactive_rounds, reactive_rate);
                     });
#ifdef MOE_JOINT_COMPARE_GLPK
      if (reactive_lp)
        reactive_row("joint+reactive-lp", [&](study::RoutingProblem const& p, int) {
          return study::lp_routes(p, paths, jo.eps);
        });
#endif
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (std::exception const& e) {
    std::cerr << "joint_compare: " << e.what() << "\n";
    return 2;
  }
}
