// Bad input to the Layer gets a clear moe::Error, never a crash or a hang.
#include <catch2/catch.hpp>

#include <array>
#include <limits>
#include <string>

#include "layer_check.hpp"

using namespace moe;
using Small = models::Reduced<models::Mixtral8x7B, 16, 8, DType::f32>;
using L2 = Layer<Small, router::SoftmaxTopK, placement::Table, replication::None, schedule::Sequential,
                 collective::InProcess<2>>;
using L2R = Layer<Small, router::SoftmaxTopK, placement::Table, replication::Table, schedule::Sequential,
                  collective::InProcess<2>>;

namespace {
RandomLayerWeights<float> const& weights() {
  static RandomLayerWeights<float> w(Small::spec, 5);
  return w;
}
template <class Body>
void on_two_ranks(Body body) {
  collective::run_in_process<2>([&](collective::InProcess<2>& comm) { body(comm); });
}
}  // namespace

TEST_CASE("placement tables that miss an expert or name a bad rank", "[layer][errors]") {
  CHECK_THROWS_WITH(on_two_ranks([](auto& comm) {
                      L2 l(comm, placement::Table({0, 0, 0, 1, 1, 1, 1}), {}, weights().view(), {.max_tokens = 4});
                    }),
                    Catch::Contains("placement table has 7 entries") && Catch::Contains("8 experts"));
  CHECK_THROWS_WITH(on_two_ranks([](auto& comm) {
                      L2 l(comm, placement::Table({0, 0, 0, 1, 1, 1, 1, 2}), {}, weights().view(), {.max_tokens = 4});
                    }),
                    Catch::Contains("expert 7 on rank 2"));
  CHECK_THROWS_WITH(on_two_ranks([](auto& comm) {
                      L2 l(comm, placement::Table({0, 0, 0, -1, 1, 1, 1, 1}), {}, weights().view(), {.max_tokens = 4});
                    }),
                    Catch::Contains("expert 3 on rank -1"));
  CHECK_THROWS_WITH(placement::Table::contiguous(8, 3), Catch::Contains("do not split evenly"));
}

TEST_CASE("replica tables that are inconsistent", "[layer][errors]") {
  auto placement = placement::Table::contiguous(8, 2);
  std::vector<std::vector<int>> copies{{0}, {0}, {0}, {0}, {1}, {1}, {1}, {1}};
  copies[5] = {1, 1};
  CHECK_THROWS_WITH(on_two_ranks([&](auto& comm) {
                      L2R l(comm, placement, replication::Table(copies), weights().view(), {.max_tokens = 4});
                    }),
                    Catch::Contains("expert 5 lists rank 1 twice"));
  copies[5] = {0};
  CHECK_THROWS_WITH(on_two_ranks([&](auto& comm) {
                      L2R l(comm, placement, replication::Table(copies), weights().view(), {.max_tokens = 4});
                    }),
                    Catch::Contains("expert 5 is placed on rank 1"));
  copies.pop_back();
  CHECK_THROWS_WITH(on_two_ranks([&](auto& comm) {
                      L2R l(comm, placement, replication::Table(copies), weights().view(), {.max_tokens = 4});
                    }),
                    Catch::Contains("replica table has 7 entries"));
}

TEST_CASE("weights that do not match the shape", "[layer][errors]") {
  auto placement = placement::Table::contiguous(8, 2);
  CHECK_THROWS_WITH(on_two_ranks([&](auto& comm) {
                      auto v = weights().view();
                      v.experts = v.experts.first(6);
                      L2 l(comm, placement, {}, v, {.max_tokens = 4});
                    }),
                    Catch::Contains("weights list 6 experts, the shape has 8"));
  CHECK_THROWS_WITH(on_two_ranks([&](auto& comm) {
                      // Every rank is handed only rank 0's experts; rank 1 notices.
                      auto local = weights().experts_where([](int e) { return e < 4; });
                      auto v = weights().view();
                      v.experts = local;
                      L2 l(comm, placement, {}, v, {.max_tokens = 4});
                    }),
                    Catch::Contains("rank 1 serves expert 4 but its weights are missing"));
  CHECK_THROWS_WITH(on_two_ranks([&](auto& comm) {
                      auto v = weights().view();
                      v.router = nullptr;
                      L2 l(comm, placement, {}, v, {.max_tokens = 4});
                    }),
                    Catch::Contains("router weights are missing"));
  CHECK_THROWS_WITH(on_two_ranks([&](auto& comm) { L2 l(comm, placement, {}, weights().view(), {.max_tokens = 0}); }),
                    Catch::Contains("max_tokens must be positive"));
}

