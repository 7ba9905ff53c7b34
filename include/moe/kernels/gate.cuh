#pragma once
// Gate GEMM and top-k routing on the GPU (nvcc only).
//
//   gate_logits(...)  logits (tokens x experts, fp32) = x (tokens x hidden) * router^T, one cuBLAS
//                     GemmEx call with fp32 accumulation (bf16 or fp32 inputs). Graph-capturable
//                     when the handle has a caller-owned workspace (cublasSetWorkspace).
//   route<S, Router>  one warp per token turns its logits into top_k expert ids and combine weights,
//                     following the host reference (router/router.hpp) step by step: the same
//                     scores, the same group scores, ties to the lower index, experts in order of
//                     decreasing selection score, the same renormalisation and routed scaling. Sums
//                     that the host does left to right are done left to right here too.
//
// The shape is a template argument: the expert count, top-k and group structure are constants.

#include <cublas_v2.h>

#include <type_traits>

#include "moe/core/shape.hpp"
#include "moe/kernels/cuda_common.cuh"
#include "moe/router/router.hpp"

namespace moe::kernels::cuda {

inline void check_cublas(cublasStatus_t s, char const* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail(what, " failed: cuBLAS status ", static_cast<int>(s));
}

/// A cuBLAS handle, owned (destroyed with its owner).
using OwnedCublas = Owned<cublasHandle_t, &cublasDestroy>;

inline OwnedCublas make_cublas() {
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  return OwnedCublas(h);
}

template <class T>
inline constexpr cudaDataType_t cuda_type = std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;

/// logits[t][e] = sum_h x[t][h] * router[e][h] in fp32, for t < tokens (row-major, ld = experts).
/// `workspace` (device, may be null) becomes the handle's workspace after the stream is set
/// (cublasSetStream resets it); with it the call allocates nothing and can be graph-captured.
template <class T>
void gate_logits(cublasHandle_t handle, cudaStream_t stream, void* workspace, std::size_t workspace_bytes, T const* x,
                 int tokens, int hidden, T const* router, int experts, float* logits) {
  if (tokens == 0) return;
  check_cublas(cublasSetStream(handle, stream), "cublasSetStream");
  if (workspace) check_cublas(cublasSetWorkspace(handle, workspace, workspace_bytes), "cublasSetWorkspace");
  float const one = 1.0f, zero = 0.0f;
  // Column-major view: logits^T (experts x tokens) = router (hidden x experts)^T * x^T (hidden x tokens).
  check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, experts, tokens, hidden, &one, router, cuda_type<T>,
                            hidden, x, cuda_type<T>, hidden, &zero, logits, CUDA_R_32F, experts,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (gate logits)");
}

namespace detail {

/// Warp-wide choice of the better (value, index) pair: larger value, ties to the lower index;
/// index -1 means "none".
__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, off);
    int oi = __shfl_xor_sync(0xffffffffu, i, off);
    bool take = oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i));
    if (take) {
      v = ov;
      i = oi;
    }
  }
}

inline constexpr int route_warps = 4;  // tokens per block

