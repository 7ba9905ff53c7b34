#pragma once
// Link-level network traffic model of an expert placement: the bytes every directed link carries
// for one MoE layer's dispatch (attention rank -> expert GPUs) and combine (the reverse).
//
// The network. Every GPU is a vertex linked to its server's vertex by an NVLink link (both
// directions); the topology's servers, switches and links are the rest. Two GPUs of one server talk
// over GPU -> server -> GPU (two NVLink links); other pairs over GPU -> server -> ... -> server ->
// GPU. Link bandwidths and latencies come from LinkParams (moe/topology/topology.hpp: defaults for
// an H100 / 400 Gb cluster, overridable in code or with `level` lines in the topology file).
//
// Routing. Traffic from GPU a to GPU b follows every shortest path between them, and each of the n
// shortest paths carries 1/n of it (equal split over equal-cost paths, ECMP per flow). A directed
// link u -> v therefore carries the fraction sigma_a(u) * tau_b(v) / sigma_a(b) of the a -> b
// flow, where sigma_a(x) counts shortest paths from a to x and tau_b(x) shortest paths from x to b.
// These fractions are computed once per topology, per server pair (breadth-first search DAG), so
// evaluating a batch is a sparse accumulation.
//
// The placement. For each expert of a layer, the GPUs holding a copy and the share of the expert's
// tokens each copy serves (LayerCopies; equal shares by default). A token's expert e is served by
// copy c with probability share(c), independently per expert (Choice::by_share), or by the copy
// moe::Layer picks with replication::Table (Choice::like_layer: own GPU first, then spread).
//
// Token-level mode (evaluate): a batch lists each token's source GPU (its attention rank; use
// spread_tokens to place tokens as the layer does: each rank holds a contiguous block) and its
// top-k experts. De-duplication: a token crosses to a destination GPU once however many of its
// experts that GPU serves, so a token reaches GPU d with probability
//   w(d) = 1 - prod over its experts e of (1 - share of e's copies on d),
// which is exactly 1 or 0 when every expert has one copy. Dispatch sends w(d) x token_bytes from
// the source to d (nothing when d is the source), combine the same back (one partial sum per
// (token, GPU)). All byte counts are expectations over the replica choice.
//
// Aggregate mode (evaluate_expected): from expected per-expert loads (token-expert pairs) instead
// of tokens; each expert's load comes uniformly from the given attention ranks and is split over
// its copies by share, WITHOUT de-duplication (the loads carry no co-activation): every
// token-expert pair crosses on its own, as in the ILP paper's cost model. Its totals are therefore
// at least what de-duplication would send for the same pairs; per link it can differ either way,
// since real sources are not uniform.
//
// Report: bytes per directed link (dispatch and combine), the bottleneck time of each phase
// (max over links of bytes / bandwidth, plus the largest path latency among the used GPU pairs:
// the sum of link latencies along the path, max over equal-cost paths), the hop-weighted bytes
// (bytes x server hops, the ILP placement paper's metric: 0 inside a server), and the per-GPU
// compute load (expected token-expert pairs).

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "moe/config.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/topology/topology.hpp"

namespace moe::topology {

enum class Level { nvlink, nic, fabric };

inline char const* level_name(Level l) {
  switch (l) {
    case Level::nvlink:
      return "nvlink";
    case Level::nic:
      return "nic";
    case Level::fabric:
      return "fabric";
  }
  return "?";
}

/// One directed link. Nodes 0 .. V-1 are the topology's vertices, V + g is GPU g.
struct Link {
  int from = 0, to = 0;
  Level level = Level::fabric;
  double bandwidth = 0;  ///< bytes per second
  double latency = 0;    ///< seconds
};

/// The copies of every expert of one layer and the share of the expert's tokens each serves.
struct LayerCopies {
  replication::CopyLists copies;  ///< expert e's GPUs: copies.ranks[first[e] .. first[e + 1])
  std::vector<double> share;      ///< parallel to copies.ranks; each expert's shares sum to 1

