#pragma once
// A second judge for the traffic model (moe/topology/traffic.hpp): the same cluster as a SimGrid
// platform, and one layer's dispatch or combine replayed on it as concurrent flows.
//
// The platform. One SimGrid link per directed link of the traffic model (same index, bandwidth and
// latency, SHARED policy: its bandwidth is shared among the flows crossing it), so the GPU NVLink
// links, the server NIC links (nic bandwidth x GPUs of the server) and the switch-to-switch links
// are the model's. SimGrid routes one fixed path per pair of hosts, while the model splits a GPU
// pair's bytes evenly over every shortest path. To keep the split, every GPU is P hosts ("ports"),
// P being the most shortest paths between two servers: the route from port i of GPU a to port i
// of GPU b is the i-th shortest path between their servers (GPU a's up link, the topology links,
// GPU b's down link); a pair with n paths sends n sub-flows of bytes / n over ports 0 .. n - 1.
// Routes are explicit (a full zone per cluster); servers and switches are not SimGrid objects,
// only the links between them. Routes (no SimGrid object) holds the paths and cuts demands into
// sub-flows; Platform makes the SimGrid zone, hosts, links and routes from it and replays flows.
//
// The demand. pair_demand() asks the traffic model itself what one layer's batch sends between
// every GPU pair (de-duplicated per token and destination as moe::Layer does): it evaluates each
// run of tokens that share a source GPU on its own (with the run's first token index, so a replica
// policy sees the same token numbers) and reads each GPU's received bytes off its NVLink down link.
// Combine is the same bytes in the opposite direction.
//
// What SimGrid adds over the model: flows share links (max-min fairness, in the CM02 model
// weighted by each flow's route latency), each flow pays its route latency before it moves, and
// the phase ends when its last flow ends; the model's bottleneck time is max over links of
// bytes / bandwidth plus the largest path latency.
//
// Needs SimGrid (Debian libsimgrid-dev); every s4u call must run after the Engine is built, and
// every platform must be built before Engine::run().

#include <simgrid/s4u.hpp>
#include <xbt/config.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "moe/config.hpp"
#include "moe/topology/traffic.hpp"

namespace moe::simgrid_replay {

/// Bytes that GPU src sends to GPU dst (src != dst) in one phase.
struct Demand {
  int src = 0, dst = 0;
  double bytes = 0;
};

/// The model's per-pair dispatch bytes of one layer's batch (see the header comment). `eval(block,
/// first_token)` must return the traffic model's report for the tokens of `block`, numbered from
/// `first_token` in the whole batch (e.g. TrafficModel::evaluate_policy with that first_token).
template <class Evaluate>
std::vector<Demand> pair_demand(topology::TrafficModel const& model, topology::Batch const& batch, Evaluate&& eval) {
  int G = model.gpus(), V = model.vertices();
  std::vector<int> down(static_cast<std::size_t>(G), -1);
  for (int i = 0; i < model.links(); ++i)
    if (model.link(i).to >= V) down[static_cast<std::size_t>(model.link(i).to - V)] = i;
  std::vector<double> per_dst(static_cast<std::size_t>(G) * static_cast<std::size_t>(G), 0.0);
  int T = batch.tokens(), k = batch.top_k;
  for (int lo = 0; lo < T;) {
    int src = batch.source[static_cast<std::size_t>(lo)];
    check(src >= 0 && src < G, "simgrid replay: token ", lo, " comes from GPU ", src, ", outside [0, ", G, ")");
    int hi = lo + 1;
    while (hi < T && batch.source[static_cast<std::size_t>(hi)] == src) ++hi;
    topology::Batch block;
    block.top_k = k;
    block.source.assign(static_cast<std::size_t>(hi - lo), src);
    block.experts.assign(batch.experts.begin() + static_cast<long>(lo) * k, batch.experts.begin() + static_cast<long>(hi) * k);
    topology::TrafficReport r = eval(block, static_cast<long long>(lo));
    for (int g = 0; g < G; ++g)
      if (g != src)
        per_dst[static_cast<std::size_t>(src) * static_cast<std::size_t>(G) + static_cast<std::size_t>(g)] +=
            r.dispatch_bytes[static_cast<std::size_t>(down[static_cast<std::size_t>(g)])];
    lo = hi;
  }
  std::vector<Demand> out;
  for (int a = 0; a < G; ++a)
    for (int b = 0; b < G; ++b) {
      double x = per_dst[static_cast<std::size_t>(a) * static_cast<std::size_t>(G) + static_cast<std::size_t>(b)];
      if (x > 0) out.push_back({a, b, x});
    }
  return out;
}

/// The same demands in the opposite direction (combine: every expert GPU returns what it got).
inline std::vector<Demand> reversed(std::span<Demand const> d) {
  std::vector<Demand> out;
  out.reserve(d.size());
  for (auto const& x : d) out.push_back({x.dst, x.src, x.bytes});
  return out;
}

/// Every shortest path between two servers of the model's network, each a list of directed link
/// indices (topology links only, no NVLink), in a fixed order.
class ServerPaths {
 public:
  /// Most shortest paths kept per server pair; more is an error (the platform has a port per path).
  static constexpr int max_paths = 64;

