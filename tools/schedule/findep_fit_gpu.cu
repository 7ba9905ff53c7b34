// Measures the FinDEP operations on one GPU, fits the alpha-beta performance models by least
// squares (perf_model.hpp) and writes a model file (format in docs/findep.md).
//
//   findep_fit_gpu [--out findep_gpu_models.tsv] [--samples samples.tsv] [--reps N] [--spin-us U]
//                  [--link memcpy|nccl] [--device D]
//   findep_fit_gpu --list      the sweep (calls, work, memory) without touching the GPU
//
// Exit status: 0 when all six models reach R^2 >= 0.99, 1 when one does not or on any error (no
// GPU, not enough memory, a CUDA / cuBLAS / NCCL failure), 2 on a bad command line.
//
// What each operation runs (bf16 storage, fp32 accumulation; sizes from gpu_sweep.hpp, which spans
// the solver's range for DeepSeek-V2 and Qwen3-235B at seq 1k-8k; the points of both shapes are
// fitted together):
//   gemm       one attention projection: cublasGemmEx, (T x h) times (h x h), work 2 T h^2 flop.
//   attention  the core of attention for m_a samples of seq tokens, heads of 128: per (sample,
//              head) S = Q K^T / sqrt(128) (cublasGemmStridedBatchedEx), a row softmax of S in place
//              (the kernel below, bf16 probabilities), O = P V (strided batched again). No causal
//              mask, no projections (they are `gemm`), scores materialised in HBM (not a fused
//              FlashAttention kernel, so this is slower than FA3 would be). Q, K, V, O in
//              [sample][head][seq][128] layout. Work 4 m_a seq^2 h flop.
//   shared     the library's shared-expert path, moe::detail::shared_experts of
//              layer/expert_ffn.cuh (the call of FinDepCudaExecutor's S task): fp32 accumulator clear, then per shared expert
//              a grouped_gemm with the SwiGLU epilogue and one with the accumulate epilogue.
//              DeepSeek-V2 only (Qwen3-235B has no shared experts). Work 6 T h f_s n_s flop.
//   experts    the routed-expert GEMMs of the EG's E task (RoutedExperts in layer/expert_ffn.cuh): one
//              grouped_gemm with the SwiGLU epilogue (gate and up) over the local experts, the rows
//              gathered through an index from the token rows (index / top_k), then one grouped_gemm
//              (down) with the store epilogue. Local experts = experts / 4 (the 4/4 split), rows
//              assigned balanced (gpu_sweep.hpp). Not included: group_by_expert and the weighted
//              combine of the E task (separate kernels). Work 6 rows h f flop.
//   a2e, e2a   the co-located link of FinDepCudaExecutor: one device-to-device cudaMemcpyAsync
//              (a2e: buffer X -> Y, e2a: Y -> X). This is the GPU's memory bandwidth, not a network.
//              With NCCL (built with moe::nccl), also ncclSend + ncclRecv to itself on a one-rank
//              communicator in one group (NCCL's all-to-all pattern includes the own rank); printed
//              as extra rows, written to the model file with --link nccl. Work = bytes.
//
// Timing: one stream, cudaEvent pairs around each call. Before each call a spin kernel holds the
// stream for --spin-us (default 500 us) so that the host has enqueued every launch of the call
// before the GPU reaches it: the time is the GPU's, without host launch gaps (the executor enqueues
// ahead too), but with the gaps between the call's kernels on the device. Every point runs twice
// as warm-up (lazy module loading, cuBLAS heuristics, NCCL set-up), then --reps rounds (default 9)
// over all points of all operations in a freshly shuffled order each round (seeded), so slow drifts
// (clocks, temperature) spread over all sizes instead of biasing one operation or one size.
// Each point keeps the MEDIAN of its rounds, not the best: a dedicated GPU has little of the
// interference the host benchmark removes with its minimum, while boost clocks make the fastest
// round optimistic; the median is the sustained time a long pipeline sees and is robust to a
// stray slow round on either side.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#if defined(MOE_FIT_GPU_NCCL)
#include <nccl.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "moe_tools/cli.hpp"
#include "moe_tools/gpu_sweep.hpp"
#include "moe/kernels/cuda_common.cuh"
#include "moe/kernels/gate.cuh"
#include "moe/kernels/grouped_gemm.cuh"
#include "moe/layer/findep_cuda_executor.cuh"
#include "moe/schedule/perf_model.hpp"

