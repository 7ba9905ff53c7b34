// The per-batch replica split on the GPU (kernels::cuda::DeviceSplit, moe/kernels/batch_split.cuh):
// one kernel, one block, from device-resident counts to the split, on the scenario of the host
// benchmark (benchmarks/planners/batch_split_scenario.hpp: DeepSeek-V3 at EP32, EPLB 288 slots,
// 4 servers of 8) at 16, 64, 256 and 4096 tokens per rank. Time per split: the mean over 50
// back-to-back launches on one stream (CUDA events), after a warm-up; `graph_us`: the same 50
// launches captured in one CUDA graph and replayed (no launch overhead between them). The device
// result is checked against the host split (max load and every take entry) before timing.
// Series: the scenario's series of seeded batches on the same plan (40 per size, 10 at 4096; one
// batch can be a lucky or an unlucky draw): each batch's device split checked against the host's,
// then one split per batch in turn, back to back, in one CUDA graph (`graph_us`: the mean per
// split), and the means over the series of the kernel's tallies and of thread 0's cycles.
// DealSorted/<tokens>: the deal the layer runs (paths/device.cuh, plan_split): rank 0's pairs put in
// expert order (kernels::cuda::order_by_expert, a CUB radix sort, on a side stream during the count
// exchange and the split in a layer pass), then dealt from that order (deal_sorted, after the
// split); checked equal to the reference deal kernel (one block, a thread per expert scanning all
// pairs) first. The time is both, in one CUDA graph of 50; `deal_us`: the deal alone, what a pass
// waits for after the split; `reference_us`: the reference kernel.
// SlotSplit/<tokens>: the split over an engine's slots (kernels::cuda::DeviceSlotSplit,
// moe/kernels/slot_split.cuh), what an engine such as SGLang would run per layer: rank 0's row of
// counts from its top-k ids (int32), the split of every rank's counts, and rank 0's pairs turned
// into physical slot ids (the sort by expert, then the deal); checked equal to the host's
// (EngineSlots, BatchSplit) first. The time is the three in one CUDA graph of 50; `count_us`,
// `plan_us`, `dispatch_us`: each alone.
// Stages: where a split's time goes, from thread 0's clock64 after each stage of the kernel (the
// mean over 50 splits, in SM cycles and as a share of the whole). Each split four times in the same
// run: the rank rounds on one warp (/warp) and on the whole block (/block), both with the packed
// labels of the tie-breaks, and on one warp with the distances' rounds, then the tree's
// (/warp_two_stage, the form the packed labels replaced: twice the tie-breaks' rounds), and on one
// warp in the other order of the rank-sized stages (/warp_least_max_first: the least max load's
// search, then the tie-breaks; the others try the tie-breaks at the lower bound first and search
// only when they get stuck: DeviceSplit::Order). The stages after the start: rank_stage_1 (the
// tie-breaks at the bound, or the search) and rank_stage_2 (when the bound was below the least max
// load, the search and the tie-breaks again; or the tie-breaks). With them,
// the kernel's tallies: the least max load's searches and rounds, the tie-breaks' searches and
// rounds (both runs), whether the fallback ran, and without it the cycles per tie-break round.
// CodeFetch/<KiB>/<warps>: what a one-block kernel pays for code it runs once, the model of
// docs/results/batch-balance.md ("The kernel's code"): a straight-line body of that many KiB (64
// independent multiply-adds per KiB in 8 chains, no loop) run twice in one launch by 1 or 8 warps
// of a block of 256; thread 0's clock64 around each pass. The first pass fetches the code; the
// second runs it again from the SM's instruction caches where it fits, so first minus second is
// the fetch.
// .../l2_evicted (CodeFetch on one warp, and DeviceSplitStages' warp form): each launch after L2
// was evicted (a memset of twice its size), so that code and data come from device memory, as they
// would after a layer's expert GEMMs.
// scripts/gpu_bench.sh runs it as the step `split`.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "../planners/batch_split_scenario.hpp"
#include "moe/kernels/batch_split.cuh"
#include "moe/kernels/cuda_common.cuh"
#include "moe/kernels/dispatch.cuh"
#include "moe/kernels/slot_split.cuh"
#include "moe/replication/batch_split.hpp"
#include "moe/replication/engine_slots.hpp"

