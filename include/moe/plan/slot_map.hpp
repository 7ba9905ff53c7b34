#pragma once
// Slot maps: the way serving engines (SGLang, TensorRT-LLM, vLLM) describe an expert plan.
//
// Per MoE layer there are P = E + R physical expert slots; slot p lives on EP rank p / S, where
// S = P / ranks slots per rank, and holds the weights of one logical expert. Every logical expert
// needs at least one slot in every layer. Our plans (plan_io.hpp) list, per expert, the GPUs that
// hold a copy; a slot map is the same information laid out in fixed-size per-GPU slot arrays.
//
// From our plan to slots (slot_map_from_plan): GPU g's slots hold the experts it has a copy of,
// in ascending expert order. When it holds fewer than S experts, each spare slot gets a second copy
// of the local expert with the most load per local slot (ties: lower expert id), so the spare
// memory relieves the hottest expert the GPU already serves; a spare slot never brings in an expert
// the plan did not put on that GPU. Copies of one expert on one GPU sit in adjacent slots. A GPU
// holding more than S experts, or none at all, is an error naming the layer and the GPU.
//
// From slots to our plan (plan_from_slot_map): each expert's copies are the distinct GPUs holding
// one of its slots, in ascending GPU order; the first is its primary. Two slots of one expert on
// one GPU are one copy for our layer (a GPU keeps one copy of the weights).

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/tsv.hpp"
#include "moe/plan/plan_io.hpp"

namespace moe::placement {

class SlotMap {
 public:
  SlotMap() = default;
  /// An all-unassigned (-1) map of `layers` x `ranks` x `slots_per_rank` for `experts` experts.
  SlotMap(int layers, int ranks, int slots_per_rank, int experts)
      : layers_(layers), ranks_(ranks), slots_(slots_per_rank), experts_(experts) {
    check(layers > 0 && layers <= core::limits::layers, "slot map: layers = ", layers, " outside [1, ",
          core::limits::layers, "]");
    check(ranks > 0 && ranks <= core::limits::gpus, "slot map: ranks = ", ranks, " outside [1, ", core::limits::gpus,
          "]");
    check(experts > 0 && experts <= core::limits::experts, "slot map: experts = ", experts, " outside [1, ",
          core::limits::experts, "]");
    // A rank may hold two slots of one expert (EPLB does), so S may exceed E a little; 4 E is far
    // beyond any plan and bounds the allocation.
    check(slots_per_rank > 0 && slots_per_rank <= 4LL * experts, "slot map: slots per rank = ", slots_per_rank,
          " outside [1, 4 x experts = ", 4LL * experts, "]");
    check(static_cast<long long>(ranks) * slots_per_rank >= experts, "slot map: ", ranks, " ranks x ", slots_per_rank,
          " slots cannot hold ", experts, " experts");
    slot_.assign(static_cast<std::size_t>(layers) * static_cast<std::size_t>(physical()), -1);
  }

  [[nodiscard]] int layers() const { return layers_; }
  [[nodiscard]] int ranks() const { return ranks_; }
  [[nodiscard]] int slots_per_rank() const { return slots_; }
  [[nodiscard]] int experts() const { return experts_; }
  /// P = ranks x slots per rank.
  [[nodiscard]] int physical() const { return ranks_ * slots_; }
  /// R = P - E redundant slots per layer.
  [[nodiscard]] int redundant() const { return physical() - experts_; }

  [[nodiscard]] int& at(int layer, int physical_slot) { return slot_[index(layer, physical_slot)]; }
  [[nodiscard]] int at(int layer, int physical_slot) const { return slot_[index(layer, physical_slot)]; }
  [[nodiscard]] int& at(int layer, int rank, int local_slot) { return at(layer, rank * slots_ + local_slot); }
  [[nodiscard]] int at(int layer, int rank, int local_slot) const { return at(layer, rank * slots_ + local_slot); }

  /// Slot -> logical expert of one layer (SGLang's and vLLM's physical_to_logical_map row).
  [[nodiscard]] std::span<int const> physical_to_logical(int layer) const {
    return {slot_.data() + index(layer, 0), static_cast<std::size_t>(physical())};
  }

  /// Copies of each expert in one layer (SGLang's logical_count / TensorRT-LLM's replica count).
  [[nodiscard]] std::vector<int> logical_count(int layer) const {
    std::vector<int> n(static_cast<std::size_t>(experts_), 0);
    for (int e : physical_to_logical(layer)) ++n[static_cast<std::size_t>(e)];
    return n;
  }

  /// Logical expert -> its slots, ascending, padded with -1 to the layer's largest copy count
  /// (row-major experts x width; `width` receives the padded width).
  [[nodiscard]] std::vector<int> logical_to_physical(int layer, int& width) const {
    auto n = logical_count(layer);
    width = std::max(1, *std::max_element(n.begin(), n.end()));
    std::vector<int> out(static_cast<std::size_t>(experts_) * static_cast<std::size_t>(width), -1);
    std::vector<int> filled(static_cast<std::size_t>(experts_), 0);
    auto row = physical_to_logical(layer);
    for (int p = 0; p < physical(); ++p) {
      auto e = static_cast<std::size_t>(row[static_cast<std::size_t>(p)]);
      out[e * static_cast<std::size_t>(width) + static_cast<std::size_t>(filled[e]++)] = p;
    }
    return out;
  }