  [[nodiscard]] int experts() const { return static_cast<int>(copies.first.size()) - 1; }
};

/// Equal shares (1 / copies) for every copy.
inline LayerCopies equal_shares(replication::CopyLists copies) {
  LayerCopies out;
  out.copies = std::move(copies);
  check(!out.copies.first.empty() && out.copies.first.front() == 0, "equal_shares: malformed copy lists");
  out.share.resize(out.copies.ranks.size());
  for (int e = 0; e < out.experts(); ++e) {
    int n = out.copies.copies(e);
    check(n > 0, "equal_shares: expert ", e, " has no copy");
    for (int i = out.copies.first[static_cast<std::size_t>(e)]; i < out.copies.first[static_cast<std::size_t>(e) + 1];
         ++i)
      out.share[static_cast<std::size_t>(i)] = 1.0 / n;
  }
  return out;
}

/// Tokens of one layer: where each token is (its attention rank's GPU) and its top-k experts.
struct Batch {
  int top_k = 0;
  std::vector<int> source;   ///< per token
  std::vector<int> experts;  ///< tokens x top_k, row-major
  [[nodiscard]] int tokens() const { return static_cast<int>(source.size()); }
};

/// Source GPU of each of `tokens` tokens spread over the attention ranks as the layer does: every
/// rank holds a contiguous block, rank i the tokens [i T / A, (i + 1) T / A).
inline std::vector<int> spread_tokens(int tokens, std::span<int const> attention_ranks) {
  check(tokens >= 0, "spread_tokens: negative token count ", tokens);
  check(!attention_ranks.empty(), "spread_tokens: no attention ranks");
  auto A = static_cast<long long>(attention_ranks.size());
  std::vector<int> out(static_cast<std::size_t>(tokens));
  for (long long i = 0, t = 0; i < A; ++i)
    for (long long end = (i + 1) * tokens / A; t < end; ++t)
      out[static_cast<std::size_t>(t)] = attention_ranks[static_cast<std::size_t>(i)];
  return out;
}

/// How the token-level mode picks the copy that serves a (token, expert) pair.
enum class Choice {
  by_share,    ///< copy c with probability share(c), independently per expert (expected bytes)
  like_layer,  ///< replication::Table::choose, as moe::Layer does: the copy on the token's own GPU
               ///< if there is one, else copy (source + token) mod copies, token = index in the
               ///< batch (the global index when each rank passes first_token); shares are ignored
};

struct TrafficOptions {
  int hidden = 7168;               ///< elements per token vector (DeepSeek-V3/R1: 7168)
  double bytes_per_element = 2.0;  ///< 2 for BF16 (dispatch and combine alike)
  Choice choice = Choice::by_share;
  [[nodiscard]] double token_bytes() const { return hidden * bytes_per_element; }
};

struct TrafficReport {
  std::vector<double> dispatch_bytes;  ///< per directed link (TrafficModel::link(i))
  std::vector<double> combine_bytes;   ///< per directed link
  std::vector<double> gpu_load;        ///< expected token-expert pairs each GPU computes
  double dispatch_time = 0;            ///< bottleneck transfer + latency, seconds
  double combine_time = 0;
  double dispatch_transfer = 0;  ///< max over links of bytes / bandwidth, seconds
  double combine_transfer = 0;
  double latency = 0;            ///< largest path latency among the GPU pairs that exchange bytes
  int dispatch_bottleneck = -1;  ///< link index of the dispatch maximum (-1: no traffic)
  int combine_bottleneck = -1;
  double hop_bytes = 0;               ///< dispatch + combine bytes x server hops (ILP paper's metric)
  double remote_crossings = 0;        ///< expected (token, destination GPU) pairs sent over a link
  double destinations_per_token = 0;  ///< expected distinct GPUs a token's experts run on (token mode)

  [[nodiscard]] double time() const { return dispatch_time + combine_time; }
};

class TrafficModel {
 public:
  /// Most servers: the model keeps a list of link shares for each of the S^2 server pairs (the
  /// 64-server paper cluster: 4,096 lists, about 40k entries).
  static constexpr int max_servers = 1024;

  explicit TrafficModel(Topology const& t) : TrafficModel(t, t.link_params()) {}

