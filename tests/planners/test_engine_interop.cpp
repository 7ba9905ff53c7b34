// Engine interop: slot maps, the engines' plan files (SGLang, TensorRT-LLM, vLLM, vllm-ascend) and
// the engines' routing statistics (SGLang recorder dumps, TensorRT-LLM expert statistics, vLLM
// routed experts).
//
// References: the fixtures in tests/data/engine-formats were written by the engines' own code paths
// (tests/data/engine-formats/README.md); the totals and checksums they must import to were computed
// from those files with Python's zipfile, array and json modules (commands in the comments), sharing
// nothing with the C++ readers. Round trips compare plans as sets of GPUs per expert.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "moe/models/models.hpp"
#include "moe/interop/engine_plans.hpp"
#include "moe/placement/ilp.hpp"
#include "moe/plan/slot_map.hpp"
#include "moe/interop/engine_stats.hpp"
#include "moe/replication/craft.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/topology/topology.hpp"

using namespace moe;
using namespace moe::placement;

namespace {

std::string const kData = std::string(MOE_SHARED_DATA_DIR) + "/engine-formats";

/// Per layer and expert, the set of GPUs with a copy: what a plan means to an engine.
std::vector<std::vector<std::set<int>>> copy_sets(std::vector<LayerPlan> const& plan) {
  std::vector<std::vector<std::set<int>>> out;
  for (auto const& lp : plan) {
    std::vector<std::set<int>> l;
    for (auto const& c : lp.replicas.replicas()) l.emplace_back(c.begin(), c.end());
    out.push_back(std::move(l));
  }
  return out;
}

LayerPlan layer(std::vector<std::vector<int>> copies) {
  std::vector<int> primary;
  for (auto const& c : copies) primary.push_back(c.front());
  return {placement::Table(std::move(primary)), replication::Table(std::move(copies))};
}

std::vector<LayerPlan> plan_of(std::vector<placement::Table> const& prim, std::vector<replication::Table> const& tabs) {
  std::vector<LayerPlan> p;
  for (std::size_t l = 0; l < prim.size(); ++l) p.push_back({prim[l], tabs[l]});
  return p;
}

/// Checks an engine would make of a slot map: every GPU has S slots of valid experts, every expert
/// has a slot in every layer (written independently of SlotMap::validate).
void check_engine_view(SlotMap const& m) {
  for (int l = 0; l < m.layers(); ++l) {
    auto row = m.physical_to_logical(l);
    REQUIRE(static_cast<int>(row.size()) == m.ranks() * m.slots_per_rank());
    std::vector<int> n(static_cast<std::size_t>(m.experts()), 0);
    for (int e : row) {
      REQUIRE(e >= 0);
      REQUIRE(e < m.experts());
      ++n[static_cast<std::size_t>(e)];
    }
    for (int c : n) REQUIRE(c >= 1);
    REQUIRE(n == m.logical_count(l));
  }
}

std::string write_to_string(engine::Format f, SlotMap const& m, engine::LayerLayout const& ly) {
  std::ostringstream os;
  engine::write(f, os, m, ly);
  return os.str();
}

SlotMap read_from_string(engine::Format f, std::string const& s, engine::LayerLayout const& ly, int ep, int E) {
  std::istringstream in(s);
  return engine::read(f, in, "plan", ly, ep, E);
}

constexpr engine::Format kFormats[] = {engine::Format::sglang, engine::Format::trtllm, engine::Format::vllm,
                                       engine::Format::vllm_ascend};

}  // namespace