namespace kc = moe::kernels::cuda;
using moe::replication::split::Outcome;

namespace {

// The names of DeviceSplit::run's stamps in the benchmarks' counters: the stages between thread 0's
// clock stamps (entry k: from stamp k - 1 to stamp k), then the rounds' tallies.
constexpr char const* kStageNames[kc::DeviceSplit::stamp_clocks] = {
    "", "counts", "totals", "lists", "start", "rank_stage_1", "rank_stage_2", "sources", "matching"};
constexpr char const* kTallyNames[kc::DeviceSplit::stamps_size - kc::DeviceSplit::stamp_clocks] = {
    "max_load_searches", "max_load_rounds", "tie_break_searches", "tie_break_rounds", "fallbacks"};

cudaStream_t stream() {
  static cudaStream_t s = [] {
    cudaStream_t x;
    kc::check_cuda(cudaStreamCreate(&x), "cudaStreamCreate");
    return x;
  }();
  return s;
}

template <class F>
double mean_us(F&& body, int reps) {
  body();
  kc::check_cuda(cudaStreamSynchronize(stream()), "warm-up");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, stream());
  for (int i = 0; i < reps; ++i) body();
  cudaEventRecord(b, stream());
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return static_cast<double>(ms) * 1e3 / reps;
}

/// Mean microseconds of one call of `body` over body(0), ..., body(reps - 1) captured in one CUDA
/// graph (after a warm-up of the graph).
template <class F>
double graph_us(F&& body, int reps = 50) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  kc::check_cuda(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < reps; ++i) body(i);
  kc::check_cuda(cudaStreamEndCapture(stream(), &graph), "end capture");
  kc::check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  double us = mean_us([&] { kc::check_cuda(cudaGraphLaunch(exec, stream()), "graph launch"); }, 5) / reps;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us;
}

/// Evicts the L2 cache on `stream()`: writes a buffer of twice its size (the code and the data of
/// the next launch then come from device memory, as after a layer's expert GEMMs have streamed their
/// weights through L2).
void flush_l2() {
  static kc::DeviceArray<unsigned char> buffer = [] {
    int device = 0, bytes = 0;
    kc::check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    kc::check_cuda(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device), "L2 size");
    return kc::DeviceArray<unsigned char>(2 * static_cast<std::size_t>(bytes > 0 ? bytes : 1 << 20));
  }();
  kc::check_cuda(cudaMemsetAsync(buffer.get(), 0, buffer.size(), stream()), "flush L2");
}

/// Whether the device's outcome and takes (of the experts with copies) are the host's.
bool same_split(moe::replication::BatchSplit const& host, Outcome const& want, Outcome const& got,
                std::vector<std::int32_t> const& t) {
  auto const& L = host.layout();
  bool same = got.bad == 0 && got.max_load == want.max_load && got.local == want.local;
  for (int e = 0; e < L.experts && same; ++e)
    if (L.first[e + 1] - L.first[e] > 1)
      for (int r = 0; r < L.ranks; ++r)
        for (int c = L.first[e]; c < L.first[e + 1]; ++c)
          same &= t[static_cast<std::size_t>(r * L.slots + c)] == host.take()[static_cast<std::size_t>(r * L.slots + c)];
  return same;
}