  /// Precomputes, for every ordered pair of servers, the fraction of their flow on each directed
  /// link. Throws moe::Error when the topology is not finalized or two servers are not connected.
  TrafficModel(Topology const& t, LinkParams const& p) : params_(p) {
    check(t.finalized(), "traffic model: the topology is not finalized (call finalize())");
    p.validate();
    V_ = t.vertices();
    S_ = t.servers();
    G_ = t.gpus();
    check(S_ <= max_servers, "traffic model: the topology has ", S_,
          " servers; the per-server-pair link shares (S^2 lists) "
          "are kept for at most ",
          max_servers);
    std::vector<int> server_of_vertex(static_cast<std::size_t>(V_), -1);
    for (int s = 0; s < S_; ++s) server_of_vertex[static_cast<std::size_t>(t.server_vertex(s))] = s;
    server_of_gpu_.resize(static_cast<std::size_t>(G_));
    for (int g = 0; g < G_; ++g) server_of_gpu_[static_cast<std::size_t>(g)] = t.server_of(g);

    // Directed links: the topology's (both directions, in vertex order), then GPU up/down links.
    // A vertex pair joined by several parallel links gets one directed link per link.
    out_.assign(static_cast<std::size_t>(V_), {});
    for (int v = 0; v < V_; ++v)
      for (int w : t.neighbors(v)) {
        Link l;
        l.from = v;
        l.to = w;
        int sv = server_of_vertex[static_cast<std::size_t>(v)], sw = server_of_vertex[static_cast<std::size_t>(w)];
        if (sv < 0 && sw < 0) {
          l.level = Level::fabric;
          l.bandwidth = p.fabric.bandwidth;
          l.latency = p.fabric.latency;
        } else {
          int gpus = std::numeric_limits<int>::max();
          if (sv >= 0) gpus = std::min(gpus, t.gpus_of_server(sv));
          if (sw >= 0) gpus = std::min(gpus, t.gpus_of_server(sw));
          l.level = Level::nic;
          l.bandwidth = p.nic.bandwidth * gpus;
          l.latency = p.nic.latency;
        }
        out_[static_cast<std::size_t>(v)].push_back(static_cast<int>(links_.size()));
        links_.push_back(l);
      }
    up_.resize(static_cast<std::size_t>(G_));
    down_.resize(static_cast<std::size_t>(G_));
    for (int g = 0; g < G_; ++g) {
      int sv = t.server_vertex(t.server_of(g));
      up_[static_cast<std::size_t>(g)] = static_cast<int>(links_.size());
      links_.push_back({V_ + g, sv, Level::nvlink, p.nvlink.bandwidth, p.nvlink.latency});
      down_[static_cast<std::size_t>(g)] = static_cast<int>(links_.size());
      links_.push_back({sv, V_ + g, Level::nvlink, p.nvlink.bandwidth, p.nvlink.latency});
    }

    // Per source server: BFS (distance, path counts sigma, worst path latency); per target server:
    // walk the DAG backwards, counting paths to the target (tau), and record every DAG link on a
    // shortest path with its fraction sigma(u) tau(v) / sigma(target).
    first_.assign(1, 0);
    hops_.assign(static_cast<std::size_t>(S_) * static_cast<std::size_t>(S_), 0);
    path_latency_.assign(hops_.size(), 0.0);
    std::vector<int> dist(static_cast<std::size_t>(V_)), order;
    std::vector<double> sigma(static_cast<std::size_t>(V_)), lat(static_cast<std::size_t>(V_)),
        tau(static_cast<std::size_t>(V_), 0.0);
    std::vector<int> on_path;
    for (int a = 0; a < S_; ++a) {
      int src = t.server_vertex(a);
      std::fill(dist.begin(), dist.end(), -1);
      std::fill(sigma.begin(), sigma.end(), 0.0);
      std::fill(lat.begin(), lat.end(), 0.0);
      order.clear();
      dist[static_cast<std::size_t>(src)] = 0;
      sigma[static_cast<std::size_t>(src)] = 1;
      order.push_back(src);
      for (std::size_t i = 0; i < order.size(); ++i) {
        int u = order[i];
        for (int li : out_[static_cast<std::size_t>(u)]) {
          auto const& l = links_[static_cast<std::size_t>(li)];
          auto& dv = dist[static_cast<std::size_t>(l.to)];
          if (dv < 0) {
            dv = dist[static_cast<std::size_t>(u)] + 1;
            order.push_back(l.to);
            lat[static_cast<std::size_t>(l.to)] = lat[static_cast<std::size_t>(u)] + l.latency;
          }
          if (dv == dist[static_cast<std::size_t>(u)] + 1) {
            sigma[static_cast<std::size_t>(l.to)] += sigma[static_cast<std::size_t>(u)];
            lat[static_cast<std::size_t>(l.to)] =
                std::max(lat[static_cast<std::size_t>(l.to)], lat[static_cast<std::size_t>(u)] + l.latency);
          }
        }
      }
      for (int b = 0; b < S_; ++b) {
        int dst = t.server_vertex(b);
        check(dist[static_cast<std::size_t>(dst)] >= 0, "traffic model: no path from server '", t.server_name(a),
              "' to server '", t.server_name(b), "'");
        std::size_t ab = pair(a, b);
        hops_[ab] = dist[static_cast<std::size_t>(dst)];
        path_latency_[ab] = lat[static_cast<std::size_t>(dst)];
        // Vertices on a shortest a -> b path: a breadth-first walk back from dst over DAG links
        // (u -> v with dist(u) = dist(v) - 1), so on_path is ordered by increasing distance to dst.
        // tau(v), the number of shortest v -> dst paths, is final when v is read: every successor
        // of v is one step closer to dst and was read (and added its tau to v's) before v.
        on_path.clear();
        tau[static_cast<std::size_t>(dst)] = 1;
        on_path.push_back(dst);
        std::size_t mark = entries_.size();
        for (std::size_t i = 0; i < on_path.size(); ++i) {
          int v = on_path[i];
          for (int li : out_[static_cast<std::size_t>(v)]) {
            int u = links_[static_cast<std::size_t>(li)].to;  // a neighbour; links are symmetric
            if (dist[static_cast<std::size_t>(u)] != dist[static_cast<std::size_t>(v)] - 1) continue;
            if (tau[static_cast<std::size_t>(u)] == 0) on_path.push_back(u);
            tau[static_cast<std::size_t>(u)] += tau[static_cast<std::size_t>(v)];
          }
        }
        // Every DAG link u -> v between two vertices of on_path lies on sigma(u) tau(v) of the
        // sigma(dst) shortest paths.
        double total = sigma[static_cast<std::size_t>(dst)];
        check(std::isfinite(total), "traffic model: too many shortest paths from server '", t.server_name(a),
              "' to server '", t.server_name(b), "' to count in double precision");
        for (int u : on_path)
          for (int li : out_[static_cast<std::size_t>(u)]) {
            int v = links_[static_cast<std::size_t>(li)].to;
            if (dist[static_cast<std::size_t>(v)] != dist[static_cast<std::size_t>(u)] + 1 ||
                tau[static_cast<std::size_t>(v)] == 0)
              continue;
            entries_.push_back({li, sigma[static_cast<std::size_t>(u)] * tau[static_cast<std::size_t>(v)] / total});
          }
        std::sort(entries_.begin() + static_cast<long>(mark), entries_.end(),
                  [](Entry const& x, Entry const& y) { return x.link < y.link; });
        first_.push_back(static_cast<long long>(entries_.size()));
        for (int v : on_path) tau[static_cast<std::size_t>(v)] = 0;
      }
    }
  }

