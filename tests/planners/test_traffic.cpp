// Link-level traffic model (moe/topology/traffic.hpp): hand-worked small topologies, a brute-force
// reference that enumerates every shortest path per (token, destination) explicitly and every
// combination of replica choices (it shares no code with the header), de-duplication, the aggregate
// mode, and bad input. The random cases are synthetic (seeded std::mt19937).
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <sstream>

#include "moe/plan/replica_table.hpp"
#include "moe/replication/routed.hpp"
#include "moe/topology/traffic.hpp"

using namespace moe::topology;
using moe::replication::CopyLists;

namespace {

CopyLists one_copy_each(std::vector<int> const& gpu) {
  CopyLists c;
  for (int g : gpu) {
    c.ranks.push_back(g);
    c.first.push_back(static_cast<int>(c.ranks.size()));
  }
  return c;
}

/// Bytes per (from node, to node) in the model's report, parallel links summed.
std::map<std::pair<int, int>, double> by_nodes(TrafficModel const& m, std::vector<double> const& bytes) {
  std::map<std::pair<int, int>, double> out;
  for (int i = 0; i < m.links(); ++i)
    if (bytes[static_cast<std::size_t>(i)] != 0)
      out[{m.link(i).from, m.link(i).to}] += bytes[static_cast<std::size_t>(i)];
  return out;
}

bool close(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max({1.0, std::abs(a), std::abs(b)}); }

void require_same(std::map<std::pair<int, int>, double> const& got, std::map<std::pair<int, int>, double> const& want) {
  std::map<std::pair<int, int>, double> all = got;
  for (auto const& [k, v] : want) all[k] += 0;
  for (auto const& [k, v] : all) {
    double g = got.count(k) ? got.at(k) : 0.0, w = want.count(k) ? want.at(k) : 0.0;
    INFO("link " << k.first << " -> " << k.second << ": model " << g << ", expected " << w);
    CHECK(close(g, w));
  }
}

// ---------------------------------------------------------------------------------------------
// Brute-force reference: its own graph (from the topology's public vertex and link lists), its own
// node numbering convention (vertices, then GPUs: the model's documented one, needed to compare
// link by link), DFS over all simple paths of the shortest length, and explicit enumeration of the
// replica choices.
// ---------------------------------------------------------------------------------------------
struct Brute {
  int V = 0, G = 0;
  std::vector<std::vector<int>> adj;  // parallel links appear once per link
  std::map<std::pair<int, int>, double> dispatch, combine;
  std::vector<double> load;
  double hop_bytes = 0, destinations = 0;

  explicit Brute(Topology const& t) : V(t.vertices()), G(t.gpus()) {
    adj.resize(static_cast<std::size_t>(V + G));
    for (int v = 0; v < V; ++v) adj[static_cast<std::size_t>(v)] = t.neighbors(v);
    for (int g = 0; g < G; ++g) {
      int s = t.server_vertex(t.server_of(g));
      adj[static_cast<std::size_t>(V + g)].push_back(s);
      adj[static_cast<std::size_t>(s)].push_back(V + g);
    }
    load.assign(static_cast<std::size_t>(G), 0.0);
  }

  int shortest(int a, int b) const {  // plain BFS
    std::vector<int> d(adj.size(), -1);
    std::vector<int> q{a};
    d[static_cast<std::size_t>(a)] = 0;
    for (std::size_t i = 0; i < q.size(); ++i)
      for (int w : adj[static_cast<std::size_t>(q[i])])
        if (d[static_cast<std::size_t>(w)] < 0) {
          d[static_cast<std::size_t>(w)] = d[static_cast<std::size_t>(q[i])] + 1;
          q.push_back(w);
        }
    return d[static_cast<std::size_t>(b)];
  }

  /// Every simple path from a to b with exactly `len` links, as node sequences.
  std::vector<std::vector<int>> paths(int a, int b, int len) const {
    std::vector<std::vector<int>> out;
    std::vector<int> cur{a};
    std::vector<char> seen(adj.size(), 0);
    seen[static_cast<std::size_t>(a)] = 1;
    std::function<void(int)> dfs = [&](int v) {
      if (static_cast<int>(cur.size()) - 1 == len) {
        if (v == b) out.push_back(cur);
        return;
      }
      for (int w : adj[static_cast<std::size_t>(v)]) {
        if (seen[static_cast<std::size_t>(w)]) continue;
        seen[static_cast<std::size_t>(w)] = 1;
        cur.push_back(w);
        dfs(w);
        cur.pop_back();
        seen[static_cast<std::size_t>(w)] = 0;
      }
    };
    dfs(a);
    return out;
  }