// The shape's routing constants are plain template parameters (nvcc cannot name a class-type
// template argument of a kernel in its host stubs); route<S, Router>() below unpacks the ShapeSpec.
template <int E, int K, int G, int GroupsPerToken, GroupScore Score, bool Sigmoid, bool Renormalize>
__global__ void __launch_bounds__(32 * route_warps)
    route_kernel(float const* __restrict__ logits, float const* __restrict__ bias, int tokens, int* __restrict__ ids,
                 float* __restrict__ weights, float routed_scale) {
  constexpr int per_group = E / G;
  constexpr bool sigmoid = Sigmoid;
  __shared__ float score_s[route_warps][E];      // probability (softmax) or sigmoid score
  __shared__ float select_s[route_warps][E];     // selection value (score + bias for sigmoid)
  __shared__ unsigned char allow_s[route_warps][E];
  __shared__ int chosen_s[route_warps][K];

  int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  int t = static_cast<int>(blockIdx.x) * route_warps + warp;
  if (t >= tokens) return;  // whole warps leave together
  float* score = score_s[warp];
  float* select = select_s[warp];
  unsigned char* allow = allow_s[warp];
  float const* row = logits + static_cast<std::size_t>(t) * E;

  if constexpr (sigmoid) {
    for (int i = lane; i < E; i += 32) {
      float s = 1.0f / (1.0f + expf(-row[i]));
      score[i] = s;
      select[i] = s + (bias ? bias[i] : 0.0f);
      allow[i] = 1;
    }
    __syncwarp();
  } else {
    // Softmax as the host does it: max, exp(l - max), a left-to-right sum, one division each.
    float m = -INFINITY;
    for (int i = lane; i < E; i += 32) m = fmaxf(m, row[i]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    for (int i = lane; i < E; i += 32) score[i] = expf(row[i] - m);
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0)
      for (int i = 0; i < E; ++i) sum += score[i];
    sum = __shfl_sync(0xffffffffu, sum, 0);
    __syncwarp();
    for (int i = lane; i < E; i += 32) {
      float p = score[i] / sum;
      score[i] = p;
      select[i] = p;
      allow[i] = 1;
    }
    __syncwarp();
  }

  if constexpr (G > 1) {
    // Group scores (one lane per group, the host's loop), then the best groups on lane 0.
    __shared__ float group_s[route_warps][G];
    // The groups lane 0 has taken: in shared memory, since it indexes them by a group found at run
    // time (a local array would live in local memory, per-thread DRAM behind L1).
    __shared__ bool group_ok_s[route_warps][G];
    for (int g = lane; g < G; g += 32) {
      float const* first = select + g * per_group;
      float gs;
      if constexpr (Score == GroupScore::sum_top2) {
        float a = -INFINITY, b = -INFINITY;
        for (int i = 0; i < per_group; ++i) {
          float v = first[i];
          if (v > a) {
            b = a;
            a = v;
          } else if (v > b) {
            b = v;
          }
        }
        gs = a + b;
      } else {
        gs = first[0];
        for (int i = 1; i < per_group; ++i) gs = first[i] > gs ? first[i] : gs;
      }
      group_s[warp][g] = gs;
    }
    __syncwarp();
    if (lane == 0) {
      bool* group_ok = group_ok_s[warp];
      for (int g = 0; g < G; ++g) group_ok[g] = false;
      for (int j = 0; j < GroupsPerToken; ++j) {
        int best = -1;
        for (int g = 0; g < G; ++g) {
          if (group_ok[g]) continue;
          if (best < 0 || group_s[warp][g] > group_s[warp][best]) best = g;
        }
        group_ok[best] = true;
      }
      for (int g = 0; g < G; ++g)
        if (!group_ok[g])
          for (int i = 0; i < per_group; ++i) allow[g * per_group + i] = 0;
    }
    __syncwarp();
  }

  // Top-k: k rounds of a warp-wide arg-max over the allowed, not yet chosen experts.
  for (int j = 0; j < K; ++j) {
    float v = -INFINITY;
    int idx = -1;
    for (int i = lane; i < E; i += 32) {
      if (!allow[i]) continue;
      if (idx < 0 || select[i] > v) {
        v = select[i];
        idx = i;
      }
    }
    warp_best(v, idx);
    if (lane == 0) {
      chosen_s[warp][j] = idx;
      if (idx >= 0) allow[idx] = 0;
    }
    __syncwarp();
  }

  if (lane == 0) {
    float w[K];
    for (int j = 0; j < K; ++j) {
      int e = chosen_s[warp][j];
      w[j] = e >= 0 ? score[e] : 0.0f;
    }
    if constexpr (Renormalize) {
      float sum = 0.0f;
      for (int j = 0; j < K; ++j) sum += w[j];
      for (int j = 0; j < K; ++j) w[j] /= sum;
    }
    for (int j = 0; j < K; ++j) {
      ids[static_cast<std::size_t>(t) * K + j] = chosen_s[warp][j];
      weights[static_cast<std::size_t>(t) * K + j] = w[j] * routed_scale;
    }
  }
}

}  // namespace detail

