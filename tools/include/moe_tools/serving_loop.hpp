#pragma once
// The scenario of the serving-loop study (tools/planner/serving_loop.cpp, its benchmark
// benchmarks/planners/bench_serving_loop.cpp, docs/results/serving-loop.md): the models, the
// drifting batches and the slot-table helpers both programs share.
//
// Models (layer 7 of the recorded routing; shapes from moe/models; expert weights bf16, three
// matrices of hidden x expert_ffn):
//   olmoe      OLMoE-1B-7B, 64 experts top-8, 8 ranks (preset h800:1), 72 slots (9 per rank)
//   mixtral    Mixtral-8x7B, 8 experts top-2, 8 ranks (preset h800:1), 16 slots (2 per rank)
//   dsv3-h800  DeepSeek-V3 shape, 256 experts top-8 in 8 groups, EP32 (preset h800:4), 288 slots
//   dsv3-dgx   the same on preset dgx-h100:4
// Drift over P passes: passes [0, b1) draw from arxiv, [b1, b2) from a mix whose github share
// rises linearly to 1 at pass b2 - 1, [b2, P) from a github/book mix whose book share rises
// linearly to 1 at the last pass; b1 = ceil(P / 3), b2 = ceil(2P / 3) (P = 2000: 667 and 1334).
// A token of a mixed pass comes from the second domain with probability equal to its share.
// Real models: a token is one of the domain's recorded token -> expert rows
// (profile::TokenSampler: real co-activation). DeepSeek-V3: no recorded routing; each OLMoE
// layer-7 expert of the domain stands for 4 experts, each scaled by exp(0.3 N(0,1)) (seed 21, the
// same factor in every domain), and a token takes top-8 distinct experts drawn from that marginal.
// Every pass's batch is drawn from its own seeded stream (seed, pass), so all strategies see the
// same tokens and a pass can be drawn again on its own.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moe/config.hpp"
#include "moe/models/models.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/profile/olmoe_tokens.hpp"
#include "moe/profile/route_profile.hpp"
#include "moe/profile/token_batches.hpp"
#include "moe/replication/migration.hpp"
#include "moe/topology/presets.hpp"
#include "moe/topology/traffic.hpp"

namespace moe::tools::serving {

inline constexpr int kLayer = 7;
inline constexpr std::array<char const*, 3> kDomains{"arxiv", "github", "book"};
inline constexpr std::array<char const*, 4> kModelNames{"olmoe", "mixtral", "dsv3-h800", "dsv3-dgx"};

struct Model {
  std::string name, preset;
  int experts = 0, top_k = 0, slots = 0, groups = 1, hidden = 0, ffn = 0, moe_layers = 0;
  double expert_bytes = 0;  ///< one routed expert's weights (bf16 gate, up, down)
  bool real = false;        ///< tokens from recorded rows (olmoe, mixtral)
  std::vector<profile::RouteProfile> profiles;   ///< real: one per domain (kDomains order)
  std::vector<profile::TokenSampler> samplers;   ///< real: over `profiles` (point into them)
  std::vector<std::vector<double>> cumulative;   ///< synthetic: per domain, running sums of the marginal
  std::vector<std::vector<double>> marginals;    ///< synthetic: per domain