  void send(int src_gpu, int dst_gpu, double bytes) {
    int a = V + src_gpu, b = V + dst_gpu;
    int len = shortest(a, b);
    REQUIRE(len > 0);
    auto ps = paths(a, b, len);
    REQUIRE(!ps.empty());
    double each = bytes / static_cast<double>(ps.size());
    for (auto const& p : ps)
      for (std::size_t i = 0; i + 1 < p.size(); ++i) {
        dispatch[{p[i], p[i + 1]}] += each;
        combine[{p[i + 1], p[i]}] += each;
      }
    hop_bytes += 2 * bytes * (len - 2);  // server hops = GPU path length minus the two NVLink links
  }

  /// One token whose experts run on the given GPUs (repeats allowed): it crosses once to each.
  void routed(int src, std::vector<int> const& gpus, double bytes) {
    std::vector<int> dests;
    for (int g : gpus) {
      load[static_cast<std::size_t>(g)] += 1;
      if (std::find(dests.begin(), dests.end(), g) == dests.end()) dests.push_back(g);
    }
    destinations += static_cast<double>(dests.size());
    for (int g : dests)
      if (g != src) send(src, g, bytes);
  }

  /// One token: every combination of copy choices, weighted by its probability.
  void token(int src, std::vector<int> const& experts, LayerCopies const& p, double bytes) {
    std::map<int, double> reach;  // destination GPU -> probability the token goes there
    std::vector<int> choice(experts.size(), 0);
    std::function<void(std::size_t, double)> rec = [&](std::size_t j, double prob) {
      if (j == experts.size()) {
        std::vector<int> dests;
        for (std::size_t i = 0; i < experts.size(); ++i) {
          int g = p.copies.ranks[static_cast<std::size_t>(choice[i])];
          if (std::find(dests.begin(), dests.end(), g) == dests.end()) dests.push_back(g);
        }
        for (int g : dests) reach[g] += prob;
        return;
      }
      int e = experts[j];
      for (int c = p.copies.first[static_cast<std::size_t>(e)]; c < p.copies.first[static_cast<std::size_t>(e) + 1];
           ++c) {
        choice[j] = c;
        rec(j + 1, prob * p.share[static_cast<std::size_t>(c)]);
      }
    };
    rec(0, 1.0);
    for (int e : experts)
      for (int c = p.copies.first[static_cast<std::size_t>(e)]; c < p.copies.first[static_cast<std::size_t>(e) + 1];
           ++c)
        load[static_cast<std::size_t>(p.copies.ranks[static_cast<std::size_t>(c)])] +=
            p.share[static_cast<std::size_t>(c)];
    for (auto const& [g, prob] : reach) {
      destinations += prob;
      if (g != src && prob > 0) send(src, g, prob * bytes);
    }
  }
};

TrafficOptions small_opt() {
  TrafficOptions o;
  o.hidden = 1000;
  o.bytes_per_element = 2;  // 2000 bytes per token
  return o;
}

}  // namespace

