#pragma once
// moe-emu WMMA shim (nvcuda::wmma): bf16 m16n16k16 with fp32 accumulators, and fp32 accumulator
// fragments. Every operation is warp-collective (all 32 lanes, warp-uniform arguments: checked)
// and computed once per warp. Which matrix element a lane's `x[i]` holds is deliberately a fixed
// pseudo-random permutation, so code that assumes an element order fails: only fill, load, store
// and mma give meaningful results (element-wise operations that ignore the position still work).
// Loads and stores check the documented contract: a 256-bit aligned pointer, ldm a multiple of 16
// bytes (8 bf16 or 4 float elements).

#include <array>
#include <cstdint>
#include <string>

#include "cuda_bf16.h"
#include "emu/runtime.hpp"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
/// Which fragment kind a permutation is for: matrix_a, matrix_b and accumulator fragments each
/// get their own, so that code that pairs x[i] of one kind with x[i] of another fails too.
template <class Use> constexpr std::uint32_t seed = 0;
template <> inline constexpr std::uint32_t seed<matrix_a> = 0x9e3779b9u;
template <> inline constexpr std::uint32_t seed<matrix_b> = 0x7f4a7c15u;
template <> inline constexpr std::uint32_t seed<accumulator> = 0x85ebca6bu;

/// position (row * 16 + col) of element i of lane l: a fixed pseudo-random permutation of the 256
/// positions of the tile, one per fragment kind.
template <class Use>
std::array<std::uint16_t, 256> const& positions() {
  static std::array<std::uint16_t, 256> const p = [] {
    std::array<std::uint16_t, 256> a{};
    for (int i = 0; i < 256; ++i) a[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(i);
    std::uint32_t s = seed<Use>;
    for (int i = 255; i > 0; --i) {
      s = s * 1664525u + 1013904223u;
      int j = static_cast<int>((s >> 8) % static_cast<std::uint32_t>(i + 1));
      std::swap(a[static_cast<std::size_t>(i)], a[static_cast<std::size_t>(j)]);
    }
    return a;
  }();
  return p;
}
template <class Use>
int pos(int lane, int i) {
  return positions<Use>()[static_cast<std::size_t>(lane * 8 + i)];
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "moe-emu models the m16n16k16 WMMA shape only");
  static constexpr int num_elements = 8;
  T x[8];
};

template <class Use, class T, class L>
void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, T v) {
  for (auto& e : f.x) e = v;
}
template <class Use, class L>
void fill_fragment(fragment<Use, 16, 16, 16, __nv_bfloat16, L>& f, float v) {
  for (auto& e : f.x) e = __float2bfloat16_rn(v);
}

namespace detail {

struct Load {
  void const* ptr;
  unsigned ldm;
  int layout;  // 0 row, 1 col
  void* x;
};

template <class T>
void check_uniform(void* const* lanes, char const* what) {
  auto const* first = static_cast<Load const*>(lanes[0]);
  for (int l = 1; l < 32; ++l) {
    auto const* o = static_cast<Load const*>(lanes[l]);
    if (o->ptr != first->ptr) ::emu::kernel_fail(std::string(what) + ": the pointer differs between lanes 0 and " + std::to_string(l));
    if (o->ldm != first->ldm) ::emu::kernel_fail(std::string(what) + ": ldm differs between lanes 0 and " + std::to_string(l));
    if (o->layout != first->layout) ::emu::kernel_fail(std::string(what) + ": the layout differs between lanes");
  }
  if (reinterpret_cast<std::uintptr_t>(first->ptr) % 32 != 0)
    ::emu::kernel_fail(std::string(what) + ": the pointer is not 256-bit aligned");
  if ((first->ldm * sizeof(T)) % 16 != 0)
    ::emu::kernel_fail(std::string(what) + ": ldm = " + std::to_string(first->ldm) + " is not a multiple of 16 bytes");
  // A tile that leaves its buffer is not checked here (the allocation registry's lock would order
  // kernels for ThreadSanitizer): AddressSanitizer sees it, as device allocations are exact-size.
}

/// Element (r, c) of a 16x16 tile at p with leading dimension ldm.
template <class T>
T at(T const* p, unsigned ldm, bool col, int r, int c) {
  return col ? p[static_cast<std::size_t>(c) * ldm + static_cast<std::size_t>(r)]
             : p[static_cast<std::size_t>(r) * ldm + static_cast<std::size_t>(c)];
}

template <class Use, class T>
void load(T* x, T const* p, unsigned ldm, int layout, ::emu::Where where) {
  Load mine{p, ldm, layout, x};
  ::emu::warp_collective(0xffffffffu, "wmma::load_matrix_sync", &mine,
                         [](void* const* lanes) {
                           check_uniform<T>(lanes, "wmma::load_matrix_sync");
                           auto const* f = static_cast<Load const*>(lanes[0]);
                           auto const* src = static_cast<T const*>(f->ptr);
                           for (int l = 0; l < 32; ++l) {
                             auto* dst = static_cast<T*>(static_cast<Load const*>(lanes[l])->x);
                             for (int i = 0; i < 8; ++i) {
                               // (row, column): (m, k) for matrix_a, (k, n) for matrix_b
                               int q = pos<Use>(l, i), r = q / 16, c = q % 16;
                               dst[i] = at(src, f->ldm, f->layout == 1, r, c);
                             }
                           }
                         },
                         where);
}

}  // namespace detail