TEST_CASE("slot maps: a hand-worked layer with spare slots filled by the hottest local expert") {
  // 5 experts on 2 GPUs, 4 slots each (P = 8, R = 3). GPU 0 holds {0, 1, 4}, GPU 1 holds {2, 3, 4}.
  // Loads 10, 1, 7, 9, 6: GPU 0's spare slot goes to expert 0 (10 > 6 > 1); GPU 1's to expert 3
  // (9 > 7 > 6/1 -- expert 4 has a copy on each GPU, but per local slot it counts 6).
  std::vector<LayerPlan> plan{layer({{0}, {0}, {1}, {1}, {1, 0}})};
  std::vector<double> loads{10, 1, 7, 9, 6};
  auto m = slot_map_from_plan(plan, 2, 4, loads);
  std::vector<int> row(m.physical_to_logical(0).begin(), m.physical_to_logical(0).end());
  CHECK(row == std::vector<int>{0, 0, 1, 4, 2, 3, 3, 4});
  CHECK(m.logical_count(0) == std::vector<int>{2, 1, 1, 2, 2});
  CHECK(m.redundant() == 3);
  int width = 0;
  auto l2p = m.logical_to_physical(0, width);
  CHECK(width == 2);
  CHECK(l2p == std::vector<int>{0, 1, 2, -1, 4, -1, 5, 6, 3, 7});
  // Two spare slots on GPU 0 with equal loads: one each to experts 0 and 1 (most load per slot).
  auto m2 = slot_map_from_plan({layer({{0}, {0}, {1}, {1}})}, 2, 4, std::vector<double>{5, 5, 1, 1});
  std::vector<int> row2(m2.physical_to_logical(0).begin(), m2.physical_to_logical(0).end());
  CHECK(row2 == std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3});
  // Back to our tables: the second copy on one GPU is the same copy.
  CHECK(copy_sets(plan_from_slot_map(m)) == copy_sets(plan));
  CHECK(min_slots_per_gpu(plan, 2) == 3);
}

TEST_CASE("slot maps: a GPU with more experts than slots, or with none, is an error naming layer and GPU") {
  std::vector<LayerPlan> plan{layer({{0}, {1}, {0}, {1}}), layer({{0}, {0}, {0}, {1}})};
  CHECK_NOTHROW(slot_map_from_plan(plan, 2, 3));
  CHECK_THROWS_WITH(
      slot_map_from_plan(plan, 2, 2),
      Catch::Contains("layer 1, GPU 0 holds 3 experts but has only 2 slots") && Catch::Contains("at least 3"));
  std::vector<LayerPlan> empty_gpu{layer({{0}, {0}, {0}, {0}})};
  CHECK_THROWS_WITH(slot_map_from_plan(empty_gpu, 2, 4), Catch::Contains("layer 0, GPU 1 holds no expert"));
  SlotMap bad(1, 2, 2, 4);
  for (int p = 0; p < 4; ++p) bad.at(0, p) = p % 3;
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("layer 0 has no slot for logical expert 3"));
}

namespace {

struct Shape {
  char const* name;
  int experts, top_k, dense, groups;
};

template <class M>
Shape shape(char const* n) {
  return {n, M::spec.experts, M::spec.top_k, M::spec.dense_layers, M::spec.groups};
}

}  // namespace