TEST_CASE("traffic: two servers on one switch, worked by hand", "[traffic]") {
  // s0 (GPUs 0, 1) and s1 (GPUs 2, 3) on switch sw. Experts 0..3 on GPUs 0..3, top-2, 2000-byte
  // tokens.
  //   t0 on GPU 0 -> experts {1, 2}: GPU 1 via gpu0->s0->gpu1; GPU 2 via gpu0->s0->sw->s1->gpu2.
  //   t1 on GPU 3 -> experts {0, 3}: expert 3 is local (no bytes); GPU 0 via gpu3->s1->sw->s0->gpu0.
  // Dispatch bytes: gpu0->s0 4000 (both of t0's crossings), s0->gpu1 2000, s0->sw 2000, sw->s1 2000,
  // s1->gpu2 2000, gpu3->s1 2000, s1->sw 2000, sw->s0 2000, s0->gpu0 2000. Combine is the mirror.
  // Hop bytes: two 2-hop crossings, each 2000 bytes out and back: 2 x 2 x 2 x 2000 = 16000.
  // Bottleneck: a NIC link is 2 GPUs x 50 GB/s = 100 GB/s: 2000 B / 100e9 = 20 ns (NVLink: 4000 B /
  // 450e9 = 8.9 ns); latency of the longest used path gpu-s-sw-s-gpu: 1 + 2 + 2 + 1 = 6 us.
  Topology t;
  int s0 = t.add_server("s0", 2), s1 = t.add_server("s1", 2), sw = t.add_switch("sw");
  t.add_link(s0, sw);
  t.add_link(s1, sw);
  t.finalize();
  TrafficModel m(t);
  int V = t.vertices();
  auto p = equal_shares(one_copy_each({0, 1, 2, 3}));
  Batch b{2, {0, 3}, {1, 2, 0, 3}};
  auto r = m.evaluate(p, b, small_opt());
  int g0 = V, g1 = V + 1, g2 = V + 2, g3 = V + 3;
  std::map<std::pair<int, int>, double> d{{{g0, s0}, 4000}, {{s0, g1}, 2000}, {{s0, sw}, 2000},
                                          {{sw, s1}, 2000}, {{s1, g2}, 2000}, {{g3, s1}, 2000},
                                          {{s1, sw}, 2000}, {{sw, s0}, 2000}, {{s0, g0}, 2000}};
  std::map<std::pair<int, int>, double> c;
  for (auto const& [k, v] : d) c[{k.second, k.first}] = v;
  require_same(by_nodes(m, r.dispatch_bytes), d);
  require_same(by_nodes(m, r.combine_bytes), c);
  CHECK(r.hop_bytes == 16000);
  CHECK(r.gpu_load == std::vector<double>{1, 1, 1, 1});
  CHECK(r.destinations_per_token == 2);
  CHECK(r.remote_crossings == 3);
  CHECK(close(r.dispatch_transfer, 2000 / 100e9));
  CHECK(m.link(r.dispatch_bottleneck).level == Level::nic);
  CHECK(close(r.latency, 6e-6));
  CHECK(close(r.dispatch_time, 6e-6 + 2e-8));
  CHECK(close(r.time(), 2 * (6e-6 + 2e-8)));
  std::ostringstream table;
  m.write_links(table, t, r);
  std::string text = table.str();
  CHECK(std::count(text.begin(), text.end(), '\n') == m.links() + 1);
  CHECK(text.find("gpu0\ts0\tnvlink\t450\t4000\t2000\t") != std::string::npos);
  CHECK(text.find("s0\tsw\tnic\t100\t2000\t2000\t0.02\t0.02\n") != std::string::npos);
}

TEST_CASE("traffic: 2-leaf fat tree with 2 spines splits equally", "[traffic]") {
  // fat_tree(2 leaves, 1 server per leaf, 1 GPU, 2 spines): GPU 0 on server0/leaf0, GPU 1 on
  // server1/leaf1. One token on GPU 0 to expert 0 on GPU 1, 2000 bytes: two shortest paths
  // (via spine0, via spine1), 1000 bytes each on the leaf-spine links, 2000 on the rest.
  // Hop bytes: 4 hops x 2000 x 2 (dispatch + combine) = 16000.
  auto t = fat_tree(2, 1, 1, 2);
  TrafficModel m(t);
  int V = t.vertices(), sv0 = t.vertex("server0"), sv1 = t.vertex("server1"), l0 = t.vertex("leaf0"),
      l1 = t.vertex("leaf1"), sp0 = t.vertex("spine0"), sp1 = t.vertex("spine1");
  auto r = m.evaluate(equal_shares(one_copy_each({1})), Batch{1, {0}, {0}}, small_opt());
  std::map<std::pair<int, int>, double> d{{{V, sv0}, 2000},  {{sv0, l0}, 2000},   {{l0, sp0}, 1000},
                                          {{l0, sp1}, 1000}, {{sp0, l1}, 1000},   {{sp1, l1}, 1000},
                                          {{l1, sv1}, 2000}, {{sv1, V + 1}, 2000}};
  require_same(by_nodes(m, r.dispatch_bytes), d);
  CHECK(r.hop_bytes == 16000);
  // The NIC link (1 GPU: 50 GB/s) is the bottleneck; the spine links carry half at 200 GB/s.
  CHECK(close(r.dispatch_transfer, 2000 / 50e9));
  CHECK(close(r.latency, 1e-6 + 2e-6 + 1e-6 + 1e-6 + 2e-6 + 1e-6));
}