  [[nodiscard]] int gpus() const { return G_; }
  [[nodiscard]] int servers() const { return S_; }
  [[nodiscard]] int vertices() const { return V_; }
  [[nodiscard]] int links() const { return static_cast<int>(links_.size()); }
  [[nodiscard]] Link const& link(int i) const { return links_[static_cast<std::size_t>(i)]; }
  [[nodiscard]] LinkParams const& params() const { return params_; }
  /// Total (link, fraction) entries over all server pairs (the precomputed share vectors).
  [[nodiscard]] std::size_t share_entries() const { return entries_.size(); }
  /// Server hops between two GPUs (0 inside a server), as Topology::hops.
  [[nodiscard]] int hops(int gpu_a, int gpu_b) const { return hops_[pair(server(gpu_a), server(gpu_b))]; }
  /// Sum of link latencies on the slowest shortest path between two distinct GPUs.
  [[nodiscard]] double path_latency(int gpu_a, int gpu_b) const {
    return 2 * params_.nvlink.latency + path_latency_[pair(server(gpu_a), server(gpu_b))];
  }
  /// Fraction of the gpu_a -> gpu_b flow on every directed link it uses (empty when a == b).
  [[nodiscard]] std::vector<std::pair<int, double>> shares(int gpu_a, int gpu_b) const {
    check_gpu(gpu_a, "shares");
    check_gpu(gpu_b, "shares");
    std::vector<std::pair<int, double>> out;
    if (gpu_a == gpu_b) return out;
    out.emplace_back(up_[static_cast<std::size_t>(gpu_a)], 1.0);
    std::size_t ab = pair(server(gpu_a), server(gpu_b));
    for (long long i = first_[ab]; i < first_[ab + 1]; ++i)
      out.emplace_back(entries_[static_cast<std::size_t>(i)].link, entries_[static_cast<std::size_t>(i)].fraction);
    out.emplace_back(down_[static_cast<std::size_t>(gpu_b)], 1.0);
    return out;
  }

