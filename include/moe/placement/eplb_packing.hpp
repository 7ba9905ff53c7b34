#pragma once
// EPLB's balanced-packing placement without replicas (CRAFT's "BASE" baseline): DeepSeek's
// rebalance_experts with as many physical slots as experts, so each layer's experts are packed
// onto the GPUs (by groups and nodes when the hierarchical policy applies) with balanced load.

#include <vector>

#include "moe/plan/placement_table.hpp"
#include "moe/replication/eplb.hpp"

namespace moe::placement {

/// load is L x E (row-major); experts must split evenly over the GPUs.
inline std::vector<Table> eplb_packing(std::vector<double> const& load, int layers, int experts, int gpus,
                                       int groups = 1, int nodes = 1) {
  auto r = replication::eplb::rebalance_experts(load, layers, experts, experts, groups, nodes, gpus);
  std::vector<Table> out;
  for (int l = 0; l < layers; ++l) out.push_back(replication::eplb::layer_tables(r, l).placement);
  return out;
}

}  // namespace moe::placement
