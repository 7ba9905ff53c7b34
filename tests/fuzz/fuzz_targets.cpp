// libFuzzer targets for every file reader, the planner programs' option-number parser and moe_plan's
// whole command line, in one program: the environment variable MOE_FUZZ_TARGET names the target a
// run fuzzes (scripts/fuzz.sh sets it). One build serves every target: the readers' headers are
// parsed and compiled once, not once per target (13 builds took most of the fuzz stage's time).
// Built with -fsanitize=fuzzer,address,undefined. A reader may reject its input only with moe::Error;
// any other exception (std::bad_alloc, std::length_error, ...), a sanitizer report, a leak, an input
// slower than the time limit or memory above the RSS limit is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include "moe/config.hpp"
#include "moe_tools/cli.hpp"
#include "moe/core/tsv.hpp"
#include "moe/interop/engine_plans.hpp"
#include "moe/plan/plan_io.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/profile/route_profile.hpp"
#include "moe/interop/torch_file.hpp"
#include "moe/schedule/perf_model.hpp"
#include "moe/speculative/table_io.hpp"
#include "moe/topology/topology.hpp"
#include "moe/topology/traffic.hpp"
// moe_plan's option parser, with the engine formats (this build links yaml-cpp and libzip).
#define MOE_PLAN_WITH_INTEROP 1
#include "moe_tools/plan_options.hpp"

