#pragma once
// Plain host kernels measured by findep_fit_host to fit the FinDEP performance models on a CPU.
// They exist only for the microbenchmark (fp32, one thread): a blocked GEMM, a simple multi-head
// attention, SwiGLU experts, and a memcpy "link" that stands in for the A2E / E2A transfers.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

namespace findep_host {

/// C[m x n] = A[m x k] * B[k x n], row-major, blocked for the caches. Work: 2 m n k flop.
inline void gemm(float const* A, float const* B, float* C, int m, int n, int k) {
  constexpr int bm = 64, bn = 256, bk = 128;
  std::fill(C, C + static_cast<std::size_t>(m) * n, 0.0f);
  for (int i0 = 0; i0 < m; i0 += bm)
    for (int p0 = 0; p0 < k; p0 += bk)
      for (int j0 = 0; j0 < n; j0 += bn) {
        int i1 = std::min(m, i0 + bm), p1 = std::min(k, p0 + bk), j1 = std::min(n, j0 + bn);
        for (int i = i0; i < i1; ++i) {
          float* c = C + static_cast<std::size_t>(i) * n;
          for (int p = p0; p < p1; ++p) {
            float a = A[static_cast<std::size_t>(i) * k + p];
            float const* b = B + static_cast<std::size_t>(p) * n;
            for (int j = j0; j < j1; ++j) c[j] += a * b[j];
          }
        }
      }
}

/// Softmax attention of `samples` sequences of `seq` tokens, `heads` heads of width `dk`
/// (hidden = heads * dk). q, k, v, out: [samples, seq, hidden]. Work: 4 samples seq^2 hidden flop.
inline void attention(float const* q, float const* k, float const* v, float* out, int samples, int seq,
                      int heads, int dk, std::vector<float>& scratch) {
  int hidden = heads * dk;
  scratch.resize(static_cast<std::size_t>(seq));
  float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int b = 0; b < samples; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < seq; ++i) {
        std::size_t row = (static_cast<std::size_t>(b) * seq + i) * hidden + static_cast<std::size_t>(h) * dk;
        float const* qi = q + row;
        float mx = -INFINITY;
        for (int j = 0; j < seq; ++j) {
          float const* kj = k + (static_cast<std::size_t>(b) * seq + j) * hidden + static_cast<std::size_t>(h) * dk;
          float s = 0;
          for (int t = 0; t < dk; ++t) s += qi[t] * kj[t];
          scratch[static_cast<std::size_t>(j)] = s * scale;
          mx = std::max(mx, s * scale);
        }
        float sum = 0;
        for (int j = 0; j < seq; ++j) {
          float e = std::exp(scratch[static_cast<std::size_t>(j)] - mx);
          scratch[static_cast<std::size_t>(j)] = e;
          sum += e;
        }
        float* o = out + row;
        std::fill(o, o + dk, 0.0f);
        for (int j = 0; j < seq; ++j) {
          float w = scratch[static_cast<std::size_t>(j)] / sum;
          float const* vj = v + (static_cast<std::size_t>(b) * seq + j) * hidden + static_cast<std::size_t>(h) * dk;
          for (int t = 0; t < dk; ++t) o[t] += w * vj[t];
        }
      }
}

/// Weights of one SwiGLU expert: gate and up [hidden x ffn], down [ffn x hidden].
struct Expert {
  std::vector<float> gate, up, down;
  Expert(int hidden, int ffn, float value)
      : gate(static_cast<std::size_t>(hidden) * ffn, value), up(gate), down(gate) {}
};

/// out[tokens x hidden] = (silu(x Wg) * (x Wu)) Wd. Work: 6 tokens hidden ffn flop.
inline void swiglu(Expert const& w, float const* x, float* out, int tokens, int hidden, int ffn,
                   std::vector<float>& g, std::vector<float>& u) {
  g.resize(static_cast<std::size_t>(tokens) * ffn);
  u.resize(g.size());
  gemm(x, w.gate.data(), g.data(), tokens, ffn, hidden);
  gemm(x, w.up.data(), u.data(), tokens, ffn, hidden);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  gemm(g.data(), w.down.data(), out, tokens, hidden, ffn);
}

/// Stand-in for a link: copies `bytes` from one buffer to another in messages of at most
/// `message` bytes (one per destination rank). Work: bytes.
inline void link_copy(char const* src, char* dst, std::size_t bytes, std::size_t message) {
  for (std::size_t off = 0; off < bytes; off += message) std::memcpy(dst + off, src + off, std::min(message, bytes - off));
}

}  // namespace findep_host
