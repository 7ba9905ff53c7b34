#pragma once
// Grouped expert GEMMs with a fused SwiGLU epilogue (nvcc only).
//
// One launch computes, for every group g (an expert) with rows [rows[g], rows[g+1]) of the grouped
// row order, C = A_g * B_g^T where B_g is the expert's weight in PyTorch Linear layout (N x K,
// row-major, K contiguous) and the A rows are gathered through an index (so the permuted copy of
// the tokens never exists: the first GEMM reads the received dispatch records in place).
//
//   Epilogue::swiglu      two weights (gate, up): out = T(silu(A gate^T) * (A up^T))
//   Epilogue::store       out = T(A B^T)
//   Epilogue::accumulate  out_f32 += A B^T (fp32; used for the shared experts, one launch each)
//
// Group sizes live on the device (they come from routing), so the grid is sized for the worst
// case: sum_g ceil(rows_g / 128) <= ceil(total / 128) + groups row tiles (`tile_starts` counts
// tiles of grouped_gemm_tile_m = 128 rows) times the column tiles. A block finds its group by a
// binary search of `tile_starts`; surplus blocks exit at once. No host synchronisation,
// graph-capturable.
//
// Two kernels compute the same function (GroupedGemmArgs::path chooses; automatic by default):
// - Hopper (grouped_gemm_sm90.cuh): bf16 only, wgmma on 128 x 128 (x2) / 128 x 256 tiles; chosen
//   on an sm_90 device when the program carries sm_90a code.
// - portable (below): bf16 tensor cores through WMMA (16x16x16, fp32 accumulate); fp32 through a
//   SIMT FMA path with the same tiling (for exact checks against the host; not a performance
//   path). Tiles are BM x BN x BK = 64 x 64 x 32 with 4 warps, two per 128-row unit of
//   `tile_starts`; two shared-memory stages, the next K slice prefetched through registers while
//   the current one is consumed (one barrier per slice).

#include <mma.h>

#include "moe/kernels/cuda_common.cuh"
#include "moe/kernels/grouped_gemm_args.cuh"
#include "moe/kernels/grouped_gemm_sm90.cuh"
#include "moe/kernels/tile_map.hpp"

namespace moe::kernels::cuda {

namespace detail {

inline constexpr int gemm_bm = 64, gemm_bn = 64, gemm_threads = 128;
/// K slice per stage: 32 for bf16 (two WMMA steps), 16 for fp32 (two stages fit static shared memory).
template <class T>
inline constexpr int gemm_bk = std::is_same_v<T, float> ? 16 : 32;

template <class T, bool Two>
struct GemmSmem {
  static constexpr int V = vec_elems<T>;
  static constexpr int ld_ab = gemm_bk<T> + V;  // padded rows (16 bytes of padding)
  static constexpr int ld_c = gemm_bn + 4;
  static constexpr std::size_t a_bytes = sizeof(T) * gemm_bm * ld_ab;
  static constexpr std::size_t b_bytes = sizeof(T) * gemm_bn * ld_ab;
  static constexpr std::size_t stage_bytes = a_bytes + b_bytes * (Two ? 2 : 1);
  static constexpr int stages = 2;  // double-buffered K slices
  static constexpr std::size_t c_bytes = sizeof(float) * gemm_bm * ld_c;
  static constexpr std::size_t epi_bytes = c_bytes * (Two ? 2 : 1);
  static constexpr std::size_t bytes = stages * stage_bytes > epi_bytes ? stages * stage_bytes : epi_bytes;
  static_assert(a_bytes % 128 == 0 && b_bytes % 128 == 0 && c_bytes % 128 == 0, "tile pieces keep 128-byte alignment");
  static_assert(bytes <= 48 * 1024, "static shared memory limit");
};

/// One thread's share of a K slice: where its 16-byte vectors of A and B come from (null: zero),
/// where they go in shared memory, and the registers that carry them in between.
template <class T, bool Two, int NA, int NB>
struct SliceLoader {
  T const* a_src[NA];
  int a_dst[NA];
  int a_col[NA];
  T const* b0_src[NB];
  T const* b1_src[NB];
  int b_dst[NB];
  int b_col[NB];
  uint4 ra[NA], rb0[NB], rb1[Two ? NB : 1];

