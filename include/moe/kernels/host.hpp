#pragma once
// Host reference kernels: the gate GEMM, the SwiGLU expert FFN and the weighted accumulate. Every
// CUDA kernel is checked against these. Storage is float or bf16; accumulation is always fp32.
// The SwiGLU intermediate is rounded to the storage type between the two GEMMs, as a GPU kernel
// that writes it to memory would.

#include <cmath>
#include <cstddef>
#include <span>

#include "moe/core/bf16.hpp"
#include "moe/core/weights.hpp"

namespace moe::kernels::host {

/// Dot product of two length-n rows in fp32 with eight partial sums (lets the compiler vectorise).
template <class A, class B>
inline float dot(A const* a, B const* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += to_float(a[i + j]) * to_float(b[i + j]);
  float s = 0.0f;
  for (; i < n; ++i) s += to_float(a[i]) * to_float(b[i]);
  return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/// y[r][m] = sum_k x[r][k] * w[m][k] for r < rows, m < out (x: rows x in, w: out x in).
template <class T, class X>
inline void gemm_nt(X const* x, int rows, int in, T const* w, int out, float* y) {
  for (int r = 0; r < rows; ++r)
    for (int m = 0; m < out; ++m)
      y[static_cast<std::size_t>(r) * out + m] = dot(x + static_cast<std::size_t>(r) * in, w + static_cast<std::size_t>(m) * in, in);
}

/// Router logits for `rows` tokens: logits (rows x experts) = x (rows x hidden) * router^T.
template <class T>
inline void gate_logits(T const* x, int rows, int hidden, T const* router, int experts, float* logits) {
  gemm_nt(x, rows, hidden, router, experts, logits);
}

inline float silu(float v) { return v / (1.0f + std::exp(-v)); }

/// out (rows x hidden, fp32) = down( silu(x gate^T) * (x up^T) ) for one expert of width ffn.
/// `scratch` must hold swiglu_scratch(rows, ffn) floats.
template <class T>
inline void swiglu_expert(T const* x, int rows, int hidden, int ffn, ExpertWeights<T> const& w, float* out,
                          std::span<float> scratch) {
  auto n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(ffn);
  float* g = scratch.data();
  float* u = g + n;
  gemm_nt(x, rows, hidden, w.gate, ffn, g);
  gemm_nt(x, rows, hidden, w.up, ffn, u);
  // The intermediate is rounded to storage precision, then kept in float for the down projection.
  for (std::size_t i = 0; i < n; ++i) g[i] = to_float(from_float<T>(silu(g[i]) * u[i]));
  gemm_nt(g, rows, ffn, w.down, hidden, out);
}

/// Number of floats swiglu_expert needs as scratch for `rows` rows.
inline std::size_t swiglu_scratch(int rows, int ffn) {
  return 2 * static_cast<std::size_t>(rows) * static_cast<std::size_t>(ffn);
}

}  // namespace moe::kernels::host
