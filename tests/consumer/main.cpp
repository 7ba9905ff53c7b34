// A host engine in miniature: one DeepSeek-V3-shaped MoE layer at reduced width on 2 in-process ranks,
// checked against the reference. Exits non-zero on a mismatch.
#include <moe/moe.hpp>

#include <cmath>
#include <cstdio>

int main() {
  using Model = moe::models::Reduced<moe::models::DeepSeekV3, 32, 16, moe::DType::f32>;
  using Router = moe::router::ForModel<Model>;
  using Layer = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential,
                           moe::collective::InProcess<2>>;
  moe::RandomLayerWeights<float> weights(Model::spec, 7);
  std::vector<float> x(2 * 4 * 32), ref(x.size()), y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i));
  moe::reference_forward<Router>(Model::spec, weights.view(), 8, x.data(), ref.data());
  moe::collective::run_in_process<2>([&](auto& comm) {
    Layer layer(comm, moe::placement::Table::contiguous(256, 2), {}, weights.view(), {.max_tokens = 4});
    std::vector<std::byte> ws(layer.workspace_size());
    std::size_t at = static_cast<std::size_t>(comm.rank()) * 4 * 32;
    layer.run({.tokens = 4, .x = x.data() + at, .y = y.data() + at, .first_token = comm.rank() * 4}, ws);
  });
  double worst = 0;
  for (std::size_t i = 0; i < y.size(); ++i) worst = std::max(worst, double(std::abs(y[i] - ref[i])));
  std::printf("consumer: max abs difference %.3g\n", worst);
  return worst < 1e-5 ? 0 : 1;
}
