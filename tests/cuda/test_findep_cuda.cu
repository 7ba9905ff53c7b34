// FinDepCudaExecutor with the CoLocated link (CUDA streams and events, AG and EG on one GPU) against the sequential
// moe::Layer<..., collective::SingleGpu> on the same device inputs and against the host
// moe::reference_forward, for both orders, both pipelines and several r1, r2; bad input.
// FinDepCudaExecutor with the PointToPoint link (AG and EG on different ranks) with several ranks on
// one GPU: in-process threads and a staged device communicator (messages through host memory),
// against moe::reference_forward. Exits 77 (skipped) without a GPU.
//
// Tolerances and near-tie tokens as in test_cuda_layer.cu: the gate GEMM runs per micro-batch here
// and over the whole batch in the layer (and in another order on the host), so a token whose top-k
// choice is within rounding of a tie may legitimately pick another expert. Such tokens are found on
// the host (a tiny perturbation of its logits changes its route) and are exempt from the
// per-token bound; there must be few of them.

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_test_support.cuh"
#include "layer_test_support.cuh"
#include "staged_collective.cuh"
#include "../support/least_max_load.hpp"
#include "../support/load_window_rows.hpp"
#include "moe/layer/paths/device_disaggregated.cuh"
#include "moe/layer/paths/device.cuh"
#include "moe/moe.hpp"
#include "moe/layer/findep_cuda_executor.cuh"
// A sanitizer build compiles only the cases its run selects (tests/emu/cuda.cmake), so that it
// generates no code it never runs: the bf16 comparisons and the executor-only point-to-point worlds
// are compiled in the plain build alone, and under ThreadSanitizer only the cases that order work
// on several streams (short batches, graph capture, NCCL ranks, the load window, the split).

#if defined(MOE_TEST_NCCL)
#include "moe/collective/nccl.hpp"
// The NCCL mode needs several GPUs to run; here it must at least compile with the real collective.
template class moe::schedule::FinDepCudaExecutor<moe::models::Reduced<moe::models::DeepSeekV3, 64, 32, moe::DType::f32>,
                                                    moe::router::SigmoidGroupTopK, moe::schedule::PointToPoint<moe::collective::Nccl>>;
#endif

using moe::test::Device;
using moe::test::DeviceWeights;
using moe::test::fragile_tokens;
using moe::test::random_tokens;
namespace ms = moe::schedule;
namespace kc = moe::kernels::cuda;

namespace {

using MixtralSmallF32 = moe::models::Reduced<moe::models::Mixtral8x7B, 64, 96, moe::DType::f32>;
using DeepSeekSmallF32 = moe::models::Reduced<moe::models::DeepSeekV3, 64, 32, moe::DType::f32>;
using DeepSeekV2SmallBf16 = moe::models::Reduced<moe::models::DeepSeekV2, 136, 72, moe::DType::bf16>;

constexpr double fp32_tol = 1e-4;
constexpr double bf16_tol = 3e-2;

using Errors = moe::test::TokenErrors;

/// Errors of `got` against `ref`; an output never written (poison) or a NaN fails every bound.
template <class T>
Errors compare(std::vector<T> const& got, std::vector<T> const& ref, std::vector<char> const& fragile, int tokens,
               int hidden) {
  Errors c = moe::test::token_errors(got, ref, fragile, tokens, hidden);
  if (!c.finite) c.normwise = c.worst_stable = 1e300;
  return c;
}

void check_errors(Errors const& c, double tolerance, int tokens) {
  INFO("normwise " << c.normwise << ", worst stable token " << c.worst_stable << ", fragile tokens " << c.fragile);
  CHECK(c.worst_stable <= tolerance);
  CHECK(c.fragile * 20 <= std::max(tokens, 20));  // at most 5% near-tie tokens
  if (c.fragile == 0) CHECK(c.normwise <= tolerance);
}

/// Copies y to the host through the caller's stream only (no device-wide synchronisation), so a
/// run() that returned before its last kernel joined the caller's stream would be caught.
template <class T>
std::vector<T> download_on(cudaStream_t st, T const* y, std::size_t n) {
  std::vector<T> out(n);
  kc::check_cuda(cudaMemcpyAsync(out.data(), y, n * sizeof(T), cudaMemcpyDeviceToHost, st), "cudaMemcpyAsync (y)");
  kc::check_cuda(cudaStreamSynchronize(st), "cudaStreamSynchronize");
  return out;
}

std::vector<ms::Config> configs() {
  std::vector<ms::Config> out;
  for (ms::Order order : {ms::Order::aass, ms::Order::asas}) {
    if (moe::test::sanitized) {
      // Under a sanitizer 14 of the 26, per order: one chunk, one micro-batch in chunks, several in
      // chunks, the most chunks (48, one token each) either way, and PPPipe with one micro-batch
      // and with several. The same kernels, and every kind of stream plan.
      for (auto [r1, r2] : {std::pair{1, 1}, {1, 4}, {2, 3}, {8, 6}, {48, 1}})
        out.push_back({ms::Pipeline::findep, order, r1, 1, r2});
      for (int r1 : {1, 3}) out.push_back({ms::Pipeline::pppipe, order, r1, 1, 1});
      continue;
    }
    for (auto [r1, r2] : {std::pair{1, 1}, {1, 4}, {2, 3}, {3, 2}, {4, 3}, {2, 8}, {6, 4}, {8, 6}, {48, 1}})
      out.push_back({ms::Pipeline::findep, order, r1, 1, r2});
    for (int r1 : {1, 2, 3, 8}) out.push_back({ms::Pipeline::pppipe, order, r1, 1, 1});
  }
  return out;
}

/// Every configuration through ONE executor (plan cache, event pool and workspace reused), on a
/// non-default stream, against the sequential single-GPU layer and the host reference.
template <class Model, class Router>
void against_layer_and_reference(int tokens, std::uint64_t seed, double tolerance,
                                 kc::GemmPath gemm = kc::GemmPath::automatic) {
  using L = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential, moe::collective::SingleGpu>;
  using Ex = ms::FinDepCudaExecutor<Model, Router>;
  using T = typename Ex::element_type;
  constexpr moe::ShapeSpec s = Model::spec;
  moe::RandomLayerWeights<T> weights(s, seed);
  auto x = random_tokens<T>(tokens, s.hidden, seed + 1);
  std::vector<T> ref(x.size());
  moe::reference_forward<Router>(s, weights.view(), tokens, x.data(), ref.data());
  auto fragile = fragile_tokens<Router>(s, weights.view(), x, tokens, 1e-5f);
  DeviceWeights<T> dw(s, weights.view());
  Device<T> dx(x), dy(x.size());

  moe::test::Stream st;
  moe::collective::SingleGpu gpu;
  L layer(gpu, moe::placement::Table::contiguous(s.experts, 1), {}, dw.view(), {.max_tokens = tokens, .device = {.gemm = gemm}});
  Device<std::byte> lws(layer.workspace_size());
  layer.run({.tokens = tokens, .x = dx.get(), .y = dy.get(), .stream = st}, lws.bytes());
  auto seq = download_on(st, dy.get(), x.size());
  REQUIRE(layer.errors() == 0u);
  check_errors(compare(seq, ref, fragile, tokens, s.hidden), tolerance, tokens);

  Ex ex(dw.view(), {.max_tokens = tokens, .gemm = gemm});
  Device<std::byte> ws(ex.workspace_size());
  ws.poison();
  for (ms::Config const& c : configs()) {
    INFO(ms::pipeline_name(c.pipeline) << " " << ms::order_name(c.order) << " r1 " << c.r1 << " r2 " << c.r2
                                       << ", shared experts " << s.shared_experts);
    dy.poison();
    kc::check_cuda(cudaDeviceSynchronize(), "poison");
    ex.run({.tokens = tokens, .x = dx.get(), .y = dy.get(), .stream = st}, c, ws.bytes());
    auto y = download_on(st, dy.get(), x.size());
    REQUIRE(ex.errors() == 0u);
    CHECK(ex.plan().config == c);
    check_errors(compare(y, seq, fragile, tokens, s.hidden), tolerance, tokens);
    check_errors(compare(y, ref, fragile, tokens, s.hidden), tolerance, tokens);
  }
}

}  // namespace

#if !defined(MOE_TEST_TSAN)
TEST_CASE("FinDEP CUDA executor equals the single-GPU layer and the host reference (fp32)", "[cuda][findep]") {
  // Mixtral routing: no shared experts (no S operations). DeepSeek-V3 routing: shared experts.
  against_layer_and_reference<MixtralSmallF32, moe::router::SoftmaxTopK>(48, 21, fp32_tol);
  against_layer_and_reference<DeepSeekSmallF32, moe::router::SigmoidGroupTopK>(48, 22, fp32_tol);
}
#endif

#if !defined(MOE_TEST_ASAN) && !defined(MOE_TEST_TSAN)
TEST_CASE("FinDEP CUDA executor equals the single-GPU layer and the host reference (bf16)", "[cuda][findep]") {
  against_layer_and_reference<DeepSeekV2SmallBf16, moe::router::GroupLimitedTopK>(96, 23, bf16_tol);
}
#endif

// The portable GEMM kernel as well (the case above runs the Hopper kernel on an sm_90a build). A
// case of its own, so that a parallel test run can spread the two longest comparisons.
#if !defined(MOE_TEST_ASAN) && !defined(MOE_TEST_TSAN)
TEST_CASE("FinDEP CUDA executor equals the single-GPU layer and the host reference (bf16, portable GEMM)",
          "[cuda][findep]") {
  against_layer_and_reference<DeepSeekV2SmallBf16, moe::router::GroupLimitedTopK>(96, 24, bf16_tol,
                                                                                 kc::GemmPath::portable);
}
#endif