namespace kc = moe::kernels::cuda;
namespace fg = findep_gpu;
using moe::bf16;
using namespace moe::schedule;

static_assert(fg::tile_m == kc::grouped_gemm_tile_m, "gpu_sweep.hpp: tile_m must match the grouped GEMM's row tile");

namespace {

// ------------------------------------------------------------------------------------------------
// Kernels of the benchmark itself.
// ------------------------------------------------------------------------------------------------

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Holds the stream for `ns` nanoseconds (one thread).
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long t0 = global_ns();
  while (global_ns() - t0 < ns) {
  }
}

/// Deterministic pseudo-random bf16 values in [-scale, scale) (a hash of the index and the seed).
__global__ void fill_kernel(bf16* p, std::size_t n, unsigned seed, float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    unsigned x = (static_cast<unsigned>(i) * 2654435761u) ^ static_cast<unsigned>(i >> 32) ^ (seed * 0x9e3779b9u);
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    float u = static_cast<float>(x >> 8) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = kc::store_as<bf16>((2.0f * u - 1.0f) * scale);
  }
}

inline constexpr int softmax_threads = 256;
inline constexpr int softmax_max_per_thread = fg::max_softmax_row / softmax_threads;

__device__ __forceinline__ float block_reduce(float v, bool is_max, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  int const warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < softmax_threads / 32 ? red[lane] : (is_max ? -INFINITY : 0.0f);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      float o = __shfl_xor_sync(0xffffffffu, v, off);
      v = is_max ? fmaxf(v, o) : v + o;
    }
    if (lane == 0) red[0] = v;
  }
  __syncthreads();
  float r = red[0];
  __syncthreads();  // red is reused by the next reduction
  return r;
}

/// In-place softmax of `rows` rows of n <= PER * softmax_threads bf16 values (one block per row;
/// the row lives in registers: one read, one write). PER is the launch's smallest power of two
/// that holds the row (softmax_rows): a kernel sized for the longest row would spend the same
/// time on a short row as on a long one, a fixed cost per row that grows with tokens (b s), not
/// with the attention's work (b s^2). The first H200 run showed exactly that: the attention model
/// reached R^2 0.84, seq 1024 ran 4x slower per score than seq 8192 (docs/results/gpu-runs.md).
template <int PER>
__global__ void __launch_bounds__(softmax_threads) softmax_rows_kernel(bf16* s, int n) {
  __shared__ float red[softmax_threads / 32];
  bf16* row = s + static_cast<std::size_t>(blockIdx.x) * static_cast<std::size_t>(n);
  float v[PER];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    int j = static_cast<int>(threadIdx.x) + i * softmax_threads;
    v[i] = j < n ? kc::load_float(row[j]) : -INFINITY;
    m = fmaxf(m, v[i]);
  }
  m = block_reduce(m, true, red);
  float sum = 0;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    int j = static_cast<int>(threadIdx.x) + i * softmax_threads;
    v[i] = j < n ? __expf(v[i] - m) : 0.0f;
    sum += v[i];
  }
  float inv = 1.0f / block_reduce(sum, false, red);
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    int j = static_cast<int>(threadIdx.x) + i * softmax_threads;
    if (j < n) row[j] = kc::store_as<bf16>(v[i] * inv);
  }
}

/// Softmax of `rows` rows of n values each, with the kernel whose registers fit n.
template <int PER = 1>
void softmax_rows(bf16* s, long long rows, int n, cudaStream_t st) {
  static_assert(PER <= softmax_max_per_thread);
  if constexpr (PER < softmax_max_per_thread) {
    if (n > PER * softmax_threads) return softmax_rows<PER * 2>(s, rows, n, st);
  } else {
    moe::check(n <= PER * softmax_threads, "softmax row ", n, " above ", PER * softmax_threads);
  }
  moe::kernels::cuda::launch(softmax_rows_kernel<PER>, static_cast<unsigned>(rows), softmax_threads, 0, st, s, n);
  kc::check_launch("softmax_rows_kernel");
}

// ------------------------------------------------------------------------------------------------
// Host helpers.
// ------------------------------------------------------------------------------------------------

