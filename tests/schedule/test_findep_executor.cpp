// FinDEP host executor on InProcess ranks: AG/EG splits of 3, 4 and 5 ranks, micro-batches and
// token chunks, AASS, ASAS and PPPipe; every output must equal the single-process sequential layer
// (moe::reference_forward) and the expert-parallel moe::Layer (Sequential schedule) on the same
// collective, fp32, 1e-5 normwise relative, for every order, r1 and r2 tried (executor_cases.hpp,
// shared with the MPI test); bad inputs give clear errors.
#include <catch2/catch.hpp>

#include <optional>

#include "executor_cases.hpp"
#include "moe/collective/in_process.hpp"

using namespace moe;
using namespace moe::schedule;
using namespace moe::test::findep;

namespace {
constexpr int world = 4;

/// Runs the shared scenarios on N in-process ranks with `ag` AG ranks and checks every AG rank.
template <class Model, int N>
void check_split(int ag, std::uint64_t seed) {
  std::vector<std::vector<Result>> per_rank(N);
  collective::run_in_process<N>([&](collective::InProcess<N>& comm) {
    per_rank[static_cast<std::size_t>(comm.rank())] = run_executor_cases<Model>(comm, ag, seed);
  });
  REQUIRE(per_rank[0].size() == configs().size());
  for (int r = 0; r < ag; ++r)
    for (Result const& res : per_rank[static_cast<std::size_t>(r)]) {
      INFO(res.what << ", AG rank " << r);
      CHECK(res.vs_reference <= tolerance);
      CHECK(res.vs_layer <= tolerance);
      CHECK(res.vs_textbook <= moe::test::textbook::fp32_tolerance);
    }
}

std::vector<float> tokens_for(ShapeSpec const& s) { return random_tokens(tokens_per_ag, s.hidden, 9); }
}  // namespace

TEMPLATE_TEST_CASE("FinDEP executor equals the sequential layer for every order, r1 and r2 (InProcess)",
                   "[schedule][executor]", DeepSeekSmall, MixtralSmall) {
  std::uint64_t seed = 100;
  SECTION("4 ranks") {
    for (int ag : {2, 3, 1}) check_split<TestType, 4>(ag, seed += 10);
  }
  SECTION("3 ranks") {
    for (int ag : {1, 2}) check_split<TestType, 3>(ag, seed += 20);
  }
  SECTION("5 ranks") {
    for (int ag : {2, 4}) check_split<TestType, 5>(ag, seed += 30);
  }
}

