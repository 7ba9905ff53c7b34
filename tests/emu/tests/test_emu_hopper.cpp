// The emulator's sm_90a PTX models (emu/hopper.hpp) against an independent oracle: CuTe's layouts
// (the CuTe headers of the PyPI package nvidia-cutlass, compiled host-only; a test-time oracle,
// never a dependency of the library) and brute-force products computed here.
//  (a) every shared-memory byte address the Hopper grouped GEMM uses: the kernel's 128-byte swizzled
//      stores, the descriptors it builds (desc_sw128, compared bit for bit with CuTe's
//      make_gmma_desc<Major::K>) and the emulator's reading of them (kmajor_address), on every
//      (row, column) of the A and B tiles of a stage, against CuTe's GMMA::Layout_K_SW128_Atom;
//      and the accumulator fragment against CuTe's CLayout_64xN;
//  (b) one m64n128k16 and one m64n256k16 mma_async (and a chain over a 64-wide K slice) against a
//      brute-force product of the bf16 inputs;
//  (c) the group semantics: a missing cp.async wait and a too-weak wait_group read poison, a wgmma
//      reading a copy still in flight or not fenced is an error, accumulators in flight are NaN.

#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "emu/hopper.hpp"
#include "moe/kernels/grouped_gemm_sm90.cuh"
#include "oracle/cute_oracle.hpp"  // CuTe's answers, computed in a translation unit of their own

