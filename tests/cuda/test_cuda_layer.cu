// The whole device layer (moe::Layer with collective::SingleGpu or Nccl) against the host reference
// forward, on one GPU (collective::SingleGpu) and through collective::Nccl at world size 1 (exact and
// padded exchanges).
// Exits 77 (skipped) without a GPU.
//
// Routes depend on fp32 logits, and the GPU sums them in another order than the host, so a token
// whose top-k choice is within rounding of a tie may legitimately pick another expert. Such tokens
// are found on the host (a tiny perturbation of its logits changes its route) and are exempt from
// the per-token bound; there must be few of them.

#include <catch2/catch.hpp>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "cuda_test_support.cuh"
#include "layer_test_support.cuh"
#include "staged_collective.cuh"
#include "moe/layer/paths/device.cuh"
#include "moe/moe.hpp"
#if defined(MOE_TEST_NCCL)
#include "moe/collective/nccl.hpp"
#endif

using moe::test::Device;
using moe::test::DeviceWeights;
using moe::test::fragile_tokens;
using moe::test::random_tokens;
namespace kc = moe::kernels::cuda;

namespace {

using MixtralSmallF32 = moe::models::Reduced<moe::models::Mixtral8x7B, 64, 96, moe::DType::f32>;
using DeepSeekSmallF32 = moe::models::Reduced<moe::models::DeepSeekV3, 64, 32, moe::DType::f32>;
using DeepSeekSmallBf16 = moe::models::Reduced<moe::models::DeepSeekV3, 64, 32, moe::DType::bf16>;
using DeepSeekV2SmallBf16 = moe::models::Reduced<moe::models::DeepSeekV2, 136, 72, moe::DType::bf16>;

struct Checked {
  double normwise = 0;      // over all tokens
  double worst_stable = 0;  // worst per-token error among tokens with a stable route
  int fragile = 0;
  moe::LayerStats stats;  // of the last run
};

/// Runs the layer `L` on `tokens` tokens (possibly several times) and compares with the reference.
template <class L, class Router, class Make>
Checked run_layer(int tokens, int max_tokens, std::uint64_t seed, Make make_layer, int repeats = 1) {
  using T = typename L::element_type;
  constexpr moe::ShapeSpec s = L::shape;
  moe::RandomLayerWeights<T> weights(s, seed);
  auto x = random_tokens<T>(tokens, s.hidden, seed + 1);
  std::vector<T> ref(x.size());
  moe::reference_forward<Router>(s, weights.view(), tokens, x.data(), ref.data());
  auto fragile = fragile_tokens<Router>(s, weights.view(), x, tokens, 1e-5f);

  DeviceWeights<T> dw(s, weights.view());
  auto layer = make_layer(dw.view(), max_tokens);
  Device<std::byte> ws(layer->workspace_size());
  ws.poison();
  Device<T> dx(x.empty() ? std::vector<T>(1) : x), dy(std::max<std::size_t>(x.size(), 1));
  std::vector<T> y;
  for (int rep = 0; rep < repeats; ++rep) {
    dy.poison();
    layer->run({.tokens = tokens, .x = dx.get(), .y = dy.get()}, ws.bytes());
    y = dy.download(x.size());
    REQUIRE(layer->errors() == 0u);
  }

  auto e = moe::test::token_errors(y, ref, fragile, tokens, s.hidden);
  REQUIRE(e.finite);
  return {e.normwise, e.worst_stable, e.fragile, layer->stats()};
}

template <class Model, class Router, class Replicas = moe::replication::None>
using SingleLayer = moe::Layer<Model, Router, moe::placement::Table, Replicas, moe::schedule::Sequential, moe::collective::SingleGpu>;

template <class Model, class Router>
Checked single_gpu(int tokens, int max_tokens, bool dedup, std::uint64_t seed, int repeats = 1,
                   kc::GemmPath gemm = kc::GemmPath::automatic) {
  using L = SingleLayer<Model, Router>;
  static moe::collective::SingleGpu gpu;
  return run_layer<L, Router>(
      tokens, max_tokens, seed,
      [&](moe::LayerWeights<typename L::element_type> w, int m) {
        return std::make_unique<L>(gpu, moe::placement::Table::contiguous(Model::spec.experts, 1),
                                   moe::replication::None{}, w,
                                   moe::LayerOptions<moe::schedule::Sequential, moe::cuda::DeviceOptions>{.max_tokens = m, .deduplicate = dedup, .device = {.gemm = gemm}});
      },
      repeats);
}

void check(Checked const& c, double tolerance, int tokens) {
  INFO("normwise " << c.normwise << ", worst stable token " << c.worst_stable << ", fragile tokens " << c.fragile);
  CHECK(c.worst_stable <= tolerance);
  CHECK(c.fragile * 20 <= std::max(tokens, 20));  // at most 5% near-tie tokens
  if (c.fragile == 0) CHECK(c.normwise <= tolerance);
}

constexpr double fp32_tol = 1e-4;
constexpr double bf16_tol = 3e-2;

}  // namespace

TEST_CASE("single-GPU layer matches the host reference (fp32)", "[cuda][layer]") {
  using moe::router::SigmoidGroupTopK;
  using moe::router::SoftmaxTopK;
  check(single_gpu<MixtralSmallF32, SoftmaxTopK>(96, 128, true, 1), fp32_tol, 96);
  check(single_gpu<DeepSeekSmallF32, SigmoidGroupTopK>(70, 80, true, 2), fp32_tol, 70);
  // Without de-duplication the records are one per assignment; results are the same.
  check(single_gpu<DeepSeekSmallF32, SigmoidGroupTopK>(70, 80, false, 3), fp32_tol, 70);
}

TEST_CASE("single-GPU layer matches the host reference (bf16)", "[cuda][layer]") {
  using moe::router::GroupLimitedTopK;
  using moe::router::SigmoidGroupTopK;
  // Under a sanitizer fewer tokens (the emulated bf16 GEMMs are its longest runs): the same kernels.
  int const t200 = moe::test::full_or(200, 48), t150 = moe::test::full_or(150, 40);
  check(single_gpu<DeepSeekSmallBf16, SigmoidGroupTopK>(t200, 256, true, 4), bf16_tol, t200);
  check(single_gpu<DeepSeekV2SmallBf16, GroupLimitedTopK>(t150, t150, true, 5), bf16_tol, t150);
  // Reusing the workspace: the second run must not depend on the first one's leftovers.
  check(single_gpu<DeepSeekSmallBf16, SigmoidGroupTopK>(33, 256, true, 6, 2), bf16_tol, 33);
}

