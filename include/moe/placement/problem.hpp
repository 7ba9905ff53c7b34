#pragma once
// The topology-aware placement problem of the ILP paper (section 4): L MoE layers of E experts
// each are placed on G GPUs. The attention block before MoE layer l (dispatch) runs on GPU
// attention[l] and the one after it (collect) on attention[l + 1]; putting an expert of layer l
// on GPU g costs p(l, g) = hops(attention[l], g) + hops(g, attention[l + 1]) per token it serves.
// Constraints: every expert placed once; at most c_layer experts of one layer per GPU; at most
// c_exp experts in all per GPU.
//
// An assignment is an L x E table of GPUs (row-major), one placement::Table per layer.

#include <vector>

#include "moe/config.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/topology/topology.hpp"

namespace moe::placement {

/// Default attention layout: attention block j (j = 0..L, block l dispatches MoE layer l and
/// block l + 1 collects it) on GPU floor(j * G / (L + 1)), spreading the blocks evenly over the
/// cluster like a pipeline.
inline std::vector<int> spread_attention(int layers, int gpus) {
  check(layers > 0 && gpus > 0, "spread_attention: layers and gpus must be positive");
  std::vector<int> a(static_cast<std::size_t>(layers) + 1);
  for (int j = 0; j <= layers; ++j)
    a[static_cast<std::size_t>(j)] = static_cast<int>(static_cast<long long>(j) * gpus / (layers + 1));
  return a;
}

struct Problem {
  int layers = 0, experts = 0, gpus = 0;
  int c_exp = 0, c_layer = 0;
  std::vector<int> hops;       ///< G x G hop matrix
  std::vector<int> attention;  ///< L + 1 attention GPUs

  [[nodiscard]] int hop(int a, int b) const {
    return hops[static_cast<std::size_t>(a) * static_cast<std::size_t>(gpus) + static_cast<std::size_t>(b)];
  }
  /// p(l, g): hops from the dispatching attention to g plus from g to the collecting attention.
  [[nodiscard]] int cost(int l, int g) const {
    return hop(attention[static_cast<std::size_t>(l)], g) + hop(g, attention[static_cast<std::size_t>(l) + 1]);
  }
  /// L x G matrix of p(l, g).
  [[nodiscard]] std::vector<double> cost_matrix() const {
    std::vector<double> c(static_cast<std::size_t>(layers) * static_cast<std::size_t>(gpus));
    for (int l = 0; l < layers; ++l)
      for (int g = 0; g < gpus; ++g) c[static_cast<std::size_t>(l) * static_cast<std::size_t>(gpus) + static_cast<std::size_t>(g)] = cost(l, g);
    return c;
  }

