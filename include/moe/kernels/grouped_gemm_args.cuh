#pragma once
// Arguments of the grouped expert GEMM (moe/kernels/grouped_gemm.cuh), shared by its two kernels:
// the portable tensor-core kernel and the Hopper wgmma kernel (moe/kernels/grouped_gemm_sm90.cuh).

#include <cstddef>

#include "moe/kernels/cuda_common.cuh"
#include "moe/kernels/gemm_path.hpp"

namespace moe::kernels::cuda {

enum class Epilogue { swiglu, store, accumulate };

// GemmPath (which kernel runs a grouped GEMM) is in moe/kernels/gemm_path.hpp.

/// Rows of one unit of `tile_starts`: every group's rows are covered by ceil(rows / tile_m) tiles.
/// Both kernels use this unit (the Hopper kernel computes a whole tile per block, the portable one
/// half a tile per block).
inline constexpr int grouped_gemm_tile_m = 128;

/// Worst-case row tiles for `total` rows split into `groups` groups (the `max_row_tiles` bound).
constexpr long long grouped_gemm_row_tiles(long long total, int groups) {
  return blocks_for(total, grouped_gemm_tile_m) + groups;
}

template <class T>
struct GroupedGemmArgs {
  // Groups: either `groups` with device row offsets (groups + 1) and tile starts (groups + 1, in
  // units of grouped_gemm_tile_m rows), or rows == nullptr and one group of `uniform_rows` rows.
  int groups = 1;
  int const* rows = nullptr;
  int const* tile_starts = nullptr;
  int uniform_rows = 0;
  long long max_row_tiles = 0;  ///< grid bound: row tiles over all groups in the worst case

  // A: output row i (in grouped order) reads source row src(i) = index ? index[i] / index_div : i,
  // at a + src(i) * a_stride bytes; K elements of T, 16-byte aligned.
  std::byte const* a = nullptr;
  std::size_t a_stride = 0;
  int const* index = nullptr;
  int index_div = 1;

  // B per group: tables of device pointers (indexed by group), or single pointers when tables are null.
  // Row-major n x k (PyTorch Linear layout); every B must be 16-byte aligned (the kernels copy
  // 16-byte vectors). Single pointers are checked by grouped_gemm; pointers inside a device table
  // cannot be, and are the caller's promise (the device layer and the FinDEP executors check them when
  // they build their tables).
  T const* const* b0_table = nullptr;
  T const* const* b1_table = nullptr;
  T const* b0 = nullptr;
  T const* b1 = nullptr;

  int n = 0;  ///< output columns (rows of B)
  int k = 0;  ///< reduction length, a multiple of 16 / sizeof(T)

  T* out = nullptr;           ///< swiglu / store: row i at out + i * out_ld
  float* out_f32 = nullptr;   ///< accumulate
  std::size_t out_ld = 0;     ///< elements

  GemmPath path = GemmPath::automatic;
};

}  // namespace moe::kernels::cuda
