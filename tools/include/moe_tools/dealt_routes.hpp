#pragma once
// The serving rank of every pair of a batch under a batch-aware replica policy (its dealt()), dealt
// per source rank in token order as the host layer deals them. Shared by the planner tools.

#include <cstddef>
#include <vector>

#include "moe/topology/traffic.hpp"

namespace moe::tools {

/// Pair routes (token-major) of batch `b` over G ranks and E experts, from a policy's dealt().
template <class P>
std::vector<int> dealt_routes(P const& p, topology::Batch const& b, int G, int E) {
  std::vector<int> gpu(b.experts.size()), seen(static_cast<std::size_t>(G) * static_cast<std::size_t>(E), 0);
  for (int t = 0; t < b.tokens(); ++t)
    for (int j = 0; j < b.top_k; ++j) {
      auto i = static_cast<std::size_t>(t * b.top_k + j);
      int s = b.source[static_cast<std::size_t>(t)], e = b.experts[i];
      gpu[i] = p.dealt(e, s, seen[static_cast<std::size_t>(s * E + e)]++);
    }
  return gpu;
}

}  // namespace moe::tools
