// s-EG co-clustering solve time and quality: OLMoE-1B-7B layer 0 (real data, arxiv + book, 8 devices)
// and a DeepSeek-V2-sized problem (160 experts, top-6, 100k-token vocabulary, 8 devices; seeded
// synthetic profile, labelled). Counters: solve seconds, LAR and token imbalance on the fitted data,
// and LAR relative to METIS (or to k-means without libmetis) of the same problem.
#include <benchmark/benchmark.h>

#include <chrono>
#include <map>
#include <string>

#include "moe/speculative/cocluster.hpp"
#include "moe/speculative/cocluster_metis.hpp"
#include "moe/profile/olmoe_tokens.hpp"
#include "moe/profile/route_synthetic.hpp"

namespace {
namespace pl = moe::placement;

moe::speculative::CoclusterProblem const& olmoe() {
  static moe::speculative::CoclusterProblem p = [] {
    moe::profile::olmoe::LoadOptions o;
    o.only_layer = 0;
    auto prof = moe::profile::olmoe::load(MOE_SHARED_DATA_DIR, {"arxiv", "book"}, o);
    return moe::speculative::CoclusterProblem::from_counts(prof.layer(0), 8, 8);
  }();
  return p;
}

moe::speculative::CoclusterProblem const& deepseek_v2() {
  static moe::speculative::CoclusterProblem p = [] {
    moe::profile::synthetic::Spec s{.vocab = 100000, .experts = 160, .top_k = 6, .topics = 16,
                                    .occurrences = 1000000, .zipf = 1.05, .affinity = 0.6, .seed = 1};
    auto prof = moe::profile::synthetic::generate(s);
    return moe::speculative::CoclusterProblem::from_counts(prof.layer(0), 6, 8);
  }();
  return p;
}

// Reference LAR per problem (METIS when available, else k-means), computed once.
double reference_lar(moe::speculative::CoclusterProblem const& p) {
  static std::map<moe::speculative::CoclusterProblem const*, double> cache;
  auto it = cache.find(&p);
  if (it != cache.end()) return it->second;
#if MOE_HAS_METIS && defined(MOE_WITH_METIS)
  double lar = moe::speculative::solve_metis(p).local_rate;
#else
  double lar = moe::speculative::balanced_kmeans(p).local_rate;
#endif
  cache[&p] = lar;
  return lar;
}

template <class Solve>
void run(benchmark::State& state, moe::speculative::CoclusterProblem const& p, Solve solve) {
  double ref = reference_lar(p);
  moe::speculative::CoclusterResult r;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    r = solve(p);
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.counters["tokens"] = static_cast<double>(p.rows());
  state.counters["LAR"] = r.local_rate;
  state.counters["imbalance"] = r.imbalance;
  state.counters["LAR_vs_ref"] = r.local_rate / ref;
}

moe::speculative::CrossEntropyOptions ce_options(int iterations, int samples) {
  moe::speculative::CrossEntropyOptions o;
  o.iterations = iterations;
  o.samples = samples;
  return o;
}

void BM_OLMoE_CrossEntropy(benchmark::State& s) { run(s, olmoe(), [](auto const& p) { return moe::speculative::solve_cross_entropy(p); }); }
void BM_OLMoE_CrossEntropyPlain(benchmark::State& s) {
  run(s, olmoe(), [](auto const& p) {
    auto o = ce_options(30, 16);
    o.polish_rounds = o.final_polish_rounds = 0;
    return moe::speculative::solve_cross_entropy(p, o);
  });
}
void BM_OLMoE_KMeans(benchmark::State& s) { run(s, olmoe(), [](auto const& p) { return moe::speculative::balanced_kmeans(p); }); }
void BM_DSV2_CrossEntropy(benchmark::State& s) {
  run(s, deepseek_v2(), [](auto const& p) { return moe::speculative::solve_cross_entropy(p, ce_options(10, 8)); });
}
void BM_DSV2_KMeans(benchmark::State& s) { run(s, deepseek_v2(), [](auto const& p) { return moe::speculative::balanced_kmeans(p); }); }
BENCHMARK(BM_OLMoE_CrossEntropy)->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);
BENCHMARK(BM_OLMoE_CrossEntropyPlain)->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);
BENCHMARK(BM_OLMoE_KMeans)->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);
BENCHMARK(BM_DSV2_CrossEntropy)->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);
BENCHMARK(BM_DSV2_KMeans)->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);
#if MOE_HAS_METIS && defined(MOE_WITH_METIS)
void BM_OLMoE_Metis(benchmark::State& s) { run(s, olmoe(), [](auto const& p) { return moe::speculative::solve_metis(p); }); }
void BM_DSV2_Metis(benchmark::State& s) { run(s, deepseek_v2(), [](auto const& p) { return moe::speculative::solve_metis(p); }); }
BENCHMARK(BM_OLMoE_Metis)->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);
BENCHMARK(BM_DSV2_Metis)->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);
#endif
}  // namespace

BENCHMARK_MAIN();
