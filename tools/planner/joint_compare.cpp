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
//   joint_compare --scenario r1-fattree-256 --preset dgx-h100   (R1 on a hardware preset's cluster,
//                 NAME[:SERVERS]; moe/topology/presets.hpp)
//
// Scenarios, batches and plans: joint_scenarios.hpp (shared with simgrid_compare, which judges the
// same plans in SimGrid).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "moe_tools/cli.hpp"
#include "moe_tools/joint_scenarios.hpp"
#include "moe_tools/reactive_study.hpp"

using namespace moe;

namespace {

struct Row {
  std::string policy;
  double time_us = 0, hop_gb = 0, balance = 0, dest = 0, replica_gib = 0, solve_s = 0;
  long long replicas = 0;
  std::map<std::string, int> bottleneck;  ///< level of the dispatch bottleneck link, counted
};

int run(int argc, char** argv) {
  tools::Args const args(argc, argv,
                         {{"train-batches"}, {"test-batches"}, {"tokens"}, {"layers"}, {"concentration"}, {"scenario"},
                          {"reactive"}, {"reactive-rounds"}, {"reactive-rate"}, {"preset"}});
  if (args.help()) {
    std::printf("usage: joint_compare [--scenario NAME] [--preset NAME[:SERVERS]] [--train-batches N] [--test-batches N]\n"
                "                     [--tokens N] [--layers N] [--concentration C] [--reactive off|greedy|lp|both]\n"
                "                     [--reactive-rounds N] [--reactive-rate R]   (docs/planners.md)\n");
    return tools::exit_ok;
  }
  auto geti = [&](char const* k, long long d, long long lo, long long hi) { return args.integer(k, d, lo, hi); };
  int train_batches = static_cast<int>(geti("train-batches", 20, 1, 100000));
  int test_batches = static_cast<int>(geti("test-batches", 2, 1, 1000));
  int tokens = static_cast<int>(geti("tokens", 4096, 1, 1 << 20));
  int max_layers = static_cast<int>(geti("layers", 0, 0, core::limits::layers));
  // Batch-to-batch drift of the synthetic rows (profile::SampleOptions::concentration): larger is
  // closer to the marginals. The docs' table uses the default; other values are for sensitivity.
  double concentration = args.number("concentration", profile::SampleOptions{}.concentration, 1.0, 1e9);
  std::string only = args.text("scenario");
  // Study rows (docs/planners.md): the joint placement with routes computed from each held-out
  // batch's own counts, by a greedy rule, by linear programs (GLPK) or by N parallel rounds.
  std::string reactive = args.choice("reactive", "off", {"off", "greedy", "lp", "both"});
  bool reactive_greedy = reactive == "greedy" || reactive == "both", reactive_lp = reactive == "lp" || reactive == "both";
  int reactive_rounds = static_cast<int>(geti("reactive-rounds", 0, 0, 1000));
  double reactive_rate = args.number("reactive-rate", 3.0, 0.0, 1e6);
#ifndef MOE_JOINT_COMPARE_GLPK
  check(!reactive_lp, "--reactive lp and both need GLPK at build time (Debian libglpk-dev)");
#endif

  if (!only.empty()) {
    std::string known;
    bool found = false;
    for (auto const& sc : joint_scenarios::all_scenarios()) {
      found = found || sc.name == only;
      known += (known.empty() ? "" : ", ") + sc.name;
    }
    check(found, "--scenario: unknown scenario '", only, "' (known: ", known, ")");
  }
  check(reactive != "off" || (!args.has("reactive-rounds") && !args.has("reactive-rate")),
        "--reactive-rounds and --reactive-rate apply to the reactive rows: give --reactive greedy, lp or both");
  std::printf("scenario\tgpus\tpolicy\tbottleneck_us\thop_GB\tbalancedness\treplicas\treplica_GiB\tdest_per_token\tsolve_s\tbottleneck_levels\n");
  for (auto& sc : joint_scenarios::all_scenarios()) {
    if (!only.empty() && sc.name != only) continue;
    if (args.has("preset")) joint_scenarios::use_preset(sc, args.text("preset"));  // the model on a preset cluster
    joint_scenarios::Setup su;
    su.train_batches = train_batches;
    su.test_batches = test_batches;
    su.tokens = tokens;
    su.max_layers = max_layers;
    su.concentration = concentration;
    auto data = joint_scenarios::make_data(sc, su);
    int G = sc.topo.gpus(), E = sc.experts;
    int L = sc.layers;
    auto const& test = data.test;
    topology::TrafficModel model(sc.topo);
    topology::TrafficOptions to;
    to.hidden = sc.hidden;
    double expert_gib = 3.0 * sc.hidden * sc.ffn * 2 / (1024.0 * 1024.0 * 1024.0);

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

    // contiguous, eplb, eplb+place, craft, ilpload, joint, joint+reactive (joint_scenarios.hpp).
    if (reactive_greedy || reactive_lp || reactive_rounds > 0) {
      std::fprintf(stderr,
                   "%s: reactive rows include %.1f us per layer for the all-gather of per-expert counts (the "
                   "layer's record-count all-to-all, charged to no row, would take %.1f us)\n",
                   sc.name.c_str(), study::count_allgather_us(model, E), study::count_allgather_us(model, 2));
    }
    auto built = joint_scenarios::make_plans(sc, data, model, to, reactive_greedy);
    for (auto const& plan : built.plans) {
      evaluate(plan.name, plan.solve_s, plan.replicas,
               [&](int l, topology::Batch const& batch) { return plan.prepare(l, batch)(batch, 0); }, plan.extra_us);
      if (plan.after) plan.after(static_cast<double>(L) * test_batches);
    }
    auto const& jo = built.jo;
    auto const& joint = *built.joint;
    auto const& routed = *built.routed;
    double joint_s = built.joint_s;
    long long jreps = built.jreps;
    if (reactive_lp || reactive_rounds > 0) {
      double exchange_us = study::count_allgather_us(model, E);
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
  return moe::tools::guarded_main("joint_compare", [&] { return run(argc, argv); });
}
