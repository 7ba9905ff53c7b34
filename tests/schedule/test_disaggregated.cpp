// The host disaggregated path of moe::Layer on InProcess ranks: the FinDEP / PPPipe pipeline picked at compile time by
// the Schedule policy type, its configuration from the solver or fixed; every AG rank's output must
// equal moe::reference_forward (fp32, 1e-5 normwise relative). Bad input gives clear errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <string>
#include <type_traits>

#include "../support/load_window_rows.hpp"
#include "disaggregated_cases.hpp"
#include "moe/collective/in_process.hpp"

using namespace moe;
using namespace moe::schedule;
using namespace moe::test::findep;

namespace {
template <class Model, class Schedule, int N, class Replicas = replication::None>
void check_split(int ag, std::uint64_t seed) {
  std::vector<std::vector<Result>> per_rank(N);
  collective::run_in_process<N>([&](collective::InProcess<N>& comm) {
    per_rank[static_cast<std::size_t>(comm.rank())] =
        run_disaggregated_cases<Model, Schedule, collective::InProcess<N>, Replicas>(comm, ag, seed);
  });
  for (int r = 0; r < ag; ++r) {
    REQUIRE(!per_rank[static_cast<std::size_t>(r)].empty());
    for (Result const& res : per_rank[static_cast<std::size_t>(r)]) {
      INFO(res.what << ", AG rank " << r);
      CHECK(res.vs_reference <= tolerance);
      CHECK(res.vs_textbook <= moe::test::textbook::fp32_tolerance);
    }
  }
}
}  // namespace

TEMPLATE_TEST_CASE("disaggregated Layer equals the sequential layer (InProcess)", "[schedule][disaggregated]",
                   FinDep, PPPipe) {
  static_assert(DisaggregatedPolicy<TestType>);
  for (int ag : {1, 2, 3}) {
    check_split<DeepSeekSmall, TestType, 4>(ag, 700 + static_cast<std::uint64_t>(ag));
    check_split<MixtralSmall, TestType, 4>(ag, 710 + static_cast<std::uint64_t>(ag));
  }
  check_split<DeepSeekSmall, TestType, 3>(2, 720);
  check_split<MixtralSmall, TestType, 5>(3, 730);
}

TEMPLATE_TEST_CASE("moe::Layer with a FinDep or PPPipe schedule takes the host disaggregated path",
                   "[schedule][disaggregated]", FinDep, PPPipe) {
  // The composition of the design: Router, Placement, Replicas, Schedule, Collective.
  using Model = DeepSeekSmall;
  using Router = router::ForModel<Model>;
  using Comm = collective::InProcess<4>;
  STATIC_REQUIRE(Layer<Model, Router, placement::Table, replication::Table, TestType, Comm>::path ==
                 ExecutionPath::host_disaggregated);
  STATIC_REQUIRE(Layer<Model, Router, placement::Table, replication::Table, schedule::Sequential, Comm>::path ==
                 ExecutionPath::host);
  // A replica table with one copy per expert, and replication::None.
  check_split<DeepSeekSmall, TestType, 4, replication::Table>(2, 740);
  check_split<MixtralSmall, TestType, 3, replication::None>(1, 750);
  check_split<MixtralSmall, TestType, 4, replication::Table>(3, 760);
}

