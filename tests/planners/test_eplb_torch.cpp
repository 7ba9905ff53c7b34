// EPLB port against DeepSeek's eplb.py itself: tests/data/eplb-torch/cases.json holds 96 cases
// (weights, and the phy2log / log2phy / logcnt that eplb.py returned under torch on CPU), many with
// tied loads. Every case must come out identical, slot for slot.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/replication/eplb.hpp"

using namespace moe::replication;
using nlohmann::json;

namespace {
json load_cases() {
  std::ifstream f(std::string(MOE_SHARED_DATA_DIR) + "/eplb-torch/cases.json");
  REQUIRE(f.is_open());
  return json::parse(f);
}
}  // namespace

TEST_CASE("EPLB port matches eplb.py (torch, CPU) on all 96 recorded cases", "[eplb][torch]") {
  json doc = load_cases();
  auto const& cases = doc.at("cases");
  REQUIRE(cases.size() == 96);
  int matched = 0, hierarchical = 0, global = 0;
  for (auto const& c : cases) {
    int L = c.at("layers"), E = c.at("experts"), R = c.at("num_replicas"), groups = c.at("num_groups"),
        nodes = c.at("num_nodes"), gpus = c.at("num_gpus");
    eplb::Matrix<float> w(L, E);
    for (int l = 0; l < L; ++l)
      for (int e = 0; e < E; ++e) w(l, e) = c.at("weight").at(l).at(e).get<float>();
    auto r = eplb::rebalance_experts(w, R, groups, nodes, gpus);
    (groups % nodes == 0 ? hierarchical : global) += 1;
    bool same_p = true, same_c = true, same_l = true;
    for (int l = 0; l < L; ++l) {
      same_p = same_p && r.phy2log.row(l) == c.at("phy2log").at(l).get<std::vector<int>>();
      same_c = same_c && r.logcnt.row(l) == c.at("logcnt").at(l).get<std::vector<int>>();
      for (int e = 0; e < E; ++e) {
        auto want = c.at("log2phy").at(l).at(e).get<std::vector<int>>();
        auto got = r.log2phy[static_cast<std::size_t>(l)][static_cast<std::size_t>(e)];
        got.resize(want.size(), -1);  // eplb.py pads every expert's list with -1 to the widest
        same_l = same_l && got == want;
      }
    }
    bool same = same_p && same_c && same_l;
    INFO("case " << c.at("config").get<std::string>() << " / " << c.at("distribution").get<std::string>()
                 << " seed " << c.at("seed").get<int>() << ": phy2log " << same_p << " logcnt " << same_c
                 << " log2phy " << same_l);
    CHECK(same);
    matched += same;
  }
  WARN("EPLB: " << matched << " of " << cases.size() << " cases match eplb.py (" << hierarchical
                << " hierarchical, " << global << " global)");
  CHECK(matched == 96);
  CHECK(hierarchical > 0);
  CHECK(global > 0);
}
