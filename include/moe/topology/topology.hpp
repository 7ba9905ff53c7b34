#pragma once
// Cluster topologies as graphs of servers and switches, with shortest-path hop distances between
// GPUs. A hop is one link between two vertices (server or switch); GPUs of one server are 0 hops
// apart (NVLink inside the server), as in the ILP placement paper.
//
// GPUs are numbered server by server in the order servers were added; the builders add servers
// leaf switch by leaf switch, so GPUs that are close in the network have close numbers (what the
// paper's round-robin placement needs).
//
// Builders (all: `leaves` leaf switches / routers, `servers_per_leaf` servers on each, and
// `gpus_per_server` GPUs in each server):
//   fat_tree          two levels: every leaf connects to every one of `spines` spine switches
//                     (same leaf 2 hops, other leaf 4 hops);
//   fat_tree_sparse   three levels: leaves grouped in pods of `pod_leaves`, one aggregation switch
//                     per pod, one core switch over the pods (same leaf 2, same pod 4, else 6);
//   dragonfly         leaves grouped in `groups` groups; routers of a group fully connected; one
//                     global link between every pair of groups;
//   dragonfly_sparse  as dragonfly, but global links only between neighbouring groups of a ring;
//   read_topology     from a file (format in docs/plan-format.md).
// paper_cluster() is the ILP paper's test cluster: 256 GPUs, 4 per server, 4 servers per leaf,
// 16 leaves.

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <ostream>
#include <queue>
#include <string>
#include <string_view>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/tsv.hpp"

namespace moe::topology {

/// Bandwidth (bytes per second, per direction) and latency (seconds) of one class of link.
struct LinkLevel {
  double bandwidth = 0;
  double latency = 0;
  friend bool operator==(LinkLevel const&, LinkLevel const&) = default;
};

/// Per-level link parameters of the traffic model (moe/topology/traffic.hpp). Defaults describe an
/// H100 cluster with one 400 Gb/s NIC per GPU:
///   nvlink: GPU <-> its server (the NVSwitch fabric), per GPU: 450 GB/s per direction (NVIDIA H100
///           SXM datasheet: NVLink 4, 900 GB/s bidirectional per GPU), 1 us;
///   nic:    server <-> switch (or server <-> server), per GPU of the server: 50 GB/s per direction
///           (DGX H100 user guide: eight ConnectX-7 400 Gb/s InfiniBand/Ethernet ports, one per
///           GPU; 400 Gb/s = 50 GB/s), 2 us (NIC + one switch traversal, RDMA small-message scale);
///           a server link carries `nic.bandwidth x GPUs of the server` (the smaller server for a
///           server <-> server link);
///   fabric: switch <-> switch, per link: 200 GB/s per direction (four bundled 400 Gb/s NDR ports,
///           which makes a leaf of the paper cluster, 16 GPU ports down and 4 spines up,
///           non-blocking; NVIDIA Quantum-2 QM9700 has 64 such ports), 1 us.
/// The latencies are order-of-magnitude per-hop figures, not measurements; override them.
struct LinkParams {
  LinkLevel nvlink{450e9, 1e-6};
  LinkLevel nic{50e9, 2e-6};
  LinkLevel fabric{200e9, 1e-6};
  friend bool operator==(LinkParams const&, LinkParams const&) = default;

  /// Throws moe::Error unless every bandwidth is positive and finite and every latency >= 0.
  void validate() const {
    auto one = [](char const* name, LinkLevel const& l) {
      check(std::isfinite(l.bandwidth) && l.bandwidth > 0, "link parameters: ", name,
            " bandwidth must be positive and finite, got ", l.bandwidth, " bytes/s");
      check(std::isfinite(l.latency) && l.latency >= 0, "link parameters: ", name,
            " latency must be >= 0 and finite, got ", l.latency, " s");
    };
    one("nvlink", nvlink);
    one("nic", nic);
    one("fabric", fabric);
  }
};

class Topology {
public:
  /// Adds a server with `gpus` GPUs; returns its vertex id.
  /// Most GPUs in one topology: planners build a G x G hop matrix (64 MiB at this bound), and the
  /// server-to-server table is S x S with S <= G. Files are also bounded in vertices and links
  /// (core::limits), which bounds finalize() to S breadth-first searches of that size.
  static constexpr long long max_gpus = core::limits::gpus;

