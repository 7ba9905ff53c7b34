// SimGrid as a second judge of the traffic model (tools/include/moe_tools/simgrid_replay.hpp).
//
// Independent references: completion times worked by hand for a 2 servers x 2 GPUs cluster and a
// two-spine FatTree (bytes / bandwidth + route latency, fair share of a shared link), and per-link
// bytes from a brute-force enumeration of every simple path in the topology graph, written here.

#include <catch2/catch.hpp>

#include <simgrid/s4u.hpp>
#include <xbt/log.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "moe/plan/replica_table.hpp"
#include "moe/topology/topology.hpp"
#include "moe/topology/traffic.hpp"
#include "moe_tools/simgrid_replay.hpp"

using namespace moe;
namespace sr = moe::simgrid_replay;

namespace {

/// Per-link bytes of some demands, every pair's bytes split evenly over its shortest paths, the
/// paths found by listing every simple path between the two servers' vertices.
std::vector<double> brute_force_link_bytes(topology::Topology const& t, topology::TrafficModel const& m,
                                           std::vector<sr::Demand> const& demands) {
  int V = t.vertices();
  std::map<std::pair<int, int>, int> index;  // (from, to) -> model link
  for (int i = 0; i < m.links(); ++i) {
    auto key = std::make_pair(m.link(i).from, m.link(i).to);
    REQUIRE(index.count(key) == 0);  // the builders make no parallel links
    index[key] = i;
  }
  std::vector<double> out(static_cast<std::size_t>(m.links()), 0.0);
  for (auto const& d : demands) {
    int sa = t.server_vertex(t.server_of(d.src)), sb = t.server_vertex(t.server_of(d.dst));
    out[static_cast<std::size_t>(index.at({V + d.src, sa}))] += d.bytes;
    out[static_cast<std::size_t>(index.at({sb, V + d.dst}))] += d.bytes;
    if (sa == sb) continue;
    std::vector<std::vector<int>> all;
    std::vector<int> path{sa};
    std::vector<char> on(static_cast<std::size_t>(V), 0);
    on[static_cast<std::size_t>(sa)] = 1;
    std::function<void(int)> dfs = [&](int v) {
      if (v == sb) {
        all.push_back(path);
        return;
      }
      for (int w : t.neighbors(v)) {
        if (on[static_cast<std::size_t>(w)]) continue;
        on[static_cast<std::size_t>(w)] = 1;
        path.push_back(w);
        dfs(w);
        path.pop_back();
        on[static_cast<std::size_t>(w)] = 0;
      }
    };
    dfs(sa);
    std::size_t shortest = SIZE_MAX;
    for (auto const& p : all) shortest = std::min(shortest, p.size());
    double n = static_cast<double>(std::count_if(all.begin(), all.end(), [&](auto const& p) { return p.size() == shortest; }));
    for (auto const& p : all)
      if (p.size() == shortest)
        for (std::size_t i = 0; i + 1 < p.size(); ++i) out[static_cast<std::size_t>(index.at({p[i], p[i + 1]}))] += d.bytes / n;
  }
  return out;
}

/// The traffic model's own per-link bytes for the same demands (TrafficModel::shares).
std::vector<double> model_link_bytes(topology::TrafficModel const& m, std::vector<sr::Demand> const& demands) {
  std::vector<double> out(static_cast<std::size_t>(m.links()), 0.0);
  for (auto const& d : demands)
    for (auto [link, fraction] : m.shares(d.src, d.dst)) out[static_cast<std::size_t>(link)] += d.bytes * fraction;
  return out;
}

struct Cluster {
  char const* name;
  topology::Topology topo;
};

std::vector<Cluster> small_clusters() {
  return {{"fat_tree 3x2x2, 2 spines", topology::fat_tree(3, 2, 2, 2)},
          {"fat_tree 2x1x1, 4 spines", topology::fat_tree(2, 1, 1, 4)},
          {"fat_tree_sparse 4x1x2, pods of 2", topology::fat_tree_sparse(4, 1, 2, 2)},
          {"dragonfly 6x1x2, 3 groups", topology::dragonfly(6, 1, 2, 3)},
          {"dragonfly 8x1x1, 2 groups", topology::dragonfly(8, 1, 1, 2)},
          {"dragonfly_sparse 8x1x1, 4 groups", topology::dragonfly_sparse(8, 1, 1, 4)}};
}

}  // namespace