namespace {

constexpr std::string_view kTargets[] = {"load_profile", "olmoe_counts", "topology",   "plan",       "route_counts",
                                         "token_table",  "sequence_table", "perf_models", "cli_numbers", "engine_plan",
                                         "torch_pickle", "safetensors",  "plan_cli"};
std::string_view target;  // MOE_FUZZ_TARGET, checked against kTargets once (LLVMFuzzerInitialize)
#define MOE_FUZZ_IS(name) (target == #name)

void run(std::string const& text) {
  std::istringstream in(text);
  moe::core::TsvReader tsv(in, "fuzz.tsv");
  if (MOE_FUZZ_IS(load_profile)) {
    auto p = moe::profile::read_profile(tsv);
    (void)p.totals();
  } else if (MOE_FUZZ_IS(olmoe_counts)) {
    (void)moe::profile::marginals_from_olmoe(tsv);
  } else if (MOE_FUZZ_IS(topology)) {
    auto t = moe::topology::read_topology(tsv);
    (void)t.gpu_hops();
    (void)moe::topology::TrafficModel(t).share_entries();
  } else if (MOE_FUZZ_IS(plan)) {
    (void)moe::placement::read_plan(tsv);
  } else if (MOE_FUZZ_IS(route_counts)) {
    // The first line of a token -> expert file, a cross-layer file, or both (the same text).
    moe::profile::RouteRecorder rec(64, 8);
    (void)moe::profile::load_token_expert_counts(tsv, rec);
    std::istringstream again(text);
    moe::core::TsvReader tsv2(again, "fuzz-cross.tsv");
    try {
      (void)moe::profile::load_crosslayer_counts(tsv2, rec);
    } catch (moe::Error const&) {
    }
    auto p = rec.profile();
    for (int l : p.layers()) (void)p.layer(l).expert_load();
  } else if (MOE_FUZZ_IS(token_table)) {
    (void)moe::speculative::read_token_table(tsv);
  } else if (MOE_FUZZ_IS(sequence_table)) {
    (void)moe::speculative::read_sequence_table(tsv);
  } else if (MOE_FUZZ_IS(perf_models)) {
    std::istringstream raw(text);
    (void)moe::schedule::read_models(raw, "fuzz.tsv");
  } else if (MOE_FUZZ_IS(engine_plan)) {
    // First byte: the format (SGLang, TensorRT-LLM, vLLM, vllm-ascend); the rest: the file, read for a
    // model of 4 experts in 3 hidden layers (the first dense) on 2 EP ranks.
    if (text.empty()) return;
    constexpr moe::placement::engine::Format formats[] = {
        moe::placement::engine::Format::sglang, moe::placement::engine::Format::trtllm,
        moe::placement::engine::Format::vllm, moe::placement::engine::Format::vllm_ascend};
    std::istringstream body(text.substr(1));
    auto m = moe::placement::engine::read(formats[static_cast<unsigned char>(text[0]) % 4], body, "fuzz", {3, 1}, 2, 4);
    auto plan = moe::placement::plan_from_slot_map(m);
    if (static_cast<int>(plan.size()) != 2) __builtin_trap();
  } else if (MOE_FUZZ_IS(torch_pickle)) {
    std::vector<unsigned char> bytes(text.begin(), text.end());
    (void)moe::profile::torch_file::detail::Unpickler(bytes, "fuzz.pkl").run();
  } else if (MOE_FUZZ_IS(safetensors)) {
    std::istringstream raw(text);
    for (auto const& [name, t] : moe::profile::torch_file::read_safetensors(raw, "fuzz.safetensors"))
      if (static_cast<std::int64_t>(t.values.size()) != t.numel()) __builtin_trap();
  } else if (MOE_FUZZ_IS(cli_numbers)) {
    // The option values of the planner programs: each line is "int|double lo hi text".
    std::istringstream lines(text);
    std::string kind, lo, hi, value;
    while (lines >> kind >> lo >> hi) {
      std::getline(lines, value);
      if (!value.empty() && value.front() == ' ') value.erase(0, 1);
      try {
        if (kind == "int") {
          long long a = moe::tools::parse_int(lo, "--lo"), b = moe::tools::parse_int(hi, "--hi");
          long long v = moe::tools::parse_int(value, "--value", a, b);
          if (v < a || v > b) __builtin_trap();
        } else {
          double a = moe::tools::parse_double(lo, "--lo"), b = moe::tools::parse_double(hi, "--hi");
          double v = moe::tools::parse_double(value, "--value", a, b);
          if (!(v >= a && v <= b)) __builtin_trap();
        }
      } catch (moe::Error const&) {
      }
    }
  } else if (MOE_FUZZ_IS(plan_cli)) {
    // moe_plan's argv: the input cut at every space and newline (empty words kept, so an empty
    // value is reachable). What the parser accepts must be inside the documented ranges.
    std::vector<std::string> words;
    std::string word;
    for (char c : text) {
      if (c == ' ' || c == '\n') {
        words.push_back(word);
        word.clear();
      } else {
        word += c;
      }
    }
    if (!word.empty()) words.push_back(word);
    auto o = moe::plan_cli::parse_plan_options(words);
    if (o.help) return;
    auto const& s = o.shape;
    bool ok = s.layers >= 1 && s.layers <= moe::core::limits::layers && s.experts >= 1 && o.leaves >= 1 &&
              o.servers_per_leaf >= 1 && o.gpus_per_server >= 1 && o.batches >= 1 &&
              o.batches <= moe::core::limits::batches && o.tokens >= 1 && o.concentration > 0 &&
              o.train_fraction >= 0 && o.train_fraction <= 1 && o.zipf_lo >= 0 && o.zipf_lo <= 100 &&
              o.zipf_hi >= 0 && o.zipf_hi <= 100 && o.seed <= static_cast<std::uint64_t>(moe::plan_cli::kMaxSeed) &&
              o.craft_r >= 0 && o.joint_slots >= 0 && o.joint_slots <= s.experts && o.joint_eps >= 0 &&
              o.joint_eps <= 100 && o.slots_per_gpu >= 0 && o.slots_per_gpu <= s.experts &&
              (!o.c_layer || *o.c_layer >= 1) && (!o.c_exp || *o.c_exp >= 1) &&
              (!o.eplb_replicas || *o.eplb_replicas >= 0) && (!o.eplb_groups || *o.eplb_groups >= 1) &&
              (!o.eplb_nodes || *o.eplb_nodes >= 1);
    int sources = o.profile.has_value() + o.olmoe.has_value() + o.import_sglang.has_value() +
                  o.import_trtllm.has_value() + o.import_vllm.has_value();
    if (!ok || sources > 1) __builtin_trap();
  }
}


}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char const* name = std::getenv("MOE_FUZZ_TARGET");
  target = name ? name : "";
  if (std::find(std::begin(kTargets), std::end(kTargets), target) == std::end(kTargets)) {
    std::fprintf(stderr, "fuzz_targets: MOE_FUZZ_TARGET is '%s'; set it to one of:", name ? name : "");
    for (auto t : kTargets) std::fprintf(stderr, " %.*s", static_cast<int>(t.size()), t.data());
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  try {
    run(std::string(reinterpret_cast<char const*>(data), size));
  } catch (moe::Error const&) {
    // The documented way to reject input.
  }
  return 0;
}