TEST_CASE("FinDEP CUDA executor: fewer tokens than max_tokens, and no tokens", "[cuda][findep]") {
  using Model = DeepSeekSmallF32;
  using Router = moe::router::SigmoidGroupTopK;
  constexpr moe::ShapeSpec s = Model::spec;
  moe::RandomLayerWeights<float> weights(s, 31);
  DeviceWeights<float> dw(s, weights.view());
  ms::FinDepCudaExecutor<Model, Router> ex(dw.view(), {.max_tokens = 64});
  Device<std::byte> ws(ex.workspace_size());
  int tokens = 12;
  auto x = random_tokens<float>(tokens, s.hidden, 32);
  std::vector<float> ref(x.size());
  moe::reference_forward<Router>(s, weights.view(), tokens, x.data(), ref.data());
  auto fragile = fragile_tokens<Router>(s, weights.view(), x, tokens, 1e-5f);
  Device<float> dx(x), dy(x.size());
  dy.poison();
  ex.run({.tokens = tokens, .x = dx.get(), .y = dy.get()}, {ms::Pipeline::findep, ms::Order::aass, 2, 1, 3}, ws.bytes());
  check_errors(compare(dy.download(), ref, fragile, tokens, s.hidden), fp32_tol, tokens);
  // No tokens: nothing is enqueued, nothing is written.
  dy.poison();
  ex.run({.tokens = 0, .x = nullptr, .y = nullptr}, {ms::Pipeline::findep, ms::Order::asas, 4, 1, 2}, ws.bytes());
  for (float v : dy.download()) CHECK(std::isnan(v));
}