TEST_CASE("round trips: EPLB, CRAFT and ILPLoad plans -> slot map -> every engine format -> our tables") {
  // DeepSeek-V3, Qwen3-235B and Kimi-K2 expert counts on 8 to 256 GPUs; 3 MoE layers keep it quick
  // (the layer count only repeats the per-layer work). Loads: seeded Zipf-like (synthetic).
  for (auto sh : {shape<models::DeepSeekV3>("deepseek-v3"), shape<models::Qwen3_235B_A22B>("qwen3-235b"),
                  shape<models::KimiK2>("kimi-k2")}) {
    for (int G : {8, 64, 256}) {
      INFO(sh.name << " on " << G << " GPUs");
      int L = 3, E = sh.experts;
      auto marg = profile::zipf_marginals(L, E, 0.4, 0.9, static_cast<std::uint64_t>(G + E));
      profile::SampleOptions so;
      so.batches = 6;
      so.top_k = sh.top_k;
      so.seed = 7;
      auto prof = profile::sample_profile(marg, so);
      auto totals = prof.totals();
      engine::LayerLayout ly{sh.dense + L, sh.dense};

      std::vector<std::pair<std::string, std::vector<LayerPlan>>> plans;
      std::vector<SlotMap> maps;
      // EPLB: its own slot layout (G redundant slots, rounded up so E + R splits over G).
      int extra = G + (G - (E + G) % G) % G;
      auto r = replication::eplb::rebalance_experts(totals, L, E, E + extra, 1, 1, G);
      {
        std::vector<LayerPlan> p;
        for (int l = 0; l < L; ++l) {
          auto lt = replication::eplb::layer_tables(r, l);
          p.push_back({lt.placement, lt.replicas});
        }
        plans.emplace_back("eplb", p);
        maps.push_back(replication::eplb::slot_map(r));
      }
      if (E >= G) {  // CRAFT and plans without replicas need an expert for every GPU
        replication::craft::Options co;
        co.replication_factor = 2;
        co.threads = 1;
        auto cp = replication::craft::plan(prof, G, co);
        plans.emplace_back("craft", plan_of(cp.placement, cp.tables));
        maps.push_back(slot_map_from_plan(plans.back().second, G, min_slots_per_gpu(plans.back().second, G), totals));
      }
      if (E % G == 0) {  // without replicas, only an even split is sure to give every GPU an expert
        auto topo = topology::fat_tree(std::max(1, G / 16), std::min(G, 4), std::min(4, G / std::min(G, 4)));
        REQUIRE(topo.gpus() == G);
        auto prob = make_problem(topo, L, E, (E + G - 1) / G, L * ((E + G - 1) / G));
        auto il = ilp_load(prob, totals);
        std::vector<LayerPlan> p;
        for (int l = 0; l < L; ++l) {
          auto t = il.assignment.table(l);
          std::vector<std::vector<int>> c;
          for (int g : t.ranks()) c.push_back({g});
          p.push_back({t, replication::Table(std::move(c))});
        }
        plans.emplace_back("ilpload", p);
        maps.push_back(slot_map_from_plan(p, G, min_slots_per_gpu(p, G), totals));
      }
      for (std::size_t i = 0; i < plans.size(); ++i) {
        INFO(plans[i].first);
        auto const& m = maps[i];
        check_engine_view(m);
        REQUIRE(copy_sets(plan_from_slot_map(m)) == copy_sets(plans[i].second));
        for (auto f : kFormats) {
          INFO("format " << engine::file_suffix(f));
          auto text = write_to_string(f, m, ly);
          auto back = read_from_string(f, text, ly, G, E);
          REQUIRE(back == m);
          REQUIRE(copy_sets(plan_from_slot_map(back)) == copy_sets(plans[i].second));
        }
      }
    }
  }
}

TEST_CASE("engine files: the layout each engine reads") {
  // 4 experts, 2 GPUs x 3 slots, 2 MoE layers after 1 dense layer.
  SlotMap m(2, 2, 3, 4);
  std::vector<int> l0{0, 1, 1, 2, 3, 3}, l1{3, 2, 0, 1, 0, 1};
  for (int p = 0; p < 6; ++p)
    m.at(0, p) = l0[static_cast<std::size_t>(p)], m.at(1, p) = l1[static_cast<std::size_t>(p)];
  engine::LayerLayout ly{3, 1};

  // SGLang: one key; 3 rows, the dense row arange(P) % E.
  auto sg = nlohmann::json::parse(write_to_string(engine::Format::sglang, m, ly));
  CHECK(sg.size() == 1);
  CHECK(sg["physical_to_logical_map"] == nlohmann::json::parse("[[0,1,2,3,0,1],[0,1,1,2,3,3],[3,2,0,1,0,1]]"));
  for (auto const& row : sg["physical_to_logical_map"])
    for (auto const& v : row) CHECK(v.is_number_integer());

  // TensorRT-LLM: keys are decoder layer indices of the MoE layers.
  auto y = YAML::Load(write_to_string(engine::Format::trtllm, m, ly));
  CHECK(y["num_slots"].as<int>() == 6);
  CHECK(y["layer_updates_per_iter"].as<int>() == 0);
  CHECK(y["initial_global_assignments"].size() == 2);
  CHECK(y["initial_global_assignments"][1].as<std::vector<int>>() == l0);
  CHECK(y["initial_global_assignments"][2].as<std::vector<int>>() == l1);

  // vLLM: [moe layers][P]; vllm-ascend: per layer, per device, its slots.
  CHECK(nlohmann::json::parse(write_to_string(engine::Format::vllm, m, ly)) ==
        nlohmann::json::parse("[[0,1,1,2,3,3],[3,2,0,1,0,1]]"));
  auto asc = nlohmann::json::parse(write_to_string(engine::Format::vllm_ascend, m, ly));
  CHECK(asc["moe_layer_count"] == 2);
  CHECK(asc["layer_list"][1]["device_count"] == 2);
  CHECK(asc["layer_list"][1]["device_list"][1]["device_id"] == 1);
  CHECK(asc["layer_list"][1]["device_list"][1]["device_expert"] == nlohmann::json::parse("[1,0,1]"));
}

