// Hardware presets (moe/topology/presets.hpp) against the published numbers, written here from the
// sources (the DeepSeek-V3 report and its ISCA 2025 companion for H800; NVIDIA's DGX H100, DGX H200,
// GB200 NVL72 and DGX SuperPOD documents), not read from the header: bandwidths in the units the
// documents use (GB/s bidirectional for NVLink, Gb/s for NICs), converted here by hand.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "moe/topology/presets.hpp"
#include "moe/topology/traffic.hpp"

using namespace moe::topology;
using Catch::Contains;

namespace {

struct Published {
  std::string name;
  int gpus_per_server;      // GPUs in one NVLink domain
  double nvlink_bidir_GBs;  // per GPU, both directions together, GB/s
  double nic_Gbs;           // per GPU, one direction, Gb/s
  int servers_per_leaf;     // servers a rail leaf serves (half of a 64-port switch; the SU size)
  int default_servers;      // the deployment the preset describes
};

// H800: 8 GPUs per node, NVLink 400 GB/s, 8 x 400 Gb/s ConnectX-7 per node, two-layer fat-tree of
// 64-port switches (32 down per leaf), 40-node decoding unit. DGX H100 / H200: 8 GPUs, NVLink 4 at
// 900 GB/s, 8 x 400 Gb/s ConnectX-7, SuperPOD scalable unit of 32 nodes. GB200 NVL72: 72 GPUs per
// rack, NVLink 5 at 1.8 TB/s, 72 x 400 Gb/s ConnectX-7 per rack, scalable unit of 8 racks.
std::vector<Published> const kPublished = {
    {"h800", 8, 400, 400, 32, 40},
    {"dgx-h100", 8, 900, 400, 32, 32},
    {"dgx-h200", 8, 900, 400, 32, 32},
    {"gb200-nvl72", 72, 1800, 400, 8, 8},
};

constexpr double kTokenBytes = 7168 * 2;  // TrafficOptions{} : DeepSeek hidden size, BF16

/// One token from `src` to `dst` per entry (one expert per destination, one copy each).
TrafficReport send(TrafficModel const& m, std::vector<std::pair<int, int>> const& flows) {
  moe::replication::CopyLists c;  // first starts as {0}
  Batch b;
  b.top_k = 1;
  for (auto [src, dst] : flows) {
    c.ranks.push_back(dst);
    c.first.push_back(static_cast<int>(c.ranks.size()));
    b.source.push_back(src);
    b.experts.push_back(static_cast<int>(c.ranks.size()) - 1);
  }
  return m.evaluate(equal_shares(c), b, TrafficOptions{});
}

}  // namespace

TEST_CASE("presets: every value matches the published figure") {
  std::vector<std::string> names;
  for (auto n : preset_names()) names.emplace_back(n);
  std::vector<std::string> expected;
  for (auto const& e : kPublished) expected.push_back(e.name);
  CHECK(names == expected);

  for (auto const& e : kPublished) {
    INFO(e.name);
    auto const& p = preset(e.name);
    CHECK(p.gpus_per_server == e.gpus_per_server);
    CHECK(p.servers_per_leaf == e.servers_per_leaf);
    CHECK(p.default_servers == e.default_servers);
    // Per direction: half the bidirectional GB/s; a NIC's Gb/s over 8 bits per byte.
    CHECK(p.links.nvlink.bandwidth == Approx(e.nvlink_bidir_GBs * 1e9 / 2).epsilon(1e-12));
    CHECK(p.links.nic.bandwidth == Approx(e.nic_Gbs * 1e9 / 8).epsilon(1e-12));
    // Non-blocking leaves: the spine bundles together carry what a full leaf's NICs send.
    CHECK(p.links.fabric.bandwidth * p.spines ==
          Approx(e.servers_per_leaf * e.gpus_per_server * e.nic_Gbs * 1e9 / 8).epsilon(1e-12));
    // No source gives latencies: the library defaults.
    CHECK(p.links.nvlink.latency == LinkParams{}.nvlink.latency);
    CHECK(p.links.nic.latency == LinkParams{}.nic.latency);
    CHECK(p.links.fabric.latency == LinkParams{}.fabric.latency);
  }
  // The numbers written out once, as the documents give them in bytes per second per direction.
  CHECK(preset("h800").links.nvlink.bandwidth == Approx(200e9));
  CHECK(preset("dgx-h100").links.nvlink.bandwidth == Approx(450e9));
  CHECK(preset("gb200-nvl72").links.nvlink.bandwidth == Approx(900e9));
  CHECK(preset("gb200-nvl72").links.nic.bandwidth == Approx(50e9));
  // DGX H200 differs from DGX H100 only in what the traffic model does not see (HBM).
  CHECK(preset("dgx-h200").links == preset("dgx-h100").links);
}

TEST_CASE("presets: cluster shapes") {
  // H800, 40 nodes: leaf 0 holds nodes 0-31, leaf 1 nodes 32-39, two spine bundles.
  auto h800 = preset_topology("h800");
  CHECK(h800.gpus() == 320);
  CHECK(h800.servers() == 40);
  CHECK(h800.vertices() == 40 + 2 + 2);
  CHECK(h800.hops(0, 7) == 0);        // one node
  CHECK(h800.hops(0, 8) == 2);        // node 0 -> leaf 0 -> node 1
  CHECK(h800.hops(0, 31 * 8) == 2);   // node 31, still leaf 0
  CHECK(h800.hops(0, 32 * 8) == 4);   // node 32, over a spine
  CHECK(h800.link_params() == preset("h800").links);

  // One scalable unit is one leaf: every pair of nodes 2 hops apart, no spines.
  auto dgx = preset_topology("dgx-h100");
  CHECK(dgx.gpus() == 256);
  CHECK(dgx.vertices() == 32 + 1);
  CHECK(dgx.hops(0, 255) == 2);
  // NAME:SERVERS: 33 nodes need a second leaf.
  auto dgx33 = preset_topology("dgx-h200:33");
  CHECK(dgx33.gpus() == 264);
  CHECK(dgx33.vertices() == 33 + 2 + 2);
  CHECK(dgx33.hops(0, 32 * 8) == 4);

  auto nvl = preset_topology("gb200-nvl72");
  CHECK(nvl.gpus() == 576);
  CHECK(nvl.servers() == 8);
  CHECK(nvl.hops(0, 71) == 0);  // one rack: one NVLink domain
  CHECK(nvl.hops(0, 72) == 2);
  CHECK(preset_topology("gb200-nvl72:1").gpus() == 72);
}

