// Predictor lookup + shuffle planning throughput on the CPU (tokens/s).
//
// Token table: DeepSeek-V2-sized vocabulary (100k ids, 8 devices), filled from a seeded synthetic
// profile (labelled synthetic); batches of token ids drawn from the same Zipf distribution.
#include <benchmark/benchmark.h>

#include <vector>

#include "moe/speculative/cocluster.hpp"
#include "moe/profile/route_synthetic.hpp"
#include "moe/speculative/predictor.hpp"
#include "moe/speculative/shuffle_plan.hpp"

namespace {
namespace sp = moe::speculative;
constexpr int kVocab = 100000, kDevices = 8;

struct Fixture {
  sp::TokenDeviceTable table{kVocab, kDevices};
  sp::DeviceSequenceTable seq{kDevices, 2};
  std::vector<int> tokens;   // a pool of token ids, Zipf distributed
  std::vector<int> history;  // 2 previous devices per token
};

Fixture const& fixture() {
  static Fixture f = [] {
    Fixture x;
    moe::profile::synthetic::Spec s{.vocab = kVocab, .experts = 160, .top_k = 6, .topics = 16,
                                    .occurrences = 400000, .affinity = 0.7, .seed = 1};
    auto prof = moe::profile::synthetic::generate(s);
    auto const& lc = prof.layer(0);
    x.table = sp::TokenDeviceTable::from_counts(lc, moe::placement::Table::contiguous(160, kDevices), kDevices, kVocab);
    moe::core::Rng rng(2);
    for (int a = 0; a < kDevices; ++a)
      for (int b = 0; b < kDevices; ++b) {
        std::vector<int> prev{a, b};
        for (int d = 0; d < kDevices; ++d) x.seq.add(prev, d, rng.uniform());
      }
    x.seq.finalize();
    // Token pool: ids in proportion to their profiled occurrences (about 400k entries).
    for (std::size_t r = 0; r < lc.rows(); ++r)
      for (std::int64_t o = 0; o < lc.row_total(r) / 6; ++o) x.tokens.push_back(lc.tokens[r]);
    rng.shuffle(x.tokens);
    for (std::size_t i = 0; i < x.tokens.size() * 2; ++i) x.history.push_back(static_cast<int>(rng.below(kDevices)));
    return x;
  }();
  return f;
}

// Token table only (the s-TS lookup before the gate) + the argsort/group plan.
void BM_LookupAndPlan(benchmark::State& state) {
  auto const& f = fixture();
  sp::Predictor pred(f.table);
  auto n = static_cast<std::size_t>(state.range(0));
  std::vector<int> dev(n);
  std::size_t offset = 0;
  for (auto _ : state) {
    if (offset + n > f.tokens.size()) offset = 0;
    std::span<int const> batch(f.tokens.data() + offset, n);
    pred.predict_devices(batch, dev);
    auto plan = sp::make_shuffle_plan(dev, kDevices);
    benchmark::DoNotOptimize(plan.permutation.data());
    offset += n;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(n),
                                                  benchmark::Counter::kIsRate);
}
BENCHMARK(BM_LookupAndPlan)->Arg(256)->Arg(4096)->Arg(65536);

// Token table + device-sequence table (2 layers of history), the more confident one wins.
void BM_LookupWithHistoryAndPlan(benchmark::State& state) {
  auto const& f = fixture();
  sp::Predictor pred(f.table, f.seq);
  auto n = static_cast<std::size_t>(state.range(0));
  std::vector<int> dev(n);
  std::size_t offset = 0;
  for (auto _ : state) {
    if (offset + n > f.tokens.size()) offset = 0;
    std::span<int const> batch(f.tokens.data() + offset, n);
    std::span<int const> hist(f.history.data() + 2 * offset, 2 * n);
    pred.predict_devices(batch, hist, dev);
    auto plan = sp::make_shuffle_plan(dev, kDevices);
    benchmark::DoNotOptimize(plan.permutation.data());
    offset += n;
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(n),
                                                  benchmark::Counter::kIsRate);
}
BENCHMARK(BM_LookupWithHistoryAndPlan)->Arg(4096)->Arg(65536);

// Plan + pack + unpack of bf16-sized rows (2 bytes x 2048 hidden as uint16), the host reference of
// the shuffle the layer performs.
void BM_PlanPackUnpack(benchmark::State& state) {
  auto const& f = fixture();
  sp::Predictor pred(f.table);
  auto n = static_cast<std::size_t>(state.range(0));
  std::size_t width = 2048;
  std::vector<int> dev(n);
  std::vector<std::uint16_t> rows(n * width, 1), packed(n * width), back(n * width);
  for (auto _ : state) {
    pred.predict_devices(std::span<int const>(f.tokens.data(), n), dev);
    auto plan = sp::make_shuffle_plan(dev, kDevices);
    sp::pack_rows<std::uint16_t>(plan, rows, packed, width);
    sp::unpack_rows<std::uint16_t>(plan, packed, back, width);
    benchmark::DoNotOptimize(back.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(n),
                                                  benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PlanPackUnpack)->Arg(4096);
}  // namespace

BENCHMARK_MAIN();
