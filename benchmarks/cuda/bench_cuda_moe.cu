// GPU benchmarks of the MoE kernels and the single-GPU layer at the example models' expert shapes,
// decode (128 tokens) and prefill (4096, 16384 tokens). Synthetic, seeded data: random bf16 weights
// and tokens, routes from a random router (so loads are roughly uniform over experts); except
// GroupedGemmLoad, whose per-expert loads are real (OLMoE and Mixtral corpus counts, see below).
//
// Every benchmark times the GPU with CUDA events (manual time) and reports counters:
//   GB/s      bytes read + written by the kernel(s) per second
//   TFLOP/s   2 * multiply-adds per second (GEMMs)
//   tokens/s  tokens per second (layer)
// and ratios against baselines measured in the same run:
//   of_copy   GB/s / device-to-device cudaMemcpy GB/s (BM_Copy runs first)
//   of_dense  TFLOP/s / a dense cuBLAS bf16 GEMM with the same flops (BM_DenseGemm runs first)
//   of_loop   speed-up over a loop of per-expert cuBLAS GEMMs with host-known counts (eager style)
//   of_portable  speed-up of the grouped GEMM the layer uses (Hopper wgmma where available) over
//             the portable WMMA kernel on the same data
//
// Options besides Google Benchmark's: --gemm=automatic|portable|hopper, the grouped-GEMM kernel
// of the Layer benchmarks (Options::device.gemm; default automatic), e.g. to measure the layer
// with the portable kernel (the GroupedGemm benchmarks always time both kernels); --smoke, every
// benchmark at reduced widths (hidden 64) with a 16 MiB copy baseline, which is what the CPU
// emulator runs in CI (tests/emu) so that setup bugs show before a GPU run.
//
// Without a GPU the program prints a note and exits with 0.

#include <benchmark/benchmark.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "bench_support.cuh"
#include "moe/kernels/combine.cuh"
#include "moe/kernels/dispatch.cuh"
#include "moe/kernels/gate.cuh"
#include "moe/kernels/grouped_gemm.cuh"
#include "moe/layer/paths/device.cuh"
#include "moe/moe.hpp"

namespace kc = moe::kernels::cuda;
using moe::bf16;
using moe::bench::time_gpu;