// Each grouped-GEMM kernel through the whole layer (the tests above use GemmPath::automatic, which
// is the Hopper kernel on an H100/H200 built for sm_90a): routed and shared experts, both record
// forms, and a second run over the same workspace.
TEST_CASE("single-GPU layer with each grouped-GEMM kernel (bf16)", "[cuda][layer][gemm]") {
  using moe::router::GroupLimitedTopK;
  using moe::router::SigmoidGroupTopK;
  std::vector<kc::GemmPath> paths{kc::GemmPath::portable};
  int const t200 = moe::test::full_or(200, 48), t150 = moe::test::full_or(150, 40);
  // Without de-duplication (one record per pair) under a sanitizer 24 tokens, still below max_tokens.
  int const t70 = moe::test::full_or(70, 24);
  if (kc::hopper_gemm_available()) paths.push_back(kc::GemmPath::hopper);
  for (kc::GemmPath path : paths) {
    INFO("GemmPath " << static_cast<int>(path));
    check(single_gpu<DeepSeekSmallBf16, SigmoidGroupTopK>(t200, 256, true, 41, 2, path), bf16_tol, t200);
    check(single_gpu<DeepSeekSmallBf16, SigmoidGroupTopK>(t70, 80, false, 42, 1, path), bf16_tol, t70);
    check(single_gpu<DeepSeekV2SmallBf16, GroupLimitedTopK>(t150, t150, true, 43, 1, path), bf16_tol, t150);
  }
}

TEST_CASE("single-GPU layer with no tokens or one token", "[cuda][layer]") {
  using moe::router::SoftmaxTopK;
  auto one = single_gpu<MixtralSmallF32, SoftmaxTopK>(1, 4, true, 7);
  check(one, fp32_tol, 1);
  auto none = single_gpu<MixtralSmallF32, SoftmaxTopK>(0, 4, true, 8);
  CHECK(none.normwise == 0.0);
}

namespace {

/// Runs `layer` directly, then captures one run in a CUDA graph (over a poisoned workspace) and
/// replays it twice; the outputs must be bitwise equal (same kernels, same inputs).
template <class L>
void check_graph_replay(L& layer, int tokens, std::uint64_t seed) {
  using T = typename L::element_type;
  constexpr moe::ShapeSpec s = L::shape;
  Device<std::byte> ws(layer.workspace_size());
  auto x = random_tokens<T>(tokens, s.hidden, seed);
  Device<T> dx(x), direct(x.size()), replay(x.size());
  moe::test::Stream st;
  layer.run({.tokens = tokens, .x = dx.get(), .y = direct.get(), .stream = st}, ws.bytes());
  st.synchronize("direct run");

  replay.poison();
  ws.poison();  // the graph must not depend on what a previous run left in the workspace
  moe::test::CapturedGraph graph(
      st, [&] { layer.run({.tokens = tokens, .x = dx.get(), .y = replay.get(), .stream = st}, ws.bytes()); });
  for (int i = 0; i < 2; ++i) graph.launch(st);
  st.synchronize("graph replay");
  auto a = direct.download(), b = replay.download();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if constexpr (std::is_same_v<T, float>) {
      REQUIRE(std::memcmp(&a[i], &b[i], sizeof(T)) == 0);
    } else {
      REQUIRE(a[i].bits == b[i].bits);
    }
  }
}

}  // namespace

TEST_CASE("single-GPU layer forward can be captured in a CUDA graph and replayed", "[cuda][layer][graph]") {
  using L = SingleLayer<DeepSeekSmallBf16, moe::router::SigmoidGroupTopK>;
  constexpr moe::ShapeSpec s = L::shape;
  moe::RandomLayerWeights<moe::bf16> weights(s, 13);
  DeviceWeights<moe::bf16> dw(s, weights.view());
  moe::collective::SingleGpu gpu;
  L layer(gpu, moe::placement::Table::contiguous(s.experts, 1), {}, dw.view(), {.max_tokens = 64});
  // Under a sanitizer 16 tokens: the same kernels captured and replayed, a third of the rows.
  check_graph_replay(layer, moe::test::full_or(48, 16), 14);
}

