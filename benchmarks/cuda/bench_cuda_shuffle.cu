// GPU benchmarks of the s-TS kernels (moe/kernels/shuffle.cuh): token-table lookup and shuffle
// planning throughput (tokens/s), and the row moves (pack / unpack, GB/s), for 128 (decode),
// 4096 and 16384 (prefill) tokens, 8 and 64 devices.
//
// Token tables:
//   olmoe    the real OLMoE-1B-7B table (vocabulary 50,304): layer 0 of the arxiv counts in
//            MOE_SHARED_DATA_DIR, experts placed contiguously over the devices (64 experts);
//            batches drawn from the profiled occurrences with every 8th token replaced by a
//            seeded uniform id (mostly ids the profile never saw: the id mod D default)
//   dsv2     DeepSeek-V2-sized, synthetic and seeded (labelled): 100,000 ids, 160 experts, top-6,
//            route_synthetic profile as in bench_spec_predictor; experts contiguous over 8 devices,
//            round-robin over 64 (160 does not split into 64 equal blocks); batches from the
//            profiled occurrences
// Rows: bf16, hidden 2048 (OLMoE) and 7168 (DeepSeek-V3 / Kimi-K2), plans from seeded uniform
// predictions.
//
// GPU timings use CUDA events (manual time) on one stream. Counters:
//   tokens/s   tokens per second
//   GB/s       bytes read + written per second (pack / unpack: 2 x rows x hidden x 2 bytes)
//   of_host    GPU tokens/s / the host Predictor + make_shuffle_plan tokens/s measured in the same
//              run on this machine's CPU (HostLookupAndPlan runs first for each configuration)
//   of_copy    GB/s / a device-to-device cudaMemcpyAsync of the same bytes, measured alongside
//
// Without a GPU the program prints a note and exits with 0.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "bench_support.cuh"
#include "moe/kernels/shuffle.cuh"
#include "moe/moe.hpp"

namespace kc = moe::kernels::cuda;
namespace sp = moe::speculative;
using moe::bf16;
using moe::bench::time_gpu;

namespace {

// ---------------------------------------------------------------------------------------------
// Timing helpers (time_gpu is in bench_support.cuh)
// ---------------------------------------------------------------------------------------------

/// Mean milliseconds of `body` (enqueued on `s`) over `reps` runs, after one warm-up.
template <class F>
double mean_ms(cudaStream_t s, F&& body, int reps = 20) {
  body();
  kc::check_cuda(cudaStreamSynchronize(s), "warm-up");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, s);
  for (int i = 0; i < reps; ++i) body();
  cudaEventRecord(b, s);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return static_cast<double>(ms) / reps;
}

