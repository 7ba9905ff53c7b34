#pragma once
// The scenarios, batches and plans that joint_compare judges with the traffic model, shared with
// simgrid_compare, which judges the same plans in SimGrid (docs/planners.md, docs/results/simgrid.md).
//
// Batches. Model shapes (R1, Qwen3, Kimi-K2): seeded Zipf-like marginals, per-batch loads drawn
// around them (seeded Dirichlet), and the tokens of a held-out batch draw their top-k experts without
// replacement in proportion to that batch's loads: synthetic, with no co-activation. OLMoE: the
// real arxiv token -> expert counts (layers 0, 7, 15 of tests/data/olmoe-routing), split in halves
// by occurrence (seeded); training and held-out batches are tokens drawn from their half
// (profile::TokenSampler: a token id by frequency, then its experts from the id's counts), so they
// carry the co-activation of real routing, and the joint planner gets the training batches'
// co-selection counts.
//
// Plans (make_plans), in joint_compare's row order: contiguous (or round robin), EPLB, EPLB counts +
// the joint placement, CRAFT (when experts >= GPUs), ILPLoad, joint, and joint+reactive (the host
// layer's replication::Reactive on the joint plan's copies) when asked, with joint+split and
// eplb+split (replication::BatchSplit on the joint plan's and EPLB's copies). Each plan prepares, per
// layer and held-out batch, an evaluator: the traffic model's report for a run of that batch's
// tokens, routed as moe::Layer routes them with the plan's replica policy.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

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
#include "moe/replication/batch_split.hpp"
#include "moe/replication/reactive.hpp"
#include "moe/replication/routed.hpp"
#include "moe/topology/traffic.hpp"
#include "moe/topology/presets.hpp"
#include "moe_tools/reactive_study.hpp"