void BM_DeviceSplit(benchmark::State& state, int tokens, kc::DeviceSplit::Rounds rounds, kc::DeviceSplit::Paths paths,
                    kc::DeviceSplit::Order order) {
  auto s = moe::bench_split::make(tokens);
  moe::replication::BatchSplit host(s.copies, s.topo);
  auto want = host.plan_batch(s.counts);
  kc::DeviceSplit dev(host.layout(), 0, rounds, paths, order);
  kc::DeviceArray<std::int32_t> counts(s.counts.size()), take(dev.take_size());
  kc::DeviceArray<long long> load(dev.load_size());
  kc::DeviceArray<Outcome> outcome(1);
  kc::DeviceArray<unsigned char> work(dev.workspace_bytes() ? dev.workspace_bytes() : 1);
  counts.upload(s.counts.data(), s.counts.size());
  auto run = [&] { dev.run(counts.get(), take.get(), load.get(), outcome.get(), work.get(), stream()); };
  run();
  Outcome got{};
  std::vector<std::int32_t> t(dev.take_size());
  kc::check_cuda(cudaStreamSynchronize(stream()), "split");
  kc::check_cuda(cudaMemcpy(&got, outcome.get(), sizeof got, cudaMemcpyDeviceToHost), "outcome");
  kc::check_cuda(cudaMemcpy(t.data(), take.get(), t.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost), "take");
  if (!same_split(host, want, got, t)) {
    state.SkipWithError("the device split differs from the host split");
    return;
  }
  constexpr int reps = 50;
  for (auto _ : state) state.SetIterationTime(mean_us(run, reps) * 1e-6);
  state.counters["graph_us"] = graph_us([&](int) { run(); });  // the same launches in one CUDA graph
  state.counters["shared_bytes"] = static_cast<double>(dev.shared_bytes());
  state.counters["start_waves"] = dev.start_waves();
  state.counters["warp_rounds"] = dev.warp_rounds() ? 1 : 0;
  state.counters["split_max_over_mean"] = static_cast<double>(want.max_load) / s.mean;
  state.counters["fixed_max_over_mean"] = s.fixed_ratio;
  state.SetLabel("DeepSeek-V3 EP32, EPLB 288 slots, h800:4");
}

void BM_DeviceSplitStages(benchmark::State& state, int tokens, kc::DeviceSplit::Rounds rounds,
                          kc::DeviceSplit::Paths paths, kc::DeviceSplit::Order order, bool flush) {
  auto s = moe::bench_split::make(tokens);
  moe::replication::BatchSplit host(s.copies, s.topo);
  kc::DeviceSplit dev(host.layout(), 0, rounds, paths, order);
  constexpr int K = kc::DeviceSplit::stamp_clocks, N = kc::DeviceSplit::stamps_size;
  kc::DeviceArray<std::int32_t> counts(s.counts.size()), take(dev.take_size());
  kc::DeviceArray<long long> load(dev.load_size()), stamps(N);
  kc::DeviceArray<Outcome> outcome(1);
  kc::DeviceArray<unsigned char> work(dev.workspace_bytes() ? dev.workspace_bytes() : 1);
  counts.upload(s.counts.data(), s.counts.size());
  std::vector<double> sum(K, 0.0);
  long long h[N];
  constexpr int reps = 50;
  for (auto _ : state) {
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int i = 0; i <= reps; ++i) {
      if (flush) flush_l2();
      dev.run(counts.get(), take.get(), load.get(), outcome.get(), work.get(), stream(), stamps.get());
      kc::check_cuda(cudaMemcpyAsync(h, stamps.get(), sizeof h, cudaMemcpyDeviceToHost, stream()), "stamps");
      kc::check_cuda(cudaStreamSynchronize(stream()), "split");
      if (i == 0) continue;  // warm-up
      for (int k = 1; k < K; ++k) sum[static_cast<std::size_t>(k)] += static_cast<double>(h[k] - h[k - 1]);
    }
  }
  double all = 0;
  for (int k = 1; k < K; ++k) all += sum[static_cast<std::size_t>(k)];
  for (int k = 1; k < K; ++k) {
    state.counters[std::string(kStageNames[k]) + "_cycles"] = sum[static_cast<std::size_t>(k)] / reps;
    state.counters[std::string(kStageNames[k]) + "_share"] = all > 0 ? sum[static_cast<std::size_t>(k)] / all : 0;
  }
  state.counters["all_cycles"] = all / reps;
  // the rounds' tallies (the same in every split of the batch): per round, the cycles of its stage
  for (int k = K; k < N; ++k) state.counters[kTallyNames[k - K]] = static_cast<double>(h[k]);
  // without the fallback (and in the order bound_first), the first tie-breaks are the only rank rounds
  if (order != kc::DeviceSplit::Order::least_max_first && h[K + 4] == 0 && h[K + 3] > 0)
    state.counters["tie_break_cycles_per_round"] = sum[5] / reps / static_cast<double>(h[K + 3]);
  state.SetLabel(flush ? "thread 0's clock64 per stage, mean of 50 splits, each after L2 was evicted"
                      : "thread 0's clock64 per stage, mean of 50 splits");
}