TEST_CASE("traffic: equal split per path, not per link", "[traffic]") {
  // Server A links to switches x and y; x to p and q; y to p; p and q to server B. The three
  // shortest paths A-x-p-B, A-x-q-B, A-y-p-B carry 1/3 each, so A->x carries 2/3, A->y 1/3,
  // x->p, x->q and y->p 1/3, p->B 2/3, q->B 1/3 (splitting per link at each vertex would give
  // A->x 1/2 instead). 3000-byte token (hidden 1500).
  Topology t;
  int A = t.add_server("A", 1), B = t.add_server("B", 1);
  int x = t.add_switch("x"), y = t.add_switch("y"), p = t.add_switch("p"), q = t.add_switch("q");
  t.add_link(A, x);
  t.add_link(A, y);
  t.add_link(x, p);
  t.add_link(x, q);
  t.add_link(y, p);
  t.add_link(p, B);
  t.add_link(q, B);
  t.finalize();
  TrafficModel m(t);
  int V = t.vertices();
  TrafficOptions o;
  o.hidden = 1500;
  o.bytes_per_element = 2;
  auto r = m.evaluate(equal_shares(one_copy_each({1})), Batch{1, {0}, {0}}, o);
  std::map<std::pair<int, int>, double> d{{{V, A}, 3000}, {{A, x}, 2000}, {{A, y}, 1000},
                                          {{x, p}, 1000}, {{x, q}, 1000}, {{y, p}, 1000},
                                          {{p, B}, 2000}, {{q, B}, 1000}, {{B, V + 1}, 3000}};
  require_same(by_nodes(m, r.dispatch_bytes), d);
  CHECK(close(r.hop_bytes, 2 * 3 * 3000));
}

TEST_CASE("traffic: a token crosses once to a GPU holding several of its experts", "[traffic]") {
  // Experts 0 and 1 both on GPU 2 (other server), expert 2 on GPU 1 (same server). A top-3 token
  // on GPU 0 sends one copy to GPU 2 and one to GPU 1: 2000 bytes on each NIC link, not 4000.
  Topology t;
  int s0 = t.add_server("s0", 2), s1 = t.add_server("s1", 2), sw = t.add_switch("sw");
  t.add_link(s0, sw);
  t.add_link(s1, sw);
  t.finalize();
  TrafficModel m(t);
  auto p = equal_shares(one_copy_each({2, 2, 1}));
  auto r = m.evaluate(p, Batch{3, {0}, {0, 1, 2}}, small_opt());
  auto d = by_nodes(m, r.dispatch_bytes);
  CHECK(d[{s0, sw}] == 2000);
  CHECK(d[{sw, s1}] == 2000);
  CHECK(d[{t.vertices(), s0}] == 4000);  // GPU 0's NVLink: one to GPU 1, one to GPU 2
  CHECK(r.remote_crossings == 2);
  CHECK(r.destinations_per_token == 2);
  CHECK(r.gpu_load == std::vector<double>{0, 1, 2, 0});

  // Replicated: expert 0 on GPUs 2 and 3 (half each), expert 1 on GPU 2. GPU 2 is reached with
  // probability 1 - (1 - 1/2)(1 - 1) = 1, GPU 3 with 1/2: 3000 bytes over the NIC.
  CopyLists c;
  c.ranks = {2, 3, 2};
  c.first = {0, 2, 3};
  LayerCopies rp{c, {0.5, 0.5, 1.0}};
  auto r2 = m.evaluate(rp, Batch{2, {0}, {0, 1}}, small_opt());
  CHECK(close(by_nodes(m, r2.dispatch_bytes)[{s0, sw}], 3000));
  CHECK(close(r2.destinations_per_token, 1.5));
}