namespace {

namespace sm90 = moe::kernels::cuda::sm90;

template <class T>
T* device_alloc(std::size_t n) {
  T* p = nullptr;
  REQUIRE(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)) == cudaSuccess);
  return p;
}
template <class T>
std::vector<T> download(T const* p, std::size_t n) {
  std::vector<T> v(n);
  REQUIRE(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return v;
}
template <class T>
void upload(T* p, std::vector<T> const& v) {
  REQUIRE(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
}
void expect_kernel_error(std::vector<std::string> const& parts) {
  REQUIRE(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  std::string const text = emu::last_kernel_error();
  INFO(text);
  for (auto const& p : parts) CHECK(text.find(p) != std::string::npos);
  emu::reset_errors();
  REQUIRE(cudaGetLastError() == cudaSuccess);
}
template <class K>
void allow_smem(K kernel, std::size_t bytes) {
  REQUIRE(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) ==
          cudaSuccess);
}

std::uint16_t bf16_bits(float v) {  // v is exactly representable in the tests below
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<std::uint16_t>(u >> 16);
}
float bf16_value(std::uint16_t b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// =============================================================================================
// (a) addresses and descriptors.
// =============================================================================================

/// Every (row, k) of an R-row stage tile at shared address `off`, split into operands of SubRows
/// rows (A: a warpgroup's 64 rows; B: one 256-row or two 128-row operands): the kernel's swizzled
/// store address, the descriptor it builds and the emulator's reading of that descriptor, against
/// CuTe's layout and CuTe's descriptor.
template <int R, int SubRows>
void check_tile(std::uint32_t off) {
  int store_bad = 0, model_bad = 0, desc_bad = 0, checked = 0;
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 64; ++c) {
      std::uint32_t const cute_addr = off + cute_oracle::sw128_offset(R, r, c);
      // The kernel's store: 16-byte chunk ch = c / 8 of row r at row * 128 + ((ch ^ (r mod 8)) << 4)
      // (grouped_gemm_sm90.cuh, load(): `(r0 + 32 i) * 128 + swz`), plus the element inside it.
      std::uint32_t const ch = static_cast<std::uint32_t>(c / 8);
      std::uint32_t const store = off + static_cast<std::uint32_t>(r) * 128u +
                                  ((ch ^ static_cast<std::uint32_t>(r & 7)) << 4) + static_cast<std::uint32_t>(c % 8) * 2u;
      // The emulator's reading of the descriptor the kernel builds for this operand and K step
      // (`desc_sw128(sa + kk * 32)`, with sa the operand's first row).
      int const sub = r / SubRows, kk = c / 16;
      std::uint64_t const desc = sm90::detail::desc_sw128(off + static_cast<std::uint32_t>(sub * SubRows * 128 + kk * 32));
      std::uint32_t const model = emu::sm90::kmajor_address(desc, r % SubRows, c % 16);
      ++checked;
      if (store != cute_addr && store_bad++ == 0) {
        INFO("kernel store address of (" << r << ", " << c << "): " << store << ", CuTe " << cute_addr);
        CHECK(false);
      }
      if (model != cute_addr && model_bad++ == 0) {
        INFO("model address of (" << r << ", " << c << "): " << model << ", CuTe " << cute_addr);
        CHECK(false);
      }
    }
  for (int sub = 0; sub < R / SubRows; ++sub)
    for (int kk = 0; kk < 4; ++kk) {
      std::uint64_t const ours = sm90::detail::desc_sw128(off + static_cast<std::uint32_t>(sub * SubRows * 128 + kk * 32));
      std::uint64_t const theirs = cute_oracle::kmajor_desc(R, SubRows, off, sub, kk);
      if (ours != theirs && desc_bad++ == 0) {
        INFO("descriptor of operand " << sub << ", k step " << kk << ": ours 0x" << std::hex << ours << ", CuTe 0x" << theirs);
        CHECK(false);
      }
    }
  CHECK(checked == R * 64);
  CHECK(store_bad == 0);
  CHECK(model_bad == 0);
  CHECK(desc_bad == 0);
}

TEST_CASE("sm90 model: the 128-byte swizzle and the descriptors agree with CuTe on every address", "[hopper][cute]") {
  static_assert(sm90::stage_bytes % 1024 == 0, "stages are 1024-byte aligned");
  // Every ring slot of the kernel's shared memory (smem0 = 0 under the emulator: the dynamic
  // shared memory starts 1024-byte aligned).
  for (int slot = 0; slot < sm90::stages; ++slot) {
    INFO("ring slot " << slot);
    std::uint32_t const sa = static_cast<std::uint32_t>(slot) * sm90::stage_bytes;
    std::uint32_t const sb = sa + sm90::a_stage_bytes;
    check_tile<sm90::bm, 64>(sa);        // A: two warpgroups of 64 rows
    check_tile<sm90::b_rows, 256>(sb);   // B of store / accumulate: n = 256
    check_tile<sm90::b_rows, 128>(sb);   // B of swiglu: gate and up, n = 128 each
  }
}

TEST_CASE("sm90 model: the descriptor fields and swizzle modes", "[hopper][cute]") {
  // The fields as CuTe's GmmaDescriptor bit-fields read them.
  std::uint64_t const d = std::uint64_t{0x123} | (std::uint64_t{1} << 16) | (std::uint64_t{64} << 32) | (std::uint64_t{1} << 62);
  auto const g = cute_oracle::fields(d);
  auto const e = emu::sm90::decode(d);
  CHECK(e.start == g.start);
  CHECK(e.leading == g.leading);
  CHECK(e.stride == g.stride);
  CHECK(e.base_offset == g.base_offset);
  CHECK(e.swizzle == g.layout_type);
  CHECK(e.swizzle == cute_oracle::layout_b128());
  // The swizzle function itself is CuTe's Swizzle<3,4,3> on byte addresses.
  int bad = 0;
  for (std::uint32_t a = 0; a < (1u << 18); ++a) bad += emu::sm90::swizzle128(a) != cute_oracle::swizzle_343(a);
  CHECK(bad == 0);
  // Modes the emulator does not model are refused, not guessed.
  CHECK_THROWS_WITH(emu::sm90::kmajor_address(d & ~(std::uint64_t{3} << 62), 0, 0), Catch::Contains("not modelled"));
  CHECK_THROWS_WITH(emu::sm90::kmajor_address(d | (std::uint64_t{2} << 49), 0, 0), Catch::Contains("not modelled"));
}

TEST_CASE("sm90 model: the m64nNk16 accumulator fragment is CuTe's CLayout_64xN", "[hopper][cute]") {
  for (int n : {128, 256}) {
    int bad = 0;
    for (int t = 0; t < 128; ++t)
      for (int v = 0; v < n / 2; ++v) {
        int const idx = cute_oracle::clayout_64xn(n, t, v);  // m + 64 col (column-major 64 x n)
        if (idx % 64 != emu::sm90::fragment_row(t / 32, t % 32, v) || idx / 64 != emu::sm90::fragment_col(t % 32, v)) ++bad;
      }
    INFO("n = " << n);
    CHECK(bad == 0);
  }
}

// =============================================================================================
// (b) one mma_async against a brute-force product.
// =============================================================================================

/// One warpgroup: A (64 x 64) and B (N x 64) written into shared memory by plain stores at CuTe's
/// addresses (not the model's), then D = C + A B^T through `steps` k16 mma_async (one group),
/// each thread storing its registers at the positions CuTe's CLayout_64xN gives.
template <int N>
__global__ void mma_kernel(std::uint16_t const* a, std::uint16_t const* b, float const* c, float* d, int steps,
                           int read_early, float* early) {
  MOE_EMU_EXTERN_SHARED(unsigned char, smem);
  int const tid = static_cast<int>(threadIdx.x);
  std::uint32_t const sa = 0, sb = 64 * 128;
  for (int i = tid; i < 64 * 64; i += 128) std::memcpy(smem + sa + cute_oracle::sw128_offset(64, i / 64, i % 64), &a[i], 2);
  for (int i = tid; i < N * 64; i += 128) std::memcpy(smem + sb + cute_oracle::sw128_offset(N, i / 64, i % 64), &b[i], 2);
  __syncthreads();
  float acc[N / 2];
  for (int v = 0; v < N / 2; ++v) {
    int idx = cute_oracle::clayout_64xn(N, tid, v);
    acc[v] = c[(idx % 64) * N + idx / 64];
  }
  emu::sm90::wgmma_fence();
  for (int kk = 0; kk < steps; ++kk)
    emu::sm90::wgmma_mma_bf16(N, acc, sm90::detail::desc_sw128(sa + static_cast<std::uint32_t>(kk * 32)),
                              sm90::detail::desc_sw128(sb + static_cast<std::uint32_t>(kk * 32)), true);
  emu::sm90::wgmma_commit();
  if (read_early) early[tid] = acc[tid % (N / 2)];  // in flight: must not be the result
  emu::sm90::wgmma_wait(0);
  for (int v = 0; v < N / 2; ++v) {
    int idx = cute_oracle::clayout_64xn(N, tid, v);
    d[(idx % 64) * N + idx / 64] = acc[v];
  }
}

template <int N>
void check_mma(int steps) {
  std::mt19937 rng(static_cast<unsigned>(N * 10 + steps));
  std::uniform_int_distribution<int> small(-8, 8);
  // Small multiples of 1/8: every product and sum below is exact in fp32, so the comparison is exact.
  std::vector<std::uint16_t> a(64 * 64), b(static_cast<std::size_t>(N) * 64);
  std::vector<float> c(static_cast<std::size_t>(64) * N);
  for (auto& v : a) v = bf16_bits(static_cast<float>(small(rng)) / 8.0f);
  for (auto& v : b) v = bf16_bits(static_cast<float>(small(rng)) / 8.0f);
  for (auto& v : c) v = static_cast<float>(small(rng));
  auto* da = device_alloc<std::uint16_t>(a.size());
  auto* db = device_alloc<std::uint16_t>(b.size());
  auto* dc = device_alloc<float>(c.size());
  auto* dd = device_alloc<float>(c.size());
  auto* de = device_alloc<float>(128);
  upload(da, a);
  upload(db, b);
  upload(dc, c);
  std::size_t const bytes = 64 * 128 + static_cast<std::size_t>(N) * 128;
  allow_smem(mma_kernel<N>, bytes);
  REQUIRE(emu::kernel_launch(mma_kernel<N>, dim3(1), dim3(128), bytes, nullptr, da, db, dc, dd, steps, 1, de) ==
          cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  auto const d = download(dd, c.size());
  auto const early = download(de, 128);
  int bad = 0;
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = c[static_cast<std::size_t>(m) * N + n];
      for (int k = 0; k < 16 * steps; ++k)
        ref += static_cast<double>(bf16_value(a[static_cast<std::size_t>(m) * 64 + k])) *
               bf16_value(b[static_cast<std::size_t>(n) * 64 + k]);
      if (static_cast<double>(d[static_cast<std::size_t>(m) * N + n]) != ref) {
        if (bad++ == 0) {
          INFO("first mismatch at (" << m << ", " << n << "): " << d[static_cast<std::size_t>(m) * N + n] << " vs " << ref);
          CHECK(false);
        }
      }
    }
  CHECK(bad == 0);
  for (float v : early) CHECK(std::isnan(v));  // accumulators in flight are not readable
  for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dc), static_cast<void*>(dd),
                  static_cast<void*>(de)})
    cudaFree(p);
}