  /// Token-level mode: one layer's batch on a placement (see the header comment).
  [[nodiscard]] TrafficReport evaluate(LayerCopies const& placement, Batch const& batch,
                                       TrafficOptions const& opt = {}) const {
    validate(placement, opt);
    int k = batch.top_k, E = placement.experts();
    check(k > 0, "traffic: top_k must be positive, got ", k);
    check(batch.experts.size() == batch.source.size() * static_cast<std::size_t>(k), "traffic: the batch has ",
          batch.source.size(), " tokens and ", batch.experts.size(),
          " expert ids, expected tokens x top_k = ", batch.source.size() * static_cast<std::size_t>(k));
    Flows f(G_, S_);
    TrafficReport r;
    r.gpu_load.assign(static_cast<std::size_t>(G_), 0.0);
    std::vector<double> stay(static_cast<std::size_t>(G_), 1.0);  // prod (1 - share) per destination
    std::vector<int> touched;
    double destinations = 0;
    for (int t = 0; t < batch.tokens(); ++t) {
      int src = batch.source[static_cast<std::size_t>(t)];
      check(src >= 0 && src < G_, "traffic: token ", t, " comes from GPU ", src, ", outside the topology's [0, ", G_,
            ")");
      int const* ex = batch.experts.data() + static_cast<std::size_t>(t) * static_cast<std::size_t>(k);
      touched.clear();
      for (int j = 0; j < k; ++j) {
        int e = ex[j];
        check(e >= 0 && e < E, "traffic: token ", t, " routes to expert ", e, ", outside [0, ", E, ")");
        for (int i = 0; i < j; ++i)
          check(ex[i] != e, "traffic: token ", t, " lists expert ", e, " twice among its top-", k);
        int lo = placement.copies.first[static_cast<std::size_t>(e)];
        int hi = placement.copies.first[static_cast<std::size_t>(e) + 1];
        if (opt.choice == Choice::like_layer) {
          int pick = lo + static_cast<int>((static_cast<long long>(src) + t) % (hi - lo));
          for (int c = lo; c < hi; ++c)
            if (placement.copies.ranks[static_cast<std::size_t>(c)] == src) pick = c;
          lo = pick;
          hi = pick + 1;
        }
        for (int c = lo; c < hi; ++c) {
          int g = placement.copies.ranks[static_cast<std::size_t>(c)];
          double s = opt.choice == Choice::like_layer ? 1.0 : placement.share[static_cast<std::size_t>(c)];
          r.gpu_load[static_cast<std::size_t>(g)] += s;
          auto& q = stay[static_cast<std::size_t>(g)];
          if (q == 1.0 && std::find(touched.begin(), touched.end(), g) == touched.end()) touched.push_back(g);
          q *= 1.0 - s;
        }
      }
      for (int g : touched) {
        double w = 1.0 - stay[static_cast<std::size_t>(g)];
        stay[static_cast<std::size_t>(g)] = 1.0;
        destinations += w;
        if (g != src) add(f, src, g, w);
      }
    }
    r.destinations_per_token = batch.tokens() > 0 ? destinations / batch.tokens() : 0.0;
    accumulate(f, opt, r);
    return r;
  }