TEST_CASE("single-GPU layer rejects bad arguments", "[cuda][layer][bad-input]") {
  using L = SingleLayer<MixtralSmallF32, moe::router::SoftmaxTopK>;
  constexpr moe::ShapeSpec s = L::shape;
  moe::RandomLayerWeights<float> weights(s, 9);
  DeviceWeights<float> dw(s, weights.view());
  moe::collective::SingleGpu gpu;
  auto table = moe::placement::Table::contiguous(s.experts, 1);
  CHECK_THROWS_WITH(L(gpu, table, {}, dw.view(), {.max_tokens = 0}), Catch::Contains("max_tokens"));
  auto missing = dw.view();
  std::vector<moe::ExpertWeights<float>> holes(dw.experts);
  holes[3] = {};
  missing.experts = holes;
  CHECK_THROWS_WITH(L(gpu, table, {}, missing, {.max_tokens = 4}), Catch::Contains("expert 3"));
  L layer(gpu, table, {}, dw.view(), {.max_tokens = 4});
  Device<std::byte> ws(layer.workspace_size());
  Device<float> x(64 * 8), y(64 * 8);
  CHECK_THROWS_WITH(layer.run({.tokens = 5, .x = x.get(), .y = y.get()}, ws.bytes()), Catch::Contains("max_tokens"));
  CHECK_THROWS_WITH(layer.run({.tokens = 2, .x = x.get(), .y = y.get()}, ws.bytes().first(ws.size() / 2)),
                    Catch::Contains("workspace"));
  CHECK_THROWS_WITH(layer.run({.tokens = 2, .x = x.get() + 1, .y = y.get()}, ws.bytes()), Catch::Contains("aligned"));
  CHECK_THROWS_WITH(layer.run({.tokens = 2, .x = x.get(), .y = y.get(), .first_token = -1}, ws.bytes()),
                    Catch::Contains("must not be negative"));
  CHECK_THROWS_WITH(layer.run({.tokens = 2, .x = x.get(), .y = y.get(),
                               .first_token = std::numeric_limits<long long>::max() - 4},
                              ws.bytes()),
                    Catch::Contains("first_token (the global index of this rank's first token) is too large"));

  // A GEMM kernel that cannot run is refused at construction, not at the first forward pass.
  CHECK_THROWS_WITH(L(gpu, table, {}, dw.view(), {.max_tokens = 4, .device = {.gemm = kc::GemmPath::hopper}}),
                    Catch::Contains("bf16 only"));
  CHECK_THROWS_WITH(L(gpu, table, {}, dw.view(), {.max_tokens = 4, .device = {.gemm = static_cast<kc::GemmPath>(7)}}),
                    Catch::Contains("unknown GemmPath"));
  if (!kc::hopper_gemm_available()) {
    using B = SingleLayer<DeepSeekSmallBf16, moe::router::SigmoidGroupTopK>;
    moe::RandomLayerWeights<moe::bf16> wb(B::shape, 10);
    DeviceWeights<moe::bf16> dwb(B::shape, wb.view());
    CHECK_THROWS_WITH(B(gpu, moe::placement::Table::contiguous(B::shape.experts, 1), {}, dwb.view(),
                        {.max_tokens = 4, .device = {.gemm = kc::GemmPath::hopper}}),
                      Catch::Contains("sm_90a"));
  }
}

// -----------------------------------------------------------------------------------------------
// Several ranks on one GPU through moe::test::StagedDevice (staged_collective.cuh): the multi-rank
// dispatch/combine logic of the device Layer (both exchanges) without needing several GPUs.
// -----------------------------------------------------------------------------------------------
namespace {
using moe::test::StagedDevice;

struct RankResult {
  double worst_stable = 0;
  int fragile = 0;
  moe::LayerStats stats;
  std::size_t expected_dispatch = 0;  // from the host routes and the tables
  // Records kept, sent and received, and pairs served here, from the host routes and the tables
  // (the padded exchange reports them through Layer::read_record_counts).
  long long expected_local = 0, expected_remote = 0, expected_received = 0, expected_local_pairs = 0;
  unsigned errors = 0;
  int non_finite = 0;  // tokens with a NaN or infinite output, fragile ones included
  int tokens = 0;
};

/// Per rank: tokens, worst relative error of the stable tokens, fragile and non-finite tokens, from
/// the outputs `y` of all ranks' tokens (in rank order) against the reference `ref`.
template <class T>
void score_outputs(std::vector<RankResult>& results, std::vector<int> const& counts, std::vector<T> const& y,
                   std::vector<T> const& ref, std::vector<char> const& fragile, std::size_t h) {
  for (int rank = 0, t0 = 0; rank < static_cast<int>(counts.size()); t0 += counts[static_cast<std::size_t>(rank)], ++rank) {
    auto& r = results[static_cast<std::size_t>(rank)];
    r.tokens = counts[static_cast<std::size_t>(rank)];
    for (int t = t0; t < t0 + counts[static_cast<std::size_t>(rank)]; ++t) {
      double td = 0, ts = 1e-6;
      bool finite = true;
      for (std::size_t q = 0; q < h; ++q) {
        double g = moe::to_float(y[static_cast<std::size_t>(t) * h + q]);
        double e = moe::to_float(ref[static_cast<std::size_t>(t) * h + q]);
        finite = finite && std::isfinite(g);
        td = std::isfinite(g) ? std::max(td, std::abs(g - e)) : 1e30;
        ts = std::max(ts, std::abs(e));
      }
      r.non_finite += finite ? 0 : 1;  // poisoned output left unwritten: never exempt
      if (fragile[static_cast<std::size_t>(t)]) {
        ++r.fragile;
      } else {
        r.worst_stable = std::max(r.worst_stable, td / ts);
      }
    }
  }
}

/// The rank the replica policy sends each pair of the reference's routes `ids` (tokens of all ranks,
/// in rank order, `counts` per rank) to: the policy's rule; for replication::BatchSplit, the host
/// policy's split of this batch's counts, each rank's pairs dealt in token order (BatchSplit::deal).
template <class Replicas>
std::vector<int> expected_dests(Replicas const& replicas, std::vector<int> const& primary, std::vector<int> const& ids,
                                std::vector<int> const& counts, int k, int experts) {
  std::vector<int> dest(ids.size());
  int ranks = static_cast<int>(counts.size());
  if constexpr (std::is_same_v<Replicas, moe::replication::BatchSplit>) {
    auto policy = replicas;
    std::vector<std::int32_t> all(static_cast<std::size_t>(ranks) * static_cast<std::size_t>(experts), 0);
    for (int r = 0, t0 = 0; r < ranks; t0 += counts[static_cast<std::size_t>(r)], ++r)
      for (std::size_t i = static_cast<std::size_t>(t0) * k; i < static_cast<std::size_t>(t0 + counts[static_cast<std::size_t>(r)]) * k; ++i)
        ++all[static_cast<std::size_t>(r) * static_cast<std::size_t>(experts) + static_cast<std::size_t>(ids[i])];
    policy.plan_batch(all);
    for (int r = 0, t0 = 0; r < ranks; t0 += counts[static_cast<std::size_t>(r)], ++r) {
      auto first = static_cast<std::size_t>(t0) * k, n = static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]) * k;
      policy.deal(r, std::span<int const>(ids).subspan(first, n), std::span<int>(dest).subspan(first, n));
    }
  } else {
    for (int r = 0, t0 = 0; r < ranks; t0 += counts[static_cast<std::size_t>(r)], ++r)
      for (int t = t0; t < t0 + counts[static_cast<std::size_t>(r)]; ++t)
        for (int j = 0; j < k; ++j) {
          auto i = static_cast<std::size_t>(t) * k + static_cast<std::size_t>(j);
          dest[i] = replicas.choose(ids[i], primary[static_cast<std::size_t>(ids[i])], r, t);
        }
  }
  return dest;
}