namespace {
/// The weights a rank passes to a disaggregated layer: on an EG rank those of the experts its EG
/// index holds a copy of, on an AG rank none (`view` points into `held`).
struct RankWeights {
  std::vector<ExpertWeights<float>> held;
  LayerWeights<float> view;
};
RankWeights rank_weights(RandomLayerWeights<float> const& w, replication::Table const& table, int rank, int ag) {
  RankWeights r{w.experts_where([&](int e) { return rank >= ag && table.holds(e, 0, rank - ag); }), w.view()};
  r.view.experts = r.held;
  return r;
}

/// The records AG rank p sends to EG index g in one forward pass (records[p][g]), counted
/// independently of the executor from the documented rule: token t of AG rank p uses copy
/// (p + t) mod n of the n copies the table lists for an expert, and goes once to each EG index
/// serving one of its experts.
template <class Router>
std::vector<std::vector<std::size_t>> expected_records(ShapeSpec const& s, LayerWeights<float> const& w, float const* x,
                                                       int ag, int tokens, replication::Table const& table, int eg) {
  std::vector<std::vector<std::size_t>> records(static_cast<std::size_t>(ag),
                                                std::vector<std::size_t>(static_cast<std::size_t>(eg), 0));
  auto k = static_cast<std::size_t>(s.top_k), h = static_cast<std::size_t>(s.hidden);
  std::vector<float> logits(static_cast<std::size_t>(s.experts));
  std::vector<int> ids(k);
  std::vector<float> gates(k);
  std::span<float const> bias;
  if (w.router_bias) bias = {w.router_bias, static_cast<std::size_t>(s.experts)};
  for (int p = 0; p < ag; ++p)
    for (int t = 0; t < tokens; ++t) {
      float const* xt = x + (static_cast<std::size_t>(p) * static_cast<std::size_t>(tokens) + static_cast<std::size_t>(t)) * h;
      kernels::host::gate_logits(xt, 1, s.hidden, w.router, s.experts, logits.data());
      router::route_all<Router>(s, logits, bias, 1, ids, gates);
      std::vector<bool> hit(static_cast<std::size_t>(eg), false);
      for (int e : ids) {
        auto const& copies = table.replicas()[static_cast<std::size_t>(e)];
        hit[static_cast<std::size_t>(copies[static_cast<std::size_t>((p + t) % static_cast<int>(copies.size()))])] = true;
      }
      for (int g = 0; g < eg; ++g)
        records[static_cast<std::size_t>(p)][static_cast<std::size_t>(g)] += hit[static_cast<std::size_t>(g)];
    }
  return records;
}

template <class Model, class Schedule, int N>
void check_replicated(int ag, std::uint64_t seed) {
  using Router = router::ForModel<Model>;
  using Comm = collective::InProcess<N>;
  using Lyr = Layer<Model, Router, placement::Table, replication::Table, Schedule, Comm>;
  constexpr ShapeSpec s = Model::spec;
  int eg = N - ag;
  auto h = static_cast<std::size_t>(s.hidden);
  RandomLayerWeights<float> weights(s, seed);
  auto x = random_tokens(ag * tokens_per_ag, s.hidden, seed + 3);
  placement::Table on_eg = blocks(s.experts, eg);
  replication::Table table = replicated_on_eg(on_eg, eg);
  auto by_pair = expected_records<Router>(s, weights.view(), x.data(), ag, tokens_per_ag, table, eg);
  std::vector<std::size_t> expected(static_cast<std::size_t>(eg), 0), by_ag(static_cast<std::size_t>(ag), 0);
  for (int p = 0; p < ag; ++p)
    for (int g = 0; g < eg; ++g) {
      expected[static_cast<std::size_t>(g)] += by_pair[static_cast<std::size_t>(p)][static_cast<std::size_t>(g)];
      by_ag[static_cast<std::size_t>(p)] += by_pair[static_cast<std::size_t>(p)][static_cast<std::size_t>(g)];
    }
  auto scheds = schedules<Schedule>(s, ag, N);
  auto runs = scheds.size();
  std::vector<std::vector<float>> y(static_cast<std::size_t>(ag) * runs);
  std::vector<std::vector<std::size_t>> sent(static_cast<std::size_t>(eg), std::vector<std::size_t>(runs));
  // stats() of each rank and run: records_remote, records_local, records_received
  std::vector<std::vector<std::array<long long, 3>>> records(N, std::vector<std::array<long long, 3>>(runs));
  collective::run_in_process<N>([&](Comm& comm) {
    int rank = comm.rank();
    bool is_ag = rank < ag;
    auto mine_w = rank_weights(weights, table, rank, ag);
    auto const& view = mine_w.view;
    for (std::size_t r = 0; r < runs; ++r) {
      Lyr layer(comm, on_eg, table, view, {.max_tokens = tokens_per_ag, .schedule = scheds[r]});
      std::vector<std::byte> ws(layer.workspace_size());
      typename Lyr::Arguments a;
      if (is_ag) {
        auto& out = y[static_cast<std::size_t>(rank) * runs + r];
        out.assign(static_cast<std::size_t>(tokens_per_ag) * h, -1.0f);
        a = {tokens_per_ag, x.data() + static_cast<std::size_t>(rank) * tokens_per_ag * h, out.data()};
      }
      layer.run(a, ws);  // twice: what is checked is the second pass's alone
      auto before = comm.counters()[collective::Op::send];
      layer.run(a, ws);
      if (!is_ag) sent[static_cast<std::size_t>(rank - ag)][r] = comm.counters()[collective::Op::send] - before;
      auto const& st = layer.stats();
      records[static_cast<std::size_t>(rank)][r] = {st.records_remote, st.records_local, st.records_received};
    }
  });
  for (int p = 0; p < ag; ++p) {
    std::vector<float> ref(static_cast<std::size_t>(tokens_per_ag) * h);
    reference_forward<Router>(s, weights.view(), tokens_per_ag, x.data() + static_cast<std::size_t>(p) * tokens_per_ag * h,
                              ref.data());
    for (std::size_t r = 0; r < runs; ++r) {
      INFO(describe(scheds[r].config(), ag, eg) << ", AG rank " << p << ", replicated experts");
      CHECK(rel_error(y[static_cast<std::size_t>(p) * runs + r].data(), ref.data(), ref.size()) <= tolerance);
    }
  }
  // An EG rank sends one fp32 partial row back per record it received.
  for (int g = 0; g < eg; ++g)
    for (std::size_t r = 0; r < runs; ++r) {
      INFO("EG index " << g << ", " << describe(scheds[r].config(), ag, eg));
      CHECK(sent[static_cast<std::size_t>(g)][r] == expected[static_cast<std::size_t>(g)] * h * sizeof(float));
      auto want = static_cast<long long>(expected[static_cast<std::size_t>(g)]);
      CHECK(records[static_cast<std::size_t>(ag + g)][r] == std::array<long long, 3>{0, 0, want});
    }
  // stats(): an AG rank's records all go to EG ranks; an EG rank counts those it received.
  for (int p = 0; p < ag; ++p)
    for (std::size_t r = 0; r < runs; ++r) {
      INFO("AG rank " << p << ", " << describe(scheds[r].config(), ag, eg));
      auto want = static_cast<long long>(by_ag[static_cast<std::size_t>(p)]);
      CHECK(records[static_cast<std::size_t>(p)][r] == std::array<long long, 3>{want, 0, 0});
    }
}
}  // namespace

