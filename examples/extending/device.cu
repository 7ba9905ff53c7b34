// The device forms of the extending examples' own router and replica policy, run through the device
// moe::Layer (moe/layer/paths/device.cuh) on 4 ranks of one GPU.
//
// The device path runs its router and replica policy inside CUDA kernels, so a policy of one's own
// needs a device form beside the host one (docs/extending.md, "Device forms"):
//   - moe::kernels::cuda::DeviceRouter<TemperedTopK>: enqueues a kernel that turns each token's
//     logits into the experts and weights TemperedTopK::route (tempered_top_k.hpp) gives on the host;
//   - moe::kernels::cuda::DeviceReplicas<HotEverywhere>: a small trivially copyable View whose
//     __device__ choose gives the rank HotEverywhere::choose (hot_everywhere.hpp) gives.
// The policies themselves are the very headers router.cpp and replicas.cpp use.
//
// Checks, on two batches of 4 x 16 tokens of the reduced OLMoE-shaped layer of check.hpp (the
// examples' seeded weights; then the same weights with the router rows repeated in threes, so that
// every token's top_k-th choice is an exact tie the tie rule settles):
//   - every token's output matches moe::reference_forward<TemperedTopK> (the host router) within
//     1e-5 of the token's largest output value;
//   - on every rank, the dispatch records kept, sent and received, and the pairs served on the
//     rank itself (local_assignments), equal the counts made here from the reference's routes and
//     HotEverywhere::choose (one record per token and serving rank);
//   - the checks can fail: the model's own router gives other outputs, and one copy per expert
//     would give other record counts.
// A batch is compared only where rounding cannot change a route: the program first checks that,
// for every token, each chosen expert's logit exceeds each unchosen one's (unless they are tied
// exactly) by more than the gate GEMM's rounding can move them, whatever order it sums in.
//
// It prints each check with "ok" or "FAILED" and exits with 0 when all pass, 1 otherwise, 77 when
// there is no CUDA device. Built with nvcc (label cuda) and for the CUDA emulator of tests/emu
// (label emu); see examples/extending/CMakeLists.txt.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>
#include <vector>

#include "check.hpp"
#include "device_weights.cuh"  // examples/paths: a layer's weights copied to the device
#include "hot_everywhere.hpp"
#include "moe/layer/paths/device.cuh"
#include "moe/moe.hpp"
#include "staged_ranks.cuh"
#include "tempered_top_k.hpp"

namespace kc = moe::kernels::cuda;

// ---- The router's device form -------------------------------------------------------------------

/// One thread per token: TemperedTopK::route step for step. The k largest logits, largest first,
/// a tie going to the lower expert index (a later expert replaces the best so far only when its
/// logit is strictly larger); then exp((logit - top) / temperature) over the chosen, summed left to
/// right, each divided by the sum and scaled by the shape's routed_scale.
template <int E, int K>
__global__ void tempered_top_k_kernel(float const* logits, int tokens, float routed_scale, int* ids, float* weights) {
  int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= tokens) return;
  float const* row = logits + static_cast<std::size_t>(t) * E;
  int chosen[K];
  for (int j = 0; j < K; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int q = 0; q < j; ++q) taken |= chosen[q] == e;
      if (!taken && (best < 0 || row[e] > row[best])) best = e;
    }
    chosen[j] = best;
  }
  float w[K], top = row[chosen[0]], sum = 0.0f;
  for (int j = 0; j < K; ++j) {
    w[j] = expf((row[chosen[j]] - top) / TemperedTopK::temperature);
    sum += w[j];
  }
  for (int j = 0; j < K; ++j) {
    ids[static_cast<std::size_t>(t) * K + j] = chosen[j];
    weights[static_cast<std::size_t>(t) * K + j] = w[j] / sum * routed_scale;
  }
}

