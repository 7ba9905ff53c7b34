// FinDEP host executor on InProcess ranks: AG/EG split, micro-batches and token chunks, AASS, ASAS
// and PPPipe; the output must equal the single-process sequential layer (moe::reference_forward,
// fp32, 1e-5 normwise relative) for every order, r1 and r2 tried; bad inputs give clear errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>

#include "moe/collective/in_process.hpp"
#include "moe/layer/layer.hpp"
#include "moe/layer/reference.hpp"
#include "moe/models/models.hpp"
#include "moe/schedule/findep_executor.hpp"

using namespace moe;
using namespace moe::schedule;

namespace {
// DeepSeek-V2 routing (160 experts, top-6, 8 groups / 3, 2 shared experts) and Mixtral routing
// (8 experts, top-2, no shared expert) at reduced widths, fp32.
using DeepSeekSmall = models::Reduced<models::DeepSeekV2, 64, 32, DType::f32>;
using MixtralSmall = models::Reduced<models::Mixtral8x7B, 64, 48, DType::f32>;

constexpr int world = 4;
constexpr int tokens_per_ag = 24;

std::vector<float> random_tokens(int tokens, int hidden, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(tokens) * static_cast<std::size_t>(hidden));
  for (auto& v : x) v = d(rng);
  return x;
}

double rel_error(float const* a, float const* b, std::size_t n) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

/// Runs the executor with `ag` AG ranks of `world`; returns the worst relative error of any AG rank.
template <class Model>
double run_case(int ag, Config const& c, std::uint64_t seed) {
  using Router = router::ForModel<Model>;
  constexpr ShapeSpec s = Model::spec;
  int eg = world - ag;
  RandomLayerWeights<float> weights(s, seed);
  int total = ag * tokens_per_ag;
  auto x = random_tokens(total, s.hidden, seed + 7);
  std::vector<float> ref(x.size());
  reference_forward<Router>(s, weights.view(), total, x.data(), ref.data());
  auto h = static_cast<std::size_t>(s.hidden);
  std::vector<float> y(x.size(), -1.0f);
  placement::Table eg_placement = placement::Table::round_robin(s.experts, eg);
  collective::run_in_process<world>([&](collective::InProcess<world>& comm) {
    // Every rank holds only what its role needs.
    auto view = weights.view();
    std::vector<ExpertWeights<float>> mine;
    if (comm.rank() < ag) {
      mine.assign(static_cast<std::size_t>(s.experts), ExpertWeights<float>{});
    } else {
      mine = weights.experts_where([&](int e) { return eg_placement.rank_of(e) == comm.rank() - ag; });
      view.router = nullptr;
    }
    view.experts = mine;
    FinDepExecutor<Router, float, collective::InProcess<world>> ex(comm, s, ag, eg_placement, view);
    typename decltype(ex)::Arguments a;
    if (comm.rank() < ag) {
      std::size_t first = static_cast<std::size_t>(comm.rank()) * tokens_per_ag * h;
      a = {tokens_per_ag, x.data() + first, y.data() + first};
    }
    ex.run(a, c);
  });
  return rel_error(y.data(), ref.data(), y.size());
}

std::vector<Config> configs() {
  std::vector<Config> out;
  // (r1, r2) with r1 | 24 and r2 | 24 / r1.
  std::pair<int, int> pairs[] = {{1, 1}, {1, 4}, {2, 3}, {3, 2}, {4, 3}, {6, 4}, {24, 1}};
  for (auto [r1, r2] : pairs)
    for (Order o : {Order::aass, Order::asas}) out.push_back(Config{Pipeline::findep, o, r1, 1, r2});
  for (int r1 : {1, 2, 3, 8}) out.push_back(Config{Pipeline::pppipe, Order::asas, r1, 1, 1});
  return out;
}
}  // namespace

TEMPLATE_TEST_CASE("FinDEP executor equals the sequential layer for every order, r1 and r2", "[schedule][executor]",
                   DeepSeekSmall, MixtralSmall) {
  std::uint64_t seed = 100;
  for (int ag : {2, 3, 1})
    for (Config const& c : configs()) {
      double err = run_case<TestType>(ag, c, seed++);
      INFO(pipeline_name(c.pipeline) << " " << order_name(c.order) << " r1 " << c.r1 << " r2 " << c.r2 << " ag "
                                     << ag << " eg " << world - ag);
      CHECK(err <= 1e-5);
    }
}