TEMPLATE_TEST_CASE("disaggregated Layer spreads replicated experts over their expert-group copies",
                   "[schedule][disaggregated][replicas]", FinDep, PPPipe) {
  check_replicated<DeepSeekSmall, TestType, 4>(2, 770);
  check_replicated<MixtralSmall, TestType, 5>(2, 780);
  check_replicated<MixtralSmall, TestType, 4>(1, 790);
}

namespace {
/// run_batch_split_cases on N InProcess ranks: every AG output against the reference; every AG
/// rank's splits against what the EG ranks received; the busiest EG index of each micro-batch at
/// the least max load, never above the fixed rule's; the counts' bytes in control_bytes.
template <class Model, class Schedule, int N>
void check_batch_split(int ag, std::uint64_t seed) {
  std::vector<std::vector<SplitResult>> per_rank(N);
  collective::run_in_process<N>([&](collective::InProcess<N>& comm) {
    per_rank[static_cast<std::size_t>(comm.rank())] = run_batch_split_cases<Model, Schedule>(comm, ag, seed);
  });
  for (int rank = 0; rank < N; ++rank)
    for (SplitResult const& r : per_rank[static_cast<std::size_t>(rank)]) check_split(r, ", rank " + std::to_string(rank));
}
}  // namespace

TEMPLATE_TEST_CASE("disaggregated Layer splits each micro-batch over the copies (replication::BatchSplit)",
                   "[schedule][disaggregated][replicas][batch-split]", FinDep, PPPipe) {
  check_batch_split<DeepSeekSmall, TestType, 4>(2, 800);
  check_batch_split<MixtralSmall, TestType, 5>(2, 810);
  check_batch_split<MixtralSmall, TestType, 4>(1, 820);
  check_batch_split<DeepSeekSmall, TestType, 5>(3, 830);
}