  ServerPaths(topology::TrafficModel const& model, topology::Topology const& topo) : S_(topo.servers()) {
    int V = model.vertices();
    std::vector<std::vector<int>> out(static_cast<std::size_t>(V));
    for (int i = 0; i < model.links(); ++i)
      if (model.link(i).from < V && model.link(i).to < V) out[static_cast<std::size_t>(model.link(i).from)].push_back(i);
    auto bfs = [&](int from) {
      std::vector<int> d(static_cast<std::size_t>(V), -1);
      std::vector<int> q{from};
      d[static_cast<std::size_t>(from)] = 0;
      for (std::size_t i = 0; i < q.size(); ++i)
        for (int li : out[static_cast<std::size_t>(q[i])]) {
          int w = model.link(li).to;
          if (d[static_cast<std::size_t>(w)] < 0) {
            d[static_cast<std::size_t>(w)] = d[static_cast<std::size_t>(q[i])] + 1;
            q.push_back(w);
          }
        }
      return d;
    };
    std::vector<std::vector<int>> dist(static_cast<std::size_t>(S_));  // from each server (links are symmetric)
    for (int s = 0; s < S_; ++s) dist[static_cast<std::size_t>(s)] = bfs(topo.server_vertex(s));
    paths_.resize(static_cast<std::size_t>(S_) * static_cast<std::size_t>(S_));
    std::vector<int> stack;
    for (int a = 0; a < S_; ++a)
      for (int b = 0; b < S_; ++b) {
        if (a == b) continue;
        auto const& da = dist[static_cast<std::size_t>(a)];
        auto const& db = dist[static_cast<std::size_t>(b)];
        int target = topo.server_vertex(b);
        auto& list = paths_[static_cast<std::size_t>(a) * static_cast<std::size_t>(S_) + static_cast<std::size_t>(b)];
        // Depth-first over links that go one step further from a and one step closer to b.
        auto walk = [&](auto&& self, int v) -> void {
          if (v == target) {
            check(static_cast<int>(list.size()) < max_paths, "simgrid replay: more than ", max_paths,
                  " shortest paths between servers '", topo.server_name(a), "' and '", topo.server_name(b), "'");
            list.push_back(stack);
            return;
          }
          for (int li : out[static_cast<std::size_t>(v)]) {
            int w = model.link(li).to;
            if (da[static_cast<std::size_t>(w)] != da[static_cast<std::size_t>(v)] + 1 ||
                db[static_cast<std::size_t>(w)] != db[static_cast<std::size_t>(v)] - 1)
              continue;
            stack.push_back(li);
            self(self, w);
            stack.pop_back();
          }
        };
        walk(walk, topo.server_vertex(a));
        most_ = std::max(most_, static_cast<int>(list.size()));
      }
  }

  [[nodiscard]] std::vector<std::vector<int>> const& between(int server_a, int server_b) const {
    return paths_[static_cast<std::size_t>(server_a) * static_cast<std::size_t>(S_) + static_cast<std::size_t>(server_b)];
  }
  /// Most shortest paths between two servers (1 when there is one server).
  [[nodiscard]] int most() const { return most_; }