/// Random placement and batch on topology t, model against the brute-force reference.
static void compare_with_brute(Topology const& t, std::mt19937& rng, int max_experts, int max_tokens) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int G = t.gpus();
  // Random placement: 2..max_experts experts, 1..3 copies each on distinct GPUs, random shares.
  int E = uni(2, max_experts);
  CopyLists c;
  std::vector<double> share;
  for (int e = 0; e < E; ++e) {
    std::vector<int> gs(static_cast<std::size_t>(G));
    for (int g = 0; g < G; ++g) gs[static_cast<std::size_t>(g)] = g;
    std::shuffle(gs.begin(), gs.end(), rng);
    int n = std::min(G, uni(1, 3));
    std::vector<double> w;
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      w.push_back(uni(1, 4));
      sum += w.back();
    }
    for (int i = 0; i < n; ++i) {
      c.ranks.push_back(gs[static_cast<std::size_t>(i)]);
      share.push_back(w[static_cast<std::size_t>(i)] / sum);
    }
    // Make the shares sum to 1 to the last bit so validation's tolerance is not what is tested.
    double s = 0;
    for (int i = 0; i + 1 < n; ++i) s += share[share.size() - static_cast<std::size_t>(n - i)];
    share.back() = 1.0 - s;
    c.first.push_back(static_cast<int>(c.ranks.size()));
  }
  LayerCopies p{c, share};
  // Random batch: 1..max_tokens tokens on random attention GPUs, top-k distinct experts.
  int k = uni(1, std::min(3, E)), T = uni(1, max_tokens);
  Batch b;
  b.top_k = k;
  Brute ref(t);
  auto opt = small_opt();
  for (int tok = 0; tok < T; ++tok) {
    b.source.push_back(uni(0, G - 1));
    std::vector<int> ex(static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e) ex[static_cast<std::size_t>(e)] = e;
    std::shuffle(ex.begin(), ex.end(), rng);
    ex.resize(static_cast<std::size_t>(k));
    b.experts.insert(b.experts.end(), ex.begin(), ex.end());
    ref.token(b.source.back(), ex, p, opt.token_bytes());
  }
  TrafficModel m(t);
  auto r = m.evaluate(p, b, opt);
  require_same(by_nodes(m, r.dispatch_bytes), ref.dispatch);
  require_same(by_nodes(m, r.combine_bytes), ref.combine);
  CHECK(close(r.hop_bytes, ref.hop_bytes));
  CHECK(close(r.destinations_per_token * T, ref.destinations));
  for (int g = 0; g < G; ++g)
    CHECK(close(r.gpu_load[static_cast<std::size_t>(g)], ref.load[static_cast<std::size_t>(g)]));
  // The bottleneck is the largest bytes / bandwidth over the report's links.
  double worst = 0;
  for (int i = 0; i < m.links(); ++i)
    worst = std::max(worst, r.dispatch_bytes[static_cast<std::size_t>(i)] / m.link(i).bandwidth);
  CHECK(close(r.dispatch_transfer, worst));
}

TEST_CASE("traffic: equals brute-force path enumeration on random cases (synthetic)", "[traffic]") {
  std::mt19937 rng(20261124);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 50; ++trial) {
    INFO("trial " << trial);
    // Random connected topology: servers and switches, a random spanning tree, then extra links
    // (a few parallel ones too), so there are many equal-cost paths.
    Topology t;
    int S = uni(2, 4), W = uni(1, 4);
    std::vector<int> vs;
    for (int s = 0; s < S; ++s) vs.push_back(t.add_server(std::string("s").append(std::to_string(s)), uni(1, 3)));
    for (int w = 0; w < W; ++w) vs.push_back(t.add_switch(std::string("w").append(std::to_string(w))));
    std::shuffle(vs.begin(), vs.end(), rng);
    for (std::size_t i = 1; i < vs.size(); ++i)
      t.add_link(vs[i], vs[static_cast<std::size_t>(uni(0, static_cast<int>(i) - 1))]);
    for (int extra = uni(0, 5); extra > 0; --extra) {
      int a = vs[static_cast<std::size_t>(uni(0, static_cast<int>(vs.size()) - 1))];
      int b = vs[static_cast<std::size_t>(uni(0, static_cast<int>(vs.size()) - 1))];
      if (a != b) t.add_link(a, b);
    }
    t.finalize();
    compare_with_brute(t, rng, 6, 12);
  }
}

