#pragma once
// s-TS (ShuffledLayer) scenarios shared by the InProcess and MPI tests: the shuffled pipeline
// (SRS + layer + SAG) must equal the all-reduce pipeline and the single-process reference whatever
// the predictions, and its collective byte counts must match the volume formulas of Speculative MoE
// section 3.2 (speculative/comm_volume.hpp) at the measured local activation rate.

#include <cstring>
#include <numeric>
#include <random>
#include <set>

#include "layer_check.hpp"
#include "moe/layer/shuffled.hpp"
#include "moe/speculative/comm_volume.hpp"

namespace moe::test {

using ShuffleModel = models::Reduced<models::DeepSeekV3, 64, 32, DType::f32>;
inline constexpr int shuffle_batch = 48;

enum class Prediction { random, all_to_rank0, oracle, anti_oracle };
inline constexpr Prediction all_predictions[] = {Prediction::random, Prediction::all_to_rank0, Prediction::oracle,
                                                 Prediction::anti_oracle};
inline char const* name(Prediction p) {
  constexpr char const* names[] = {"random", "all_to_rank0", "oracle", "anti_oracle"};
  return names[static_cast<int>(p)];
}

/// What one rank measured; trivially copyable so ranks can all-gather it.
struct ShuffleOutcome {
  double error_baseline = 0, error_shuffled = 0, baseline_vs_shuffled = 0;
  long long assignments[2] = {0, 0}, local[2] = {0, 0};  // [baseline, shuffled]
  std::size_t combine[2] = {0, 0}, dispatch[2] = {0, 0}, record_bytes = 0;
  std::size_t all_reduce = 0, reduce_scatter = 0, all_gather[2] = {0, 0};
};

/// Runs the batch through both pipelines on this rank and returns every rank's outcome.
template <class Comm>
std::vector<ShuffleOutcome> run_shuffle_case(Comm& comm, Prediction pred, bool deduplicate, std::uint64_t seed) {
  using Model = ShuffleModel;
  using Router = router::SigmoidGroupTopK;
  using Inner = Layer<Model, Router, placement::Table, replication::None, schedule::Sequential, Comm>;
  constexpr ShapeSpec s = Model::spec;
  int ranks = comm.size(), rank = comm.rank();
  auto h = static_cast<std::size_t>(s.hidden), k = static_cast<std::size_t>(s.top_k);
  auto B = static_cast<std::size_t>(shuffle_batch);

  RandomLayerWeights<float> weights(s, seed);
  auto placement = placement::Table::contiguous(s.experts, ranks);
  // Partial sums of a tensor-parallel attention: each rank's share, seeded per rank; the true input is
  // their sum in rank order.
  std::vector<std::vector<float>> partials;
  for (int r = 0; r < ranks; ++r) partials.push_back(random_tokens<float>(shuffle_batch, s.hidden, seed * 100 + r));
  std::vector<float> x(B * h, 0.0f), ref(B * h);
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += partials[static_cast<std::size_t>(r)][i];
  std::vector<int> ids(B * k);
  std::vector<float> gw(B * k);
  reference_forward<Router>(s, weights.view(), shuffle_batch, x.data(), ref.data(), ids, gw);

  std::vector<int> predicted(B);
  std::mt19937 rng(static_cast<unsigned>(seed));
  for (std::size_t t = 0; t < B; ++t) {
    std::vector<int> hits(static_cast<std::size_t>(ranks), 0);
    for (std::size_t j = 0; j < k; ++j) ++hits[static_cast<std::size_t>(placement.rank_of(ids[t * k + j]))];
    auto best = static_cast<int>(std::max_element(hits.begin(), hits.end()) - hits.begin());
    auto worst = static_cast<int>(std::min_element(hits.begin(), hits.end()) - hits.begin());
    switch (pred) {
      case Prediction::random: predicted[t] = static_cast<int>(rng() % static_cast<unsigned>(ranks)); break;
      case Prediction::all_to_rank0: predicted[t] = 0; break;
      case Prediction::oracle: predicted[t] = best; break;
      case Prediction::anti_oracle: predicted[t] = worst; break;
    }
  }

  auto local = weights.experts_where([&](int e) { return placement.rank_of(e) == rank; });
  auto view = weights.view();
  view.experts = local;
  Inner inner(comm, placement, {}, view, {.max_tokens = shuffle_batch, .deduplicate = deduplicate});
  ShuffledLayer<Inner> layer(inner, shuffle_batch);
  std::vector<std::byte> ws(layer.workspace_size());
  std::vector<float> y_base(B * h), y_shuf(B * h);
  auto const& mine = partials[static_cast<std::size_t>(rank)];

  ShuffleOutcome o;
  comm.reset_counters();
  layer.run_baseline({.tokens = shuffle_batch, .partial = mine.data(), .y = y_base.data()}, ws);
  auto cb = comm.counters();
  o.all_reduce = cb[collective::Op::all_reduce];
  // The inner layer's agreement on its pass is an all-gather too (LayerStats::agreement_bytes).
  o.all_gather[0] = cb[collective::Op::all_gather] - inner.stats().agreement_bytes;
  o.assignments[0] = inner.stats().assignments;
  o.local[0] = inner.stats().local_assignments;
  o.combine[0] = inner.stats().combine_bytes;
  o.dispatch[0] = inner.stats().dispatch_bytes;
  comm.reset_counters();
  layer.run_shuffled({.tokens = shuffle_batch, .partial = mine.data(), .y = y_shuf.data(), .predicted = predicted}, ws);
  auto cs = comm.counters();
  o.reduce_scatter = cs[collective::Op::reduce_scatter];
  o.all_gather[1] = cs[collective::Op::all_gather] - inner.stats().agreement_bytes;
  o.assignments[1] = inner.stats().assignments;
  o.local[1] = inner.stats().local_assignments;
  o.combine[1] = inner.stats().combine_bytes;
  o.dispatch[1] = inner.stats().dispatch_bytes;
  o.record_bytes = inner.stats().record_bytes;
  o.error_baseline = max_relative_error(y_base, ref);
  o.error_shuffled = max_relative_error(y_shuf, ref);
  o.baseline_vs_shuffled = max_relative_error(y_shuf, y_base);

  std::vector<ShuffleOutcome> all(static_cast<std::size_t>(ranks));
  std::vector<std::size_t> sizes(static_cast<std::size_t>(ranks), sizeof(ShuffleOutcome));
  comm.all_gather_v(std::as_bytes(std::span<ShuffleOutcome const>(&o, 1)), std::as_writable_bytes(std::span(all)), sizes);
  return all;
}

/// Failures of one case, given every rank's outcome (empty = all good).
inline std::vector<std::string> check_shuffle_case(std::vector<ShuffleOutcome> const& all, Prediction pred,
                                                   bool deduplicate) {
  std::vector<std::string> bad;
  auto expect = [&](bool ok, std::string const& what) {
    if (!ok) bad.push_back(std::string(name(pred)) + (deduplicate ? " dedup: " : " per-expert: ") + what);
  };
  auto D = static_cast<int>(all.size());
  constexpr ShapeSpec s = ShuffleModel::spec;
  long long assign[2] = {0, 0}, local[2] = {0, 0};
  std::size_t combine[2] = {0, 0}, dispatch[2] = {0, 0}, ar = 0, rs = 0, ag[2] = {0, 0};
  for (auto const& o : all) {
    expect(o.error_baseline <= 1e-5, "all-reduce pipeline differs from the reference");
    expect(o.error_shuffled <= 1e-5, "shuffled pipeline differs from the reference");
    expect(o.baseline_vs_shuffled <= 1e-5, "shuffled pipeline differs from the all-reduce pipeline");
    for (int m = 0; m < 2; ++m) {
      assign[m] += o.assignments[m];
      local[m] += o.local[m];
      combine[m] += o.combine[m];
      dispatch[m] += o.dispatch[m];
      ag[m] += o.all_gather[m];
    }
    ar += o.all_reduce;
    rs += o.reduce_scatter;
  }
  expect(assign[0] == shuffle_batch * s.top_k && assign[1] == assign[0], "assignments do not add up");
  speculative::VolumeModel fp32{.devices = D, .tokens = shuffle_batch, .hidden = s.hidden, .top_k = s.top_k,
                                .bytes_per_element = 4, .all_to_all_passes = 1};
  expect(double(ar) == fp32.all_reduce(), "all-reduce bytes differ from 2 (D-1) T H b");
  expect(double(rs) == fp32.reduce_scatter(), "reduce-scatter bytes differ from (D-1) T H b");
  expect(double(ag[0]) == fp32.all_gather() && double(ag[1]) == fp32.all_gather(),
         "all-gather bytes differ from (D-1) T H b");
  if (!deduplicate) {
    // One copy per remote assignment: the all-to-all formula (1 - LAR) K T H b, per direction.
    for (int m = 0; m < 2; ++m) {
      double lar = double(local[m]) / double(assign[m]);
      expect(std::abs(double(combine[m]) - fp32.all_to_all(lar)) < 0.5, "combine bytes differ from (1-LAR) K T H b");
      double rows = (1.0 - lar) * double(assign[m]);
      expect(std::abs(double(dispatch[m]) - rows * double(all[0].record_bytes)) < 0.5,
             "dispatch bytes differ from one record per remote assignment");
    }
  }
  double lar0 = double(local[0]) / double(assign[0]), lar1 = double(local[1]) / double(assign[1]);
  if (pred == Prediction::oracle) {
    expect(lar1 > lar0, "oracle predictions did not raise the local activation rate");
    // Per token, the oracle's rank serves the most of its experts, so it needs the fewest remote
    // copies (strictly fewer per-expert copies here; never more de-duplicated records).
    if (deduplicate) {
      expect(combine[1] <= combine[0], "oracle predictions raised the de-duplicated combine bytes");
    } else {
      expect(combine[1] < combine[0], "oracle predictions did not cut the combine bytes");
    }
  }
  if (pred == Prediction::anti_oracle) expect(lar1 < lar0, "anti-oracle predictions did not lower the rate");
  return bad;
}

/// Runs every prediction kind with and without de-duplication; returns the failures seen by this rank.
template <class Comm>
std::vector<std::string> run_shuffle_cases(Comm& comm) {
  std::vector<std::string> bad;
  std::uint64_t seed = 5;
  for (Prediction p : all_predictions)
    for (bool dedup : {false, true}) {
      auto all = run_shuffle_case(comm, p, dedup, ++seed);
      auto b = check_shuffle_case(all, p, dedup);
      bad.insert(bad.end(), b.begin(), b.end());
    }
  return bad;
}

}  // namespace moe::test