TEST_CASE("more tokens than the workspace was sized for, or too small a workspace", "[layer][errors]") {
  auto placement = placement::Table::contiguous(8, 2);
  auto x = test::random_tokens<float>(8, 16, 3);
  std::vector<float> y(x.size());
  CHECK_THROWS_WITH(on_two_ranks([&](auto& comm) {
                      L2 l(comm, placement, {}, weights().view(), {.max_tokens = 4});
                      std::vector<std::byte> ws(l.workspace_size());
                      int n = comm.rank() == 0 ? 5 : 2;
                      l.run({.tokens = n, .x = x.data(), .y = y.data()}, ws);
                    }),
                    Catch::Contains("5 tokens exceed the 4"));
  CHECK_THROWS_WITH(on_two_ranks([&](auto& comm) {
                      L2 l(comm, placement, {}, weights().view(), {.max_tokens = 4});
                      std::vector<std::byte> ws(l.workspace_size() / 2);
                      l.run({.tokens = 2, .x = x.data(), .y = y.data()}, ws);
                    }),
                    Catch::Contains("workspace holds"));
  CHECK_THROWS_WITH(on_two_ranks([&](auto& comm) {
                      L2 l(comm, placement, {}, weights().view(), {.max_tokens = 4});
                      std::vector<std::byte> ws(l.workspace_size());
                      l.run({.tokens = 2, .x = nullptr, .y = y.data()}, ws);
                    }),
                    Catch::Contains("null"));
  // A negative first token would pick a replica at a negative index of its copy list.
  CHECK_THROWS_WITH(on_two_ranks([&](auto& comm) {
                      std::vector<std::vector<int>> copies(8, std::vector<int>{0, 1});
                      for (int e = 0; e < 8; ++e) copies[static_cast<std::size_t>(e)] = {placement.rank_of(e), 1 - placement.rank_of(e)};
                      L2R l(comm, placement, replication::Table(copies), weights().view(), {.max_tokens = 4});
                      std::vector<std::byte> ws(l.workspace_size());
                      l.run({.tokens = 2, .x = x.data(), .y = y.data(), .first_token = -3}, ws);
                    }),
                    Catch::Contains("first_token (the global index of this rank's first token) must not be negative, got -3"));
  // Ranks disagreeing on max_tokens are caught by the agreement before any data moves.
  CHECK_THROWS_WITH(on_two_ranks([&](auto& comm) {
                      int cap = comm.rank() == 0 ? 8 : 1;
                      L2 l(comm, placement, {}, weights().view(), {.max_tokens = cap});
                      std::vector<std::byte> ws(l.workspace_size());
                      int n = comm.rank() == 0 ? 8 : 1;
                      l.run({.tokens = n, .x = x.data(), .y = y.data()}, ws);
                    }),
                    Catch::Contains("every rank must build its layer with the same options: rank 0 has max_tokens 8"));
}

TEST_CASE("ranks with different placement tables are caught", "[layer][errors]") {
  auto x = test::random_tokens<float>(8, 16, 3);
  std::vector<float> y(x.size());
  CHECK_THROWS_WITH(on_two_ranks([&](auto& comm) {
                      // Rank 0 thinks everything lives on rank 1, rank 1 thinks everything lives on rank 0.
                      std::vector<int> t(8, 1 - comm.rank());
                      L2 l(comm, placement::Table(t), {}, weights().view(), {.max_tokens = 8});
                      std::vector<std::byte> ws(l.workspace_size());
                      l.run({.tokens = 8, .x = x.data(), .y = y.data()}, ws);
                    }),
                    Catch::Contains("which it does not serve"));
}

TEST_CASE("a first token so large that the replica choice overflows is refused", "[layer][errors]") {
  // Rank 2 holds no copy of any expert, so replication::Table picks copy (2 + token) % 2 for its
  // pairs: with first_token near the largest long long that sum overflowed, and the index it gave
  // (negative, as an unsigned one far past the copy list) read outside the list.
  using L3R = Layer<Small, router::SoftmaxTopK, placement::Table, replication::Table, schedule::Sequential,
                    collective::InProcess<3>>;
  auto x = test::random_tokens<float>(8, 16, 3);
  std::array<std::string, 3> what;
  collective::run_in_process<3>([&](collective::InProcess<3>& comm) {
    std::vector<std::vector<int>> copies(8, std::vector<int>{0, 1});
    L3R l(comm, placement::Table(std::vector<int>(8, 0)), replication::Table(copies), weights().view(),
          {.max_tokens = 4});
    std::vector<std::byte> ws(l.workspace_size());
    std::vector<float> y(4 * 16);
    long long first = comm.rank() == 2 ? std::numeric_limits<long long>::max() - 2 : 4 * comm.rank();
    try {
      l.run({.tokens = 4, .x = x.data(), .y = y.data(), .first_token = first}, ws);
    } catch (Error const& e) {
      what[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  for (auto const& w : what) {
    CHECK(w == what[0]);
    CHECK_THAT(w, Catch::Contains("rank 2 rejected its arguments") && Catch::Contains("first_token"));
  }
}