TEST_CASE("FinDEP CUDA executor run can be captured in a CUDA graph and replayed", "[cuda][findep][graph]") {
  using Model = DeepSeekSmallF32;
  using Router = moe::router::SigmoidGroupTopK;
  constexpr moe::ShapeSpec s = Model::spec;
  moe::RandomLayerWeights<float> weights(s, 41);
  DeviceWeights<float> dw(s, weights.view());
  // Under a sanitizer 16 tokens: the same 8 chunks of the same streams and events, in half the rows.
  int const tokens = moe::test::full_or(32, 16);
  ms::FinDepCudaExecutor<Model, Router> ex(dw.view(), {.max_tokens = tokens});
  Device<std::byte> ws(ex.workspace_size());
  auto x = random_tokens<float>(tokens, s.hidden, 42);
  Device<float> dx(x), direct(x.size()), replay(x.size());
  ms::Config c{ms::Pipeline::findep, ms::Order::asas, 2, 1, 4};
  moe::test::Stream st;
  ex.run({.tokens = tokens, .x = dx.get(), .y = direct.get(), .stream = st}, c, ws.bytes());
  st.synchronize("direct run");
  replay.poison();
  ws.poison();
  moe::test::CapturedGraph graph(
      st, [&] { ex.run({.tokens = tokens, .x = dx.get(), .y = replay.get(), .stream = st}, c, ws.bytes()); });
  for (int i = 0; i < 2; ++i) graph.launch(st);
  st.synchronize("graph replay");
  auto a = direct.download(), b = replay.download();
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

#if !defined(MOE_TEST_TSAN)
TEST_CASE("FinDEP CUDA executor rejects bad input", "[cuda][findep][bad-input]") {
  using Model = MixtralSmallF32;
  using Ex = ms::FinDepCudaExecutor<Model, moe::router::SoftmaxTopK>;
  constexpr moe::ShapeSpec s = Model::spec;
  moe::RandomLayerWeights<float> weights(s, 51);
  DeviceWeights<float> dw(s, weights.view());
  CHECK_THROWS_WITH(Ex(dw.view(), {.max_tokens = 0}), Catch::Contains("max_tokens must be positive"));
  CHECK_THROWS_WITH(Ex(dw.view(), {.max_tokens = 8, .max_chunks = 0}), Catch::Contains("max_chunks must be at least 1"));
  CHECK_THROWS_WITH(Ex(dw.view(), {.max_tokens = 8, .gemm = kc::GemmPath::hopper}), Catch::Contains("GemmPath::hopper"));
  auto missing = dw.view();
  std::vector<moe::ExpertWeights<float>> holes(dw.experts);
  holes[3] = {};
  missing.experts = holes;
  CHECK_THROWS_WITH(Ex(missing, {.max_tokens = 8}), Catch::Contains("expert 3"));

  Ex ex(dw.view(), {.max_tokens = 24, .max_chunks = 8});
  Device<std::byte> ws(ex.workspace_size());
  Device<float> x(24 * 64), y(24 * 64);
  auto run = [&](int tokens, ms::Config c) {
    ex.run({.tokens = tokens, .x = x.get(), .y = y.get()}, c, ws.bytes());
  };
  using P = ms::Pipeline;
  using O = ms::Order;
  CHECK_THROWS_WITH(run(12, {P::findep, O::aass, 0, 1, 1}), Catch::Contains("r1 (micro-batches) must be at least 1"));
  CHECK_THROWS_WITH(run(12, {P::findep, O::aass, 2, 1, 0}), Catch::Contains("r2 (token chunks) must be at least 1"));
  CHECK_THROWS_WITH(run(12, {P::findep, O::aass, 5, 1, 1}), Catch::Contains("r1 = 5 does not divide the 12 tokens"));
  CHECK_THROWS_WITH(run(12, {P::findep, O::asas, 2, 1, 4}),
                    Catch::Contains("r2 = 4 does not divide the 6 tokens of a micro-batch"));
  CHECK_THROWS_WITH(run(12, {P::pppipe, O::asas, 2, 1, 2}), Catch::Contains("PPPipe has no token chunks"));
  CHECK_THROWS_WITH(run(24, {P::findep, O::asas, 4, 1, 3}), Catch::Contains("exceed max_chunks = 8"));
  CHECK_THROWS_WITH(run(25, {P::findep, O::asas, 1, 1, 1}), Catch::Contains("max_tokens"));
  CHECK_THROWS_WITH(run(-1, {P::findep, O::asas, 1, 1, 1}), Catch::Contains("negative token count"));
  CHECK_THROWS_WITH(ex.run({.tokens = 4, .x = nullptr, .y = y.get()}, {P::findep, O::asas, 1, 1, 1}, ws.bytes()),
                    Catch::Contains("null"));
  CHECK_THROWS_WITH(ex.run({.tokens = 4, .x = x.get() + 1, .y = y.get()}, {P::findep, O::asas, 1, 1, 1}, ws.bytes()),
                    Catch::Contains("16-byte aligned"));
  CHECK_THROWS_WITH(
      ex.run({.tokens = 4, .x = x.get(), .y = y.get()}, {P::findep, O::asas, 1, 1, 1}, ws.bytes().first(ws.size() / 2)),
      Catch::Contains("workspace"));
  // can_implement says the same without throwing.
  auto st = ex.can_implement({.tokens = 12, .x = x.get(), .y = y.get()}, {P::findep, O::aass, 5, 1, 1});
  CHECK_FALSE(st.ok);
  CHECK(st.message.find("does not divide") != std::string::npos);
  CHECK(ex.can_implement({.tokens = 12, .x = x.get(), .y = y.get()}, {P::findep, O::aass, 2, 1, 3}).ok);
}
#endif

// -----------------------------------------------------------------------------------------------
// AG and EG on different ranks: FinDepCudaExecutor<..., PointToPoint> over moe::test::StagedDevice (send / recv
// staged through host memory, staged_collective.cuh).
// -----------------------------------------------------------------------------------------------
namespace {

/// How p2p_world runs a configuration: through one point-to-point FinDepCudaExecutor per rank for all of them,
/// or through a moe::Layer (device disaggregated path) per configuration (its schedule policy is FinDep or PPPipe
/// as the configuration says) made from one communicator (the layer duplicates it) or from two.
enum class Via { executor, layer, layer_two_comms };

/// One forward pass of `c` through a Layer made for it; the rank's device error bits. With
/// `records`, the layer keeps its record counts on the device (LayerOptions::device.count_records)
/// and `records` gets them after the pass: records_local, records_remote, records_received.
/// Runs on a rank's thread, so it reports through `role_ok` rather than Catch2 (not thread-safe).
template <class Sched, class Model, class Router, class Comm, class T>
unsigned through_layer(Comm& a2e, Comm& e2a, Via via, int ag, moe::placement::Table const& on_eg,
                       moe::replication::Table const& replicas, moe::LayerWeights<T> weights, ms::Config const& c,
                       int tokens, int max_tokens, T const* x, T* y, cudaStream_t st, char& role_ok,
                       std::array<long long, 3>* records = nullptr) {
  using L = moe::Layer<Model, Router, moe::placement::Table, moe::replication::Table, Sched, Comm>;
  static_assert(std::is_same_v<typename L::element_type, T>);
  static_assert(L::path == moe::ExecutionPath::device_disaggregated);
  typename L::Options options{.max_tokens = max_tokens, .schedule = Sched::from(c, ag)};
  options.device.count_records = records != nullptr;
  std::optional<L> layer;
  if (via == Via::layer)
    layer.emplace(a2e, on_eg, replicas, weights, options);
  else
    layer.emplace(a2e, e2a, on_eg, replicas, weights, options);
  role_ok = role_ok && layer->is_attention_rank() == (a2e.rank() < ag);
  Device<std::byte> ws(layer->workspace_size());
  ws.poison();
  layer->run({.tokens = tokens, .x = x, .y = y, .stream = st}, ws.bytes());
  kc::check_cuda(cudaStreamSynchronize(st), "rank run (layer)");
  if (records) {
    role_ok = role_ok && layer->stats().records_remote == 0 && layer->stats().records_received == 0;  // not read yet
    auto const& got = layer->read_record_counts();
    *records = {got.records_local, got.records_remote, got.records_received};
  }
  return layer->errors();
}

/// The weights a rank passes to a disaggregated executor or layer: every expert of `all` on an AG
/// rank (rank < ag), on an EG rank those its EG index holds a copy of, the rest empty (`view`
/// points into `held`).
template <class T>
struct RankWeights {
  std::vector<moe::ExpertWeights<T>> held;
  moe::LayerWeights<T> view;
};
template <class T>
RankWeights<T> rank_weights(moe::LayerWeights<T> const& all, moe::replication::Table const& table, int rank, int ag) {
  RankWeights<T> r{{all.experts.begin(), all.experts.end()}, all};
  if (rank >= ag)
    for (std::size_t e = 0; e < r.held.size(); ++e)
      if (!table.holds(static_cast<int>(e), 0, rank - ag)) r.held[e] = {};
  r.view.experts = r.held;
  return r;
}

/// The replica table of p2p_world over `eg` EG indices (seeded layout, not data): one copy per
/// expert, or with `replicated` expert 0 on every EG index and every third expert also on the next
/// index, listed in an order that differs from the placement's for some.
moe::replication::Table p2p_replicas(moe::placement::Table const& on_eg, int eg, bool replicated) {
  std::vector<std::vector<int>> copies(static_cast<std::size_t>(on_eg.experts()));
  for (int e = 0; e < on_eg.experts(); ++e) {
    int p = on_eg.rank_of(e);
    auto& c = copies[static_cast<std::size_t>(e)];
    if (replicated && e == 0)
      for (int g = eg - 1; g >= 0; --g) c.push_back(g);
    else if (replicated && e % 3 == 0 && eg > 1)
      c = e % 2 ? std::vector<int>{(p + 1) % eg, p} : std::vector<int>{p, (p + 1) % eg};
    else
      c = {p};
  }
  return moe::replication::Table(std::move(copies));
}

/// `N` ranks, `ag` of them AG ranks with `tokens` tokens each; every configuration (through one
/// executor per rank, or one Layer per configuration and rank: `via`); every AG
/// rank's output against the host reference on its tokens. With `replicated`, experts have copies
/// on several EG ranks (p2p_replicas) and each EG rank gets only the weights of the experts it
/// holds a copy of, so a token sent to a rank without the expert raises a device error.
/// `max_tokens` (0: `tokens`) sizes the executors' buffers; above `tokens`, the chunk regions are
/// laid out for fewer tokens than the workspace holds.
template <int N, class Model, class Router>
void p2p_world(int ag, int tokens, std::uint64_t seed, double tolerance, Via via = Via::executor,
               bool replicated = false, int max_tokens = 0) {
  if (max_tokens == 0) max_tokens = tokens;
  using Ex = ms::FinDepCudaExecutor<Model, Router, ms::PointToPoint<moe::test::StagedDevice<N>>>;
  using T = typename Ex::element_type;
  constexpr moe::ShapeSpec s = Model::spec;
  auto h = static_cast<std::size_t>(s.hidden);
  int total = ag * tokens;
  moe::RandomLayerWeights<T> weights(s, seed);
  auto x = random_tokens<T>(total, s.hidden, seed + 1);
  std::vector<T> ref(x.size());
  std::vector<int> ids(static_cast<std::size_t>(total) * static_cast<std::size_t>(s.top_k));
  std::vector<float> gw(ids.size());
  moe::reference_forward<Router>(s, weights.view(), total, x.data(), ref.data(), ids, gw);
  auto fragile = fragile_tokens<Router>(s, weights.view(), x, total, 1e-5f);
  DeviceWeights<T> dw(s, weights.view());
  Device<T> dx(x), dy(x.size());
  dy.poison();
  auto on_eg = moe::placement::Table::round_robin(s.experts, N - ag);
  auto replicas = p2p_replicas(on_eg, N - ag, replicated);
  std::vector<ms::Config> cfgs{{ms::Pipeline::findep, ms::Order::aass, 1, 1, 1}, {ms::Pipeline::findep, ms::Order::aass, 2, 1, 3},
                               {ms::Pipeline::findep, ms::Order::asas, 3, 1, 2}, {ms::Pipeline::findep, ms::Order::asas, 4, 1, 3},
                               {ms::Pipeline::findep, ms::Order::aass, 2, 1, 4}, {ms::Pipeline::pppipe, ms::Order::aass, 3, 1, 1},
                               {ms::Pipeline::pppipe, ms::Order::asas, 2, 1, 1}};
  // Through a Layer, every pass keeps its record counts (LayerOptions::device.count_records); they
  // are checked against counts made here from the reference's routes and the copy rule, unless a
  // token's route is fragile (its device route may differ; the seeds below have none, checked).
  bool exact_routes = std::count(fragile.begin(), fragile.end(), 1) == 0;
  std::vector<std::vector<std::array<long long, 3>>> records(cfgs.size(), std::vector<std::array<long long, 3>>(N));
  std::vector<Errors> result(cfgs.size());
  std::vector<unsigned> device_errors(N, 0);
  std::vector<char> role_ok(N, 1);  // each layer knew whether its rank is an AG rank
  moe::collective::run_in_process<N>([&](moe::collective::InProcess<N>& host) {
    moe::test::StagedDevice<N> a2e(host), e2a(host);
    int rank = host.rank();
    auto mine_w = rank_weights(dw.view(), replicas, rank, ag);
    auto const& view = mine_w.view;
    std::optional<Ex> ex;
    std::optional<Device<std::byte>> ws;
    if (via == Via::executor) {
      ex.emplace(a2e, e2a, ag, on_eg, view, ms::FinDepCudaOptions{.max_tokens = max_tokens}, replicas);
      ws.emplace(ex->workspace_size());
      ws->poison();
    }
    moe::test::Stream st;
    for (std::size_t q = 0; q < cfgs.size(); ++q) {
      bool is_ag = rank < ag;
      std::size_t first = is_ag ? static_cast<std::size_t>(rank) * static_cast<std::size_t>(tokens) * h : 0;
      T const* xr = is_ag ? dx.get() + first : nullptr;
      T* yr = is_ag ? dy.get() + first : nullptr;
      unsigned& errors = device_errors[static_cast<std::size_t>(rank)];
      if (via == Via::executor) {
        ex->run({.tokens = tokens, .x = xr, .y = yr, .stream = st}, cfgs[q], ws->bytes());
        st.synchronize("rank run");
        errors |= ex->errors();
      } else if (cfgs[q].pipeline == ms::Pipeline::findep) {
        errors |= through_layer<ms::FinDep, Model, Router>(a2e, e2a, via, ag, on_eg, replicas, view, cfgs[q], tokens,
                                                           max_tokens, xr, yr, st, role_ok[static_cast<std::size_t>(rank)],
                                                           &records[q][static_cast<std::size_t>(rank)]);
      } else {
        errors |= through_layer<ms::PPPipe, Model, Router>(a2e, e2a, via, ag, on_eg, replicas, view, cfgs[q], tokens,
                                                           max_tokens, xr, yr, st, role_ok[static_cast<std::size_t>(rank)],
                                                           &records[q][static_cast<std::size_t>(rank)]);
      }
      host.barrier();
      if (rank == 0) {
        result[q] = compare(dy.download(), ref, fragile, total, s.hidden);
        dy.poison();
        kc::check_cuda(cudaDeviceSynchronize(), "poison");
      }
      host.barrier();
    }
  });
  for (std::size_t q = 0; q < cfgs.size(); ++q) {
    INFO(N << " ranks, " << ag << " AG, " << ms::pipeline_name(cfgs[q].pipeline) << " " << ms::order_name(cfgs[q].order)
           << " r1 " << cfgs[q].r1 << " r2 " << cfgs[q].r2 << ", shared experts " << s.shared_experts
           << (via == Via::executor ? ", executor" : via == Via::layer ? ", layer (one communicator)" : ", layer (two)")
           << (replicated ? ", replicated experts" : "") << ", max_tokens " << max_tokens);
    check_errors(result[q], tolerance, total);
    if (via == Via::executor) continue;
    REQUIRE(exact_routes);
        auto want = moe::test::disaggregated_records(ids, static_cast<std::size_t>(s.top_k), ag, tokens, replicas.replicas(),
                                                 N - ag);
    for (int r = 0; r < N; ++r) {
      INFO("rank " << r << ": records local, remote, received");
      CHECK(records[q][static_cast<std::size_t>(r)] == moe::test::disaggregated_rank_records(want, ag, r));
    }
  }
  for (unsigned e : device_errors) CHECK(e == 0u);
  for (char ok : role_ok) CHECK(ok);
}

}  // namespace

#if !defined(MOE_TEST_ASAN) && !defined(MOE_TEST_TSAN)
TEST_CASE("FinDEP CUDA executor with AG and EG on different ranks (staged point-to-point, one GPU)",
          "[cuda][findep][p2p]") {
  using moe::router::SigmoidGroupTopK;
  using moe::router::SoftmaxTopK;
  p2p_world<2, DeepSeekSmallF32, SigmoidGroupTopK>(1, 24, 61, fp32_tol);
  if (!moe::test::sanitized) {  // under a sanitizer: one shape per model, rank count and path
    p2p_world<3, DeepSeekSmallF32, SigmoidGroupTopK>(1, 24, 62, fp32_tol);
    p2p_world<3, DeepSeekSmallF32, SigmoidGroupTopK>(2, 24, 63, fp32_tol);
  }
  p2p_world<4, MixtralSmallF32, SoftmaxTopK>(2, 24, 64, fp32_tol);
  p2p_world<3, DeepSeekV2SmallBf16, moe::router::GroupLimitedTopK>(2, 48, 65, bf16_tol);
  // Fewer tokens than the executors were built for.
  p2p_world<3, DeepSeekSmallF32, SigmoidGroupTopK>(1, 24, 66, fp32_tol, Via::executor, false, 40);
  p2p_world<4, MixtralSmallF32, SoftmaxTopK>(2, 24, 67, fp32_tol, Via::layer, false, 64);
}
#endif

#if !defined(MOE_TEST_TSAN)
TEST_CASE("the disaggregated Layer over a device communicator (staged point-to-point, one GPU)",
          "[cuda][findep][p2p][layer]") {
  using moe::router::SigmoidGroupTopK;
  using moe::router::SoftmaxTopK;
  p2p_world<3, DeepSeekSmallF32, SigmoidGroupTopK>(2, 24, 81, fp32_tol, Via::layer);
  p2p_world<4, MixtralSmallF32, SoftmaxTopK>(1, 24, 82, fp32_tol, Via::layer_two_comms);
  // bf16 under a sanitizer on 24 tokens, the fewest that every configuration divides: the same
  // kernels on half the rows.
  p2p_world<3, DeepSeekV2SmallBf16, moe::router::GroupLimitedTopK>(1, moe::test::full_or(48, 24), 83, bf16_tol,
                                                                   Via::layer);
}
#endif

namespace {

/// LayerOptions::live.window on the device disaggregated Layer: `N` staged ranks (`ag` AG ranks of
/// 12 tokens), two passes on different tokens, then every rank's window (load_window() waits for
/// the last pass's counts) against counts made on the host from the router, token by token, and
/// the documented copy rule: token t of AG rank p uses copy (p + t) mod n of an expert's n copies
/// (p2p_replicas with replicated experts). Tokens whose route is fragile would make the host's
/// routes differ from the device's; the seeds have none (checked). A first pass, captured into a
/// CUDA graph, must be refused on every rank and count nothing.
template <int N, class Model, class Router>
void p2p_window(int ag, std::uint64_t seed) {
  using Comm = moe::test::StagedDevice<N>;
  using L = moe::Layer<Model, Router, moe::placement::Table, moe::replication::Table, ms::FinDep, Comm>;
  static_assert(L::path == moe::ExecutionPath::device_disaggregated && L::counts_loads && L::can_replan);
  using T = typename L::element_type;
  constexpr moe::ShapeSpec s = Model::spec;
  constexpr int tokens = 12, passes = 2;
  auto h = static_cast<std::size_t>(s.hidden), k = static_cast<std::size_t>(s.top_k);
  auto E = static_cast<std::size_t>(s.experts);
  moe::RandomLayerWeights<T> weights(s, seed);
  auto on_eg = moe::placement::Table::round_robin(s.experts, N - ag);
  auto replicas = p2p_replicas(on_eg, N - ag, true);
  std::vector<std::vector<T>> x;
  std::vector<std::vector<long long>> want;
  std::vector<float> logits(static_cast<std::size_t>(ag * tokens) * E), gates(static_cast<std::size_t>(ag * tokens) * k);
  std::vector<int> ids(gates.size());
  std::span<float const> bias;
  if (weights.view().router_bias) bias = {weights.view().router_bias, E};
  for (int i = 0; i < passes; ++i) {
    x.push_back(random_tokens<T>(ag * tokens, s.hidden, seed + 1 + static_cast<std::uint64_t>(i)));
    auto fragile = fragile_tokens<Router>(s, weights.view(), x.back(), ag * tokens, 1e-5f);
    REQUIRE(std::count(fragile.begin(), fragile.end(), 1) == 0);
    moe::kernels::host::gate_logits(x.back().data(), ag * tokens, s.hidden, weights.view().router, s.experts, logits.data());
    moe::router::route_all<Router>(s, logits, bias, ag * tokens, ids, gates);
    want.push_back(moe::test::disaggregated_row(ids, k, ag, tokens, replicas.replicas(), N));
  }
  DeviceWeights<T> dw(s, weights.view());
  std::vector<Device<T>> dx;
  for (auto const& xi : x) dx.emplace_back(xi);
  Device<T> dy(static_cast<std::size_t>(ag * tokens) * h);
  std::vector<std::vector<std::vector<long long>>> seen(N);
  std::vector<long long> last_max(N, -1);
  std::vector<double> last_mean(N, -1);
  std::vector<std::string> refused(N);
  moe::collective::run_in_process<N>([&](moe::collective::InProcess<N>& host) {
    Comm a2e(host), e2a(host);
    int rank = host.rank();
    bool is_ag = rank < ag;
    auto mine_w = rank_weights(dw.view(), replicas, rank, ag);
    auto const& view = mine_w.view;
    L layer(a2e, e2a, on_eg, replicas, view,
            {.max_tokens = tokens, .schedule = ms::FinDep{ag, ms::Order::aass, 2, 2}, .live = {.window = 3}});
    // Plans are over the expert group: live.nodes splits its N - ag ranks, not the N (refused
    // before any collective call, so one rank may ask alone).
    if (rank == 0)
      CHECK_THROWS_WITH(L(a2e, e2a, on_eg, replicas, view,
                          {.max_tokens = tokens, .schedule = ms::FinDep{ag, ms::Order::aass, 2, 2},
                           .live = {.window = 3, .spare_slots = 2, .nodes = N}}),
                        Catch::Contains("must divide the " + std::to_string(N - ag) + " expert-group ranks"));
    Device<std::byte> ws(layer.workspace_size());
    moe::test::Stream st;
    std::size_t first = is_ag ? static_cast<std::size_t>(rank) * tokens * h : 0;
    // A pass captured into a CUDA graph is refused on every rank (the window needs the ranks'
    // agreement, which a capture skips) and counts nothing: the window below holds two passes. The
    // ranks share device 0: no rank copies through the legacy stream while another captures.
    host.barrier();
    refused[static_cast<std::size_t>(rank)] = moe::test::error_under_capture(st, [&] {
      layer.run({.tokens = tokens, .x = is_ag ? dx[0].get() + first : nullptr, .y = is_ag ? dy.get() + first : nullptr,
                 .stream = st},
                ws.bytes());
    });
    host.barrier();
    for (int i = 0; i < passes; ++i)
      layer.run({.tokens = tokens, .x = is_ag ? dx[static_cast<std::size_t>(i)].get() + first : nullptr,
                 .y = is_ag ? dy.get() + first : nullptr, .stream = st},
                ws.bytes());
    auto const& w = layer.load_window();
    seen[static_cast<std::size_t>(rank)] = moe::test::window_rows(w);
    last_max[static_cast<std::size_t>(rank)] = layer.stats().rank_load_max;
    last_mean[static_cast<std::size_t>(rank)] = layer.stats().rank_load_mean;
    st.synchronize("window");
  });
  for (int r = 0; r < N; ++r) {
    INFO("rank " << r << " of " << N << ", " << ag << " AG");
    CHECK_THAT(refused[static_cast<std::size_t>(r)],
               Catch::Contains("moe::Layer (device disaggregated)") && Catch::Contains("CUDA graph capture"));
    REQUIRE(seen[static_cast<std::size_t>(r)].size() == passes);
    for (int i = 0; i < passes; ++i)
      CHECK(seen[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)] == want[static_cast<std::size_t>(i)]);
    CHECK(last_max[static_cast<std::size_t>(r)] ==
          *std::max_element(want.back().begin() + static_cast<std::ptrdiff_t>(E), want.back().end()));
    // the mean over the EG ranks (Layer::plan_ranks()), the AG ranks' zero columns left out
    long long eg_pairs = 0;
    for (int g = ag; g < N; ++g) eg_pairs += want.back()[E + static_cast<std::size_t>(g)];
    CHECK(last_mean[static_cast<std::size_t>(r)] == static_cast<double>(eg_pairs) / (N - ag));
  }
}

}  // namespace