TEST_CASE("sm90 model: one mma_async m64n128k16 and m64n256k16 against a brute-force product", "[hopper][wgmma]") {
  SECTION("m64n128k16") { check_mma<128>(1); }
  SECTION("m64n256k16") { check_mma<256>(1); }
  SECTION("m64n128k16 chained over a 64-wide K slice") { check_mma<128>(4); }
  SECTION("m64n256k16 chained over a 64-wide K slice") { check_mma<256>(4); }
}

// =============================================================================================
// (c) group semantics: poison, pending copies, fences.
// =============================================================================================

/// 32 threads copy two 512-byte regions X (group 0) and Y (group 1) of `src` into shared memory and
/// read them back after the wait `mode` names: 0 none, 1 wait_group 1 (too weak for Y), 2 wait_group
/// 0, 3 zero-fill copies then wait_group 0.
__global__ void cp_async_kernel(unsigned char const* src, unsigned char* out, int mode) {
  MOE_EMU_EXTERN_SHARED(unsigned char, smem);
  int const t = static_cast<int>(threadIdx.x);
  std::uint32_t const base = emu::shared_address(smem);
  emu::sm90::cp_async16(base + static_cast<std::uint32_t>(t * 16), src + t * 16, mode == 3 ? 0 : 16);
  emu::sm90::cp_async_commit();
  emu::sm90::cp_async16(base + 512 + static_cast<std::uint32_t>(t * 16), src + 512 + t * 16, mode == 3 ? 0 : 16);
  emu::sm90::cp_async_commit();
  if (mode == 1) emu::sm90::cp_async_wait(1);
  if (mode >= 2) emu::sm90::cp_async_wait(0);
  __syncthreads();
  for (int i = t; i < 1024; i += 32) out[i] = smem[i];
}