TEST_CASE("FinDEP executor rejects bad input", "[schedule][executor][bad-input]") {
  using Model = MixtralSmall;
  constexpr ShapeSpec s = Model::spec;
  using Router = router::ForModel<Model>;
  using Ex = FinDepExecutor<Router, float, collective::InProcess<world>>;
  RandomLayerWeights<float> weights(s, 5);
  auto x = tokens_for(s);
  auto run = [&](int ag, placement::Table p, Config c, int tokens_on_eg = 0,
                 std::optional<Config> eg_config = std::nullopt, int max_tokens = tokens_per_ag) {
    std::vector<std::vector<float>> out(world, std::vector<float>(x.size()));
    collective::run_in_process<world>([&](collective::InProcess<world>& comm) {
      Ex ex(comm, s, ag, p, weights.view(), max_tokens);
      typename Ex::Arguments a;
      if (comm.rank() < ag)
        a = {tokens_per_ag, x.data(), out[static_cast<std::size_t>(comm.rank())].data()};
      else
        a.tokens = tokens_on_eg;
      ex.run(a, comm.rank() >= ag && eg_config ? *eg_config : c);
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
  SECTION("more tokens than max_tokens") {
    CHECK_THROWS_WITH(run(2, two, Config{}, 0, std::nullopt, 16),
                      Catch::Contains("passes 24 tokens, above the max_tokens of 16"));
  }
  SECTION("max_tokens below one") {
    CHECK_THROWS_WITH(run(2, two, Config{}, 0, std::nullopt, 0),
                      Catch::Contains("max_tokens (tokens per AG rank) must be at least 1, got 0"));
  }
  SECTION("more chunks than max_tokens") {
    CHECK_THROWS_WITH(run(2, two, Config{Pipeline::findep, Order::asas, 24, 1, 2}),
                      Catch::Contains("r1 * r2 = 24 * 2 chunks exceed max_tokens = 24"));
  }
  SECTION("r2 below one") {
    CHECK_THROWS_WITH(run(2, two, Config{Pipeline::findep, Order::asas, 2, 1, 0}),
                      Catch::Contains("r2 (token chunks) must be at least 1, got 0"));
  }
  SECTION("AG rank without router weights") {
    CHECK_THROWS_WITH(collective::run_in_process<world>([&](collective::InProcess<world>& comm) {
                        auto w = weights.view();
                        w.router = nullptr;
                        Ex ex(comm, s, 2, two, w, tokens_per_ag);
                      }),
                      Catch::Contains("has no router weights"));
  }
  SECTION("workspace smaller than workspace_size()") {
    CHECK_THROWS_WITH(collective::run_in_process<world>([&](collective::InProcess<world>& comm) {
                        Ex ex(comm, s, 2, two, weights.view(), tokens_per_ag);
                        std::vector<std::byte> ws(ex.workspace_size() / 2);
                        ex.run({}, Config{}, ws);
                      }),
                      Catch::Contains("run() needs"));
  }
  SECTION("EG ranks run another schedule than the AG ranks") {
    CHECK_THROWS_WITH(run(2, two, Config{Pipeline::findep, Order::aass, 2, 1, 3}, 0,
                          Config{Pipeline::findep, Order::aass, 2, 1, 2}),
                      Catch::Contains("every rank must call run() with the same configuration"));
    CHECK_THROWS_WITH(run(2, two, Config{Pipeline::findep, Order::asas, 4, 1, 1}, 0,
                          Config{Pipeline::findep, Order::asas, 2, 1, 1}),
                      Catch::Contains("rank 0 runs FinDEP ASAS, r1 = 4, r2 = 1, rank 2 runs FinDEP ASAS, r1 = 2, r2 = 1"));
  }
}

TEST_CASE("FinDEP executor: bad input on one rank stops every rank with its reason", "[schedule][executor][bad-input]") {
  // The other ranks must not wait for the rejecting rank (on MPI they would hang): each rank catches
  // its own moe::Error, and the rejecting rank's reason reaches all of them.
  for (int bad : {0, 1, 3}) {
    std::vector<std::string> msg(world);
    collective::run_in_process<world>([&](collective::InProcess<world>& comm) {
      msg[static_cast<std::size_t>(comm.rank())] = reject_on_one_rank<MixtralSmall>(comm, 2, bad);
    });
    std::string reason = bad < 2 ? "r1 = 2 does not divide the 23 tokens of AG rank " + std::to_string(bad)
                                 : "EG rank 3 was given 1 tokens; tokens live on the AG ranks";
    for (int r = 0; r < world; ++r) {
      INFO("bad rank " << bad << ", rank " << r << ": " << msg[static_cast<std::size_t>(r)]);
      CHECK_THAT(msg[static_cast<std::size_t>(r)], Catch::Contains(reason));
      if (r != bad)
        CHECK_THAT(msg[static_cast<std::size_t>(r)],
                   Catch::Contains("rank " + std::to_string(bad) + " rejected this run(), so every rank stops"));
    }
  }
}

TEST_CASE("FinDEP executor: another plan's tables are checked before a switch", "[schedule][executor][bad-input]") {
  // prepare_tables (moe::Layer's re-planning) must refuse, on the rank that would meet it, a plan
  // adopt() could not serve. It makes no collective call, so each rank's verdicts are collected
  // and checked after the ranks join.
  using Ex = FinDepExecutor<router::ForModel<MixtralSmall>, float, collective::InProcess<world>>;
  constexpr ShapeSpec s = MixtralSmall::spec;
  RandomLayerWeights<float> weights(s, 5);
  placement::Table two = placement::Table::round_robin(s.experts, 2);  // expert e on EG index e % 2
  std::vector<int> flipped_ranks(static_cast<std::size_t>(s.experts));
  std::vector<std::vector<int>> one_copy;
  for (int e = 0; e < s.experts; ++e) {
    flipped_ranks[static_cast<std::size_t>(e)] = 1 - e % 2;
    one_copy.push_back({e % 2});
  }
  placement::Table flipped(flipped_ranks);
  replication::BatchSplit split(one_copy, std::vector<int>{0, 0});           // two's copies, one server
  replication::BatchSplit three(one_copy, std::vector<int>{0, 0, 1});        // built for three EG ranks
  std::vector<ExpertWeights<float>> missing(weights.view().experts.begin(), weights.view().experts.end());
  missing[3] = {};  // expert 3: EG index 1 (rank 3) in `two`

  std::vector<std::vector<std::string>> said(world);
  collective::run_in_process<world>([&](collective::InProcess<world>& comm) {
    auto& mine = said[static_cast<std::size_t>(comm.rank())];
    auto verdict = [&](auto&& f) {
      try {
        (void)f();
        mine.push_back("accepted");
      } catch (Error const& e) {
        mine.push_back(e.what());
      }
    };
    auto experts = weights.view().experts;
    Ex fixed(comm, s, 2, two, weights.view(), tokens_per_ag);
    Ex splitting(comm, s, 2, two, weights.view(), tokens_per_ag);
    splitting.split_each_micro_batch(split);
    verdict([&] { return fixed.prepare_tables(two, {}, experts, &split); });      // 0
    verdict([&] { return splitting.prepare_tables(two, {}, experts, nullptr); }); // 1
    verdict([&] { return splitting.prepare_tables(flipped, {}, experts, &split); });  // 2
    verdict([&] { return splitting.prepare_tables(two, {}, experts, &three); });  // 3
    verdict([&] { return fixed.prepare_tables(two, {}, missing, nullptr); });     // 4
    verdict([&] { return fixed.prepare_tables(placement::Table::round_robin(s.experts, 3), {}, experts, nullptr); });  // 5
    verdict([&] { return splitting.prepare_tables(two, {}, experts, &split); });  // 6
    verdict([&] { return fixed.prepare_tables(flipped, {}, experts, nullptr); }); // 7
  });
  for (int r = 0; r < world; ++r) {
    auto const& v = said[static_cast<std::size_t>(r)];
    INFO("rank " << r);
    REQUIRE(v.size() == 8);
    CHECK_THAT(v[0], Catch::Contains("brings a per-micro-batch split to an executor without one"));
    CHECK_THAT(v[1], Catch::Contains("has no split, but this executor splits"));
    CHECK_THAT(v[2], Catch::Contains("the batch split puts expert 0 on EG index 0, which does not hold it"));
    CHECK_THAT(v[3], Catch::Contains("the batch split is built for 3 ranks, the expert group has 2"));
    if (r == 3)  // the EG rank that would serve expert 3 without its weights
      CHECK_THAT(v[4], Catch::Contains("EG rank 3 would serve expert 3 in the next plan but has no weights for it"));
    else
      CHECK(v[4] == "accepted");
    CHECK_THAT(v[5], Catch::Contains("outside [0, 2)"));
    CHECK(v[6] == "accepted");
    CHECK(v[7] == "accepted");
  }
}