/// Four ranks, tokens per rank `counts`, experts placed by `placement`, copies by `replicas`.
/// `hot` >= 0 (models with a router bias): that expert's bias is raised by 100, so that every token
/// picks it (one expert takes all tokens).
template <class Model, class Router, class Replicas>
std::vector<RankResult> four_ranks(std::vector<int> const& counts, moe::placement::Table const& placement,
                                   Replicas const& replicas, moe::cuda::Exchange exchange, bool dedup,
                                   std::uint64_t seed, int hot = -1) {
  constexpr int N = 4;
  using T = std::conditional_t<Model::spec.dtype == moe::DType::f32, float, moe::bf16>;
  constexpr moe::ShapeSpec s = Model::spec;
  auto h = static_cast<std::size_t>(s.hidden), k = static_cast<std::size_t>(s.top_k);
  int total = std::accumulate(counts.begin(), counts.end(), 0);
  moe::RandomLayerWeights<T> weights(s, seed);
  auto x = random_tokens<T>(total, s.hidden, seed + 1);
  std::vector<T> ref(x.size());
  std::vector<int> ids(static_cast<std::size_t>(total) * k);
  std::vector<float> gw(ids.size());
  auto wv = weights.view();
  std::vector<float> bias;
  if (hot >= 0) {
    REQUIRE(wv.router_bias != nullptr);
    bias.assign(wv.router_bias, wv.router_bias + s.experts);
    bias[static_cast<std::size_t>(hot)] += 100.0f;
    wv.router_bias = bias.data();
  }
  moe::reference_forward<Router>(s, wv, total, x.data(), ref.data(), ids, gw);
  if (hot >= 0)
    for (int t = 0; t < total; ++t)
      REQUIRE(std::count(ids.begin() + t * s.top_k, ids.begin() + (t + 1) * s.top_k, hot) == 1);
  auto fragile = fragile_tokens<Router>(s, wv, x, total, 1e-5f);
  DeviceWeights<T> dw(s, wv);
  Device<T> dx(x), dy(x.size());
  dy.poison();
  std::vector<int> primary = placement.ranks();
  int max_tokens = std::max(1, *std::max_element(counts.begin(), counts.end()));
  std::vector<RankResult> results(N);
  auto dest_of = expected_dests(replicas, primary, ids, counts, s.top_k, s.experts);

  moe::collective::run_in_process<N>([&](moe::collective::InProcess<N>& host) {
    StagedDevice<N> comm(host);
    int rank = host.rank();
    int first = std::accumulate(counts.begin(), counts.begin() + rank, 0);
    auto view = dw.view();
    std::vector<moe::ExpertWeights<T>> mine(dw.experts.size());
    for (int e = 0; e < s.experts; ++e)
      if (replicas.holds(e, primary[static_cast<std::size_t>(e)], rank))
        mine[static_cast<std::size_t>(e)] = dw.experts[static_cast<std::size_t>(e)];
    view.experts = mine;
    using L = moe::Layer<Model, Router, moe::placement::Table, Replicas, moe::schedule::Sequential, StagedDevice<N>>;
    L layer(comm, placement, replicas, view,
            {.max_tokens = max_tokens,
             .deduplicate = dedup,
             .device = {.exchange = exchange, .count_records = exchange == moe::cuda::Exchange::padded}});
    Device<std::byte> ws(layer.workspace_size());
    ws.poison();
    moe::test::Stream st;
    layer.run({.tokens = counts[static_cast<std::size_t>(rank)], .x = dx.get() + static_cast<std::size_t>(first) * h,
               .y = dy.get() + static_cast<std::size_t>(first) * h, .first_token = first, .stream = st},
              ws.bytes());
    st.synchronize("rank run");
    auto& r = results[static_cast<std::size_t>(rank)];
    r.stats = layer.read_record_counts();
    r.errors = layer.errors();
    // Analytic dispatch bytes. Padded: every peer gets a whole worst-case region. Exact: one record
    // per (token, remote serving rank) with de-duplication, per remote assignment without.
    if (exchange == moe::cuda::Exchange::padded) {
      r.expected_dispatch = static_cast<std::size_t>(N - 1) * static_cast<std::size_t>(max_tokens) *
                            (dedup ? 1 : k) * r.stats.record_bytes;
      return;
    }
    for (int t = first; t < first + counts[static_cast<std::size_t>(rank)]; ++t) {
      std::vector<int> dests;
      for (std::size_t j = 0; j < k; ++j) {
        int d = dest_of[static_cast<std::size_t>(t) * k + j];
        if (d == rank) continue;
        if (!dedup || std::find(dests.begin(), dests.end(), d) == dests.end()) {
          dests.push_back(d);
          r.expected_dispatch += r.stats.record_bytes;
        }
      }
    }
  });

  // The records each rank sends each rank: one per distinct destination of a token with
  // de-duplication, one per pair without.
  for (int p = 0, t0 = 0; p < N; t0 += counts[static_cast<std::size_t>(p)], ++p)
    for (int t = t0; t < t0 + counts[static_cast<std::size_t>(p)]; ++t) {
      std::vector<int> dests;
      for (std::size_t j = 0; j < k; ++j) {
        int d = dest_of[static_cast<std::size_t>(t) * k + j];
        if (d == p) ++results[static_cast<std::size_t>(p)].expected_local_pairs;
        if (dedup && std::find(dests.begin(), dests.end(), d) != dests.end()) continue;
        dests.push_back(d);
        ++(d == p ? results[static_cast<std::size_t>(p)].expected_local : results[static_cast<std::size_t>(p)].expected_remote);
        ++results[static_cast<std::size_t>(d)].expected_received;
      }
    }
  score_outputs(results, counts, dy.download(), ref, fragile, h);
  return results;
}

