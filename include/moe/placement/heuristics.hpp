#pragma once
// The ILP paper's baseline placements (sections 4.1 and 4.2).
//
// round_robin: for layer l, with d = ceil(E / c_layer), the experts go round-robin (expert e to
//   the (e mod d)-th GPU) over the window of d consecutive GPU numbers centred on the dispatching
//   attention GPU (d/2 to the left, the rest to the right, wrapping around the circle of GPU
//   numbers). It ignores the collecting attention and c_exp; a plan that breaks c_exp is reported.
// greedy: for each layer l and each expert e in id order, the GPUs are sorted by p(l, g) (ties by
//   GPU number) and the expert takes the first GPU that still has room under c_layer and c_exp.

#include <algorithm>
#include <numeric>
#include <vector>

#include "moe/config.hpp"
#include "moe/placement/problem.hpp"

namespace moe::placement {

inline Assignment round_robin(Problem const& p) {
  p.validate();
  int d = (p.experts + p.c_layer - 1) / p.c_layer;
  check(d <= p.gpus, "round-robin: a window of ", d, " GPUs does not fit on ", p.gpus, " GPUs");
  Assignment a{p.layers, p.experts, std::vector<int>(static_cast<std::size_t>(p.layers) * static_cast<std::size_t>(p.experts))};
  std::vector<int> total(static_cast<std::size_t>(p.gpus), 0);
  for (int l = 0; l < p.layers; ++l) {
    int start = p.attention[static_cast<std::size_t>(l)] - d / 2;
    for (int e = 0; e < p.experts; ++e) {
      int g = ((start + e % d) % p.gpus + p.gpus) % p.gpus;
      a.gpu[static_cast<std::size_t>(l) * static_cast<std::size_t>(p.experts) + static_cast<std::size_t>(e)] = g;
      check(++total[static_cast<std::size_t>(g)] <= p.c_exp, "round-robin: GPU ", g, " would hold more than c_exp = ",
            p.c_exp, " experts (layer ", l, "); raise c_exp or c_layer");
    }
  }
  return a;
}

inline Assignment greedy(Problem const& p) {
  p.validate();
  Assignment a{p.layers, p.experts, std::vector<int>(static_cast<std::size_t>(p.layers) * static_cast<std::size_t>(p.experts))};
  std::vector<int> total(static_cast<std::size_t>(p.gpus), 0), per(static_cast<std::size_t>(p.gpus)), order(static_cast<std::size_t>(p.gpus));
  for (int l = 0; l < p.layers; ++l) {
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return p.cost(l, x) < p.cost(l, y); });
    std::fill(per.begin(), per.end(), 0);
    std::size_t first = 0;  // GPUs before `first` in `order` are full
    for (int e = 0; e < p.experts; ++e) {
      std::size_t i = first;
      while (i < order.size() && (per[static_cast<std::size_t>(order[i])] >= p.c_layer ||
                                  total[static_cast<std::size_t>(order[i])] >= p.c_exp))
        ++i;
      check(i < order.size(), "greedy placement: no GPU has room for layer ", l, " expert ", e,
            " (c_exp = ", p.c_exp, ", c_layer = ", p.c_layer, "); the greedy order ran out of capacity");
      int g = order[i];
      a.gpu[static_cast<std::size_t>(l) * static_cast<std::size_t>(p.experts) + static_cast<std::size_t>(e)] = g;
      ++per[static_cast<std::size_t>(g)];
      ++total[static_cast<std::size_t>(g)];
      while (first < order.size() && (per[static_cast<std::size_t>(order[first])] >= p.c_layer ||
                                      total[static_cast<std::size_t>(order[first])] >= p.c_exp))
        ++first;
    }
  }
  return a;
}

}  // namespace moe::placement