  /// Token-level mode with a replica policy (replication::Table, replication::Routed, ...): each
  /// (token, expert) pair goes to replicas.choose(e, primary[e], source, first_token + t), exactly as
  /// moe::Layer routes it with that policy; no shares are involved, so the bytes are those of this
  /// batch, not expectations.
  template <class Replicas>
  [[nodiscard]] TrafficReport evaluate_policy(Replicas const& replicas, std::span<int const> primary,
                                              Batch const& batch, TrafficOptions const& opt = {},
                                              long long first_token = 0) const {
    int k = batch.top_k, E = static_cast<int>(primary.size());
    check(k > 0, "traffic: top_k must be positive, got ", k);
    check(opt.hidden > 0 && std::isfinite(opt.bytes_per_element) && opt.bytes_per_element > 0,
          "traffic: token size must be positive");
    check(batch.experts.size() == batch.source.size() * static_cast<std::size_t>(k), "traffic: the batch has ",
          batch.source.size(), " tokens and ", batch.experts.size(), " expert ids, expected tokens x top_k");
    Flows f(G_, S_);
    TrafficReport r;
    r.gpu_load.assign(static_cast<std::size_t>(G_), 0.0);
    std::vector<int> dest;
    double destinations = 0;
    for (int t = 0; t < batch.tokens(); ++t) {
      int src = batch.source[static_cast<std::size_t>(t)];
      check(src >= 0 && src < G_, "traffic: token ", t, " comes from GPU ", src, ", outside [0, ", G_, ")");
      dest.clear();
      for (int j = 0; j < k; ++j) {
        int e = batch.experts[static_cast<std::size_t>(t) * static_cast<std::size_t>(k) + static_cast<std::size_t>(j)];
        check(e >= 0 && e < E, "traffic: token ", t, " routes to expert ", e, ", outside [0, ", E, ")");
        int g = replicas.choose(e, primary[static_cast<std::size_t>(e)], src, first_token + t);
        check(g >= 0 && g < G_, "traffic: the replica policy sends expert ", e, " to GPU ", g, ", outside [0, ", G_,
              ")");
        r.gpu_load[static_cast<std::size_t>(g)] += 1;
        if (std::find(dest.begin(), dest.end(), g) == dest.end()) dest.push_back(g);
      }
      destinations += static_cast<double>(dest.size());
      for (int g : dest)
        if (g != src) add(f, src, g, 1.0);
    }
    r.destinations_per_token = batch.tokens() > 0 ? destinations / batch.tokens() : 0.0;
    accumulate(f, opt, r);
    return r;
  }

  /// Aggregate mode: expected loads (token-expert pairs per expert of this layer) arriving
  /// uniformly from the attention ranks, no de-duplication (see the header comment).
  [[nodiscard]] TrafficReport evaluate_expected(LayerCopies const& placement, std::span<double const> load,
                                                std::span<int const> attention_ranks,
                                                TrafficOptions const& opt = {}) const {
    validate(placement, opt);
    int E = placement.experts();
    check(static_cast<int>(load.size()) == E, "traffic: ", load.size(), " expert loads for a placement of ", E,
          " experts");
    check(!attention_ranks.empty(), "traffic: no attention ranks");
    for (int a : attention_ranks)
      check(a >= 0 && a < G_, "traffic: attention rank on GPU ", a, ", outside the topology's [0, ", G_, ")");
    Flows flows(G_, S_);
    TrafficReport r;
    r.gpu_load.assign(static_cast<std::size_t>(G_), 0.0);
    double per_rank = 1.0 / static_cast<double>(attention_ranks.size());
    for (int e = 0; e < E; ++e) {
      double x = load[static_cast<std::size_t>(e)];
      check(std::isfinite(x) && x >= 0, "traffic: expert ", e, " has load ", x, "; loads must be finite and >= 0");
      for (int c = placement.copies.first[static_cast<std::size_t>(e)];
           c < placement.copies.first[static_cast<std::size_t>(e) + 1]; ++c) {
        int g = placement.copies.ranks[static_cast<std::size_t>(c)];
        double f = x * placement.share[static_cast<std::size_t>(c)];
        r.gpu_load[static_cast<std::size_t>(g)] += f;
        for (int a : attention_ranks)
          if (a != g) add(flows, a, g, f * per_rank);
      }
    }
    accumulate(flows, opt, r);
    return r;
  }

