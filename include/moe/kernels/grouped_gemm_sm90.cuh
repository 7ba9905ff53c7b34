#pragma once
// Grouped expert GEMM for Hopper (sm_90a): wgmma tensor-core instructions on shared-memory
// operands. Same arguments, epilogues and results as the portable kernel of grouped_gemm.cuh,
// which selects this one (GemmPath::automatic) for bf16 on an sm_90 device when the program was
// built with -gencode=arch=compute_90a,code=sm_90a. Not meant to be launched directly.
//
// Tiling. A block of two warpgroups (256 threads) computes a 128-row tile of one group: each
// warpgroup owns 64 rows and issues m64nNk16 wgmma instructions (fp32 accumulators in registers).
//   swiglu            N = 128 columns of the gate and the same 128 of the up projection
//                     (two m64n128 accumulators, 64 + 64 registers per thread)
//   store, accumulate N = 256 columns (one m64n256 accumulator, 128 registers per thread)
// K advances in slices of 64 (one 128-byte row of bf16 per tile row).
//
// Data movement. All 256 threads copy A rows (gathered through `index`, so this cannot be a tensor
// copy on Hopper) and B rows with 16-byte cp.async into a 4-stage ring of shared memory, laid out
// in the 128-byte swizzle that the wgmma descriptors name (16-byte chunk c of row r stored at
// chunk c ^ (r mod 8) of that row; every tile starts 1024-byte aligned). Out-of-range rows,
// columns and K chunks are zero-filled by the copy itself. Slice t is loaded two slices ahead of
// its use; the ring's other slot holds the slice whose wgmma may still run (wait_group 1), so
// copies and tensor-core work overlap.
//
// Order of blocks (tiles::unit_tile): inside one group the row tiles are the fastest index, so
// blocks running at the same time share the same B columns (weights are read from memory about
// once per group and column tile) and the group's A rows stay in L2 across column tiles.
//
// No host synchronisation; the launch needs 197,632 bytes (193 KiB) of dynamic shared memory (one
// block per SM).

#include <atomic>
#include <cstdint>

#include "moe/kernels/grouped_gemm_args.cuh"
#include "moe/kernels/tile_map.hpp"
#if defined(MOE_CUDA_EMULATOR)
#include "emu/hopper.hpp"  // the test-only CPU emulator's models of the sm_90a PTX used below
#endif

namespace moe::kernels::cuda::sm90 {

inline constexpr int bm = 128;          ///< rows per block (= grouped_gemm_tile_m)
inline constexpr int bk = 64;           ///< K per stage: one 128-byte swizzle row of bf16
inline constexpr int stages = 4;        ///< shared-memory ring
inline constexpr int threads = 256;     ///< two warpgroups
inline constexpr int b_rows = 256;      ///< B rows per stage (both weights for swiglu)
/// Output columns per block.
template <Epilogue Ep>
inline constexpr int bn = Ep == Epilogue::swiglu ? 128 : 256;
inline constexpr std::uint32_t a_stage_bytes = bm * bk * 2;      // 16 KB
inline constexpr std::uint32_t b_stage_bytes = b_rows * bk * 2;  // 32 KB
inline constexpr std::uint32_t stage_bytes = a_stage_bytes + b_stage_bytes;
inline constexpr std::size_t smem_bytes = std::size_t{stages} * stage_bytes + 1024;  // + alignment slack
static_assert(bm == grouped_gemm_tile_m, "the Hopper kernel computes one tile_starts unit per block");

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOE_SM90A_DEVICE_CODE 1
#endif
// The kernel body exists where the sm_90a instructions do: in sm_90a device code, and in the
// project's tests built for the CPU emulator (tests/emu), whose models of these PTX instructions
// (tests/emu/include/emu/hopper.hpp) stand behind the wrappers below.
#if defined(MOE_SM90A_DEVICE_CODE) || defined(MOE_CUDA_EMULATOR)
#define MOE_SM90A_KERNEL_BODY 1
#endif

namespace detail {

#if defined(MOE_SM90A_DEVICE_CODE)

__device__ __forceinline__ void cp_async16(std::uint32_t dst, void const* src, bool full) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(full ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/// Makes this thread's completed shared-memory writes visible to the async proxy (wgmma reads).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/// Keeps the compiler from moving accesses of an accumulator register across the asynchronous MMAs.
template <int R>
__device__ __forceinline__ void pin(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/// D (64 x 128, fp32 registers) += A (64 x 16, smem descriptor) * B (128 x 16, K-major smem descriptor)^T.
__device__ __forceinline__ void mma_m64n128k16(float (&d)[64], std::uint64_t a, std::uint64_t b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, 1, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b));
}

/// D (64 x 256, fp32 registers) += A (64 x 16, smem descriptor) * B (256 x 16, K-major smem descriptor)^T.
__device__ __forceinline__ void mma_m64n256k16(float (&d)[128], std::uint64_t a, std::uint64_t b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, 1, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b));
}

