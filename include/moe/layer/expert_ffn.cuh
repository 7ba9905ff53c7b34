#pragma once
// The expert feed-forward passes of a MoE layer on the GPU (nvcc only), shared by moe::CudaLayer
// and the FinDEP executors (moe/layer/findep_cuda.cuh) so that every device path runs the same
// kernels with the same roundings:
//
//   RoutedExperts<S, T>   received records -> (record, slot) pairs grouped by expert -> SwiGLU
//                         grouped GEMM (bf16/fp32 intermediate in storage precision) -> down
//                         grouped GEMM -> weighted combine: one partial row per record
//   shared_experts<S>     acc (fp32) = sum over the shared experts of SwiGLU FFNs on every row
//
// Both take the grouped GEMM's kernel choice (kernels::cuda::GemmPath); prepare_gemm_path checks
// it once, at an owner's construction.

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <type_traits>

#include "moe/core/shape.hpp"
#include "moe/kernels/combine.cuh"
#include "moe/kernels/cuda_common.cuh"
#include "moe/kernels/dispatch.cuh"
#include "moe/kernels/grouped_gemm.cuh"
#include "moe/core/weights.hpp"

namespace moe::detail {

/// Checks that grouped GEMMs of T can run with `path` on the current device (`who` names the
/// owner in the error) and, for bf16, runs the one-time probe behind GemmPath::automatic now: the
/// probe synchronises, so it must not happen first inside a captured forward pass.
template <class T>
void prepare_gemm_path(char const* who, kernels::cuda::GemmPath path) {
  namespace kc = kernels::cuda;
  check(path == kc::GemmPath::automatic || path == kc::GemmPath::portable || path == kc::GemmPath::hopper, who,
        ": unknown GemmPath ", static_cast<int>(path));
  if constexpr (std::is_same_v<T, moe::bf16>) {
    if (path == kc::GemmPath::portable) return;
    bool hopper = kc::hopper_gemm_available();
    check(hopper || path != kc::GemmPath::hopper, who,
          ": GemmPath::hopper needs an sm_90 device and a program built with -gencode=arch=compute_90a,code=sm_90a");
  } else {
    check(path != kc::GemmPath::hopper, who, ": GemmPath::hopper computes bf16 only; this layer stores fp32");
  }
}

/// The two grouped GEMMs of the routed experts over rows already grouped by expert: expert e's rows
/// are [offsets[e], offsets[e + 1]) (device; tile_starts in units of grouped_gemm_tile_m rows), row
/// i reads its token at a + (index ? index[i] / index_div : i) * a_stride. inter (rows x
/// expert_ffn) = bf16/fp32 silu(gate x) * (up x); out (rows x hidden) = down inter, in storage
/// precision. `max_rows` bounds the total rows (the grid is sized for it).
template <ShapeSpec S, class T>
struct ExpertGemms {
  int const* offsets = nullptr;
  int const* tile_starts = nullptr;
  long long max_rows = 0;
  std::byte const* a = nullptr;
  std::size_t a_stride = 0;
  int const* index = nullptr;
  int index_div = 1;
  T const* const* gate = nullptr;  ///< device tables, one pointer per expert
  T const* const* up = nullptr;
  T const* const* down = nullptr;
  T* inter = nullptr;
  T* out = nullptr;
  kernels::cuda::GemmPath path = kernels::cuda::GemmPath::automatic;

