// The device path of moe::Layer is open to policies defined outside the library: a router and a
// replica policy written here, each with its device form (kernels::cuda::DeviceRouter,
// kernels::cuda::DeviceReplicas), run through the device Layer on 4 ranks of one GPU (StagedDevice)
// and must give what the host Layer gives with the same policies: the same outputs (fp32, 1e-5
// normwise per token, tokens within rounding of a routing tie exempt) and, rank by rank, the same
// dispatch records kept and sent, which only the replica choice decides.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cuda_test_support.cuh"
#include "layer_test_support.cuh"
#include "staged_collective.cuh"
#include "moe/layer/paths/device.cuh"
#include "moe/moe.hpp"

namespace {

/// A router of this test: the top_k largest logits (ties to the lower index), each weighted 1/top_k.
struct LargestLogits {
  static constexpr std::string_view name = "largest-logits";
  static constexpr bool fits(moe::ShapeSpec const& s) { return s.groups == 1; }
  static void route(moe::ShapeSpec const& s, std::span<float const> logits, std::span<float const>,
                    std::span<int> ids, std::span<float> weights) {
    std::vector<char> taken(logits.size(), 0);
    for (int j = 0; j < s.top_k; ++j) {
      int best = -1;
      for (int e = 0; e < s.experts; ++e)
        if (!taken[static_cast<std::size_t>(e)] &&
            (best < 0 || logits[static_cast<std::size_t>(e)] > logits[static_cast<std::size_t>(best)]))
          best = e;
      taken[static_cast<std::size_t>(best)] = 1;
      ids[static_cast<std::size_t>(j)] = best;
      weights[static_cast<std::size_t>(j)] = 1.0f / static_cast<float>(s.top_k);
    }
  }
};

/// A replica policy of this test: expert e has copies on its placement rank p and on p + 1 (mod the
/// ranks); even tokens go to p, odd tokens to p + 1, wherever they come from.
struct Mirrored {
  int ranks = 0;
  [[nodiscard]] int choose(int, int primary, int, long long token) const {
    return token % 2 == 0 ? primary : (primary + 1) % ranks;
  }
  [[nodiscard]] bool holds(int, int primary, int rank) const { return rank == primary || rank == (primary + 1) % ranks; }
  void validate(int, int r, std::span<int const>) const {
    moe::check(r == ranks && ranks >= 2, "Mirrored: made for ", ranks, " ranks, the layer has ", r);
  }
};

template <int E, int K>
__global__ void largest_logits_kernel(float const* logits, int tokens, int* ids, float* weights) {
  int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= tokens) return;
  float const* row = logits + static_cast<std::size_t>(t) * E;
  // the K largest in the order (value descending, index ascending): each pick is the first
  // largest after the one before in that order (no array of taken flags, which would sit in
  // local memory and fail the build's local-memory check)
  int last = -1;
  for (int j = 0; j < K; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool after = last < 0 || row[e] < row[last] || (row[e] == row[last] && e > last);
      if (after && (best < 0 || row[e] > row[best])) best = e;
    }
    last = best;
    ids[static_cast<std::size_t>(t) * K + j] = best;
    weights[static_cast<std::size_t>(t) * K + j] = 1.0f / static_cast<float>(K);
  }
}

struct MirroredView {
  int const* primary;
  int ranks;
  __device__ int choose(int e, int, long long token) const {
    int p = primary[e];
    return token % 2 == 0 ? p : (p + 1) % ranks;
  }
};

}  // namespace

// The device forms: what a user of the library writes for their own policies.
template <>
struct moe::kernels::cuda::DeviceRouter<LargestLogits> {
  template <moe::ShapeSpec S>
  static void route(cudaStream_t s, float const* logits, float const*, int tokens, int* ids, float* weights) {
    if (tokens == 0) return;
    launch(largest_logits_kernel<S.experts, S.top_k>, static_cast<unsigned>(blocks_for(tokens, 64)), 64, 0, s, logits,
           tokens, ids, weights);
    check_launch("largest_logits_kernel");
  }
};
template <>
struct moe::kernels::cuda::DeviceReplicas<Mirrored> {
  using View = MirroredView;
  static View view(Mirrored const& m, DeviceCopyTable const& t) { return {t.primary, m.ranks}; }
};