  /// Throws moe::Error for inconsistent sizes, and for capacities that cannot hold all experts
  /// (c_layer * G < E or c_exp * G < L * E).
  void validate() const {
    check(layers > 0 && experts > 0 && gpus > 0, "placement problem: layers (", layers, "), experts (", experts,
          ") and gpus (", gpus, ") must be positive");
    check(hops.size() == static_cast<std::size_t>(gpus) * static_cast<std::size_t>(gpus),
          "placement problem: hop matrix has ", hops.size(), " entries, expected ", gpus, "x", gpus);
    check(attention.size() == static_cast<std::size_t>(layers) + 1, "placement problem: ", attention.size(),
          " attention GPUs given, expected layers + 1 = ", layers + 1);
    for (int a : attention) check(a >= 0 && a < gpus, "placement problem: attention GPU ", a, " outside [0, ", gpus, ")");
    for (int h : hops) check(h >= 0, "placement problem: negative hop count ", h);
    check(c_layer > 0 && c_exp > 0, "placement problem: capacities c_layer (", c_layer, ") and c_exp (", c_exp,
          ") must be positive");
    check(static_cast<long long>(c_layer) * gpus >= experts, "infeasible placement: c_layer = ", c_layer, " on ",
          gpus, " GPUs holds ", static_cast<long long>(c_layer) * gpus, " experts of a layer, but a layer has ",
          experts);
    check(static_cast<long long>(c_exp) * gpus >= static_cast<long long>(layers) * experts,
          "infeasible placement: c_exp = ", c_exp, " on ", gpus, " GPUs holds ", static_cast<long long>(c_exp) * gpus,
          " experts, but the model has ", static_cast<long long>(layers) * experts);
  }
};

/// A problem on a topology with the default attention layout.
inline Problem make_problem(topology::Topology const& topo, int layers, int experts, int c_layer, int c_exp) {
  Problem p;
  p.layers = layers;
  p.experts = experts;
  p.gpus = topo.gpus();
  p.c_layer = c_layer;
  p.c_exp = c_exp;
  p.hops = topo.gpu_hops();
  p.attention = spread_attention(layers, p.gpus);
  p.validate();
  return p;
}

/// L x E expert -> GPU table.
struct Assignment {
  int layers = 0, experts = 0;
  std::vector<int> gpu;
  [[nodiscard]] int at(int l, int e) const {
    return gpu[static_cast<std::size_t>(l) * static_cast<std::size_t>(experts) + static_cast<std::size_t>(e)];
  }
  [[nodiscard]] Table table(int l) const {
    return Table(std::vector<int>(gpu.begin() + static_cast<long>(l) * experts,
                                  gpu.begin() + static_cast<long>(l + 1) * experts));
  }
};

/// Throws moe::Error when the assignment breaks a constraint of the problem.
inline void check_assignment(Problem const& p, Assignment const& a) {
  check(a.layers == p.layers && a.experts == p.experts &&
            a.gpu.size() == static_cast<std::size_t>(p.layers) * static_cast<std::size_t>(p.experts),
        "assignment has the wrong shape");
  std::vector<int> total(static_cast<std::size_t>(p.gpus), 0), per(static_cast<std::size_t>(p.gpus));
  for (int l = 0; l < p.layers; ++l) {
    std::fill(per.begin(), per.end(), 0);
    for (int e = 0; e < p.experts; ++e) {
      int g = a.at(l, e);
      check(g >= 0 && g < p.gpus, "assignment puts layer ", l, " expert ", e, " on GPU ", g, " outside [0, ", p.gpus, ")");
      check(++per[static_cast<std::size_t>(g)] <= p.c_layer, "assignment puts more than c_layer = ", p.c_layer,
            " experts of layer ", l, " on GPU ", g);
      check(++total[static_cast<std::size_t>(g)] <= p.c_exp, "assignment puts more than c_exp = ", p.c_exp,
            " experts on GPU ", g);
    }
  }
}

/// sum over (l, e) of weight(l, e) * p(l, gpu(l, e)); weight is L x E row-major (empty = all 1).
inline double objective(Problem const& p, Assignment const& a, std::vector<double> const& weight = {}) {
  check(a.layers == p.layers && a.experts == p.experts &&
            a.gpu.size() == static_cast<std::size_t>(p.layers) * static_cast<std::size_t>(p.experts),
        "objective: assignment is ", a.layers, "x", a.experts, " with ", a.gpu.size(), " entries, the problem is ",
        p.layers, "x", p.experts);
  check(weight.empty() || weight.size() == static_cast<std::size_t>(p.layers) * static_cast<std::size_t>(p.experts),
        "objective: weight has ", weight.size(), " entries, expected layers x experts = ", p.layers, "x", p.experts);
  for (int g : a.gpu) check(g >= 0 && g < p.gpus, "objective: assignment uses GPU ", g, " outside [0, ", p.gpus, ")");
  double s = 0;
  for (int l = 0; l < p.layers; ++l)
    for (int e = 0; e < p.experts; ++e) {
      double w = weight.empty() ? 1.0 : weight[static_cast<std::size_t>(l) * static_cast<std::size_t>(p.experts) + static_cast<std::size_t>(e)];
      s += w * p.cost(l, a.at(l, e));
    }
  return s;
}

}  // namespace moe::placement