void check_ranks(std::vector<RankResult> const& results, double tolerance, bool check_bytes) {
  int fragile = 0, tokens = 0;
  for (auto const& r : results) {
    fragile += r.fragile;
    tokens += r.tokens;
  }
  INFO("fragile tokens " << fragile << " of " << tokens);
  CHECK(fragile * 20 <= std::max(tokens, 20));  // at most 5% near-tie tokens, as on one GPU
  for (std::size_t rank = 0; rank < results.size(); ++rank) {
    auto const& r = results[rank];
    INFO("rank " << rank << ": worst stable token " << r.worst_stable << ", fragile " << r.fragile
                 << ", dispatch bytes " << r.stats.dispatch_bytes << " (expected " << r.expected_dispatch << ")");
    CHECK(r.errors == 0u);
    CHECK(r.non_finite == 0);
    CHECK(r.worst_stable <= tolerance);
    if (check_bytes && fragile == 0) {
      CHECK(r.stats.dispatch_bytes == r.expected_dispatch);
      CHECK(r.stats.records_local == r.expected_local);
      CHECK(r.stats.records_remote == r.expected_remote);
      CHECK(r.stats.records_received == r.expected_received);
      CHECK(r.stats.local_assignments == r.expected_local_pairs);
    }
  }
}

moe::replication::Table every_16th_everywhere(moe::placement::Table const& placement, int ranks) {
  std::vector<std::vector<int>> copies(static_cast<std::size_t>(placement.experts()));
  for (int e = 0; e < placement.experts(); ++e) {
    auto& c = copies[static_cast<std::size_t>(e)];
    c = {placement.rank_of(e)};
    if (e % 16 == 0)
      for (int r = 0; r < ranks; ++r)
        if (r != placement.rank_of(e)) c.push_back(r);
  }
  return moe::replication::Table(copies);
}

}  // namespace

TEST_CASE("four ranks on one GPU (staged collective) match the host reference", "[cuda][layer][ranks]") {
  using moe::router::SigmoidGroupTopK;
  using moe::router::SoftmaxTopK;
  using moe::cuda::Exchange;
  for (auto ex : {Exchange::exact, Exchange::padded}) {
    INFO("exchange " << (ex == Exchange::exact ? "exact" : "padded"));
    auto contiguous = moe::placement::Table::contiguous(256, 4);
    check_ranks(four_ranks<DeepSeekSmallF32, SigmoidGroupTopK>({9, 30, 1, 14}, contiguous, moe::replication::None{}, ex,
                                                               true, 31),
                fp32_tol, true);
    check_ranks(four_ranks<DeepSeekSmallF32, SigmoidGroupTopK>({20, 0, 20, 7}, contiguous, moe::replication::None{}, ex,
                                                               false, 32),
                fp32_tol, true);
    check_ranks(four_ranks<DeepSeekSmallBf16, SigmoidGroupTopK>({10, 25, 5, 17}, contiguous,
                                                                every_16th_everywhere(contiguous, 4), ex, true, 33),
                bf16_tol, true);
    check_ranks(four_ranks<MixtralSmallF32, SoftmaxTopK>({7, 0, 23, 3}, moe::placement::Table::round_robin(8, 4),
                                                         moe::replication::None{}, ex, true, 34),
                fp32_tol, true);
  }
}

TEST_CASE("four ranks on one GPU with a per-batch split (replication::BatchSplit) match the host reference",
          "[cuda][layer][ranks][batch-split]") {
  using moe::router::SigmoidGroupTopK;
  using moe::router::SoftmaxTopK;
  using moe::cuda::Exchange;
  // copies: every 16th expert on every rank, every 5th also on the next rank; 2 servers of 2
  auto split_of = [](moe::placement::Table const& placement) {
    std::vector<std::vector<int>> copies(static_cast<std::size_t>(placement.experts()));
    for (int e = 0; e < placement.experts(); ++e) {
      auto& c = copies[static_cast<std::size_t>(e)];
      c = {placement.rank_of(e)};
      for (int r = 0; r < 4; ++r)
        if (r != c[0] && (e % 16 == 0 || (e % 5 == 0 && r == (c[0] + 1) % 4))) c.push_back(r);
    }
    return moe::replication::BatchSplit(copies, std::vector<int>{0, 0, 1, 1});
  };
  for (auto ex : {Exchange::exact, Exchange::padded}) {
    INFO("exchange " << (ex == Exchange::exact ? "exact" : "padded"));
    auto contiguous = moe::placement::Table::contiguous(256, 4);
    check_ranks(four_ranks<DeepSeekSmallF32, SigmoidGroupTopK>({9, 30, 1, 14}, contiguous, split_of(contiguous), ex,
                                                               true, 41),
                fp32_tol, true);
    check_ranks(four_ranks<DeepSeekSmallBf16, SigmoidGroupTopK>({20, 0, 0, 7}, contiguous, split_of(contiguous), ex,
                                                                false, 42),
                bf16_tol, true);
    auto rr = moe::placement::Table::round_robin(8, 4);
    check_ranks(four_ranks<MixtralSmallF32, SoftmaxTopK>({7, 0, 23, 3}, rr, split_of(rr), ex, true, 43), fp32_tol,
                true);
    check_ranks(four_ranks<MixtralSmallF32, SoftmaxTopK>({0, 0, 0, 0}, rr, split_of(rr), ex, true, 44), fp32_tol,
                true);
    // every token picks expert 16 (copies on every rank) or expert 1 (one copy: all its pairs on rank 0)
    for (int hot : {16, 1})
      check_ranks(four_ranks<DeepSeekSmallF32, SigmoidGroupTopK>({12, 30, 0, 9}, contiguous, split_of(contiguous), ex,
                                                                 true, 45, hot),
                  fp32_tol, true);
  }
}