#if defined(MOE_FIT_GPU_NCCL)
void check_nccl(ncclResult_t r, char const* what) {
  if (r != ncclSuccess) moe::fail(what, " failed: ", ncclGetErrorString(r), " (ncclResult ", static_cast<int>(r), ")");
}
#endif

void fill(bf16* p, std::size_t n, unsigned seed, float scale, cudaStream_t s) {
  if (n == 0) return;
  moe::kernels::cuda::launch(fill_kernel, 4096, 256, 0, s, p, n, seed, scale);
  kc::check_launch("fill_kernel");
}

/// One timed call of the sweep.
struct Timed {
  fg::Point point;
  std::string op;  ///< the row it is fitted under: op_name, or "a2e[nccl]" / "e2a[nccl]"
  std::function<void(cudaStream_t)> run;
  std::vector<double> times_us;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Options {
  std::string out = "findep_gpu_models.tsv";
  std::string samples;
  int reps = 9;
  double spin_us = 500;
  std::string link = "memcpy";
  int device = 0;
  bool list = false;
};

int usage() {
  std::cerr << "usage: findep_fit_gpu [--out findep_gpu_models.tsv] [--samples samples.tsv] [--reps N] [--spin-us U]\n"
               "                      [--link memcpy|nccl] [--device D]\n"
               "       findep_fit_gpu --list\n";
  return 2;
}

/// --list: the sweep as the program would run it; needs no GPU.
int list_sweep() {
  std::vector<fg::Point> points = fg::sweep();
  std::printf("op\tshape\ttokens\tsamples\tseq\twork\n");
  for (fg::Point const& p : points)
    std::printf("%s\t%s\t%lld\t%d\t%d\t%.6g\n", std::string(op_name(p.op)).c_str(),
                std::string(fg::shapes[static_cast<std::size_t>(p.shape)].name).c_str(), p.tokens, p.samples, p.seq,
                p.work);
  std::printf("# %zu calls (plus a2e[nccl] / e2a[nccl] with NCCL); device buffers %.2f GiB\n", points.size(),
              static_cast<double>(fg::buffer_sizes(points).total_bytes()) / (1 << 30));
  return 0;
}

int run(Options const& opt) {
  if (opt.list) return list_sweep();
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "findep_fit_gpu: no usable CUDA device (%s); nothing measured, no model file written\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "device count 0");
    return 1;
  }
  moe::check(opt.device >= 0 && opt.device < devices, "--device ", opt.device, " but ", devices,
             " device(s) present");
  kc::check_cuda(cudaSetDevice(opt.device), "cudaSetDevice");
  cudaDeviceProp prop{};
  kc::check_cuda(cudaGetDeviceProperties(&prop, opt.device), "cudaGetDeviceProperties");
#if !defined(MOE_FIT_GPU_NCCL)
  moe::check(opt.link == "memcpy", "--link nccl needs a build with NCCL (moe::nccl target)");
#endif

  std::vector<fg::Point> points = fg::sweep();
  fg::BufferSizes sz = fg::buffer_sizes(points);
  std::size_t free_b = 0, total_b = 0;
  kc::check_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  std::size_t need = sz.total_bytes() + (std::size_t{1} << 30);  // + 1 GiB for cuBLAS, NCCL, index tables
  std::printf("# device %d: %s, %.1f GiB (%.1f free); the sweep needs %.1f GiB\n", opt.device, prop.name,
              static_cast<double>(total_b) / (1 << 30), static_cast<double>(free_b) / (1 << 30),
              static_cast<double>(need) / (1 << 30));
  moe::check(need <= free_b, "the sweep needs ", need >> 20, " MiB of device memory, ", free_b >> 20,
             " MiB are free");

  cudaStream_t stream = nullptr;
  kc::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cublasHandle_t cublas = nullptr;
  kc::check_cublas(cublasCreate(&cublas), "cublasCreate");
  std::size_t const cublas_ws_bytes = std::size_t{64} << 20;
  kc::DeviceArray<std::byte> cublas_ws(cublas_ws_bytes);
  kc::check_cublas(cublasSetStream(cublas, stream), "cublasSetStream");  // resets the workspace: set it after
  kc::check_cublas(cublasSetWorkspace(cublas, cublas_ws.get(), cublas_ws_bytes), "cublasSetWorkspace");

