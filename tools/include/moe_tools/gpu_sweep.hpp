#pragma once
// The size sweep of findep_fit_gpu (host only, so that tests/schedule/test_gpu_sweep.cpp checks it
// without a GPU): which calls the GPU microbenchmark times, the work of each call in the units of
// the performance models (perf_model.hpp, docs/findep.md), the buffers the sweep needs, and the
// balanced token -> expert assignment of the routed-expert calls.
//
// The sweep spans what the FinDEP solver asks the models for on the grid of docs/findep.md
// (DeepSeek-V2 and Qwen3-235B, sequence 1k-8k, AG/EG splits 4/4 6/2 2/6 16/16, up to 40 GB per AG
// rank, r2 <= 64): micro-batches of T = m_a * seq tokens from 1024 to 30720 (DeepSeek-V2) / 24576
// (Qwen3-235B), expert passes of 32 to ~590k token copies, messages of ~1 MB to ~5.7 GB. The
// test recomputes that range from the solver's own search space and checks that the sweep covers it.
//
// Points of both shapes are fitted together: one model per operation and machine, as the model
// file holds.

#include <algorithm>
#include <array>
#include <cstddef>
#include <string_view>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/shape.hpp"
#include "moe/models/models.hpp"
#include "moe/schedule/perf_model.hpp"