void BM_DeviceSplitSeries(benchmark::State& state, int tokens) {
  auto const batches = moe::bench_split::series(tokens);
  int const B = static_cast<int>(batches.size());
  moe::replication::BatchSplit host(batches[0].copies, batches[0].topo);
  kc::DeviceSplit dev(host.layout());
  std::size_t const per = batches[0].counts.size();
  kc::DeviceArray<std::int32_t> counts(per * static_cast<std::size_t>(B)), take(dev.take_size());
  kc::DeviceArray<long long> load(dev.load_size()), stamps(kc::DeviceSplit::stamps_size);
  kc::DeviceArray<Outcome> outcome(1);
  kc::DeviceArray<unsigned char> work(dev.workspace_bytes() ? dev.workspace_bytes() : 1);
  constexpr int K = kc::DeviceSplit::stamp_clocks, N = kc::DeviceSplit::stamps_size;
  double fixed = 0, split = 0, tally[N - K] = {}, stage[K] = {};
  std::vector<std::int32_t> t(dev.take_size());
  auto run = [&](int b, long long* st) {
    dev.run(counts.get() + per * static_cast<std::size_t>(b), take.get(), load.get(), outcome.get(), work.get(),
            stream(), st);
  };
  for (int b = 0; b < B; ++b) {
    auto const& sb = batches[static_cast<std::size_t>(b)];
    auto want = host.plan_batch(sb.counts);
    fixed += sb.fixed_ratio;
    split += static_cast<double>(want.max_load) / sb.mean;
    kc::check_cuda(cudaMemcpy(counts.get() + per * static_cast<std::size_t>(b), sb.counts.data(),
                              per * sizeof(std::int32_t), cudaMemcpyHostToDevice), "counts");
    run(b, nullptr);
    Outcome got{};
    long long h[N];
    kc::check_cuda(cudaStreamSynchronize(stream()), "split");
    kc::check_cuda(cudaMemcpy(&got, outcome.get(), sizeof got, cudaMemcpyDeviceToHost), "outcome");
    kc::check_cuda(cudaMemcpy(t.data(), take.get(), t.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost), "take");
    if (!same_split(host, want, got, t)) {
      state.SkipWithError(("the device split differs from the host split on batch " + std::to_string(b)).c_str());
      return;
    }
    // the stages' cycles from a second split of the batch (its counts and the kernel's code warm, as
    // in the graph below)
    run(b, stamps.get());
    kc::check_cuda(cudaMemcpyAsync(h, stamps.get(), sizeof h, cudaMemcpyDeviceToHost, stream()), "stamps");
    kc::check_cuda(cudaStreamSynchronize(stream()), "split");
    for (int k = 1; k < K; ++k) stage[k] += static_cast<double>(h[k] - h[k - 1]);
    for (int k = K; k < N; ++k) tally[k - K] += static_cast<double>(h[k]);
  }
  // one split per batch in turn, in one CUDA graph
  for (auto _ : state) state.SetIterationTime(graph_us([&](int b) { run(b, nullptr); }, B) * 1e-6);
  for (int k = K; k < N; ++k) state.counters[kTallyNames[k - K]] = tally[k - K] / B;
  double all = 0;
  for (int k = 1; k < K; ++k) state.counters[std::string(kStageNames[k]) + "_cycles"] = stage[k] / B, all += stage[k];
  state.counters["all_cycles"] = all / B;
  state.counters["batches"] = B;
  state.counters["fixed_max_over_mean"] = fixed / B;
  state.counters["split_max_over_mean"] = split / B;
  state.SetLabel("the mean per split over the seeded series, in one CUDA graph");
}