  // Buffers (gpu_sweep.hpp sizes them for the largest point of each operation).
  kc::DeviceArray<bf16> gemm_a(sz.gemm_act), gemm_c(sz.gemm_act);
  kc::DeviceArray<bf16> q(sz.attn_act), k(sz.attn_act), v(sz.attn_act), o(sz.attn_act), scores(sz.attn_scores);
  kc::DeviceArray<bf16> shared_x(sz.shared_x), shared_inter(sz.shared_inter);
  kc::DeviceArray<float> shared_acc(sz.shared_acc);
  kc::DeviceArray<bf16> expert_src(sz.expert_src), expert_inter(sz.expert_inter), expert_out(sz.expert_out);
  kc::DeviceArray<std::byte> link_x(sz.link_bytes), link_y(sz.link_bytes);
  std::vector<kc::DeviceArray<bf16>> gemm_w, shared_w, expert_w;
  for (int i = 0; i < fg::shape_count; ++i) {
    auto si = static_cast<std::size_t>(i);
    gemm_w.emplace_back(sz.gemm_w[si]);
    shared_w.emplace_back(sz.shared_w[si]);
    expert_w.emplace_back(sz.expert_w[si]);
  }
  unsigned seed = 1;
  auto fill_all = [&](kc::DeviceArray<bf16>& a, float scale) { fill(a.get(), a.size(), seed++, scale, stream); };
  fill_all(gemm_a, 1.0f);
  fill_all(q, 1.0f);
  fill_all(k, 1.0f);
  fill_all(v, 1.0f);
  fill_all(shared_x, 1.0f);
  fill_all(expert_src, 1.0f);
  fill(reinterpret_cast<bf16*>(link_x.get()), sz.link_bytes / sizeof(bf16), seed++, 1.0f, stream);
  fill(reinterpret_cast<bf16*>(link_y.get()), sz.link_bytes / sizeof(bf16), seed++, 1.0f, stream);
  for (int i = 0; i < fg::shape_count; ++i) {
    float inv_h = 1.0f / std::sqrt(static_cast<float>(fg::shapes[static_cast<std::size_t>(i)].spec.hidden));
    fill_all(gemm_w[static_cast<std::size_t>(i)], inv_h);
    fill_all(shared_w[static_cast<std::size_t>(i)], inv_h);
    fill_all(expert_w[static_cast<std::size_t>(i)], inv_h);
  }

  // Per shape: the shared experts' weight views and the local experts' pointer tables.
  std::vector<std::vector<moe::ExpertWeights<bf16>>> shared_views(fg::shape_count);
  std::vector<kc::DeviceArray<bf16 const*>> gate_tab, up_tab, down_tab;
  for (int i = 0; i < fg::shape_count; ++i) {
    auto si = static_cast<std::size_t>(i);
    moe::ShapeSpec const& s = fg::shapes[si].spec;
    auto h = static_cast<std::size_t>(s.hidden);
    auto sf = static_cast<std::size_t>(s.shared_ffn), f = static_cast<std::size_t>(s.expert_ffn);
    for (int e = 0; e < s.shared_experts; ++e) {
      bf16 const* base = shared_w[si].get() + static_cast<std::size_t>(e) * 3 * sf * h;
      shared_views[si].push_back({base, base + sf * h, base + 2 * sf * h});
    }
    int E = fg::shapes[si].local_experts();
    std::vector<bf16 const*> g(static_cast<std::size_t>(E)), u(g.size()), d(g.size());
    for (std::size_t e = 0; e < g.size(); ++e) {
      bf16 const* base = expert_w[si].get() + e * 3 * f * h;
      g[e] = base;
      u[e] = base + f * h;
      d[e] = base + 2 * f * h;
    }
    gate_tab.emplace_back(g.size());
    gate_tab.back().upload(g.data(), g.size());
    up_tab.emplace_back(u.size());
    up_tab.back().upload(u.data(), u.size());
    down_tab.emplace_back(d.size());
    down_tab.back().upload(d.data(), d.size());
  }

#if defined(MOE_FIT_GPU_NCCL)
  ncclComm_t comm = nullptr;
  bool nccl_ok = true;
  try {
    int dev = opt.device;
    check_nccl(ncclCommInitAll(&comm, 1, &dev), "ncclCommInitAll (one rank)");
    // A trial exchange, so that an NCCL that refuses a send to itself is found here, not mid-sweep.
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    check_nccl(ncclSend(link_x.get(), 4096, ncclUint8, 0, comm, stream), "ncclSend (to itself)");
    check_nccl(ncclRecv(link_y.get(), 4096, ncclUint8, 0, comm, stream), "ncclRecv (from itself)");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    kc::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (NCCL trial)");
  } catch (moe::Error const& err) {
    std::fprintf(stderr, "findep_fit_gpu: NCCL unavailable, link measured with cudaMemcpyAsync only: %s\n", err.what());
    nccl_ok = false;
    moe::check(opt.link == "memcpy", "--link nccl but NCCL could not be set up");
  }
#endif