#if defined(MOE_TEST_NCCL)
namespace {

/// The host round trips the whole process has made so far: blocking calls (stream, event and device
/// synchronisation, synchronous copies) and device-to-host copies. Only the emulator counts them
/// (emu::Counters); on a GPU `counted` is false and the checks that need them are skipped.
struct RoundTrips {
  std::uint64_t syncs = 0, reads = 0;
  bool counted = false;
};
RoundTrips round_trips() {
#if defined(MOE_CUDA_EMULATOR)
  auto c = emu::counters();
  return {c.host_syncs, c.device_to_host, true};
#else
  return {};
#endif
}

template <class Model, class Router>
Checked nccl_world1(int tokens, moe::cuda::Exchange exchange, std::uint64_t seed) {
  using L = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential, moe::collective::Nccl>;
  auto comm = moe::collective::Nccl::create(0, 1, moe::collective::Nccl::unique_id());
  return run_layer<L, Router>(tokens, tokens, seed, [&](moe::LayerWeights<typename L::element_type> w, int m) {
    return std::make_unique<L>(comm, moe::placement::Table::contiguous(Model::spec.experts, 1),
                               moe::replication::None{}, w,
                               moe::LayerOptions<moe::schedule::Sequential, moe::cuda::DeviceOptions>{.max_tokens = m, .device = {.exchange = exchange}});
  });
}

}  // namespace

/// Four ranks through collective::Nccl: one thread, one device and one stream per rank; each rank
/// uploads its own tokens and the weights of the experts it serves (no memory shared between ranks).
/// With `trips`, the host round trips that the four `run` calls made together (the ranks meet
/// before and after them, so nothing else falls in the window).
template <class Model, class Router, class Replicas = moe::replication::None>
std::vector<RankResult> nccl_four_ranks(std::vector<int> const& counts, moe::placement::Table const& placement,
                                        moe::cuda::Exchange exchange, std::uint64_t seed, Replicas const& replicas = {},
                                        RoundTrips* trips = nullptr) {
  constexpr int N = 4;
  using T = std::conditional_t<Model::spec.dtype == moe::DType::f32, float, moe::bf16>;
  using L = moe::Layer<Model, Router, moe::placement::Table, Replicas, moe::schedule::Sequential, moe::collective::Nccl>;
  constexpr moe::ShapeSpec s = Model::spec;
  auto h = static_cast<std::size_t>(s.hidden);
  int total = std::accumulate(counts.begin(), counts.end(), 0);
  moe::RandomLayerWeights<T> weights(s, seed);
  auto x = random_tokens<T>(total, s.hidden, seed + 1);
  std::vector<T> ref(x.size()), y(x.size());
  std::vector<int> ids(static_cast<std::size_t>(total) * static_cast<std::size_t>(s.top_k));
  std::vector<float> gw(ids.size());
  moe::reference_forward<Router>(s, weights.view(), total, x.data(), ref.data(), ids, gw);
  auto fragile = fragile_tokens<Router>(s, weights.view(), x, total, 1e-5f);
  int max_tokens = std::max(1, *std::max_element(counts.begin(), counts.end()));
  std::vector<RankResult> results(N);
  std::vector<std::string> failures(N);
  auto id = moe::collective::Nccl::unique_id();
  std::barrier meet(N);  // a rank that throws drops out, so that the others never wait for it
  RoundTrips before;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < N; ++rank)
    threads.emplace_back([&, rank] {
      try {
        moe::kernels::cuda::check_cuda(cudaSetDevice(rank), "cudaSetDevice");
        moe::test::Stream st;  // outlives the communicator created on it
        {
          auto comm = moe::collective::Nccl::create(rank, N, id, st);
          int first = std::accumulate(counts.begin(), counts.begin() + rank, 0);
          auto n = static_cast<std::size_t>(counts[static_cast<std::size_t>(rank)]);
          DeviceWeights<T> dw(s, weights.view());
          auto view = dw.view();
          std::vector<moe::ExpertWeights<T>> mine(dw.experts.size());
          for (int e = 0; e < s.experts; ++e)
            if (replicas.holds(e, placement.rank_of(e), rank))
              mine[static_cast<std::size_t>(e)] = dw.experts[static_cast<std::size_t>(e)];
          view.experts = mine;
          auto begin = x.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(first) * h);
          Device<T> dx(std::vector<T>(begin, begin + static_cast<std::ptrdiff_t>(std::max<std::size_t>(n, 1) * h)));
          Device<T> dy(std::max<std::size_t>(n, 1) * h);
          dy.poison();
          // The padded exchange keeps its record counts on the device (read after the pass, outside
          // the window of `trips`: what the pass itself does is counted).
          L layer(comm, placement, replicas, view,
                  {.max_tokens = max_tokens,
                   .device = {.exchange = exchange, .count_records = exchange == moe::cuda::Exchange::padded}});
          Device<std::byte> ws(layer.workspace_size());
          ws.poison();
          if (trips) {
            meet.arrive_and_wait();
            if (rank == 0) before = round_trips();
            meet.arrive_and_wait();
          }
          layer.run({.tokens = static_cast<int>(n), .x = dx.get(), .y = dy.get(), .first_token = first, .stream = st},
                    ws.bytes());
          if (trips) {
            meet.arrive_and_wait();
            if (rank == 0) {
              auto after = round_trips();
              *trips = {after.syncs - before.syncs, after.reads - before.reads, after.counted};
            }
            meet.arrive_and_wait();
          }
          st.synchronize("rank run");
          auto out = dy.download(n * h);
          std::copy(out.begin(), out.end(), y.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(first) * h));
          results[static_cast<std::size_t>(rank)].stats = layer.read_record_counts();
          results[static_cast<std::size_t>(rank)].errors = layer.errors();
        }
      } catch (std::exception const& e) {
        failures[static_cast<std::size_t>(rank)] = e.what();
        if (trips) meet.arrive_and_drop();
      }
    });
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < N; ++rank) {
    INFO("rank " << rank);
    CHECK(failures[static_cast<std::size_t>(rank)].empty());
    UNSCOPED_INFO(failures[static_cast<std::size_t>(rank)]);
  }
  score_outputs(results, counts, y, ref, fragile, h);
  return results;
}

