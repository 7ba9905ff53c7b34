// Bad input to the Layer gets a clear moe::Error, never a crash or a hang.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

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

namespace {
/// Runs one pass of 4 tokens per rank on N in-process ranks, each building its layer with
/// make(rank); returns what each rank threw ("" if it ran).
template <class L, int N, class Make>
std::array<std::string, N> one_pass_on(Make make) {
  auto x = test::random_tokens<float>(4 * N, 16, 3);
  std::array<std::string, N> what;
  collective::run_in_process<N>([&](collective::InProcess<N>& comm) {
    int r = comm.rank();
    std::vector<float> y(4 * 16);
    try {
      L l = make(comm);
      std::vector<std::byte> ws(l.workspace_size());
      l.run({.tokens = 4, .x = x.data() + 4 * 16 * r, .y = y.data(), .first_token = 4 * r}, ws);
    } catch (Error const& e) {
      what[static_cast<std::size_t>(r)] = e.what();
    }
  });
  return what;
}
}  // namespace

TEST_CASE("ranks built with different placement or replica tables are stopped before any pair moves",
          "[layer][errors]") {
  using L3 = Layer<Small, router::SoftmaxTopK, placement::Table, replication::Table, schedule::Sequential,
                   collective::InProcess<3>>;
  using L3S = Layer<Small, router::SoftmaxTopK, placement::Table, replication::BatchSplit, schedule::Sequential,
                    collective::InProcess<3>>;
  auto placement = placement::Table::round_robin(8, 3);
  auto copies = [&](int extra_on) {  // each expert on its rank; experts 0 and 1 also on `extra_on`
    std::vector<std::vector<int>> c(8);
    for (int e = 0; e < 8; ++e) {
      c[static_cast<std::size_t>(e)] = {placement.rank_of(e)};
      if (e < 2 && extra_on != placement.rank_of(e)) c[static_cast<std::size_t>(e)].push_back(extra_on);
    }
    return c;
  };
  auto stopped = [](auto const& what, int rank) {
    for (auto const& w : what) {
      CHECK(w == what[0]);
      CHECK_THAT(w, Catch::Contains("every rank must build its layer with the same placement and replica tables: "
                                    "rank " + std::to_string(rank) + "'s differ from rank 0's"));
    }
  };
  SECTION("two ranks, each placing every expert on the other") {
    auto what = one_pass_on<L2, 2>([&](auto& comm) {
      return L2(comm, placement::Table(std::vector<int>(8, 1 - comm.rank())), {}, weights().view(),
                {.max_tokens = 4});
    });
    stopped(what, 1);
  }
  SECTION("one rank of three with another replica list (the placement the same): no rank waits") {
    // Rank 2 also holds experts 0 and 1 in its own table; ranks 0 and 1 think rank 2 holds them
    // not, so rank 2 would send their pairs to itself and the others would wait for them.
    auto what = one_pass_on<L3, 3>([&](auto& comm) {
      return L3(comm, placement, replication::Table(copies(comm.rank() == 2 ? 2 : 0)), weights().view(),
                {.max_tokens = 4});
    });
    stopped(what, 2);
  }
  SECTION("one rank of three with another placement (the same copies)") {
    auto what = one_pass_on<L3, 3>([&](auto& comm) {
      std::vector<int> t(8);
      for (int e = 0; e < 8; ++e) t[static_cast<std::size_t>(e)] = placement.rank_of(e);
      if (comm.rank() == 1) std::swap(t[0], t[1]);  // experts 0 and 1 change ranks
      std::vector<std::vector<int>> c(8);
      for (int e = 0; e < 8; ++e) c[static_cast<std::size_t>(e)] = {t[static_cast<std::size_t>(e)]};
      return L3(comm, placement::Table(t), replication::Table(c), weights().view(), {.max_tokens = 4});
    });
    stopped(what, 1);
  }
  SECTION("the same copies listed in another order agree, and the pass runs") {
    // The fixed rule serves a pair from any holder; only who holds what must agree.
    auto what = one_pass_on<L3, 3>([&](auto& comm) {
      auto c = copies(1);
      if (comm.rank() == 2)
        for (auto& l : c) std::reverse(l.begin(), l.end());
      return L3(comm, placement, replication::Table(c), weights().view(), {.max_tokens = 4});
    });
    for (auto const& w : what) CHECK(w.empty());
  }
  SECTION("replication::BatchSplit: the order of a copy list and the servers must agree too") {
    // Its split breaks ties by the order of each list and prefers copies on the sender's server:
    // ranks holding other orders or servers would deal their pairs by different splits.
    auto reordered = one_pass_on<L3S, 3>([&](auto& comm) {
      auto c = copies(1);
      if (comm.rank() == 0)
        for (auto& l : c) std::reverse(l.begin(), l.end());
      return L3S(comm, placement, replication::BatchSplit(c, std::vector<int>{0, 0, 1}), weights().view(),
                 {.max_tokens = 4});
    });
    stopped(reordered, 1);
    auto servers = one_pass_on<L3S, 3>([&](auto& comm) {
      std::vector<int> server = comm.rank() == 1 ? std::vector<int>{0, 1, 1} : std::vector<int>{0, 0, 1};
      return L3S(comm, placement, replication::BatchSplit(copies(1), server), weights().view(), {.max_tokens = 4});
    });
    stopped(servers, 1);
    auto same = one_pass_on<L3S, 3>([&](auto& comm) {
      return L3S(comm, placement, replication::BatchSplit(copies(1), std::vector<int>{0, 0, 1}), weights().view(),
                 {.max_tokens = 4});
    });
    for (auto const& w : same) CHECK(w.empty());
  }
  SECTION("tables whose 32-bit FNV-1a hashes collide are told apart") {
    // Two tables of 8 experts on 3 ranks (found by a seeded birthday search over random tables, 2026-12-03)
    // whose words, as the agreement hashes them, have the same 32-bit FNV-1a: a 32-bit hash let these
    // ranks route by different tables. Words: per expert its primary rank, the ranks holding a copy
    // in ascending order, then 0xffffffff.
    std::vector<int> const primary_a{0, 2, 2, 1, 1, 1, 2, 1}, primary_b{1, 0, 1, 0, 2, 1, 0, 2};
    std::vector<std::vector<int>> const holders_a{{0, 1}, {1, 2}, {0, 1, 2}, {1, 2}, {1}, {0, 1, 2}, {2}, {0, 1, 2}},
        holders_b{{1, 2}, {0, 2}, {0, 1}, {0, 1}, {0, 2}, {0, 1}, {0, 2}, {0, 2}};
    auto words = [](std::vector<int> const& primary, std::vector<std::vector<int>> const& holders) {
      std::vector<std::uint32_t> w;
      for (std::size_t e = 0; e < primary.size(); ++e) {
        w.push_back(static_cast<std::uint32_t>(primary[e]));
        for (int r : holders[e]) w.push_back(static_cast<std::uint32_t>(r));
        w.push_back(0xffffffffu);
      }
      return w;
    };
    auto fnv1a_32 = [](std::vector<std::uint32_t> const& w) {  // the textbook 32-bit FNV-1a, bytes low first
      std::uint32_t h = 0x811c9dc5u;
      for (std::uint32_t u : w)
        for (int b = 0; b < 4; ++b) h = (h ^ ((u >> (8 * b)) & 0xffu)) * 0x01000193u;
      return h;
    };
    REQUIRE(fnv1a_32(words(primary_a, holders_a)) == fnv1a_32(words(primary_b, holders_b)));
    auto copies = [](std::vector<int> const& primary, std::vector<std::vector<int>> holders) {
      for (std::size_t e = 0; e < holders.size(); ++e)  // the primary first, as the planners list it
        std::stable_partition(holders[e].begin(), holders[e].end(), [&](int r) { return r == primary[e]; });
      return holders;
    };
    auto what = one_pass_on<L3, 3>([&](auto& comm) {
      bool b = comm.rank() == 2;
      auto const& primary = b ? primary_b : primary_a;
      return L3(comm, placement::Table(primary), replication::Table(copies(primary, b ? holders_b : holders_a)),
                weights().view(), {.max_tokens = 4});
    });
    stopped(what, 2);
  }
}

TEST_CASE("the agreement's hash is 64-bit FNV-1a: the published test vectors", "[layer][errors]") {
  // Offset basis and the vectors "a" and "foobar" of FNV's reference test suite (Noll's fnv_test_str).
  auto of = [](std::string const& text) {
    live::Fnv1a f;
    for (char c : text) f.byte(static_cast<std::uint8_t>(c));
    return f.h;
  };
  CHECK(of("") == 0xcbf29ce484222325ull);
  CHECK(of("a") == 0xaf63dc4c8601ec8cull);
  CHECK(of("foobar") == 0x85944171f73967e8ull);
  // A 32-bit word is its four bytes, low byte first: "foob" is the word 0x626f6f66.
  live::Fnv1a word;
  word.mix(0x626f6f66u);
  CHECK(word.h == of("foob"));
  CHECK(live::hash_layout(std::vector<int>{0x626f6f66, 0x00007261}) == of(std::string("foobar\0\0", 8)));
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