/// The device form of a router policy (the device paths of moe::Layer take any router that has
/// one). Specialise it for your own router::Policy R:
///
///   template <> struct moe::kernels::cuda::DeviceRouter<R> {
///     template <ShapeSpec S>
///     static void route(cudaStream_t stream, float const* logits, float const* bias, int tokens,
///                       int* ids, float* weights);   // enqueue only
///   };
///
/// It turns `tokens` rows of fp32 logits (tokens x S.experts, device) into expert ids and combine
/// weights (tokens x S.top_k, device) as R::route does on the host; `bias` is the per-expert
/// correction bias (device, may be null). The three routers of router/router.hpp have one (below).
template <class Router>
struct DeviceRouter;

namespace detail {
/// The warp-per-token kernel of the built-in routers.
template <ShapeSpec S, bool Sigmoid>
void route_builtin(cudaStream_t stream, float const* logits, float const* bias, int tokens, int* ids, float* weights) {
  static_assert(S.experts * (2 * sizeof(float) + 1) * route_warps <= 40 * 1024,
                "route: too many experts for the per-warp shared-memory score buffers");
  if (tokens == 0) return;
  auto blocks = static_cast<unsigned>(blocks_for(tokens, route_warps));
  launch(route_kernel<S.experts, S.top_k, S.groups, S.groups_per_token, S.group_score, Sigmoid, S.renormalize>, blocks,
         32 * route_warps, 0, stream, logits, bias, tokens, ids, weights, S.routed_scale);
  check_launch("route_kernel");
}
}  // namespace detail

template <>
struct DeviceRouter<router::SoftmaxTopK> {
  template <ShapeSpec S>
  static void route(cudaStream_t s, float const* logits, float const* bias, int tokens, int* ids, float* weights) {
    detail::route_builtin<S, false>(s, logits, bias, tokens, ids, weights);
  }
};
template <>
struct DeviceRouter<router::GroupLimitedTopK> : DeviceRouter<router::SoftmaxTopK> {};
template <>
struct DeviceRouter<router::SigmoidGroupTopK> {
  template <ShapeSpec S>
  static void route(cudaStream_t s, float const* logits, float const* bias, int tokens, int* ids, float* weights) {
    detail::route_builtin<S, true>(s, logits, bias, tokens, ids, weights);
  }
};

/// A router policy the device paths can run on shape S: a router::Policy with a DeviceRouter form.
template <class R, ShapeSpec S>
concept DeviceRouterPolicy = router::Policy<R> && requires(cudaStream_t s, float const* f, int* i, float* w) {
  DeviceRouter<R>::template route<S>(s, f, f, 0, i, w);
};

/// Routes `tokens` rows of fp32 logits (tokens x S.experts) into ids and weights (tokens x S.top_k)
/// with the router's device form. `bias` is the per-expert correction bias of sigmoid routers
/// (device memory, may be null).
template <ShapeSpec S, class Router>
void route(cudaStream_t stream, float const* logits, float const* bias, int tokens, int* ids, float* weights) {
  static_assert(router::Policy<Router>, "route: Router must be a router policy");
  static_assert(Router::fits(S), "route: this Router does not fit the shape's scoring and grouping");
  static_assert(DeviceRouterPolicy<Router, S>,
                "route: this router has no device form; specialise moe::kernels::cuda::DeviceRouter<Router> "
                "(moe/kernels/gate.cuh)");
  DeviceRouter<Router>::template route<S>(stream, logits, bias, tokens, ids, weights);
}

}  // namespace moe::kernels::cuda
