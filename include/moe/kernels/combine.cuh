#pragma once
// Weighted combine and un-permute on the GPU (nvcc only).
//
//   combine_records  one block per received record: the weighted sum of its experts' outputs (fp32,
//                    slots in record order), rounded to storage precision: the partial sent back
//   finish_tokens    one block per local token: the shared experts' fp32 sum (or zero), then the
//                    partials returned for the token, in destination order (the host Layer's order),
//                    rounded to storage precision into y
//
// Both move whole hidden vectors with 16-byte loads and stores; hidden must be a multiple of
// 16 / sizeof(T).

#include "moe/kernels/cuda_common.cuh"
#include "moe/kernels/dispatch.cuh"
#include "moe/kernels/records.hpp"

namespace moe::kernels::cuda {

namespace detail {

template <class T, int K>
__global__ void combine_records_kernel(std::byte const* __restrict__ recv, std::size_t record_bytes, long long slots,
                                       long long const* __restrict__ recv_base, int const* __restrict__ recv_n,
                                       int ranks, int experts, unsigned char const* __restrict__ served,
                                       int max_count, T const* __restrict__ expert_out,
                                       int const* __restrict__ position, int hidden, T* __restrict__ back) {
  constexpr int V = vec_elems<T>;
  long long r = blockIdx.x;
  if (r >= slots || !slot_valid(r, recv_base, recv_n, ranks)) return;
  std::byte const* rec = recv + static_cast<std::size_t>(r) * record_bytes;
  int count = moe::detail::record_header(rec)->count;
  if (count < 0 || count > max_count) count = 0;  // reported by sort_items; the partial is zero
  // Per slot: the expert-output row to add (or -1) and its weight. Indexed only by unrolled
  // constants, so both arrays stay in registers.
  int row[K];
  float w[K];
#pragma unroll
  for (int i = 0; i < K; ++i) {
    row[i] = -1;
    w[i] = 0.0f;
    if (i < count) {
      int e = moe::detail::record_experts(rec)[i];
      if (e >= 0 && e < experts && served[e]) {
        row[i] = position[r * K + i];
        w[i] = moe::detail::record_weights(rec, K)[i];
      }
    }
  }
  int vecs = hidden / V;
  auto* dst = reinterpret_cast<uint4*>(back + static_cast<std::size_t>(r) * hidden);
  for (int q = static_cast<int>(threadIdx.x); q < vecs; q += static_cast<int>(blockDim.x)) {
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = 0.0f;
#pragma unroll
    for (int i = 0; i < K; ++i) {
      if (row[i] < 0) continue;
      float o[V];
      unpack<T>(reinterpret_cast<uint4 const*>(expert_out + static_cast<std::size_t>(row[i]) * hidden)[q], o);
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] += w[i] * o[v];
    }
    dst[q] = pack<T>(acc);
  }
}

template <class T>
__global__ void finish_tokens_kernel(int tokens, int hidden, int ranks, int const* __restrict__ rec_count,
                                     int const* __restrict__ rec_pos, long long const* __restrict__ send_base,
                                     T const* __restrict__ returned, float const* __restrict__ shared_acc,
                                     T* __restrict__ y) {
  constexpr int V = vec_elems<T>;
  int t = static_cast<int>(blockIdx.x);
  int vecs = hidden / V;
  for (int q = static_cast<int>(threadIdx.x); q < vecs; q += static_cast<int>(blockDim.x)) {
    float acc[V];
    if (shared_acc) {
      auto const* s = reinterpret_cast<float4 const*>(shared_acc + static_cast<std::size_t>(t) * hidden + q * V);
#pragma unroll
      for (int v = 0; v < V / 4; ++v) {
        float4 f = s[v];
        acc[4 * v] = f.x;
        acc[4 * v + 1] = f.y;
        acc[4 * v + 2] = f.z;
        acc[4 * v + 3] = f.w;
      }
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] = 0.0f;
    }
    for (int d = 0; d < ranks; ++d) {
      std::size_t row0 = static_cast<std::size_t>(d) * tokens;
      int n = rec_count[row0 + t];
      long long rec = send_base[d] + (rec_pos[row0 + t] - rec_pos[row0]);
      for (int l = 0; l < n; ++l) {
        float o[V];
        unpack<T>(reinterpret_cast<uint4 const*>(returned + static_cast<std::size_t>(rec + l) * hidden)[q], o);
#pragma unroll
        for (int v = 0; v < V; ++v) acc[v] += o[v];
      }
    }
    reinterpret_cast<uint4*>(y + static_cast<std::size_t>(t) * hidden)[q] = pack<T>(acc);
  }
}

}  // namespace detail

/// back[r] = sum_i weight_i * expert_out[position[r*K+i]] for every valid received record slot r.
/// `max_count`: as in group_by_expert (the same value: records it rejected contribute nothing).
template <class T, int K>
void combine_records(cudaStream_t s, std::byte const* recv, std::size_t record_bytes, long long slots,
                     long long const* recv_base, int const* recv_n, int ranks, int experts, unsigned char const* served,
                     T const* expert_out, int const* position, int hidden, T* back, int max_count = K) {
  if (slots == 0) return;
  check(max_count >= 1 && max_count <= K, "combine_records: max_count = ", max_count, " outside [1, ", K, "]");
  launch(detail::combine_records_kernel<T, K>, static_cast<unsigned>(slots), 128, 0, s, recv, record_bytes, slots,
         recv_base, recv_n, ranks, experts, served, max_count, expert_out, position, hidden, back);
  check_launch("combine_records_kernel");
}

/// y[t] = shared_acc[t] (or 0) + the returned partials of token t, destinations ascending.
template <class T>
void finish_tokens(cudaStream_t s, int tokens, int hidden, int ranks, int const* rec_count, int const* rec_pos,
                   long long const* send_base, T const* returned, float const* shared_acc, T* y) {
  if (tokens == 0) return;
  launch(detail::finish_tokens_kernel<T>, static_cast<unsigned>(tokens), 128, 0, s, tokens, hidden, ranks, rec_count,
         rec_pos, send_base, returned, shared_acc, y);
  check_launch("finish_tokens_kernel");
}

}  // namespace moe::kernels::cuda