benchmark::Counter rate(double per_iteration) {
  return benchmark::Counter(per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

/// One stream for every GPU benchmark (created after the device check in main).
cudaStream_t stream() {
  static cudaStream_t s = [] {
    cudaStream_t x;
    kc::check_cuda(cudaStreamCreate(&x), "cudaStreamCreate");
    return x;
  }();
  return s;
}

__global__ void fill_bits_kernel(std::uint16_t* p, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint64_t z = (i + seed * 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
    z ^= z >> 29;
    p[i] = static_cast<std::uint16_t>(z >> 48);
  }
}

template <class T>
std::vector<T> download(T const* p, std::size_t n) {
  std::vector<T> v(n);
  kc::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (n) kc::check_cuda(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return v;
}

// ---------------------------------------------------------------------------------------------
// Token tables and batches
// ---------------------------------------------------------------------------------------------

constexpr int max_tokens = 16384;

struct TableCase {
  sp::TokenDeviceTable table;
  std::vector<int> pool;  // at least max_tokens token ids, in batch order
  kc::DeviceTokenTable device_table;
  kc::DeviceArray<int> tokens{static_cast<std::size_t>(max_tokens)};  // pool[0, max_tokens) on the GPU
};

std::vector<int> occurrence_pool(moe::profile::LayerCounts const& lc, int top_k, std::uint64_t seed) {
  std::vector<int> pool;
  for (std::size_t r = 0; r < lc.rows(); ++r)
    for (std::int64_t o = 0; o < lc.row_total(r) / top_k; ++o) pool.push_back(lc.tokens[r]);
  std::mt19937_64 rng(seed);
  std::shuffle(pool.begin(), pool.end(), rng);
  return pool;
}

std::unique_ptr<TableCase> make_case(std::string const& model, int devices) {
  auto c = std::make_unique<TableCase>();
  if (model == "olmoe") {
    namespace olmoe = moe::profile::olmoe;
    static auto prof = olmoe::load(MOE_SHARED_DATA_DIR, {"arxiv"}, {.token_counts = true, .only_layer = 0});
    auto const& lc = prof.layer(0);
    c->table = sp::TokenDeviceTable::from_counts(lc, moe::placement::Table::contiguous(olmoe::experts, devices), devices,
                                                 olmoe::vocab);
    c->pool = occurrence_pool(lc, olmoe::top_k, 42);
    std::mt19937_64 rng(43);
    std::uniform_int_distribution<int> any(0, olmoe::vocab - 1);
    for (std::size_t i = 0; i < c->pool.size(); i += 8) c->pool[i] = any(rng);
  } else {
    constexpr int experts = 160, top_k = 6, vocab = 100000;
    static auto prof = moe::profile::synthetic::generate({.vocab = vocab, .experts = experts, .top_k = top_k,
                                                          .topics = 16, .occurrences = 400000, .affinity = 0.7,
                                                          .seed = 1});
    auto const& lc = prof.layer(0);
    auto placement = experts % devices == 0 ? moe::placement::Table::contiguous(experts, devices)
                                            : moe::placement::Table::round_robin(experts, devices);
    c->table = sp::TokenDeviceTable::from_counts(lc, placement, devices, vocab);
    c->pool = occurrence_pool(lc, top_k, 44);
  }
  moe::check(c->pool.size() >= static_cast<std::size_t>(max_tokens), "bench: token pool of ", c->pool.size(),
            " ids is below ", max_tokens);
  c->device_table = kc::DeviceTokenTable(c->table);
  c->tokens.upload(c->pool.data(), static_cast<std::size_t>(max_tokens));
  return c;
}

TableCase& table_case(std::string const& model, int devices) {
  static std::map<std::string, std::unique_ptr<TableCase>> cases;
  auto key = model + "/" + std::to_string(devices);
  auto& c = cases[key];
  if (!c) c = make_case(model, devices);
  return *c;
}

/// The plan's buffers for max_tokens tokens (one workspace per device count, kept for the run).
struct PlanWorkspace {
  kc::DeviceArray<std::byte> ws;
  kc::DeviceShufflePlan p;
  explicit PlanWorkspace(int devices) : ws(kc::shuffle_plan_workspace_bytes(max_tokens, devices)) {
    p = kc::make_device_shuffle_plan(std::span<std::byte>(ws.get(), ws.size()), max_tokens, devices);
  }
};

PlanWorkspace& plan_workspace(int devices) {
  static std::map<int, std::unique_ptr<PlanWorkspace>> w;
  auto& x = w[devices];
  if (!x) x = std::make_unique<PlanWorkspace>(devices);
  return *x;
}

kc::DeviceArray<unsigned>& error_word() {
  static kc::DeviceArray<unsigned> e = [] {
    kc::DeviceArray<unsigned> x(1);
    kc::check_cuda(cudaMemset(x.get(), 0, sizeof(unsigned)), "cudaMemset");
    return x;
  }();
  return e;
}

void require_no_errors(benchmark::State& state) {
  auto v = download(error_word().get(), 1);
  if (v[0] == 0) return;
  state.SkipWithError(("device error word " + std::to_string(v[0])).c_str());
  // Cleared, so that the benchmarks after this one report their own errors only.
  kc::check_cuda(cudaMemset(error_word().get(), 0, sizeof(unsigned)), "cudaMemset (error word)");
}

std::map<std::string, double> g_host;  // host tokens/s per (model, devices, tokens)

std::string key(std::string const& model, int devices, long tokens) {
  return model + "/" + std::to_string(devices) + "/" + std::to_string(tokens);
}

// ---------------------------------------------------------------------------------------------
// Lookup and planning
// ---------------------------------------------------------------------------------------------

/// The host reference on this machine's CPU: Predictor::predict_devices + make_shuffle_plan.
void BM_HostLookupAndPlan(benchmark::State& state, std::string model, int devices) {
  auto& c = table_case(model, devices);
  sp::Predictor pred(c.table);
  auto n = static_cast<std::size_t>(state.range(0));
  std::vector<int> dev(n);
  std::span<int const> batch(c.pool.data(), n);
  double seconds = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    pred.predict_devices(batch, dev);
    auto plan = sp::make_shuffle_plan(dev, devices);
    benchmark::DoNotOptimize(plan.permutation.data());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (seconds > 0) g_host[key(model, devices, state.range(0))] = static_cast<double>(state.iterations()) * n / seconds;
  state.counters["tokens/s"] = rate(static_cast<double>(n));
}

void set_of_host(benchmark::State& state, std::string const& model, int devices, double ms) {
  auto it = g_host.find(key(model, devices, state.range(0)));
  if (it != g_host.end() && ms > 0)
    state.counters["of_host"] = static_cast<double>(state.range(0)) / (ms / 1e3) / it->second;
}

/// predict_devices alone (device + confidence outputs).
void BM_Predict(benchmark::State& state, std::string model, int devices) {
  auto& c = table_case(model, devices);
  auto& w = plan_workspace(devices);
  int n = static_cast<int>(state.range(0));
  kc::DeviceArray<std::int16_t> conf(static_cast<std::size_t>(max_tokens));
  auto body = [&] {
    kc::predict_devices(stream(), c.device_table.view(), c.tokens.get(), n, w.p.keys, conf.get(), error_word().get());
  };
  time_gpu(state, stream(), body);
  require_no_errors(state);
  state.counters["tokens/s"] = rate(n);
  state.counters["table_MB"] = static_cast<double>(c.device_table.bytes()) / 1e6;
}

/// shuffle_plan alone, from device predictions already on the GPU.
void BM_Plan(benchmark::State& state, std::string model, int devices) {
  auto& c = table_case(model, devices);
  auto& w = plan_workspace(devices);
  int n = static_cast<int>(state.range(0));
  kc::DeviceArray<int> pred(static_cast<std::size_t>(max_tokens));
  kc::predict_devices(stream(), c.device_table.view(), c.tokens.get(), n, pred.get(), nullptr, error_word().get());
  auto body = [&] { kc::shuffle_plan(stream(), pred.get(), n, 1, w.p, error_word().get()); };
  time_gpu(state, stream(), body);
  require_no_errors(state);
  state.counters["tokens/s"] = rate(n);
}

/// The fused lookup + plan (what s-TS runs before the gate): the headline tokens/s.
void BM_PredictAndPlan(benchmark::State& state, std::string model, int devices) {
  auto& c = table_case(model, devices);
  auto& w = plan_workspace(devices);
  int n = static_cast<int>(state.range(0));
  kc::DeviceArray<std::int16_t> conf(static_cast<std::size_t>(max_tokens));
  auto body = [&] {
    kc::predict_and_plan(stream(), c.device_table.view(), c.tokens.get(), n, 1, w.p, nullptr, conf.get(),
                         error_word().get());
  };
  time_gpu(state, stream(), body);
  require_no_errors(state);
  state.counters["tokens/s"] = rate(n);
  set_of_host(state, model, devices, mean_ms(stream(), body));
}

/// The same captured once in a CUDA graph and replayed (no per-kernel launch overhead).
void BM_PredictAndPlanGraph(benchmark::State& state, std::string model, int devices) {
  auto& c = table_case(model, devices);
  auto& w = plan_workspace(devices);
  int n = static_cast<int>(state.range(0));
  kc::DeviceArray<std::int16_t> conf(static_cast<std::size_t>(max_tokens));
  auto run = [&] {
    kc::predict_and_plan(stream(), c.device_table.view(), c.tokens.get(), n, 1, w.p, nullptr, conf.get(),
                         error_word().get());
  };
  run();  // outside the capture
  kc::check_cuda(cudaStreamSynchronize(stream()), "warm-up");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  kc::check_cuda(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  run();
  kc::check_cuda(cudaStreamEndCapture(stream(), &graph), "cudaStreamEndCapture");
  kc::check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cudaError_t launched = cudaSuccess;  // the first failed launch, reported after the timing loop
  auto body = [&] {
    cudaError_t e = cudaGraphLaunch(exec, stream());
    if (launched == cudaSuccess) launched = e;
  };
  time_gpu(state, stream(), body);
  if (launched != cudaSuccess) state.SkipWithError((std::string("cudaGraphLaunch: ") + cudaGetErrorString(launched)).c_str());
  require_no_errors(state);
  state.counters["tokens/s"] = rate(n);
  set_of_host(state, model, devices, mean_ms(stream(), body));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// ---------------------------------------------------------------------------------------------
// Row moves
// ---------------------------------------------------------------------------------------------

/// pack_rows (unpack = false) or unpack_rows of n bf16 rows of `hidden`, plan from seeded uniform
/// predictions over `devices` devices.
void BM_Rows(benchmark::State& state, bool unpack) {
  int n = static_cast<int>(state.range(0));
  int hidden = static_cast<int>(state.range(1));
  int devices = static_cast<int>(state.range(2));
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> d(0, devices - 1);
  std::vector<int> pred(static_cast<std::size_t>(n));
  for (auto& x : pred) x = d(rng);
  auto plan = sp::make_shuffle_plan(pred, devices);
  auto const& index = unpack ? plan.inverse : plan.permutation;
  kc::DeviceArray<int> didx(index.size());
  didx.upload(index.data(), index.size());
  auto elems = static_cast<std::size_t>(n) * static_cast<std::size_t>(hidden);
  kc::DeviceArray<bf16> src(elems), dst(elems);
  moe::kernels::cuda::launch(fill_bits_kernel, 1024, 256, 0, stream(), reinterpret_cast<std::uint16_t*>(src.get()),
                             elems, 9);
  kc::check_launch("fill_bits_kernel");
  auto body = [&] {
    if (unpack) {
      kc::unpack_rows<bf16>(stream(), src.get(), n, hidden, didx.get(), dst.get(), error_word().get());
    } else {
      kc::pack_rows<bf16>(stream(), src.get(), n, hidden, didx.get(), dst.get(), error_word().get());
    }
  };
  time_gpu(state, stream(), body);
  require_no_errors(state);
  double bytes = 2.0 * static_cast<double>(elems) * sizeof(bf16);
  state.counters["GB/s"] = rate(bytes / 1e9);
  state.counters["tokens/s"] = rate(n);
  double ms = mean_ms(stream(), body);
  double copy_ms = mean_ms(stream(), [&] {
    cudaMemcpyAsync(dst.get(), src.get(), elems * sizeof(bf16), cudaMemcpyDeviceToDevice, stream());
  });
  if (ms > 0 && copy_ms > 0) state.counters["of_copy"] = copy_ms / ms;
}

void register_all() {
  for (std::string model : {"olmoe", "dsv2"})
    for (int devices : {8, 64}) {
      std::string suffix = "/" + model + "/D" + std::to_string(devices);
      for (long t : {128L, 4096L, 16384L}) {
        benchmark::RegisterBenchmark(("HostLookupAndPlan" + suffix).c_str(), BM_HostLookupAndPlan, model, devices)
            ->Arg(t)
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("Predict" + suffix).c_str(), BM_Predict, model, devices)
            ->Arg(t)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("Plan" + suffix).c_str(), BM_Plan, model, devices)
            ->Arg(t)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("PredictAndPlan" + suffix).c_str(), BM_PredictAndPlan, model, devices)
            ->Arg(t)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("PredictAndPlanGraph" + suffix).c_str(), BM_PredictAndPlanGraph, model, devices)
            ->Arg(t)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  for (bool unpack : {false, true}) {
    auto* b = benchmark::RegisterBenchmark(unpack ? "UnpackRows/bf16" : "PackRows/bf16", BM_Rows, unpack);
    b->ArgNames({"tokens", "hidden", "devices"});
    for (long t : {128L, 4096L, 16384L})
      for (long h : {2048L, 7168L})
        for (long d : {8L, 64L}) b->Args({t, h, d});
    b->UseManualTime()->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_cuda_shuffle: no CUDA device, nothing measured\n");
    return 0;
  }
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