  void enqueue(cudaStream_t s) const {
    namespace kc = kernels::cuda;
    kc::GroupedGemmArgs<T> g1;
    g1.groups = S.experts;
    g1.rows = offsets;
    g1.tile_starts = tile_starts;
    g1.max_row_tiles = kc::grouped_gemm_row_tiles(max_rows, S.experts);
    g1.index = index;
    g1.a = a;
    g1.a_stride = a_stride;
    g1.index_div = index_div;
    g1.b0_table = gate;
    g1.b1_table = up;
    g1.n = S.expert_ffn;
    g1.k = S.hidden;
    g1.out = inter;
    g1.out_ld = static_cast<std::size_t>(S.expert_ffn);
    g1.path = path;
    kc::grouped_gemm<T, kc::Epilogue::swiglu>(s, g1);

    kc::GroupedGemmArgs<T> g2 = g1;  // same groups and tiles, rows in grouped order
    g2.a = reinterpret_cast<std::byte const*>(inter);
    g2.a_stride = static_cast<std::size_t>(S.expert_ffn) * sizeof(T);
    g2.index = nullptr;
    g2.index_div = 1;
    g2.b0_table = down;
    g2.b1_table = nullptr;
    g2.n = S.hidden;
    g2.k = S.expert_ffn;
    g2.out = out;
    g2.out_ld = static_cast<std::size_t>(S.hidden);
    kc::grouped_gemm<T, kc::Epilogue::store>(s, g2);
  }
};

/// The routed experts of `slots` received records: records at `records` (`record_bytes` apart,
/// metadata first), per source s the records [recv_base[s], recv_base[s] + recv_n[s]); the token
/// row of (record, slot) item i = record * top_k + slot is read at a + (i / index_div) * a_stride.
/// Writes one weighted partial row per record slot into `back`. The grouping scratch holds
/// slots * top_k items; inter and expert_out hold slots * max_count rows (a record naming more
/// than max_count experts is rejected, see kernels::cuda::group_by_expert).
template <ShapeSpec S, class T>
struct RoutedExperts {
  std::byte const* records = nullptr;
  std::size_t record_bytes = 0;
  long long slots = 0;
  long long const* recv_base = nullptr;
  int const* recv_n = nullptr;
  int sources = 1;
  std::byte const* a = nullptr;
  std::size_t a_stride = 0;
  int index_div = S.top_k;  ///< top_k: one token row per record; top_k^2: one record per (token, expert)
  unsigned char const* served = nullptr;
  /// Most experts one record names (1..top_k): 1 without de-duplication, at most the experts a
  /// rank serves with it.
  int max_count = S.top_k;
  T const* const* gate = nullptr;  ///< device tables, one pointer per expert
  T const* const* up = nullptr;
  T const* const* down = nullptr;
  kernels::cuda::ExpertGrouping grouping{};
  T* inter = nullptr;       ///< slots * max_count x expert_ffn
  T* expert_out = nullptr;  ///< slots * max_count x hidden
  T* back = nullptr;        ///< slots x hidden
  unsigned* errors = nullptr;
  kernels::cuda::GemmPath path = kernels::cuda::GemmPath::automatic;

  void enqueue(cudaStream_t s) const {
    namespace kc = kernels::cuda;
    constexpr int k = S.top_k;
    kc::group_by_expert<k>(s, records, record_bytes, slots, recv_base, recv_n, sources, S.experts, served,
                           kc::grouped_gemm_tile_m, grouping, errors, max_count);
    if (slots == 0) return;
    ExpertGemms<S, T>{.offsets = grouping.offsets,
                      .tile_starts = grouping.tile_starts,
                      .max_rows = slots * max_count,  // the valid pairs group_by_expert keeps
                      .a = a,
                      .a_stride = a_stride,
                      .index = grouping.sorted_values,  // record * k + slot
                      .index_div = index_div,
                      .gate = gate,
                      .up = up,
                      .down = down,
                      .inter = inter,
                      .out = expert_out,
                      .path = path}
        .enqueue(s);
    kc::combine_records<T, k>(s, records, record_bytes, slots, recv_base, recv_n, sources, S.experts, served,
                              expert_out, grouping.position, S.hidden, back, max_count);
  }
};

/// acc (tokens x hidden, fp32) = sum of the shared experts on `tokens` rows of x (hidden apart);
/// `inter` holds tokens x shared_ffn of scratch. Enqueued on `s`.
template <ShapeSpec S, class T>
void shared_experts(cudaStream_t s, std::span<ExpertWeights<T> const> shared, T const* x, int tokens, T* inter,
                    float* acc, kernels::cuda::GemmPath path) {
  namespace kc = kernels::cuda;
  auto const h = static_cast<std::size_t>(S.hidden);
  kc::check_cuda(cudaMemsetAsync(acc, 0, static_cast<std::size_t>(tokens) * h * sizeof(float), s),
                 "cudaMemsetAsync (shared experts)");
  for (auto const& e : shared) {
    kc::GroupedGemmArgs<T> up;
    up.uniform_rows = tokens;
    up.a = reinterpret_cast<std::byte const*>(x);
    up.a_stride = h * sizeof(T);
    up.b0 = e.gate;
    up.b1 = e.up;
    up.n = S.shared_ffn;
    up.k = S.hidden;
    up.out = inter;
    up.out_ld = static_cast<std::size_t>(S.shared_ffn);
    up.path = path;
    kc::grouped_gemm<T, kc::Epilogue::swiglu>(s, up);

    kc::GroupedGemmArgs<T> down;
    down.uniform_rows = tokens;
    down.a = reinterpret_cast<std::byte const*>(inter);
    down.a_stride = static_cast<std::size_t>(S.shared_ffn) * sizeof(T);
    down.b0 = e.down;
    down.n = S.hidden;
    down.k = S.shared_ffn;
    down.out_f32 = acc;
    down.out_ld = h;
    down.path = path;
    kc::grouped_gemm<T, kc::Epilogue::accumulate>(s, down);
  }
}

}  // namespace moe::detail