TEST_CASE("device disaggregated Layer keeps a load window (LayerOptions::live.window)",
          "[cuda][findep][p2p][layer][live]") {
  p2p_window<3, DeepSeekSmallF32, moe::router::SigmoidGroupTopK>(1, 91);
  p2p_window<4, MixtralSmallF32, moe::router::SoftmaxTopK>(2, 92);
}

namespace {

/// The device disaggregated Layer on `N` staged ranks (`ag` AG ranks): every rank passes 12 tokens
/// (max_tokens) except rank `bad`, which passes 13. Returns each rank's error message ("" if it
/// returned); the test needs every rank to throw and none to wait for the bad one.
template <int N>
std::vector<std::string> disaggregated_bad_rank(int ag, int bad, bool other_tables = false) {
  using Model = MixtralSmallF32;
  using L = moe::Layer<Model, moe::router::SoftmaxTopK, moe::placement::Table, moe::replication::None, ms::FinDep,
                       moe::test::StagedDevice<N>>;
  constexpr moe::ShapeSpec s = Model::spec;
  moe::RandomLayerWeights<float> weights(s, 77);
  DeviceWeights<float> dw(s, weights.view());
  std::vector<std::string> what(N);
  moe::collective::run_in_process<N>([&](moe::collective::InProcess<N>& host) {
    moe::test::StagedDevice<N> comm(host);
    int rank = host.rank();
    auto placement = moe::placement::Table::round_robin(s.experts, N - ag).ranks();
    if (other_tables && rank == bad) std::swap(placement[0], placement[1]);
    L layer(comm, moe::placement::Table(placement), {}, dw.view(),
            {.max_tokens = 12, .schedule = {.ag = ag, .r1 = 2, .r2 = 2}});
    Device<std::byte> ws(layer.workspace_size());
    Device<float> x(13 * 64), y(13 * 64);
    moe::test::Stream st;
    bool sends_rows = rank < ag;
    try {
      layer.run({.tokens = rank == bad && !other_tables ? 13 : 12, .x = sends_rows ? x.get() : nullptr,
                 .y = sends_rows ? y.get() : nullptr, .stream = st},
                ws.bytes());
      st.synchronize("run");
    } catch (moe::Error const& e) {
      what[static_cast<std::size_t>(rank)] = e.what();
    }
  });
  return what;
}

}  // namespace