TEST_CASE("sm90 model: cp.async copies land at the wait_group that retires their group", "[hopper][cp.async]") {
  std::vector<unsigned char> src(1024);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 % 251);  // never 0xff
  auto* dsrc = device_alloc<unsigned char>(1024);
  auto* dout = device_alloc<unsigned char>(1024);
  upload(dsrc, src);
  auto run = [&](int mode) {
    REQUIRE(emu::kernel_launch(cp_async_kernel, dim3(1), dim3(32), 1024, nullptr, dsrc, dout, mode) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    return download(dout, 1024);
  };
  auto poisoned = [](std::vector<unsigned char> const& v, std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; ++i)
      if (v[i] != 0xff) return false;
    return true;
  };
  auto equal = [&](std::vector<unsigned char> const& v, std::size_t from, std::size_t to) {
    return std::equal(v.begin() + static_cast<long>(from), v.begin() + static_cast<long>(to), src.begin() + static_cast<long>(from));
  };
  SECTION("missing wait: both regions read poison") {
    auto v = run(0);
    CHECK(poisoned(v, 0, 1024));
  }
  SECTION("wait_group 1 is too weak for the newest group: X landed, Y reads poison") {
    auto v = run(1);
    CHECK(equal(v, 0, 512));
    CHECK(poisoned(v, 512, 1024));
  }
  SECTION("wait_group 0: both landed") {
    auto v = run(2);
    CHECK(equal(v, 0, 1024));
  }
  SECTION("source size 0 zero-fills") {
    auto v = run(3);
    CHECK(std::all_of(v.begin(), v.end(), [](unsigned char x) { return x == 0; }));
  }
  cudaFree(dsrc);
  cudaFree(dout);
}