  // The timed calls.
  std::vector<Timed> calls;
  for (fg::Point const& p : points) {
    auto si = static_cast<std::size_t>(p.shape);
    fg::SweepShape const& sh = fg::shapes[si];
    moe::ShapeSpec const& s = sh.spec;
    int const h = s.hidden;
    std::function<void(cudaStream_t)> fn;
    switch (p.op) {
      case Op::gemm: {
        int T = static_cast<int>(p.tokens);
        bf16 const* w = gemm_w[si].get();
        fn = [=, &gemm_a, &gemm_c](cudaStream_t) {
          float const one = 1.0f, zero = 0.0f;
          // Row-major C (T x h) = A (T x h) W^T, W in Linear layout (h_out x h_in, row-major): in
          // column-major terms C^T (h x T) = W A^T, W being the transposed column-major view of
          // its buffer (op T, ld h) and A^T the plain view of A's (op N, ld h); as gate_logits.
          kc::check_cublas(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, h, T, h, &one, w, CUDA_R_16BF, h,
                                        gemm_a.get(), CUDA_R_16BF, h, &zero, gemm_c.get(), CUDA_R_16BF, h,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                           "cublasGemmEx (projection)");
        };
        break;
      }
      case Op::attention: {
        int const seq = p.seq, dk = fg::head_dim;
        long long const entries = static_cast<long long>(p.samples) * sh.heads();
        long long const chunk = fg::attention_chunk(sh, p.samples, p.seq);
        moe::check(seq <= fg::max_softmax_row, "softmax row ", seq, " above ", fg::max_softmax_row);
        fn = [=, &q, &k, &v, &o, &scores](cudaStream_t st) {
          float const scale = 1.0f / std::sqrt(static_cast<float>(dk)), one = 1.0f, zero = 0.0f;
          long long const qs = static_cast<long long>(seq) * dk, ss = static_cast<long long>(seq) * seq;
          for (long long b0 = 0; b0 < entries; b0 += chunk) {
            int nb = static_cast<int>(std::min(chunk, entries - b0));
            bf16 const* qb = q.get() + b0 * qs;
            bf16 const* kb = k.get() + b0 * qs;
            bf16 const* vb = v.get() + b0 * qs;
            bf16* ob = o.get() + b0 * qs;
            // Row-major S (seq x seq) = Q K^T: column-major S^T = K Q^T, with Q and K viewed
            // column-major as dk x seq (ld dk).
            kc::check_cublas(cublasGemmStridedBatchedEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, seq, seq, dk, &scale, kb,
                                                        CUDA_R_16BF, dk, qs, qb, CUDA_R_16BF, dk, qs, &zero,
                                                        scores.get(), CUDA_R_16BF, seq, ss, nb, CUBLAS_COMPUTE_32F,
                                                        CUBLAS_GEMM_DEFAULT),
                             "cublasGemmStridedBatchedEx (Q K^T)");
            softmax_rows(scores.get(), static_cast<long long>(nb) * seq, seq, st);
            // Row-major O (seq x dk) = P V: column-major O^T (dk x seq) = V^T P^T.
            kc::check_cublas(cublasGemmStridedBatchedEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, dk, seq, seq, &one, vb,
                                                        CUDA_R_16BF, dk, qs, scores.get(), CUDA_R_16BF, seq, ss,
                                                        &zero, ob, CUDA_R_16BF, dk, qs, nb, CUBLAS_COMPUTE_32F,
                                                        CUBLAS_GEMM_DEFAULT),
                             "cublasGemmStridedBatchedEx (P V)");
          }
        };
        break;
      }
      case Op::shared: {
        moe::check(s == moe::models::DeepSeekV2::spec, "the shared-expert call is instantiated for "
                                                       "DeepSeek-V2 only, not ", sh.name);
        auto shared = std::span<moe::ExpertWeights<bf16> const>(shared_views[si]);
        int T = static_cast<int>(p.tokens);
        fn = [=, &shared_x, &shared_inter, &shared_acc](cudaStream_t st) {
          moe::detail::shared_experts<moe::models::DeepSeekV2::spec>(st, shared, shared_x.get(), T, shared_inter.get(),
                                                                     shared_acc.get(), kc::GemmPath::automatic);
        };
        break;
      }
      case Op::experts: {
        int const E = sh.local_experts(), f = s.expert_ffn, top_k = s.top_k;
        long long const rows = p.tokens;
        fg::ExpertGrouping g = fg::balanced_grouping(rows, E);
        auto tabs = std::make_shared<std::array<kc::DeviceArray<int>, 3>>();
        (*tabs)[0] = kc::DeviceArray<int>(g.offsets.size());
        (*tabs)[0].upload(g.offsets.data(), g.offsets.size());
        (*tabs)[1] = kc::DeviceArray<int>(g.tile_starts.size());
        (*tabs)[1].upload(g.tile_starts.data(), g.tile_starts.size());
        (*tabs)[2] = kc::DeviceArray<int>(g.index.size());
        (*tabs)[2].upload(g.index.data(), g.index.size());
        bf16 const* const* gt = gate_tab[si].get();
        bf16 const* const* ut = up_tab[si].get();
        bf16 const* const* dt = down_tab[si].get();
        fn = [=, &expert_src, &expert_inter, &expert_out](cudaStream_t st) {
          kc::GroupedGemmArgs<bf16> g1;
          g1.groups = E;
          g1.rows = (*tabs)[0].get();
          g1.tile_starts = (*tabs)[1].get();
          g1.max_row_tiles = kc::grouped_gemm_row_tiles(rows, E);
          g1.index = (*tabs)[2].get();  // copy id; its token row is copy / top_k
          g1.index_div = top_k;
          g1.a = reinterpret_cast<std::byte const*>(expert_src.get());
          g1.a_stride = static_cast<std::size_t>(h) * sizeof(bf16);
          g1.b0_table = gt;
          g1.b1_table = ut;
          g1.n = f;
          g1.k = h;
          g1.out = expert_inter.get();
          g1.out_ld = static_cast<std::size_t>(f);
          kc::grouped_gemm<bf16, kc::Epilogue::swiglu>(st, g1);
          kc::GroupedGemmArgs<bf16> g2 = g1;
          g2.a = reinterpret_cast<std::byte const*>(expert_inter.get());
          g2.a_stride = static_cast<std::size_t>(f) * sizeof(bf16);
          g2.index = nullptr;
          g2.index_div = 1;
          g2.b0_table = dt;
          g2.b1_table = nullptr;
          g2.n = h;
          g2.k = f;
          g2.out = expert_out.get();
          g2.out_ld = static_cast<std::size_t>(h);
          kc::grouped_gemm<bf16, kc::Epilogue::store>(st, g2);
        };
        break;
      }
      case Op::a2e:
      case Op::e2a: {
        auto bytes = static_cast<std::size_t>(p.work);
        bool fwd = p.op == Op::a2e;
        fn = [=, &link_x, &link_y](cudaStream_t st) {
          void* dst = fwd ? link_y.get() : link_x.get();
          void const* src = fwd ? link_x.get() : link_y.get();
          kc::check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st), "cudaMemcpyAsync (link)");
        };