// CodeFetch: 64 multiply-adds (one IMAD of 16 bytes each on sm_70 and later: 1 KiB of code) over 8
// independent chains; the constants differ, and a chain of squares cannot be folded.
template <unsigned Base, std::size_t... J>
__device__ __forceinline__ void code_kib(unsigned (&a)[8], std::index_sequence<J...>) {
  ((a[J % 8] = a[J % 8] * a[J % 8] + (2u * (Base + static_cast<unsigned>(J)) + 1u)), ...);
}

template <std::size_t... I>
__device__ __forceinline__ void code_body(unsigned (&a)[8], std::index_sequence<I...>) {
  (code_kib<static_cast<unsigned>(I) * 64u>(a, std::make_index_sequence<64>{}), ...);
}

/// The body of KB KiB, twice, on the first `active` threads; stamps[0, 1]: thread 0's cycles of
/// each pass (the block waits for both at a barrier). `sink` keeps the chains alive.
template <int KB>
__global__ void __launch_bounds__(256, 1) code_fetch_kernel(int active, unsigned* sink, long long* stamps) {
  int const tid = static_cast<int>(threadIdx.x);
  unsigned a[8];
  for (int k = 0; k < 8; ++k) a[k] = static_cast<unsigned>(tid * 8 + k);
  __syncthreads();
  long long const t0 = clock64();
  long long t1 = t0, t2 = t0;
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    if (tid < active) code_body(a, std::make_index_sequence<KB>{});
    __syncthreads();
    long long const now = clock64();
    if (pass == 0)
      t1 = now;
    else
      t2 = now;
  }
  unsigned s = 0;
  for (int k = 0; k < 8; ++k) s ^= a[k];
  sink[tid] = s;
  if (tid == 0) stamps[0] = t1 - t0, stamps[1] = t2 - t1;
}

void BM_DeviceDealSorted(benchmark::State& state, int tokens) {
  auto s = moe::bench_split::make(tokens);
  moe::replication::BatchSplit host(s.copies, s.topo);
  host.plan_batch(s.counts);
  kc::DeviceSplit dev(host.layout());
  kc::DeviceArray<std::int32_t> take(dev.take_size());
  take.upload(host.take().data(), host.take().size());
  auto const& ids = s.ids[0];
  auto const n = static_cast<long long>(ids.size());
  int const E = moe::bench_split::kExperts;
  std::size_t const temp_bytes = kc::sort_items_bytes(n, E);
  kc::DeviceArray<int> d_ids(ids.size()), values(ids.size()), keys(ids.size()), order(ids.size()),
      offsets(static_cast<std::size_t>(E) + 1), dest(ids.size()), want(ids.size());
  kc::DeviceArray<unsigned char> temp(temp_bytes ? temp_bytes : 1);
  d_ids.upload(ids.data(), ids.size());
  auto sort = [&] {
    kc::order_by_expert(stream(), d_ids.get(), n, E, values.get(), keys.get(), order.get(), offsets.get(), temp.get(),
                        temp_bytes);
  };
  auto deal = [&] { dev.deal_sorted(take.get(), 0, keys.get(), order.get(), offsets.get(), n, dest.get(), stream()); };
  // the reference deal kernel's answer first
  dev.deal(take.get(), 0, d_ids.get(), n, want.get(), stream());
  sort();
  deal();
  std::vector<int> a(ids.size()), b(ids.size());
  kc::check_cuda(cudaStreamSynchronize(stream()), "deal");
  kc::check_cuda(cudaMemcpy(a.data(), dest.get(), a.size() * sizeof(int), cudaMemcpyDeviceToHost), "dest");
  kc::check_cuda(cudaMemcpy(b.data(), want.get(), b.size() * sizeof(int), cudaMemcpyDeviceToHost), "want");
  if (a != b) {
    state.SkipWithError("deal_sorted differs from the reference deal kernel");
    return;
  }
  for (auto _ : state) state.SetIterationTime(graph_us([&](int) { sort(), deal(); }) * 1e-6);
  state.counters["deal_us"] = graph_us([&](int) { deal(); });
  state.counters["reference_us"] =
      graph_us([&](int) { dev.deal(take.get(), 0, d_ids.get(), n, want.get(), stream()); });
  state.counters["pairs"] = static_cast<double>(n);
  state.SetLabel("rank 0's pairs: expert order (CUB), then the deal; deal_us: the deal alone; reference_us: "
                 "the reference deal kernel");
}