namespace {

// ---------------------------------------------------------------------------------------------
// Small device helpers
// ---------------------------------------------------------------------------------------------

/// Owning device buffer (the library's DeviceArray).
template <class T>
using Buf = kc::DeviceArray<T>;

__global__ void fill_kernel(bf16* p, std::size_t n, std::uint64_t seed, float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint64_t z = (i + seed * 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
    z ^= z >> 29;
    float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
    p[i] = kc::store_as<bf16>(u * scale);
  }
}

void fill(bf16* p, std::size_t n, std::uint64_t seed, float scale) {
  moe::kernels::cuda::launch(fill_kernel, 1024, 256, 0, nullptr, p, n, seed, scale);
  kc::check_launch("fill_kernel");
}

/// Times `body` (enqueued on `s`) with events; one benchmark iteration per call.

benchmark::Counter rate(double per_iteration) {
  return benchmark::Counter(per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

double g_copy_gbs = 0;                     // measured D2D copy bandwidth
std::map<std::string, double> g_dense;     // dense cuBLAS TFLOP/s per (model, tokens)
std::map<std::string, double> g_loop_ms;   // per-expert cuBLAS loop time per (model, tokens)
std::map<std::string, double> g_portable_ms;  // portable grouped GEMM time per (model, tokens)
kc::GemmPath g_layer_gemm = kc::GemmPath::automatic;  // --gemm: the Layer benchmarks' kernel

/// The label of a Layer benchmark: which grouped-GEMM kernel its experts ran.
std::string layer_gemm_label() {
  bool hopper = g_layer_gemm == kc::GemmPath::hopper ||
                (g_layer_gemm == kc::GemmPath::automatic && kc::hopper_gemm_available());
  return std::string("gemm ") + (hopper ? "hopper wgmma" : "portable");
}

std::string key(std::string_view model, long tokens) { return std::string(model) + "/" + std::to_string(tokens); }

// ---------------------------------------------------------------------------------------------
// Per-model fixtures: full-size bf16 weights (cached per model), routes for a token count
// ---------------------------------------------------------------------------------------------

template <class Model>
struct ModelWeights {
  static constexpr moe::ShapeSpec s = Model::spec;
  Buf<bf16> router, experts, shared;
  std::vector<moe::ExpertWeights<bf16>> ew, sw;
  ModelWeights()
      : router(static_cast<std::size_t>(s.experts) * s.hidden),
        experts(3ull * s.experts * s.hidden * s.expert_ffn),
        shared(3ull * s.shared_experts * s.hidden * s.shared_ffn) {
    fill(router.get(), router.size(), 1, 1.0f / std::sqrt(float(s.hidden)));
    fill(experts.get(), experts.size(), 2, 1.0f / std::sqrt(float(s.hidden)));
    if (shared.size()) fill(shared.get(), shared.size(), 3, 1.0f / std::sqrt(float(s.hidden)));
    std::size_t m = static_cast<std::size_t>(s.hidden) * s.expert_ffn;
    for (int e = 0; e < s.experts; ++e) {
      bf16* base = experts.get() + 3 * m * static_cast<std::size_t>(e);
      ew.push_back({base, base + m, base + 2 * m});
    }
    std::size_t sm = static_cast<std::size_t>(s.hidden) * s.shared_ffn;
    for (int e = 0; e < s.shared_experts; ++e) {
      bf16* base = shared.get() + 3 * sm * static_cast<std::size_t>(e);
      sw.push_back({base, base + sm, base + 2 * sm});
    }
    kc::check_cuda(cudaDeviceSynchronize(), "weights");
  }
  static ModelWeights& get() {
    static ModelWeights* w = new ModelWeights();  // kept for the whole run
    return *w;
  }
  moe::LayerWeights<bf16> view() const { return {router.get(), nullptr, ew, sw}; }
};

/// Host routes of `tokens` random tokens (Gaussian logits stand in for router outputs).
template <class Model>
struct Routes {
  static constexpr moe::ShapeSpec s = Model::spec;
  static constexpr int k = s.top_k;
  std::vector<int> ids;
  std::vector<float> w;
  std::vector<int> per_expert;
  explicit Routes(int tokens) {
    std::mt19937_64 rng(17);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> logits(static_cast<std::size_t>(tokens) * s.experts);
    for (auto& v : logits) v = d(rng);
    ids.resize(static_cast<std::size_t>(tokens) * k);
    w.resize(ids.size());
    moe::router::route_all<moe::router::ForModel<Model>>(s, logits, {}, tokens, ids, w);
    per_expert.assign(static_cast<std::size_t>(s.experts), 0);
    for (int e : ids) ++per_expert[static_cast<std::size_t>(e)];
  }
};

/// Device state of one token count: packed records (world size 1), grouping, GEMM buffers.
template <class Model>
struct Prepared {
  static constexpr moe::ShapeSpec s = Model::spec;
  static constexpr int k = s.top_k;
  int tokens, ranks;
  std::size_t meta = (8 + 8 * static_cast<std::size_t>(k) + 15) / 16 * 16;
  std::size_t rec = meta + (static_cast<std::size_t>(s.hidden) * 2 + 15) / 16 * 16;
  std::size_t slots, items;
  Buf<bf16> x;
  Buf<int> ids, dest, rec_count, rec_pos, off, rk, prim;
  Buf<float> w;
  Buf<std::byte> scan_temp, send;
  Buf<std::uint64_t> send_count;
  Buf<long long> send_base, recv_base;
  Buf<int> recv_n, keys, values, skeys, svalues, position, offsets, tiles;
  Buf<std::byte> sort_temp;
  Buf<unsigned char> served;
  Buf<unsigned> errors;
  Buf<bf16> inter, out, back, y;
  Buf<bf16 const*> gate, up, down;

  Prepared(int tokens_, int ranks_)
      : tokens(tokens_), ranks(ranks_), slots(static_cast<std::size_t>(tokens_) * std::min(k, ranks_)),
        items(slots * k), x(static_cast<std::size_t>(tokens_) * s.hidden), ids(static_cast<std::size_t>(tokens_) * k),
        dest(ids.size()), rec_count(static_cast<std::size_t>(ranks_) * tokens_), rec_pos(rec_count.size()),
        off(static_cast<std::size_t>(s.experts) + 1), rk(static_cast<std::size_t>(s.experts)), prim(rk.size()), w(ids.size()),
        scan_temp(kc::exclusive_sum_bytes(static_cast<long long>(rec_count.size()))), send(slots * rec),
        send_count(static_cast<std::size_t>(ranks_)), send_base(send_count.size()), recv_base(send_count.size()),
        recv_n(send_count.size()), keys(items), values(items), skeys(items), svalues(items), position(items),
        offsets(off.size()), tiles(off.size()), sort_temp(kc::sort_items_bytes(static_cast<long long>(items), s.experts)),
        served(rk.size()), errors(1), inter(items * s.expert_ffn), out(items * s.hidden), back(slots * s.hidden),
        y(x.size()), gate(rk.size()), up(rk.size()), down(rk.size()) {
    Routes<Model> r(tokens);
    fill(x.get(), x.size(), 5, 1.0f);
    ids.upload(r.ids.data(), ids.size());
    w.upload(r.w.data(), w.size());
    // Experts spread contiguously over `ranks` ranks, one copy each; this rank serves them all
    // (the benchmark measures one GPU's share of the work as if it received every record).
    std::vector<int> o(off.size()), ranks_of(rk.size());
    for (int e = 0; e < s.experts; ++e) {
      o[static_cast<std::size_t>(e)] = e;
      ranks_of[static_cast<std::size_t>(e)] = e * ranks / s.experts;
    }
    o[static_cast<std::size_t>(s.experts)] = s.experts;
    off.upload(o.data(), off.size());
    rk.upload(ranks_of.data(), rk.size());
    prim.upload(ranks_of.data(), prim.size());
    std::vector<unsigned char> all(rk.size(), 1);
    served.upload(all.data(), served.size());
    auto& mw = ModelWeights<Model>::get();
    std::vector<bf16 const*> g(rk.size()), u(rk.size()), d(rk.size());
    for (std::size_t e = 0; e < rk.size(); ++e) {
      g[e] = mw.ew[e].gate;
      u[e] = mw.ew[e].up;
      d[e] = mw.ew[e].down;
    }
    gate.upload(g.data(), gate.size());
    up.upload(u.data(), up.size());
    down.upload(d.data(), down.size());
    pack(nullptr);
    group(nullptr);
    kc::check_cuda(cudaDeviceSynchronize(), "prepare");
  }

  void pack(cudaStream_t st) {
    kc::ReplicaView view{off.get(), rk.get(), prim.get()};
    kc::plan_records<k>(st, ids.get(), tokens, ranks, view, 0, 0, true, dest.get(), rec_count.get());
    kc::exclusive_sum(st, scan_temp.get(), scan_temp.size(), rec_count.get(), rec_pos.get(), static_cast<long long>(rec_count.size()));
    kc::send_layout(st, rec_count.get(), rec_pos.get(), tokens, ranks, 0, send_count.get(), send_base.get());
    pack_kernel(st);
  }
  /// Records the last pack() wrote (read back from the device; not for timed code).
  double records() const {
    std::vector<std::uint64_t> counts(static_cast<std::size_t>(ranks));
    kc::check_cuda(cudaMemcpy(counts.data(), send_count.get(), counts.size() * 8, cudaMemcpyDeviceToHost),
                   "cudaMemcpy (send counts)");
    double n = 0;
    for (auto c : counts) n += static_cast<double>(c);
    return n;
  }
  /// Bytes a permutation must move: the tokens read once, every record written once.
  double packed_bytes() const { return static_cast<double>(tokens) * s.hidden * 2 + records() * static_cast<double>(rec); }
  /// The data-moving step of pack() alone (the plan, scan and layout it reads are pack()'s).
  void pack_kernel(cudaStream_t st) {
    kc::pack_records<bf16, k>(st, x.get(), tokens, s.hidden, ids.get(), w.get(), dest.get(), rec_pos.get(), send_base.get(), true, send.get(), rec,
                              meta);
  }
  /// The received side sees every record this rank packed, as if all came back to it.
  void group(cudaStream_t st) {
    kc::send_layout(st, rec_count.get(), rec_pos.get(), tokens, ranks, 0, send_count.get(), send_base.get());
    // One region holding every packed record: total count on the device, summed by recv_layout
    // over the per-destination counts.
    kc::recv_layout(st, send_count.get(), ranks, 0, recv_base.get(), recv_n.get());
    kc::ExpertGrouping g{keys.get(), values.get(), skeys.get(), svalues.get(), position.get(), offsets.get(), tiles.get(), sort_temp.get(), sort_temp.size()};
    kc::group_by_expert<k>(st, send.get(), rec, static_cast<long long>(slots), recv_base.get(), recv_n.get(), ranks, s.experts,
                           served.get(), kc::grouped_gemm_tile_m, g, errors.get());
  }
  void experts(cudaStream_t st, kc::GemmPath path = kc::GemmPath::automatic) {
    moe::detail::ExpertGemms<s, bf16>{.offsets = offsets.get(),
                                      .tile_starts = tiles.get(),
                                      .max_rows = static_cast<long long>(items),
                                      .a = send.get() + meta,
                                      .a_stride = rec,
                                      .index = svalues.get(),
                                      .index_div = k,
                                      .gate = gate.get(),
                                      .up = up.get(),
                                      .down = down.get(),
                                      .inter = inter.get(),
                                      .out = out.get(),
                                      .path = path}
        .enqueue(st);
  }
  void combine(cudaStream_t st) {
    kc::combine_records<bf16, k>(st, send.get(), rec, static_cast<long long>(slots), recv_base.get(), recv_n.get(), ranks,
                                 s.experts, served.get(), out.get(), position.get(), s.hidden, back.get());
    kc::finish_tokens<bf16>(st, tokens, s.hidden, ranks, rec_count.get(), rec_pos.get(), send_base.get(), back.get(), nullptr, y.get());
  }
};

template <class Model>
double routed_flops(long tokens) {
  constexpr moe::ShapeSpec s = Model::spec;
  return 6.0 * static_cast<double>(tokens) * s.top_k * s.hidden * s.expert_ffn;
}

// ---------------------------------------------------------------------------------------------
// Benchmarks
// ---------------------------------------------------------------------------------------------

/// Bytes of the copy baseline (1 GiB; 16 MiB in a --smoke run).
std::size_t g_copy_bytes = std::size_t{1} << 30;

void BM_Copy(benchmark::State& state) {
  std::size_t bytes = g_copy_bytes;
  Buf<std::byte> a(bytes), b(bytes);
  cudaMemset(a.get(), 1, bytes);
  time_gpu(state, nullptr, [&] { cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, nullptr); });
  state.counters["GB/s"] = rate(2.0 * static_cast<double>(bytes) / 1e9);
  // Derive the rate for later ratios from a separate timed pass (the counter is finalised later).
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int i = 0; i < 10; ++i) cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, nullptr);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  g_copy_gbs = 2.0 * 10 * static_cast<double>(bytes) / (static_cast<double>(ms) / 1e3) / 1e9;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

/// Mean milliseconds of `body` over `reps` runs (for same-run baselines).
template <class F>
double mean_ms(F&& body, int reps = 20) {
  body();
  cudaDeviceSynchronize();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int i = 0; i < reps; ++i) body();
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return static_cast<double>(ms) / reps;
}