TEST_CASE("engine files: the engines' load-time checks reject bad plans, naming the field") {
  engine::LayerLayout ly{3, 1};
  auto sg = [&](std::string const& s, int ep = 2) { return read_from_string(engine::Format::sglang, s, ly, ep, 4); };
  std::string good = R"({"physical_to_logical_map": [[0,1,2,3,0,1],[0,1,1,2,3,3],[3,2,0,1,0,1]]})";
  CHECK_NOTHROW(sg(good));
  CHECK_THROWS_WITH(sg(R"({"physical_to_logical_map": [[0,1,2,3,0,1],[0,1,1,2,3,3],[3,2,0,1,0,1]], "x": 1})"),
                    Catch::Contains("unexpected key \"x\""));
  CHECK_THROWS_WITH(sg(R"({"physical_to_logical_map": [[0,1,2,3,0,1],[0,1,1,2,3,3]]})"),
                    Catch::Contains("2 rows, the model has 3 hidden layers"));
  CHECK_THROWS_WITH(sg(R"({"physical_to_logical_map": [[0,1,2,3,0,1],[0,1,1,2,3.0,3],[3,2,0,1,0,1]]})"),
                    Catch::Contains("physical_to_logical_map[1][4]: expected an integer"));
  CHECK_THROWS_WITH(sg(R"({"physical_to_logical_map": [[0,1,2,3,0,1],[0,1,1,2,3,3],[3,2,0,1,0]]})"),
                    Catch::Contains("physical_to_logical_map[2]: has 5 entries, expected 6"));
  CHECK_THROWS_WITH(sg(R"({"physical_to_logical_map": [[0,1,2,3,0,1],[0,1,1,2,2,2],[3,2,0,1,0,1]]})"),
                    Catch::Contains("MoE layer 0 has no slot for logical expert 3"));
  CHECK_THROWS_WITH(sg(R"({"physical_to_logical_map": [[0,1,2,3,0,1],[0,1,1,2,3,7],[3,2,0,1,0,1]]})"),
                    Catch::Contains("expert id 7 outside [0, 4)"));
  CHECK_THROWS_WITH(sg(good, 4), Catch::Contains("6 physical slots do not split over 4 EP ranks"));
  CHECK_THROWS_WITH(sg(R"({"physical_to_logical_map": [[0,1,2,3,0,1],)"), Catch::Contains("not valid JSON"));
  // A dense row must be a valid row too.
  CHECK_THROWS_WITH(sg(R"({"physical_to_logical_map": [[0,1,2,3,0,-1],[0,1,1,2,3,3],[3,2,0,1,0,1]]})"),
                    Catch::Contains("physical_to_logical_map[0][5]: expert id -1"));

  auto tr = [&](std::string const& s) { return read_from_string(engine::Format::trtllm, s, ly, 2, 4); };
  CHECK_NOTHROW(
      tr("num_slots: 6\ninitial_global_assignments:\n  1: [0,1,1,2,3,3]\n  2: [3,2,0,1,0,1]\n"
         "layer_updates_per_iter: 0\n"));
  CHECK_THROWS_WITH(tr("num_slots: 6\ninitial_global_assignments:\n  1: [0,1,1,2,3,3]\nlayer_updates_per_iter: 0\n"),
                    Catch::Contains("no entry for MoE decoder layer 2"));
  CHECK_THROWS_WITH(tr("num_slots: 6\ninitial_global_assignments:\n  0: [0,1,1,2,3,3]\n  2: [3,2,0,1,0,1]\n"
                       "layer_updates_per_iter: 0\n"),
                    Catch::Contains("decoder layer 0 is not a MoE layer"));
  CHECK_THROWS_WITH(tr("num_slots: 6\ninitial_global_assignments:\n  1: [0,1,1,2,3,3]\n  2: [3,2,0,1,0,x]\n"
                       "layer_updates_per_iter: 0\n"),
                    Catch::Contains("initial_global_assignments[2][5] = 'x' is not an integer"));
  CHECK_THROWS_WITH(tr("num_slots: 7\ninitial_global_assignments:\n  1: [0,1,1,2,3,3]\n  2: [3,2,0,1,0,1]\n"
                       "layer_updates_per_iter: 0\n"),
                    Catch::Contains("has 6 slots, num_slots is 7"));
  CHECK_THROWS_WITH(tr("num_slots: 6\ninitial_global_assignments:\n  1: [0,1,1,2,3,3]\n  2: [3,2,0,1,0,1]\n"),
                    Catch::Contains("missing layer_updates_per_iter"));

  auto asc = [&](std::string const& s) { return read_from_string(engine::Format::vllm_ascend, s, {2, 0}, 2, 4); };
  std::string a_ok = R"({"moe_layer_count":2,"layer_list":[
      {"layer_id":0,"device_count":2,"device_list":[{"device_id":0,"device_expert":[0,1]},{"device_id":1,"device_expert":[2,3]}]},
      {"layer_id":1,"device_count":2,"device_list":[{"device_id":0,"device_expert":[3,1]},{"device_id":1,"device_expert":[2,0]}]}]})";
  CHECK_NOTHROW(asc(a_ok));
  std::string a_bad = a_ok;
  a_bad.replace(a_bad.find("[3,1]"), 5, "[3,1,1]");
  CHECK_THROWS_WITH(asc(a_bad),
                    Catch::Contains("layer_list[1].device_list[0].device_expert: has 3 entries, expected 2"));
}