namespace findep_gpu {

using moe::schedule::Op;

inline constexpr int elem_bytes = 2;    ///< bf16 storage everywhere
inline constexpr int head_dim = 128;    ///< attention heads of 128 (MHA-equivalent: heads = hidden / 128)
inline constexpr int tile_m = 128;      ///< row tile of kernels::cuda::grouped_gemm (static_assert in the .cu)
inline constexpr int max_softmax_row = 8192;  ///< longest row the softmax kernel takes (32 values per thread)
/// Score buffer of the attention calls: (sample, head) pairs are processed in chunks whose bf16
/// score matrices fit this many bytes (only the seq 8192 points need more than one chunk).
inline constexpr std::size_t score_budget_bytes = std::size_t{4} << 30;

/// A model shape of the sweep. `eg_ranks` fixes the expert count of the EG rank whose routed
/// experts are timed (experts / eg_ranks local experts, the 4/4 split of the grid).
struct SweepShape {
  std::string_view name;
  moe::ShapeSpec spec;
  int eg_ranks = 4;
  [[nodiscard]] constexpr int local_experts() const { return spec.experts / eg_ranks; }
  [[nodiscard]] constexpr int heads() const { return spec.hidden / head_dim; }
};

inline constexpr int shape_count = 2;
inline constexpr std::array<SweepShape, shape_count> shapes{
    SweepShape{moe::models::DeepSeekV2::name, moe::models::DeepSeekV2::spec, 4},
    SweepShape{moe::models::Qwen3_235B_A22B::name, moe::models::Qwen3_235B_A22B::spec, 4}};

// Sizes. gemm / shared: tokens T of a micro-batch. attention: (samples, seq) with samples * seq <=
// max_tokens. experts: token copies (rows of the grouped GEMM) on the EG rank. a2e / e2a: tokens
// of a message, each sent top_k times (the model's Tc * max(1, ag/eg)).
inline constexpr long long max_tokens = 32768;
inline constexpr std::array<long long, 11> token_sizes{512,  1024,  2048,  3072,  4096, 6144,
                                                       8192, 12288, 16384, 24576, 32768};
inline constexpr std::array<int, 4> seq_sizes{1024, 2048, 4096, 8192};
inline constexpr std::array<long long, 17> expert_rows{32,    64,    128,    256,    512,    1024,
                                                       2048,  4096,  8192,   16384,  32768,  65536,
                                                       131072, 262144, 393216, 524288, 655360};
inline constexpr std::array<long long, 14> link_tokens{16,   32,   64,   128,   256,   512,   1024,
                                                       2048, 4096, 8192, 16384, 32768, 65536, 98304};

// Work of one call, as the solver's model counts it (docs/findep.md, problem.hpp).
[[nodiscard]] constexpr double gemm_work(moe::ShapeSpec const& s, long long tokens) {
  return 2.0 * static_cast<double>(tokens) * s.hidden * s.hidden;
}
[[nodiscard]] constexpr double attention_work(moe::ShapeSpec const& s, int samples, int seq) {
  return 4.0 * samples * static_cast<double>(seq) * seq * s.hidden;
}
[[nodiscard]] constexpr double shared_work(moe::ShapeSpec const& s, long long tokens) {
  return 6.0 * static_cast<double>(tokens) * s.hidden * s.shared_ffn * s.shared_experts;
}
[[nodiscard]] constexpr double experts_work(moe::ShapeSpec const& s, long long rows) {
  return 6.0 * static_cast<double>(rows) * s.hidden * s.expert_ffn;
}
[[nodiscard]] constexpr long long link_bytes(moe::ShapeSpec const& s, long long tokens) {
  return tokens * s.top_k * s.hidden * elem_bytes;
}

/// One timed call.
struct Point {
  Op op = Op::gemm;
  int shape = 0;          ///< index into `shapes`
  long long tokens = 0;   ///< gemm, shared: T; experts: rows; a2e, e2a: message tokens
  int samples = 0;        ///< attention
  int seq = 0;            ///< attention
  double work = 0;        ///< flop, or bytes for a2e / e2a
};

/// (sample, head) pairs per attention chunk: as many as the score budget holds, at least one.
[[nodiscard]] constexpr long long attention_chunk(SweepShape const& sh, int samples, int seq) {
  long long entries = static_cast<long long>(samples) * sh.heads();
  long long per = static_cast<long long>(seq) * seq * elem_bytes;
  long long fit = static_cast<long long>(score_budget_bytes) / per;
  return std::max(1LL, std::min(entries, fit));
}

/// Every point of the sweep, grouped by operation (the program shuffles them).
[[nodiscard]] inline std::vector<Point> sweep() {
  std::vector<Point> out;
  for (int i = 0; i < shape_count; ++i) {
    moe::ShapeSpec const& s = shapes[static_cast<std::size_t>(i)].spec;
    for (long long t : token_sizes) out.push_back({Op::gemm, i, t, 0, 0, gemm_work(s, t)});
    for (int seq : seq_sizes)
      for (int b = 1; static_cast<long long>(b) * seq <= max_tokens; b *= 2)
        out.push_back({Op::attention, i, 0, b, seq, attention_work(s, b, seq)});
    if (s.shared_experts > 0)
      for (long long t : token_sizes) out.push_back({Op::shared, i, t, 0, 0, shared_work(s, t)});
    for (long long r : expert_rows) out.push_back({Op::experts, i, r, 0, 0, experts_work(s, r)});
    for (Op op : {Op::a2e, Op::e2a})
      for (long long t : link_tokens) out.push_back({op, i, t, 0, 0, static_cast<double>(link_bytes(s, t))});
  }
  return out;
}

/// Device buffers of the sweep, in elements (bf16 unless noted). Each operation's points share
/// its buffers, sized for its largest point; weights are per shape.
struct BufferSizes {
  std::size_t gemm_act = 0;                      ///< A and C of the projection GEMM: T x hidden
  std::array<std::size_t, shape_count> gemm_w{};  ///< hidden x hidden
  std::size_t attn_act = 0;                      ///< each of Q, K, V, O: samples x seq x hidden
  std::size_t attn_scores = 0;                   ///< chunk x seq x seq
  std::size_t shared_x = 0;                      ///< T x hidden
  std::size_t shared_inter = 0;                  ///< T x shared_ffn
  std::size_t shared_acc = 0;                    ///< T x hidden, fp32
  std::array<std::size_t, shape_count> shared_w{};   ///< 3 x shared_ffn x hidden per shared expert
  std::size_t expert_src = 0;                    ///< token rows the copies read: ceil(rows / top_k) x hidden
  std::size_t expert_inter = 0;                  ///< rows x expert_ffn
  std::size_t expert_out = 0;                    ///< rows x hidden
  std::array<std::size_t, shape_count> expert_w{};   ///< 3 x expert_ffn x hidden x local experts
  std::size_t expert_index = 0;                  ///< int32: sum of rows over the experts points
  std::size_t link_bytes = 0;                    ///< bytes of each of the two link buffers