#elif defined(MOE_CUDA_EMULATOR)

// The emulator's models of the same instructions (semantics and their PTX ISA sections:
// tests/emu/include/emu/hopper.hpp). Only the project's tests compile this branch.
inline void cp_async16(std::uint32_t dst, void const* src, bool full) {
  ::emu::sm90::cp_async16(dst, src, full ? 16 : 0);
}
inline void cp_async_commit() { ::emu::sm90::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  ::emu::sm90::cp_async_wait(N);
}
inline void fence_proxy_async() { ::emu::sm90::fence_proxy_async(); }
inline void wgmma_fence() { ::emu::sm90::wgmma_fence(); }
inline void wgmma_commit() { ::emu::sm90::wgmma_commit(); }
template <int N>
inline void wgmma_wait() {
  ::emu::sm90::wgmma_wait(N);
}
template <int R>
inline void pin(float (&)[R]) {}
inline void mma_m64n128k16(float (&d)[64], std::uint64_t a, std::uint64_t b) {
  ::emu::sm90::wgmma_mma_bf16(128, d, a, b, true);
}
inline void mma_m64n256k16(float (&d)[128], std::uint64_t a, std::uint64_t b) {
  ::emu::sm90::wgmma_mma_bf16(256, d, a, b, true);
}

#endif  // MOE_SM90A_DEVICE_CODE, MOE_CUDA_EMULATOR

#if defined(MOE_SM90A_KERNEL_BODY)
/// Shared-memory matrix descriptor of a K-major bf16 tile in the 128-byte swizzle: rows of 128
/// bytes, groups of 8 rows 1024 bytes apart (stride byte offset), leading byte offset unused (1).
__device__ __forceinline__ std::uint64_t desc_sw128(std::uint32_t smem_addr) {
  std::uint64_t d = (smem_addr & 0x3FFFFu) >> 4;
  d |= std::uint64_t{1} << 16;
  d |= std::uint64_t{1024 >> 4} << 32;
  d |= std::uint64_t{1} << 62;
  return d;
}
#endif  // MOE_SM90A_KERNEL_BODY