TEST_CASE("SGLang recorder dump: the real .pt layout, read without torch") {
  // Reference (Python, independent of the C++ reader):
  //   a = array('i', zipfile.ZipFile(pt).read(prefix + 'data/0')); P, H, E = 4, 61, 256
  //   sum(a) = 3801088; all-zero layers = [0, 1, 2]; per-pass totals 950272;
  //   sum(a[(p*H+h)*E+e] * (1 + e + 7*h + 131*p)) = 2072105617; a[(1*H+10)*E+5] = 153.
  auto imp = profile::engine::import_sglang_stat(
      kData + "/sglang-stat/expert_distribution_recorder_1763900000.123456.pt", 256);
  REQUIRE(imp.loads.batches() == 4);
  REQUIRE(imp.loads.layers() == 58);
  REQUIRE(imp.loads.experts() == 256);
  REQUIRE(imp.decoder_layers.front() == 3);
  REQUIRE(imp.decoder_layers.back() == 60);
  double total = 0, chk = 0;
  for (int b = 0; b < 4; ++b) {
    double pass = 0;
    for (int l = 0; l < 58; ++l)
      for (int e = 0; e < 256; ++e) {
        double v = imp.loads.at(b, l, e);
        pass += v;
        chk += v * (1 + e + 7 * imp.decoder_layers[static_cast<std::size_t>(l)] + 131 * b);
      }
    CHECK(pass == 950272);
    total += pass;
  }
  CHECK(total == 3801088);
  CHECK(chk == 2072105617.0);
  CHECK(imp.loads.at(1, 10 - 3, 5) == 153);
  CHECK_THROWS_WITH(profile::engine::import_sglang_stat(
                        kData + "/sglang-stat/expert_distribution_recorder_1763900000.123456.pt", 384),
                    Catch::Contains("256 experts, the model has 384"));
}