struct Cublas {
  cublasHandle_t h = nullptr;
  Cublas() { kc::check_cublas(cublasCreate(&h), "cublasCreate"); }
  ~Cublas() { cublasDestroy(h); }
  /// C (m x n, row-major) = A (m x k, row-major) * B^T (B: n x k, row-major), bf16 in, bf16 out.
  void gemm_nt(bf16 const* a, bf16 const* b, bf16* c, int m, int n, int k) const {
    float one = 1, zero = 0;
    kc::check_cublas(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, b, CUDA_R_16BF, k, a, CUDA_R_16BF, k,
                                  &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
  }
};

/// Dense cuBLAS GEMMs with the routed experts' total flops: (tokens * k) x ffn x hidden twice
/// (gate, up) and (tokens * k) x hidden x ffn once, on one expert's weights.
template <class Model>
void BM_DenseGemm(benchmark::State& state) {
  constexpr moe::ShapeSpec s = Model::spec;
  long tokens = state.range(0);
  int m = static_cast<int>(tokens * s.top_k);
  auto& mw = ModelWeights<Model>::get();
  Buf<bf16> a(static_cast<std::size_t>(m) * s.hidden), mid(static_cast<std::size_t>(m) * s.expert_ffn),
      c(static_cast<std::size_t>(m) * s.hidden);
  fill(a.get(), a.size(), 9, 1.0f);
  Cublas cb;
  auto body = [&] {
    cb.gemm_nt(a.get(), mw.ew[0].gate, mid.get(), m, s.expert_ffn, s.hidden);
    cb.gemm_nt(a.get(), mw.ew[0].up, mid.get(), m, s.expert_ffn, s.hidden);
    cb.gemm_nt(mid.get(), mw.ew[0].down, c.get(), m, s.hidden, s.expert_ffn);
  };
  time_gpu(state, nullptr, body);
  double flops = routed_flops<Model>(tokens);
  state.counters["TFLOP/s"] = rate(flops / 1e12);
  g_dense[key(Model::name, tokens)] = flops / (mean_ms(body) / 1e3) / 1e12;
}

/// The eager baseline: per expert, three cuBLAS GEMMs on its rows (counts known on the host).
template <class Model>
void BM_CublasExpertLoop(benchmark::State& state) {
  constexpr moe::ShapeSpec s = Model::spec;
  long tokens = state.range(0);
  Routes<Model> r(static_cast<int>(tokens));
  auto& mw = ModelWeights<Model>::get();
  std::size_t rows = static_cast<std::size_t>(tokens) * s.top_k;
  Buf<bf16> a(rows * s.hidden), g(rows * s.expert_ffn), c(rows * s.hidden);
  fill(a.get(), a.size(), 10, 1.0f);
  Cublas cb;
  auto body = [&] {
    std::size_t at = 0;
    for (int e = 0; e < s.experts; ++e) {
      int n = r.per_expert[static_cast<std::size_t>(e)];
      if (n == 0) continue;
      cb.gemm_nt(a.get() + at * s.hidden, mw.ew[static_cast<std::size_t>(e)].gate, g.get() + at * s.expert_ffn, n, s.expert_ffn,
                 s.hidden);
      cb.gemm_nt(a.get() + at * s.hidden, mw.ew[static_cast<std::size_t>(e)].up, g.get() + at * s.expert_ffn, n, s.expert_ffn,
                 s.hidden);
      cb.gemm_nt(g.get() + at * s.expert_ffn, mw.ew[static_cast<std::size_t>(e)].down, c.get() + at * s.hidden, n, s.hidden,
                 s.expert_ffn);
      at += static_cast<std::size_t>(n);
    }
  };
  time_gpu(state, nullptr, body);
  state.counters["TFLOP/s"] = rate(routed_flops<Model>(tokens) / 1e12);
  g_loop_ms[key(Model::name, tokens)] = mean_ms(body, 5);
}

/// Both grouped expert GEMMs (gate/up with SwiGLU, then down) with the kernel the layer uses
/// (GemmPath::automatic: the Hopper kernel where it can run), or with the portable kernel
/// (`GroupedGemmPortable/...`, registered first). of_portable = portable time / this time.
template <class Model, kc::GemmPath Path>
void BM_GroupedGemm(benchmark::State& state) {
  long tokens = state.range(0);
  Prepared<Model> p(static_cast<int>(tokens), 1);
  time_gpu(state, nullptr, [&] { p.experts(nullptr, Path); });
  double flops = routed_flops<Model>(tokens);
  state.counters["TFLOP/s"] = rate(flops / 1e12);
  double ms = mean_ms([&] { p.experts(nullptr, Path); }, 5);
  double tf = flops / (ms / 1e3) / 1e12;
  auto k = key(Model::name, tokens);
  if (g_dense.count(k)) state.counters["of_dense"] = tf / g_dense[k];
  if (g_loop_ms.count(k)) state.counters["of_loop"] = g_loop_ms[k] / ms;
  if constexpr (Path == kc::GemmPath::portable) {
    g_portable_ms[k] = ms;
  } else {
    if (g_portable_ms.count(k)) state.counters["of_portable"] = g_portable_ms[k] / ms;
    state.SetLabel(kc::hopper_gemm_available() ? "hopper wgmma" : "portable");
  }
}

// ---------------------------------------------------------------------------------------------
// The grouped GEMMs under real expert loads. The rows of a batch (tokens * top_k) are split over
// the experts in proportion to the real corpus counts of one recorded layer
// (tests/data/olmoe-routing, MODEL/DOMAIN/expert_counts.tsv; largest-remainder rounding, ties to
// the lower expert), or evenly ("uniform", the balanced best case). The A rows lie contiguous in
// expert order, as after a permutation copy (the layer gathers them instead; the loads are what
// differ here). scripts/gpu_bench.sh times torch._grouped_mm on the same splits.
// ---------------------------------------------------------------------------------------------

struct LoadCase {
  char const* name;     ///< "uniform" or DOMAIN-L<layer>
  char const* folder;   ///< MODEL folder of the data, or nullptr for uniform
  char const* domain;
  int layer_pos;        ///< position of the layer in the file (recorded layers 0, 7, 15)
};

/// `rows` split in proportion to `weight`: floors first, then one more row to the largest
/// fractional parts (ties to the lower index).
std::vector<int> proportional_split(std::vector<double> const& weight, long rows) {
  double total = 0;
  for (double w : weight) total += w;
  moe::check(total > 0, "proportional_split: the weights sum to 0");
  std::vector<int> n(weight.size());
  std::vector<std::pair<double, std::size_t>> frac(weight.size());
  long given = 0;
  for (std::size_t e = 0; e < weight.size(); ++e) {
    double q = static_cast<double>(rows) * weight[e] / total;
    n[e] = static_cast<int>(std::floor(q));
    given += n[e];
    frac[e] = {q - std::floor(q), e};
  }
  std::stable_sort(frac.begin(), frac.end(), [](auto const& a, auto const& b) { return a.first > b.first; });
  for (long i = 0; i < rows - given; ++i) ++n[frac[static_cast<std::size_t>(i)].second];
  return n;
}

/// Rows per expert for one load case.
template <class Model>
std::vector<int> case_rows(LoadCase const& c, long rows) {
  constexpr moe::ShapeSpec s = Model::spec;
  std::vector<double> w(static_cast<std::size_t>(s.experts), 1.0);
  if (c.folder != nullptr) {
    auto m = moe::profile::marginals_from_olmoe(std::string(MOE_SHARED_DATA_DIR) + "/olmoe-routing/" + c.folder +
                                                "/" + c.domain + "/expert_counts.tsv");
    moe::check(m.experts == s.experts && c.layer_pos < m.layers, "bench_cuda_moe: ", c.folder, "/", c.domain,
               " does not match ", Model::name);
    for (int e = 0; e < s.experts; ++e) w[static_cast<std::size_t>(e)] = m.at(c.layer_pos, e);
  }
  return proportional_split(w, rows);
}

/// Both grouped GEMMs (SwiGLU, then down) over fixed per-expert row counts.
template <class Model>
struct SplitGemm {
  static constexpr moe::ShapeSpec s = Model::spec;
  long rows;
  Buf<bf16> a, inter, out;
  Buf<int> offsets, tiles;
  Buf<bf16 const*> gate, up, down;