TEST_CASE("four ranks, one device each, through collective::Nccl match the host reference", "[cuda][layer][nccl][ranks]") {
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  if (devices < 4) {
    WARN("needs 4 devices; skipped");
    return;
  }
  using moe::cuda::Exchange;
  for (auto ex : {Exchange::exact, Exchange::padded}) {
    INFO("exchange " << (ex == Exchange::exact ? "exact" : "padded"));
    check_ranks(nccl_four_ranks<DeepSeekSmallF32, moe::router::SigmoidGroupTopK>(
                    {9, 30, 1, 14}, moe::placement::Table::contiguous(256, 4), ex, 41),
                fp32_tol, false);
    check_ranks(nccl_four_ranks<MixtralSmallF32, moe::router::SoftmaxTopK>(
                    {7, 0, 23, 3}, moe::placement::Table::round_robin(8, 4), ex, 42),
                fp32_tol, false);
    // a per-batch split: every expert also on the next rank, expert 3 on every rank (2 servers of 2)
    auto rr = moe::placement::Table::round_robin(8, 4);
    std::vector<std::vector<int>> copies(8);
    for (int e = 0; e < 8; ++e) copies[static_cast<std::size_t>(e)] = e == 3 ? std::vector<int>{3, 0, 1, 2}
                                                                             : std::vector<int>{e % 4, (e + 1) % 4};
    check_ranks(nccl_four_ranks<MixtralSmallF32, moe::router::SoftmaxTopK>(
                    {12, 0, 30, 5}, rr, ex, 43, moe::replication::BatchSplit(copies, std::vector<int>{0, 0, 1, 1})),
                fp32_tol, false);
  }
}

TEST_CASE("a per-batch split adds no host round trip to a pass (NCCL ranks)", "[cuda][layer][nccl][batch-split]") {
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  if (devices < 4) {
    WARN("needs 4 devices; skipped");
    return;
  }
  // The same copies used by the fixed rule and by the per-batch split (2 servers of 2): the split's
  // count exchange, kernel, sort and deal must add no host synchronisation and no read of device
  // memory by the host. What a pass has without it, per rank: the ranks' agreement on the pass (one
  // read of the gathered votes; skipped under graph capture), and with the exact exchange the
  // record counts it sizes its exchange with. The padded passes keep their record counts on the
  // device (LayerOptions::device.count_records), which adds none either.
  auto rr = moe::placement::Table::round_robin(8, 4);
  std::vector<std::vector<int>> copies(8);
  for (int e = 0; e < 8; ++e) copies[static_cast<std::size_t>(e)] = e == 3 ? std::vector<int>{3, 0, 1, 2}
                                                                           : std::vector<int>{e % 4, (e + 1) % 4};
  for (auto ex : {moe::cuda::Exchange::exact, moe::cuda::Exchange::padded}) {
    bool const exact = ex == moe::cuda::Exchange::exact;
    INFO("exchange " << (exact ? "exact" : "padded"));
    RoundTrips fixed, split;
    check_ranks(nccl_four_ranks<MixtralSmallF32, moe::router::SoftmaxTopK>({12, 0, 30, 5}, rr, ex, 51,
                                                                           moe::replication::Table(copies), &fixed),
                fp32_tol, false);
    check_ranks(nccl_four_ranks<MixtralSmallF32, moe::router::SoftmaxTopK>(
                    {12, 0, 30, 5}, rr, ex, 51, moe::replication::BatchSplit(copies, std::vector<int>{0, 0, 1, 1}), &split),
                fp32_tol, false);
    if (!split.counted) {
      WARN("host round trips are counted on the emulator only; skipped");
      continue;
    }
    INFO("fixed rule: " << fixed.syncs << " synchronisations, " << fixed.reads << " device-to-host copies; split: "
                        << split.syncs << ", " << split.reads);
    CHECK(split.syncs == fixed.syncs);
    CHECK(split.reads == fixed.reads);
    CHECK(split.syncs == (exact ? 8u : 4u));
    CHECK(split.reads == (exact ? 8u : 4u));
  }
}