#if !defined(MOE_TEST_TSAN)
TEST_CASE("device disaggregated Layer: one rank's bad arguments make every rank throw the same error",
          "[cuda][findep][p2p][layer][agreement]") {
  // The bad rank an AG rank or an EG rank (which passes an AG rank's token count).
  for (auto [ag, bad] : {std::pair{1, 0}, {1, 2}, {2, 1}}) {
    INFO("3 ranks, " << ag << " AG, bad rank " << bad);
    auto what = disaggregated_bad_rank<3>(ag, bad);
    for (auto const& m : what) CHECK(m == what[0]);
    CHECK_THAT(what[0], Catch::Contains(moe::detail::concat("rank ", bad, " rejected its arguments")) &&
                            Catch::Contains("13 tokens"));
    if (3 - ag < 2) continue;  // one expert rank: no other placement
    // The same rank built with another placement over the expert group, every pass good.
    what = disaggregated_bad_rank<3>(ag, bad, true);
    for (auto const& m : what) CHECK(m == what[0]);
    CHECK_THAT(what[0], Catch::Contains(moe::detail::concat(
                            "every rank must build its layer with the same placement and replica tables: rank ",
                            bad == 0 ? 1 : bad, "'s differ from rank 0's")));
  }
  {
    INFO("4 ranks, 2 AG, bad rank 3");
    auto what = disaggregated_bad_rank<4>(2, 3);
    for (auto const& m : what) CHECK(m == what[0]);
    CHECK_THAT(what[0], Catch::Contains("rank 3 rejected its arguments") && Catch::Contains("13 tokens"));
    what = disaggregated_bad_rank<4>(2, 3, true);
    for (auto const& m : what) CHECK(m == what[0]);
    CHECK_THAT(what[0], Catch::Contains("same placement and replica tables: rank 3's differ from rank 0's"));
  }
}
#endif

#if defined(MOE_TEST_NCCL)
namespace {

/// Tokens per AG rank of the NCCL worlds below: under a sanitizer 12, the fewest that each of their
/// configurations divides (FinDEP r1 2 r2 3, r1 3 r2 2, r1 2 r2 2, PPPipe r1 2): the same streams,
/// events and NCCL calls on half the rows.
constexpr int nccl_tokens = moe::test::full_or(24, 12);

/// The point-to-point executor through collective::Nccl: `N` ranks, one thread, one device and one
/// stream each, two communicators (A2E, E2A); `ag` AG ranks with `tokens` tokens each hold their
/// tokens on their own device, EG ranks the weights of their experts. Every AG rank's output,
/// gathered on the host, against the host reference, for FinDEP and PPPipe configurations. With
/// `via` a layer mode, each configuration runs through a device disaggregated moe::Layer instead,
/// made from the A2E communicator alone (the layer splits its own E2A one with
/// `Nccl::duplicate`) or from both.
template <int N, class Model, class Router>
void p2p_nccl_world(int ag, int tokens, std::uint64_t seed, double tolerance, Via via = Via::executor) {
  using Ex = ms::FinDepCudaExecutor<Model, Router, ms::PointToPoint<moe::collective::Nccl>>;
  using T = typename Ex::element_type;
  constexpr moe::ShapeSpec s = Model::spec;
  auto h = static_cast<std::size_t>(s.hidden);
  int total = ag * tokens;
  moe::RandomLayerWeights<T> weights(s, seed);
  auto x = random_tokens<T>(total, s.hidden, seed + 1);
  std::vector<T> ref(x.size()), y(x.size());
  moe::reference_forward<Router>(s, weights.view(), total, x.data(), ref.data());
  auto fragile = fragile_tokens<Router>(s, weights.view(), x, total, 1e-5f);
  auto on_eg = moe::placement::Table::round_robin(s.experts, N - ag);
  std::vector<ms::Config> cfgs{{ms::Pipeline::findep, ms::Order::aass, 2, 1, 3},
                               {ms::Pipeline::findep, ms::Order::asas, 3, 1, 2},
                               {ms::Pipeline::pppipe, ms::Order::aass, 2, 1, 1}};
  std::vector<Errors> result(cfgs.size());
  std::vector<std::string> failures(N);
  std::vector<unsigned> device_errors(N, 0);
  std::vector<char> role_ok(N, 1);  // each layer knew whether its rank is an AG rank
  auto one_copy = p2p_replicas(on_eg, N - ag, false);
  auto id_a2e = moe::collective::Nccl::unique_id(), id_e2a = moe::collective::Nccl::unique_id();
  moe::collective::run_in_process<N>([&](moe::collective::InProcess<N>& host) {
    int rank = host.rank();
    auto& failed = failures[static_cast<std::size_t>(rank)];
    try {
      kc::check_cuda(cudaSetDevice(rank), "cudaSetDevice");
      moe::test::Stream st;  // outlives the communicators created on it
      {
        auto a2e = moe::collective::Nccl::create(rank, N, id_a2e, st);
        auto e2a = moe::collective::Nccl::create(rank, N, id_e2a, st);
        DeviceWeights<T> dw(s, weights.view());
        auto view = dw.view();
        std::vector<moe::ExpertWeights<T>> held(view.experts.begin(), view.experts.end());
        if (rank >= ag)
          for (int e = 0; e < s.experts; ++e)
            if (on_eg.rank_of(e) != rank - ag) held[static_cast<std::size_t>(e)] = {};
        view.experts = held;
        bool is_ag = rank < ag;
        auto first = is_ag ? static_cast<std::size_t>(rank) * static_cast<std::size_t>(tokens) * h : 0;
        auto rows = static_cast<std::size_t>(tokens) * h;
        Device<T> dx(std::vector<T>(x.begin() + static_cast<std::ptrdiff_t>(first),
                                    x.begin() + static_cast<std::ptrdiff_t>(first + rows)));
        Device<T> dy(rows);
        std::optional<Ex> ex;
        std::optional<Device<std::byte>> ws;
        if (via == Via::executor) {
          ex.emplace(a2e, e2a, ag, on_eg, view, ms::FinDepCudaOptions{.max_tokens = tokens});
          ws.emplace(ex->workspace_size());
          ws->poison();
        }
        for (std::size_t q = 0; q < cfgs.size(); ++q) {
          dy.poison();
          kc::check_cuda(cudaDeviceSynchronize(), "poison");
          T const* xr = is_ag ? dx.get() : nullptr;
          T* yr = is_ag ? dy.get() : nullptr;
          unsigned& errors = device_errors[static_cast<std::size_t>(rank)];
          char& role = role_ok[static_cast<std::size_t>(rank)];
          if (via == Via::executor) {
            ex->run({.tokens = tokens, .x = xr, .y = yr, .stream = st}, cfgs[q], ws->bytes());
            errors |= ex->errors();
          } else if (cfgs[q].pipeline == ms::Pipeline::findep) {
            errors |= through_layer<ms::FinDep, Model, Router>(a2e, e2a, via, ag, on_eg, one_copy, view, cfgs[q],
                                                               tokens, tokens, xr, yr, st, role);
          } else {
            errors |= through_layer<ms::PPPipe, Model, Router>(a2e, e2a, via, ag, on_eg, one_copy, view, cfgs[q],
                                                               tokens, tokens, xr, yr, st, role);
          }
          if (is_ag) {
            auto out = download_on(st, dy.get(), rows);
            std::copy(out.begin(), out.end(), y.begin() + static_cast<std::ptrdiff_t>(first));
          }
          st.synchronize("rank run");
          host.barrier();
          if (rank == 0) result[q] = compare(y, ref, fragile, total, s.hidden);
          host.barrier();
        }
      }
    } catch (std::exception const& e) {
      failed = e.what();
    }
  });
  for (int r = 0; r < N; ++r) {
    INFO("rank " << r << ": " << failures[static_cast<std::size_t>(r)]);
    CHECK(failures[static_cast<std::size_t>(r)].empty());
    CHECK(device_errors[static_cast<std::size_t>(r)] == 0u);
    CHECK(role_ok[static_cast<std::size_t>(r)]);
  }
  for (std::size_t q = 0; q < cfgs.size(); ++q) {
    INFO(N << " ranks through NCCL, " << ag << " AG, " << ms::pipeline_name(cfgs[q].pipeline) << " "
           << ms::order_name(cfgs[q].order) << " r1 " << cfgs[q].r1 << " r2 " << cfgs[q].r2
           << (via == Via::executor ? ", executor" : via == Via::layer ? ", layer (one communicator)" : ", layer (two)"));
    check_errors(result[q], tolerance, total);
  }
}


/// The device disaggregated Layer through collective::Nccl keeping its record counts on the device
/// (LayerOptions::device.count_records): `N` ranks, one thread, device and stream each, `ag` AG
/// ranks of `tokens` tokens, experts replicated (p2p_replicas). Each rank runs one pass directly,
/// then captures a pass on other tokens into a CUDA graph and replays it. After each, every rank's
/// counts (Layer::read_record_counts) against counts made here from the reference's routes and the
/// copy rule; after the replay, every AG output against the reference. The capture takes the
/// memset and the counting kernel with the pass, so the replay's counts are its own.
template <int N, class Model, class Router>
void p2p_nccl_records(int ag, int tokens, std::uint64_t seed) {
  using L = moe::Layer<Model, Router, moe::placement::Table, moe::replication::Table, ms::FinDep, moe::collective::Nccl>;
  using T = typename L::element_type;
  constexpr moe::ShapeSpec s = Model::spec;
  auto h = static_cast<std::size_t>(s.hidden), k = static_cast<std::size_t>(s.top_k);
  int total = ag * tokens, eg = N - ag;
  moe::RandomLayerWeights<T> weights(s, seed);
  auto on_eg = moe::placement::Table::round_robin(s.experts, eg);
  auto replicas = p2p_replicas(on_eg, eg, true);
  // two batches: [0] run directly, [1] captured and replayed
  std::vector<std::vector<T>> x, ref;
  std::vector<std::vector<std::vector<long long>>> want;
  for (int i = 0; i < 2; ++i) {
    x.push_back(random_tokens<T>(total, s.hidden, seed + 1 + static_cast<std::uint64_t>(i)));
    ref.emplace_back(x.back().size());
    std::vector<int> ids(static_cast<std::size_t>(total) * k);
    std::vector<float> gw(ids.size());
    moe::reference_forward<Router>(s, weights.view(), total, x.back().data(), ref.back().data(), ids, gw);
    auto fragile = fragile_tokens<Router>(s, weights.view(), x.back(), total, 1e-5f);
    REQUIRE(std::count(fragile.begin(), fragile.end(), 1) == 0);  // the device routes as the host does
    want.push_back(moe::test::disaggregated_records(ids, k, ag, tokens, replicas.replicas(), eg));
  }
  std::vector<T> y(x[1].size());
  std::vector<std::array<std::array<long long, 3>, 2>> got(N);
  std::vector<std::string> failures(N);
  auto id = moe::collective::Nccl::unique_id();
  moe::collective::run_in_process<N>([&](moe::collective::InProcess<N>& host) {
    int rank = host.rank();
    try {
      kc::check_cuda(cudaSetDevice(rank), "cudaSetDevice");
      moe::test::Stream st;  // outlives the communicator created on it
      auto comm = moe::collective::Nccl::create(rank, N, id, st);
      DeviceWeights<T> dw(s, weights.view());
      auto mine_w = rank_weights(dw.view(), replicas, rank, ag);
      bool is_ag = rank < ag;
      auto first = is_ag ? static_cast<std::size_t>(rank) * static_cast<std::size_t>(tokens) * h : 0;
      auto rows = static_cast<std::size_t>(tokens) * h;
      std::vector<Device<T>> dx;
      for (auto const& xi : x)
        dx.emplace_back(std::vector<T>(xi.begin() + static_cast<std::ptrdiff_t>(first),
                                       xi.begin() + static_cast<std::ptrdiff_t>(first + rows)));
      Device<T> dy(rows);
      L layer(comm, on_eg, replicas, mine_w.view,
              {.max_tokens = tokens, .schedule = ms::FinDep{ag, ms::Order::aass, 2, 2}, .device = {.count_records = true}});
      Device<std::byte> ws(layer.workspace_size());
      auto args = [&](int i) {
        return typename L::Arguments{.tokens = tokens, .x = is_ag ? dx[static_cast<std::size_t>(i)].get() : nullptr,
                                     .y = is_ag ? dy.get() : nullptr, .stream = st};
      };
      auto keep = [&](int i) {
        auto const& c = layer.read_record_counts();
        got[static_cast<std::size_t>(rank)][static_cast<std::size_t>(i)] = {c.records_local, c.records_remote,
                                                                             c.records_received};
      };
      layer.run(args(0), ws.bytes());
      st.synchronize("direct pass");
      keep(0);
      dy.poison();
      kc::check_cuda(cudaDeviceSynchronize(), "poison");
      moe::test::CapturedGraph graph(st, [&] { layer.run(args(1), ws.bytes()); });
      graph.launch(st);
      st.synchronize("graph replay");
      keep(1);
      if (is_ag) {
        auto out = download_on(st, dy.get(), rows);
        std::copy(out.begin(), out.end(), y.begin() + static_cast<std::ptrdiff_t>(first));
      }
      failures[static_cast<std::size_t>(rank)] = layer.errors() ? "device error" : "";
    } catch (std::exception const& e) {
      failures[static_cast<std::size_t>(rank)] = e.what();
    }
  });
  for (int r = 0; r < N; ++r) {
    INFO("rank " << r << " of " << N << ", " << ag << " AG: " << failures[static_cast<std::size_t>(r)]);
    REQUIRE(failures[static_cast<std::size_t>(r)].empty());
    for (int i = 0; i < 2; ++i) {
      INFO((i == 0 ? "direct pass" : "graph replay") << ": records local, remote, received");
      CHECK(got[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)] ==
            moe::test::disaggregated_rank_records(want[static_cast<std::size_t>(i)], ag, r));
    }
  }
  std::vector<char> none(static_cast<std::size_t>(total), 0);
  check_errors(compare(y, ref[1], none, total, s.hidden), fp32_tol, total);
}
}  // namespace

