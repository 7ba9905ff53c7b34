// moe_plan: the offline planner. Model shape + load profile + topology + policies in; one plan
// file per policy (docs/plan-format.md) and a side-by-side metrics report out.
//
//   moe_plan --model deepseek-r1 --topology fattree --synthetic-zipf 0.3,0.8 --batches 200
//            --policies rr,greedy,ilp,ilpload,eplb,craft --c-layer 8 --c-exp 64 --out-dir plans
//
// Run with --help for every option. The profile's first --train-fraction of batches builds the
// load-aware plans (ILPLoad, EPLB, CRAFT); the metrics are measured on the remaining batches.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "moe/models/models.hpp"
#include "moe/placement/eplb_packing.hpp"
#include "moe/placement/heuristics.hpp"
#include "moe/placement/ilp.hpp"
#include "moe/placement/joint.hpp"
#include "moe/placement/metrics.hpp"
#include "moe/plan/plan_io.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/profile/route_profile.hpp"
#include "moe/replication/craft.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/topology/topology.hpp"
#if MOE_PLAN_WITH_INTEROP
#include "moe/interop/engine_plans.hpp"
#include "moe/interop/engine_stats.hpp"
#endif
#include "moe_tools/cli.hpp"
#include "moe_tools/plan_options.hpp"

using namespace moe;