  __device__ __forceinline__ void fetch(int k0, int k) {
    uint4 const zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < NA; ++i)
      ra[i] = a_src[i] && k0 + a_col[i] < k ? *reinterpret_cast<uint4 const*>(a_src[i] + k0 + a_col[i]) : zero;
#pragma unroll
    for (int i = 0; i < NB; ++i) {
      bool ok = k0 + b_col[i] < k;
      rb0[i] = b0_src[i] && ok ? *reinterpret_cast<uint4 const*>(b0_src[i] + k0 + b_col[i]) : zero;
      if constexpr (Two) rb1[i] = b1_src[i] && ok ? *reinterpret_cast<uint4 const*>(b1_src[i] + k0 + b_col[i]) : zero;
    }
  }
  __device__ __forceinline__ void stash(T* as, T* b0s, T* b1s) const {
#pragma unroll
    for (int i = 0; i < NA; ++i) *reinterpret_cast<uint4*>(as + a_dst[i]) = ra[i];
#pragma unroll
    for (int i = 0; i < NB; ++i) {
      *reinterpret_cast<uint4*>(b0s + b_dst[i]) = rb0[i];
      if constexpr (Two) *reinterpret_cast<uint4*>(b1s + b_dst[i]) = rb1[i];
    }
  }
};

template <class T, Epilogue Ep>
__global__ void __launch_bounds__(gemm_threads) grouped_gemm_kernel(GroupedGemmArgs<T> const p) {
  constexpr bool two = Ep == Epilogue::swiglu;
  using Smem = GemmSmem<T, two>;
  constexpr int BM = gemm_bm, BN = gemm_bn, BK = gemm_bk<T>, V = Smem::V;
  constexpr int ld = Smem::ld_ab, ldc = Smem::ld_c;
  constexpr int vpr = BK / V;                         // 16-byte vectors per tile row
  constexpr int a_per_thread = BM * vpr / gemm_threads;
  constexpr int b_per_thread = BN * vpr / gemm_threads;
  static_assert(a_per_thread * gemm_threads == BM * vpr && b_per_thread * gemm_threads == BN * vpr);

  __shared__ __align__(128) unsigned char smem[Smem::bytes];
  // Stage `st` of the K-slice buffers (two stages: compute on one while the other is refilled).
  auto As = [&](int st) { return reinterpret_cast<T*>(smem + st * Smem::stage_bytes); };
  auto B0s = [&](int st) { return reinterpret_cast<T*>(smem + st * Smem::stage_bytes + Smem::a_bytes); };
  auto B1s = [&](int st) {
    return reinterpret_cast<T*>(smem + st * Smem::stage_bytes + Smem::a_bytes + Smem::b_bytes);
  };
  float* C0s = reinterpret_cast<float*>(smem);
  float* C1s = reinterpret_cast<float*>(smem + Smem::c_bytes);

  int const tid = static_cast<int>(threadIdx.x);
  static_assert(2 * BM == grouped_gemm_tile_m, "two portable blocks per tile_starts unit");
  tiles::Tile const t =
      tiles::half_tile(blockIdx.x, p.n, BN, grouped_gemm_tile_m, p.groups, p.rows, p.tile_starts, p.uniform_rows);
  if (!t.valid) return;
  int const g = t.group, row_begin = t.row_begin, rows_here = t.rows, n0 = t.col_begin;
  T const* b0 = p.b0_table ? p.b0_table[g] : p.b0;
  T const* b1 = two ? (p.b1_table ? p.b1_table[g] : p.b1) : nullptr;

  // Source addresses of this thread's A and B vectors (null: zero fill).
  SliceLoader<T, two, a_per_thread, b_per_thread> ld_;
#pragma unroll
  for (int i = 0; i < a_per_thread; ++i) {
    int idx = tid + i * gemm_threads, r = idx / vpr, c = (idx % vpr) * V;
    ld_.a_dst[i] = r * ld + c;
    ld_.a_col[i] = c;
    ld_.a_src[i] = nullptr;
    if (r < rows_here) {
      int row = row_begin + r;
      long long src = p.index ? p.index[row] / p.index_div : row;
      ld_.a_src[i] = reinterpret_cast<T const*>(p.a + static_cast<std::size_t>(src) * p.a_stride);
    }
  }
#pragma unroll
  for (int i = 0; i < b_per_thread; ++i) {
    int idx = tid + i * gemm_threads, r = idx / vpr, c = (idx % vpr) * V;
    ld_.b_dst[i] = r * ld + c;
    ld_.b_col[i] = c;
    bool ok = n0 + r < p.n;
    ld_.b0_src[i] = ok ? b0 + static_cast<std::size_t>(n0 + r) * p.k : nullptr;
    ld_.b1_src[i] = ok && two ? b1 + static_cast<std::size_t>(n0 + r) * p.k : nullptr;
  }
  auto fetch = [&](int k0) { ld_.fetch(k0, p.k); };
  auto stash = [&](int st) { ld_.stash(As(st), B0s(st), B1s(st)); };
  // Pipeline: slice 0 is staged before the loop. In the iteration on stage `cur`, the next slice
  // is fetched into registers, `cur` is consumed, and the registers are stashed into the other
  // stage, which nobody reads any more (its last reader finished before the previous barrier);
  // one barrier per slice publishes it. The loop ends on a barrier, so the stages are free for C.
  fetch(0);
  stash(0);
  __syncthreads();

  if constexpr (std::is_same_v<T, moe::bf16>) {
    namespace wmma = nvcuda::wmma;
    using bf = __nv_bfloat16;
    int const warp = tid / 32, wm = warp / 2, wn = warp % 2;  // 2 x 2 warps of 32 x 32
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc0[2][2], acc1[two ? 2 : 1][two ? 2 : 1];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wmma::fill_fragment(acc0[i][j], 0.0f);
        if constexpr (two) wmma::fill_fragment(acc1[i][j], 0.0f);
      }
    for (int k0 = 0, cur = 0; k0 < p.k; k0 += BK, cur ^= 1) {
      bool const more = k0 + BK < p.k;
      if (more) fetch(k0 + BK);
      bf const* as = reinterpret_cast<bf const*>(As(cur));
      bf const* b0s = reinterpret_cast<bf const*>(B0s(cur));
      bf const* b1s = reinterpret_cast<bf const*>(B1s(cur));
#pragma unroll
      for (int kk = 0; kk < BK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf, wmma::col_major> fb;
#pragma unroll
        for (int i = 0; i < 2; ++i)
          wmma::load_matrix_sync(fa[i], as + (wm * 32 + i * 16) * ld + kk, ld);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          wmma::load_matrix_sync(fb, b0s + (wn * 32 + j * 16) * ld + kk, ld);
#pragma unroll
          for (int i = 0; i < 2; ++i) wmma::mma_sync(acc0[i][j], fa[i], fb, acc0[i][j]);
          if constexpr (two) {
            wmma::load_matrix_sync(fb, b1s + (wn * 32 + j * 16) * ld + kk, ld);
#pragma unroll
            for (int i = 0; i < 2; ++i) wmma::mma_sync(acc1[i][j], fa[i], fb, acc1[i][j]);
          }
        }
      }
      if (more) stash(cur ^ 1);
      __syncthreads();
    }
    // The stage buffers are dead now (the loop ends with a barrier): reuse them for C.
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        int off = (wm * 32 + i * 16) * ldc + wn * 32 + j * 16;
        wmma::store_matrix_sync(C0s + off, acc0[i][j], ldc, wmma::mem_row_major);
        if constexpr (two) wmma::store_matrix_sync(C1s + off, acc1[i][j], ldc, wmma::mem_row_major);
      }
  } else {
    // fp32 SIMT: thread (tr, tc) owns rows tr*8 .. tr*8+7 and columns tc, tc+16, tc+32, tc+48.
    int const tr = tid / 16, tc = tid % 16;
    float acc0[8][4] = {}, acc1[two ? 8 : 1][4] = {};
    for (int k0 = 0, cur = 0; k0 < p.k; k0 += BK, cur ^= 1) {
      bool const more = k0 + BK < p.k;
      if (more) fetch(k0 + BK);
      T const* as = As(cur);
      T const* b0s = B0s(cur);
      T const* b1s = B1s(cur);
#pragma unroll 4
      for (int kk = 0; kk < BK; ++kk) {
        float a[8], b0v[4], b1v[4];
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = as[(tr * 8 + i) * ld + kk];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          b0v[j] = b0s[(tc + 16 * j) * ld + kk];
          if constexpr (two) b1v[j] = b1s[(tc + 16 * j) * ld + kk];
        }
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            acc0[i][j] = fmaf(a[i], b0v[j], acc0[i][j]);
            if constexpr (two) acc1[i][j] = fmaf(a[i], b1v[j], acc1[i][j]);
          }
      }
      if (more) stash(cur ^ 1);
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        C0s[(tr * 8 + i) * ldc + tc + 16 * j] = acc0[i][j];
        if constexpr (two) C1s[(tr * 8 + i) * ldc + tc + 16 * j] = acc1[i][j];
      }
  }
  __syncthreads();

  // Epilogue: V consecutive columns per step.
  constexpr int cvecs = BN / V;
  for (int idx = tid; idx < BM * cvecs; idx += gemm_threads) {
    int r = idx / cvecs, c = (idx % cvecs) * V;
    if (r >= rows_here) continue;
    int n = n0 + c;
    if (n >= p.n) continue;
    std::size_t row = static_cast<std::size_t>(row_begin + r);
    float v[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      float c0 = C0s[r * ldc + c + e];
      if constexpr (two) {
        v[e] = silu(c0) * C1s[r * ldc + c + e];
      } else {
        v[e] = c0;
      }
    }
    if constexpr (Ep == Epilogue::accumulate) {
      float* o = p.out_f32 + row * p.out_ld + n;
#pragma unroll
      for (int e = 0; e < V; ++e)
        if (n + e < p.n) o[e] += v[e];
    } else {
      T* o = p.out + row * p.out_ld + n;
      if (n + V <= p.n) {
        *reinterpret_cast<uint4*>(o) = pack<T>(v);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e)
          if (n + e < p.n) o[e] = store_as<T>(v[e]);
      }
    }
  }
}

}  // namespace detail