namespace {

using PolicyModel = moe::models::Reduced<moe::models::Mixtral8x7B, 64, 96, moe::DType::f32>;  // 8 experts, top-2
constexpr int N = 4;

struct PerRank {
  std::vector<float> y;
  moe::LayerStats stats;
};

/// Rank r's tokens: rows [first(r), first(r) + counts[r]) of x. Returns each rank's outputs and stats.
template <class Router, class Replicas, bool device>
std::vector<PerRank> run(std::vector<int> const& counts, std::vector<float> const& x, moe::RandomLayerWeights<float> const& w,
                         moe::placement::Table const& placement, Replicas const& replicas) {
  constexpr moe::ShapeSpec s = PolicyModel::spec;
  auto h = static_cast<std::size_t>(s.hidden);
  std::vector<PerRank> out(N);
  int most = *std::max_element(counts.begin(), counts.end());
  moe::test::DeviceWeights<float> dw(s, w.view());
  moe::collective::run_in_process<N>([&](moe::collective::InProcess<N>& host) {
    int rank = host.rank();
    int first = std::accumulate(counts.begin(), counts.begin() + rank, 0);
    auto n = static_cast<std::size_t>(counts[static_cast<std::size_t>(rank)]) * h;
    auto& mine = out[static_cast<std::size_t>(rank)];
    mine.y.assign(n, 0.0f);
    if constexpr (device) {
      moe::test::StagedDevice<N> comm(host);
      using L = moe::Layer<PolicyModel, Router, moe::placement::Table, Replicas, moe::schedule::Sequential,
                           moe::test::StagedDevice<N>>;
      static_assert(L::path == moe::ExecutionPath::device);
      L layer(comm, placement, replicas, dw.view(), {.max_tokens = most});
      moe::test::Device<float> dx(std::vector<float>(x.begin() + static_cast<std::ptrdiff_t>(first * h),
                                                     x.begin() + static_cast<std::ptrdiff_t>(first * h + n)));
      moe::test::Device<float> dy(std::max<std::size_t>(n, 1));
      moe::test::Device<std::byte> ws(layer.workspace_size());
      moe::test::Stream st;
      layer.run({.tokens = counts[static_cast<std::size_t>(rank)], .x = dx.get(), .y = dy.get(), .first_token = first,
                 .stream = st},
                ws.bytes());
      st.synchronize("device policies run");
      mine.y = dy.download();
      mine.y.resize(n);
      mine.stats = layer.stats();
    } else {
      using L = moe::Layer<PolicyModel, Router, moe::placement::Table, Replicas, moe::schedule::Sequential,
                           moe::collective::InProcess<N>>;
      L layer(host, placement, replicas, w.view(), {.max_tokens = most});
      std::vector<std::byte> ws(layer.workspace_size());
      layer.run({.tokens = counts[static_cast<std::size_t>(rank)], .x = x.data() + first * h, .y = mine.y.data(),
                 .first_token = first},
                ws);
      mine.stats = layer.stats();
    }
  });
  return out;
}

/// Tokens whose top_k-th and next largest logits are within `margin` (relative): a rounding of the
/// gate GEMM may pick another expert for them.
std::vector<char> near_ties(std::vector<float> const& x, int tokens, moe::LayerWeights<float> const& w) {
  constexpr moe::ShapeSpec s = PolicyModel::spec;
  std::vector<char> out(static_cast<std::size_t>(tokens));
  for (int t = 0; t < tokens; ++t) {
    std::vector<double> l(static_cast<std::size_t>(s.experts));
    for (int e = 0; e < s.experts; ++e)
      for (int q = 0; q < s.hidden; ++q)
        l[static_cast<std::size_t>(e)] += double(w.router[static_cast<std::size_t>(e * s.hidden + q)]) *
                                          x[static_cast<std::size_t>(t * s.hidden + q)];
    std::sort(l.begin(), l.end(), std::greater<>());
    out[static_cast<std::size_t>(t)] = l[s.top_k - 1] - l[s.top_k] < 1e-4 * (1 + std::abs(l[0]));
  }
  return out;
}

}  // namespace

TEST_CASE("a router and a replica policy defined outside the library run on the device path",
          "[cuda][layer][policies]") {
  constexpr moe::ShapeSpec s = PolicyModel::spec;
  auto h = static_cast<std::size_t>(s.hidden);
  std::vector<int> counts{7, 5, 6, 4};
  int total = std::accumulate(counts.begin(), counts.end(), 0);
  moe::RandomLayerWeights<float> w(s, 41);
  auto x = moe::test::random_tokens<float>(total, s.hidden, 42);
  auto tie = near_ties(x, total, w.view());
  auto placement = moe::placement::Table::contiguous(s.experts, N);
  Mirrored mirrored{N};

  auto host = run<LargestLogits, Mirrored, false>(counts, x, w, placement, mirrored);
  auto dev = run<LargestLogits, Mirrored, true>(counts, x, w, placement, mirrored);
  for (int r = 0, t0 = 0; r < N; t0 += counts[static_cast<std::size_t>(r)], ++r) {
    auto const& a = host[static_cast<std::size_t>(r)];
    auto const& b = dev[static_cast<std::size_t>(r)];
    bool any_tie = false;
    for (int t = 0; t < counts[static_cast<std::size_t>(r)]; ++t) {
      if (tie[static_cast<std::size_t>(t0 + t)]) {
        any_tie = true;
        continue;
      }
      double d = 0, n = 1e-6;
      for (std::size_t q = 0; q < h; ++q) {
        d = std::max(d, std::abs(double(a.y[t * h + q]) - b.y[t * h + q]));
        n = std::max(n, std::abs(double(a.y[t * h + q])));
      }
      INFO("rank " << r << ", token " << t);
      CHECK(d / n <= 1e-5);
    }
    INFO("rank " << r);
    CHECK(b.stats.assignments == a.stats.assignments);
    if (!any_tie) {
      CHECK(b.stats.records_local == a.stats.records_local);
      CHECK(b.stats.records_remote == a.stats.records_remote);
      CHECK(b.stats.local_assignments == a.stats.local_assignments);
    }
  }
  // The replica policy decides where records go: with one copy per expert the host layer keeps and
  // sends other counts (so the comparison above can tell a policy the device ignored).
  auto single = run<LargestLogits, moe::replication::None, false>(counts, x, w, placement, moe::replication::None{});
  long long kept_mirrored = 0, kept_single = 0;
  for (int r = 0; r < N; ++r) {
    kept_mirrored += host[static_cast<std::size_t>(r)].stats.records_remote;
    kept_single += single[static_cast<std::size_t>(r)].stats.records_remote;
  }
  CHECK(kept_mirrored != kept_single);
}