  int add_server(std::string name, int gpus) {
    check(gpus > 0, "topology: server '", name, "' needs at least one GPU, has ", gpus);
    check(total_gpus_ + gpus <= max_gpus, "topology: server '", name, "' with ", gpus, " GPUs brings the cluster to ",
          total_gpus_ + gpus, " GPUs, above the limit of ", max_gpus);
    total_gpus_ += gpus;
    int v = add_vertex(std::move(name));
    server_vertex_.push_back(v);
    server_gpus_.push_back(gpus);
    return v;
  }
  /// Adds a switch (no GPUs); returns its vertex id.
  int add_switch(std::string name) { return add_vertex(std::move(name)); }
  /// Adds an undirected link between two vertices.
  void add_link(int a, int b) {
    check(links_ < core::limits::links, "topology: more than ", core::limits::links, " links");
    ++links_;
    check(a >= 0 && b >= 0 && a < vertices() && b < vertices(), "topology: link between unknown vertices ", a,
          " and ", b);
    check(a != b, "topology: link from '", names_[static_cast<std::size_t>(a)], "' to itself");
    adj_[static_cast<std::size_t>(a)].push_back(b);
    adj_[static_cast<std::size_t>(b)].push_back(a);
    finalized_ = false;
  }
  [[nodiscard]] int vertex(std::string_view name) const {
    auto it = index_.find(std::string(name));
    check(it != index_.end(), "topology: unknown vertex '", name, "'");
    return it->second;
  }

  /// Computes the hop distances; throws moe::Error naming a server that another cannot reach.
  void finalize() {
    int S = servers();
    check(S > 0, "topology: no servers");
    server_dist_.assign(static_cast<std::size_t>(S) * static_cast<std::size_t>(S), 0);
    std::vector<int> dist(static_cast<std::size_t>(vertices()));
    for (int s = 0; s < S; ++s) {
      std::fill(dist.begin(), dist.end(), -1);
      std::queue<int> q;
      int src = server_vertex_[static_cast<std::size_t>(s)];
      dist[static_cast<std::size_t>(src)] = 0;
      q.push(src);
      while (!q.empty()) {
        int v = q.front();
        q.pop();
        for (int w : adj_[static_cast<std::size_t>(v)])
          if (dist[static_cast<std::size_t>(w)] < 0) {
            dist[static_cast<std::size_t>(w)] = dist[static_cast<std::size_t>(v)] + 1;
            q.push(w);
          }
      }
      for (int t = 0; t < S; ++t) {
        int d = dist[static_cast<std::size_t>(server_vertex_[static_cast<std::size_t>(t)])];
        check(d >= 0, "topology: server '", names_[static_cast<std::size_t>(server_vertex_[static_cast<std::size_t>(t)])],
              "' is unreachable from server '", names_[static_cast<std::size_t>(src)], "'");
        server_dist_[static_cast<std::size_t>(s) * static_cast<std::size_t>(S) + static_cast<std::size_t>(t)] = d;
      }
    }
    gpu_server_.clear();
    for (int s = 0; s < S; ++s)
      for (int g = 0; g < server_gpus_[static_cast<std::size_t>(s)]; ++g) gpu_server_.push_back(s);
    finalized_ = true;
  }