/// The layer calls route<S>() once per run(), after the gate GEMM, on the run's stream: it must only
/// enqueue (no synchronisation, no allocation; it has no scratch memory but what a kernel holds).
template <>
struct moe::kernels::cuda::DeviceRouter<TemperedTopK> {
  template <moe::ShapeSpec S>
  static void route(cudaStream_t stream, float const* logits, float const* /*bias: unused, as on the host*/,
                    int tokens, int* ids, float* weights) {
    static_assert(TemperedTopK::fits(S));
    if (tokens == 0) return;
    constexpr int per_block = 128;
    kc::launch(tempered_top_k_kernel<S.experts, S.top_k>, static_cast<unsigned>(kc::blocks_for(tokens, per_block)),
               per_block, 0, stream, logits, tokens, S.routed_scale, ids, weights);
    kc::check_launch("tempered_top_k_kernel");
  }
};
static_assert(kc::DeviceRouterPolicy<TemperedTopK, extending::shape>);

// ---- The replica policy's device form -----------------------------------------------------------

/// HotEverywhere on the device. The host policy keeps its hot list in a std::vector, which a kernel
/// cannot read; the View reads the same fact from the copy lists the layer built from
/// HotEverywhere::holds and uploaded: an expert is hot exactly when it has more than one copy (a
/// copy on every rank), and then the token's own rank serves it, else its primary rank.
struct HotEverywhereView {
  int const* offsets;  ///< copies of expert e: offsets[e] .. offsets[e + 1] (device)
  int const* primary;  ///< the placement's rank of each expert (device)
  __device__ int choose(int expert, int source_rank, long long /*token*/) const {
    bool hot = offsets[expert + 1] - offsets[expert] > 1;
    return hot ? source_rank : primary[expert];
  }
};
static_assert(std::is_trivially_copyable_v<HotEverywhereView>);

/// The layer calls view() in every run(), before the dispatch kernel that takes the View by value.
template <>
struct moe::kernels::cuda::DeviceReplicas<HotEverywhere> {
  using View = HotEverywhereView;
  static View view(HotEverywhere const&, DeviceCopyTable const& copies) { return {copies.offsets, copies.primary}; }
};
static_assert(kc::DeviceReplicaPolicy<HotEverywhere>);

// ---- The program --------------------------------------------------------------------------------

