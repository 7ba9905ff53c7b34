#pragma once
// moe-emu cuBLAS shim: handles, streams, workspaces, cublasGemmEx and cublasGemmStridedBatchedEx
// with cuBLAS's contract (column-major operands, op(A) m x k, op(B) k x n, C m x n; leading
// dimensions at least the stored rows; matching data types; fp32 compute; host pointer mode).
// A violated rule returns the status cuBLAS documents, with a message naming the argument.
// Products are accumulated in fp32 in k order (tensor cores may sum in another order).

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "cuda_bf16.h"
#include "emu/runtime.hpp"

enum cublasStatus_t : int {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t : int { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cudaDataType_t : int { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
using cudaDataType = cudaDataType_t;
enum cublasComputeType_t : int {
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
};
enum cublasGemmAlgo_t : int { CUBLAS_GEMM_DEFAULT = -1, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 };
enum cublasMath_t : int { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 };

struct cublasContext {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  int device = 0;
};
using cublasHandle_t = cublasContext*;

namespace emu::blas {

inline cublasStatus_t bad(cublasStatus_t s, std::string const& msg) {
  ::emu::diagnose(msg);
  return s;
}

/// The live handles: a destroyed (or never created) handle is CUBLAS_STATUS_NOT_INITIALIZED,
/// never a read of freed memory.
struct Registry {
  std::mutex m;
  std::set<cublasContext const*> live;
};
inline Registry& registry() {
  static Registry r;
  return r;
}
/// cuBLAS handles created and not destroyed.
inline std::size_t live_handles() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.m);
  return r.live.size();
}
inline bool live(cublasContext const* h) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.m);
  return h && r.live.count(h) != 0;
}
/// A scale factor read through a pointer in pointer mode host: device memory there is a host read
/// of a device address on a GPU (a crash), so it is refused.
inline bool host_scalar(void const* p) {
  ::emu::Allocation a;
  return !(::emu::find_allocation(p, sizeof(float), &a) && a.device >= 0);
}
/// The input rounding the reduced-precision compute types allow (tensor cores convert fp32 inputs
/// to bf16 or tf32 before the products; round to nearest even here).
inline float round_mantissa(float v, int drop_bits) {
  unsigned u = std::bit_cast<unsigned>(v);
  if ((u & 0x7f800000u) == 0x7f800000u) return v;  // inf, NaN
  unsigned const half = 1u << (drop_bits - 1), keep = ~((1u << drop_bits) - 1u);
  u = (u + half - 1u + ((u >> drop_bits) & 1u)) & keep;
  return std::bit_cast<float>(u);
}
inline int elem_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
inline float load(void const* p, cudaDataType_t t, std::size_t i) {
  if (t == CUDA_R_32F) return static_cast<float const*>(p)[i];
  return __bfloat162float(static_cast<__nv_bfloat16 const*>(p)[i]);
}
inline void store(void* p, cudaDataType_t t, std::size_t i, float v) {
  if (t == CUDA_R_32F)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
}