TEST_CASE("TensorRT-LLM expert statistics: summed over ranks") {
  // Reference (Python): per (iteration, layer) the int64 bincounts of rank0 and rank1 summed;
  //   iterations [50, 51], decoder layers 3..60; total 1900544;
  //   sum(count * (1 + e + 7*layer + 131*iteration_index)) = 789449394;
  //   (51, 60, e=255) = 48; (50, 3, e=0) = 124.
  auto imp = profile::engine::import_trtllm_stat(kData + "/trtllm-expert-statistic", 256);
  REQUIRE(imp.loads.batches() == 2);
  REQUIRE(imp.loads.layers() == 58);
  REQUIRE(imp.top_k == 8);
  REQUIRE(imp.decoder_layers.front() == 3);
  double total = 0, chk = 0;
  for (int b = 0; b < 2; ++b)
    for (int l = 0; l < 58; ++l)
      for (int e = 0; e < 256; ++e) {
        double v = imp.loads.at(b, l, e);
        total += v;
        chk += v * (1 + e + 7 * imp.decoder_layers[static_cast<std::size_t>(l)] + 131 * b);
      }
  CHECK(total == 1900544);
  CHECK(chk == 789449394.0);
  CHECK(imp.loads.at(1, 57, 255) == 48);
  CHECK(imp.loads.at(0, 0, 0) == 124);
}

namespace {

namespace fs = std::filesystem;

/// A scratch copy of the TensorRT-LLM fixture that a test may damage.
struct Scratch {
  fs::path dir;
  explicit Scratch(std::string const& name) {
    dir = fs::temp_directory_path() / ("moe_interop_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (auto const& f : fs::directory_iterator(kData + "/trtllm-expert-statistic"))
      fs::copy_file(f.path(), dir / f.path().filename());
    for (auto const& f : fs::directory_iterator(dir))
      fs::permissions(f.path(), fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string bytes(std::string const& f) const {
    std::ifstream in(dir / f, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  void put(std::string const& f, std::string const& b) const {
    std::ofstream out(dir / f, std::ios::binary | std::ios::trunc);
    out << b;
  }
};

}  // namespace

TEST_CASE("TensorRT-LLM expert statistics: truncated and inconsistent dumps are clear errors") {
  using profile::engine::import_trtllm_stat;
  {
    Scratch s("missing_rank");
    fs::rename(s.dir / "rank1.safetensors", s.dir / "rank2.safetensors");
    CHECK_THROWS_WITH(import_trtllm_stat(s.dir.string()), Catch::Contains("rank1.safetensors is missing"));
  }
  {
    Scratch s("truncated");
    auto b = s.bytes("rank1.safetensors");
    s.put("rank1.safetensors", b.substr(0, b.size() - 100));
    CHECK_THROWS_WITH(import_trtllm_stat(s.dir.string()),
                      Catch::Contains("rank1.safetensors: tensor '") && Catch::Contains("outside the"));
  }
  {
    Scratch s("header");
    auto b = s.bytes("rank0.safetensors");
    s.put("rank0.safetensors", b.substr(0, 100));
    CHECK_THROWS_WITH(import_trtllm_stat(s.dir.string()), Catch::Contains("rank0.safetensors: header size"));
  }
  {
    Scratch s("negative");
    auto b = s.bytes("rank0.safetensors");
    std::uint64_t hlen = 0;
    for (int i = 0; i < 8; ++i)
      hlen |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[static_cast<std::size_t>(i)])) << (8 * i);
    // The first tensor's first count becomes -1 (int64 little-endian).
    for (int i = 0; i < 8; ++i) b[8 + hlen + static_cast<std::size_t>(i)] = '\xff';
    s.put("rank0.safetensors", b);
    CHECK_THROWS_WITH(import_trtllm_stat(s.dir.string()), Catch::Contains("is negative (-1)"));
  }
  {
    Scratch s("shape");
    s.put("meta_info.json", R"({"num_experts": 128, "num_experts_per_token": 8})");
    CHECK_THROWS_WITH(import_trtllm_stat(s.dir.string()), Catch::Contains("shape must be [128]"));
  }
  {
    Scratch s("meta");
    s.put("meta_info.json", R"({"num_experts": 256})");
    CHECK_THROWS_WITH(import_trtllm_stat(s.dir.string()),
                      Catch::Contains("meta_info.json: \"num_experts_per_token\" missing"));
  }
  {
    // Rank 1 lacks a key rank 0 has: the header names the tensor, so drop it from the JSON.
    Scratch s("keys");
    auto b = s.bytes("rank1.safetensors");
    std::uint64_t hlen = 0;
    for (int i = 0; i < 8; ++i)
      hlen |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[static_cast<std::size_t>(i)])) << (8 * i);
    auto h = nlohmann::json::parse(b.substr(8, hlen));
    h.erase("51_60");
    std::string nh = h.dump();
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((nh.size() >> (8 * i)) & 0xff);
    s.put("rank1.safetensors", out + nh + b.substr(8 + hlen));
    CHECK_THROWS_WITH(import_trtllm_stat(s.dir.string()), Catch::Contains("has no tensor '51_60' that rank 0 has"));
  }
}

TEST_CASE("SGLang recorder dump: damaged files are clear errors") {
  namespace fs = std::filesystem;
  std::string src = kData + "/sglang-stat/expert_distribution_recorder_1763900000.123456.pt";
  std::ifstream in(src, std::ios::binary);
  std::string b{std::istreambuf_iterator<char>(in), {}};
  auto tmp = fs::temp_directory_path() / ("moe_interop_pt_" + std::to_string(::getpid()) + ".pt");
  auto put = [&](std::string const& bytes) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << bytes;
  };
  put(b.substr(0, b.size() / 2));
  CHECK_THROWS_WITH(profile::engine::import_sglang_stat(tmp.string()), Catch::Contains("not a readable zip archive"));
  put("not a zip");
  CHECK_THROWS_WITH(profile::engine::import_sglang_stat(tmp.string()), Catch::Contains("not a readable zip archive"));
  // The pickle asks for a global other than the tensor rebuild: refused, as weights_only does.
  // (Same length, so the archive stays consistent; the zip CRC then fails, which is also an error.)
  auto p = b.find("_rebuild_tensor_v2");
  REQUIRE(p != std::string::npos);
  std::string evil = b;
  evil.replace(p, 18, "_rebuild_tensor_v9");
  put(evil);
  CHECK_THROWS(profile::engine::import_sglang_stat(tmp.string()));
  fs::remove(tmp);
}