namespace {
/// One pass on N NCCL ranks in which `bad` passes one token more than max_tokens (with
/// `other_tables`, a good pass on a layer whose placement swaps experts 0 and 1): what each rank threw.
std::vector<std::string> nccl_bad_rank(int N, int bad, moe::cuda::Exchange exchange, bool other_tables = false) {
  using Model = MixtralSmallF32;
  using T = float;
  using L = moe::Layer<Model, moe::router::SoftmaxTopK, moe::placement::Table, moe::replication::None,
                       moe::schedule::Sequential, moe::collective::Nccl>;
  constexpr moe::ShapeSpec s = Model::spec;
  int const m = 4;
  auto placement = moe::placement::Table::round_robin(s.experts, N);
  moe::RandomLayerWeights<T> weights(s, 7);
  auto x = random_tokens<T>(m + 1, s.hidden, 8);
  std::vector<std::string> what(static_cast<std::size_t>(N));
  auto id = moe::collective::Nccl::unique_id();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < N; ++rank)
    threads.emplace_back([&, rank] {
      try {
        moe::kernels::cuda::check_cuda(cudaSetDevice(rank), "cudaSetDevice");
        moe::test::Stream st;
        auto comm = moe::collective::Nccl::create(rank, N, id, st);
        DeviceWeights<T> dw(s, weights.view());
        auto mine = placement.ranks();
        if (other_tables && rank == bad) std::swap(mine[0], mine[1]);
        L layer(comm, moe::placement::Table(mine), moe::replication::None{}, dw.view(),
                {.max_tokens = m, .device = {.exchange = exchange}});
        Device<T> dx(x), dy(x.size());
        Device<std::byte> ws(layer.workspace_size());
        int n = rank == bad && !other_tables ? m + 1 : m;
        layer.run({.tokens = n, .x = dx.get(), .y = dy.get(), .stream = st}, ws.bytes());
        st.synchronize("rank run");
      } catch (std::exception const& e) {
        what[static_cast<std::size_t>(rank)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return what;
}
}  // namespace

TEST_CASE("device path: one rank's bad arguments make every rank throw the same error (NCCL)",
          "[cuda][layer][nccl][agreement]") {
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  for (int N : {2, 4}) {
    if (devices < N) {
      WARN("needs " << N << " devices; skipped");
      continue;
    }
    for (auto ex : {moe::cuda::Exchange::exact, moe::cuda::Exchange::padded})
      for (int bad : {0, N - 1}) {
        INFO(N << " ranks, bad rank " << bad << ", exchange " << (ex == moe::cuda::Exchange::exact ? "exact" : "padded"));
        auto what = nccl_bad_rank(N, bad, ex);
        for (auto const& m : what) CHECK(m == what[0]);
        CHECK_THAT(what[0], Catch::Contains(moe::detail::concat("rank ", bad, " rejected its arguments")) &&
                                Catch::Contains("5 tokens exceed the 4"));
        // The same rank built with another placement: stopped by the agreement before any pair moves.
        what = nccl_bad_rank(N, bad, ex, true);
        for (auto const& m : what) CHECK(m == what[0]);
        CHECK_THAT(what[0], Catch::Contains(moe::detail::concat(
                                "every rank must build its layer with the same placement and replica tables: rank ",
                                bad == 0 ? 1 : bad, "'s differ from rank 0's")));
      }
  }
}

TEST_CASE("NCCL world size 1 through the same layer", "[cuda][layer][nccl]") {
  using moe::router::SigmoidGroupTopK;
  using moe::router::SoftmaxTopK;
  for (auto ex : {moe::cuda::Exchange::exact, moe::cuda::Exchange::padded}) {
    INFO("exchange " << (ex == moe::cuda::Exchange::exact ? "exact" : "padded"));
    auto mixtral = nccl_world1<MixtralSmallF32, SoftmaxTopK>(64, ex, 11);
    check(mixtral, fp32_tol, 64);
    int const bf16_tokens = moe::test::full_or(100, 40);  // under a sanitizer: the same kernels, fewer rows
    auto deepseek = nccl_world1<DeepSeekSmallBf16, SigmoidGroupTopK>(bf16_tokens, ex, 12);
    check(deepseek, bf16_tol, bf16_tokens);
    for (auto const* st : {&mixtral.stats, &deepseek.stats}) {
      CHECK(st->dispatch_bytes == 0);  // a world of one sends nothing to another rank
      CHECK(st->combine_bytes == 0);
      if (ex == moe::cuda::Exchange::exact) {
        CHECK(st->records_local == st->tokens);  // one de-duplicated record per token
        CHECK(st->records_received == st->tokens);
        CHECK(st->records_remote == 0);
      }
    }
  }
}

TEST_CASE("NCCL padded exchange can be captured in a CUDA graph", "[cuda][layer][nccl][graph]") {
  using L = moe::Layer<DeepSeekSmallBf16, moe::router::SigmoidGroupTopK, moe::placement::Table,
                           moe::replication::None, moe::schedule::Sequential, moe::collective::Nccl>;
  constexpr moe::ShapeSpec s = L::shape;
  auto comm = moe::collective::Nccl::create(0, 1, moe::collective::Nccl::unique_id());
  moe::RandomLayerWeights<moe::bf16> weights(s, 15);
  DeviceWeights<moe::bf16> dw(s, weights.view());
  // Under a sanitizer 16 of the 40 tokens the layers hold: the same exchange and kernels captured.
  int const tokens = moe::test::full_or(40, 16);
  {
    L layer(comm, moe::placement::Table::contiguous(s.experts, 1), {}, dw.view(),
            {.max_tokens = 40, .device = {.exchange = moe::cuda::Exchange::padded}});
    check_graph_replay(layer, tokens, 16);
  }
  // a per-batch split: the count all-gather, the split kernel, the sort and the deal are captured too
  using B = moe::Layer<DeepSeekSmallBf16, moe::router::SigmoidGroupTopK, moe::placement::Table,
                       moe::replication::BatchSplit, moe::schedule::Sequential, moe::collective::Nccl>;
  std::vector<std::vector<int>> one(static_cast<std::size_t>(s.experts), std::vector<int>{0});
  {
    B layer(comm, moe::placement::Table::contiguous(s.experts, 1), moe::replication::BatchSplit(one, std::vector<int>{0}),
            dw.view(), {.max_tokens = 40, .device = {.exchange = moe::cuda::Exchange::padded}});
    check_graph_replay(layer, tokens, 16);
  }
}

TEST_CASE("padded exchange: the record counts a pass keeps on the device, after a graph replay too",
          "[cuda][layer][nccl][graph]") {
  using L = moe::Layer<MixtralSmallF32, moe::router::SoftmaxTopK, moe::placement::Table, moe::replication::None,
                       moe::schedule::Sequential, moe::collective::Nccl>;
  constexpr moe::ShapeSpec s = L::shape;
  auto comm = moe::collective::Nccl::create(0, 1, moe::collective::Nccl::unique_id());
  moe::RandomLayerWeights<float> weights(s, 17);
  DeviceWeights<float> dw(s, weights.view());
  L layer(comm, moe::placement::Table::contiguous(s.experts, 1), {}, dw.view(),
          {.max_tokens = 40, .device = {.exchange = moe::cuda::Exchange::padded, .count_records = true}});
  Device<std::byte> ws(layer.workspace_size());
  auto x = random_tokens<float>(40, s.hidden, 18);
  Device<float> dx(x), dy(x.size());
  moe::test::Stream st;
  // One rank: every token is one de-duplicated record to itself, every pair is served here.
  auto expect = [&](int tokens) {
    auto const& got = layer.read_record_counts();
    CHECK(got.records_local == tokens);
    CHECK(got.records_remote == 0);
    CHECK(got.records_received == tokens);
    CHECK(got.local_assignments == static_cast<long long>(tokens) * s.top_k);
    CHECK(got.local_activation_rate() == (tokens ? 1.0 : 0.0));
  };
  layer.run({.tokens = 7, .x = dx.get(), .y = dy.get(), .stream = st}, ws.bytes());
  CHECK(layer.stats().records_local == 0);  // not known to the host during a padded pass
  st.synchronize("direct run");
  expect(7);
  moe::test::CapturedGraph graph(st, [&] { layer.run({.tokens = 40, .x = dx.get(), .y = dy.get(), .stream = st}, ws.bytes()); });
  graph.launch(st);
  st.synchronize("graph replay");
  expect(40);  // the replay's counts, not the direct run's
  layer.run({.tokens = 0, .x = dx.get(), .y = dy.get(), .stream = st}, ws.bytes());
  st.synchronize("empty run");
  expect(0);
}
#endif