  [[nodiscard]] int vertices() const { return static_cast<int>(names_.size()); }
  [[nodiscard]] int servers() const { return static_cast<int>(server_vertex_.size()); }
  [[nodiscard]] int gpus() const { return static_cast<int>(gpu_server_.size()); }
  [[nodiscard]] int server_of(int gpu) const { return gpu_server_[static_cast<std::size_t>(gpu)]; }
  [[nodiscard]] int gpus_of_server(int s) const { return server_gpus_[static_cast<std::size_t>(s)]; }
  [[nodiscard]] std::string const& server_name(int s) const {
    return names_[static_cast<std::size_t>(server_vertex_[static_cast<std::size_t>(s)])];
  }
  [[nodiscard]] int server_hops(int a, int b) const {
    return server_dist_[static_cast<std::size_t>(a) * static_cast<std::size_t>(servers()) + static_cast<std::size_t>(b)];
  }
  /// Hops between two GPUs (0 inside one server).
  [[nodiscard]] int hops(int gpu_a, int gpu_b) const { return server_hops(server_of(gpu_a), server_of(gpu_b)); }
  [[nodiscard]] bool finalized() const { return finalized_; }
  /// Vertex id of server s.
  [[nodiscard]] int server_vertex(int s) const { return server_vertex_[static_cast<std::size_t>(s)]; }
  [[nodiscard]] std::string const& vertex_name(int v) const { return names_[static_cast<std::size_t>(v)]; }
  /// Vertices linked to v (a vertex appears once per link).
  [[nodiscard]] std::vector<int> const& neighbors(int v) const { return adj_[static_cast<std::size_t>(v)]; }
  /// Link parameters for the traffic model (defaults unless set or read from the topology file).
  [[nodiscard]] LinkParams const& link_params() const { return link_params_; }
  void set_link_params(LinkParams const& p) {
    p.validate();
    link_params_ = p;
  }

  /// G x G GPU hop matrix, row-major.
  [[nodiscard]] std::vector<int> gpu_hops() const {
    check(finalized_, "topology: call finalize() first");
    int G = gpus();
    std::vector<int> d(static_cast<std::size_t>(G) * static_cast<std::size_t>(G));
    for (int a = 0; a < G; ++a)
      for (int b = 0; b < G; ++b) d[static_cast<std::size_t>(a) * static_cast<std::size_t>(G) + static_cast<std::size_t>(b)] = hops(a, b);
    return d;
  }

  /// Writes the topology in the file format read by read_topology().
  void write(std::ostream& os) const {
    os << "# moe topology: server NAME GPUS | switch NAME | link A B\n";
    for (int v = 0; v < vertices(); ++v) {
      auto it = std::find(server_vertex_.begin(), server_vertex_.end(), v);
      if (it != server_vertex_.end())
        os << "server\t" << names_[static_cast<std::size_t>(v)] << '\t'
           << server_gpus_[static_cast<std::size_t>(it - server_vertex_.begin())] << '\n';
      else
        os << "switch\t" << names_[static_cast<std::size_t>(v)] << '\n';
    }
    for (int v = 0; v < vertices(); ++v)
      for (int w : adj_[static_cast<std::size_t>(v)])
        if (v < w) os << "link\t" << names_[static_cast<std::size_t>(v)] << '\t' << names_[static_cast<std::size_t>(w)] << '\n';
    if (link_params_ != LinkParams{}) {
      auto level = [&](char const* name, LinkLevel const& l) {
        os << "level\t" << name << '\t' << l.bandwidth / 1e9 << '\t' << l.latency * 1e6 << '\n';
      };
      auto old = os.precision(17);
      level("nvlink", link_params_.nvlink);
      level("nic", link_params_.nic);
      level("fabric", link_params_.fabric);
      os.precision(old);
    }
  }

private:
  int add_vertex(std::string name) {
    check(!name.empty(), "topology: empty vertex name");
    check(index_.find(name) == index_.end(), "topology: duplicate vertex name '", name, "'");
    check(vertices() < core::limits::vertices, "topology: more than ", core::limits::vertices,
          " servers and switches");
    int v = vertices();
    index_.emplace(name, v);
    names_.push_back(std::move(name));
    adj_.emplace_back();
    finalized_ = false;
    return v;
  }

