// moe_plan's command line (tools/include/moe_tools/plan_options.hpp): accepted lines give the documented
// values, and each bad line gives a moe::Error that names the option at fault. The plan_cli fuzz
// target (tests/fuzz) runs the same parser on arbitrary words.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "moe_tools/plan_options.hpp"

using Catch::Contains;
using moe::plan_cli::parse_plan_options;

namespace {
moe::plan_cli::PlanOptions parse(std::vector<std::string> const& words) { return parse_plan_options(words); }

/// The message of the moe::Error parsing `words` throws ("accepted" when it throws none; any other
/// exception escapes and fails the test).
std::string error_of(std::vector<std::string> const& words) {
  try {
    (void)parse(words);
  } catch (moe::Error const& e) {
    return e.what();
  }
  return "accepted";
}
}  // namespace

TEST_CASE("moe_plan options: defaults and a documented command line") {
  auto d = parse({});
  CHECK(d.model == "deepseek-r1");
  CHECK(d.shape.layers == 58);
  CHECK(d.shape.experts == 256);
  CHECK(d.leaves == 16);
  CHECK(d.batches == 200);
  CHECK(d.policies.size() == 8);
  CHECK(d.all_policies);
  CHECK(d.write_tsv);
  CHECK_FALSE(d.c_layer.has_value());

  auto o = parse({"--model",   "olmoe-1b-7b", "--layers",           "3",           "--tokens",          "512",
                  "--leaves",  "4",           "--servers-per-leaf", "1",           "--gpus-per-server", "4",
                  "--c-layer", "4",           "--out-dir",          "plans-olmoe", "--policies",        "rr,joint",
                  "--seed",    "0",           "--train-fraction",   "1",           "--synthetic-zipf",  "0,100"});
  CHECK(o.model == "olmoe-1b-7b");
  CHECK(o.shape.layers == 3);
  CHECK(o.shape.experts == 64);
  CHECK(o.layers_given);
  CHECK(o.tokens == 512.0);
  CHECK(parse({"--olmoe", "dir"}).olmoe == "dir");
  CHECK(o.c_layer == 4);
  CHECK(o.out_dir == "plans-olmoe");
  CHECK(o.policies == std::vector<std::string>{"rr", "joint"});
  CHECK_FALSE(o.all_policies);
  CHECK(o.seed == 0);
  CHECK(o.train_fraction == 1.0);
  CHECK(o.zipf_hi == 100.0);
  CHECK(o.zipf_b == "100");
  CHECK(d.joint_server_cap);
  CHECK(d.joint_coact);
  CHECK(d.joint_regroup);
  auto j = parse({"--joint-server-cap", "off", "--joint-z", "1.5", "--joint-server-eps", "0", "--joint-coact", "off",
                  "--joint-regroup", "off"});
  CHECK_FALSE(j.joint_server_cap);
  CHECK_FALSE(j.joint_coact);
  CHECK_FALSE(j.joint_regroup);
  CHECK(j.joint_z == 1.5);
  CHECK(j.joint_server_eps == 0.0);

  // A later option replaces an earlier one; --help stops the scan before any later word.
  CHECK(parse({"--batches", "5", "--batches", "6"}).batches == 6);
  CHECK(parse({"--batches", "12abc", "--help"}).help);
  CHECK(parse({"-h", "not-an-option"}).help);
}