template <Epilogue Ep>
__global__ void __launch_bounds__(threads, 1) grouped_gemm_kernel(GroupedGemmArgs<moe::bf16> const p) {
#if defined(MOE_SM90A_KERNEL_BODY)
  constexpr bool two = Ep == Epilogue::swiglu;
  constexpr int BN = bn<Ep>;
  constexpr int acc_regs = two ? 64 : 128;
  MOE_EXTERN_SHARED(unsigned char, smem_raw);
  std::uint32_t const smem0 = (static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;

  int const tid = static_cast<int>(threadIdx.x);
  tiles::Tile const t = tiles::unit_tile(blockIdx.x, p.n, BN, bm, p.groups, p.rows, p.tile_starts, p.uniform_rows);
  if (!t.valid) return;
  int const g = t.group, row_begin = t.row_begin, rows_here = t.rows, n0 = t.col_begin;
  moe::bf16 const* b0 = p.b0_table ? p.b0_table[g] : p.b0;
  moe::bf16 const* b1 = two ? (p.b1_table ? p.b1_table[g] : p.b1) : nullptr;

  // This thread's copies: 16-byte chunk `ch` of tile rows (tid / 8) + 32 i, 4 rows of A and 8 of B.
  int const ch = tid & 7, r0 = tid >> 3;
  std::uint32_t const swz = static_cast<std::uint32_t>(((ch ^ (r0 & 7)) << 4));  // r0 + 32 i keeps r mod 8
  char const* a_src[4];
  char const* b_src[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int r = r0 + 32 * i;
    a_src[i] = nullptr;
    if (r < rows_here) {
      int row = row_begin + r;
      long long src = p.index ? p.index[row] / p.index_div : row;
      a_src[i] = reinterpret_cast<char const*>(p.a + static_cast<std::size_t>(src) * p.a_stride) + ch * 16;
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    int r = r0 + 32 * i;  // 0 .. 255
    int col = two ? n0 + (r & 127) : n0 + r;
    moe::bf16 const* w = two && r >= 128 ? b1 : b0;
    b_src[i] = col < p.n ? reinterpret_cast<char const*>(w + static_cast<std::size_t>(col) * p.k) + ch * 16 : nullptr;
  }
  char const* const dummy = reinterpret_cast<char const*>(b0);  // a valid address for zero-fill copies

  int const k_tiles = (p.k + bk - 1) / bk;
  auto load = [&](int kt) {
    std::uint32_t sa = smem0 + static_cast<std::uint32_t>(kt % stages) * stage_bytes;
    std::uint32_t sb = sa + a_stage_bytes;
    int kb = kt * bk * 2;  // byte offset of the slice in a row
    bool kin = kt * bk + ch * 8 < p.k;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      bool ok = kin && a_src[i] != nullptr;
      cp_async16(sa + static_cast<std::uint32_t>((r0 + 32 * i) * 128) + swz, ok ? a_src[i] + kb : dummy, ok);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      bool ok = kin && b_src[i] != nullptr;
      cp_async16(sb + static_cast<std::uint32_t>((r0 + 32 * i) * 128) + swz, ok ? b_src[i] + kb : dummy, ok);
    }
  };

  // Warpgroup: rows wg * 64 .. wg * 64 + 63 of the tile (broadcast from lane 0, so that the compiler
  // sees a warp-uniform value and keeps the descriptors in uniform registers).
  int const wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  bool const active = rows_here > wg * 64;   // this warpgroup has rows to write
  float acc0[acc_regs], acc1[two ? 64 : 1];
#pragma unroll
  for (int i = 0; i < acc_regs; ++i) acc0[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < (two ? 64 : 1); ++i) acc1[i] = 0.0f;

  // The zeroed accumulators are operands of the first wgmma: keep their initialisation before it.
  pin(acc0);
  if constexpr (two) pin(acc1);

  // Prologue: slices 0 and 1 in flight (one commit group each, empty groups keep the count).
  constexpr int ahead = stages - 2;
#pragma unroll
  for (int t = 0; t < ahead; ++t) {
    if (t < k_tiles) load(t);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<ahead - 1>();  // this thread's copies of slice kt have landed
    fence_proxy_async();
    __syncthreads();  // every thread's copies of kt are visible; every wgmma of kt - 2 has completed
    // Both warpgroups issue the MMAs even when one has no valid rows (its A rows are zero-filled):
    // a wgmma under a branch that ptxas cannot prove warpgroup-uniform is serialised (C7518).
    std::uint32_t const sa = smem0 + static_cast<std::uint32_t>(kt % stages) * stage_bytes + wg * 64 * 128;
    std::uint32_t const sb = smem0 + static_cast<std::uint32_t>(kt % stages) * stage_bytes + a_stage_bytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < bk / 16; ++kk) {
      std::uint64_t da = desc_sw128(sa + kk * 32);
      if constexpr (two) {
        mma_m64n128k16(acc0, da, desc_sw128(sb + kk * 32));
        mma_m64n128k16(acc1, da, desc_sw128(sb + 128 * 128 + kk * 32));
      } else {
        mma_m64n256k16(acc0, da, desc_sw128(sb + kk * 32));
      }
    }
    wgmma_commit();
    // Slice kt + 2 into the slot of slice kt - 2 (neither kt's nor kt - 1's, whose MMAs may still
    // run), issued after this slice's MMAs so that the tensor cores start first.
    if (kt + ahead < k_tiles) load(kt + ahead);
    cp_async_commit();
    wgmma_wait<1>();  // the previous slice's MMAs are done: its slot may be refilled next iteration
  }
  cp_async_wait<0>();
  wgmma_wait<0>();
  pin(acc0);
  if constexpr (two) pin(acc1);
  if (!active) return;

  // Epilogue straight from the accumulators. Fragment of m64nNk16: thread (warp w of the
  // warpgroup, lane l) holds rows 16 w + l / 4 and + 8, columns 8 j + 2 (l mod 4) and + 1.
  int const lane = tid & 31, warp = (tid & 127) >> 5;
  int const ra = wg * 64 + warp * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    int col = n0 + 8 * j + 2 * (lane & 3);
    if (col >= p.n) continue;  // n is a multiple of 8: a pair is either inside or outside
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int r = ra + 8 * h;
      if (r >= rows_here) continue;
      float v0 = acc0[4 * j + 2 * h], v1 = acc0[4 * j + 2 * h + 1];
      if constexpr (two) {
        v0 = silu(v0) * acc1[4 * j + 2 * h];
        v1 = silu(v1) * acc1[4 * j + 2 * h + 1];
      }
      std::size_t at = static_cast<std::size_t>(row_begin + r) * p.out_ld + static_cast<std::size_t>(col);
      if constexpr (Ep == Epilogue::accumulate) {
        p.out_f32[at] += v0;
        p.out_f32[at + 1] += v1;
      } else {
        __nv_bfloat162 pair = __floats2bfloat162_rn(v0, v1);
        *reinterpret_cast<__nv_bfloat162*>(p.out + at) = pair;
      }
    }
  }