namespace {
/// LayerOptions::live.window on the host disaggregated path: N ranks (ag of them AG), two passes
/// on different tokens, then the window of every rank against counts made here from the router
/// applied token by token and the documented copy rule (token t of AG rank p uses copy (p + t) mod
/// n of an expert's n copies): pairs per expert, and the pairs each rank received (AG ranks none,
/// EG index g is rank ag + g).
template <class Model, int N>
void check_window(int ag, std::uint64_t seed) {
  using Router = router::ForModel<Model>;
  using Comm = collective::InProcess<N>;
  using Lyr = Layer<Model, Router, placement::Table, replication::Table, FinDep, Comm>;
  static_assert(Lyr::counts_loads && Lyr::can_replan);  // re-planning: tests/layer/test_live_disaggregated.cpp
  constexpr ShapeSpec s = Model::spec;
  int eg = N - ag;
  auto h = static_cast<std::size_t>(s.hidden), k = static_cast<std::size_t>(s.top_k);
  auto E = static_cast<std::size_t>(s.experts);
  RandomLayerWeights<float> weights(s, seed);
  placement::Table on_eg = blocks(s.experts, eg);
  replication::Table table = replicated_on_eg(on_eg, eg);
  constexpr int passes = 2;
  std::vector<std::vector<float>> x;
  std::vector<std::vector<long long>> want;
  for (int i = 0; i < passes; ++i) {
    x.push_back(random_tokens(ag * tokens_per_ag, s.hidden, seed + 3 + static_cast<std::uint64_t>(i)));
    auto ids = routes_of<Router>(s, weights.view(), x.back().data(), ag * tokens_per_ag);
    want.push_back(moe::test::disaggregated_row(ids, k, ag, tokens_per_ag, table.replicas(), N));
  }
  std::vector<std::vector<std::vector<long long>>> seen(N);
  std::vector<long long> last_max(N, -1);
  std::vector<double> last_mean(N, -1);
  collective::run_in_process<N>([&](Comm& comm) {
    int rank = comm.rank();
    bool is_ag = rank < ag;
    auto mine_w = rank_weights(weights, table, rank, ag);
    auto const& view = mine_w.view;
    Lyr layer(comm, on_eg, table, view,
              {.max_tokens = tokens_per_ag, .schedule = FinDep{ag, Order::aass, 3, 2}, .live = {.window = 3}});
    std::vector<std::byte> ws(layer.workspace_size());
    std::vector<float> y(is_ag ? static_cast<std::size_t>(tokens_per_ag) * h : 0);
    for (int i = 0; i < passes; ++i) {
      typename Lyr::Arguments a;
      if (is_ag) a = {tokens_per_ag, x[static_cast<std::size_t>(i)].data() + static_cast<std::size_t>(rank) * tokens_per_ag * h, y.data()};
      layer.run(a, ws);
    }
    auto const& w = layer.load_window();
    seen[static_cast<std::size_t>(rank)] = moe::test::window_rows(w);
    last_max[static_cast<std::size_t>(rank)] = layer.stats().rank_load_max;
    last_mean[static_cast<std::size_t>(rank)] = layer.stats().rank_load_mean;
  });
  for (int r = 0; r < N; ++r) {
    INFO("rank " << r << " of " << N << ", " << ag << " AG");
    REQUIRE(seen[static_cast<std::size_t>(r)].size() == passes);
    for (int i = 0; i < passes; ++i) CHECK(seen[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)] == want[static_cast<std::size_t>(i)]);
    CHECK(last_max[static_cast<std::size_t>(r)] == *std::max_element(want.back().begin() + static_cast<std::ptrdiff_t>(E), want.back().end()));
    // the mean over the EG ranks (Layer::plan_ranks()), the AG ranks' zero columns left out
    long long eg_pairs = 0;
    for (int g = ag; g < N; ++g) eg_pairs += want.back()[E + static_cast<std::size_t>(g)];
    CHECK(last_mean[static_cast<std::size_t>(r)] == static_cast<double>(eg_pairs) / (N - ag));
  }
}
}  // namespace

TEST_CASE("disaggregated Layer keeps a load window (LayerOptions::live.window)", "[schedule][disaggregated][live]") {
  check_window<DeepSeekSmall, 4>(2, 840);
  check_window<MixtralSmall, 5>(3, 850);
  check_window<MixtralSmall, 3>(1, 860);
}