  explicit SplitGemm(std::vector<int> const& per_expert)
      : rows(std::accumulate(per_expert.begin(), per_expert.end(), 0L)),
        a(static_cast<std::size_t>(rows) * s.hidden),
        inter(static_cast<std::size_t>(rows) * s.expert_ffn),
        out(static_cast<std::size_t>(rows) * s.hidden),
        offsets(per_expert.size() + 1),
        tiles(per_expert.size() + 1),
        gate(per_expert.size()),
        up(per_expert.size()),
        down(per_expert.size()) {
    std::vector<int> o{0}, t{0};
    for (int n : per_expert) {
      o.push_back(o.back() + n);
      t.push_back(t.back() + (n + kc::grouped_gemm_tile_m - 1) / kc::grouped_gemm_tile_m);
    }
    offsets.upload(o.data(), o.size());
    tiles.upload(t.data(), t.size());
    auto& mw = ModelWeights<Model>::get();
    std::vector<bf16 const*> g, u, d;
    for (auto const& e : mw.ew) {
      g.push_back(e.gate);
      u.push_back(e.up);
      d.push_back(e.down);
    }
    gate.upload(g.data(), g.size());
    up.upload(u.data(), u.size());
    down.upload(d.data(), d.size());
    fill(a.get(), a.size(), 7, 1.0f);
    kc::check_cuda(cudaDeviceSynchronize(), "split GEMM setup");
  }

