#pragma once
// Metrics of placement and replication plans, evaluated on a load profile.
//
// hops per forward pass (ILP paper): per token, sum over layers and chosen experts of
//   p(l, gpu) = hops(dispatch attention, gpu) + hops(gpu, collect attention). For batch b it is
//   sum_{l,e} load(b,l,e) / tokens(b,l) * p(l, gpu(l,e)), with tokens(b,l) = sum_e load / top_k.
// balancedness (CRAFT): for each layer and batch, mean GPU load / max GPU load, where an expert's
//   load is split over its copies by the copies' shares; averaged over layers and batches.
// replicas: copies beyond the first, in all and per GPU, and their memory in bytes.

#include <algorithm>
#include <cmath>
#include <vector>

#include "moe/config.hpp"
#include "moe/placement/problem.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/plan/replica_table.hpp"

namespace moe::placement {

struct MeanStd {
  double mean = 0, std = 0;
};

inline MeanStd mean_std(std::vector<double> const& v) {
  MeanStd r;
  if (v.empty()) return r;
  for (double x : v) r.mean += x;
  r.mean /= static_cast<double>(v.size());
  for (double x : v) r.std += (x - r.mean) * (x - r.mean);
  r.std = std::sqrt(r.std / static_cast<double>(v.size()));
  return r;
}

/// Hops per token of every batch of the profile (one value per batch).
inline std::vector<double> hops_per_batch(Problem const& p, Assignment const& a, profile::LoadProfile const& prof,
                                          int top_k) {
  check(prof.layers() == p.layers && prof.experts() == p.experts, "hops: profile shape ", prof.layers(), "x",
        prof.experts(), " does not match the problem's ", p.layers, "x", p.experts);
  check(top_k > 0, "hops: top_k must be positive");
  p.validate();
  check(a.layers == p.layers && a.experts == p.experts &&
            a.gpu.size() == static_cast<std::size_t>(p.layers) * static_cast<std::size_t>(p.experts),
        "hops: assignment is ", a.layers, "x", a.experts, " with ", a.gpu.size(), " entries, the problem is ",
        p.layers, "x", p.experts);
  for (int g : a.gpu) check(g >= 0 && g < p.gpus, "hops: assignment uses GPU ", g, " outside [0, ", p.gpus, ")");
  std::vector<double> out;
  for (int b = 0; b < prof.batches(); ++b) {
    double h = 0;
    for (int l = 0; l < p.layers; ++l) {
      double const* r = prof.row(b, l);
      double tokens = 0, s = 0;
      for (int e = 0; e < p.experts; ++e) {
        tokens += r[e];
        s += r[e] * p.cost(l, a.at(l, e));
      }
      tokens /= top_k;
      if (tokens > 0) h += s / tokens;
    }
    out.push_back(h);
  }
  return out;
}

/// Where each expert's load goes: per layer, per expert, (GPU, share) pairs with shares summing to 1.
struct Shares {
  int layers = 0, experts = 0, gpus = 0;
  std::vector<std::vector<std::vector<std::pair<int, double>>>> of;  // [layer][expert]