TEST_CASE("traffic: built-in topologies equal brute force (synthetic placements)", "[traffic]") {
  std::mt19937 rng(17);
  std::vector<std::pair<char const*, Topology>> topos{{"fat_tree(3, 2, 2, 3)", fat_tree(3, 2, 2, 3)},
                                                      {"fat_tree_sparse(4, 1, 2, 2)", fat_tree_sparse(4, 1, 2, 2)},
                                                      {"dragonfly(4, 1, 2, 2)", dragonfly(4, 1, 2, 2)},
                                                      {"dragonfly(6, 1, 1, 3)", dragonfly(6, 1, 1, 3)},
                                                      {"dragonfly_sparse(8, 1, 1, 4)", dragonfly_sparse(8, 1, 1, 4)}};
  for (auto const& [name, t] : topos)
    for (int trial = 0; trial < 3; ++trial) {
      INFO(name << ", trial " << trial);
      compare_with_brute(t, rng, 8, 30);
    }
}

TEST_CASE("traffic: aggregate mode equals top-1 tokens spread uniformly", "[traffic]") {
  // With top-1 tokens there is nothing to de-duplicate: expected loads of m x A per expert from A
  // attention ranks equal a batch in which every attention rank sends m tokens to every expert.
  auto t = fat_tree(2, 2, 2, 2);  // 8 GPUs
  TrafficModel m(t);
  CopyLists c;
  c.ranks = {0, 5, 3, 7, 2};
  c.first = {0, 2, 3, 5};
  LayerCopies p{c, {0.25, 0.75, 1.0, 0.5, 0.5}};
  std::vector<int> att{0, 2, 6};
  std::vector<int> per_expert{2, 1, 3};  // m per attention rank
  std::vector<double> load;
  Batch b{1, {}, {}};
  for (int e = 0; e < 3; ++e) {
    load.push_back(per_expert[static_cast<std::size_t>(e)] * 3.0);
    for (int a : att)
      for (int i = 0; i < per_expert[static_cast<std::size_t>(e)]; ++i) {
        b.source.push_back(a);
        b.experts.push_back(e);
      }
  }
  auto ra = m.evaluate_expected(p, load, att, small_opt());
  auto rt = m.evaluate(p, b, small_opt());
  require_same(by_nodes(m, ra.dispatch_bytes), by_nodes(m, rt.dispatch_bytes));
  require_same(by_nodes(m, ra.combine_bytes), by_nodes(m, rt.combine_bytes));
  CHECK(close(ra.hop_bytes, rt.hop_bytes));
  for (int g = 0; g < 8; ++g)
    CHECK(close(ra.gpu_load[static_cast<std::size_t>(g)], rt.gpu_load[static_cast<std::size_t>(g)]));
  CHECK(spread_tokens(7, att) == std::vector<int>{0, 0, 2, 2, 6, 6, 6});
}

TEST_CASE("traffic: link parameters from the topology file", "[traffic]") {
  std::istringstream in("server\ta\t2\nserver\tb\t2\nswitch\tsw\nlink\ta\tsw\nlink\tb\tsw\nlevel\tnic\t25\t3\n");
  moe::core::TsvReader rd(in, "topo.tsv");
  auto t = read_topology(rd);
  CHECK(t.link_params().nic.bandwidth == 25e9);
  CHECK(t.link_params().nic.latency == 3e-6);
  CHECK(t.link_params().nvlink == LinkParams{}.nvlink);
  TrafficModel m(t);
  for (int i = 0; i < m.links(); ++i)
    if (m.link(i).level == Level::nic) CHECK(m.link(i).bandwidth == 50e9);  // 2 GPUs x 25 GB/s
  std::ostringstream os;
  t.write(os);
  std::istringstream back(os.str());
  moe::core::TsvReader rd2(back, "written.tsv");
  CHECK(read_topology(rd2).link_params() == t.link_params());
  std::istringstream bad("server\ta\t1\nlevel\twarp\t1\t1\n");
  moe::core::TsvReader rd3(bad, "bad.tsv");
  CHECK_THROWS_WITH(read_topology(rd3), Catch::Contains("bad.tsv:2") && Catch::Contains("unknown link level 'warp'"));
  std::istringstream neg("server\ta\t1\nlevel\tnic\t-5\t1\n");
  moe::core::TsvReader rd4(neg, "neg.tsv");
  CHECK_THROWS_WITH(read_topology(rd4), Catch::Contains("bandwidth must be positive"));
}