TEST_CASE("FinDEP executor rejects bad input", "[schedule][executor][bad-input]") {
  using Model = MixtralSmall;
  constexpr ShapeSpec s = Model::spec;
  using Router = router::ForModel<Model>;
  using Ex = FinDepExecutor<Router, float, collective::InProcess<world>>;
  RandomLayerWeights<float> weights(s, 5);
  auto x = random_tokens(tokens_per_ag, s.hidden, 9);
  std::vector<float> y(x.size());
  auto run = [&](int ag, placement::Table p, Config c, int tokens_on_eg = 0) {
    std::vector<std::vector<float>> out(world, std::vector<float>(x.size()));
    collective::run_in_process<world>([&](collective::InProcess<world>& comm) {
      Ex ex(comm, s, ag, p, weights.view());
      typename Ex::Arguments a;
      if (comm.rank() < ag)
        a = {tokens_per_ag, x.data(), out[static_cast<std::size_t>(comm.rank())].data()};
      else
        a.tokens = tokens_on_eg;
      ex.run(a, c);
    });
  };
  placement::Table two = placement::Table::round_robin(s.experts, 2);
  SECTION("r1 that does not divide an AG rank's tokens") {
    CHECK_THROWS_WITH(run(2, two, Config{Pipeline::findep, Order::aass, 5, 1, 1}),
                      Catch::Contains("r1 = 5 does not divide the 24 tokens"));
  }
  SECTION("r2 that does not divide a micro-batch") {
    CHECK_THROWS_WITH(run(2, two, Config{Pipeline::findep, Order::asas, 2, 1, 5}),
                      Catch::Contains("r2 = 5 does not divide the 12 tokens of a micro-batch"));
  }
  SECTION("PPPipe with chunks") {
    CHECK_THROWS_WITH(run(2, two, Config{Pipeline::pppipe, Order::asas, 2, 1, 2}),
                      Catch::Contains("PPPipe has no token chunks"));
  }
  SECTION("empty expert group") {
    CHECK_THROWS_WITH(run(4, two, Config{}), Catch::Contains("expert group (EG) is empty"));
  }
  SECTION("empty attention group") {
    CHECK_THROWS_WITH(run(0, placement::Table::round_robin(s.experts, 4), Config{}),
                      Catch::Contains("attention group (AG) is empty"));
  }
  SECTION("placement over more ranks than the expert group") {
    CHECK_THROWS_WITH(run(2, placement::Table::round_robin(s.experts, 3), Config{}),
                      Catch::Contains("outside [0, 2)"));
  }
  SECTION("tokens on an EG rank") {
    CHECK_THROWS_WITH(run(2, two, Config{}, 4), Catch::Contains("tokens live on the AG ranks"));
  }
}

TEMPLATE_TEST_CASE("FinDEP executor equals the sequential moe::Layer on the same tokens", "[schedule][executor]",
                   DeepSeekSmall, MixtralSmall) {
  using Model = TestType;
  using Router = router::ForModel<Model>;
  using Comm = collective::InProcess<world>;
  using Lyr = Layer<Model, Router, placement::Table, replication::None, schedule::Sequential, Comm>;
  constexpr ShapeSpec s = Model::spec;
  constexpr int ag = 2;
  auto h = static_cast<std::size_t>(s.hidden);
  RandomLayerWeights<float> weights(s, 77);
  int total = ag * tokens_per_ag;
  auto x = random_tokens(total, s.hidden, 78);
  // The expert-parallel Layer with the sequential schedule: every rank holds a quarter of the tokens.
  std::vector<float> y_layer(x.size());
  placement::Table ep = placement::Table::contiguous(s.experts, world);
  collective::run_in_process<world>([&](Comm& comm) {
    int per = total / world, r = comm.rank();
    auto view = weights.view();
    auto local = weights.experts_where([&](int e) { return ep.rank_of(e) == r; });
    view.experts = local;
    Lyr layer(comm, ep, replication::None{}, view, {.max_tokens = per});
    std::vector<std::byte> ws(layer.workspace_size());
    std::size_t first = static_cast<std::size_t>(r * per) * h;
    layer.run({.tokens = per, .x = x.data() + first, .y = y_layer.data() + first, .first_token = r * per}, ws);
  });
  // The FinDEP executor on 2 AG + 2 EG ranks.
  placement::Table eg_placement = placement::Table::contiguous(s.experts, world - ag);
  for (Config c : {Config{Pipeline::findep, Order::aass, 3, 1, 4}, Config{Pipeline::findep, Order::asas, 4, 1, 2},
                   Config{Pipeline::pppipe, Order::asas, 2, 1, 1}}) {
    std::vector<float> y(x.size(), -1.0f);
    collective::run_in_process<world>([&](Comm& comm) {
      FinDepExecutor<Router, float, Comm> ex(comm, s, ag, eg_placement, weights.view());
      typename FinDepExecutor<Router, float, Comm>::Arguments a;
      if (comm.rank() < ag) {
        std::size_t first = static_cast<std::size_t>(comm.rank()) * tokens_per_ag * h;
        a = {tokens_per_ag, x.data() + first, y.data() + first};
      }
      ex.run(a, c);
    });
    INFO(pipeline_name(c.pipeline) << " " << order_name(c.order) << " r1 " << c.r1 << " r2 " << c.r2);
    CHECK(rel_error(y.data(), y_layer.data(), y.size()) <= 1e-5);
  }
}