  /// Even split over the ranks of each layer's replica table.
  static Shares from_tables(std::vector<replication::Table> const& tables, int gpus) {
    Shares s;
    s.layers = static_cast<int>(tables.size());
    check(s.layers > 0, "shares: no layers");
    s.experts = static_cast<int>(tables[0].replicas().size());
    s.gpus = gpus;
    for (auto const& t : tables) {
      check(static_cast<int>(t.replicas().size()) == s.experts, "shares: layers have different expert counts");
      std::vector<std::vector<std::pair<int, double>>> layer;
      for (auto const& copies : t.replicas()) {
        std::vector<std::pair<int, double>> v;
        for (int g : copies) v.emplace_back(g, 1.0 / static_cast<double>(copies.size()));
        layer.push_back(std::move(v));
      }
      s.of.push_back(std::move(layer));
    }
    return s;
  }
  /// EPLB's physical slots: each slot of an expert with c copies carries 1/c of its load (two
  /// slots of one expert on one GPU carry 2/c there).
  static Shares from_eplb(replication::eplb::Result const& r) {
    Shares s{r.phy2log.rows, r.logcnt.cols, r.num_gpus, {}};
    int per = r.slots_per_gpu();
    for (int l = 0; l < s.layers; ++l) {
      std::vector<std::vector<std::pair<int, double>>> layer(static_cast<std::size_t>(s.experts));
      for (int p = 0; p < r.phy2log.cols; ++p) {
        int e = r.phy2log(l, p);
        layer[static_cast<std::size_t>(e)].emplace_back(p / per, 1.0 / r.logcnt(l, e));
      }
      s.of.push_back(std::move(layer));
    }
    return s;
  }
  /// One copy per expert, on the assignment's GPU.
  static Shares from_assignment(Assignment const& a, int gpus) {
    Shares s{a.layers, a.experts, gpus, {}};
    for (int l = 0; l < a.layers; ++l) {
      std::vector<std::vector<std::pair<int, double>>> layer;
      for (int e = 0; e < a.experts; ++e) layer.push_back({{a.at(l, e), 1.0}});
      s.of.push_back(std::move(layer));
    }
    return s;
  }
};

/// Per layer: mean over batches of mean GPU load / max GPU load (a batch with no load counts 1).
inline std::vector<double> balancedness_per_layer(Shares const& s, profile::LoadProfile const& prof) {
  check(prof.layers() == s.layers && prof.experts() == s.experts, "balancedness: profile shape ", prof.layers(), "x",
        prof.experts(), " does not match the plan's ", s.layers, "x", s.experts);
  std::vector<double> out(static_cast<std::size_t>(s.layers), 0.0), load(static_cast<std::size_t>(s.gpus));
  for (int l = 0; l < s.layers; ++l) {
    double acc = 0;
    for (int b = 0; b < prof.batches(); ++b) {
      std::fill(load.begin(), load.end(), 0.0);
      double const* r = prof.row(b, l);
      for (int e = 0; e < s.experts; ++e)
        for (auto [g, w] : s.of[static_cast<std::size_t>(l)][static_cast<std::size_t>(e)]) {
          check(g >= 0 && g < s.gpus, "balancedness: layer ", l, " expert ", e, " has a copy on GPU ", g,
                ", outside [0, ", s.gpus, ")");
          load[static_cast<std::size_t>(g)] += r[e] * w;
        }
      double mx = *std::max_element(load.begin(), load.end()), sum = 0;
      for (double x : load) sum += x;
      acc += mx > 0 ? (sum / s.gpus) / mx : 1.0;
    }
    out[static_cast<std::size_t>(l)] = acc / prof.batches();
  }
  return out;
}

inline double balancedness(Shares const& s, profile::LoadProfile const& prof) {
  auto v = balancedness_per_layer(s, prof);
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

struct ReplicaStats {
  long long replicas = 0;         ///< copies beyond the first, all layers
  long long max_gpu_slots = 0;    ///< most expert copies (all layers) on one GPU
  long long min_gpu_slots = 0;    ///< fewest expert copies on one GPU
  double replica_bytes = 0;       ///< replicas * bytes of one expert
};

/// Counts replicas of per-layer replica tables; expert_bytes = memory of one expert's weights.
inline ReplicaStats replica_stats(std::vector<replication::Table> const& tables, int gpus, double expert_bytes) {
  check(gpus > 0, "replica stats: gpus must be positive, got ", gpus);
  ReplicaStats r;
  std::vector<long long> slots(static_cast<std::size_t>(gpus), 0);
  for (auto const& t : tables)
    for (auto const& copies : t.replicas()) {
      r.replicas += static_cast<long long>(copies.size()) - 1;
      for (int g : copies) {
        check(g >= 0 && g < gpus, "replica stats: a copy on GPU ", g, ", outside [0, ", gpus, ")");
        ++slots[static_cast<std::size_t>(g)];
      }
    }
  r.max_gpu_slots = *std::max_element(slots.begin(), slots.end());
  r.min_gpu_slots = *std::min_element(slots.begin(), slots.end());
  r.replica_bytes = static_cast<double>(r.replicas) * expert_bytes;
  return r;
}

/// Bytes of one routed expert (three matrices hidden x expert_ffn, SwiGLU) at bytes_per_param.
inline double expert_bytes(int hidden, int expert_ffn, double bytes_per_param = 2.0) {
  return 3.0 * hidden * static_cast<double>(expert_ffn) * bytes_per_param;
}

}  // namespace moe::placement
