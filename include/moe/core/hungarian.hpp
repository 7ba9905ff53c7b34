#pragma once
// Minimum-cost assignment (the Hungarian method with potentials, Kuhn 1955 / Munkres 1957, in the
// O(n^2 m) shortest-augmenting-path form): n rows to m >= n distinct columns of a row-major n x m
// cost matrix. One implementation for the library: the minimal-move rebalance relabels EPLB's GPU
// packs with it (moe/replication/migration.hpp), s-EG's co-clustering assigns experts to devices
// (moe/speculative/cocluster.hpp). Exact for integer costs; for floating-point costs, exact up to
// rounding in the potentials.

#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

#include "moe/config.hpp"

namespace moe::core {

/// The column of each row in a minimum-cost assignment of n rows to m >= n columns; `cost` is the
/// row-major n x m matrix (T: an integer or floating-point type). Ties go to the first assignment
/// the augmenting paths find (deterministic).
template <class T>
std::vector<int> hungarian(std::vector<T> const& cost, std::size_t n, std::size_t m) {
  check(n <= m, "hungarian: ", n, " rows do not fit ", m, " columns");
  check(cost.size() == n * m, "hungarian: the cost matrix has ", cost.size(), " entries, expected ", n, " x ", m);
  const T inf = std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max() / 4;
  std::vector<T> u(n + 1, T{0}), v(m + 1, T{0}), minv(m + 1);
  std::vector<std::size_t> p(m + 1, 0), way(m + 1, 0);
  std::vector<char> used(m + 1);
  for (std::size_t i = 1; i <= n; ++i) {
    p[0] = i;
    std::size_t j0 = 0;
    std::fill(minv.begin(), minv.end(), inf);
    std::fill(used.begin(), used.end(), 0);
    do {
      used[j0] = 1;
      std::size_t i0 = p[j0], j1 = 0;
      T delta = inf;
      for (std::size_t j = 1; j <= m; ++j) {
        if (used[j]) continue;
        T cur = cost[(i0 - 1) * m + (j - 1)] - u[i0] - v[j];
        if (cur < minv[j]) {
          minv[j] = cur;
          way[j] = j0;
        }
        if (minv[j] < delta) {
          delta = minv[j];
          j1 = j;
        }
      }
      for (std::size_t j = 0; j <= m; ++j) {
        if (used[j]) {
          u[p[j]] += delta;
          v[j] -= delta;
        } else {
          minv[j] -= delta;
        }
      }
      j0 = j1;
    } while (p[j0] != 0);
    do {
      std::size_t j1 = way[j0];
      p[j0] = p[j1];
      j0 = j1;
    } while (j0 != 0);
  }
  std::vector<int> col(n, -1);
  for (std::size_t j = 1; j <= m; ++j)
    if (p[j] != 0) col[p[j] - 1] = static_cast<int>(j - 1);
  return col;
}

}  // namespace moe::core
