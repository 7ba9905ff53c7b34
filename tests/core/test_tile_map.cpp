// The grouped GEMM's block -> tile maps (moe/kernels/tile_map.hpp), checked on the host: over the
// grid each launcher sizes, every (row, column tile) of every group is computed by exactly one
// block, blocks stay inside their group, and surplus blocks do nothing. Seeded random group sizes
// with empty groups at the start, inside and at the end.

#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "moe/kernels/tile_map.hpp"

namespace tiles = moe::kernels::tiles;

namespace {

constexpr int unit = 128;  // kernels::cuda::grouped_gemm_tile_m

struct Groups {
  std::vector<int> rows{0}, starts{0};
  int total = 0;
  long long max_units = 0;  // the launchers' bound: ceil(total / unit) + groups
};

Groups make_groups(std::vector<int> const& sizes) {
  Groups g;
  for (int s : sizes) {
    g.rows.push_back(g.rows.back() + s);
    g.starts.push_back(g.starts.back() + (s + unit - 1) / unit);
  }
  g.total = g.rows.back();
  g.max_units = (g.total + unit - 1) / unit + static_cast<long long>(sizes.size());
  return g;
}

enum class Map { unit_tiles, half_tiles };

/// Runs every block of the grid and checks coverage; returns the blocks that computed something.
long long check_cover(Map map, Groups const& gs, int groups, bool grouped, int uniform_rows, int n, int bn) {
  int const total = grouped ? gs.total : uniform_rows;
  int const height = map == Map::unit_tiles ? unit : unit / 2;
  long long const n_tiles = (n + bn - 1) / bn;
  long long const grid = map == Map::unit_tiles ? tiles::unit_grid(grouped, gs.max_units, uniform_rows, n, bn, unit)
                                                : tiles::half_grid(grouped, gs.max_units, uniform_rows, n, bn, unit);
  std::vector<int> covered(static_cast<std::size_t>(total) * static_cast<std::size_t>(n_tiles), 0);
  int const* rows = grouped ? gs.rows.data() : nullptr;
  int const* starts = grouped ? gs.starts.data() : nullptr;
  long long busy = 0;
  tiles::Tile prev;
  for (long long b = 0; b < grid; ++b) {
    tiles::Tile t = map == Map::unit_tiles ? tiles::unit_tile(b, n, bn, unit, groups, rows, starts, uniform_rows)
                                           : tiles::half_tile(b, n, bn, unit, groups, rows, starts, uniform_rows);
    if (!t.valid) continue;
    ++busy;
    INFO("block " << b << " group " << t.group << " rows " << t.row_begin << "+" << t.rows << " col " << t.col_begin);
    int first = grouped ? gs.rows[static_cast<std::size_t>(t.group)] : 0;
    int end = grouped ? gs.rows[static_cast<std::size_t>(t.group) + 1] : uniform_rows;
    REQUIRE(t.rows >= 1);
    REQUIRE(t.rows <= height);
    REQUIRE(t.row_begin >= first);
    REQUIRE(t.row_begin + t.rows <= end);
    REQUIRE((t.row_begin - first) % height == 0);  // tiles start at the group's first row
    REQUIRE(t.col_begin % bn == 0);
    REQUIRE(t.col_begin < n);
    // The block takes every row up to its height or its group's end: nothing is left between tiles.
    REQUIRE((t.rows == height || t.row_begin + t.rows == end));
    for (int r = t.row_begin; r < t.row_begin + t.rows; ++r)
      ++covered[static_cast<std::size_t>(r) * static_cast<std::size_t>(n_tiles) + static_cast<std::size_t>(t.col_begin / bn)];
    // Unit tiles: row tiles are the fastest index inside a group (consecutive blocks share columns).
    if (map == Map::unit_tiles && prev.valid && prev.group == t.group) {
      bool next_row = t.col_begin == prev.col_begin && t.row_begin == prev.row_begin + unit;
      bool next_col = t.col_begin == prev.col_begin + bn && t.row_begin == first;
      REQUIRE((next_row || next_col));
    }
    prev = t;
  }
  for (std::size_t i = 0; i < covered.size(); ++i) {
    INFO("row " << i / static_cast<std::size_t>(n_tiles) << " column tile " << i % static_cast<std::size_t>(n_tiles));
    REQUIRE(covered[i] == 1);
  }
  return busy;
}

}  // namespace

TEST_CASE("grouped GEMM tile maps cover every row and column tile exactly once", "[kernels][tiles]") {
  std::mt19937_64 rng(2026);
  std::vector<std::vector<int>> cases{
      {0, 1, 63, 64, 65, 127, 128, 129, 0, 300, 7, 0},  // the GPU test's sizes
      {0},
      {5},
      {128, 128, 128},
      {0, 0, 0, 256, 0},
  };
  for (int rep = 0; rep < 6; ++rep) {  // seeded random: many groups, ~20 % empty, some large
    std::vector<int> s(static_cast<std::size_t>(1 + rng() % 260));
    for (auto& v : s) v = rng() % 5 == 0 ? 0 : static_cast<int>(rng() % (rng() % 8 == 0 ? 900 : 40));
    cases.push_back(s);
  }
  for (auto const& sizes : cases) {
    Groups gs = make_groups(sizes);
    int groups = static_cast<int>(sizes.size());
    for (int n : {8, 120, 128, 136, 256, 264, 1000}) {
      for (int bn : {64, 128, 256}) {
        INFO("groups " << groups << " rows " << gs.total << " n " << n << " bn " << bn);
        long long busy_unit = check_cover(Map::unit_tiles, gs, groups, true, 0, n, bn);
        long long busy_half = check_cover(Map::half_tiles, gs, groups, true, 0, n, bn);
        long long n_tiles = (n + bn - 1) / bn;
        CHECK(busy_unit == gs.starts.back() * n_tiles);  // one block per tile, none idle inside the bound
        CHECK(busy_half <= 2 * busy_unit);
      }
    }
  }
  // One uniform group (the shared experts' form).
  Groups none = make_groups({});
  for (int rows : {1, 63, 64, 65, 128, 129, 1000})
    for (int n : {8, 264}) {
      INFO("uniform rows " << rows << " n " << n);
      check_cover(Map::unit_tiles, none, 1, false, rows, n, 256);
      check_cover(Map::half_tiles, none, 1, false, rows, n, 64);
    }
}