TEST_CASE("FinDEP point-to-point executor through collective::Nccl (one device per rank)", "[cuda][findep][p2p][nccl]") {
  if (!moe::test::has_devices(4)) return;
  p2p_nccl_world<2, DeepSeekSmallF32, moe::router::SigmoidGroupTopK>(1, nccl_tokens, 91, fp32_tol);
  p2p_nccl_world<4, MixtralSmallF32, moe::router::SoftmaxTopK>(2, nccl_tokens, 92, fp32_tol);
}

TEST_CASE("device disaggregated Layer through collective::Nccl (one device per rank)",
          "[cuda][findep][p2p][nccl][layer]") {
  if (!moe::test::has_devices(4)) return;
  p2p_nccl_world<3, DeepSeekSmallF32, moe::router::SigmoidGroupTopK>(1, nccl_tokens, 94, fp32_tol, Via::layer);
  p2p_nccl_world<4, MixtralSmallF32, moe::router::SoftmaxTopK>(2, nccl_tokens, 95, fp32_tol, Via::layer_two_comms);
}

TEST_CASE("device disaggregated Layer through collective::Nccl keeps its record counts, in a CUDA graph too",
          "[cuda][findep][p2p][nccl][layer][graph]") {
  if (!moe::test::has_devices(4)) return;
  p2p_nccl_records<4, DeepSeekSmallF32, moe::router::SigmoidGroupTopK>(2, nccl_tokens, 101);
  p2p_nccl_records<3, MixtralSmallF32, moe::router::SoftmaxTopK>(1, nccl_tokens, 102);
}
#endif

#if !defined(MOE_TEST_TSAN)
TEST_CASE("FinDEP point-to-point executor and device disaggregated Layer with replicated experts on the EG",
          "[cuda][findep][p2p][replicas]") {
  using moe::router::SigmoidGroupTopK;
  using moe::router::SoftmaxTopK;
  p2p_world<4, DeepSeekSmallF32, SigmoidGroupTopK>(2, 24, 91, fp32_tol, Via::executor, true);
  p2p_world<5, MixtralSmallF32, SoftmaxTopK>(2, 24, 92, fp32_tol, Via::layer, true);
  p2p_world<4, DeepSeekSmallF32, SigmoidGroupTopK>(1, 24, 93, fp32_tol, Via::layer_two_comms, true);
}
#endif