TEST_CASE("moe_plan options: a bad command line names the option") {
  struct Bad {
    std::vector<std::string> words;
    char const* message;
  };
  std::vector<Bad> bad = {
      {{"--batches", "3000000000"}, "--batches: 3000000000 is outside [1, "},
      {{"--batches", "12abc"}, "--batches: '12abc' is not an integer"},
      {{"--leaves", "-1"}, "--leaves: -1 is outside [1, "},
      {{"--train-fraction", "nan"}, "--train-fraction: nan is outside [0, 1]"},
      {{"--tokens", ""}, "--tokens: empty value"},
      {{"--c-layer", "0"}, "--c-layer: 0 is outside [1, "},
      {{"--eplb-replicas", "-3"}, "--eplb-replicas: -3 is outside [0, "},
      {{"--seed", "-1"}, "--seed: -1 is outside [0, "},
      {{"--layers", "0"}, "--layers: 0 is outside [1, "},
      {{"--model", "mixtral-8x7b", "--slots-per-gpu", "9"}, "--slots-per-gpu: 9 is outside [0, 8]"},
      {{"--joint-slots", "257"}, "--joint-slots: 257 is outside [0, 256]"},
      {{"--joint-eps", "1e999"}, "--joint-eps: 1e999 is outside [0, 100]"},
      {{"--synthetic-zipf", "0.3"}, "--synthetic-zipf needs A,B"},
      {{"--synthetic-zipf", "0.3,x"}, "--synthetic-zipf B: 'x' is not a number"},
      {{"--model", "gpt-5"}, "unknown model 'gpt-5'"},
      {{"--policies", "rr,ilp2"}, "unknown policy 'ilp2'"},
      {{"--format", "sglang"}, "--format"},
      {{"--format", "tsv"}, "--format needs --out-dir"},
      {{"--profile", "a", "--olmoe", "b"}, "give at most one of --profile, --olmoe"},
      {{"--batches"}, "--batches: missing value"},
      {{"plans"}, "unexpected argument 'plans'"},
      {{"--polices", "rr"}, "unknown option '--polices'"},
      {{"--joint-server-cap", "yes"}, "--joint-server-cap takes on or off, got 'yes'"},
      {{"--joint-coact", "1"}, "--joint-coact takes on or off, got '1'"},
      {{"--joint-regroup", "On"}, "--joint-regroup takes on or off, got 'On'"},
      {{"--joint-z", "-1"}, "--joint-z: -1 is outside [0, 100]"},
      {{"--joint-server-eps", "x"}, "--joint-server-eps: 'x' is not a number"},
      // Requests that would do nothing, or not what was asked (issue 37): named, never ignored.
      {{"--format", "", "--out-dir", "d"}, "--format: empty value"},
      {{"--format", ",", "--out-dir", "d"}, "--format: empty item in ','"},
      {{"--format", "tsv,", "--out-dir", "d"}, "--format: empty item in 'tsv,'"},
      {{"--policies", ""}, "--policies: empty value"},
      {{"--policies", ","}, "--policies: empty item"},
      {{"--policies", "rr,,joint"}, "--policies: empty item in 'rr,,joint'"},
      {{"--policies", "rr", "--craft-r", "3"}, "--craft-r applies to the policy craft, which --policies does not"},
      {{"--policies", "craft", "--c-exp", "9"}, "--c-exp applies to the policy rr, greedy, ilp or ilpload"},
      {{"--policies", "eplb", "--joint-eps", "0.1"}, "--joint-eps applies to the policy joint"},
      {{"--profile", "p.tsv", "--batches", "4"}, "--batches: only synthetic batches"},
      {{"--profile", "p.tsv", "--seed", "4"}, "--seed: only synthetic batches"},
      {{"--olmoe", "d", "--synthetic-zipf", "0.1,0.2"}, "--synthetic-zipf: the profile comes from another source (--olmoe)"},
      {{"--synthetic-zipf", "0.9,0.1"}, "--synthetic-zipf: A (0.9) is above B (0.1)"},
      {{"--train-fraction", "0"}, "--train-fraction: 0 leaves no batch"},
      {{"--slots-per-gpu", "4"}, "--slots-per-gpu applies to the engine formats"},
      {{"--slots-per-gpu", "4", "--out-dir", "d"}, "--slots-per-gpu applies to the engine formats"},
  };
  for (auto const& b : bad) {
    std::string line;
    for (auto const& w : b.words) line += w + " ";
    INFO(line);
    CHECK_THAT(error_of(b.words), Contains(b.message));
  }
}

TEST_CASE("moe_plan options: --preset") {
  auto p = parse({"--preset", "dgx-h100:4"});
  CHECK(p.preset == "dgx-h100:4");
  CHECK(parse({}).preset.empty());
  CHECK_THAT(error_of({"--preset", "dgx-a100"}),
             Contains("--preset: unknown hardware preset 'dgx-a100' (known: h800, dgx-h100, dgx-h200, gb200-nvl72)"));
  CHECK_THAT(error_of({"--preset", "h800:many"}), Contains("--preset: hardware preset 'h800:many'"));
  // A preset is the whole cluster: the topology options contradict it.
  for (char const* k : {"--topology", "--leaves", "--servers-per-leaf", "--gpus-per-server"})
    CHECK_THAT(error_of({"--preset", "h800", k, "4"}), Contains(std::string("drop ") + k));
}
