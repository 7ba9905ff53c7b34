#pragma once
// The least number of pairs the busiest rank can receive when each expert's pairs may go to any of
// its copies: a reference for the per-batch split's balance that shares no code with it.

#include <algorithm>
#include <bit>
#include <vector>

namespace moe::test {

/// `pairs[e]` pairs of expert e, `copies[e]` the ranks in [0, ranks) holding it (ranks <= 20). By
/// Hall's theorem (max-flow min-cut), the largest over sets S of ranks of
/// ceil(pairs of the experts whose copies all lie in S / |S|).
inline long long least_max_load(std::vector<long long> const& pairs, std::vector<std::vector<int>> const& copies,
                                int ranks) {
  long long best = 0;
  for (unsigned set = 1; set < (1u << ranks); ++set) {
    long long inside = 0;
    for (std::size_t e = 0; e < pairs.size(); ++e) {
      bool all = true;
      for (int g : copies[e]) all = all && ((set >> g) & 1u);
      if (all) inside += pairs[e];
    }
    long long size = std::popcount(set);
    best = std::max(best, (inside + size - 1) / size);
  }
  return best;
}

}  // namespace moe::test