TEST_CASE("simgrid replay: the platform's routes carry the model's per-link bytes", "[simgrid]") {
  std::mt19937_64 rng(3);
  for (auto const& c : small_clusters()) {
    INFO(c.name);
    topology::TrafficModel model(c.topo);
    sr::Routes routes(model, c.topo);
    int G = c.topo.gpus();
    // Every ordered pair, a random whole number of 720720-byte units (divisible by 1 .. 16, so an
    // even split over up to 16 paths is exact in whole bytes).
    std::vector<sr::Demand> demands;
    std::uniform_int_distribution<int> units(0, 5);
    for (int a = 0; a < G; ++a)
      for (int b = 0; b < G; ++b)
        if (a != b) demands.push_back({a, b, 720720.0 * units(rng)});
    auto reference = brute_force_link_bytes(c.topo, model, demands);
    auto platform = routes.link_bytes(routes.sub_flows(demands));
    auto modelled = model_link_bytes(model, demands);
    for (int i = 0; i < model.links(); ++i) {
      INFO("link " << i << " " << model.link(i).from << " -> " << model.link(i).to);
      CHECK(platform[static_cast<std::size_t>(i)] == reference[static_cast<std::size_t>(i)]);
      CHECK(modelled[static_cast<std::size_t>(i)] == Approx(reference[static_cast<std::size_t>(i)]).epsilon(1e-12).margin(1e-6));
    }
  }
}

TEST_CASE("simgrid replay: pair_demand reproduces the model's batch evaluation", "[simgrid]") {
  // A layer with some experts on two GPUs (replication::Table's rule: own GPU first, then spread),
  // a batch from every GPU; the per-pair demands taken from the model, split over the paths, must
  // give back the model's per-link dispatch and combine bytes.
  std::mt19937_64 rng(5);
  for (auto const& c : small_clusters()) {
    INFO(c.name);
    topology::TrafficModel model(c.topo);
    sr::Routes routes(model, c.topo);
    int G = c.topo.gpus(), E = 2 * G, k = 3, T = 37 * G;
    std::vector<std::vector<int>> copies(static_cast<std::size_t>(E));
    std::vector<int> primary(static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e) {
      primary[static_cast<std::size_t>(e)] = e % G;
      copies[static_cast<std::size_t>(e)] = {e % G};
      if (e % 3 == 0 && G > 1) copies[static_cast<std::size_t>(e)].push_back((e + 1 + e / G) % G);
    }
    replication::Table table(copies);
    std::vector<int> ranks(static_cast<std::size_t>(G));
    for (int g = 0; g < G; ++g) ranks[static_cast<std::size_t>(g)] = g;
    topology::Batch batch;
    batch.top_k = k;
    batch.source = topology::spread_tokens(T, ranks);
    std::vector<int> ex(static_cast<std::size_t>(E));
    for (int t = 0; t < T; ++t) {
      for (int e = 0; e < E; ++e) ex[static_cast<std::size_t>(e)] = e;
      std::shuffle(ex.begin(), ex.end(), rng);
      batch.experts.insert(batch.experts.end(), ex.begin(), ex.begin() + k);
    }
    topology::TrafficOptions to;
    to.hidden = 2520;  // 5040 bytes a token: divisible by 1 .. 10
    auto eval = [&](topology::Batch const& b, long long first) { return model.evaluate_policy(table, primary, b, to, first); };
    auto report = eval(batch, 0);
    auto demands = sr::pair_demand(model, batch, eval);
    auto dispatch = routes.link_bytes(routes.sub_flows(demands));
    auto combine = routes.link_bytes(routes.sub_flows(sr::reversed(demands)));
    auto reference = brute_force_link_bytes(c.topo, model, demands);
    for (int i = 0; i < model.links(); ++i) {
      INFO("link " << i);
      CHECK(dispatch[static_cast<std::size_t>(i)] == Approx(report.dispatch_bytes[static_cast<std::size_t>(i)]).margin(1e-6));
      CHECK(combine[static_cast<std::size_t>(i)] == Approx(report.combine_bytes[static_cast<std::size_t>(i)]).margin(1e-6));
      CHECK(dispatch[static_cast<std::size_t>(i)] == reference[static_cast<std::size_t>(i)]);
    }
  }
}