void BM_SlotSplit(benchmark::State& state, int tokens) {
  auto s = moe::bench_split::make(tokens);
  int const G = moe::bench_split::kRanks, E = moe::bench_split::kExperts;
  moe::replication::EngineSlots slots(s.phy2log, G, 8);
  auto host = slots.split();
  host.plan_batch(s.counts);
  auto const& ids = s.ids[0];
  auto const n = static_cast<long long>(ids.size());
  kc::DeviceSlotSplit dev(slots, n);
  kc::DeviceArray<std::int32_t> counts(s.counts.size()), d_ids(ids.size()), out(ids.size());
  counts.upload(s.counts.data(), s.counts.size());
  d_ids.upload(ids.data(), ids.size());
  auto count = [&] { dev.count(d_ids.get(), n, counts.get(), stream()); };  // rank 0's row
  auto plan = [&] { dev.plan(counts.get(), stream()); };
  auto dispatch = [&] { dev.dispatch(0, d_ids.get(), n, out.get(), stream()); };
  count(), plan(), dispatch();
  std::vector<std::int32_t> got(ids.size());
  kc::check_cuda(cudaStreamSynchronize(stream()), "slot split");
  kc::check_cuda(cudaMemcpy(got.data(), out.get(), got.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost), "out");
  std::vector<int> serving(ids.size());
  host.deal(0, ids, serving);
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (got[i] != slots.slot_of(ids[i], serving[i])) {
      state.SkipWithError("the device slot split differs from the host's");
      return;
    }
  for (auto _ : state) state.SetIterationTime(graph_us([&](int) { count(), plan(), dispatch(); }) * 1e-6);
  state.counters["count_us"] = graph_us([&](int) { count(); });
  state.counters["plan_us"] = graph_us([&](int) { plan(); });
  state.counters["dispatch_us"] = graph_us([&](int) { dispatch(); });
  state.counters["pairs"] = static_cast<double>(n);
  state.SetLabel("rank 0: counts, the split of " + std::to_string(G) + " x " + std::to_string(E) +
                 " counts, physical slot ids");
}