TEST_CASE("disaggregated Layer schedule policies carry the solved configuration", "[schedule][disaggregated]") {
  STATIC_REQUIRE(FinDep::pipeline == Pipeline::findep);
  STATIC_REQUIRE(PPPipe::pipeline == Pipeline::pppipe);
  STATIC_REQUIRE(!DisaggregatedPolicy<Sequential>);
  FinDep f = FinDep::from(Config{Pipeline::findep, Order::aass, 3, 2, 4}, 2);
  CHECK(f.ag == 2);
  CHECK(f.config() == Config{Pipeline::findep, Order::aass, 3, 1, 4});
  PPPipe p{.ag = 1, .order = Order::aass, .r1 = 2, .r2 = 1};
  CHECK(p.config() == Config{Pipeline::pppipe, Order::asas, 2, 1, 1});  // PPPipe always alternates
  CHECK_THROWS_WITH(FinDep::from(Config{Pipeline::pppipe, Order::asas, 2, 1, 1}, 2),
                    Catch::Contains("is a PPPipe schedule, not FinDEP"));
}

TEST_CASE("disaggregated Layer rejects bad input", "[schedule][disaggregated][bad-input]") {
  using Model = MixtralSmall;
  using Router = router::ForModel<Model>;
  constexpr int world = 4;
  using Comm = collective::InProcess<world>;
  using Lyr = Layer<Model, Router, placement::Table, replication::None, FinDep, Comm>;
  constexpr ShapeSpec s = Model::spec;
  RandomLayerWeights<float> weights(s, 5);
  auto x = random_tokens(tokens_per_ag, s.hidden, 9);
  auto run = [&](FinDep sched, LayerOptions<FinDep> o, int tokens_on_ag = tokens_per_ag, int tokens_on_eg = 0) {
    std::vector<std::vector<float>> out(world, std::vector<float>(x.size()));
    o.schedule = sched;
    collective::run_in_process<world>([&](Comm& comm) {
      Lyr layer(comm, blocks(s.experts, world - sched.ag), replication::None{}, weights.view(), o);
      std::vector<std::byte> ws(layer.workspace_size());
      typename Lyr::Arguments a;
      if (comm.rank() < sched.ag)
        a = {tokens_on_ag, x.data(), out[static_cast<std::size_t>(comm.rank())].data()};
      else
        a.tokens = tokens_on_eg;
      layer.run(a, ws);
    });
  };
  LayerOptions<FinDep> ok{.max_tokens = tokens_per_ag};
  auto with = [&](FinDep sched) {
    auto o = ok;
    o.schedule = sched;
    return o;
  };
  SECTION("empty attention group") {
    CHECK_THROWS_WITH(run(FinDep{.ag = 0}, ok), Catch::Contains("between 1 and 3 of the 4 ranks (the rest form the expert group), got ag = 0"));
  }
  SECTION("empty expert group") {
    CHECK_THROWS_WITH(run(FinDep{.ag = 4}, ok), Catch::Contains("got ag = 4"));
  }
  SECTION("r1 that does not divide the tokens") {
    CHECK_THROWS_WITH(run(FinDep{.ag = 2, .r1 = 5}, ok), Catch::Contains("r1 = 5 does not divide the 24 tokens"));
  }
  SECTION("r2 that does not divide a micro-batch") {
    CHECK_THROWS_WITH(run(FinDep{.ag = 2, .r1 = 2, .r2 = 5}, ok),
                      Catch::Contains("r2 = 5 does not divide the 12 tokens of a micro-batch"));
  }
  SECTION("more tokens than max_tokens") {
    CHECK_THROWS_WITH(run(FinDep{.ag = 2}, {.max_tokens = 8}), Catch::Contains("24 tokens exceed the 8"));
  }
  SECTION("deduplicate = false") {
    CHECK_THROWS_WITH(run(FinDep{.ag = 2}, {.max_tokens = 24, .deduplicate = false}),
                      Catch::Contains("deduplicate = false is not supported"));
  }
  SECTION("r1 or r2 below one") {
    CHECK_THROWS_WITH(run(FinDep{.ag = 2, .r1 = 0}, ok), Catch::Contains("r1 and r2 must be at least 1, got r1 = 0, r2 = 1"));
    CHECK_THROWS_WITH(run(FinDep{.ag = 2, .r2 = -1}, ok), Catch::Contains("got r1 = 1, r2 = -1"));
  }
  SECTION("PPPipe with token chunks") {
    using PP = Layer<Model, Router, placement::Table, replication::None, PPPipe, Comm>;
    CHECK_THROWS_WITH(collective::run_in_process<world>([&](Comm& comm) {
                        PP layer(comm, blocks(s.experts, 2), replication::None{}, weights.view(),
                                 {.max_tokens = tokens_per_ag, .schedule = {.ag = 2, .r1 = 2, .r2 = 3}});
                      }),
                      Catch::Contains("PPPipe has no token chunks; r2 must be 1, got r2 = 3"));
  }
  SECTION("max_tokens below one") {
    CHECK_THROWS_WITH(run(FinDep{.ag = 2}, {.max_tokens = 0}), Catch::Contains("max_tokens must be positive, got 0"));
  }
  SECTION("a replica table the placement contradicts, or that misses an expert or a copy's weights") {
    using Replicated = Layer<Model, Router, placement::Table, replication::Table, FinDep, Comm>;
    auto build = [&](replication::Table table) {
      collective::run_in_process<world>([&](Comm& comm) {
        Replicated layer(comm, blocks(s.experts, 2), table, weights.view(), with(FinDep{.ag = 2}));
      });
    };
    std::vector<std::vector<int>> copies(static_cast<std::size_t>(s.experts));
    for (int e = 0; e < s.experts; ++e) copies[static_cast<std::size_t>(e)] = {blocks(s.experts, 2).rank_of(e)};
    auto outside = copies;
    outside[4].push_back(2);  // EG indices are 0 and 1 (ranks 2 and 3)
    CHECK_THROWS_WITH(build(replication::Table(outside)), Catch::Contains("expert 4 has a copy on rank 2, outside [0, 2)"));
    // A second copy of expert 3 on the EG rank that lacks its weights (view() holds every expert,
    // so the weights are taken away here).
    auto two = copies;
    int other = 1 - blocks(s.experts, 2).rank_of(3);
    two[3].push_back(other);
    auto no_three = weights.experts_where([](int e) { return e != 3; });
    auto missing = weights.view();
    missing.experts = no_three;
    CHECK_THROWS_WITH(collective::run_in_process<world>([&](Comm& comm) {
                        auto w = comm.rank() == 2 + other ? missing : weights.view();
                        Replicated layer(comm, blocks(s.experts, 2), replication::Table(two), w, with(FinDep{.ag = 2}));
                      }),
                      Catch::Contains("serves expert 3 but its weights are missing"));
    auto moved = copies;
    moved[5] = {1 - blocks(s.experts, 2).rank_of(5)};
    CHECK_THROWS_WITH(build(replication::Table(moved)), Catch::Contains("expert 5 is placed on rank"));
    auto short_table = copies;
    short_table.pop_back();
    CHECK_THROWS_WITH(build(replication::Table(short_table)), Catch::Contains("replica table has"));
    CHECK_NOTHROW(build(replication::Table(copies)));
  }
  SECTION("tokens on an expert-group rank") {
    CHECK_THROWS_WITH(run(FinDep{.ag = 2}, ok, tokens_per_ag, 3),
                      Catch::Contains("is an expert-group rank and was given 3 tokens"));
  }
  SECTION("bad input on one rank stops every rank with that rank's reason") {
    // AG rank 1 alone passes 23 tokens (r1 = 2 does not divide them); every rank must throw, none
    // may wait for rank 1's messages (on MPI it would wait forever).
    std::vector<std::string> msg(world);
    collective::run_in_process<world>([&](Comm& comm) {
      FinDep sched{.ag = 2, .r1 = 2};
      Lyr layer(comm, blocks(s.experts, world - sched.ag), replication::None{}, weights.view(), with(sched));
      std::vector<std::byte> ws(layer.workspace_size());
      std::vector<float> y(x.size());
      typename Lyr::Arguments a;
      if (comm.rank() < sched.ag) a = {comm.rank() == 1 ? tokens_per_ag - 1 : tokens_per_ag, x.data(), y.data()};
      try {
        layer.run(a, ws);
      } catch (Error const& e) {
        msg[static_cast<std::size_t>(comm.rank())] = e.what();
      }
    });
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r << ": " << msg[static_cast<std::size_t>(r)]);
      CHECK_THAT(msg[static_cast<std::size_t>(r)],
                 Catch::Contains("moe::Layer (disaggregated): r1 = 2 does not divide the 23 tokens"));
      CHECK_THAT(msg[static_cast<std::size_t>(r)], Catch::Contains("rank 1 rejected its arguments"));
      CHECK(msg[static_cast<std::size_t>(r)] == msg[0]);  // the same error on every rank
    }
  }
}