  Model() = default;
  Model(Model const&) = delete;  // the samplers point into this object's profiles
  Model& operator=(Model const&) = delete;
  Model(Model&&) = default;  // a moved vector keeps its buffer: the pointers stay valid
  Model& operator=(Model&&) = default;
};

/// Layer kLayer of one domain's recorded token -> expert counts.
inline profile::RouteProfile read_domain(std::string const& data_dir, std::string const& model_dir,
                                         std::string const& domain, int experts, int k) {
  profile::RouteRecorder rec(experts, k);
  core::TsvReader in(data_dir + "/olmoe-routing/" + model_dir + "/" + domain + "/token_expert_counts.tsv");
  profile::load_token_expert_counts(in, rec, [](int l) { return l == kLayer; });
  return rec.profile();
}

template <class Shape>
void set_shape(Model& m) {
  constexpr auto s = Shape::spec;
  m.experts = s.experts, m.top_k = s.top_k, m.hidden = s.hidden, m.ffn = s.expert_ffn, m.moe_layers = s.moe_layers;
  m.groups = s.groups > 0 ? s.groups : 1;
  m.expert_bytes = 3.0 * s.hidden * s.expert_ffn * 2.0;
}

/// One of kModelNames; `data_dir` holds olmoe-routing/.
inline Model make_model(std::string const& name, std::string const& data_dir) {
  Model m;
  m.name = name;
  if (name == "olmoe" || name == "mixtral") {
    bool o = name == "olmoe";
    if (o) set_shape<models::OLMoE_1B_7B>(m);
    else set_shape<models::Mixtral8x7B>(m);
    m.preset = "h800:1";
    m.slots = o ? 72 : 16;
    m.real = true;
    for (auto const* d : kDomains)
      m.profiles.push_back(read_domain(data_dir, o ? "olmoe-1b-7b" : "mixtral-8x7b", d, m.experts, m.top_k));
    for (auto const& p : m.profiles) m.samplers.emplace_back(p, kLayer);
  } else if (name == "dsv3-h800" || name == "dsv3-dgx") {
    set_shape<models::DeepSeekV3>(m);
    m.preset = name == "dsv3-h800" ? "h800:4" : "dgx-h100:4";
    m.slots = 288;
    std::vector<double> factor(static_cast<std::size_t>(m.experts));
    profile::Rng rng(21);
    for (auto& f : factor) f = std::exp(0.3 * rng.normal());
    for (auto const* d : kDomains) {
      auto base = read_domain(data_dir, "olmoe-1b-7b", d, 64, 8).layer(kLayer).expert_load();
      std::vector<double> w(static_cast<std::size_t>(m.experts)), c(w.size());
      double sum = 0;
      for (std::size_t e = 0; e < w.size(); ++e) {
        w[e] = static_cast<double>(base[e / 4]) * factor[e];
        c[e] = sum += w[e];
      }
      m.marginals.push_back(std::move(w));
      m.cumulative.push_back(std::move(c));
    }
  } else {
    fail("unknown model '", name, "' (olmoe, mixtral, dsv3-h800, dsv3-dgx)");
  }
  return m;
}

/// The domains of a pass: a fraction `w` of its tokens from domain b, the rest from domain a.
struct Mix {
  int a = 0, b = 0;
  double w = 0;
};

inline Mix mix_at(int pass, int passes) {
  int b1 = (passes + 2) / 3, b2 = (2 * passes + 2) / 3;
  if (pass < b1) return {0, 0, 0.0};
  if (pass < b2) return {0, 1, static_cast<double>(pass - b1 + 1) / (b2 - b1)};
  return {1, 2, static_cast<double>(pass - b2 + 1) / (passes - b2)};
}

/// `tokens` tokens of top-k distinct experts from a synthetic marginal's running sums.
inline void draw_synthetic(std::vector<double> const& cum, int k, int tokens, profile::Rng& rng, std::vector<int>& out) {
  for (int t = 0; t < tokens; ++t) {
    std::size_t first = out.size();
    while (out.size() - first < static_cast<std::size_t>(k)) {
      double x = rng.uniform() * cum.back();
      int e = static_cast<int>(std::upper_bound(cum.begin(), cum.end(), x) - cum.begin());
      e = std::min(e, static_cast<int>(cum.size()) - 1);
      if (std::find(out.begin() + static_cast<long>(first), out.end(), e) == out.end()) out.push_back(e);
    }
  }
}

/// Pass `pass` of `passes`: `tokens` tokens on each of `ranks` ranks (a rank's tokens are one
/// contiguous block, as the layer numbers them), seeded by (seed, pass).
inline topology::Batch draw_pass(Model const& m, int ranks, int pass, int passes, int tokens, std::uint64_t seed) {
  Mix x = mix_at(pass, passes);
  profile::Rng rng(seed * 0x9E3779B97F4A7C15ull ^ (0xD1B54A32D192ED03ull * static_cast<std::uint64_t>(pass + 1)));
  topology::Batch b;
  b.top_k = m.top_k;
  b.experts.reserve(static_cast<std::size_t>(ranks) * static_cast<std::size_t>(tokens) * static_cast<std::size_t>(m.top_k));
  for (int r = 0; r < ranks; ++r) {
    int nb = 0;
    for (int t = 0; t < tokens; ++t) nb += rng.uniform() < x.w ? 1 : 0;
    int na = tokens - nb;
    if (m.real) {
      m.samplers[static_cast<std::size_t>(x.a)].sample(na, rng, b.experts);
      m.samplers[static_cast<std::size_t>(x.b)].sample(nb, rng, b.experts);
    } else {
      draw_synthetic(m.cumulative[static_cast<std::size_t>(x.a)], m.top_k, na, rng, b.experts);
      draw_synthetic(m.cumulative[static_cast<std::size_t>(x.b)], m.top_k, nb, rng, b.experts);
    }
    b.source.insert(b.source.end(), static_cast<std::size_t>(tokens), r);
  }
  return b;
}

/// Pairs per expert of a batch.
inline void count_experts(topology::Batch const& b, std::vector<double>& per_expert) {
  for (int e : b.experts) per_expert[static_cast<std::size_t>(e)] += 1;
}

/// The least max/mean rank load of a batch over every layout that keeps each of `groups` expert
/// groups (expert e in group e / (E / groups)) whole on one of `nodes` nodes, groups / nodes groups
/// on each, as EPLB's hierarchical policy does: a node's ranks share at best its groups' pairs
/// evenly, so the bound is the best node packing's largest node over the mean node. The best
/// packing is found by trying every assignment (groups <= 8: at most 2,520 for 8 groups on 4 nodes).
inline double group_rule_bound(topology::Batch const& b, int experts, int groups, int nodes) {
  check(groups > 0 && nodes > 0 && groups % nodes == 0 && experts % groups == 0 && groups <= 8,
        "group_rule_bound: ", groups, " groups of ", experts, " experts on ", nodes, " nodes");
  std::vector<double> load(static_cast<std::size_t>(groups), 0.0);
  double total = 0;
  for (int e : b.experts) load[static_cast<std::size_t>(e / (experts / groups))] += 1, total += 1;
  if (total == 0) return 1.0;
  int per = groups / nodes;
  std::vector<double> node(static_cast<std::size_t>(nodes), 0.0);
  std::vector<int> fill(static_cast<std::size_t>(nodes), 0);
  double best = total;
  // Depth-first over assignments; node n is opened only after node n - 1 (nodes are alike).
  auto go = [&](auto&& self, int g, int opened, double worst) -> void {
    if (worst >= best) return;
    if (g == groups) {
      best = worst;
      return;
    }
    for (int n = 0; n < std::min(opened + 1, nodes); ++n) {
      auto un = static_cast<std::size_t>(n);
      if (fill[un] == per) continue;
      node[un] += load[static_cast<std::size_t>(g)], ++fill[un];
      self(self, g + 1, std::max(opened, n + 1), std::max(worst, node[un]));
      node[un] -= load[static_cast<std::size_t>(g)], --fill[un];
    }
  };
  go(go, 0, 0, 0.0);
  return best / (total / nodes);
}

/// The ranks holding each expert in one slot row (slot p on rank p / S), ascending, each once.
inline std::vector<std::vector<int>> copies_of(std::span<int const> row, int experts, int ranks) {
  check(ranks > 0 && row.size() % static_cast<std::size_t>(ranks) == 0, "copies_of: ", row.size(),
        " slots do not split over ", ranks, " ranks");
  auto S = static_cast<int>(row.size()) / ranks;
  std::vector<std::vector<int>> c(static_cast<std::size_t>(experts));
  for (std::size_t p = 0; p < row.size(); ++p) {
    int e = row[p], g = static_cast<int>(p) / S;
    check(e >= 0 && e < experts, "copies_of: slot ", p, " holds expert ", e);
    auto& v = c[static_cast<std::size_t>(e)];
    if (v.empty() || v.back() != g) v.push_back(g);
  }
  for (int e = 0; e < experts; ++e) check(!c[static_cast<std::size_t>(e)].empty(), "copies_of: expert ", e, " has no slot");
  return c;
}

/// The copies a layout change needs, by the rule of migration::rebalance: every slot of `now`
/// whose rank held no copy of its expert in `old` receives it from a rank that did (one on the
/// same server first, then the one with the fewest sends so far, then the lowest slot). Used for
/// the engine-style full reshuffle, whose plan does not come from migration::rebalance.
inline std::vector<replication::migration::Transfer> transfers_between(std::span<int const> old, std::span<int const> now,
                                                                       int ranks, int ranks_per_server, int layer = 0) {
  check(old.size() == now.size() && ranks > 0 && now.size() % static_cast<std::size_t>(ranks) == 0,
        "transfers_between: layouts of ", old.size(), " and ", now.size(), " slots over ", ranks, " ranks");
  int P = static_cast<int>(now.size()), S = P / ranks;
  std::vector<int> sends(static_cast<std::size_t>(ranks), 0);
  std::vector<replication::migration::Transfer> out;
  for (int p = 0; p < P; ++p) {
    int g = p / S, e = now[static_cast<std::size_t>(p)];
    bool had = false;
    for (int q = g * S; q < (g + 1) * S; ++q) had = had || old[static_cast<std::size_t>(q)] == e;
    if (had) continue;
    int src = -1;
    for (int q = 0; q < P; ++q) {
      if (old[static_cast<std::size_t>(q)] != e) continue;
      int c = q / S;
      if (src < 0) {
        src = c;
        continue;
      }
      bool nc = c / ranks_per_server == g / ranks_per_server, ns = src / ranks_per_server == g / ranks_per_server;
      if (nc != ns ? nc : sends[static_cast<std::size_t>(c)] < sends[static_cast<std::size_t>(src)]) src = c;
    }
    check(src >= 0, "transfers_between: expert ", e, " has no copy in the old layout");
    ++sends[static_cast<std::size_t>(src)];
    out.push_back({layer, p, e, src, g});
  }
  return out;
}

}  // namespace moe::tools::serving