template <int KB>
void BM_CodeFetch(benchmark::State& state, int warps, bool flush) {
  kc::DeviceArray<unsigned> sink(256);
  kc::DeviceArray<long long> stamps(2);
  constexpr int launches = 50;
  double cold = 0, warm = 0, cold_min = 0;
  for (auto _ : state) {
    cold = warm = 0;
    cold_min = 1e300;
    for (int i = 0; i <= launches; ++i) {
      if (flush) flush_l2();
      kc::launch(code_fetch_kernel<KB>, 1, 256, 0, stream(), warps * 32, sink.get(), stamps.get());
      kc::check_launch("code_fetch_kernel");
      long long h[2];
      kc::check_cuda(cudaMemcpyAsync(h, stamps.get(), sizeof h, cudaMemcpyDeviceToHost, stream()), "stamps");
      kc::check_cuda(cudaStreamSynchronize(stream()), "code_fetch_kernel");
      if (i == 0) continue;  // the first launch also loads the module's code into L2
      cold += static_cast<double>(h[0]), warm += static_cast<double>(h[1]);
      cold_min = std::min(cold_min, static_cast<double>(h[0]));
    }
  }
  cold /= launches, warm /= launches;
  state.counters["kib"] = KB;
  state.counters["first_pass_cycles"] = cold;
  state.counters["first_pass_min_cycles"] = cold_min;
  state.counters["second_pass_cycles"] = warm;
  state.counters["first_pass_cycles_per_kib"] = cold / KB;
  state.counters["fetch_cycles_per_kib"] = (cold - warm) / KB;
  state.SetLabel(flush ? "thread 0's clock64 per pass, mean of 50 launches of one block, each after L2 was evicted"
                      : "thread 0's clock64 per pass, mean of 50 launches of one block");
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_cuda_batch_split: no CUDA device, nothing measured\n");
    return 0;
  }
  // the rank rounds on one warp (the automatic choice at this size) and on the whole block, and the
  // tie-breaks' former two-stage rounds on one warp, side by side
  using Rounds = kc::DeviceSplit::Rounds;
  using Paths = kc::DeviceSplit::Paths;
  using Order = kc::DeviceSplit::Order;
  struct Form {
    char const* name;
    Rounds rounds;
    Paths paths;
    Order order;
  };
  Form const forms[] = {{"warp", Rounds::warp, Paths::automatic, Order::automatic},
                        {"block", Rounds::block, Paths::automatic, Order::automatic},
                        {"warp_two_stage", Rounds::warp, Paths::two_stage, Order::automatic},
                        {"warp_least_max_first", Rounds::warp, Paths::automatic, Order::least_max_first}};
  for (int tokens : {16, 64, 256, 4096})
    for (auto const& f : forms)
      benchmark::RegisterBenchmark(("DeviceSplit/" + std::to_string(tokens) + "/" + f.name).c_str(), BM_DeviceSplit,
                                   tokens, f.rounds, f.paths, f.order)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  for (int tokens : {16, 64, 4096}) {
    for (auto const& f : forms)
      benchmark::RegisterBenchmark(("DeviceSplitStages/" + std::to_string(tokens) + "/" + f.name).c_str(),
                                   BM_DeviceSplitStages, tokens, f.rounds, f.paths, f.order, false)
          ->Iterations(1);
    // each split after L2 was evicted: its code and the layout from device memory, as in a layer
    // pass whose expert GEMMs streamed their weights through L2 since the last split
    benchmark::RegisterBenchmark(("DeviceSplitStages/" + std::to_string(tokens) + "/warp_l2_evicted").c_str(),
                                 BM_DeviceSplitStages, tokens, Rounds::warp, Paths::automatic, Order::automatic, true)
        ->Iterations(1);
  }
  for (int tokens : {16, 64, 256, 4096})
    benchmark::RegisterBenchmark(("DeviceSplitSeries/" + std::to_string(tokens)).c_str(), BM_DeviceSplitSeries, tokens)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  for (int tokens : {16, 256, 4096})
    benchmark::RegisterBenchmark(("DeviceDealSorted/" + std::to_string(tokens)).c_str(), BM_DeviceDealSorted, tokens)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  for (int tokens : {16, 256, 4096})
    benchmark::RegisterBenchmark(("SlotSplit/" + std::to_string(tokens)).c_str(), BM_SlotSplit, tokens)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  // what code run once costs a one-block kernel: 4 to 128 KiB (the split kernel is 131 KiB, its
  // stages 1.5 to 35), on one warp and on eight, and on one warp after L2 was evicted
  for (int variant = 0; variant < 3; ++variant) {
    int const warps = variant == 1 ? 8 : 1;
    bool const flush = variant == 2;
    auto add = [&](int kib, void (*f)(benchmark::State&, int, bool)) {
      benchmark::RegisterBenchmark(
          ("CodeFetch/" + std::to_string(kib) + "/" + std::to_string(warps) + (flush ? "/l2_evicted" : "")).c_str(), f,
          warps, flush)
          ->Iterations(1);
    };
    add(4, BM_CodeFetch<4>);
    add(16, BM_CodeFetch<16>);
    add(32, BM_CodeFetch<32>);
    add(64, BM_CodeFetch<64>);
    add(128, BM_CodeFetch<128>);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