/// Checks and enqueues one strided batch. `api` names the call in messages.
inline cublasStatus_t gemm(char const* api, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                           int k, void const* alpha, void const* A, cudaDataType_t at, int lda, long long sa,
                           void const* B, cudaDataType_t bt, int ldb, long long sb, void const* beta, void* C,
                           cudaDataType_t ct, int ldc, long long sc, int batch, cublasComputeType_t compute) {
  std::string const who(api);
  if (!live(h)) return bad(CUBLAS_STATUS_NOT_INITIALIZED, who + ": the handle is not initialised (cublasCreate) or destroyed");
  if (::emu::current_device() != h->device)
    return bad(CUBLAS_STATUS_INVALID_VALUE, who + ": the handle belongs to device " + std::to_string(h->device) +
                                                " but device " + std::to_string(::emu::current_device()) +
                                                " is current (a cuBLAS context stays on the device it was created on)");
  if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
    return bad(CUBLAS_STATUS_INVALID_VALUE, who + ": transa/transb must be CUBLAS_OP_N or CUBLAS_OP_T for real types");
  if (m < 0 || n < 0 || k < 0 || batch < 0)
    return bad(CUBLAS_STATUS_INVALID_VALUE, who + ": negative m, n, k or batchCount");
  int const a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
  int const b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
  if (lda < std::max(1, a_rows))
    return bad(CUBLAS_STATUS_INVALID_VALUE, who + ": lda = " + std::to_string(lda) + " < max(1, " +
                                                std::to_string(a_rows) + ") (rows of A as stored, transa " +
                                                (ta == CUBLAS_OP_N ? "N" : "T") + ")");
  if (ldb < std::max(1, b_rows))
    return bad(CUBLAS_STATUS_INVALID_VALUE, who + ": ldb = " + std::to_string(ldb) + " < max(1, " +
                                                std::to_string(b_rows) + ") (rows of B as stored)");
  if (ldc < std::max(1, m))
    return bad(CUBLAS_STATUS_INVALID_VALUE, who + ": ldc = " + std::to_string(ldc) + " < max(1, m = " + std::to_string(m) + ")");
  // The cublasGemmEx type table, for the real types modelled: CUBLAS_COMPUTE_32F takes A = B =
  // 16BF with C 16BF or 32F, or A = B = C = 32F; the _FAST_ compute types take 32F operands only.
  auto known = [](cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF; };
  if (compute == CUBLAS_COMPUTE_32F) {
    if (!known(at) || !known(bt) || !known(ct) || at != bt || (at == CUDA_R_32F && ct != CUDA_R_32F))
      return bad(CUBLAS_STATUS_NOT_SUPPORTED, who + ": unsupported data types for CUBLAS_COMPUTE_32F (Atype " +
                                                  std::to_string(at) + ", Btype " + std::to_string(bt) + ", Ctype " +
                                                  std::to_string(ct) + "; A = B = 16BF with C 16BF or 32F, or all 32F)");
  } else if (compute == CUBLAS_COMPUTE_32F_FAST_16BF || compute == CUBLAS_COMPUTE_32F_FAST_TF32) {
    if (at != CUDA_R_32F || bt != CUDA_R_32F || ct != CUDA_R_32F)
      return bad(CUBLAS_STATUS_NOT_SUPPORTED, who + ": compute type " + std::to_string(compute) +
                                                  " takes CUDA_R_32F A, B and C only");
  } else {
    return bad(CUBLAS_STATUS_NOT_SUPPORTED, who + ": compute type " + std::to_string(compute) + " is not modelled");
  }
  if (!alpha || !beta) return bad(CUBLAS_STATUS_INVALID_VALUE, who + ": alpha and beta must not be null");
  if (!host_scalar(alpha) || !host_scalar(beta))
    return bad(CUBLAS_STATUS_INVALID_VALUE, who + ": alpha or beta points to device memory, but the pointer mode is "
                                                  "CUBLAS_POINTER_MODE_HOST (host memory)");
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  auto span = [](int rows, int cols, int ld, long long stride, int count) {
    return (static_cast<std::size_t>(cols - 1) * static_cast<std::size_t>(ld) + static_cast<std::size_t>(rows)) +
           static_cast<std::size_t>(count - 1) * static_cast<std::size_t>(stride);
  };
  if (k > 0) {
    if (!::emu::is_device_range(A, span(a_rows, a_cols, lda, sa, batch) * static_cast<std::size_t>(elem_bytes(at))))
      return bad(CUBLAS_STATUS_INVALID_VALUE, who + ": A is not inside one device allocation (lda " + std::to_string(lda) + ")");
    if (!::emu::is_device_range(B, span(b_rows, b_cols, ldb, sb, batch) * static_cast<std::size_t>(elem_bytes(bt))))
      return bad(CUBLAS_STATUS_INVALID_VALUE, who + ": B is not inside one device allocation (ldb " + std::to_string(ldb) + ")");
  }
  if (!::emu::is_device_range(C, span(m, n, ldc, sc, batch) * static_cast<std::size_t>(elem_bytes(ct))))
    return bad(CUBLAS_STATUS_INVALID_VALUE, who + ": C is not inside one device allocation (ldc " + std::to_string(ldc) + ")");
  if (::emu::stream_device(h->stream) != h->device)
    return bad(CUBLAS_STATUS_INVALID_VALUE, who + ": the handle's stream belongs to another device");
  void* const ws = h->workspace;
  std::size_t const ws_bytes = h->workspace_bytes;
  if (ws && !::emu::is_device_range(ws, ws_bytes))
    return bad(CUBLAS_STATUS_INVALID_VALUE, who + ": the handle's workspace (cublasSetWorkspace, " +
                                                std::to_string(ws_bytes) + " bytes) is no longer device memory (freed?)");
  int const drop = compute == CUBLAS_COMPUTE_32F_FAST_16BF ? 16 : compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? 13 : 0;
  float const al = *static_cast<float const*>(alpha), be = *static_cast<float const*>(beta);
  int r = ::emu::enqueue(h->stream, api, [=] {
    // The library owns its workspace during the call (split-k partials and the like): scribble
    // over it so that a workspace shared with concurrent work shows up (a race for TSan, or a
    // clobbered buffer). Bounded so that a large workspace costs little.
    if (ws) std::memset(ws, 0x5a, std::min<std::size_t>(ws_bytes, std::size_t{1} << 20));
    auto in = [drop](float v) { return drop ? round_mantissa(v, drop) : v; };
    for (int q = 0; q < batch; ++q) {
      std::size_t const oa = static_cast<std::size_t>(q) * static_cast<std::size_t>(sa);
      std::size_t const ob = static_cast<std::size_t>(q) * static_cast<std::size_t>(sb);
      std::size_t const oc = static_cast<std::size_t>(q) * static_cast<std::size_t>(sc);
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
          float acc = 0.0f;
          for (int p = 0; p < k; ++p) {
            std::size_t ia = ta == CUBLAS_OP_N ? static_cast<std::size_t>(p) * lda + i : static_cast<std::size_t>(i) * lda + p;
            std::size_t ib = tb == CUBLAS_OP_N ? static_cast<std::size_t>(j) * ldb + p : static_cast<std::size_t>(p) * ldb + j;
            acc += in(load(A, at, oa + ia)) * in(load(B, bt, ob + ib));
          }
          std::size_t ic = oc + static_cast<std::size_t>(j) * ldc + i;
          float v = al * acc;
          if (be != 0.0f) v += be * load(C, ct, ic);  // beta = 0: C is not read (may hold NaN)
          store(C, ct, ic, v);
        }
    }
  });
  return r == cudaSuccess ? CUBLAS_STATUS_SUCCESS : bad(CUBLAS_STATUS_EXECUTION_FAILED, who + ": enqueue failed");
}

}  // namespace emu::blas

inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  if (::emu::injected_failure("cublasCreate")) return CUBLAS_STATUS_ALLOC_FAILED;
  *h = new cublasContext();
  (*h)->device = ::emu::current_device();
  auto& r = ::emu::blas::registry();
  std::lock_guard<std::mutex> lock(r.m);
  r.live.insert(*h);
  return CUBLAS_STATUS_SUCCESS;
}
/// Synchronises the device, as cuBLAS documents (queued GEMMs hold the handle's settings by value).
inline cublasStatus_t cublasDestroy(cublasHandle_t h) {
  {
    auto& r = ::emu::blas::registry();
    std::lock_guard<std::mutex> lock(r.m);
    if (!h || r.live.erase(h) == 0)
      return ::emu::blas::bad(CUBLAS_STATUS_NOT_INITIALIZED, "cublasDestroy: the handle is not initialised or already destroyed");
  }
  cudaDeviceSynchronize();
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
/// Also resets the user workspace, as cuBLAS does.
inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  if (!::emu::blas::live(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  h->workspace = nullptr;
  h->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t* s) {
  if (!::emu::blas::live(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  *s = h->stream;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void* ws, std::size_t bytes) {
  if (!::emu::blas::live(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes > 0 && !::emu::is_device_range(ws, bytes))
    return ::emu::blas::bad(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace: " + std::to_string(bytes) +
                                                             " bytes at the pointer are not device memory");
  if (reinterpret_cast<std::uintptr_t>(ws) % 256 != 0)
    return ::emu::blas::bad(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace: the workspace must be 256-byte aligned");
  h->workspace = ws;
  h->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t) {
  return ::emu::blas::live(h) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   void const* alpha, void const* A, cudaDataType_t at, int lda, void const* B,
                                   cudaDataType_t bt, int ldb, void const* beta, void* C, cudaDataType_t ct, int ldc,
                                   cublasComputeType_t compute, cublasGemmAlgo_t) {
  return ::emu::blas::gemm("cublasGemmEx", h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0,
                           1, compute);
}
inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                                 int n, int k, void const* alpha, void const* A, cudaDataType_t at,
                                                 int lda, long long sa, void const* B, cudaDataType_t bt, int ldb,
                                                 long long sb, void const* beta, void* C, cudaDataType_t ct, int ldc,
                                                 long long sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t) {
  return ::emu::blas::gemm("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb,
                           beta, C, ct, ldc, sc, batch, compute);
}