TEST_CASE("traffic: bad input is a clear moe::Error", "[traffic]") {
  auto t = fat_tree(2, 1, 2, 2);  // 4 GPUs
  TrafficModel m(t);
  auto opt = small_opt();
  // A copy on a GPU outside the topology.
  CHECK_THROWS_WITH(m.evaluate(equal_shares(one_copy_each({0, 9})), Batch{1, {0}, {0}}, opt),
                    Catch::Contains("expert 1 has a copy on GPU 9, outside the topology's [0, 4)"));
  // A token from a GPU outside the topology, or to an unknown expert, or a repeated expert.
  auto p = equal_shares(one_copy_each({0, 1}));
  CHECK_THROWS_WITH(m.evaluate(p, Batch{1, {-1}, {0}}, opt), Catch::Contains("comes from GPU -1"));
  CHECK_THROWS_WITH(m.evaluate(p, Batch{1, {0}, {2}}, opt), Catch::Contains("expert 2, outside [0, 2)"));
  CHECK_THROWS_WITH(m.evaluate(p, Batch{2, {0}, {1, 1}}, opt), Catch::Contains("lists expert 1 twice"));
  CHECK_THROWS_WITH(m.evaluate(p, Batch{2, {0}, {1}}, opt), Catch::Contains("expected tokens x top_k"));
  // Negative or zero sizes.
  TrafficOptions neg = opt;
  neg.hidden = -4;
  CHECK_THROWS_WITH(m.evaluate(p, Batch{1, {0}, {0}}, neg), Catch::Contains("hidden size must be positive, got -4"));
  neg = opt;
  neg.bytes_per_element = -1;
  CHECK_THROWS_WITH(m.evaluate(p, Batch{1, {0}, {0}}, neg), Catch::Contains("bytes per element must be positive"));
  CHECK_THROWS_WITH(spread_tokens(-3, std::vector<int>{0}), Catch::Contains("negative token count -3"));
  std::vector<double> bad_load{1.0, -2.0};
  CHECK_THROWS_WITH(m.evaluate_expected(p, bad_load, std::vector<int>{0}, opt),
                    Catch::Contains("expert 1 has load -2"));
  LinkParams lp;
  lp.fabric.bandwidth = -1;
  CHECK_THROWS_WITH(TrafficModel(t, lp), Catch::Contains("fabric bandwidth must be positive"));
  // Shares that do not sum to 1, or outside [0, 1].
  CopyLists c;
  c.ranks = {0, 1};
  c.first = {0, 2};
  CHECK_THROWS_WITH(m.evaluate(LayerCopies{c, {0.5, 0.25}}, Batch{1, {0}, {0}}, opt),
                    Catch::Contains("shares of expert 0 sum to 0.75"));
  CHECK_THROWS_WITH(m.evaluate(LayerCopies{c, {1.5, -0.5}}, Batch{1, {0}, {0}}, opt), Catch::Contains("share 1.5"));
  // A topology with no path between two GPUs' servers: finalize() names them; the model refuses
  // an unfinalized topology.
  Topology split;
  split.add_server("left", 1);
  split.add_server("right", 1);
  CHECK_THROWS_WITH(split.finalize(), Catch::Contains("server 'right' is unreachable from server 'left'"));
  CHECK_THROWS_WITH(TrafficModel(split), Catch::Contains("not finalized"));
  // Too many servers for the per-pair share lists.
  auto big = fat_tree(TrafficModel::max_servers + 1, 1, 1, 1);
  CHECK_THROWS_WITH(TrafficModel(big), Catch::Contains("1025 servers"));
}

