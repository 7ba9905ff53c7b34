// moe::core::hungarian (moe/core/hungarian.hpp) against brute force: on seeded random square and
// rectangular matrices (integer and floating-point costs, with ties) the assignment is a valid
// injection of rows into columns and its cost equals the minimum over every injection.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <limits>
#include <set>
#include <vector>

#include "moe/core/hungarian.hpp"
#include "moe/core/rng.hpp"

namespace {

// The minimum cost over every injection of n rows into m columns (choose the columns of the rows
// in order, recursively).
template <class T>
T brute_force(std::vector<T> const& cost, std::size_t n, std::size_t m, std::size_t row, std::vector<char>& used) {
  if (row == n) return T{0};
  T best = std::numeric_limits<T>::max();
  for (std::size_t j = 0; j < m; ++j) {
    if (used[j]) continue;
    used[j] = 1;
    best = std::min(best, cost[row * m + j] + brute_force(cost, n, m, row + 1, used));
    used[j] = 0;
  }
  return best;
}

template <class T>
void check_against_brute_force(moe::core::Rng& rng, std::size_t n, std::size_t m, std::size_t range) {
  std::vector<T> cost(n * m);
  for (auto& c : cost) c = static_cast<T>(rng.below(range)) - static_cast<T>(range / 3);  // negatives and ties too
  auto col = moe::core::hungarian(cost, n, m);
  REQUIRE(col.size() == n);
  std::set<int> distinct(col.begin(), col.end());
  REQUIRE(distinct.size() == n);
  T got{0};
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE(col[i] >= 0);
    REQUIRE(static_cast<std::size_t>(col[i]) < m);
    got += cost[i * m + static_cast<std::size_t>(col[i])];
  }
  std::vector<char> used(m, 0);
  INFO("n " << n << " m " << m << " range " << range);
  REQUIRE(got == brute_force(cost, n, m, 0, used));
}

}  // namespace

TEST_CASE("hungarian: integer costs, square and rectangular, against brute force", "[core][hungarian]") {
  moe::core::Rng rng(2026);
  for (int trial = 0; trial < 60; ++trial) {
    std::size_t n = 1 + rng.below(6), m = n + rng.below(3);
    check_against_brute_force<long long>(rng, n, m, trial % 2 ? 4 : 1000);  // range 4: many ties
  }
}

TEST_CASE("hungarian: floating-point costs against brute force", "[core][hungarian]") {
  moe::core::Rng rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    std::size_t n = 1 + rng.below(6), m = n + rng.below(2);
    check_against_brute_force<double>(rng, n, m, 100);  // integral values: sums are exact in double
  }
}

TEST_CASE("hungarian: bad shapes are refused", "[core][hungarian]") {
  std::vector<long long> c(6, 0);
  CHECK_THROWS_WITH(moe::core::hungarian(c, 3, 2), Catch::Contains("3 rows do not fit 2 columns"));
  CHECK_THROWS_WITH(moe::core::hungarian(c, 2, 4), Catch::Contains("expected 2 x 4"));
}