 private:
  int S_ = 0, most_ = 1;
  std::vector<std::vector<std::vector<int>>> paths_;
};

/// One sub-flow: `bytes` from port `port` of GPU src to the same port of GPU dst, over the port-th
/// shortest path between them (Routes::for_each_path).
struct SubFlow {
  int src = 0, dst = 0, port = 0;
  std::uint64_t bytes = 0;
};

/// The paths of every GPU pair and the sub-flows of a set of demands (no SimGrid object: what the
/// platform's routes will be).
class Routes {
 public:
  Routes(topology::TrafficModel const& model, topology::Topology const& topo)
      : model_(&model), topo_(&topo), paths_(model, topo) {
    int G = model.gpus(), V = model.vertices();
    up_.assign(static_cast<std::size_t>(G), -1);
    down_.assign(static_cast<std::size_t>(G), -1);
    for (int i = 0; i < model.links(); ++i) {
      auto const& l = model.link(i);
      if (l.from >= V) up_[static_cast<std::size_t>(l.from - V)] = i;
      if (l.to >= V) down_[static_cast<std::size_t>(l.to - V)] = i;
    }
  }

  [[nodiscard]] topology::TrafficModel const& model() const { return *model_; }
  /// Hosts per GPU: the most shortest paths between two servers.
  [[nodiscard]] int ports() const { return paths_.most(); }

  /// Calls f(links) for each path GPU a -> GPU b (a != b) in port order: model link indices, NVLink
  /// up and down links included.
  template <class F>
  void for_each_path(int a, int b, F&& f) const {
    int sa = topo_->server_of(a), sb = topo_->server_of(b);
    std::vector<int> links;
    if (sa == sb) {
      links = {up_[static_cast<std::size_t>(a)], down_[static_cast<std::size_t>(b)]};
      f(links);
      return;
    }
    for (auto const& p : paths_.between(sa, sb)) {
      links.assign(1, up_[static_cast<std::size_t>(a)]);
      links.insert(links.end(), p.begin(), p.end());
      links.push_back(down_[static_cast<std::size_t>(b)]);
      f(links);
    }
  }

  /// The sub-flows of some demands: n per pair with n shortest paths, bytes split evenly (rounded
  /// to whole bytes, the last sub-flow taking the remainder). `split = false` sends each pair's
  /// bytes over its first path only (one path per pair, as SimGrid would route it by itself).
  [[nodiscard]] std::vector<SubFlow> sub_flows(std::span<Demand const> demands, bool split = true) const {
    std::vector<SubFlow> out;
    for (auto const& d : demands) {
      check(d.src != d.dst && d.src >= 0 && d.dst >= 0 && d.src < model_->gpus() && d.dst < model_->gpus(),
            "simgrid replay: bad demand ", d.src, " -> ", d.dst);
      check(std::isfinite(d.bytes) && d.bytes >= 0, "simgrid replay: demand ", d.src, " -> ", d.dst, " of ", d.bytes,
            " bytes");
      auto total = static_cast<std::uint64_t>(std::llround(d.bytes));
      if (total == 0) continue;
      int n = 0;
      for_each_path(d.src, d.dst, [&](std::vector<int> const&) { ++n; });
      if (!split) n = 1;
      std::uint64_t each = total / static_cast<std::uint64_t>(n);
      for (int i = 0; i < n; ++i)
        out.push_back({d.src, d.dst, i, i + 1 < n ? each : total - each * static_cast<std::uint64_t>(n - 1)});
    }
    return out;
  }

  /// Calls f(links) with the path of one sub-flow.
  template <class F>
  void path_of(SubFlow const& s, F&& f) const {
    int n = 0;
    for_each_path(s.src, s.dst, [&](std::vector<int> const& links) {
      if (n++ == s.port) f(links);
    });
  }

  /// Bytes every model link carries under these sub-flows (indexed as TrafficModel::link).
  [[nodiscard]] std::vector<double> link_bytes(std::span<SubFlow const> flows) const {
    std::vector<double> out(static_cast<std::size_t>(model_->links()), 0.0);
    for (auto const& f : flows)
      path_of(f, [&](std::vector<int> const& links) {
        for (int li : links) out[static_cast<std::size_t>(li)] += static_cast<double>(f.bytes);
      });
    return out;
  }