/// Enqueues one grouped GEMM. Requirements (checked): k and n multiples of 16 / sizeof(T) (the
/// outputs and every row start are then 16-byte aligned given aligned bases). `p.path` chooses
/// the kernel (GemmPath); both compute the same function.
template <class T, Epilogue Ep>
void grouped_gemm(cudaStream_t s, GroupedGemmArgs<T> const& p) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, moe::bf16>, "grouped_gemm: float or moe::bf16");
  constexpr int V = vec_elems<T>;
  check(p.k > 0 && p.k % V == 0, "grouped_gemm: K = ", p.k, " must be a positive multiple of ", V);
  check(p.n > 0 && p.n % V == 0, "grouped_gemm: N = ", p.n, " must be a positive multiple of ", V);
  check(p.a_stride % 16 == 0, "grouped_gemm: A row stride ", p.a_stride, " bytes is not a multiple of 16");
  check(reinterpret_cast<std::uintptr_t>(p.a) % 16 == 0, "grouped_gemm: A is not 16-byte aligned");
  check(Ep == Epilogue::accumulate ? p.out_f32 != nullptr : p.out != nullptr, "grouped_gemm: no output");
  check(p.out_ld >= static_cast<std::size_t>(p.n), "grouped_gemm: output row stride ", p.out_ld, " < N = ", p.n);
  // The swiglu / store epilogue writes 16-byte vectors at out + row * out_ld + column.
  check(Ep == Epilogue::accumulate || (p.out_ld % V == 0 && reinterpret_cast<std::uintptr_t>(p.out) % 16 == 0),
        "grouped_gemm: output rows must start 16-byte aligned (out_ld ", p.out_ld, " elements)");
  check(reinterpret_cast<std::uintptr_t>(p.b0) % 16 == 0 && reinterpret_cast<std::uintptr_t>(p.b1) % 16 == 0,
        "grouped_gemm: B (b0 / b1) is not 16-byte aligned");
  check(p.b0 != nullptr || p.b0_table != nullptr, "grouped_gemm: no B (b0 and b0_table are both null)");
  check(Ep != Epilogue::swiglu || p.b1 != nullptr || p.b1_table != nullptr,
        "grouped_gemm: the SwiGLU epilogue needs the up projection (b1 and b1_table are both null)");
  check(p.index_div >= 1, "grouped_gemm: index_div must be at least 1, got ", p.index_div);
  check(p.rows == nullptr || (p.tile_starts != nullptr && p.groups > 0 && p.max_row_tiles >= 0),
        "grouped_gemm: grouped rows need tile_starts, groups > 0 and max_row_tiles >= 0");

  if constexpr (std::is_same_v<T, moe::bf16>) {
    bool hopper = p.path == GemmPath::automatic && hopper_gemm_selected(s);
    if (p.path == GemmPath::hopper) {
      check(hopper_gemm_available(), "grouped_gemm: GemmPath::hopper needs an sm_90 device and a program built with "
                                     "-gencode=arch=compute_90a,code=sm_90a");
      hopper = true;
    }
    if (hopper) {
      sm90::launch_grouped_gemm<Ep>(s, p);
      return;
    }
  } else {
    check(p.path != GemmPath::hopper, "grouped_gemm: GemmPath::hopper computes bf16 only");
  }
  long long blocks = tiles::half_grid(p.rows != nullptr, p.max_row_tiles, p.uniform_rows, p.n, detail::gemm_bn,
                                      grouped_gemm_tile_m);
  if (blocks == 0) return;
  check(blocks < (1LL << 31), "grouped_gemm: ", blocks, " blocks exceed the grid limit");
  launch(detail::grouped_gemm_kernel<T, Ep>, static_cast<unsigned>(blocks), detail::gemm_threads, 0, s, p);
  check_launch("grouped_gemm_kernel");
}

}  // namespace moe::kernels::cuda