namespace moe::joint_scenarios {

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

inline std::vector<Scenario> all_scenarios() {
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

/// Moves a scenario's model onto a hardware preset (--preset NAME[:SERVERS] of joint_compare and
/// simgrid_compare; moe/topology/presets.hpp): the cluster and its link parameters become the
/// preset's, and the name becomes the model's part of it, '@', the spec (r1@dgx-h100:32).
inline void use_preset(Scenario& sc, std::string const& spec) {
  sc.topo = topology::preset_topology(spec);
  sc.name = sc.name.substr(0, sc.name.find('-')) + "@" + spec;
}

/// Tokens of one layer of a held-out batch: top-k experts without replacement, each token drawing
/// with probability proportional to the batch's loads (Gumbel top-k), sources spread over all GPUs.
inline topology::Batch sample_tokens(double const* load, int experts, int top_k, int tokens, int gpus,
                                     std::mt19937_64& rng) {
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

struct Setup {
  int train_batches = 20;
  int test_batches = 2;
  int tokens = 4096;       ///< per training batch (and per held-out batch unless test_tokens is set)
  int test_tokens = 0;     ///< tokens per held-out batch; 0: `tokens`
  int max_layers = 0;      ///< 0: every layer (OLMoE scenarios always keep their 3 layers)
  double concentration = profile::SampleOptions{}.concentration;
  [[nodiscard]] int held_tokens() const { return test_tokens > 0 ? test_tokens : tokens; }
};

struct Data {
  profile::LoadProfile train;                     ///< training loads
  std::vector<std::vector<topology::Batch>> test;  ///< held-out batches, per batch and layer
  std::vector<double> coact;                      ///< OLMoE: co-selection counts per layer (E x E)
};

/// The training loads and held-out batches of a scenario (sets sc.layers for --layers and OLMoE).
inline Data make_data(Scenario& sc, Setup const& su) {
  int G = sc.topo.gpus(), E = sc.experts;
  if (su.max_layers > 0 && !sc.olmoe) sc.layers = std::min(sc.layers, su.max_layers);
  int L = sc.layers;
  int held_tokens = su.held_tokens();
  Data d;
  std::vector<int> ranks(static_cast<std::size_t>(G));
  std::iota(ranks.begin(), ranks.end(), 0);
  auto sources = topology::spread_tokens(held_tokens, ranks);
  if (sc.olmoe) {
    auto all = profile::olmoe::load(MOE_DATA_DIR, {"arxiv"});
    auto [fit, held] = profile::split_profile(all, 0.5, 5);
    auto layer_ids = all.layers();
    L = sc.layers = static_cast<int>(layer_ids.size());
    d.train = profile::LoadProfile(su.train_batches, L, E);
    d.coact.assign(static_cast<std::size_t>(L) * E * E, 0.0);
    profile::Rng rng(17);
    std::vector<int> chosen;
    for (int l = 0; l < L; ++l) {
      profile::TokenSampler fs(fit, layer_ids[static_cast<std::size_t>(l)]);
      for (int b = 0; b < su.train_batches; ++b) {
        chosen.clear();
        fs.sample(su.tokens, rng, chosen);
        for (int e : chosen) d.train.at(b, l, e) += 1;
        placement::joint::add_coactivation(chosen, sc.top_k, E,
                                           std::span(d.coact).subspan(static_cast<std::size_t>(l) * E * E, static_cast<std::size_t>(E) * E));
      }
    }
    d.test.assign(static_cast<std::size_t>(su.test_batches), std::vector<topology::Batch>(static_cast<std::size_t>(L)));
    for (int l = 0; l < L; ++l) {
      profile::TokenSampler hs(held, layer_ids[static_cast<std::size_t>(l)]);
      for (int b = 0; b < su.test_batches; ++b) {
        auto& batch = d.test[static_cast<std::size_t>(b)][static_cast<std::size_t>(l)];
        batch.top_k = sc.top_k;
        batch.source = sources;
        hs.sample(held_tokens, rng, batch.experts);
      }
    }
  } else {
    profile::SampleOptions so;
    so.batches = su.train_batches + su.test_batches;
    so.tokens_per_batch = su.tokens;
    so.top_k = sc.top_k;
    so.seed = 11;
    so.concentration = su.concentration;
    auto prof = profile::sample_profile(profile::zipf_marginals(L, E, 0.3, 0.8, 1), so);
    d.train = prof.slice(0, su.train_batches);
    auto held = prof.slice(su.train_batches, su.train_batches + su.test_batches);
    std::mt19937_64 rng(99);
    d.test.assign(static_cast<std::size_t>(su.test_batches), {});
    for (int b = 0; b < su.test_batches; ++b)
      for (int l = 0; l < L; ++l)
        d.test[static_cast<std::size_t>(b)].push_back(sample_tokens(held.row(b, l), E, sc.top_k, held_tokens, G, rng));
  }
  return d;
}

/// The traffic model's report for `tokens`, a run of a held-out batch's tokens whose first token
/// has index `first_token` in the batch (the whole batch: first_token 0).
using LayerEval = std::function<topology::TrafficReport(topology::Batch const& tokens, long long first_token)>;

struct Plan {
  std::string name;
  double solve_s = 0;
  long long replicas = 0;
  double extra_us = 0;  ///< charged per layer on top of the traffic (reactive rows: count all-gather)
  /// The evaluator of layer l on one held-out batch (a reactive plan computes its routes here).
  std::function<LayerEval(int layer, topology::Batch const& batch)> prepare;
  /// Called once after every layer of every batch was prepared (stderr notes); may be empty.
  std::function<void(double runs)> after;
};

/// Everything make_plans built: the plans in row order, and what joint_compare's study rows reuse.
struct Plans {
  std::vector<Plan> plans;
  placement::joint::Options jo;
  std::shared_ptr<placement::joint::Result> joint;
  std::shared_ptr<std::vector<replication::Routed>> routed;  ///< the joint plan's routing, per layer
  double joint_s = 0;
  long long jreps = 0;
};

/// Builds the plans of a scenario (see the header comment). `reactive_greedy` adds joint+reactive.
inline Plans make_plans(Scenario const& sc, Data const& data, topology::TrafficModel const& model,
                        topology::TrafficOptions const& to, bool reactive_greedy) {
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  int G = sc.topo.gpus(), E = sc.experts, L = sc.layers;
  auto const& train = data.train;
  auto totals = train.totals();
  Plans out;

  // Joint first: its slot count sets the replica memory every replicating policy gets.
  auto& jo = out.jo;
  auto t0 = clock::now();
  // Batch-to-batch spread of each expert's load in the training batches, in the units of totals.
  jo.load_sd = placement::joint::load_spread(train);
  jo.coact = data.coact;
  out.joint = std::make_shared<placement::joint::Result>(placement::joint::plan(sc.topo, totals, L, E, jo));
  out.joint_s = seconds(t0);
  auto joint = out.joint;
  if (!data.coact.empty()) {
    auto co = joint->co_location_totals();
    std::fprintf(stderr, "%s: joint co-locates in %d of %d layers; regrouping: %d swaps, co-located sends %.0f -> %.0f\n",
                 sc.name.c_str(), co.layers, L, co.swaps, co.saved_before, co.saved_after);
  }
  int extra = G * joint->slots_per_gpu - E;  // redundant slots per layer

  auto single = [&](std::vector<std::vector<int>> primary) {
    return [&model, to, primary = std::make_shared<std::vector<std::vector<int>>>(std::move(primary))](
               int l, topology::Batch const&) -> LayerEval {
      auto const& p = (*primary)[static_cast<std::size_t>(l)];
      std::vector<std::vector<int>> c;
      for (int g : p) c.push_back({g});
      auto table = std::make_shared<replication::Table>(std::move(c));
      return [&model, to, table, primary, l](topology::Batch const& b, long long first) {
        return model.evaluate_policy(*table, (*primary)[static_cast<std::size_t>(l)], b, to, first);
      };
    };
  };
  // Contiguous (or round robin when E does not split over G).
  {
    std::vector<std::vector<int>> contiguous(static_cast<std::size_t>(L));
    for (auto& p : contiguous)
      p = (E % G == 0 ? placement::Table::contiguous(E, G) : placement::Table::round_robin(E, G)).ranks();
    out.plans.push_back({E % G == 0 ? "contiguous" : "round-robin", 0.0, 0, 0.0, single(std::move(contiguous)), {}});
  }

  // EPLB with the same redundant slots per layer.
  t0 = clock::now();
  int nodes = sc.topo.servers();  // EPLB falls back to its global policy when groups do not split over nodes
  auto er = replication::eplb::rebalance_experts(totals, L, E, E + extra, sc.groups, nodes, G);
  double eplb_s = seconds(t0);
  {
    auto eplb_layers = std::make_shared<std::vector<replication::eplb::LayerTables>>();
    for (int l = 0; l < L; ++l) eplb_layers->push_back(replication::eplb::layer_tables(er, l));
    out.plans.push_back({"eplb", eplb_s, static_cast<long long>(extra) * L, 0.0,
                         [&model, to, eplb_layers](int l, topology::Batch const&) -> LayerEval {
                           return [&model, to, eplb_layers, l](topology::Batch const& b, long long first) {
                             auto const& lt = (*eplb_layers)[static_cast<std::size_t>(l)];
                             return model.evaluate_policy(lt.replicas, lt.placement.ranks(), b, to, first);
                           };
                         },
                         {}});
  }

  // Two-step baseline: EPLB's copy counts, then the joint planner's placement (same per-GPU
  // load cap, same slots) and routing for those counts.
  {
    placement::joint::Options two = jo;
    two.coact.clear();  // the baseline places for the network and balance only
    two.slots_per_gpu = joint->slots_per_gpu;
    two.counts.assign(er.logcnt.v.begin(), er.logcnt.v.end());
    t0 = clock::now();
    auto tp = std::make_shared<placement::joint::Result>(placement::joint::plan(sc.topo, totals, L, E, two));
    double tp_s = eplb_s + seconds(t0);
    auto tr = std::make_shared<std::vector<replication::Routed>>();
    long long treps = 0;
    for (int l = 0; l < L; ++l) {
      tr->push_back(tp->policy(l, sc.topo));
      treps += tp->stats[static_cast<std::size_t>(l)].replicas;
    }
    out.plans.push_back({"eplb+place", tp_s, treps, 0.0,
                         [&model, to, tp, tr](int l, topology::Batch const&) -> LayerEval {
                           return [&model, to, tp, tr, l](topology::Batch const& b, long long first) {
                             return model.evaluate_policy((*tr)[static_cast<std::size_t>(l)],
                                                          tp->plan[static_cast<std::size_t>(l)].placement.ranks(), b, to, first);
                           };
                         },
                         {}});
  }

  // CRAFT with the same total replica memory (replicas per GPU over all layers).
  if (E >= G) {
    replication::craft::Options co;
    co.replication_factor = std::max(1, extra * L / G);
    co.threads = 1;
    t0 = clock::now();
    auto cp = std::make_shared<replication::craft::Plan>(replication::craft::plan(train, G, co));
    double craft_s = seconds(t0);
    long long reps = 0;
    for (int x : cp->replicas) reps += x;
    out.plans.push_back({"craft", craft_s, reps, 0.0,
                         [&model, to, cp](int l, topology::Batch const&) -> LayerEval {
                           return [&model, to, cp, l](topology::Batch const& b, long long first) {
                             return model.evaluate_policy(cp->tables[static_cast<std::size_t>(l)],
                                                          cp->placement[static_cast<std::size_t>(l)].ranks(), b, to, first);
                           };
                         },
                         {}});
  }

  // ILPLoad (no replicas), c_layer = ceil(E / G).
  {
    int c_layer = (E + G - 1) / G;
    auto prob = placement::make_problem(sc.topo, L, E, c_layer, L * c_layer);
    t0 = clock::now();
    auto il = placement::ilp_load(prob, totals);
    double il_s = seconds(t0);
    std::vector<std::vector<int>> prim;
    for (int l = 0; l < L; ++l) prim.push_back(il.assignment.table(l).ranks());
    out.plans.push_back({"ilpload", il_s, 0, 0.0, single(std::move(prim)), {}});
  }

  // Joint, with its routing.
  out.routed = std::make_shared<std::vector<replication::Routed>>();
  for (int l = 0; l < L; ++l) {
    out.routed->push_back(joint->policy(l, sc.topo));
    out.jreps += joint->stats[static_cast<std::size_t>(l)].replicas;
  }
  auto routed = out.routed;
  out.plans.push_back({"joint", out.joint_s, out.jreps, 0.0,
                       [&model, to, joint, routed](int l, topology::Batch const&) -> LayerEval {
                         return [&model, to, joint, routed, l](topology::Batch const& b, long long first) {
                           return model.evaluate_policy((*routed)[static_cast<std::size_t>(l)],
                                                        joint->plan[static_cast<std::size_t>(l)].placement.ranks(), b, to, first);
                         };
                       },
                       {}});

  if (reactive_greedy) {
    // The host layer's policy itself, one per layer on the joint plan's copies; every reactive row
    // is charged the all-gather of per-expert counts.
    double exchange_us = study::count_allgather_us(model, E);
    auto policies = std::make_shared<std::vector<replication::Reactive>>();
    for (int l = 0; l < L; ++l) policies->emplace_back((*routed)[static_cast<std::size_t>(l)].table().replicas(), sc.topo, jo.eps);
    auto route_s = std::make_shared<double>(0.0);
    std::string name = sc.name;
    out.plans.push_back({"joint+reactive", out.joint_s, out.jreps, exchange_us,
                         [&model, to, joint, policies, route_s, G, E](int l, topology::Batch const& batch) -> LayerEval {
                           auto& policy = (*policies)[static_cast<std::size_t>(l)];
                           auto counts = replication::reactive::pair_counts(batch, G, E);
                           auto t = clock::now();
                           policy.plan_batch(counts);
                           *route_s += std::chrono::duration<double>(clock::now() - t).count();
                           auto dealt = std::make_shared<replication::reactive::PairRoutes>(policy.deal(batch));
                           return [&model, to, dealt, joint, l](topology::Batch const& b, long long first) {
                             return model.evaluate_policy(*dealt, joint->plan[static_cast<std::size_t>(l)].placement.ranks(),
                                                          b, to, first);
                           };
                         },
                         [route_s, name](double runs) {
                           std::fprintf(stderr,
                                        "%s: joint+reactive (replication::Reactive, greedy rule) computes the routes of a "
                                        "layer in %.3f ms (one core, not charged in the row)\n",
                                        name.c_str(), 1e3 * *route_s / runs);
                         }});
    // replication::BatchSplit (the per-batch split at the least max rank load, own rank and server
    // first) on the same copies, and on EPLB's: charged the same all-gather.
    auto split_row = [&](std::string row, std::vector<std::vector<std::vector<int>>> copies,
                         std::shared_ptr<std::vector<std::vector<int>>> primary, int slack) {
      auto pols = std::make_shared<std::vector<replication::BatchSplit>>();
      for (auto& c : copies) pols->emplace_back(std::move(c), sc.topo, slack);
      auto split_s = std::make_shared<double>(0.0);
      out.plans.push_back({row, out.joint_s, out.jreps, exchange_us,
                           [&model, to, pols, primary, split_s, G, E](int l, topology::Batch const& batch) -> LayerEval {
                             auto& policy = (*pols)[static_cast<std::size_t>(l)];
                             auto counts = replication::reactive::pair_counts(batch, G, E);
                             auto t = clock::now();
                             policy.plan_batch(counts);
                             *split_s += std::chrono::duration<double>(clock::now() - t).count();
                             auto dealt = std::make_shared<replication::reactive::PairRoutes>();
                             dealt->k = batch.top_k;
                             dealt->experts = &batch.experts;
                             dealt->gpu.resize(batch.experts.size());
                             std::vector<int> seen(static_cast<std::size_t>(G) * static_cast<std::size_t>(E), 0);
                             for (int tk = 0; tk < batch.tokens(); ++tk)
                               for (int j = 0; j < batch.top_k; ++j) {
                                 auto i = static_cast<std::size_t>(tk * batch.top_k + j);
                                 int src = batch.source[static_cast<std::size_t>(tk)], e = batch.experts[i];
                                 dealt->gpu[i] = policy.dealt(e, src, seen[static_cast<std::size_t>(src * E + e)]++);
                               }
                             return [&model, to, dealt, primary, l](topology::Batch const& b, long long first) {
                               return model.evaluate_policy(*dealt, (*primary)[static_cast<std::size_t>(l)], b, to, first);
                             };
                           },
                           [split_s, name, row](double runs) {
                             std::fprintf(stderr,
                                          "%s: %s (replication::BatchSplit) computes the split of a layer in %.3f ms "
                                          "(one core, not charged in the row)\n",
                                          name.c_str(), row.c_str(), 1e3 * *split_s / runs);
                           }});
    };
    std::vector<std::vector<std::vector<int>>> jc, ec;
    auto jprim = std::make_shared<std::vector<std::vector<int>>>(), eprim = std::make_shared<std::vector<std::vector<int>>>();
    for (int l = 0; l < L; ++l) {
      jc.push_back((*routed)[static_cast<std::size_t>(l)].table().replicas());
      jprim->push_back(joint->plan[static_cast<std::size_t>(l)].placement.ranks());
      auto lt = replication::eplb::layer_tables(er, l);
      ec.push_back(lt.replicas.replicas());
      eprim->push_back(lt.placement.ranks());
    }
    split_row("joint+split", jc, jprim, 0);
    // with Reactive's balance slack (eps = 5 %) for the tie-breaks: more pairs kept on their server
    split_row("joint+split-slack5%", jc, jprim, static_cast<int>(std::lround(jo.eps * 1000)));
    split_row("eplb+split", ec, eprim, 0);
  }
  return out;
}

}  // namespace moe::joint_scenarios