TEST_CASE("pickles: only containers, numbers, strings and tensor rebuilds are accepted") {
  using profile::torch_file::detail::Unpickler;
  auto run = [](std::string const& s) {
    std::vector<unsigned char> b(s.begin(), s.end());
    Unpickler u(b, "t.pkl");
    (void)u.run();
  };
  // {"a": (1, -2, 300)} with protocol 2 opcodes (pickletools' names in the comments).
  std::string ok(
      "\x80\x02}q\x00X\x01\x00\x00\x00"
      "a"
      "K\x01J\xfe\xff\xff\xffM\x2c\x01\x87s.",
      24);
  std::vector<unsigned char> okb(ok.begin(), ok.end());
  Unpickler u(okb, "ok.pkl");
  auto v = u.run();
  auto const& d = std::get<profile::torch_file::detail::Dict>(v->v);
  REQUIRE(d.v.size() == 1);
  auto const& t = std::get<profile::torch_file::detail::Items>(d.v[0].second->v);
  CHECK(std::get<std::int64_t>(t.v[1]->v) == -2);
  CHECK(std::get<std::int64_t>(t.v[2]->v) == 300);
  // GLOBAL os.system, REDUCE: refused (what torch.load(weights_only=True) refuses too).
  CHECK_THROWS_WITH(run(std::string("\x80\x02"
                                    "cos\nsystem\nX\x02\x00\x00\x00"
                                    "ls\x85R.",
                                    23)),
                    Catch::Contains("calls os.system") && Catch::Contains("refused"));
  // A list that holds itself (BINPUT 0, BINGET 0, APPEND): legal, and neither leaks nor recurses.
  std::string cycle(
      "\x80\x02]q\x00h\x00"
      "a.",
      9);
  std::vector<unsigned char> cb(cycle.begin(), cycle.end());
  Unpickler cu(cb, "cycle.pkl");
  auto c = cu.run();
  CHECK(std::get<profile::torch_file::detail::Items>(c->v).v.front() == c);
  // Deep nesting is only memory, bounded by the pickle's size.
  CHECK_NOTHROW(run("\x80\x02" + std::string(10000, ']') + std::string(9999, 'a') + "."));
  CHECK_THROWS_WITH(run(std::string("\x80\x02X\xff\xff\x00\x00"
                                    "ab.",
                                    10)),
                    Catch::Contains("runs past the end"));
  CHECK_THROWS_WITH(run("\x80\x02K\x01"), Catch::Contains("ends without STOP"));
  CHECK_THROWS_WITH(run("\x80\x02h\x05."), Catch::Contains("memo 5 read before it was written"));
  CHECK_THROWS_WITH(run("\x80\x02s."), Catch::Contains("underflow"));
}