  [[nodiscard]] std::size_t total_bytes() const {
    std::size_t e = gemm_act * 2 + 4 * attn_act + attn_scores + shared_x + shared_inter + expert_src +
                    expert_inter + expert_out;
    for (int i = 0; i < shape_count; ++i) {
      auto k = static_cast<std::size_t>(i);
      e += gemm_w[k] + shared_w[k] + expert_w[k];
    }
    return e * elem_bytes + shared_acc * sizeof(float) + expert_index * sizeof(int) + 2 * link_bytes;
  }
};

[[nodiscard]] inline BufferSizes buffer_sizes(std::vector<Point> const& points) {
  BufferSizes b;
  auto up = [](std::size_t& v, double x) { v = std::max(v, static_cast<std::size_t>(x)); };
  for (Point const& p : points) {
    SweepShape const& sh = shapes[static_cast<std::size_t>(p.shape)];
    moe::ShapeSpec const& s = sh.spec;
    auto k = static_cast<std::size_t>(p.shape);
    double h = s.hidden, t = static_cast<double>(p.tokens);
    switch (p.op) {
      case Op::gemm:
        up(b.gemm_act, t * h);
        b.gemm_w[k] = static_cast<std::size_t>(s.hidden) * s.hidden;
        break;
      case Op::attention:
        up(b.attn_act, static_cast<double>(p.samples) * p.seq * h);
        up(b.attn_scores, static_cast<double>(attention_chunk(sh, p.samples, p.seq)) * p.seq * p.seq);
        break;
      case Op::shared:
        up(b.shared_x, t * h);
        up(b.shared_inter, t * s.shared_ffn);
        up(b.shared_acc, t * h);
        b.shared_w[k] = 3ULL * s.shared_ffn * s.hidden * s.shared_experts;
        break;
      case Op::experts:
        up(b.expert_src, static_cast<double>((p.tokens + s.top_k - 1) / s.top_k) * h);
        up(b.expert_inter, t * s.expert_ffn);
        up(b.expert_out, t * h);
        b.expert_w[k] = 3ULL * s.expert_ffn * s.hidden * static_cast<std::size_t>(sh.local_experts());
        b.expert_index += static_cast<std::size_t>(p.tokens);
        break;
      case Op::a2e:
      case Op::e2a:
        up(b.link_bytes, p.work);
        break;
    }
  }
  return b;
}

/// Balanced token -> expert assignment of `rows` token copies over `experts` local experts, in the
/// grouped order the routed-expert GEMM reads. Copy c = token * top_k + slot goes to expert
/// c % experts (so a token's top_k copies go to top_k different experts when top_k <= experts);
/// expert e gets the copies e, e + experts, e + 2 experts, ... (counts differ by at most one).
struct ExpertGrouping {
  std::vector<int> offsets;      ///< experts + 1: first grouped row of each expert
  std::vector<int> tile_starts;  ///< experts + 1: first row tile (of tile_m rows) of each expert
  std::vector<int> index;        ///< rows: copy id of each grouped row; its token row is index / top_k
};

[[nodiscard]] inline ExpertGrouping balanced_grouping(long long rows, int experts) {
  moe::check(rows >= 0 && rows < (1LL << 31), "findep_fit_gpu: ", rows, " expert rows do not fit an int");
  moe::check(experts >= 1, "findep_fit_gpu: need at least one local expert, got ", experts);
  ExpertGrouping g;
  auto E = static_cast<std::size_t>(experts);
  g.offsets.assign(E + 1, 0);
  g.tile_starts.assign(E + 1, 0);
  g.index.reserve(static_cast<std::size_t>(rows));
  for (std::size_t e = 0; e < E; ++e) {
    long long count = 0;
    for (long long c = static_cast<long long>(e); c < rows; c += experts, ++count) g.index.push_back(static_cast<int>(c));
    g.offsets[e + 1] = g.offsets[e] + static_cast<int>(count);
    g.tile_starts[e + 1] = g.tile_starts[e] + static_cast<int>((count + tile_m - 1) / tile_m);
  }
  return g;
}

}  // namespace findep_gpu