#if defined(MOE_FIT_GPU_NCCL)
        if (nccl_ok) {
          auto nfn = [=, &link_x, &link_y](cudaStream_t st) {
            void* dst = fwd ? link_y.get() : link_x.get();
            void const* src = fwd ? link_x.get() : link_y.get();
            check_nccl(ncclGroupStart(), "ncclGroupStart");
            check_nccl(ncclSend(src, bytes, ncclUint8, 0, comm, st), "ncclSend (to itself)");
            check_nccl(ncclRecv(dst, bytes, ncclUint8, 0, comm, st), "ncclRecv (from itself)");
            check_nccl(ncclGroupEnd(), "ncclGroupEnd");
          };
          calls.push_back({p, std::string(op_name(p.op)) + "[nccl]", nfn, {}});
        }
#endif
        break;
      }
    }
    calls.push_back({p, std::string(op_name(p.op)), std::move(fn), {}});
  }
  kc::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (set-up)");

  cudaEvent_t t0 = nullptr, t1 = nullptr;
  kc::check_cuda(cudaEventCreate(&t0), "cudaEventCreate");
  kc::check_cuda(cudaEventCreate(&t1), "cudaEventCreate");
  auto const spin_ns = static_cast<unsigned long long>(opt.spin_us * 1e3);
  auto time_call = [&](Timed& c) {
    moe::kernels::cuda::launch(spin_kernel, 1, 1, 0, stream, spin_ns);
    kc::check_launch("spin_kernel");
    kc::check_cuda(cudaEventRecord(t0, stream), "cudaEventRecord");
    c.run(stream);
    kc::check_cuda(cudaEventRecord(t1, stream), "cudaEventRecord");
    kc::check_cuda(cudaEventSynchronize(t1), "cudaEventSynchronize (a call failed)");
    float ms = 0;
    kc::check_cuda(cudaEventElapsedTime(&ms, t0, t1), "cudaEventElapsedTime");
    return 1e3 * static_cast<double>(ms);
  };

  std::printf("# %zu calls, 2 warm-up passes, %d timed rounds in shuffled order, median per call\n", calls.size(),
              opt.reps);
  for (int w = 0; w < 2; ++w)
    for (auto& c : calls) (void)time_call(c);
  // Sanity: after the warm-up every output holds finite values (a wrong layout or a broken kernel
  // shows up here as NaN / Inf or an error, not as a plausible-looking time).
  auto finite = [&](void const* dev, std::size_t n, bool is_float, char const* what) {
    n = std::min<std::size_t>(n, 4096);
    if (n == 0) return;
    std::vector<float> f(n);
    std::vector<bf16> b(n);
    kc::check_cuda(cudaMemcpy(is_float ? static_cast<void*>(f.data()) : static_cast<void*>(b.data()), dev,
                              n * (is_float ? sizeof(float) : sizeof(bf16)), cudaMemcpyDeviceToHost),
                   "cudaMemcpy (sanity)");
    for (std::size_t i = 0; i < n; ++i) {
      float x = is_float ? f[i] : static_cast<float>(b[i]);
      moe::check(std::isfinite(x), "", what, " output ", i, " is not finite (", x, ")");
    }
  };
  kc::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (warm-up)");
  finite(gemm_c.get(), gemm_c.size(), false, "gemm");
  finite(o.get(), o.size(), false, "attention");
  finite(scores.get(), scores.size(), false, "attention probabilities");
  finite(shared_acc.get(), shared_acc.size(), true, "shared");
  finite(expert_out.get(), expert_out.size(), false, "experts");
  finite(link_y.get(), sz.link_bytes / sizeof(bf16), false, "link");

  std::vector<std::size_t> order(calls.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 rng(42);
  for (int r = 0; r < opt.reps; ++r) {
    std::shuffle(order.begin(), order.end(), rng);
    for (std::size_t i : order) calls[i].times_us.push_back(time_call(calls[i]));
  }
  kc::check_cuda(cudaEventDestroy(t0), "cudaEventDestroy");
  kc::check_cuda(cudaEventDestroy(t1), "cudaEventDestroy");

  // Fit every row: the six operations, plus a2e[nccl] / e2a[nccl] when measured.
  std::vector<std::string> rows;
  for (Op op : all_ops) rows.emplace_back(op_name(op));
#if defined(MOE_FIT_GPU_NCCL)
  if (nccl_ok) {
    rows.emplace_back("a2e[nccl]");
    rows.emplace_back("e2a[nccl]");
  }
#endif
  PerfModels models;
  models.source = std::string("GPU microbenchmarks (findep_fit_gpu) on ") + prop.name + "; link " +
                  (opt.link == "nccl" ? "ncclSend/ncclRecv to itself" : "device-to-device cudaMemcpyAsync") +
                  "; median of " + std::to_string(opt.reps) + " rounds";
  bool ok = true;
  std::printf("%-10s %6s %12s %16s %10s %12s %12s  %s\n", "op", "points", "alpha_us", "beta_us_per_unit", "R^2",
              "min_work", "max_work", "rate");
  for (std::string const& row : rows) {
    std::vector<Sample> samples;
    for (auto const& c : calls)
      if (c.op == row) samples.push_back({c.point.work, median(c.times_us)});
    bool is_nccl = row.find("[nccl]") != std::string::npos;
    std::string base = is_nccl ? row.substr(0, row.find('[')) : row;
    Op op = Op::gemm;
    for (Op x : all_ops)
      if (op_name(x) == base) op = x;
    Fit f;
    try {
      f = fit_linear(samples, row);
    } catch (moe::Error const& err) {
      if (!is_nccl || opt.link == "nccl") throw;  // the six models of the file must fit; an extra row may fail
      std::printf("%-10s %6zu  no fit: %s\n", row.c_str(), samples.size(), err.what());
      continue;
    }
    double lo = 1e300, hi = 0;
    for (auto const& s : samples) {
      lo = std::min(lo, s.work);
      hi = std::max(hi, s.work);
    }
    bool in_file = is_nccl == (opt.link == "nccl");
    if (in_file) {
      models.set(op, f);
      if (f.r2 < 0.99) ok = false;
    }
    double rate = 1.0 / f.model.beta;  // units per microsecond
    bool flop = op_unit(op) == "flop";
    std::printf("%-10s %6zu %12.3f %16.6e %10.6f %12.4g %12.4g  %.1f %s%s%s\n", row.c_str(), f.samples,
                f.model.alpha, f.model.beta, f.r2, lo, hi, flop ? rate * 1e-6 : rate * 1e-3,
                flop ? "TFLOP/s" : "GB/s", f.alpha_clamped ? " (alpha clamped to 0)" : "",
                in_file ? (f.r2 < 0.99 ? "  R^2 < 0.99" : "") : (f.r2 < 0.99 ? "  (not in the model file; R^2 < 0.99)" : "  (not in the model file)"));
  }
  write_models(opt.out, models);
  std::printf("wrote %s\n", opt.out.c_str());
  if (!opt.samples.empty()) {
    std::ofstream s(opt.samples);
    moe::check(s.is_open(), "cannot open '", opt.samples, "' for writing");
    s << "# findep_fit_gpu samples on " << prop.name << ": median time of " << opt.reps << " rounds per call\n";
    s << "op\tshape\ttokens\tsamples\tseq\twork\ttime_us\n";
    for (auto const& c : calls)
      s << c.op << '\t' << fg::shapes[static_cast<std::size_t>(c.point.shape)].name << '\t' << c.point.tokens << '\t'
        << c.point.samples << '\t' << c.point.seq << '\t' << c.point.work << '\t' << median(c.times_us) << '\n';
    moe::check(static_cast<bool>(s), "error writing '", opt.samples, "'");
    std::printf("wrote %s\n", opt.samples.c_str());
  }
  if (!ok) std::printf("findep_fit_gpu: at least one model has R^2 < 0.99\n");

#if defined(MOE_FIT_GPU_NCCL)
  if (comm) ncclCommDestroy(comm);
#endif
  cublasDestroy(cublas);
  cudaStreamDestroy(stream);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return moe::tools::guarded_main("findep_fit_gpu", [&] {
    moe::tools::Args const args(argc, argv, {{"out"}, {"samples"}, {"reps"}, {"spin-us"}, {"link"}, {"device"}, {"list", true}});
    if (args.help()) {
      usage();
      return static_cast<int>(moe::tools::exit_ok);
    }
    Options opt;
    opt.out = args.text("out", opt.out);
    opt.samples = args.text("samples", opt.samples);
    opt.reps = static_cast<int>(args.integer("reps", opt.reps, 1, 1000000));
    opt.spin_us = args.number("spin-us", opt.spin_us, 0, 1e5);
    opt.link = args.choice("link", opt.link, {"memcpy", "nccl"});
    opt.device = static_cast<int>(args.integer("device", opt.device, 0, 1023));
    opt.list = args.has("list");
    return run(opt);
  });
}