  void run(cudaStream_t st, kc::GemmPath path) {
    moe::detail::ExpertGemms<s, bf16>{.offsets = offsets.get(),
                                      .tile_starts = tiles.get(),
                                      .max_rows = rows,
                                      .a = reinterpret_cast<std::byte const*>(a.get()),
                                      .a_stride = static_cast<std::size_t>(s.hidden) * sizeof(bf16),
                                      .gate = gate.get(),
                                      .up = up.get(),
                                      .down = down.get(),
                                      .inter = inter.get(),
                                      .out = out.get(),
                                      .path = path}
        .enqueue(st);
  }
};

std::map<std::string, double> g_uniform_ms;  // uniform split time per (model, tokens)

/// Args: tokens, index into `cases` (registered uniform first). Counters: TFLOP/s, the split's
/// max/mean expert load, of_uniform = uniform time / this time (same kernel, same rows).
template <class Model>
void BM_GroupedGemmLoad(benchmark::State& state, std::vector<LoadCase> const& cases) {
  long tokens = state.range(0);
  LoadCase const& c = cases[static_cast<std::size_t>(state.range(1))];
  auto per_expert = case_rows<Model>(c, tokens * Model::spec.top_k);
  SplitGemm<Model> g(per_expert);
  time_gpu(state, nullptr, [&] { g.run(nullptr, g_layer_gemm); });
  double ms = mean_ms([&] { g.run(nullptr, g_layer_gemm); }, 5);
  state.counters["TFLOP/s"] = rate(routed_flops<Model>(tokens) / 1e12);
  double mean = static_cast<double>(g.rows) / static_cast<double>(per_expert.size());
  state.counters["max_over_mean"] = *std::max_element(per_expert.begin(), per_expert.end()) / mean;
  auto k = key(Model::name, tokens);
  if (c.folder == nullptr) g_uniform_ms[k] = ms;
  else if (g_uniform_ms.count(k)) state.counters["of_uniform"] = g_uniform_ms[k] / ms;
  state.SetLabel(std::string(c.name) + ", " + layer_gemm_label());
}

template <class Model>
void register_loads(std::vector<LoadCase> const& cases) {
  for (long t : {128L, 4096L, 16384L})
    for (std::size_t i = 0; i < cases.size(); ++i)
      benchmark::RegisterBenchmark(("GroupedGemmLoad/" + std::string(Model::name) + "/" + cases[i].name).c_str(),
                                   [cases](benchmark::State& st) { BM_GroupedGemmLoad<Model>(st, cases); })
          ->Args({t, static_cast<long>(i)})
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
}

/// Permutation: plan, scan, layout and packing of the send buffer (with `ranks` destinations),
/// then the grouping by expert. Bytes: the tokens read once, every record written once.
template <class Model>
void BM_Permute(benchmark::State& state) {
  long tokens = state.range(0);
  int ranks = static_cast<int>(state.range(1));
  Prepared<Model> p(static_cast<int>(tokens), ranks);
  time_gpu(state, nullptr, [&] {
    p.pack(nullptr);
    p.group(nullptr);
  });
  double records = p.records();
  double bytes = p.packed_bytes();
  state.counters["GB/s"] = rate(bytes / 1e9);
  state.counters["records"] = records;
  if (g_copy_gbs > 0) {
    double ms = mean_ms([&] {
      p.pack(nullptr);
      p.group(nullptr);
    }, 10);
    state.counters["of_copy"] = bytes / (ms / 1e3) / 1e9 / g_copy_gbs;
  }
}

/// The packing kernel alone (pack_records: headers and token rows into the send buffer), without
/// the plan, scan and grouping around it that Permute includes: the data-movement part of the
/// permutation against the copy bandwidth. Same bytes as Permute.
template <class Model>
void BM_PackRecords(benchmark::State& state) {
  long tokens = state.range(0);
  int ranks = static_cast<int>(state.range(1));
  Prepared<Model> p(static_cast<int>(tokens), ranks);
  time_gpu(state, nullptr, [&] { p.pack_kernel(nullptr); });
  double bytes = p.packed_bytes();
  state.counters["GB/s"] = rate(bytes / 1e9);
  if (g_copy_gbs > 0) {
    double ms = mean_ms([&] { p.pack_kernel(nullptr); }, 10);
    state.counters["of_copy"] = bytes / (ms / 1e3) / 1e9 / g_copy_gbs;
  }
}

/// Weighted combine of each record's experts, then un-permute into token order.
template <class Model>
void BM_Combine(benchmark::State& state) {
  long tokens = state.range(0);
  Prepared<Model> p(static_cast<int>(tokens), 1);
  p.experts(nullptr);
  time_gpu(state, nullptr, [&] { p.combine(nullptr); });
  double h2 = Model::spec.hidden * 2.0;
  double bytes = static_cast<double>(p.items) * h2 + 2.0 * static_cast<double>(p.slots) * h2 + tokens * h2;
  state.counters["GB/s"] = rate(bytes / 1e9);
  if (g_copy_gbs > 0) {
    double ms = mean_ms([&] { p.combine(nullptr); }, 10);
    state.counters["of_copy"] = bytes / (ms / 1e3) / 1e9 / g_copy_gbs;
  }
}

/// One single-GPU layer of `Model` on `tokens` random tokens, its workspace and a stream: what the
/// Layer benchmarks time. The label names the grouped-GEMM kernel of its experts.
template <class Model>
struct LayerSetup {
  using L = moe::Layer<Model, moe::router::ForModel<Model>, moe::placement::Table, moe::replication::None, moe::schedule::Sequential,
                           moe::collective::SingleGpu>;
  static constexpr moe::ShapeSpec s = Model::spec;
  int tokens;
  moe::collective::SingleGpu gpu;
  L layer;
  Buf<std::byte> ws;
  Buf<bf16> x, y;
  cudaStream_t stream = nullptr;