namespace {

char const* kHelp = R"(moe_plan - offline expert placement and replication planner

Model:     --model NAME        deepseek-r1 (default), deepseek-v3, deepseek-v2, deepseek-moe-16b,
                               mixtral-8x7b, qwen3-30b-a3b, qwen3-235b-a22b, olmoe-1b-7b, kimi-k2
           --layers N          override the number of MoE layers (e.g. to match a profile)
Profile:   --profile FILE      a load profile (docs/plan-format.md)
           --synthetic-zipf A,B  seeded Zipf-like marginals, exponent per layer in [A, B] (default 0.3,0.8)
           --olmoe DIR         real marginals from DIR/expert_counts.tsv (e.g. .../olmoe-1b-7b/arxiv)
           --import-sglang FILE  an SGLang expert distribution recorder dump (stat mode, .pt): one batch per pass
           --import-trtllm DIR   a TensorRT-LLM expert statistic dump (meta_info.json + rank<r>.safetensors):
                               one batch per iteration
           --import-vllm FILE  vLLM routed experts (JSON [tokens][moe layers][top_k]): one batch per request
           --batches N --tokens T --concentration C --seed S   per-batch sampling (synthetic batches)
           --train-fraction F  share of the batches used for planning, in (0, 1] (default 0.5); the rest are
                               the report's held-out batches (with 1, or one batch, the report is in-sample)
           --write-profile FILE  save the profile used
Topology:  --topology KIND|FILE  fattree (default), dragonfly, fattree-sparse, dragonfly-sparse, or a file
           --leaves N --servers-per-leaf N --gpus-per-server N   (default 16, 4, 4: the ILP paper's cluster)
           --preset NAME[:SERVERS]  a hardware preset instead (docs/planners.md): h800, dgx-h100, dgx-h200,
                               gb200-nvl72; SERVERS overrides its default number of nodes (racks for NVL72)
Policies:  --policies LIST     comma list of rr, greedy, ilp, ilpload, eplb-pack, eplb, craft, joint (default all)
           --c-layer N --c-exp N   capacities of rr, greedy, ilp, ilpload: experts per GPU in one layer
                               (default ceil(E/G)) and in all layers (default max(ceil(L*E/G) + 6, L*c_layer))
           --eplb-replicas N   EPLB redundant slots per layer (default: GPUs, rounded up so E + N splits over them)
           --eplb-groups N --eplb-nodes N   EPLB hierarchy (default: model groups, servers)
           --craft-r R         CRAFT replicas per GPU (default 0 = automatic)
           --joint-slots S     joint: expert slots per GPU (default ceil((E + G) / G), EPLB's default memory)
           --joint-eps X       joint: per-GPU load bound (1 + X) x mean (default 0.05)
           --joint-server-cap on|off   joint: cap each server's load + z sd, sd from the training
                               batches (default on when there are 2 or more training batches)
           --joint-z X --joint-server-eps X   joint: the server cap's z (default 2) and bound (default 0.02)
           --joint-coact on|off   joint: co-locate experts that tokens choose together, counted from the
                               training requests' tokens (default on; needs a profile that records each
                               token's experts: --import-vllm)
           --joint-regroup on|off   joint, with co-location: swap copies between the GPUs of a server
                               where that groups more co-chosen experts (default on)
Exit status: 0 done; 2 a bad option or input file (the message names it); 3 any other failure
           (docs/planners.md, "Exit statuses").
Output:    --out-dir DIR       write DIR/plan_<policy>.tsv for each policy
           --format LIST       comma list of tsv (default), sglang, trtllm, vllm, vllm-ascend: the plan files
                               written per policy (docs/engines.md; vllm and vllm-ascend are experimental)
           --slots-per-gpu S   engine formats: expert slots per GPU (default: the fewest that hold the plan;
                               EPLB keeps its own layout); the report notes P = GPUs x S and R = P - E
           --report FILE       also write the report there (TSV)
)";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Row {
  std::string policy;
  placement::MeanStd hops;
  double balancedness = 0;
  long long replicas = 0;
  double replica_gib = 0;
  double seconds = 0;
  std::string note;
};

int run(int argc, char** argv) {
  std::vector<std::string> words(argv + 1, argv + argc);
  plan_cli::PlanOptions const o = plan_cli::parse_plan_options(words);
  if (o.help) {
    std::cout << kHelp;
    return 0;
  }
  plan_cli::Shape s = o.shape;

  // Topology.
  std::string const& tk = o.topology;
  int leaves = o.leaves, spl = o.servers_per_leaf, gps = o.gpus_per_server;
  topology::Topology topo = !o.preset.empty()          ? topology::preset_topology(o.preset)
                            : tk == "fattree"          ? topology::fat_tree(leaves, spl, gps)
                            : tk == "dragonfly"        ? topology::dragonfly(leaves, spl, gps)
                            : tk == "fattree-sparse"   ? topology::fat_tree_sparse(leaves, spl, gps)
                            : tk == "dragonfly-sparse" ? topology::dragonfly_sparse(leaves, spl, gps)
                                                       : topology::read_topology(tk);
  int G = topo.gpus();

  // Profile.
  profile::LoadProfile prof;
  std::string source;
  std::vector<int> decoder_layers;  // of an imported dump: the decoder layer of each MoE layer
  profile::RouteProfile token_routes;  // each token's experts, when the source records them (vLLM)
  std::vector<long long> request_end;  // of token_routes: one past each request's last token id
  if (o.profile) {
    prof = profile::read_profile(*o.profile);
    source = "file " + *o.profile;
  } else if (o.import_sglang || o.import_trtllm || o.import_vllm) {
#if MOE_PLAN_WITH_INTEROP
    if (o.import_sglang) {
      auto imp = profile::engine::import_sglang_stat(*o.import_sglang, s.experts);
      prof = std::move(imp.loads);
      decoder_layers = std::move(imp.decoder_layers);
      source = "SGLang recorder dump " + *o.import_sglang + " (" + std::to_string(prof.batches()) + " passes)";
    } else if (o.import_trtllm) {
      auto imp = profile::engine::import_trtllm_stat(*o.import_trtllm, s.experts);
      check(imp.top_k == s.top_k, *o.import_trtllm, ": num_experts_per_token = ", imp.top_k, ", the model has top-",
            s.top_k);
      prof = std::move(imp.loads);
      decoder_layers = std::move(imp.decoder_layers);
      source = "TensorRT-LLM expert statistics " + *o.import_trtllm + " (" + std::to_string(prof.batches()) +
               " iterations)";
    } else {
      auto imp = profile::engine::import_vllm_routed_experts(*o.import_vllm, s.experts);
      check(imp.routes.top_k() == s.top_k, *o.import_vllm, ": each token's routes list ", imp.routes.top_k(),
            " experts, but ", o.model, " routes every token to top-", s.top_k, " (use the matching --model)");
      prof = std::move(imp.loads);
      token_routes = std::move(imp.routes);
      request_end = std::move(imp.request_end);
      source = "vLLM routed experts " + *o.import_vllm + " (" + std::to_string(imp.tokens) + " tokens, " +
               std::to_string(prof.batches()) + " requests)";
    }
    if (!decoder_layers.empty() && !o.layers_given) {
      bool contiguous = true;
      for (std::size_t l = 0; l < decoder_layers.size(); ++l)
        contiguous = contiguous && decoder_layers[l] == s.dense + static_cast<int>(l);
      check(contiguous && static_cast<int>(decoder_layers.size()) == s.layers, "the dump records decoder layers ",
            decoder_layers.front(), "..", decoder_layers.back(), " (", decoder_layers.size(), " layers), but ",
            o.model, " has MoE layers ", s.dense, "..", s.dense + s.layers - 1,
            " (use the matching --model, or --layers)");
    }
#endif
  } else {
    profile::Marginals m;
    if (o.olmoe) {
      m = profile::marginals_from_olmoe(*o.olmoe + "/expert_counts.tsv");
      source = "real OLMoE marginals (" + *o.olmoe + "), synthetic seeded batches";
    } else {
      m = profile::zipf_marginals(s.layers, s.experts, o.zipf_lo, o.zipf_hi, o.seed);
      source = "synthetic Zipf-like marginals s in [" + o.zipf_a + ", " + o.zipf_b + "], seeded batches";
    }
    profile::SampleOptions so;
    so.batches = o.batches;
    so.tokens_per_batch = o.tokens;
    so.top_k = s.top_k;
    so.concentration = o.concentration;
    so.seed = o.seed + 1000;
    prof = profile::sample_profile(m, so);
  }
  check(prof.layers() == s.layers && prof.experts() == s.experts, "profile has ", prof.layers(), " layers x ",
        prof.experts(), " experts but the model has ", s.layers, " x ", s.experts, " (use --layers or another --model)");
  if (o.write_profile) profile::write_profile(*o.write_profile, prof);
  // Planning batches: the first --train-fraction of them; the report measures the rest. With one
  // batch, or --train-fraction 1, there is nothing held out: the report says so and is in-sample.
  double tf = o.train_fraction;
  bool const in_sample = prof.batches() == 1 || tf >= 1.0;
  int train_b = in_sample ? prof.batches() : static_cast<int>(prof.batches() * tf);
  check(train_b >= 1, "--train-fraction ", tf, " leaves none of the profile's ", prof.batches(),
        " batches to plan from");
  if (!in_sample) train_b = std::min(train_b, prof.batches() - 1);
  auto train = prof.slice(0, train_b);
  auto test = in_sample ? prof : prof.slice(train_b, prof.batches());
  auto train_totals = train.totals();
  // A profile without load plans nothing: every placement would look perfectly balanced.
  auto all_zero = [](profile::LoadProfile const& p) {
    for (double v : p.totals())
      if (v != 0) return false;
    return true;
  };
  check(!all_zero(prof), "the profile (", source, ") is all zeros: no expert received a token in any of its ",
        prof.batches(), " batches, so there is nothing to plan from or to measure");
  check(!all_zero(train), "the profile (", source, ") has no load in its ", train.batches(),
        " planning batches: every count is zero, so there is nothing to plan from");
  check(in_sample || !all_zero(test), "the profile (", source, ") has no load in its ", test.batches(),
        " held-out batches: every count is zero, so the report could measure nothing (use --train-fraction 1)");
  if (in_sample)
    tools::warn("moe_plan", prof.batches() == 1 ? "the profile has 1 batch" : "--train-fraction 1",
                ": the report measures the plans on the batches they were planned from (in-sample); give a "
                "profile of 2 or more batches and --train-fraction below 1 for a held-out measure");

  // The default per-layer capacity is the least that can hold every expert: ceil(E / G).
  int c_layer = o.c_layer ? *o.c_layer : static_cast<int>(std::max<long long>(1, (s.experts + G - 1) / G));
  // The default total capacity leaves the greedy order room too: when E does not split evenly,
  // c_layer on every layer (L * c_layer) is allowed, so no default stops a policy.
  int c_exp = o.c_exp ? *o.c_exp
                      : static_cast<int>(std::max((static_cast<long long>(s.layers) * s.experts + G - 1) / G + 6,
                                                  static_cast<long long>(s.layers) * c_layer));
  auto problem = placement::make_problem(topo, s.layers, s.experts, c_layer, c_exp);
  double eb = placement::expert_bytes(s.hidden, s.ffn);
  std::string const& out_dir = o.out_dir;
  if (!out_dir.empty()) std::filesystem::create_directories(out_dir);
  bool const write_tsv = o.write_tsv;
#if MOE_PLAN_WITH_INTEROP
  std::vector<placement::engine::Format> const& formats = o.formats;
  placement::engine::LayerLayout layout{s.dense + s.layers, s.dense};
#endif
  int slots_per_gpu = o.slots_per_gpu;

  std::vector<Row> rows;
  // `own_slots`: a slot layout the policy made itself (EPLB), used when it has the requested size.
  auto record = [&](std::string name, placement::Assignment const& primary,
                    std::vector<replication::Table> const& tables, placement::Shares const& shares, double secs,
                    std::string note, placement::SlotMap const* own_slots = nullptr) {
    Row r;
    r.policy = std::move(name);
    r.hops = placement::mean_std(placement::hops_per_batch(problem, primary, test, s.top_k));
    r.balancedness = placement::balancedness(shares, test);
    auto st = placement::replica_stats(tables, G, eb);
    r.replicas = st.replicas;
    r.replica_gib = st.replica_bytes / (1024.0 * 1024.0 * 1024.0);
    r.seconds = secs;
    r.note = std::move(note);
    if (!out_dir.empty()) {
      std::vector<placement::LayerPlan> plan;
      for (int l = 0; l < s.layers; ++l) plan.push_back({primary.table(l), tables[static_cast<std::size_t>(l)]});
      if (write_tsv) placement::write_plan(out_dir + "/plan_" + r.policy + ".tsv", plan, G);
#if MOE_PLAN_WITH_INTEROP
      if (!formats.empty()) {
        int S = slots_per_gpu > 0 ? slots_per_gpu
                : own_slots       ? own_slots->slots_per_rank()
                                  : placement::min_slots_per_gpu(plan, G);
        auto slots = own_slots && own_slots->slots_per_rank() == S
                         ? *own_slots
                         : placement::slot_map_from_plan(plan, G, S, train_totals);
        for (auto f : formats)
          placement::engine::write(f, out_dir + "/plan_" + r.policy + placement::engine::file_suffix(f), slots, layout);
        r.note += (r.note.empty() ? "" : ", ") + std::string("engine slots: S = ") + std::to_string(S) +
                  " per GPU, P = " + std::to_string(slots.physical()) + ", R = " + std::to_string(slots.redundant());
      }
#else
      (void)own_slots;
#endif
    }
    rows.push_back(std::move(r));
  };
  auto single = [&](std::string name, placement::Assignment const& a, double secs, std::string note) {
    std::vector<replication::Table> t;
    for (int l = 0; l < s.layers; ++l) {
      std::vector<std::vector<int>> c;
      for (int e = 0; e < s.experts; ++e) c.push_back({a.at(l, e)});
      t.emplace_back(std::move(c));
    }
    record(std::move(name), a, t, placement::Shares::from_assignment(a, G), secs, std::move(note));
  };
  auto from_tables = [&](std::vector<placement::Table> const& prim) {
    placement::Assignment a{s.layers, s.experts, {}};
    for (auto const& t : prim) a.gpu.insert(a.gpu.end(), t.ranks().begin(), t.ranks().end());
    return a;
  };

  // Without --policies every policy runs that can on this cluster; the others are named and skipped.
  bool all_policies = o.all_policies;
  for (auto const& pol : o.policies) {
    if (all_policies && pol == "eplb-pack" && s.experts % G != 0) {
      std::cerr << "moe_plan: eplb-pack skipped: " << s.experts << " experts do not split over " << G << " GPUs\n";
      continue;
    }
    if (all_policies && pol == "craft" && G < 2) {
      std::cerr << "moe_plan: craft skipped: replication needs at least 2 GPUs\n";
      continue;
    }
    auto t0 = std::chrono::steady_clock::now();
    if (pol == "rr") {
      auto a = placement::round_robin(problem);
      single(pol, a, seconds_since(t0), "");
    } else if (pol == "greedy") {
      auto a = placement::greedy(problem);
      single(pol, a, seconds_since(t0), "");
    } else if (pol == "ilp") {
      auto r = placement::ilp(problem);
      single(pol, r.assignment, seconds_since(t0), "exact, objective " + std::to_string(r.objective));
    } else if (pol == "ilpload") {
      auto r = placement::ilp_load(problem, train_totals);
      single(pol, r.assignment, seconds_since(t0), "exact, objective " + std::to_string(r.objective));
    } else if (pol == "eplb-pack" || pol == "eplb") {
      int groups = o.eplb_groups ? *o.eplb_groups : s.groups;
      // Defaults EPLB can always use: one node per server when the GPUs split evenly over the
      // servers, and at least G redundant slots, rounded up so that E + slots splits over G.
      int nodes = o.eplb_nodes ? *o.eplb_nodes : G % topo.servers() == 0 ? topo.servers() : 1;
      int extra = pol != "eplb"        ? 0
                  : o.eplb_replicas ? *o.eplb_replicas
                                    : G + (G - (s.experts + G) % G) % G;
      auto r = replication::eplb::rebalance_experts(train_totals, s.layers, s.experts, s.experts + extra, groups, nodes, G);
      std::vector<placement::Table> prim;
      std::vector<replication::Table> tabs;
      for (int l = 0; l < s.layers; ++l) {
        auto lt = replication::eplb::layer_tables(r, l);
        prim.push_back(lt.placement);
        tabs.push_back(lt.replicas);
      }
      double secs = seconds_since(t0);
      long long physical = 0;  // EPLB may put two copies of an expert on one GPU: count slots
      for (int c : r.logcnt.v) physical += c - 1;
      auto own = replication::eplb::slot_map(r);
      record(pol, from_tables(prim), tabs, placement::Shares::from_eplb(r), secs,
             std::to_string(s.experts + extra) + " slots/layer", &own);
      rows.back().note += ", " + std::to_string(physical - rows.back().replicas) + " copies share a GPU with another copy";
      rows.back().replicas = physical;
      rows.back().replica_gib = static_cast<double>(physical) * eb / (1024.0 * 1024.0 * 1024.0);
    } else if (pol == "craft") {
      replication::craft::Options co;
      co.replication_factor = o.craft_r;
      auto p = replication::craft::plan(train, G, co);
      double secs = seconds_since(t0);
      long long placed = 0;
      for (int x : p.replicas) placed += x;
      long long asked = static_cast<long long>(p.replication_factor) * G;
      // CRAFT places the best selection whose total does not pass R x G; a total below it is not
      // the plan asked for when R was given.
      check(o.craft_r == 0 || placed == asked, "--craft-r ", o.craft_r, ": asks for ", asked, " replicas (",
            o.craft_r, " x ", G, " GPUs), but the best CRAFT selection for ", s.layers, " layers places only ",
            placed, " (", static_cast<double>(placed) / G, " per GPU); give a smaller --craft-r or 0 (automatic)");
      record(pol, from_tables(p.placement), p.tables, placement::Shares::from_tables(p.tables, G), secs,
             "R = " + std::to_string(p.replication_factor) + " replicas/GPU" +
                 (placed == asked ? std::string() : " (" + std::to_string(placed) + " placed)"));
    } else if (pol == "joint") {
      placement::joint::Options jo;
      jo.slots_per_gpu = o.joint_slots;
      jo.eps = o.joint_eps;
      // A switch set on that this profile cannot honour is an error, not quietly off.
      check(!(o.joint_server_cap_given && o.joint_server_cap) || train.batches() >= 2,
            "--joint-server-cap on: the server cap needs the load spread of 2 or more planning batches, the profile "
            "gives ", train.batches());
      check(!(o.joint_coact_given && o.joint_coact) || !token_routes.empty(),
            "--joint-coact on: co-location needs each token's experts, which only --import-vllm records");
      check(!o.joint_regroup_given || (o.joint_coact && !token_routes.empty()),
            "--joint-regroup: regrouping works on co-location, which is off here (it needs --import-vllm and "
            "--joint-coact on)");
      if (o.joint_server_cap && train.batches() >= 2) jo.load_sd = placement::joint::load_spread(train);
      jo.z = o.joint_z;
      jo.server_eps = o.joint_server_eps;
      jo.regroup = o.joint_regroup;
      long long coact_tokens = 0;
      if (o.joint_coact && !token_routes.empty()) {
        // Co-selections of the training requests' tokens (ids below the first test request's).
        coact_tokens = request_end[static_cast<std::size_t>(train_b) - 1];
        auto cells = static_cast<std::size_t>(s.experts) * static_cast<std::size_t>(s.experts);
        jo.coact.assign(static_cast<std::size_t>(s.layers) * cells, 0.0);
        std::vector<int> chosen;
        for (int l = 0; l < s.layers; ++l) {
          auto const& lc = token_routes.layer(l);
          chosen.clear();
          for (std::size_t r = 0; r < lc.rows() && lc.tokens[r] < coact_tokens; ++r)
            for (auto i = lc.offsets[r]; i < lc.offsets[r + 1]; ++i) chosen.push_back(lc.expert[static_cast<std::size_t>(i)]);
          placement::joint::add_coactivation(chosen, token_routes.top_k(), s.experts,
                                             std::span(jo.coact).subspan(static_cast<std::size_t>(l) * cells, cells));
        }
      }
      auto j = placement::joint::plan(topo, train_totals, s.layers, s.experts, jo);
      double secs = seconds_since(t0);
      std::vector<placement::Table> prim;
      std::vector<replication::Table> tabs;
      double hops = 0, bound = 0, worst = 0;
      auto co = j.co_location_totals();
      for (int l = 0; l < s.layers; ++l) {
        prim.push_back(j.plan[static_cast<std::size_t>(l)].placement);
        tabs.push_back(j.plan[static_cast<std::size_t>(l)].replicas);
        auto const& st = j.stats[static_cast<std::size_t>(l)];
        hops += st.mean_hops / s.layers, bound += st.hops_bound / s.layers;
        worst = std::max(worst, st.max_load_ratio);
      }
      char note[400];
      std::snprintf(note, sizeof note,
                    "S = %d slots/GPU, routed: %.3f hops to a copy (bound %.3f), planned max load %.3f x mean%s",
                    j.slots_per_gpu, hops, bound, worst,
                    coact_tokens > 0 ? (", co-location in " + std::to_string(co.layers) + " of " + std::to_string(s.layers) +
                                        " layers (from " + std::to_string(coact_tokens) +
                                        " training tokens; the others broke the GPU cap), " + std::to_string(co.swaps) +
                                        " regrouping swaps inside servers")
                                           .c_str()
                                     : "");
      record(pol, from_tables(prim), tabs, placement::Shares::from_tables(tabs, G), secs, note);
    } else {
      fail("unknown policy '", pol, "' (see --help)");
    }
  }

  std::ostringstream rep;
  rep << "# moe_plan report: " << o.model << " (" << s.layers << " MoE layers x " << s.experts
      << " experts, top-" << s.top_k << "), " << G << " GPUs on " << (o.preset.empty() ? tk : "preset " + o.preset) << ", c_layer " << c_layer << ", c_exp "
      << c_exp << "\n# profile: " << source << "; planned on " << train.batches() << " batches, measured on "
      << (in_sample ? "the same batches (in-sample)" : std::to_string(test.batches())) << "\n";
  rep << "policy\thops_mean\thops_std\tgain_vs_first\tbalancedness\treplicas\treplica_GiB\tseconds\tnote\n";
  char buf[512];
  for (auto const& r : rows) {
    double gain = rows.front().hops.mean > 0 ? 100.0 * (rows.front().hops.mean - r.hops.mean) / rows.front().hops.mean : 0;
    std::snprintf(buf, sizeof buf, "%s\t%.2f\t%.2f\t%+.1f%%\t%.4f\t%lld\t%.2f\t%.4f\t%s\n", r.policy.c_str(), r.hops.mean,
                  r.hops.std, gain, r.balancedness, r.replicas, r.replica_gib, r.seconds, r.note.c_str());
    rep << buf;
  }
  std::cout << rep.str();
  if (o.report) {
    std::ofstream f(*o.report);
    check(f.is_open(), "cannot open '", *o.report, "' for writing");
    f << rep.str();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return moe::tools::guarded_main("moe_plan", [&] { return run(argc, argv); });
}