namespace {

using namespace extending;
constexpr int ranks = 4, tokens_per_rank = 16, total = ranks * tokens_per_rank;
using Comm = StagedRanks<ranks>;
using Layer = moe::Layer<Model, TemperedTopK, moe::placement::Table, HotEverywhere, moe::schedule::Sequential, Comm>;
static_assert(Layer::path == moe::ExecutionPath::device);

/// Each rank's outputs (its tokens, in order) and statistics.
struct DeviceRun {
  std::vector<float> y = std::vector<float>(static_cast<std::size_t>(total) * shape.hidden);
  std::vector<moe::LayerStats> stats = std::vector<moe::LayerStats>(ranks);
};

/// The device layer on `ranks` ranks of this GPU (one thread each): rank r holds only the experts it
/// serves and passes tokens [r * tokens_per_rank, (r + 1) * tokens_per_rank) of x.
DeviceRun run_device(moe::LayerWeights<float> const& weights, std::vector<float> const& x,
                     moe::placement::Table const& placement, HotEverywhere const& replicas) {
  std::size_t n = static_cast<std::size_t>(tokens_per_rank) * static_cast<std::size_t>(shape.hidden);
  DeviceRun out;
  moe::collective::run_in_process<ranks>([&](moe::collective::InProcess<ranks>& host) {
    int rank = host.rank();
    Comm comm(host);
    auto mine = weights;
    std::vector<moe::ExpertWeights<float>> kept(weights.experts.size());
    for (int e = 0; e < shape.experts; ++e)
      if (replicas.holds(e, placement.rank_of(e), rank))
        kept[static_cast<std::size_t>(e)] = weights.experts[static_cast<std::size_t>(e)];
    mine.experts = kept;
    DeviceWeights<float> on_device(shape, mine);
    Layer layer(comm, placement, replicas, on_device.view(), {.max_tokens = tokens_per_rank});

    std::size_t first = static_cast<std::size_t>(rank) * n;
    kc::DeviceArray<float> dx(n), dy(n);
    kc::DeviceArray<std::byte> workspace(layer.workspace_size());
    dx.upload(x.data() + first, n);
    auto stream = kc::make_stream();
    Layer::Arguments args{.tokens = tokens_per_rank, .x = dx.get(), .y = dy.get(),
                          .first_token = static_cast<long long>(rank) * tokens_per_rank, .stream = stream.get()};
    if (auto ok = layer.can_implement(args); !ok.ok) moe::fail(ok.message);
    layer.run(args, {workspace.get(), workspace.size()});
    kc::check_cuda(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    kc::check_cuda(cudaMemcpy(out.y.data() + first, dy.get(), n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    out.stats[static_cast<std::size_t>(rank)] = layer.stats();
  });
  return out;
}

/// The dispatch records each rank keeps, sends and receives when the pairs of `ids` (the reference's
/// routes) are served where `choose(expert, source_rank, token)` says: one record per token and
/// serving rank (the layer's de-duplication); and the pairs each rank serves itself.
struct Records {
  std::vector<long long> kept = std::vector<long long>(ranks), sent = kept, received = kept, local = kept;
  bool operator==(Records const&) const = default;
};
template <class Choose>
Records expected_records(std::vector<int> const& ids, Choose choose) {
  Records r;
  for (int t = 0; t < total; ++t) {
    int source = t / tokens_per_rank;
    std::set<int> serving;
    for (int j = 0; j < shape.top_k; ++j) {
      int d = choose(ids[static_cast<std::size_t>(t * shape.top_k + j)], source, t);
      serving.insert(d);
      r.local[static_cast<std::size_t>(source)] += d == source;
    }
    for (int d : serving) {
      ++(d == source ? r.kept : r.sent)[static_cast<std::size_t>(source)];
      ++r.received[static_cast<std::size_t>(d)];
    }
  }
  return r;
}

/// Whether rounding could make the device pick other experts than the host for some token: the
/// gate GEMM computes each logit, a dot product of length hidden, in fp32 in an order of its own,
/// and however it sums, the result is within gamma = hidden * u / (1 - hidden * u) (u = 2^-24) of
/// sum |w_i x_i| from the exact value. So a chosen expert a and an unchosen b keep their order on
/// both sides when their exact logits (fp64 here) differ by more than gamma * (S_a + S_b). Exact
/// ties (equal router rows, equal logits on both sides) are left to the tie rule. Returns the
/// smallest ratio of gap to that bound over all such pairs (above 1: no route can change).
double route_margin(moe::LayerWeights<float> const& w, std::vector<float> const& x, std::vector<int> const& ids) {
  auto h = static_cast<std::size_t>(shape.hidden);
  double u = std::ldexp(1.0, -24), gamma = double(h) * u / (1 - double(h) * u), margin = INFINITY;
  for (std::size_t t = 0; t < static_cast<std::size_t>(total); ++t) {
    std::vector<double> l(static_cast<std::size_t>(shape.experts)), bound(l.size());
    for (std::size_t e = 0; e < l.size(); ++e)
      for (std::size_t q = 0; q < h; ++q) {
        double p = double(w.router[e * h + q]) * double(x[t * h + q]);
        l[e] += p;
        bound[e] += gamma * std::abs(p);
      }
    std::vector<char> chosen(l.size(), 0);
    for (std::size_t j = 0; j < static_cast<std::size_t>(shape.top_k); ++j)
      chosen[static_cast<std::size_t>(ids[t * shape.top_k + j])] = 1;
    for (std::size_t a = 0; a < l.size(); ++a)
      for (std::size_t b = 0; b < l.size(); ++b)
        if (chosen[a] && !chosen[b] && l[a] != l[b]) margin = std::min(margin, (l[a] - l[b]) / (bound[a] + bound[b]));
  }
  return margin;
}

/// Largest, over tokens, of max |y - reference| / max |reference| within the token.
double worst_token_error(std::vector<float> const& y, std::vector<float> const& reference) {
  auto h = static_cast<std::size_t>(shape.hidden);
  double worst = 0;
  for (std::size_t t = 0; t < static_cast<std::size_t>(total); ++t) {
    double diff = 0, scale = 1e-30;
    for (std::size_t q = t * h; q < (t + 1) * h; ++q) {
      diff = std::max(diff, std::abs(double(y[q]) - double(reference[q])));
      scale = std::max(scale, std::abs(double(reference[q])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

/// One batch: the device run and every check on it. Returns whether all passed.
bool check_batch(char const* what, moe::LayerWeights<float> const& weights, std::vector<float> const& x) {
  std::printf("-- %s\n", what);
  auto placement = moe::placement::Table::contiguous(shape.experts, ranks);
  std::vector<int> hot = {3, 17, 40, 63};
  HotEverywhere replicas(hot);
  bool ok = true;

  std::vector<float> reference(x.size());
  std::vector<int> ids(static_cast<std::size_t>(total * shape.top_k));
  std::vector<float> gate(ids.size());
  moe::reference_forward<TemperedTopK>(shape, weights, total, x.data(), reference.data(), ids, gate);
  double margin = route_margin(weights, x, ids);
  std::printf("smallest gap between a chosen and an unchosen logit: %.2f times what rounding can move\n", margin);
  ok &= expect(margin > 1, "no route can change with the gate GEMM's rounding");

  auto run = run_device(weights, x, placement, replicas);
  double error = worst_token_error(run.y, reference);
  std::printf("device layer vs reference_forward<TemperedTopK>: worst token's relative error %.2e\n", error);
  ok &= expect(error < 1e-5, "every token's output matches the reference with the same router");

  std::vector<float> other(x.size());
  moe::reference_forward<moe::router::ForModel<Model>>(shape, weights, total, x.data(), other.data());
  ok &= expect(worst_token_error(other, reference) > 1e-3, "the model's own router gives other outputs");

  auto want = expected_records(ids, [&](int e, int source, long long t) {
    return replicas.choose(e, placement.rank_of(e), source, t);
  });
  Records got;
  for (std::size_t r = 0; r < ranks; ++r) {
    got.kept[r] = run.stats[r].records_local;
    got.sent[r] = run.stats[r].records_remote;
    got.received[r] = run.stats[r].records_received;
    got.local[r] = run.stats[r].local_assignments;
    std::printf("rank %zu: records kept %lld, sent %lld, received %lld, pairs served here %lld "
                "(HotEverywhere::choose: %lld, %lld, %lld, %lld)\n",
                r, got.kept[r], got.sent[r], got.received[r], got.local[r], want.kept[r], want.sent[r],
                want.received[r], want.local[r]);
  }
  ok &= expect(got == want,
               "records kept, sent and received and pairs served on their rank follow HotEverywhere::choose");
  auto single = expected_records(ids, [&](int e, int, long long) { return placement.rank_of(e); });
  ok &= expect(!(single == want), "one copy per expert would give other record counts");
  return ok;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("extending_device: no CUDA device, skipped (exit 77)\n");
    return 77;
  }
  moe::RandomLayerWeights<float> seeded(shape, weight_seed);
  auto x = seeded_tokens(total);
  bool ok = check_batch("the examples' seeded weights", seeded.view(), x);

  // The same weights with router rows in threes: rows 3g + 1 and 3g + 2 repeat row 3g (expert 63
  // keeps its own). Tied experts have equal logits on the host and the device, and as 8 is not a
  // multiple of 3, every token's eighth choice falls inside a tied group: the tie rule (the lower
  // index first) decides which of its experts serve.
  auto h = static_cast<std::size_t>(shape.hidden);
  auto tied = seeded.view();
  std::vector<float> rows(tied.router, tied.router + static_cast<std::size_t>(shape.experts) * h);
  for (std::size_t e = 0; e + 1 < static_cast<std::size_t>(shape.experts); ++e)
    std::copy_n(tied.router + (e - e % 3) * h, h, rows.begin() + static_cast<std::ptrdiff_t>(e * h));
  tied.router = rows.data();
  ok &= check_batch("router rows in threes: every token's eighth choice is a tie", tied, x);

  std::printf("%s\n", ok ? "all checks passed" : "some checks FAILED");
  return ok ? 0 : 1;
}