  LayerSetup(benchmark::State& state, int t)
      : tokens(t),
        layer(gpu, moe::placement::Table::contiguous(s.experts, 1), {}, ModelWeights<Model>::get().view(),
              {.max_tokens = t, .device = {.gemm = g_layer_gemm}}),
        ws(layer.workspace_size()),
        x(static_cast<std::size_t>(t) * s.hidden),
        y(x.size()) {
    state.SetLabel(layer_gemm_label());
    fill(x.get(), x.size(), 11, 1.0f);
    kc::check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  }
  LayerSetup(LayerSetup const&) = delete;
  LayerSetup& operator=(LayerSetup const&) = delete;
  ~LayerSetup() { cudaStreamDestroy(stream); }

  void run() { layer.run({.tokens = tokens, .x = x.get(), .y = y.get(), .stream = stream}, {ws.get(), ws.size()}); }
};

/// The whole single-GPU layer forward (gate, route, permute, experts, combine, shared experts).
template <class Model>
void BM_Layer(benchmark::State& state) {
  constexpr moe::ShapeSpec s = Model::spec;
  long tokens = state.range(0);
  LayerSetup<Model> l(state, static_cast<int>(tokens));
  time_gpu(state, l.stream, [&] { l.run(); });
  double flops = routed_flops<Model>(tokens) + 6.0 * tokens * s.shared_experts * s.hidden * s.shared_ffn +
                 2.0 * tokens * s.hidden * s.experts;
  state.counters["TFLOP/s"] = rate(flops / 1e12);
  state.counters["tokens/s"] = rate(static_cast<double>(tokens));
  state.counters["workspace_GB"] = static_cast<double>(l.ws.size()) / 1e9;
  // What any implementation of this forward must do, for the report's lower bound on its time
  // (gpu_report.py: the larger of weight bytes / copy bandwidth and FLOPs / the best dense rate
  // of the run): the weights of every expert (with random routes nearly every expert receives
  // rows even at decode sizes: DeepSeek-V3 at 128 tokens about 251 of 256) and the FLOPs above.
  double weight_bytes = (3.0 * s.experts * s.hidden * s.expert_ffn + 3.0 * s.shared_experts * s.hidden * s.shared_ffn +
                         1.0 * s.experts * s.hidden) *
                        sizeof(bf16);
  state.counters["weights_GB"] = weight_bytes / 1e9;
  state.counters["GFLOP"] = flops / 1e9;
}

/// The same forward captured once in a CUDA graph and replayed (no launch overhead; decode sizes).
template <class Model>
void BM_LayerGraph(benchmark::State& state) {
  long tokens = state.range(0);
  LayerSetup<Model> l(state, static_cast<int>(tokens));
  l.run();  // first run outside the capture (lazy library initialisation)
  kc::check_cuda(cudaStreamSynchronize(l.stream), "cudaStreamSynchronize");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  kc::check_cuda(cudaStreamBeginCapture(l.stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  l.run();
  kc::check_cuda(cudaStreamEndCapture(l.stream, &graph), "cudaStreamEndCapture");
  kc::check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cudaError_t launched = cudaSuccess;  // the first failed launch, reported after the timing loop
  time_gpu(state, l.stream, [&] {
    cudaError_t e = cudaGraphLaunch(exec, l.stream);
    if (launched == cudaSuccess) launched = e;
  });
  if (launched != cudaSuccess) state.SkipWithError((std::string("cudaGraphLaunch: ") + cudaGetErrorString(launched)).c_str());
  state.counters["tokens/s"] = rate(static_cast<double>(tokens));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

template <class Model>
void register_model() {
  std::string n(Model::name);
  for (long t : {128L, 4096L, 16384L}) {
    benchmark::RegisterBenchmark(("DenseGemm/" + n).c_str(), BM_DenseGemm<Model>)->Arg(t)->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("CublasExpertLoop/" + n).c_str(), BM_CublasExpertLoop<Model>)->Arg(t)->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("GroupedGemmPortable/" + n).c_str(), BM_GroupedGemm<Model, kc::GemmPath::portable>)->Arg(t)->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("GroupedGemm/" + n).c_str(), BM_GroupedGemm<Model, kc::GemmPath::automatic>)->Arg(t)->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("Permute/" + n).c_str(), BM_Permute<Model>)->Args({t, 1})->Args({t, 8})->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("PackRecords/" + n).c_str(), BM_PackRecords<Model>)->Args({t, 1})->Args({t, 8})->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("Combine/" + n).c_str(), BM_Combine<Model>)->Arg(t)->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("Layer/" + n).c_str(), BM_Layer<Model>)->Arg(t)->UseManualTime()->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark(("LayerGraph/" + n).c_str(), BM_LayerGraph<Model>)->Arg(128)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  // --gemm=...: ours, taken out before Google Benchmark reads the rest.
  int kept = 1;
  bool smoke = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg(argv[i]);
    if (arg == "--smoke") {
      smoke = true;
      continue;
    }
    if (arg.rfind("--gemm=", 0) != 0) {
      argv[kept++] = argv[i];
      continue;
    }
    std::string_view v = arg.substr(7);
    if (v == "automatic") g_layer_gemm = kc::GemmPath::automatic;
    else if (v == "portable") g_layer_gemm = kc::GemmPath::portable;
    else if (v == "hopper") g_layer_gemm = kc::GemmPath::hopper;
    else {
      std::fprintf(stderr, "bench_cuda_moe: --gemm takes automatic, portable or hopper, got '%.*s'\n",
                   static_cast<int>(v.size()), v.data());
      return 2;
    }
  }
  argc = kept;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_cuda_moe: no CUDA device, nothing measured\n");
    return 0;
  }
  if (smoke) {
    g_copy_bytes = std::size_t{16} << 20;
    benchmark::RegisterBenchmark("Copy/D2D_16MiB", BM_Copy)->UseManualTime()->Unit(benchmark::kMicrosecond);
    register_model<moe::models::Reduced<moe::models::Mixtral8x7B, 64, 96>>();
    register_model<moe::models::Reduced<moe::models::DeepSeekV3, 64, 32>>();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
  }
  benchmark::RegisterBenchmark("Copy/D2D_1GiB", BM_Copy)->UseManualTime()->Unit(benchmark::kMicrosecond);
  register_model<moe::models::Mixtral8x7B>();
  register_model<moe::models::DeepSeekV3>();
  register_model<moe::models::Qwen3_30B_A3B>();
  // Real loads: OLMoE's most skewed recorded layer (arxiv, layer 0: max/mean 7.8) and its least
  // (c4, layer 15: 2.5); Mixtral's most skewed (github, layer 15: 1.33).
  register_loads<moe::models::OLMoE_1B_7B>({{"uniform", nullptr, nullptr, 0},
                                            {"arxiv-L0", "olmoe-1b-7b", "arxiv", 0},
                                            {"c4-L15", "olmoe-1b-7b", "c4", 2}});
  register_loads<moe::models::Mixtral8x7B>({{"uniform", nullptr, nullptr, 0},
                                            {"github-L15", "mixtral-8x7b", "github", 2}});
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
