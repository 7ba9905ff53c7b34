// Writes the seed corpus of each fuzz target into DIR/<target>/: small valid files made with the
// library's own writers, and the first lines of the real OLMoE routing files in tests/data.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "moe/interop/engine_plans.hpp"
#include "moe/plan/plan_io.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/interop/torch_file.hpp"
#include "moe/schedule/perf_model.hpp"
#include "moe/speculative/table_io.hpp"
#include "moe/topology/topology.hpp"

namespace fs = std::filesystem;
using namespace moe;

static void head(fs::path const& from, fs::path const& to, int lines) {
  std::ifstream in(from);
  std::ofstream out(to);
  std::string line;
  for (int i = 0; i < lines && std::getline(in, line); ++i) out << line << '\n';
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: make_seeds OUT_DIR TESTS_DATA_DIR\n";
    return 2;
  }
  fs::path out = argv[1], data = argv[2];
  for (char const* t : {"load_profile", "olmoe_counts", "topology", "plan", "route_counts", "token_table",
                        "sequence_table", "perf_models", "cli_numbers", "engine_plan", "torch_pickle", "safetensors", "plan_cli",
                        "batch_split"})
    fs::create_directories(out / t);
  {
    profile::LoadProfile p(2, 2, 4);
    for (int b = 0; b < 2; ++b)
      for (int l = 0; l < 2; ++l)
        for (int e = 0; e < 4; ++e) p.row(b, l)[e] = b + l + e * 0.5;
    profile::write_profile((out / "load_profile" / "small.tsv").string(), p);
  }
  auto olmoe = data / "olmoe-routing" / "olmoe-1b-7b" / "arxiv";
  head(olmoe / "expert_counts.tsv", out / "olmoe_counts" / "arxiv.tsv", 40);
  head(olmoe / "token_expert_counts.tsv", out / "route_counts" / "tokens.tsv", 41);
  head(olmoe / "crosslayer_counts.tsv", out / "route_counts" / "cross.tsv", 40);
  {
    std::ofstream f(out / "topology" / "fattree.tsv");
    topology::fat_tree(2, 2, 2, 2).write(f);
    std::ofstream g(out / "topology" / "dragonfly.tsv");
    topology::dragonfly(3, 1, 1, 3).write(g);
    auto slow = topology::fat_tree(2, 1, 2, 1);  // with traffic-model link parameters (level lines)
    topology::LinkParams lp;
    lp.nic = {25e9, 3e-6};
    slow.set_link_params(lp);
    std::ofstream h(out / "topology" / "levels.tsv");
    slow.write(h);
  }
  {
    std::vector<placement::LayerPlan> plan;
    for (int l = 0; l < 2; ++l)
      plan.push_back({placement::Table::round_robin(4, 2), replication::Table({{0, 1}, {1}, {0}, {1, 0}})});
    placement::write_plan((out / "plan" / "small.tsv").string(), plan, 2);
  }
  {
    speculative::TokenDeviceTable t(8, 2);
    t.set(1, 1, 0.75);
    t.set(5, 0, 0.5);
    speculative::write_token_table((out / "token_table" / "small.tsv").string(), t);
    speculative::DeviceSequenceTable s(2, 2);
    std::vector<int> prev{0, 1};
    s.set(prev, 1, 20000);
    speculative::write_sequence_table((out / "sequence_table" / "small.tsv").string(), s);
  }
  {
    schedule::PerfModels m;
    for (std::size_t i = 0; i < m.ops.size(); ++i) m.ops[i] = {1.0 + double(i), 0.01};
    m.source = "seed";
    schedule::write_models((out / "perf_models" / "small.tsv").string(), m);
  }
  {
    // Each engine format of a 2-layer, 2-rank, 3-slot map of 4 experts (first byte: the format).
    placement::SlotMap m(2, 2, 3, 4);
    int rows[2][6] = {{0, 1, 1, 2, 3, 3}, {3, 2, 0, 1, 0, 1}};
    for (int l = 0; l < 2; ++l)
      for (int p = 0; p < 6; ++p) m.at(l, p) = rows[l][p];
    char const* names[] = {"sglang.json", "trtllm.yaml", "vllm.json", "vllm-ascend.json"};
    placement::engine::Format fs[] = {placement::engine::Format::sglang, placement::engine::Format::trtllm,
                                      placement::engine::Format::vllm, placement::engine::Format::vllm_ascend};
    for (int f = 0; f < 4; ++f) {
      std::ofstream o(out / "engine_plan" / names[f], std::ios::binary);
      o << static_cast<char>(f);
      placement::engine::write(fs[f], o, m, {3, 1});
    }
  }
  {
    // The pickle of the real SGLang recorder dump, and a small safetensors file (two int tensors).
    auto pt = data / "engine-formats" / "sglang-stat" / "expert_distribution_recorder_1763900000.123456.pt";
    profile::torch_file::detail::Zip zip(pt.string());
    auto pkl = zip.read("expert_distribution_recorder_1763900000.123456/data.pkl", 1 << 20);
    std::ofstream(out / "torch_pickle" / "sglang_stat.pkl", std::ios::binary)
        .write(reinterpret_cast<char const*>(pkl.data()), static_cast<std::streamsize>(pkl.size()));
    std::string header = R"({"50_3":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                         R"("50_4":{"dtype":"I32","shape":[2],"data_offsets":[16,24]},"__metadata__":{}})";
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i)
      bytes[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    bytes += header;
    long long a[2] = {5, 7};
    int b[2] = {1, 2};
    bytes.append(reinterpret_cast<char const*>(a), 16).append(reinterpret_cast<char const*>(b), 8);
    std::ofstream(out / "safetensors" / "small.safetensors", std::ios::binary) << bytes;
  }
  // moe_plan command lines from docs/planners.md, docs/results/ and docs/engines.md, and a few more
  // (words cut at spaces).
  char const* command_lines[] = {
      "--model deepseek-r1 --topology fattree --c-layer 8 --out-dir plans",
      "--model olmoe-1b-7b --layers 3 --olmoe ../shared/data/olmoe-routing/olmoe-1b-7b/arxiv --leaves 4 "
      "--servers-per-leaf 1 --gpus-per-server 4 --c-layer 4 --out-dir plans-olmoe",
      "--topology dragonfly-sparse --c-layer 1 --policies rr,greedy,ilp,ilpload",
      "--leaves 4 --servers-per-leaf 4 --gpus-per-server 4 --batches 3000 --c-layer 4 --policies "
      "eplb-pack,eplb,craft --craft-r 8",
      "--model deepseek-v3 --import-sglang /data/stats/expert_distribution_recorder_1.pt --leaves 2 "
      "--servers-per-leaf 2 --gpus-per-server 8 --policies eplb,craft,ilpload --format sglang --out-dir plans",
      "--model deepseek-v3 --import-trtllm /data/trtllm-stats --leaves 4 --servers-per-leaf 2 --gpus-per-server 8 "
      "--policies craft --format trtllm --out-dir plans",
      "--model qwen3-235b-a22b --import-vllm routes.json --format vllm,vllm-ascend,tsv --out-dir plans "
      "--slots-per-gpu 9 --policies joint --joint-coact on",
      "--model mixtral-8x7b --synthetic-zipf 0.1,1.5 --batches 20 --tokens 512 --concentration 0.5 --seed 7 "
      "--train-fraction 0.25 --write-profile p.tsv --report r.tsv",
      "--policies joint --joint-slots 3 --joint-eps 0.1 --eplb-replicas 4 --eplb-groups 2 --eplb-nodes 1 "
      "--c-exp 99 --profile p.tsv",
      "--model kimi-k2 --help",
      // Values at the edges of their ranges, one mutation away from the outside.
      "--model mixtral-8x7b --slots-per-gpu 8 --joint-slots 8 --train-fraction 1 --joint-eps 100 --craft-r 0 "
      "--seed 9223372036854774807 --layers 1 --synthetic-zipf 0,100 --eplb-replicas 0"};
  int n = 0;
  for (char const* line : command_lines)
    std::ofstream(out / "plan_cli" / ("line" + std::to_string(n++) + ".txt")) << line;
  std::ofstream(out / "cli_numbers" / "small.txt") << "int 1 2147483647 200\ndouble 0 1 0.5\nint 0 9 12abc\n";
  {
    // batch_split (see fuzz_targets.cpp for the layout of the bytes): 2 servers of 4 ranks, 8
    // experts of 1-3 copies, counts from a fixed linear congruential sequence: one-byte counts, the
    // same with a slack, and four-byte counts up to 2^24.
    struct Seed {
      char const* name;
      unsigned char slack, width;
      unsigned mask;
    };
    for (Seed const& seed : {Seed{"small.bin", 0, 0, 0x3f}, Seed{"slack.bin", 230, 0, 0x3f},
                             Seed{"large.bin", 0, 3, 0xffffff}}) {
      std::string bytes = {1, 3, 7, static_cast<char>(seed.slack), static_cast<char>(seed.width)};
      unsigned x = 12345;
      auto next = [&x] {
        x = x * 1103515245u + 12345u;
        return x >> 8;
      };
      for (int e = 0; e < 8; ++e) {
        int k = 1 + e % 3;
        bytes += static_cast<char>(k - 1);
        for (int j = 0; j < k; ++j) bytes += static_cast<char>((e + 3 * j) % 8);
      }
      for (int i = 0; i < 64; ++i) {
        unsigned v = next() & seed.mask;
        for (int b = 0; b <= seed.width; ++b) bytes += static_cast<char>(v >> (8 * b));
      }
      std::ofstream(out / "batch_split" / seed.name, std::ios::binary) << bytes;
    }
  }
  return 0;
}