TEST_CASE("presets: the bandwidths reach the traffic model's links") {
  for (auto const& e : kPublished) {
    INFO(e.name);
    auto t = preset_topology(e.name);
    TrafficModel m(t);
    int leaves = (e.default_servers + e.servers_per_leaf - 1) / e.servers_per_leaf;
    int spines = leaves > 1 ? preset(e.name).spines : 0;
    std::map<Level, int> count;
    for (int i = 0; i < m.links(); ++i) {
      auto const& l = m.link(i);
      ++count[l.level];
      if (l.level == Level::nvlink) CHECK(l.bandwidth == Approx(e.nvlink_bidir_GBs * 1e9 / 2));
      // A server's uplink: one NIC per GPU of the server.
      if (l.level == Level::nic) CHECK(l.bandwidth == Approx(e.gpus_per_server * e.nic_Gbs * 1e9 / 8));
      if (l.level == Level::fabric)
        CHECK(l.bandwidth == Approx(e.servers_per_leaf * e.gpus_per_server * e.nic_Gbs * 1e9 / 8 / spines));
    }
    CHECK(count[Level::nvlink] == 2 * e.default_servers * e.gpus_per_server);  // up and down per GPU
    CHECK(count[Level::nic] == 2 * e.default_servers);
    CHECK(count[Level::fabric] == 2 * leaves * spines);
  }
}

TEST_CASE("presets: transfer times from the published bandwidths") {
  // DGX H100, two nodes: one token from GPU 0 to GPU 8 crosses NVLink (450 GB/s), the node's
  // uplink (8 x 50 GB/s) and back; the uplink is the slowest: 14336 B / 400 GB/s. Path latency:
  // NVLink 1 + NIC 2 + NIC 2 + NVLink 1 us.
  {
    TrafficModel m(preset_topology("dgx-h100:2"));
    auto r = send(m, {{0, 8}});
    CHECK(r.dispatch_transfer == Approx(kTokenBytes / 400e9));
    CHECK(r.dispatch_time == Approx(kTokenBytes / 400e9 + 6e-6));
    // All 8 GPUs of node 0 send a token each: 8 tokens share the 400 GB/s uplink.
    std::vector<std::pair<int, int>> all;
    for (int g = 0; g < 8; ++g) all.push_back({g, 8 + g});
    CHECK(send(m, all).dispatch_transfer == Approx(8 * kTokenBytes / 400e9));
  }
  // H800: the GPU's own NVLink (200 GB/s per direction) is now slower than its node's uplink
  // (400 GB/s); between leaves the path adds two fabric hops (1 us each): 8 us.
  {
    TrafficModel m(preset_topology("h800"));
    auto r = send(m, {{0, 32 * 8}});
    CHECK(r.dispatch_transfer == Approx(kTokenBytes / 200e9));
    CHECK(r.dispatch_time == Approx(kTokenBytes / 200e9 + 8e-6));
  }
  // GB200 NVL72: GPUs 0 and 71 share a rack: NVLink 5 only, 900 GB/s, 2 us.
  {
    TrafficModel m(preset_topology("gb200-nvl72:2"));
    auto r = send(m, {{0, 71}});
    CHECK(r.dispatch_transfer == Approx(kTokenBytes / 900e9));
    CHECK(r.dispatch_time == Approx(kTokenBytes / 900e9 + 2e-6));
    // Across racks the rack's uplink is 72 x 50 GB/s = 3.6 TB/s, so the GPU's 900 GB/s NVLink
    // still limits one token.
    CHECK(send(m, {{0, 72}}).dispatch_transfer == Approx(kTokenBytes / 900e9));
  }
}

TEST_CASE("presets: bad names and sizes are named") {
  CHECK_THROWS_WITH(preset("dgx-h300"), Contains("unknown hardware preset 'dgx-h300'") &&
                                             Contains("known: h800, dgx-h100, dgx-h200, gb200-nvl72"));
  CHECK_THROWS_WITH(preset_topology(""), Contains("unknown hardware preset ''"));
  CHECK_THROWS_WITH(preset_topology("H800"), Contains("unknown hardware preset 'H800'"));
  CHECK_THROWS_WITH(preset_topology("h800:0"), Contains("h800:0") && Contains("outside [1, 512]"));
  CHECK_THROWS_WITH(preset_topology("h800:"), Contains("is not an integer"));
  CHECK_THROWS_WITH(preset_topology("h800:4x"), Contains("'4x' is not an integer"));
  // 4096 GPUs at most: 56 racks of 72.
  CHECK_THROWS_WITH(preset_topology("gb200-nvl72:57"), Contains("outside [1, 56]"));
  CHECK(preset_topology("gb200-nvl72:56").gpus() == 56 * 72);
  CHECK_THROWS_WITH(preset("h800").topology(-1), Contains("server count must be in [1, 512]") && Contains("got -1"));
}