/// One warpgroup copies an operand pair with cp.async and runs one m64n128k16 on it; `mode`
/// plants a misuse: 1 no cp.async wait, 2 no fence.proxy.async, 3 no wgmma.fence, 4 descriptors that
/// differ between threads, 5 mma reads a copy of a later group (wait_group too weak).
__global__ void wgmma_misuse_kernel(std::uint16_t const* src, float* out, int mode) {
  MOE_EMU_EXTERN_SHARED(unsigned char, smem);
  int const tid = static_cast<int>(threadIdx.x);
  std::uint32_t const base = emu::shared_address(smem);
  // A (64 rows) and B (128 rows) of 128 bytes each: 192 rows x 8 chunks, 12 chunks per thread.
  for (int i = tid; i < 192 * 8; i += 128) {
    int const row = i / 8, ch = i % 8;
    if (mode == 5 && i + 128 >= 192 * 8) emu::sm90::cp_async_commit();  // the last copies in a group of their own
    emu::sm90::cp_async16(base + static_cast<std::uint32_t>(row * 128 + ((ch ^ (row & 7)) << 4)), src + i * 8, 16);
  }
  emu::sm90::cp_async_commit();
  if (mode != 1) emu::sm90::cp_async_wait(mode == 5 ? 1 : 0);
  if (mode != 2) emu::sm90::fence_proxy_async();
  __syncthreads();
  float acc[64] = {};
  if (mode != 3) emu::sm90::wgmma_fence();
  std::uint64_t da = sm90::detail::desc_sw128(base);
  if (mode == 4 && tid == 77) da = sm90::detail::desc_sw128(base + 32);
  emu::sm90::wgmma_mma_bf16(128, acc, da, sm90::detail::desc_sw128(base + 64 * 128), true);
  emu::sm90::wgmma_commit();
  emu::sm90::wgmma_wait(0);
  out[tid] = acc[0];
}

TEST_CASE("sm90 model: wgmma reading unfinished or unfenced copies, a missing wgmma.fence, non-uniform operands",
          "[hopper][wgmma][errors]") {
  std::vector<std::uint16_t> src(192 * 64, bf16_bits(1.0f));
  auto* dsrc = device_alloc<std::uint16_t>(src.size());
  auto* dout = device_alloc<float>(128);
  upload(dsrc, src);
  std::size_t const bytes = 192 * 128;
  auto run = [&](int mode) {
    REQUIRE(emu::kernel_launch(wgmma_misuse_kernel, dim3(1), dim3(128), bytes, nullptr, dsrc, dout, mode) == cudaSuccess);
  };
  SECTION("control: correct use") {
    run(0);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    auto v = download(dout, 128);
    CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 16.0f; }));
  }
  SECTION("no cp.async.wait_group") {
    run(1);
    expect_kernel_error({"wgmma_misuse_kernel", "wgmma.mma_async", "still pending"});
  }
  SECTION("no fence.proxy.async") {
    run(2);
    expect_kernel_error({"wgmma.mma_async", "fence.proxy.async"});
  }
  SECTION("no wgmma.fence") {
    run(3);
    expect_kernel_error({"wgmma.mma_async", "without a wgmma.fence"});
  }
  SECTION("descriptors differ between threads") {
    run(4);
    expect_kernel_error({"wgmma.mma_async", "thread 77"});
  }
  SECTION("wait_group one too weak") {
    run(5);
    expect_kernel_error({"wgmma.mma_async", "still pending"});
  }
  cudaFree(dsrc);
  cudaFree(dout);
}

}  // namespace