TEST_CASE("vLLM routed experts: tokens x layers x top_k into a route profile") {
  namespace fs = std::filesystem;
  // Two requests (synthetic, hand-written): 2 + 1 tokens, 2 MoE layers, top-2 of 4 experts.
  std::string j = R"([{"prompt_routed_experts": [[[0,1],[2,3]], [[1,2],[0,3]]], "routed_experts": [[[3,0],[1,2]]]},
                      {"routed_experts": [[[2,1],[3,0]]]}])";
  auto tmp = fs::temp_directory_path() / ("moe_interop_vllm_" + std::to_string(::getpid()) + ".json");
  { std::ofstream(tmp) << j; }
  auto imp = profile::engine::import_vllm_routed_experts(tmp.string(), 4);
  CHECK(imp.tokens == 4);
  CHECK(imp.request_end == std::vector<long long>{3, 4});  // request 0: tokens 0..2 (prompt, then generated)
  CHECK(imp.loads.batches() == 2);
  CHECK(imp.loads.layers() == 2);
  // Request 0, layer 0: experts 0,1 | 1,2 | 3,0 -> loads 2,2,1,1; layer 1: 2,3 | 0,3 | 1,2 -> 1,1,2,2.
  CHECK(std::vector<double>(imp.loads.row(0, 0), imp.loads.row(0, 0) + 4) == std::vector<double>{2, 2, 1, 1});
  CHECK(std::vector<double>(imp.loads.row(0, 1), imp.loads.row(0, 1) + 4) == std::vector<double>{1, 1, 2, 2});
  CHECK(std::vector<double>(imp.loads.row(1, 1), imp.loads.row(1, 1) + 4) == std::vector<double>{1, 0, 0, 1});
  auto const& l1 = imp.routes.layer(1);
  CHECK(l1.rows() == 4);
  CHECK(l1.expert_load() == std::vector<std::int64_t>{2, 1, 2, 3});
  auto row = l1.find(3);
  REQUIRE(row >= 0);
  CHECK(l1.expert[static_cast<std::size_t>(l1.offsets[static_cast<std::size_t>(row)])] == 0);

  for (auto [bad, msg] : std::vector<std::pair<std::string, std::string>>{
           {R"([[[0,1],[2,3]], [[1,2]]])", "token 1: 1 layers, the first token has 2"},
           {R"([[[0,1],[2,3]], [[1,2],[0,9]]])", "token 1, layer 1: expert id 9 outside [0, 4)"},
           {R"([[[0,1],[2,3]], [[1,2],[0]]])", "token 1, layer 1: expected 2 expert ids"},
           {R"([[[0,1],[2,3]], [[1,1],[0,2]]])", "chose expert 1 twice"},
           {R"([[[0,1],[2,"3"]]])", "is not an integer"},
           {R"({"outputs": []})", "has neither \"routed_experts\""}}) {
    { std::ofstream(tmp) << bad; }
    CHECK_THROWS_WITH(profile::engine::import_vllm_routed_experts(tmp.string(), 4), Catch::Contains(msg));
  }
  fs::remove(tmp);
}
