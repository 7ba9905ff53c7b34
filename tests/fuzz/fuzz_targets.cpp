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
#include "moe/replication/batch_split.hpp"
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
                                         "torch_pickle", "safetensors",  "plan_cli",   "batch_split"};
std::string_view target;  // MOE_FUZZ_TARGET, checked against kTargets once (LLVMFuzzerInitialize)
#define MOE_FUZZ_IS(name) (target == #name)

/// The per-batch replica split (replication::BatchSplit) on a layout and counts read from the bytes:
/// servers, ranks per server, experts, slack, count width (1-4 bytes; 4: any int32, negative ones
/// included); per expert its number of copies and their ranks; then the counts, ranks x experts,
/// little-endian (missing bytes are 0). A layout the constructor refuses ends the input. Findings:
/// any error from plan_batch but a negative count's, a negative count accepted, and a split that
/// loses or invents pairs, reports loads or sums it does not have, differs from a fresh solve of
/// the same counts, falls below the lower bound, or (without slack) exceeds the fixed rule's max
/// load or least_max_load(); with small counts also a deal that does not follow the split.
void fuzz_batch_split(std::string const& text) {
  using std::size_t;
  size_t at = 0;
  auto byte = [&]() -> unsigned { return at < text.size() ? static_cast<unsigned char>(text[at++]) : 0u; };
  int const S = 1 + static_cast<int>(byte() % 4), per = 1 + static_cast<int>(byte() % 8), G = S * per;
  int const E = 1 + static_cast<int>(byte() % 40);
  unsigned const sl = byte();
  int const slack = sl < 192 ? 0 : static_cast<int>(sl - 191) * 20;
  int const width = 1 + static_cast<int>(byte() % 4);
  std::vector<std::vector<int>> copies(static_cast<size_t>(E));
  for (auto& list : copies) {
    int k = 1 + static_cast<int>(byte() % static_cast<unsigned>(std::min(G, 8)));
    for (int j = 0; j < k; ++j) list.push_back(static_cast<int>(byte() % static_cast<unsigned>(G)));
  }
  std::vector<int> server(static_cast<size_t>(G));
  for (int g = 0; g < G; ++g) server[static_cast<size_t>(g)] = g / per;
  std::vector<std::int32_t> counts(static_cast<size_t>(G) * static_cast<size_t>(E));
  bool negative = false;
  for (auto& n : counts) {
    std::uint32_t v = 0;
    for (int b = 0; b < width; ++b) v |= static_cast<std::uint32_t>(byte()) << (8 * b);
    n = static_cast<std::int32_t>(v);
    negative |= n < 0;
  }
  moe::replication::BatchSplit split;
  try {
    split = moe::replication::BatchSplit(copies, server, slack);
  } catch (moe::Error const&) {
    return;  // a duplicated copy: refused by name
  }
  moe::replication::split::Outcome out;
  try {
    out = split.plan_batch(counts);
  } catch (moe::Error const&) {
    if (!negative) __builtin_trap();  // an internal fault
    return;
  }
  if (negative) __builtin_trap();
  auto const& lists = split.copy_lists();
  auto const slots = static_cast<size_t>(lists.first.back());
  auto first = [&](int e) { return lists.first[static_cast<size_t>(e)]; };
  auto rank_of = [&](int c) { return lists.ranks[static_cast<size_t>(c)]; };
  auto count = [&](int r, int e) -> long long { return counts[static_cast<size_t>(r) * static_cast<size_t>(E) + static_cast<size_t>(e)]; };
  // pairs of (source r, copy c of e) in a split: all of them for a single copy, else the take
  auto taken = [&](moe::replication::BatchSplit const& x, int r, int e, int c) -> long long {
    return first(e + 1) - first(e) == 1 ? count(r, e) : x.take()[static_cast<size_t>(r) * slots + static_cast<size_t>(c)];
  };
  // what the split says, recounted from its takes; beside it the fixed rule (Table::choose) with
  // the m-th pair as token m: a copy on the source takes all, else copy j the m with (r + m) % k == j
  std::vector<long long> recv(static_cast<size_t>(G), 0), fixed(static_cast<size_t>(G), 0);
  long long local = 0, same = 0, total = 0;
  for (int r = 0; r < G; ++r)
    for (int e = 0; e < E; ++e) {
      long long n = count(r, e), given = 0, k = first(e + 1) - first(e);
      bool own = false;
      for (int c = first(e); c < first(e + 1); ++c) own |= rank_of(c) == r;
      for (int c = first(e); c < first(e + 1); ++c) {
        int g = rank_of(c);
        long long t = taken(split, r, e, c), j = c - first(e);
        if (t < 0) __builtin_trap();
        given += t;
        recv[static_cast<size_t>(g)] += t;
        local += g == r ? t : 0;
        same += server[static_cast<size_t>(g)] == server[static_cast<size_t>(r)] ? t : 0;
        fixed[static_cast<size_t>(g)] += own ? (g == r ? n : 0) : n / k + (((j - r) % k + k) % k < n % k ? 1 : 0);
      }
      total += n;
      if (given != n) __builtin_trap();
    }
  long long mx = *std::max_element(recv.begin(), recv.end()), least = split.least_max_load(counts);
  if (recv != split.load() || mx != out.max_load || local != out.local || same != out.same_server) __builtin_trap();
  if (mx < (total + G - 1) / G || mx < least) __builtin_trap();
  if (slack == 0 && (mx != least || mx > *std::max_element(fixed.begin(), fixed.end()))) __builtin_trap();
  // the same split from a fresh workspace
  moe::replication::BatchSplit fresh(copies, server, slack);
  (void)fresh.plan_batch(counts);
  for (int r = 0; r < G; ++r)
    for (int e = 0; e < E; ++e)
      for (int c = first(e); c < first(e + 1); ++c)
        if (taken(fresh, r, e, c) != taken(split, r, e, c)) __builtin_trap();
  // with small counts: each rank's deal (its pairs, expert by expert) gives each copy its take
  if (total > 20000) return;
  for (int r = 0; r < G; ++r) {
    std::vector<int> experts;
    for (int e = 0; e < E; ++e) experts.insert(experts.end(), static_cast<size_t>(count(r, e)), e);
    std::vector<int> to(experts.size());
    split.deal(r, experts, to);
    std::vector<long long> got(static_cast<size_t>(G) * static_cast<size_t>(E), 0);
    for (size_t i = 0; i < experts.size(); ++i)
      ++got[static_cast<size_t>(to[i]) * static_cast<size_t>(E) + static_cast<size_t>(experts[i])];
    for (int e = 0; e < E; ++e)
      for (int c = first(e); c < first(e + 1); ++c)
        if (got[static_cast<size_t>(rank_of(c)) * static_cast<size_t>(E) + static_cast<size_t>(e)] != taken(split, r, e, c))
          __builtin_trap();
  }
}

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
  } else if (MOE_FUZZ_IS(batch_split)) {
    fuzz_batch_split(text);
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