namespace {
/// `N` staged ranks, `ag` of them AG ranks with `tokens` tokens each, every expert's copies from
/// p2p_replicas(replicated) and EG index g on server g / 2, each micro-batch split on the device
/// (replication::BatchSplit), through the executor and through the Layer. Checks, per
/// configuration: every AG output against the reference; no device error (a pair dealt to an EG rank
/// without the expert raises one); the pairs each EG index received by the splits against the host
/// BatchSplit of the same counts (the device split equals it bit for bit), on every AG rank, and
/// every pair sent where the host BatchSplit::deal sends it; the
/// busiest EG index of each micro-batch at the least max load (Hall's theorem, computed here); and,
/// through the Layer, the count swaps in control_bytes.
template <int N, class Model, class Router>
void p2p_split_world(int ag, int tokens, std::uint64_t seed, double tolerance) {
  using Comm = moe::test::StagedDevice<N>;
  using Ex = ms::FinDepCudaExecutor<Model, Router, ms::PointToPoint<Comm>>;
  using T = typename Ex::element_type;
  constexpr moe::ShapeSpec s = Model::spec;
  auto h = static_cast<std::size_t>(s.hidden), k = static_cast<std::size_t>(s.top_k);
  int eg = N - ag, total = ag * tokens;
  moe::RandomLayerWeights<T> weights(s, seed);
  auto x = random_tokens<T>(total, s.hidden, seed + 1);
  std::vector<T> ref(x.size());
  std::vector<int> ids(static_cast<std::size_t>(total) * k);
  std::vector<float> gw(ids.size());
  moe::reference_forward<Router>(s, weights.view(), total, x.data(), ref.data(), ids, gw);
  auto fragile = fragile_tokens<Router>(s, weights.view(), x, total, 1e-5f);
  DeviceWeights<T> dw(s, weights.view());
  Device<T> dx(x), dy(x.size());
  dy.poison();
  auto on_eg = moe::placement::Table::round_robin(s.experts, eg);
  auto table = p2p_replicas(on_eg, eg, true);
  std::vector<int> servers(static_cast<std::size_t>(eg));
  for (int g = 0; g < eg; ++g) servers[static_cast<std::size_t>(g)] = g / 2;
  moe::replication::BatchSplit split(table.replicas(), servers);
  std::vector<ms::Config> cfgs{{ms::Pipeline::findep, ms::Order::aass, 1, 1, 1}, {ms::Pipeline::findep, ms::Order::aass, 2, 1, 3},
                               {ms::Pipeline::findep, ms::Order::asas, 3, 1, 2}, {ms::Pipeline::pppipe, ms::Order::asas, 4, 1, 1}};
  if (moe::test::thread_sanitized) cfgs.resize(2);  // one and two micro-batches (the Layer runs cfgs[1])
  std::vector<Errors> result(cfgs.size() + 1);
  std::vector<std::vector<std::vector<long long>>> loads(cfgs.size(), std::vector<std::vector<long long>>(static_cast<std::size_t>(ag)));
  std::vector<std::vector<std::vector<int>>> dests(cfgs.size(), std::vector<std::vector<int>>(static_cast<std::size_t>(ag)));
  std::vector<unsigned> device_errors(N, 0);
  std::vector<std::size_t> control(N, 0);
  std::vector<std::array<long long, 3>> records(N);  // through the Layer: local, remote, received
  moe::collective::run_in_process<N>([&](moe::collective::InProcess<N>& host) {
    Comm a2e(host), e2a(host);
    int rank = host.rank();
    bool is_ag = rank < ag;
    auto mine_w = rank_weights(dw.view(), table, rank, ag);
    auto const& view = mine_w.view;
    std::size_t first = is_ag ? static_cast<std::size_t>(rank) * static_cast<std::size_t>(tokens) * h : 0;
    T const* xr = is_ag ? dx.get() + first : nullptr;
    T* yr = is_ag ? dy.get() + first : nullptr;
    moe::test::Stream st;
    {
      Ex ex(a2e, e2a, ag, on_eg, view, ms::FinDepCudaOptions{.max_tokens = tokens}, table, &split);
      Device<std::byte> ws(ex.workspace_size());
      ws.poison();
      for (std::size_t q = 0; q < cfgs.size(); ++q) {
        ex.run({.tokens = tokens, .x = xr, .y = yr, .stream = st}, cfgs[q], ws.bytes());
        st.synchronize("rank run");
        device_errors[static_cast<std::size_t>(rank)] |= ex.errors();
        if (is_ag) {
          loads[q][static_cast<std::size_t>(rank)] = ex.split_loads(ws.bytes());
          dests[q][static_cast<std::size_t>(rank)] = ex.destinations(ws.bytes(), tokens);
        }
        host.barrier();
        if (rank == 0) {
          result[q] = compare(dy.download(), ref, fragile, total, s.hidden);
          dy.poison();
          kc::check_cuda(cudaDeviceSynchronize(), "poison");
        }
        host.barrier();
      }
    }
    // the same through the Layer (FinDEP AASS r1 2 r2 3)
    using L = moe::Layer<Model, Router, moe::placement::Table, moe::replication::BatchSplit, ms::FinDep, Comm>;
    L layer(a2e, e2a, on_eg, split, view,
            {.max_tokens = tokens, .schedule = ms::FinDep::from(cfgs[1], ag), .device = {.count_records = true}});
    Device<std::byte> ws(layer.workspace_size());
    layer.run({.tokens = tokens, .x = xr, .y = yr, .stream = st}, ws.bytes());
    st.synchronize("rank run (layer)");
    device_errors[static_cast<std::size_t>(rank)] |= layer.errors();
    control[static_cast<std::size_t>(rank)] = layer.stats().control_bytes;
    auto const& kept = layer.read_record_counts();
    records[static_cast<std::size_t>(rank)] = {kept.records_local, kept.records_remote, kept.records_received};
    host.barrier();
    if (rank == 0) result[cfgs.size()] = compare(dy.download(), ref, fragile, total, s.hidden);
  });
  auto copies = table.replicas();
  moe::replication::BatchSplit world = split.with_sources(ag);
  for (std::size_t q = 0; q <= cfgs.size(); ++q) {
    ms::Config const& c = cfgs[q < cfgs.size() ? q : 1];  // the Layer ran cfgs[1]
    INFO(N << " ranks, " << ag << " AG, " << ms::pipeline_name(c.pipeline) << " " << ms::order_name(c.order) << " r1 "
           << c.r1 << " r2 " << c.r2 << (q == cfgs.size() ? ", through the Layer" : ", executor"));
    check_errors(result[q], tolerance, total);
    if (q == cfgs.size()) break;
    // the host split of each micro-batch, and the least max load
    int mb = tokens / c.r1;
    std::vector<long long> expected(static_cast<std::size_t>(eg) + 1, 0);
    long long least = 0;
    for (int i = 0; i < c.r1; ++i) {
      std::vector<std::int32_t> counts(static_cast<std::size_t>(N) * static_cast<std::size_t>(s.experts), 0);
      std::vector<long long> pairs(static_cast<std::size_t>(s.experts), 0);
      for (int p = 0; p < ag; ++p)
        for (int t = i * mb; t < (i + 1) * mb; ++t)
          for (std::size_t j = 0; j < k; ++j) {
            int e = ids[(static_cast<std::size_t>(p) * static_cast<std::size_t>(tokens) + static_cast<std::size_t>(t)) * k + j];
            ++counts[static_cast<std::size_t>(eg + p) * static_cast<std::size_t>(s.experts) + static_cast<std::size_t>(e)];
            ++pairs[static_cast<std::size_t>(e)];
          }
      auto out = world.plan_batch(counts);
      for (int g = 0; g < eg; ++g) expected[static_cast<std::size_t>(g)] += world.load()[static_cast<std::size_t>(g)];
      // every AG rank's pairs of the micro-batch dealt as the host deals them (token order)
      for (int p = 0; p < ag; ++p) {
        auto at = (static_cast<std::size_t>(p) * static_cast<std::size_t>(tokens) + static_cast<std::size_t>(i * mb)) * k;
        auto n = static_cast<std::size_t>(mb) * k;
        std::vector<int> want(n);
        world.deal(eg + p, std::span<int const>(ids).subspan(at, n), want);
        auto const& got = dests[q][static_cast<std::size_t>(p)];
        INFO("AG rank " << p << ", micro-batch " << i);
        CHECK(std::vector<int>(got.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i * mb) * k),
                               got.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>((i + 1) * mb) * k)) == want);
      }
      expected[static_cast<std::size_t>(eg)] += out.max_load;
      least += moe::test::least_max_load(pairs, copies, eg);
    }
    INFO("split totals per EG index, then the busiest summed: expected " << ::Catch::Detail::stringify(expected)
                                                                          << ", least max load summed " << least);
    for (int p = 0; p < ag; ++p) {
      INFO("AG rank " << p << ": " << ::Catch::Detail::stringify(loads[q][static_cast<std::size_t>(p)]));
      CHECK(loads[q][static_cast<std::size_t>(p)] == expected);
    }
    CHECK(expected[static_cast<std::size_t>(eg)] == least);
  }
  for (unsigned e : device_errors) CHECK(e == 0u);
  // The Layer's record counts (LayerOptions::device.count_records) against those of the pairs'
  // destinations above (the executor's, equal to the host deal's under cfgs[1], which the Layer
  // ran): a record per token and EG index it sends a pair to.
  std::vector<long long> sent(static_cast<std::size_t>(ag), 0), received(static_cast<std::size_t>(eg), 0);
  for (int p = 0; p < ag; ++p) {
    auto const& d = dests[1][static_cast<std::size_t>(p)];
    for (int t = 0; t < tokens; ++t) {
      std::vector<bool> hit(static_cast<std::size_t>(eg), false);
      for (std::size_t j = 0; j < k; ++j) hit[static_cast<std::size_t>(d[static_cast<std::size_t>(t) * k + j])] = true;
      for (int g = 0; g < eg; ++g)
        if (hit[static_cast<std::size_t>(g)]) {
          ++sent[static_cast<std::size_t>(p)];
          ++received[static_cast<std::size_t>(g)];
        }
    }
  }
  for (int r = 0; r < N; ++r) {
    INFO("rank " << r << ": records local, remote, received through the Layer");
    CHECK(records[static_cast<std::size_t>(r)] ==
          (r < ag ? std::array<long long, 3>{0, sent[static_cast<std::size_t>(r)], 0}
                  : std::array<long long, 3>{0, 0, received[static_cast<std::size_t>(r - ag)]}));
  }
  for (int r = 0; r < N; ++r) {
    INFO("rank " << r << " control bytes through the Layer");
    CHECK(control[static_cast<std::size_t>(r)] ==
          (r < ag ? static_cast<std::size_t>(cfgs[1].r1) * static_cast<std::size_t>(ag - 1) *
                        static_cast<std::size_t>(s.experts) * sizeof(std::int32_t)
                  : 0u));
  }
}
}  // namespace