 private:
  topology::TrafficModel const* model_;
  topology::Topology const* topo_;
  ServerPaths paths_;
  std::vector<int> up_, down_;
};

/// The SimGrid platform of one cluster (see the header comment).
class Platform {
 public:
  /// Builds the hosts, links and routes of `routes` in a new full zone named `name` under `parent`
  /// (nullptr: the zone is the root) and seals it. Only GPU pairs for which `wanted(a, b)` is true
  /// get routes (all pairs when `wanted` is empty). `routes` must outlive the platform.
  Platform(simgrid::s4u::NetZone* parent, std::string const& name, Routes const& routes,
           std::function<bool(int, int)> const& wanted = {})
      : routes_(&routes), ports_(routes.ports()) {
    namespace s4u = simgrid::s4u;
    auto const& model = routes.model();
    zone_ = s4u::create_full_zone(name);
    if (parent != nullptr) zone_->set_parent(parent);
    int G = model.gpus();
    for (int i = 0; i < model.links(); ++i) {
      auto const& l = model.link(i);
      links_.push_back(zone_->create_link(name + "-l" + std::to_string(i), l.bandwidth)
                           ->set_latency(l.latency)
                           ->set_sharing_policy(s4u::Link::SharingPolicy::SHARED)
                           ->seal());
    }
    for (int g = 0; g < G; ++g)
      for (int p = 0; p < ports_; ++p)
        hosts_.push_back(zone_->create_host(name + "-gpu" + std::to_string(g) + "-p" + std::to_string(p), 1e9)->seal());
    std::vector<s4u::LinkInRoute> route;
    for (int a = 0; a < G; ++a)
      for (int b = 0; b < G; ++b) {
        if (a == b || (wanted && !wanted(a, b))) continue;
        int n = 0;
        routes.for_each_path(a, b, [&](std::vector<int> const& links) {
          route.clear();
          for (int li : links) route.emplace_back(links_[static_cast<std::size_t>(li)]);
          zone_->add_route(host(a, n)->get_netpoint(), host(b, n)->get_netpoint(), nullptr, nullptr, route, false);
          ++n;
        });
      }
    zone_->seal();
  }

  [[nodiscard]] Routes const& routes() const { return *routes_; }
  [[nodiscard]] simgrid::s4u::Host* host(int gpu, int port) const {
    return hosts_[static_cast<std::size_t>(gpu) * static_cast<std::size_t>(ports_) + static_cast<std::size_t>(port)];
  }
  [[nodiscard]] simgrid::s4u::Link* link(int model_link) const { return links_[static_cast<std::size_t>(model_link)]; }
  [[nodiscard]] simgrid::s4u::NetZone* zone() const { return zone_; }

  /// Starts every sub-flow at once (from inside a SimGrid actor) and waits for all of them; returns
  /// the simulated seconds from the start to the end of the last. `ends`, when given, receives each
  /// sub-flow's end, in seconds from the start.
  double replay(std::span<SubFlow const> flows, std::vector<double>* ends = nullptr) const {
    namespace s4u = simgrid::s4u;
    double t0 = s4u::Engine::get_clock();
    std::vector<s4u::CommPtr> comms;
    comms.reserve(flows.size());
    for (auto const& f : flows) comms.push_back(s4u::Comm::sendto_async(host(f.src, f.port), host(f.dst, f.port), f.bytes));
    s4u::Comm::wait_all(comms);
    if (ends != nullptr) {
      ends->resize(flows.size());
      for (std::size_t i = 0; i < comms.size(); ++i) (*ends)[i] = comms[i]->get_finish_time() - t0;
    }
    return s4u::Engine::get_clock() - t0;
  }

 private:
  Routes const* routes_;
  int ports_ = 1;
  simgrid::s4u::NetZone* zone_ = nullptr;
  std::vector<simgrid::s4u::Link*> links_;
  std::vector<simgrid::s4u::Host*> hosts_;
};

/// Network-model settings for a fair comparison with the bottleneck bound, applied where the
/// command line did not set them (call after building the Engine, before any platform): CM02
/// (max-min sharing without LV08's slow-start factors 13.01 / 0.97), no TCP window bound
/// (TCP-gamma 0: a flow's rate is not capped at window / (2 x latency)), no cross-traffic (a flow
/// does not also load its reverse route with 5% of its rate), and the Full update of every flow
/// at every event (network/optim:Full): with the default Lazy update, SimGrid 3.32 ended the flows
/// of a replayed OLMoE dispatch 2% sooner than the busiest link's bytes / bandwidth allows
/// (docs/results/simgrid.md); Full meets the bound there and was no slower on our replays.
inline void default_network_config() {
  auto set = [](char const* name, char const* value) {
    if (simgrid::config::is_default(name)) simgrid::s4u::Engine::set_config(std::string(name) + ":" + value);
  };
  set("network/model", "CM02");
  set("network/TCP-gamma", "0");
  set("network/crosstraffic", "0");
  set("network/optim", "Full");
}

}  // namespace moe::simgrid_replay
