#pragma once
// Which rows and columns each block of the grouped GEMM computes (moe/kernels/grouped_gemm.cuh and
// grouped_gemm_sm90.cuh). Plain C++ so that the host tests can check, without a GPU, that the
// grids the launchers size cover every (row, column tile) of every group exactly once.
//
// Groups: either `groups` groups with row offsets rows[0..groups] and tile starts
// tile_starts[0..groups] (tile_starts[g + 1] - tile_starts[g] = ceil(rows of g / unit)), or
// rows == nullptr and one group of `uniform_rows` rows.

#if defined(__CUDACC__)
#define MOE_TILE_FN __host__ __device__ __forceinline__
#else
#define MOE_TILE_FN inline
#endif

namespace moe::kernels::tiles {

struct Tile {
  bool valid = false;  ///< false: a surplus block of the worst-case grid, nothing to compute
  int group = 0;
  int row_begin = 0;   ///< first row (grouped order) of the block
  int rows = 0;        ///< rows of the block, 1 .. block height
  int col_begin = 0;   ///< first output column
};

/// Last g in [0, groups) with tile_starts[g] * scale <= x (tile_starts ascending; x below the total).
MOE_TILE_FN int find_group(int const* tile_starts, int groups, long long x, long long scale) {
  int lo = 0, hi = groups;
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (static_cast<long long>(tile_starts[mid]) * scale <= x) lo = mid; else hi = mid;
  }
  return lo;
}

/// Blocks of `unit` rows and `bn` columns; inside a group the row tiles are the fastest index
/// (blocks that run together share B columns). Grid: units * ceil(n / bn) blocks, units >= the
/// tiles of all groups.
MOE_TILE_FN Tile unit_tile(long long b, int n, int bn, int unit, int groups, int const* rows, int const* tile_starts,
                           int uniform_rows) {
  Tile t;
  long long const n_tiles = (n + bn - 1) / bn;
  long long local, tiles_g;
  int first, end;
  if (rows == nullptr) {
    tiles_g = (uniform_rows + unit - 1) / unit;
    if (b >= tiles_g * n_tiles) return t;
    local = b;
    first = 0;
    end = uniform_rows;
  } else {
    if (b >= static_cast<long long>(tile_starts[groups]) * n_tiles) return t;
    t.group = find_group(tile_starts, groups, b, n_tiles);
    tiles_g = tile_starts[t.group + 1] - tile_starts[t.group];
    local = b - static_cast<long long>(tile_starts[t.group]) * n_tiles;
    first = rows[t.group];
    end = rows[t.group + 1];
  }
  t.row_begin = first + static_cast<int>(local % tiles_g) * unit;
  t.col_begin = static_cast<int>(local / tiles_g) * bn;
  t.rows = end - t.row_begin < unit ? end - t.row_begin : unit;
  t.valid = true;
  return t;
}

/// Blocks of `half` = unit / 2 rows (two per unit of tile_starts) and `bn` columns; column tiles
/// are the fastest index. Grid: ceil(n / bn) times 2 * units (grouped) or ceil(uniform_rows / half).
MOE_TILE_FN Tile half_tile(long long b, int n, int bn, int unit, int groups, int const* rows, int const* tile_starts,
                           int uniform_rows) {
  Tile t;
  int const half = unit / 2;
  long long const n_tiles = (n + bn - 1) / bn;
  long long const tile = b / n_tiles;  // in halves
  t.col_begin = static_cast<int>(b % n_tiles) * bn;
  if (rows == nullptr) {
    t.row_begin = static_cast<int>(tile) * half;
    if (t.row_begin >= uniform_rows) return t;
    t.rows = uniform_rows - t.row_begin < half ? uniform_rows - t.row_begin : half;
  } else {
    long long const u = tile / 2;
    if (u >= tile_starts[groups]) return t;
    t.group = find_group(tile_starts, groups, u, 1);
    t.row_begin = rows[t.group] + static_cast<int>(u - tile_starts[t.group]) * unit + static_cast<int>(tile % 2) * half;
    if (t.row_begin >= rows[t.group + 1]) return t;  // the second half of a group's last unit may be empty
    t.rows = rows[t.group + 1] - t.row_begin < half ? rows[t.group + 1] - t.row_begin : half;
  }
  t.valid = true;
  return t;
}

/// Grid sizes the launchers use (blocks), from the worst-case unit count of grouped rows
/// (max_units) or the uniform row count.
constexpr long long unit_grid(bool grouped, long long max_units, int uniform_rows, int n, int bn, int unit) {
  long long units = grouped ? max_units : (uniform_rows + unit - 1) / unit;
  return units * ((n + bn - 1) / bn);
}
constexpr long long half_grid(bool grouped, long long max_units, int uniform_rows, int n, int bn, int unit) {
  long long halves = grouped ? 2 * max_units : (uniform_rows + unit / 2 - 1) / (unit / 2);
  return halves * ((n + bn - 1) / bn);
}

}  // namespace moe::kernels::tiles

#undef MOE_TILE_FN