  std::vector<std::string> names_;
  std::map<std::string, int> index_;
  std::vector<std::vector<int>> adj_;
  std::vector<int> server_vertex_, server_gpus_, gpu_server_, server_dist_;
  LinkParams link_params_;
  long long links_ = 0;
  bool finalized_ = false;
  long long total_gpus_ = 0;
};

namespace detail {
inline std::string name(char const* prefix, int i) { return std::string(prefix) + std::to_string(i); }
inline std::vector<int> add_leaves(Topology& t, int leaves, int servers_per_leaf, int gpus_per_server) {
  check(leaves > 0 && servers_per_leaf > 0 && gpus_per_server > 0, "topology: leaves (", leaves,
        "), servers per leaf (", servers_per_leaf, ") and GPUs per server (", gpus_per_server, ") must be positive");
  std::vector<int> leaf(static_cast<std::size_t>(leaves));
  for (int l = 0; l < leaves; ++l) {
    leaf[static_cast<std::size_t>(l)] = t.add_switch(name("leaf", l));
    for (int s = 0; s < servers_per_leaf; ++s)
      t.add_link(t.add_server(name("server", l * servers_per_leaf + s), gpus_per_server), leaf[static_cast<std::size_t>(l)]);
  }
  return leaf;
}
}  // namespace detail

inline Topology fat_tree(int leaves, int servers_per_leaf, int gpus_per_server, int spines = 4) {
  check(spines > 0, "fat_tree: spines must be positive");
  Topology t;
  auto leaf = detail::add_leaves(t, leaves, servers_per_leaf, gpus_per_server);
  for (int s = 0; s < spines; ++s) {
    int sp = t.add_switch(detail::name("spine", s));
    for (int l : leaf) t.add_link(l, sp);
  }
  t.finalize();
  return t;
}

inline Topology fat_tree_sparse(int leaves, int servers_per_leaf, int gpus_per_server, int pod_leaves = 4) {
  check(pod_leaves > 0 && leaves % pod_leaves == 0, "fat_tree_sparse: ", leaves, " leaves do not split into pods of ",
        pod_leaves);
  Topology t;
  auto leaf = detail::add_leaves(t, leaves, servers_per_leaf, gpus_per_server);
  int core = t.add_switch("core");
  for (int p = 0; p < leaves / pod_leaves; ++p) {
    int agg = t.add_switch(detail::name("agg", p));
    t.add_link(agg, core);
    for (int l = 0; l < pod_leaves; ++l) t.add_link(leaf[static_cast<std::size_t>(p * pod_leaves + l)], agg);
  }
  t.finalize();
  return t;
}

namespace detail {
inline Topology dragonfly(int leaves, int servers_per_leaf, int gpus_per_server, int groups, bool ring) {
  check(groups > 0 && leaves % groups == 0, "dragonfly: ", leaves, " routers do not split into ", groups, " groups");
  int R = leaves / groups;
  Topology t;
  auto leaf = add_leaves(t, leaves, servers_per_leaf, gpus_per_server);
  auto router = [&](int g, int j) { return leaf[static_cast<std::size_t>(g * R + j)]; };
  for (int g = 0; g < groups; ++g)
    for (int a = 0; a < R; ++a)
      for (int b = a + 1; b < R; ++b) t.add_link(router(g, a), router(g, b));
  // Global link between groups a and b: router ((b - a - 1) mod G) mod R of group a to router
  // ((a - b - 1) mod G) mod R of group b (a router carries several global links when R < G - 1).
  auto link = [&](int a, int b) {
    int ra = ((b - a - 1) % groups + groups) % groups % R, rb = ((a - b - 1) % groups + groups) % groups % R;
    t.add_link(router(a, ra), router(b, rb));
  };
  if (ring) {
    if (groups == 2) link(0, 1);
    else if (groups > 2)
      for (int g = 0; g < groups; ++g) link(g, (g + 1) % groups);
  } else {
    for (int a = 0; a < groups; ++a)
      for (int b = a + 1; b < groups; ++b) link(a, b);
  }
  t.finalize();
  return t;
}
}  // namespace detail

inline Topology dragonfly(int leaves, int servers_per_leaf, int gpus_per_server, int groups = 4) {
  return detail::dragonfly(leaves, servers_per_leaf, gpus_per_server, groups, false);
}
inline Topology dragonfly_sparse(int leaves, int servers_per_leaf, int gpus_per_server, int groups = 4) {
  return detail::dragonfly(leaves, servers_per_leaf, gpus_per_server, groups, true);
}

/// Reads `server NAME GPUS`, `switch NAME` and `link A B` lines (any order, except that a link
/// names vertices declared above it), and optional `level LEVEL GB_PER_S LATENCY_US` lines
/// (LEVEL: nvlink, nic or fabric) overriding the traffic model's link parameters. Throws moe::Error
/// naming file:line for a malformed line and naming the servers when one cannot reach another.
inline Topology read_topology(core::TsvReader& in) {
  Topology t;
  LinkParams params;
  while (in.next()) {
    std::string_view kind = in.field(0);
    if (kind == "server") {
      in.expect_fields(3);
      int g = in.get_int_in<int>(2, "gpus", 1, static_cast<int>(Topology::max_gpus));
      try {
        t.add_server(std::string(in.field(1)), g);
      } catch (Error const& e) { fail(in.where(), ": ", e.what()); }
    } else if (kind == "switch") {
      in.expect_fields(2);
      try {
        t.add_switch(std::string(in.field(1)));
      } catch (Error const& e) { fail(in.where(), ": ", e.what()); }
    } else if (kind == "link") {
      in.expect_fields(3);
      try {
        t.add_link(t.vertex(in.field(1)), t.vertex(in.field(2)));
      } catch (Error const& e) { fail(in.where(), ": ", e.what()); }
    } else if (kind == "level") {
      in.expect_fields(4);
      std::string_view name = in.field(1);
      LinkLevel* l = name == "nvlink"   ? &params.nvlink
                     : name == "nic"    ? &params.nic
                     : name == "fabric" ? &params.fabric
                                        : nullptr;
      check(l != nullptr, in.where(), ": unknown link level '", name, "' (expected nvlink, nic or fabric)");
      double bw = in.get_double(2, "bandwidth GB/s"), lat = in.get_double(3, "latency us");
      check(bw > 0 && std::isfinite(bw * 1e9), in.where(), ": link level ", name,
            ": bandwidth must be positive and finite in bytes/s, got ", bw, " GB/s");
      check(lat >= 0 && std::isfinite(lat * 1e-6), in.where(), ": link level ", name, ": latency must be >= 0, got ",
            lat, " us");
      *l = LinkLevel{bw * 1e9, lat * 1e-6};
    } else {
      fail(in.where(), ": unknown line kind '", kind, "' (expected server, switch, link or level)");
    }
  }
  t.set_link_params(params);
  try {
    t.finalize();
  } catch (Error const& e) { fail(in.name(), ": ", e.what()); }
  return t;
}
inline Topology read_topology(std::string const& path) {
  core::TsvReader in(path);
  return read_topology(in);
}

enum class Kind { fat_tree, dragonfly, fat_tree_sparse, dragonfly_sparse };

inline char const* kind_name(Kind k) {
  switch (k) {
    case Kind::fat_tree: return "FatTree";
    case Kind::dragonfly: return "Dragonfly";
    case Kind::fat_tree_sparse: return "FatTree-sparse";
    case Kind::dragonfly_sparse: return "Dragonfly-sparse";
  }
  return "?";
}

/// The ILP paper's test cluster (section 5.1): 16 leaf switches x 4 servers x 4 GPUs = 256 GPUs.
inline Topology paper_cluster(Kind k) {
  switch (k) {
    case Kind::fat_tree: return fat_tree(16, 4, 4);
    case Kind::dragonfly: return dragonfly(16, 4, 4);
    case Kind::fat_tree_sparse: return fat_tree_sparse(16, 4, 4);
    case Kind::dragonfly_sparse: return dragonfly_sparse(16, 4, 4);
  }
  fail("paper_cluster: unknown topology kind");
}

}  // namespace moe::topology