TEST_CASE("simgrid replay: completion times worked by hand", "[simgrid]") {
  // One Engine per process; every simulation of this file runs in this test case's one actor.
  xbt_log_control_set("root.threshold:warning");
  simgrid::s4u::Engine engine("test_simgrid");
  sr::default_network_config();
  // Actors on threads rather than switched stacks, which sanitizer builds would misread.
  simgrid::s4u::Engine::set_config("contexts/factory:thread");
  auto* root = simgrid::s4u::create_full_zone("root");

  // 2 servers x 2 GPUs on one leaf. NVLink 100 GB/s, 1 us; NIC 10 GB/s per GPU (a server link: 20
  // GB/s), 2 us. GPU 0 -> GPU 2: up (1 us), server 0 -> leaf (2 us), leaf -> server 1 (2 us), down
  // (1 us): 6 us of latency, 20 GB/s at most.
  auto small = topology::fat_tree(1, 2, 2, 1);
  topology::LinkParams p;
  p.nvlink = {100e9, 1e-6};
  p.nic = {10e9, 2e-6};
  p.fabric = {100e9, 1e-6};
  small.set_link_params(p);
  topology::TrafficModel small_model(small);
  sr::Routes small_routes(small_model, small);
  sr::Platform small_platform(root, "small", small_routes);

  // 2 leaves x 1 server x 2 GPUs, 2 spines, fabric 5 GB/s per link (the bottleneck), 1 us; NIC 50
  // GB/s per GPU. GPU 0 -> GPU 2 has two shortest paths, one per spine, each with 8 us of latency.
  auto wide = topology::fat_tree(2, 1, 2, 2);
  p.nic = {50e9, 2e-6};
  p.fabric = {5e9, 1e-6};
  wide.set_link_params(p);
  topology::TrafficModel wide_model(wide);
  sr::Routes wide_routes(wide_model, wide);
  sr::Platform wide_platform(root, "wide", wide_routes);
  root->seal();

  std::map<std::string, double> got;
  std::vector<double> ends_unequal;
  simgrid::s4u::Actor::create("replay", small_platform.host(0, 0), [&] {
    auto run = [&](sr::Platform const& pl, std::vector<sr::Demand> d, bool split = true,
                   std::vector<double>* ends = nullptr) {
      auto f = pl.routes().sub_flows(d, split);
      return pl.replay(f, ends) * 1e6;
    };
    got["one flow"] = run(small_platform, {{0, 2, 1e6}});
    got["two flows, one link"] = run(small_platform, {{0, 2, 1e6}, {1, 3, 1e6}});
    got["two flows, unequal"] = run(small_platform, {{0, 2, 1e6}, {1, 3, 3e6}}, true, &ends_unequal);
    got["inside a server"] = run(small_platform, {{0, 1, 1e6}});
    got["two spines, split"] = run(wide_platform, {{0, 2, 1e6}});
    got["two spines, one path"] = run(wide_platform, {{0, 2, 1e6}}, false);
  });
  engine.run();

  // 1 MB at 20 GB/s = 50 us, + 6 us.
  CHECK(got["one flow"] == Approx(56.0).epsilon(1e-9));
  // Two flows share server 0's link (and server 1's) fairly: 2 MB at 20 GB/s = 100 us, + 6 us.
  CHECK(got["two flows, one link"] == Approx(106.0).epsilon(1e-9));
  // Fair share 10 GB/s each until the 1 MB flow ends (6 + 100 us); then the other, 2 MB left, gets
  // all 20 GB/s (100 us more): 206 us.
  REQUIRE(ends_unequal.size() == 2);
  CHECK(ends_unequal[0] * 1e6 == Approx(106.0).epsilon(1e-9));
  CHECK(ends_unequal[1] * 1e6 == Approx(206.0).epsilon(1e-9));
  CHECK(got["two flows, unequal"] == Approx(206.0).epsilon(1e-9));
  // Two NVLink links: 1 MB at 100 GB/s = 10 us, + 2 us.
  CHECK(got["inside a server"] == Approx(12.0).epsilon(1e-9));
  // Half a MB over each spine at 5 GB/s = 100 us, + 8 us; all of it over one spine takes twice as
  // long. The traffic model says 108 us too: its bottleneck is a spine link (0.5 MB / 5 GB/s) plus
  // the 8 us path latency.
  CHECK(got["two spines, split"] == Approx(108.0).epsilon(1e-9));
  CHECK(got["two spines, one path"] == Approx(208.0).epsilon(1e-9));
  std::vector<sr::Demand> one{{0, 2, 1e6}};
  double modelled = 0;
  for (auto [link, fraction] : wide_model.shares(0, 2))
    modelled = std::max(modelled, 1e6 * fraction / wide_model.link(link).bandwidth);
  CHECK((modelled + wide_model.path_latency(0, 2)) * 1e6 == Approx(108.0).epsilon(1e-9));
}