template <class T>
void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, row_major>& f, T const* p, unsigned ldm,
                      ::emu::Where where = ::emu::Where::current()) {
  detail::load<matrix_a>(f.x, p, ldm, 0, where);
}
template <class T>
void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, col_major>& f, T const* p, unsigned ldm,
                      ::emu::Where where = ::emu::Where::current()) {
  detail::load<matrix_a>(f.x, p, ldm, 1, where);
}
template <class T>
void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, row_major>& f, T const* p, unsigned ldm,
                      ::emu::Where where = ::emu::Where::current()) {
  detail::load<matrix_b>(f.x, p, ldm, 0, where);
}
template <class T>
void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, col_major>& f, T const* p, unsigned ldm,
                      ::emu::Where where = ::emu::Where::current()) {
  detail::load<matrix_b>(f.x, p, ldm, 1, where);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, float const* p, unsigned ldm, layout_t l,
                             ::emu::Where where = ::emu::Where::current()) {
  detail::load<accumulator>(f.x, p, ldm, l == mem_col_major ? 1 : 0, where);
}

inline void store_matrix_sync(float* p, fragment<accumulator, 16, 16, 16, float> const& f, unsigned ldm, layout_t l,
                              ::emu::Where where = ::emu::Where::current()) {
  detail::Load mine{p, ldm, l == mem_col_major ? 1 : 0, const_cast<float*>(f.x)};
  ::emu::warp_collective(0xffffffffu, "wmma::store_matrix_sync", &mine,
                         [](void* const* lanes) {
                           detail::check_uniform<float>(lanes, "wmma::store_matrix_sync");
                           auto const* first = static_cast<detail::Load const*>(lanes[0]);
                           auto* dst = static_cast<float*>(const_cast<void*>(first->ptr));
                           for (int l = 0; l < 32; ++l) {
                             auto const* x = static_cast<float const*>(static_cast<detail::Load const*>(lanes[l])->x);
                             for (int i = 0; i < 8; ++i) {
                               int q = detail::pos<accumulator>(l, i), r = q / 16, c = q % 16;
                               std::size_t at = first->layout == 1 ? static_cast<std::size_t>(c) * first->ldm + r
                                                                   : static_cast<std::size_t>(r) * first->ldm + c;
                               dst[at] = x[i];
                             }
                           }
                         },
                         where);
}

namespace detail {
/// mma_sync's warp collective: the lanes' fragments in, d out. Without the sanitizers' checks, as
/// the wgmma model's arithmetic (tests/emu/src/hopper.cpp): it touches only the fragments, fixed-size
/// arrays of the lanes, never memory a kernel addresses.
template <class T, class Args>
__attribute__((no_sanitize("address", "undefined"))) void mma_lanes(void* const* lanes) {
  float A[16][16], B[16][16], C[16][16];
  auto to_f = [](T v) {
    if constexpr (std::is_same_v<T, float>) return v;
    else return __bfloat162float(v);
  };
  for (int l = 0; l < 32; ++l) {
    auto const* g = static_cast<Args const*>(lanes[l]);
    for (int i = 0; i < 8; ++i) {
      int qa = pos<matrix_a>(l, i), qb = pos<matrix_b>(l, i);
      int qc = pos<accumulator>(l, i);
      A[qa / 16][qa % 16] = to_f(g->a[i]);
      B[qb / 16][qb % 16] = to_f(g->b[i]);
      C[qc / 16][qc % 16] = g->c[i];
    }
  }
  float D[16][16];
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 16; ++col) {
      float acc = C[r][col];
      for (int k = 0; k < 16; ++k) acc += A[r][k] * B[k][col];
      D[r][col] = acc;
    }
  for (int l = 0; l < 32; ++l) {
    auto const* g = static_cast<Args const*>(lanes[l]);
    for (int i = 0; i < 8; ++i) {
      int q = pos<accumulator>(l, i);
      g->d[i] = D[q / 16][q % 16];
    }
  }
}
}  // namespace detail

/// d = a * b + c (fp32 accumulation over k in order).
template <class T, class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, fragment<matrix_a, 16, 16, 16, T, LA> const& a,
              fragment<matrix_b, 16, 16, 16, T, LB> const& b, fragment<accumulator, 16, 16, 16, float> const& c,
              ::emu::Where where = ::emu::Where::current()) {
  struct Args {
    float* d;
    T const* a;
    T const* b;
    float const* c;
  } mine{d.x, a.x, b.x, c.x};
  ::emu::warp_collective(0xffffffffu, "wmma::mma_sync", &mine,
                         [](void* const* lanes) { detail::mma_lanes<T, Args>(lanes); }, where);
}

}  // namespace nvcuda::wmma