TEST_CASE("FinDEP point-to-point executor and device disaggregated Layer split each micro-batch (BatchSplit)",
          "[cuda][findep][p2p][replicas][batch-split]") {
  using moe::router::SigmoidGroupTopK;
  using moe::router::SoftmaxTopK;
  // Under ThreadSanitizer one world of 12 tokens per AG rank: what it checks there is that the
  // split's sort, on a stream of its own (FinDepCudaExecutor::split_micro_batch), is joined before
  // the deal.
  p2p_split_world<4, DeepSeekSmallF32, SigmoidGroupTopK>(2, moe::test::thread_sanitized ? 12 : 24, 94, fp32_tol);
#if !defined(MOE_TEST_TSAN)
  p2p_split_world<5, MixtralSmallF32, SoftmaxTopK>(2, 24, 95, fp32_tol);
  p2p_split_world<5, DeepSeekSmallF32, SigmoidGroupTopK>(3, 24, 96, fp32_tol);
  p2p_split_world<4, MixtralSmallF32, SoftmaxTopK>(1, 24, 97, fp32_tol);
#endif
}

#if !defined(MOE_TEST_TSAN)
TEST_CASE("FinDEP point-to-point executor and the device disaggregated Layer reject bad input", "[cuda][findep][p2p][bad-input]") {
  using Model = MixtralSmallF32;
  using Ex = ms::FinDepCudaExecutor<Model, moe::router::SoftmaxTopK, ms::PointToPoint<moe::test::StagedDevice<3>>>;
  constexpr moe::ShapeSpec s = Model::spec;
  moe::RandomLayerWeights<float> weights(s, 71);
  DeviceWeights<float> dw(s, weights.view());
  std::vector<std::string> messages(3);
  moe::collective::run_in_process<3>([&](moe::collective::InProcess<3>& host) {
    moe::test::StagedDevice<3> a2e(host), e2a(host);
    auto table = moe::placement::Table::round_robin(s.experts, 2);
    auto& m = messages[static_cast<std::size_t>(host.rank())];
    auto expect = [&](auto&& make, char const* part) {
      try {
        make();
        m += std::string("no error for '") + part + "'; ";
      } catch (moe::Error const& e) {
        if (std::string(e.what()).find(part) == std::string::npos) m += std::string("'") + e.what() + "' lacks '" + part + "'; ";
      }
    };
    expect([&] { Ex(a2e, a2e, 1, table, dw.view(), {.max_tokens = 8}); }, "two communicators");
    expect([&] { Ex(a2e, e2a, 0, table, dw.view(), {.max_tokens = 8}); }, "attention group (AG) is empty");
    expect([&] { Ex(a2e, e2a, 3, table, dw.view(), {.max_tokens = 8}); }, "expert group (EG) is empty");
    expect([&] { Ex(a2e, e2a, 1, moe::placement::Table::round_robin(s.experts, 3), dw.view(), {.max_tokens = 8}); },
           "rank");
    expect([&] { Ex(a2e, e2a, 1, table, dw.view(), {.max_tokens = 0}); }, "max_tokens must be positive");
    // The device disaggregated Layer's own checks of its schedule, before it makes any communicator.
    using L = moe::Layer<Model, moe::router::SoftmaxTopK, moe::placement::Table, moe::replication::None, ms::FinDep,
                         moe::test::StagedDevice<3>>;
    expect([&] { L(a2e, table, {}, dw.view(), {.max_tokens = 8, .schedule = {.ag = 0}}); },
           "attention group must hold between 1 and 2 of the 3 ranks");
    expect([&] { L(a2e, e2a, table, {}, dw.view(), {.max_tokens = 8, .schedule = {.ag = 3}}); }, "got ag = 3");
    expect([&] { L(a2e, table, {}, dw.view(), {.max_tokens = 8, .schedule = {.ag = 1, .r1 = 0}}); }, "r1 and r2 must be at least 1");
    expect([&] { L(a2e, table, {}, dw.view(), {.max_tokens = 12, .schedule = {.ag = 1, .r1 = 4, .r2 = 3}, .device = {.max_chunks = 8}}); },
           "r1 * r2 = 12 chunks exceed Options::device.max_chunks = 8");
    expect([&] { L(a2e, table, {}, dw.view(), {.max_tokens = 8, .schedule = {.ag = 2}}); }, "outside [0, 1)");  // 1 EG rank
    expect([&] { L(a2e, table, {}, dw.view(), {.max_tokens = 0, .schedule = {.ag = 1}}); }, "max_tokens must be positive");
    {
      L layer(a2e, table, {}, dw.view(), {.max_tokens = 12, .schedule = {.ag = 1, .r1 = 5}});
      Device<std::byte> ws(layer.workspace_size());
      Device<float> x(12 * 64), y(12 * 64);
      if (layer.can_implement({.tokens = 12, .x = x.get(), .y = y.get()}).ok) m += "can_implement accepted r1 = 5; ";
      expect([&] { layer.run({.tokens = 12, .x = x.get(), .y = y.get()}, ws.bytes()); },
             "r1 = 5 does not divide the 12 tokens");
      expect([&] { layer.run({.tokens = 13, .x = x.get(), .y = y.get()}, ws.bytes()); }, "max_tokens");
    }
    {
      // Another plan's tables (re-planning) are checked against the workspace's bounds: no EG rank
      // above the first plan's busiest (5 experts here), and without FinDepCudaOptions::replans
      // none above its own first count (EG index 0, rank 1, held 3).
      std::vector<int> three_five(static_cast<std::size_t>(s.experts), 1), five_three(three_five.size(), 0);
      for (std::size_t e = 0; e < three_five.size(); ++e) {
        three_five[e] = e < 3 ? 0 : 1;
        five_three[e] = e < 5 ? 0 : 1;
      }
      moe::placement::Table first(three_five), swapped(five_three), all_on_0(std::vector<int>(three_five.size(), 0));
      Ex fixed(a2e, e2a, 1, first, dw.view(), {.max_tokens = 8});
      Ex grows(a2e, e2a, 1, first, dw.view(), {.max_tokens = 8, .replans = true});
      expect([&] { (void)grows.prepare_tables(all_on_0, {}, dw.view().experts, nullptr); },
             "gives EG index 0 8 experts; a plan may give an EG rank at most 5");
      if (host.rank() == 1)
        expect([&] { (void)fixed.prepare_tables(swapped, {}, dw.view().experts, nullptr); },
               "its workspace was sized for 3");
      // On the AG rank (rank 0): a split needs buffers an executor built without one lacks, and a
      // splitting executor takes new copies only with their split (null keeps the one in use).
      std::vector<std::vector<int>> one_copy;
      for (int g : three_five) one_copy.push_back({g});
      moe::replication::BatchSplit split(one_copy, std::vector<int>{0, 0});
      Ex splitting(a2e, e2a, 1, first, dw.view(), {.max_tokens = 8}, {}, &split);
      if (host.rank() == 0) {
        expect([&] { (void)fixed.prepare_tables(first, {}, dw.view().experts, &split); },
               "a batch split for an executor built without one");
        expect([&] { (void)splitting.prepare_tables(swapped, {}, dw.view().experts, nullptr); },
               "new copies without their batch split");
        try {
          (void)splitting.prepare_tables(first, {}, dw.view().experts, nullptr);  // the same copies
        } catch (moe::Error const& e) {
          m += std::string("the same copies without a split were refused: ") + e.what() + "; ";
        }
      }
      try {
        auto next = grows.prepare_tables(swapped, {}, dw.view().experts, nullptr);
        grows.adopt(std::move(next), dw.view().experts);
      } catch (moe::Error const& e) {
        m += std::string("replans refused a plan within its bound: ") + e.what() + "; ";
      }
    }
    Ex ex(a2e, e2a, 1, table, dw.view(), {.max_tokens = 12, .max_chunks = 8});
    Device<std::byte> ws(ex.workspace_size());
    Device<float> x(12 * 64), y(12 * 64);
    auto run = [&](int tokens, ms::Config c) { ex.run({.tokens = tokens, .x = x.get(), .y = y.get()}, c, ws.bytes()); };
    expect([&] { run(12, {ms::Pipeline::findep, ms::Order::aass, 5, 1, 1}); }, "r1 = 5 does not divide the 12 tokens");
    expect([&] { run(12, {ms::Pipeline::findep, ms::Order::aass, 2, 1, 4}); }, "r2 = 4 does not divide");
    expect([&] { run(12, {ms::Pipeline::pppipe, ms::Order::aass, 2, 1, 2}); }, "PPPipe has no token chunks");
    expect([&] { run(12, {ms::Pipeline::findep, ms::Order::aass, 3, 1, 4}); }, "exceed max_chunks = 8");
    expect([&] { run(13, {ms::Pipeline::findep, ms::Order::aass, 1, 1, 1}); }, "max_tokens");
    expect([&] {
             ex.run({.tokens = 4, .x = x.get(), .y = y.get()}, {ms::Pipeline::findep, ms::Order::aass, 1, 1, 1},
                    ws.bytes().first(16));
           },
           "workspace");
  });
  for (auto const& m : messages) {
    INFO(m);
    CHECK(m.empty());
  }
}
#endif
