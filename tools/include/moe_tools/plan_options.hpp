#pragma once
// The command line of moe_plan, parsed into PlanOptions without reading a file or planning: every
// number is parsed whole and range-checked (moe_tools/cli.hpp), every name (model, policy, engine
// format) is checked against the known ones, and a bad line ends in a moe::Error that names the
// option. moe_plan.cpp calls parse_plan_options() first; the plan_cli fuzz target calls it on
// arbitrary words. Defaults that depend on the cluster (ILP capacities, EPLB slots) stay empty
// here and are filled in by the program once the topology is known.

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/tsv.hpp"
#include "moe/models/models.hpp"
#include "moe/topology/presets.hpp"
#include "moe_tools/cli.hpp"
#if MOE_PLAN_WITH_INTEROP
#include "moe/interop/engine_plans.hpp"
#endif

namespace moe::plan_cli {

/// The largest int option.
inline constexpr long long kInt = std::numeric_limits<int>::max();

/// The largest accepted --seed; the sampler adds 1000 to it, which must not overflow.
constexpr long long kMaxSeed = std::numeric_limits<long long>::max() - 1000;

/// The sizes of a model the planner needs.
struct Shape {
  int layers, experts, top_k, hidden, ffn, groups, dense;
};

template <class M>
Shape shape_of() {
  return {M::spec.moe_layers, M::spec.experts, M::spec.top_k,       M::spec.hidden,
          M::spec.expert_ffn, M::spec.groups,  M::spec.dense_layers};
}

inline Shape model_shape(std::string const& name) {
  if (name == "deepseek-r1") return shape_of<models::DeepSeekR1>();
  if (name == "deepseek-v3") return shape_of<models::DeepSeekV3>();
  if (name == "deepseek-v2") return shape_of<models::DeepSeekV2>();
  if (name == "deepseek-moe-16b") return shape_of<models::DeepSeekMoE16B>();
  if (name == "mixtral-8x7b") return shape_of<models::Mixtral8x7B>();
  if (name == "qwen3-30b-a3b") return shape_of<models::Qwen3_30B_A3B>();
  if (name == "qwen3-235b-a22b") return shape_of<models::Qwen3_235B_A22B>();
  if (name == "olmoe-1b-7b") return shape_of<models::OLMoE_1B_7B>();
  if (name == "kimi-k2") return shape_of<models::KimiK2>();
  fail("unknown model '", name, "' (see --help)");
}

/// `s` cut at every `sep`, empty pieces dropped.
inline std::vector<std::string> split(std::string const& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

inline constexpr char const* kPolicies[] = {"rr", "greedy", "ilp", "ilpload", "eplb-pack", "eplb", "craft", "joint"};

struct PlanOptions {
  bool help = false;  ///< --help or -h came before any bad word: print the help and stop

  std::string model = "deepseek-r1";
  Shape shape{};  ///< of the model, --layers applied
  bool layers_given = false;

  std::string topology = "fattree";  ///< a kind or a file name
  std::string preset;                ///< --preset NAME[:SERVERS] (moe/topology/presets.hpp); empty: none
  int leaves = 16, servers_per_leaf = 4, gpus_per_server = 4;

  // Profile sources (at most one is given).
  std::optional<std::string> profile, olmoe, import_sglang, import_trtllm, import_vllm;
  std::string zipf_a = "0.3", zipf_b = "0.8";  ///< the texts, as the report quotes them
  double zipf_lo = 0.3, zipf_hi = 0.8;
  int batches = 200;
  double tokens = 4096;
  double concentration = 2000;
  std::uint64_t seed = 1;
  double train_fraction = 0.5;
  std::optional<std::string> write_profile;

  std::vector<std::string> policies;  ///< each one of kPolicies
  bool all_policies = true;           ///< --policies not given: skip those that cannot run here

  std::optional<int> c_layer, c_exp, eplb_replicas, eplb_groups, eplb_nodes;  ///< empty: cluster default
  int craft_r = 0;
  int joint_slots = 0;
  double joint_eps = 0.05;
  bool joint_server_cap = true;  ///< used when the profile has 2 or more training batches
  bool joint_coact = true;       ///< co-location, when the profile records each token's experts
  bool joint_regroup = true;     ///< with co-location: swaps inside servers (joint step 3c)
  double joint_z = 2.0, joint_server_eps = 0.02;
  /// Which of the three joint switches the command line set (a switch set "on" that the profile
  /// cannot honour is an error, not silently off).
  bool joint_server_cap_given = false, joint_coact_given = false, joint_regroup_given = false;

  std::string out_dir;  ///< empty: no plan files
  bool write_tsv = false;
#if MOE_PLAN_WITH_INTEROP
  std::vector<placement::engine::Format> formats;
#endif
  int slots_per_gpu = 0;
  std::optional<std::string> report;
};

/// Every option name moe_plan reads (without the leading "--").
inline constexpr std::string_view kOptionNames[] = {
    "model",          "layers",        "topology",      "leaves",           "servers-per-leaf", "gpus-per-server",
    "profile",        "olmoe",         "import-sglang", "import-trtllm",    "import-vllm",      "synthetic-zipf",
    "batches",        "tokens",        "concentration", "seed",             "train-fraction",   "write-profile",
    "policies",       "c-layer",       "c-exp",         "eplb-replicas",    "eplb-groups",      "eplb-nodes",
    "craft-r",        "joint-slots",   "joint-eps",     "joint-server-cap", "joint-z",          "joint-server-eps",
    "joint-coact",    "joint-regroup", "out-dir",       "format",           "slots-per-gpu",    "report",
    "preset"};

/// Parses moe_plan's words (argv without the program name) with the tools' shared parser
/// (moe_tools/cli.hpp). Options are `--name value` pairs; a later one replaces an earlier one of
/// the same name. An unknown name (a typo such as --polices), a missing or empty value, an empty
/// list item and a bad number are errors; the moe::Error names the option.
inline PlanOptions parse_plan_options(std::span<std::string const> words) {
  PlanOptions o;
  tools::Args const args(words, {{"model"},          {"layers"},        {"topology"},      {"leaves"},
                                 {"servers-per-leaf"}, {"gpus-per-server"}, {"profile"},     {"olmoe"},
                                 {"import-sglang"},  {"import-trtllm"}, {"import-vllm"},   {"synthetic-zipf"},
                                 {"batches"},        {"tokens"},        {"concentration"}, {"seed"},
                                 {"train-fraction"}, {"write-profile"}, {"policies"},      {"c-layer"},
                                 {"c-exp"},          {"eplb-replicas"}, {"eplb-groups"},   {"eplb-nodes"},
                                 {"craft-r"},        {"joint-slots"},   {"joint-eps"},     {"joint-server-cap"},
                                 {"joint-z"},        {"joint-server-eps"}, {"joint-coact"}, {"joint-regroup"},
                                 {"out-dir"},        {"format"},        {"slots-per-gpu"}, {"report"},
                                 {"preset"}});
  if (args.help()) {
    o.help = true;
    return o;
  }
  auto has = [&](std::string const& k) { return args.has(k); };
  // Ranges default to [1, INT_MAX].
  auto set_int = [&](int& to, std::string const& k, long long lo = 1, long long hi = kInt) {
    to = static_cast<int>(args.integer(k, to, lo, hi));
  };
  auto opt_int = [&](std::optional<int>& to, std::string const& k, long long lo = 1) {
    if (has(k)) to = static_cast<int>(args.integer(k, 0, lo, kInt));
  };
  auto set_double = [&](double& to, std::string const& k, double lo = 0,
                        double hi = std::numeric_limits<double>::max()) { to = args.number(k, to, lo, hi); };
  auto set_text = [&](std::optional<std::string>& to, std::string const& k) {
    if (has(k)) to = args.text(k);
  };

  o.model = args.text("model", o.model);
  o.shape = model_shape(o.model);
  o.layers_given = has("layers");
  set_int(o.shape.layers, "layers", 1, core::limits::layers);

  o.topology = args.text("topology", o.topology);
  set_int(o.leaves, "leaves");
  set_int(o.servers_per_leaf, "servers-per-leaf");
  set_int(o.gpus_per_server, "gpus-per-server");
  if (has("preset")) {
    // A preset fixes the whole cluster: its size goes after the name (NAME:SERVERS).
    for (char const* k : {"topology", "leaves", "servers-per-leaf", "gpus-per-server"})
      check(!has(k), "--preset sets the cluster; drop --", k, " (choose the size as --preset NAME:SERVERS)");
    o.preset = args.text("preset");
    try {
      (void)topology::parse_preset(o.preset);  // an unknown name or a bad size fails here
    } catch (Error const& e) { fail("--preset: ", e.what()); }
  }

  set_text(o.profile, "profile");
  set_text(o.olmoe, "olmoe");
  set_text(o.import_sglang, "import-sglang");
  set_text(o.import_trtllm, "import-trtllm");
  set_text(o.import_vllm, "import-vllm");
  int sources = static_cast<int>(o.profile.has_value() + o.olmoe.has_value() + o.import_sglang.has_value() +
                                 o.import_trtllm.has_value() + o.import_vllm.has_value());
  check(sources <= 1, "give at most one of --profile, --olmoe, --import-sglang, --import-trtllm, --import-vllm");
#if !MOE_PLAN_WITH_INTEROP
  check(!o.import_sglang && !o.import_trtllm && !o.import_vllm,
        "this moe_plan was built without engine interop (nlohmann-json, yaml-cpp, libzip)");
#endif
  if (has("synthetic-zipf")) {
    // Options of a source that is not used would be silently ignored: refuse them.
    check(sources == 0, "--synthetic-zipf: the profile comes from another source (",
          o.profile ? "--profile" : o.olmoe ? "--olmoe" : "an --import option", ")");
    auto ab = split(args.text("synthetic-zipf"), ',');
    check(ab.size() == 2, "--synthetic-zipf needs A,B");
    o.zipf_a = ab[0];
    o.zipf_b = ab[1];
    o.zipf_lo = tools::parse_double(ab[0], "--synthetic-zipf A", 0, 100);
    o.zipf_hi = tools::parse_double(ab[1], "--synthetic-zipf B", 0, 100);
    check(o.zipf_lo <= o.zipf_hi, "--synthetic-zipf: A (", ab[0], ") is above B (", ab[1], ")");
  }
  set_int(o.batches, "batches", 1, core::limits::batches);
  set_double(o.tokens, "tokens", 1);
  set_double(o.concentration, "concentration", 1e-9);
  // The sampling options shape synthetic batches only; a file or an engine dump has its own.
  bool const sampled = !o.profile && !o.import_sglang && !o.import_trtllm && !o.import_vllm;
  for (char const* k : {"batches", "tokens", "concentration", "seed"})
    check(sampled || !has(k), "--", k, ": only synthetic batches (--synthetic-zipf, --olmoe) are sampled; ",
          "the profile given has its own batches");
  if (has("seed")) o.seed = static_cast<std::uint64_t>(args.integer("seed", 0, 0, kMaxSeed));
  set_double(o.train_fraction, "train-fraction", 0, 1);
  check(o.train_fraction > 0, "--train-fraction: 0 leaves no batch to plan from (give a value in (0, 1])");
  set_text(o.write_profile, "write-profile");

  o.all_policies = !has("policies");
  o.policies = args.list("policies", "rr,greedy,ilp,ilpload,eplb-pack,eplb,craft,joint");
  for (auto const& p : o.policies) {
    bool known = false;
    for (char const* name : kPolicies) known = known || p == name;
    check(known, "unknown policy '", p, "' (see --help)");
  }
  opt_int(o.c_layer, "c-layer");
  opt_int(o.c_exp, "c-exp");
  opt_int(o.eplb_replicas, "eplb-replicas", 0);
  opt_int(o.eplb_groups, "eplb-groups");
  opt_int(o.eplb_nodes, "eplb-nodes");
  set_int(o.craft_r, "craft-r", 0);
  set_int(o.joint_slots, "joint-slots", 0, o.shape.experts);
  set_double(o.joint_eps, "joint-eps", 0, 100);
  auto on_off = [&](std::string const& k, bool& out) {
    if (!has(k)) return;
    std::string const v = args.text(k);
    check(v == "on" || v == "off", "--", k, " takes on or off, got '", v, "'");
    out = v == "on";
  };
  on_off("joint-coact", o.joint_coact);
  on_off("joint-regroup", o.joint_regroup);
  on_off("joint-server-cap", o.joint_server_cap);
  o.joint_server_cap_given = has("joint-server-cap");
  o.joint_coact_given = has("joint-coact");
  o.joint_regroup_given = has("joint-regroup");
  set_double(o.joint_z, "joint-z", 0, 100);
  set_double(o.joint_server_eps, "joint-server-eps", 0, 100);
  // A policy's options without the policy would do nothing: refuse them, naming the option.
  auto wants = [&](std::initializer_list<char const*> ps) {
    for (auto const& p : o.policies)
      for (char const* q : ps)
        if (p == q) return true;
    return false;
  };
  struct Needs {
    char const* option;
    std::initializer_list<char const*> policies;
    char const* names;
  };
  for (Needs const& n : {Needs{"c-layer", {"rr", "greedy", "ilp", "ilpload"}, "rr, greedy, ilp or ilpload"},
                         Needs{"c-exp", {"rr", "greedy", "ilp", "ilpload"}, "rr, greedy, ilp or ilpload"},
                         Needs{"eplb-replicas", {"eplb"}, "eplb"},
                         Needs{"eplb-groups", {"eplb", "eplb-pack"}, "eplb or eplb-pack"},
                         Needs{"eplb-nodes", {"eplb", "eplb-pack"}, "eplb or eplb-pack"},
                         Needs{"craft-r", {"craft"}, "craft"},
                         Needs{"joint-slots", {"joint"}, "joint"},
                         Needs{"joint-eps", {"joint"}, "joint"},
                         Needs{"joint-server-cap", {"joint"}, "joint"},
                         Needs{"joint-z", {"joint"}, "joint"},
                         Needs{"joint-server-eps", {"joint"}, "joint"},
                         Needs{"joint-coact", {"joint"}, "joint"},
                         Needs{"joint-regroup", {"joint"}, "joint"}})
    check(!has(n.option) || wants(n.policies), "--", n.option, " applies to the policy ", n.names,
          ", which --policies does not include");

  if (has("out-dir")) o.out_dir = args.text("out-dir");
  bool engine_format = false;
  for (auto const& f : args.list("format", "tsv")) {
    engine_format = engine_format || f != "tsv";
    if (f == "tsv") {
      o.write_tsv = true;
      continue;
    }
#if MOE_PLAN_WITH_INTEROP
    o.formats.push_back(placement::engine::parse_format(f));
#else
    fail("--format ", f, ": this moe_plan was built without engine interop (nlohmann-json, yaml-cpp, libzip)");
#endif
  }
  set_int(o.slots_per_gpu, "slots-per-gpu", 0, o.shape.experts);
  check(!has("format") || has("out-dir"), "--format needs --out-dir");
  check(!has("slots-per-gpu") || (has("out-dir") && engine_format),
        "--slots-per-gpu applies to the engine formats: give --out-dir and --format with sglang, trtllm, vllm or "
        "vllm-ascend");
  set_text(o.report, "report");
  return o;
}

}  // namespace moe::plan_cli