  /// Writes the per-link table: from, to, level, bandwidth, dispatch and combine bytes and times.
  void write_links(std::ostream& os, Topology const& t, TrafficReport const& r) const {
    check(r.dispatch_bytes.size() == links_.size(), "traffic: the report is not from this model");
    auto name = [&](int node) {
      return node < V_ ? t.vertex_name(node) : std::string("gpu").append(std::to_string(node - V_));
    };
    os << "# from\tto\tlevel\tbandwidth_GBps\tdispatch_bytes\tcombine_bytes\tdispatch_us\tcombine_us\n";
    for (std::size_t i = 0; i < links_.size(); ++i) {
      auto const& l = links_[i];
      os << name(l.from) << '\t' << name(l.to) << '\t' << level_name(l.level) << '\t' << l.bandwidth / 1e9 << '\t'
         << r.dispatch_bytes[i] << '\t' << r.combine_bytes[i] << '\t' << r.dispatch_bytes[i] / l.bandwidth * 1e6 << '\t'
         << r.combine_bytes[i] / l.bandwidth * 1e6 << '\n';
    }
  }

 private:
  struct Entry {
    int link;
    double fraction;
  };

  [[nodiscard]] std::size_t pair(int a, int b) const {
    return static_cast<std::size_t>(a) * static_cast<std::size_t>(S_) + static_cast<std::size_t>(b);
  }
  [[nodiscard]] int server(int g) const { return server_of_gpu_[static_cast<std::size_t>(g)]; }
  void check_gpu(int g, char const* what) const {
    check(g >= 0 && g < G_, "traffic: ", what, ": GPU ", g, " outside the topology's [0, ", G_, ")");
  }

  void validate(LayerCopies const& p, TrafficOptions const& opt) const {
    check(opt.hidden > 0, "traffic: hidden size must be positive, got ", opt.hidden);
    check(std::isfinite(opt.bytes_per_element) && opt.bytes_per_element > 0,
          "traffic: bytes per element must be positive, got ", opt.bytes_per_element);
    auto const& c = p.copies;
    check(!c.first.empty() && c.first.front() == 0 && c.first.back() == static_cast<int>(c.ranks.size()),
          "traffic: malformed copy lists (first must start at 0 and end at the number of copies)");
    check(p.share.size() == c.ranks.size(), "traffic: ", p.share.size(), " shares for ", c.ranks.size(), " copies");
    for (int e = 0; e < p.experts(); ++e) {
      int lo = c.first[static_cast<std::size_t>(e)], hi = c.first[static_cast<std::size_t>(e) + 1];
      check(hi > lo, "traffic: expert ", e, " has no copy");
      double sum = 0;
      for (int i = lo; i < hi; ++i) {
        int g = c.ranks[static_cast<std::size_t>(i)];
        check(g >= 0 && g < G_, "traffic: expert ", e, " has a copy on GPU ", g, ", outside the topology's [0, ", G_,
              ")");
        for (int j = lo; j < i; ++j)
          check(c.ranks[static_cast<std::size_t>(j)] != g, "traffic: expert ", e, " lists GPU ", g, " twice");
        double s = p.share[static_cast<std::size_t>(i)];
        check(std::isfinite(s) && s >= 0 && s <= 1, "traffic: expert ", e, " copy on GPU ", g, " has share ", s,
              ", outside [0, 1]");
        sum += s;
      }
      check(std::abs(sum - 1.0) <= 1e-9, "traffic: the shares of expert ", e, " sum to ", sum, ", not 1");
    }
  }