TEST_CASE("traffic: Choice::like_layer picks copies as replication::Table does (synthetic)", "[traffic]") {
  // The reference is the layer's own rule, replication::Table::choose(expert, primary, source,
  // token), which the model does not call; tokens spread over the ranks as the layer does.
  std::mt19937 rng(5);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (auto const& t : {fat_tree(2, 2, 2, 2), dragonfly(4, 1, 2, 2)}) {
    int G = t.gpus(), E = 12, k = 3, T = 40;
    std::vector<std::vector<int>> replicas(static_cast<std::size_t>(E));
    CopyLists c;
    std::vector<int> primary;
    for (auto& r : replicas) {
      std::vector<int> gs(static_cast<std::size_t>(G));
      for (int g = 0; g < G; ++g) gs[static_cast<std::size_t>(g)] = g;
      std::shuffle(gs.begin(), gs.end(), rng);
      r.assign(gs.begin(), gs.begin() + uni(1, 3));
      primary.push_back(r[static_cast<std::size_t>(uni(0, static_cast<int>(r.size()) - 1))]);
      c.ranks.insert(c.ranks.end(), r.begin(), r.end());
      c.first.push_back(static_cast<int>(c.ranks.size()));
    }
    moe::replication::Table table(replicas);
    table.validate(E, G, primary);
    std::vector<int> ranks(static_cast<std::size_t>(G));
    for (int g = 0; g < G; ++g) ranks[static_cast<std::size_t>(g)] = g;
    Batch b{k, spread_tokens(T, ranks), {}};
    Brute ref(t);
    auto opt = small_opt();
    opt.choice = Choice::like_layer;
    for (int tok = 0; tok < T; ++tok) {
      std::vector<int> ex(static_cast<std::size_t>(E));
      for (int e = 0; e < E; ++e) ex[static_cast<std::size_t>(e)] = e;
      std::shuffle(ex.begin(), ex.end(), rng);
      ex.resize(static_cast<std::size_t>(k));
      b.experts.insert(b.experts.end(), ex.begin(), ex.end());
      std::vector<int> gpus;
      int src = b.source[static_cast<std::size_t>(tok)];
      for (int e : ex) gpus.push_back(table.choose(e, primary[static_cast<std::size_t>(e)], src, tok));
      ref.routed(src, gpus, opt.token_bytes());
    }
    TrafficModel m(t);
    auto r = m.evaluate(equal_shares(c), b, opt);
    require_same(by_nodes(m, r.dispatch_bytes), ref.dispatch);
    require_same(by_nodes(m, r.combine_bytes), ref.combine);
    CHECK(close(r.hop_bytes, ref.hop_bytes));
    CHECK(close(r.destinations_per_token * T, ref.destinations));
    for (int g = 0; g < G; ++g) CHECK(r.gpu_load[static_cast<std::size_t>(g)] == ref.load[static_cast<std::size_t>(g)]);
    // evaluate_policy with the table itself gives the same bytes.
    auto p = m.evaluate_policy(table, primary, b, opt);
    require_same(by_nodes(m, p.dispatch_bytes), ref.dispatch);
    require_same(by_nodes(m, p.combine_bytes), ref.combine);
    CHECK(close(p.destinations_per_token * T, ref.destinations));

    // A source-dependent policy (replication::Routed with random shares per source server): the
    // brute force routes each pair where the policy's choose() says.
    std::vector<std::vector<std::vector<moe::replication::RouteShare>>> routes(
        static_cast<std::size_t>(t.servers()), std::vector<std::vector<moe::replication::RouteShare>>(static_cast<std::size_t>(E)));
    for (int s = 0; s < t.servers(); ++s)
      for (int e = 0; e < E; ++e) {
        auto const& cp = replicas[static_cast<std::size_t>(e)];
        std::vector<double> w(cp.size());
        double sum = 0;
        for (auto& x : w) sum += (x = uni(1, 5));
        for (std::size_t i = 0; i < cp.size(); ++i) routes[static_cast<std::size_t>(s)][static_cast<std::size_t>(e)].push_back({cp[i], w[i] / sum});
      }
    moe::replication::Routed routed(replicas, t, routes);
    Brute ref2(t);
    for (int tok = 0; tok < T; ++tok) {
      std::vector<int> gpus;
      int src = b.source[static_cast<std::size_t>(tok)];
      for (int j = 0; j < k; ++j) {
        int e = b.experts[static_cast<std::size_t>(tok) * k + static_cast<std::size_t>(j)];
        gpus.push_back(routed.choose(e, primary[static_cast<std::size_t>(e)], src, tok));
      }
      ref2.routed(src, gpus, opt.token_bytes());
    }
    auto q = m.evaluate_policy(routed, primary, b, opt);
    require_same(by_nodes(m, q.dispatch_bytes), ref2.dispatch);
    require_same(by_nodes(m, q.combine_bytes), ref2.combine);
    CHECK(close(q.hop_bytes, ref2.hop_bytes));
  }
}
