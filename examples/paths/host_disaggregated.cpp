// The disaggregated moe::Layer end to end on 4 in-process ranks (2 AG + 2 EG): solve a FinDEP schedule,
// hand it to the layer as its Schedule policy, run one forward pass and compare every AG rank's
// output with the single-process reference. Synthetic, seeded data: DeepSeek-V2 routing at hidden
// 128 / expert ffn 64, fp32, 6 samples of 8 tokens per AG rank.
//
//   example_host_disaggregated [pppipe]
#include <cmath>
#include <cstdio>
#include <random>
#include <string_view>

#include "moe/collective/in_process.hpp"
#include "moe/layer/paths/host_disaggregated.hpp"
#include "moe/layer/reference.hpp"
#include "moe/models/models.hpp"
#include "moe/schedule/findep.hpp"

namespace ms = moe::schedule;
using Model = moe::models::Reduced<moe::models::DeepSeekV2, 128, 64, moe::DType::f32>;
using Router = moe::router::ForModel<Model>;
constexpr int world = 4, ag = 2, samples = 6, seq = 8, tokens = samples * seq;
using Comm = moe::collective::InProcess<world>;

template <class Sched>
double run(Sched sched) {
  constexpr moe::ShapeSpec s = Model::spec;
  using L = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, Sched, Comm>;
  moe::RandomLayerWeights<float> weights(s, 1);
  std::vector<float> x(static_cast<std::size_t>(ag * tokens * s.hidden)), y(x.size()), ref(x.size());
  std::mt19937_64 rng(2);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& v : x) v = d(rng);
  moe::reference_forward<Router>(s, weights.view(), ag * tokens, x.data(), ref.data());
  auto h = static_cast<std::size_t>(s.hidden);
  auto on_eg = moe::placement::Table::round_robin(s.experts, world - ag);  // expert -> EG index
  moe::collective::run_in_process<world>([&](Comm& comm) {
    L layer(comm, on_eg, {}, weights.view(), {.max_tokens = tokens, .schedule = sched});
    std::vector<std::byte> ws(layer.workspace_size());
    typename L::Arguments a;
    if (layer.is_attention_rank()) {
      std::size_t first = static_cast<std::size_t>(comm.rank()) * tokens * h;
      a = {tokens, x.data() + first, y.data() + first};
    }
    layer.run(a, ws);
  });
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    diff = std::max(diff, std::abs(double(y[i]) - ref[i]));
    scale = std::max(scale, std::abs(double(ref[i])));
  }
  return diff / scale;
}

int main(int argc, char** argv) {
  bool pppipe = argc > 1 && std::string_view(argv[1]) == "pppipe";
  ms::Problem p{.shape = Model::spec, .ag = ag, .eg = world - ag, .seq = seq, .memory_bytes = 1e12, .batch = samples};
  ms::PerfModels models = ms::h100_cluster_reference();
  ms::Config c = pppipe ? ms::solve_pppipe(p, models).config : ms::solve_findep(p, models).config;
  std::printf("schedule: %s %s r1 %d m_a %d r2 %d\n", ms::pipeline_name(c.pipeline).data(),
              ms::order_name(c.order).data(), c.r1, c.m_a, c.r2);
  double err = pppipe ? run(ms::PPPipe::from(c, ag)) : run(ms::FinDep::from(c, ag));
  std::printf("max relative error vs reference_forward: %.3g\n", err);
  return err <= 1e-5 ? 0 : 1;
}