  /// Throws moe::Error for a slot outside [0, E) or an expert with no slot, naming layer and slot.
  void validate() const {
    for (int l = 0; l < layers_; ++l) {
      std::vector<char> seen(static_cast<std::size_t>(experts_), 0);
      for (int p = 0; p < physical(); ++p) {
        int e = at(l, p);
        check(e >= 0 && e < experts_, "slot map: layer ", l, ", slot ", p, " (rank ", p / slots_, ") holds expert ", e,
              ", outside [0, ", experts_, ")");
        seen[static_cast<std::size_t>(e)] = 1;
      }
      for (int e = 0; e < experts_; ++e)
        check(seen[static_cast<std::size_t>(e)], "slot map: layer ", l, " has no slot for logical expert ", e);
    }
  }

  friend bool operator==(SlotMap const&, SlotMap const&) = default;

 private:
  [[nodiscard]] std::size_t index(int layer, int p) const {
    check(layer >= 0 && layer < layers_ && p >= 0 && p < physical(), "slot map: (layer ", layer, ", slot ", p,
          ") outside ", layers_, " x ", physical());
    return static_cast<std::size_t>(layer) * static_cast<std::size_t>(physical()) + static_cast<std::size_t>(p);
  }
  int layers_ = 0, ranks_ = 0, slots_ = 0, experts_ = 0;
  std::vector<int> slot_;
};

/// The fewest slots per GPU that hold `plan`: the most experts any GPU holds in any layer.
inline int min_slots_per_gpu(std::vector<LayerPlan> const& plan, int gpus) {
  int most = 1;
  for (auto const& lp : plan) {
    std::vector<int> held(static_cast<std::size_t>(gpus), 0);
    for (auto const& copies : lp.replicas.replicas())
      for (int g : copies) most = std::max(most, ++held[static_cast<std::size_t>(g)]);
  }
  return most;
}

/// Lays `plan` out in `slots_per_gpu` slots on each of `gpus` GPUs (rules in the file comment).
/// `loads` (layers x experts, row-major, optional) ranks the experts for the spare slots; without
/// it every expert weighs the same.
inline SlotMap slot_map_from_plan(std::vector<LayerPlan> const& plan, int gpus, int slots_per_gpu,
                                  std::span<double const> loads = {}) {
  check(!plan.empty(), "slot map: the plan has no layers");
  int E = plan.front().placement.experts();
  int L = static_cast<int>(plan.size());
  check(loads.empty() || loads.size() == static_cast<std::size_t>(L) * static_cast<std::size_t>(E),
        "slot map: ", loads.size(), " loads given for ", L, " layers x ", E, " experts");
  SlotMap m(L, gpus, slots_per_gpu, E);
  for (int l = 0; l < L; ++l) {
    auto const& lp = plan[static_cast<std::size_t>(l)];
    lp.placement.validate(E, gpus);
    lp.replicas.validate(E, gpus, lp.placement.ranks());
    std::vector<std::vector<int>> on(static_cast<std::size_t>(gpus));  // experts per GPU, ascending
    for (int e = 0; e < E; ++e)
      for (int g : lp.replicas.replicas()[static_cast<std::size_t>(e)]) on[static_cast<std::size_t>(g)].push_back(e);
    auto load = [&](int e) {
      return loads.empty()
                 ? 1.0
                 : loads[static_cast<std::size_t>(l) * static_cast<std::size_t>(E) + static_cast<std::size_t>(e)];
    };
    for (int g = 0; g < gpus; ++g) {
      auto const& held = on[static_cast<std::size_t>(g)];
      check(static_cast<int>(held.size()) <= slots_per_gpu, "slot map: layer ", l, ", GPU ", g, " holds ", held.size(),
            " experts but has only ", slots_per_gpu, " slots (use at least ", min_slots_per_gpu(plan, gpus),
            " slots per GPU)");
      check(!held.empty(), "slot map: layer ", l, ", GPU ", g,
            " holds no expert, so its slots cannot be filled with a local copy (plan with replicas, "
            "e.g. CRAFT or EPLB, or use fewer GPUs)");
      // Copies per held expert: one each, then the spare slots one at a time to the expert with the
      // most load per local slot.
      std::vector<int> n(held.size(), 1);
      for (int spare = slots_per_gpu - static_cast<int>(held.size()); spare > 0; --spare) {
        std::size_t best = 0;
        for (std::size_t i = 1; i < held.size(); ++i)
          if (load(held[i]) * n[best] > load(held[best]) * n[i]) best = i;
        ++n[best];
      }
      int s = 0;
      for (std::size_t i = 0; i < held.size(); ++i)
        for (int c = 0; c < n[i]; ++c) m.at(l, g, s++) = held[i];
    }
  }
  m.validate();
  return m;
}

/// Our per-layer tables from a slot map (rules in the file comment).
inline std::vector<LayerPlan> plan_from_slot_map(SlotMap const& m) {
  m.validate();
  std::vector<LayerPlan> out;
  for (int l = 0; l < m.layers(); ++l) {
    std::vector<std::vector<int>> copies(static_cast<std::size_t>(m.experts()));
    for (int p = 0; p < m.physical(); ++p) {
      auto& c = copies[static_cast<std::size_t>(m.at(l, p))];
      int g = p / m.slots_per_rank();
      if (c.empty() || c.back() != g) c.push_back(g);  // slots ascend, so GPUs do too
    }
    std::vector<int> primary;
    for (auto const& c : copies) primary.push_back(c.front());
    out.push_back({Table(std::move(primary)), replication::Table(std::move(copies))});
  }
  return out;
}

}  // namespace moe::placement