#else
  // Built without sm_90a code for this device: never selected by the launcher (hopper_gemm_available).
  __trap();
#endif
}

/// Probe: 1 when the code that runs on this device was compiled with the sm_90a features.
template <int = 0>
__global__ void feature_probe(int* flag) {
#if defined(MOE_SM90A_DEVICE_CODE)
  *flag = 1;
#elif defined(MOE_CUDA_EMULATOR)
  *flag = ::emu::sm90::sm90a_code() ? 1 : 0;  // the emulated H100 runs the kernel (unless MOE_EMU_SM90A=0)
#else
  *flag = 0;
#endif
}

}  // namespace detail

/// Enqueues the Hopper kernel (the caller has checked the arguments and the device).
template <Epilogue Ep>
void launch_grouped_gemm(cudaStream_t s, GroupedGemmArgs<moe::bf16> const& p) {
  long long blocks = tiles::unit_grid(p.rows != nullptr, p.max_row_tiles, p.uniform_rows, p.n, bn<Ep>, bm);
  if (blocks == 0) return;
  check(blocks < (1LL << 31), "grouped_gemm: ", blocks, " blocks exceed the grid limit");
  // The shared-memory attribute was set by hopper_gemm_available(), which every path to this
  // launch has called on this device.
  launch(detail::grouped_gemm_kernel<Ep>, static_cast<unsigned>(blocks), threads, smem_bytes, s, p);
  check_launch("sm90::grouped_gemm_kernel");
}

}  // namespace moe::kernels::cuda::sm90

namespace moe::kernels::cuda {

namespace sm90::detail {
/// Per-device result of the probe: 0 unknown, 1 no, 2 yes.
inline std::atomic<int>& probe_result(int device) {
  static std::atomic<int> known[64] = {};
  static std::atomic<int> beyond{0};  // devices past the table are probed every time
  return device >= 0 && device < 64 ? known[device] : beyond;
}
}  // namespace sm90::detail

/// Whether GemmPath::automatic picks the Hopper kernel on the current device: an sm_90 device and
/// sm_90a code for it in this program. The first call per device launches a one-thread probe and
/// synchronises (do it before capturing a graph; the device Layer's constructor does); later calls only
/// read the cached answer.
inline bool hopper_gemm_available() {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  auto& known = sm90::detail::probe_result(dev);
  if (int v = known.load(std::memory_order_relaxed); v != 0) return v == 2;
  int major = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
  bool yes = false;
  if (major == 9) {
    int* flag = nullptr;
    check_cuda(cudaMalloc(&flag, sizeof(int)), "cudaMalloc (sm90a probe)");
    int host = 0;
    launch(sm90::detail::feature_probe<>, 1, 1, 0, nullptr, flag);
    cudaError_t r = cudaGetLastError();
    if (r == cudaSuccess) r = cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(flag);
    // No code for this device at all (cudaErrorNoKernelImageForDevice) simply means no.
    if (r != cudaSuccess && r != cudaErrorNoKernelImageForDevice) check_cuda(r, "sm90a probe");
    yes = r == cudaSuccess && host == 1;
    if (yes) {
      // The kernels' dynamic shared memory, once per device (a host-side attribute; the launches,
      // captured ones included, find it set).
      auto allow = [](auto kernel) {
        check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(sm90::smem_bytes)),
                   "cudaFuncSetAttribute (sm90 grouped GEMM shared memory)");
      };
      allow(sm90::detail::grouped_gemm_kernel<Epilogue::swiglu>);
      allow(sm90::detail::grouped_gemm_kernel<Epilogue::store>);
      allow(sm90::detail::grouped_gemm_kernel<Epilogue::accumulate>);
    }
  }
  known.store(yes ? 2 : 1, std::memory_order_relaxed);
  return yes;
}

/// The kernel choice of GemmPath::automatic on stream `s`: hopper_gemm_available(), except while
/// `s` captures a graph and the current device has not been probed yet; then the portable kernel
/// (the probe synchronises, which a capture forbids).
inline bool hopper_gemm_selected(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  // An error here (the legacy stream queried while another stream captures) counts as capturing.
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    st = cudaStreamCaptureStatusActive;
  }
  if (st == cudaStreamCaptureStatusNone) return hopper_gemm_available();
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  return sm90::detail::probe_result(dev).load(std::memory_order_relaxed) == 2;
}

}  // namespace moe::kernels::cuda