  /// Dispatch flows in tokens: what each GPU sends and receives (its NVLink up and down links),
  /// and server -> server totals (pairs of GPUs in one server on the diagonal). G + S^2 numbers, so
  /// an evaluation needs no G x G matrix.
  struct Flows {
    std::vector<double> sent, received, server_server;
    Flows(int G, int S)
        : sent(static_cast<std::size_t>(G), 0.0),
          received(static_cast<std::size_t>(G), 0.0),
          server_server(static_cast<std::size_t>(S) * static_cast<std::size_t>(S), 0.0) {}
  };
  /// w tokens dispatched from GPU a to GPU b != a.
  void add(Flows& f, int a, int b, double w) const {
    f.sent[static_cast<std::size_t>(a)] += w;
    f.received[static_cast<std::size_t>(b)] += w;
    f.server_server[pair(server(a), server(b))] += w;
  }

  /// Spreads the flows over the links (dispatch a -> b, combine b -> a).
  void accumulate(Flows const& f, TrafficOptions const& opt, TrafficReport& r) const {
    double bytes = opt.token_bytes();
    std::size_t L = links_.size();
    r.dispatch_bytes.assign(L, 0.0);
    r.combine_bytes.assign(L, 0.0);
    for (int g = 0; g < G_; ++g) {
      double out = f.sent[static_cast<std::size_t>(g)] * bytes, in = f.received[static_cast<std::size_t>(g)] * bytes;
      r.remote_crossings += f.sent[static_cast<std::size_t>(g)];
      r.dispatch_bytes[static_cast<std::size_t>(up_[static_cast<std::size_t>(g)])] += out;
      r.dispatch_bytes[static_cast<std::size_t>(down_[static_cast<std::size_t>(g)])] += in;
      r.combine_bytes[static_cast<std::size_t>(up_[static_cast<std::size_t>(g)])] += in;
      r.combine_bytes[static_cast<std::size_t>(down_[static_cast<std::size_t>(g)])] += out;
    }
    for (int sa = 0; sa < S_; ++sa)
      for (int sb = 0; sb < S_; ++sb) {
        std::size_t ab = pair(sa, sb);
        double x = f.server_server[ab] * bytes;
        if (x == 0) continue;
        r.hop_bytes += 2 * x * hops_[ab];
        r.latency = std::max(r.latency, 2 * params_.nvlink.latency + path_latency_[ab]);
        for (long long i = first_[ab]; i < first_[ab + 1]; ++i) {
          auto const& en = entries_[static_cast<std::size_t>(i)];
          r.dispatch_bytes[static_cast<std::size_t>(en.link)] += x * en.fraction;
        }
        std::size_t ba = pair(sb, sa);
        for (long long i = first_[ba]; i < first_[ba + 1]; ++i) {
          auto const& en = entries_[static_cast<std::size_t>(i)];
          r.combine_bytes[static_cast<std::size_t>(en.link)] += x * en.fraction;
        }
      }
    for (std::size_t i = 0; i < L; ++i) {
      double d = r.dispatch_bytes[i] / links_[i].bandwidth, c = r.combine_bytes[i] / links_[i].bandwidth;
      if (r.dispatch_bytes[i] > 0 && d > r.dispatch_transfer) {
        r.dispatch_transfer = d;
        r.dispatch_bottleneck = static_cast<int>(i);
      }
      if (r.combine_bytes[i] > 0 && c > r.combine_transfer) {
        r.combine_transfer = c;
        r.combine_bottleneck = static_cast<int>(i);
      }
    }
    r.dispatch_time = r.dispatch_transfer + r.latency;
    r.combine_time = r.combine_transfer + r.latency;
  }

  LinkParams params_;
  int V_ = 0, S_ = 0, G_ = 0;
  std::vector<Link> links_;
  std::vector<std::vector<int>> out_;  ///< outgoing topology links per vertex
  std::vector<int> up_, down_;         ///< GPU -> server and server -> GPU link per GPU
  std::vector<int> server_of_gpu_;
  std::vector<long long> first_;  ///< server pair (a S + b) -> entries_[first_[ab] .. first_[ab + 1])
  std::vector<Entry> entries_;
  std::vector<int> hops_;
  std::vector<double> path_latency_;  ///< topology part only (no NVLink), per server pair
};

}  // namespace moe::topology
