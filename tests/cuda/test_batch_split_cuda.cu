// The device split (kernels::cuda::DeviceSplit, moe/kernels/batch_split.cuh) against the host's
// replication::BatchSplit: on many seeded cases (1-48 ranks on 1-6 servers, random copy tables,
// skewed counts, zero tokens, all pairs to one expert, DeepSeek-V3-sized, and a layout whose
// workspace is too large for shared memory) the device's take (the slots of experts with copies),
// loads and outcome equal the host's bit for bit; the device deal of one rank's pairs equals the
// host's deal; a negative count sets outcome.bad and writes nothing. The split over an engine's
// slots (kernels::cuda::DeviceSlotSplit: counts from top-k ids, the split, physical slot ids) equals
// the host's replication::EngineSlots and BatchSplit on seeded engine layouts and edge cases.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

#include "cuda_test_support.cuh"
#include "moe/kernels/batch_split.cuh"
#include "moe/kernels/slot_split.cuh"
#include "moe/replication/batch_split.hpp"
#include "moe/replication/engine_slots.hpp"

namespace {

using moe::replication::BatchSplit;
using moe::replication::split::Outcome;
using moe::test::Device;

struct Case {
  std::vector<int> server;
  std::vector<std::vector<int>> copies;
  std::vector<std::int32_t> counts;  // ranks x experts
  int slack_permille = 0;            // split::Layout's balance slack
};

Case random_case(std::mt19937& rng, int G, int servers, int E, int extra, int scale) {
  Case c;
  for (int g = 0; g < G; ++g) c.server.push_back(g * servers / G);
  c.copies.resize(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e) c.copies[static_cast<std::size_t>(e)].push_back(static_cast<int>(rng() % G));
  for (int i = 0; i < extra; ++i) {
    auto& l = c.copies[rng() % static_cast<unsigned>(E)];
    if (static_cast<int>(l.size()) >= G) continue;
    int g;
    do g = static_cast<int>(rng() % G);
    while (std::find(l.begin(), l.end(), g) != l.end());
    l.push_back(g);
  }
  std::gamma_distribution<double> gam(0.5, 1.0);
  std::vector<double> w(static_cast<std::size_t>(E));
  for (auto& x : w) x = gam(rng);
  c.counts.resize(static_cast<std::size_t>(G * E));
  for (int r = 0; r < G; ++r)
    for (int e = 0; e < E; ++e) {
      std::poisson_distribution<int> p(scale * w[static_cast<std::size_t>(e)] * (0.5 + (rng() % 100) / 100.0));
      c.counts[static_cast<std::size_t>(r * E + e)] = p(rng);
    }
  return c;
}

/// Runs host and device on the case, the rank rounds on `rounds`, the shortest paths' labels as
/// `paths` says, the rank-sized stages in `order`; requires equality. Returns whether the workspace
/// was shared.
bool compare_with(Case const& c, std::size_t shared_limit, moe::kernels::cuda::DeviceSplit::Rounds rounds,
                  moe::kernels::cuda::DeviceSplit::Paths paths,
                  moe::kernels::cuda::DeviceSplit::Order order = moe::kernels::cuda::DeviceSplit::Order::automatic) {
  BatchSplit host(c.copies, c.server, c.slack_permille);
  auto hout = host.plan_batch(c.counts);
  auto const& L = host.layout();
  moe::kernels::cuda::DeviceSplit dev(L, shared_limit, rounds, paths, order);
  INFO((dev.warp_rounds() ? "rounds on one warp" : "rounds on the block"));
  INFO((order == moe::kernels::cuda::DeviceSplit::Order::least_max_first ? "least max load first"
                                                                         : "tie-breaks at the bound first"));
  INFO((paths == moe::kernels::cuda::DeviceSplit::Paths::automatic ? "packed labels where they fit"
                                                                   : "distances, then the tree"));
  Device<std::int32_t> counts(c.counts);
  Device<std::int32_t> take(std::max<std::size_t>(dev.take_size(), 1));
  Device<long long> load(dev.load_size());
  Device<Outcome> outcome(1);
  Device<unsigned char> work(std::max<std::size_t>(dev.workspace_bytes(), 1));
  take.poison();
  dev.run(counts.get(), take.get(), load.get(), outcome.get(), dev.workspace_bytes() ? work.get() : nullptr, nullptr);
  auto dtake = take.download();
  auto dload = load.download();
  auto dout = outcome.download()[0];
  REQUIRE(dout.bad == 0);
  CHECK(dout.max_load == hout.max_load);
  CHECK(dout.local == hout.local);
  CHECK(dout.same_server == hout.same_server);
  REQUIRE(dload == host.load());
  // every slot of an expert with copies, every source rank
  for (int e = 0; e < L.experts; ++e) {
    if (L.first[e + 1] - L.first[e] == 1) continue;
    for (int r = 0; r < L.ranks; ++r)
      for (int s = L.first[e]; s < L.first[e + 1]; ++s) {
        auto i = static_cast<std::size_t>(r) * static_cast<std::size_t>(L.slots) + static_cast<std::size_t>(s);
        REQUIRE(dtake[i] == host.take()[i]);
      }
  }
  // the deal of rank 0's pairs (a token order made from the counts: expert ids interleaved), when
  // they are few enough to list (the cases with counts near 2^31 are for the split alone)
  long long pairs0 = 0;
  for (int e = 0; e < L.experts && L.ranks > 0; ++e) pairs0 += c.counts[static_cast<std::size_t>(e)];
  if (L.ranks > 0 && pairs0 <= (1 << 22)) {
    std::vector<int> ids;
    std::vector<std::int32_t> left(c.counts.begin(), c.counts.begin() + L.experts);
    for (bool more = true; more;) {
      more = false;
      for (int e = L.experts - 1; e >= 0; --e)
        if (left[static_cast<std::size_t>(e)] > 0) --left[static_cast<std::size_t>(e)], ids.push_back(e), more = true;
    }
    std::vector<int> want(ids.size());
    host.deal(0, ids, want);
    if (!ids.empty()) {
      Device<int> d_ids(ids), d_dest(ids.size());
      d_dest.poison();
      dev.deal(take.get(), 0, d_ids.get(), static_cast<long long>(ids.size()), d_dest.get(), nullptr);
      REQUIRE(d_dest.download() == want);
    }
  }
  return dev.shared_bytes() > 0;
}

/// Runs host and device on the case with both teams of the rank rounds (one warp, the whole
/// block) and both forms of the shortest paths' rounds, then on one warp in the other order of the
/// rank-sized stages; requires equality. Returns whether the workspace was shared.
/// `shared_limit`: DeviceSplit's (0: what the device allows with an opt-in).
bool compare(Case const& c, std::size_t shared_limit = 0) {
  using moe::kernels::cuda::DeviceSplit;
  bool shared = false;
  for (auto rounds : {DeviceSplit::Rounds::warp, DeviceSplit::Rounds::block})
    for (auto paths : {DeviceSplit::Paths::automatic, DeviceSplit::Paths::two_stage})
      shared = compare_with(c, shared_limit, rounds, paths);
  compare_with(c, shared_limit, DeviceSplit::Rounds::warp, DeviceSplit::Paths::automatic,
               DeviceSplit::Order::least_max_first);
  return shared;
}


}  // namespace

TEST_CASE("device batch split equals the host split bit for bit", "[batch-split]") {
  // Under ThreadSanitizer (the emulator's TSan build) the first 30 seeds: a race is a property of the
  // kernel's code paths, which the first 30 already take (both teams, one to six servers, slack and
  // zero counts; the edge cases below force the global workspace and the long experts), and the
  // sanitizer makes every case about 20 times slower. The plain, ASan and GPU builds run all 120.
#if defined(MOE_EMU_TSAN)
  constexpr unsigned seeds = 30;
#else
  constexpr unsigned seeds = 120;
#endif
  int shared = 0, global = 0;
  for (unsigned seed = 1; seed <= seeds; ++seed) {
    std::mt19937 rng(seed);
    int servers = 1 + static_cast<int>(seed % 6);
    int G = servers * (1 + static_cast<int>(rng() % 8));
    int E = 1 + static_cast<int>(rng() % 64);
    int extra = static_cast<int>(rng() % static_cast<unsigned>(E + G));
    int scale = seed % 7 == 0 ? 0 : 1 + static_cast<int>(rng() % 200);
    auto c = random_case(rng, G, servers, E, extra, scale);
    c.slack_permille = seed % 5 == 0 ? 20 * static_cast<int>(seed % 4 + 1) : 0;  // the tie-breaks' cap above T
    INFO("seed " << seed << ": G " << G << ", servers " << servers << ", E " << E << ", extra " << extra << ", slack "
                 << c.slack_permille);
    (compare(c) ? shared : global) += 1;
  }
  CHECK(shared > 0);
}

TEST_CASE("device batch split: one split reused, and sources that hold no copy", "[batch-split]") {
  // A disaggregated layer's split (BatchSplit::with_sources): the copies on the first G ranks, the
  // pairs from `sources` more ranks that hold none; one DeviceSplit runs batch after batch, each
  // against a fresh host split.
  for (unsigned seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    int servers = 1 + static_cast<int>(seed % 3);
    int G = servers * (1 + static_cast<int>(rng() % 3));
    int E = 4 + static_cast<int>(rng() % 60);
    int sources = 1 + static_cast<int>(rng() % 3);
    auto c = random_case(rng, G, servers, E, static_cast<int>(rng() % static_cast<unsigned>(E + G)), 1);
    BatchSplit eg_only(c.copies, c.server);
    BatchSplit world = eg_only.with_sources(sources);
    auto const& L = world.layout();
    moe::kernels::cuda::DeviceSplit dev(L);
    Device<std::int32_t> take(std::max<std::size_t>(dev.take_size(), 1));
    Device<long long> load(dev.load_size());
    Device<Outcome> outcome(1);
    Device<unsigned char> work(std::max<std::size_t>(dev.workspace_bytes(), 1));
    for (int batch = 0; batch < 3; ++batch) {
      std::vector<std::int32_t> counts(static_cast<std::size_t>(L.ranks) * static_cast<std::size_t>(E), 0);
      for (int p = 0; p < sources; ++p)
        for (int e = 0; e < E; ++e)
          counts[static_cast<std::size_t>(G + p) * static_cast<std::size_t>(E) + static_cast<std::size_t>(e)] =
              static_cast<std::int32_t>(rng() % 9);
      BatchSplit fresh = eg_only.with_sources(sources);
      auto hout = fresh.plan_batch(counts);
      Device<std::int32_t> d_counts(counts);
      dev.run(d_counts.get(), take.get(), load.get(), outcome.get(), dev.workspace_bytes() ? work.get() : nullptr, nullptr);
      INFO("seed " << seed << ", G " << G << ", sources " << sources << ", E " << E << ", batch " << batch);
      auto dout = outcome.download()[0];
      REQUIRE(dout.bad == 0);
      CHECK(dout.max_load == hout.max_load);
      CHECK(load.download() == fresh.load());
    }
  }
}

TEST_CASE("device batch split on the edge cases", "[batch-split]") {
  SECTION("all pairs to one expert with copies on every rank") {
    std::mt19937 rng(5);
    auto c = random_case(rng, 16, 2, 8, 0, 0);
    c.copies[2].clear();
    for (int g = 0; g < 16; ++g) c.copies[2].push_back((g * 5) % 16);
    std::fill(c.counts.begin(), c.counts.end(), 0);
    for (int r = 0; r < 16; ++r) c.counts[static_cast<std::size_t>(r * 8 + 2)] = 100 + r;
    compare(c);
  }
  SECTION("DeepSeek-V3 at EP32: 256 experts, 32 more copies, 4 servers of 8") {
    std::mt19937 rng(11);
    auto c = random_case(rng, 32, 4, 256, 32, 120);
    CHECK(compare(c));  // the workspace fits in shared memory (past 48 KiB: the kernel opts in)
    CHECK_FALSE(compare(c, moe::kernels::cuda::DeviceSplit::max_shared));  // without the opt-in: global memory
  }
  SECTION("a smaller split built later leaves the larger one its shared memory (the kernel's opt-in)") {
    // A re-plan builds its split beside the one in use, which serves on if the switch is dropped;
    // several layers in one process each have one. The opt-in is the kernel's, not a split's.
    using moe::kernels::cuda::DeviceSplit;
    std::mt19937 rng(11);
    auto c = random_case(rng, 32, 4, 256, 32, 120);
    Case fewer = c;  // four copies fewer: less shared memory, still past 48 KiB
    int dropped = 0;
    for (auto& l : fewer.copies)
      if (l.size() > 1 && dropped < 4) l.pop_back(), ++dropped;
    BatchSplit host(c.copies, c.server), host_fewer(fewer.copies, fewer.server);
    auto hout = host.plan_batch(c.counts);
    DeviceSplit in_use(host.layout());
    DeviceSplit next(host_fewer.layout());
    REQUIRE(next.shared_bytes() > DeviceSplit::max_shared);
    REQUIRE(next.shared_bytes() < in_use.shared_bytes());
    Device<std::int32_t> counts(c.counts);
    Device<std::int32_t> take(in_use.take_size());
    Device<long long> load(in_use.load_size());
    Device<Outcome> outcome(1);
    in_use.run(counts.get(), take.get(), load.get(), outcome.get(), nullptr, nullptr);
    auto dout = outcome.download()[0];
    REQUIRE(dout.bad == 0);
    CHECK(dout.max_load == hout.max_load);
    CHECK(load.download() == host.load());
  }
  SECTION("an expert of 32 copies (a lane each) and one of 40 (past a warp: the host's code on a lane)") {
    std::mt19937 rng(17);
    auto c = random_case(rng, 48, 3, 12, 20, 30);
    for (int e : {3, 7}) {
      auto& l = c.copies[static_cast<std::size_t>(e)];
      l.clear();
      for (int j = 0; j < (e == 3 ? 32 : 40); ++j) l.push_back((j * 7 + e) % 48);  // distinct: 7 is odd, not 3
    }
    compare(c);
  }
  SECTION("servers without ranks (server numbers 1 and 3 only)") {
    std::mt19937 rng(19);
    auto c = random_case(rng, 12, 2, 20, 14, 40);
    for (int g = 0; g < 12; ++g) c.server[static_cast<std::size_t>(g)] = g < 5 ? 1 : 3;
    compare(c);
  }
  SECTION("counts whose per-server sums pass 2^31 (the host's 64-bit path)") {
    std::mt19937 rng(13);
    auto c = random_case(rng, 8, 2, 6, 6, 1);
    for (auto& n : c.counts) n = n > 0 ? 400000000 + n : 0;
    compare(c);
  }
  SECTION("packed labels at the edge of the word, and past it (the two-stage rounds)") {
    // 48 ranks, every count positive (so that every arc is in the batch's graph): counts scaled so
    // that the tie-breaks' weight A = all pairs + 1 sits just under what the packed labels allow,
    // then well over it, where `automatic` must take the two-stage rounds.
    using moe::kernels::cuda::detail::PackedLabels;
    std::mt19937 rng(23);
    auto c = random_case(rng, 48, 6, 64, 120, 20);
    BatchSplit host(c.copies, c.server);
    int arcs = host.layout().arcs;
    PackedLabels probe(48, arcs, 1);
    REQUIRE(probe.fits);
    long long most = (1LL << (62 - probe.arc_bits - probe.hop_bits)) / 50;  // A + 1 stays under it: G + 2 = 50
    for (double fill : {0.9, 2.0}) {
      INFO("all pairs + 1 at " << fill << " of the packed labels' most");
      auto scaled = c;
      long long cells = static_cast<long long>(scaled.counts.size()), want = static_cast<long long>(fill * most);
      long long sum = 0;
      for (auto& n : scaled.counts) sum += n + 1;
      long long total = 0;
      for (auto& n : scaled.counts) {
        n = static_cast<std::int32_t>(std::min<long long>((n + 1) * (want / sum), 0x7fffffff));
        total += n;
      }
      REQUIRE(total / cells > 1000);
      CHECK(PackedLabels(48, arcs, total + 1).fits == (fill < 1));
      CHECK(total + 1 > most / 2);
      compare(scaled);
    }
  }
  SECTION("a workspace too large for shared memory goes to global memory") {
    std::mt19937 rng(12);
    auto c = random_case(rng, 16, 8, 2048, 64, 2);
    CHECK_FALSE(compare(c));
  }
}

TEST_CASE("device batch split flags a negative count and writes nothing", "[batch-split]") {
  BatchSplit host({{0, 1}, {1}}, std::vector<int>{0, 0});
  moe::kernels::cuda::DeviceSplit dev(host.layout());
  Device<std::int32_t> counts(std::vector<std::int32_t>{1, 2, -4, 0});
  Device<std::int32_t> take(dev.take_size());
  Device<long long> load(dev.load_size());
  Device<Outcome> outcome(1);
  take.poison();
  load.poison();
  dev.run(counts.get(), take.get(), load.get(), outcome.get(), nullptr, nullptr);
  CHECK(outcome.download()[0].bad == 1);
  for (auto v : take.download()) CHECK(v == -1);
  for (auto v : load.download()) CHECK(v == -1);
}

TEST_CASE("device batch split refuses a layout whose counts' offsets pass int", "[batch-split]") {
  // The counts pass addresses rank x experts (and server x experts) with int offsets. A hand-made
  // layout of one copy per expert on 65,536 ranks: 32,767 experts fit (2,147,418,112 entries),
  // 32,769 do not (2,147,549,184 > INT_MAX).
  auto layout_of = [](int ranks, int experts, std::vector<int>& first, std::vector<int>& rank,
                      std::vector<int>& server) {
    first.resize(static_cast<std::size_t>(experts) + 1);
    rank.resize(static_cast<std::size_t>(experts));
    server.assign(static_cast<std::size_t>(ranks), 0);
    for (int e = 0; e <= experts; ++e) first[static_cast<std::size_t>(e)] = e;
    for (int c = 0; c < experts; ++c) rank[static_cast<std::size_t>(c)] = c % ranks;
    moe::replication::split::Layout L;
    L.ranks = ranks, L.experts = experts, L.slots = experts, L.servers = 1;
    L.first = first.data(), L.rank = rank.data(), L.server = server.data();
    return L;
  };
  std::vector<int> first, rank, server;
  CHECK_NOTHROW(moe::kernels::cuda::DeviceSplit(layout_of(65536, 32767, first, rank, server)));
  CHECK_THROWS_WITH(moe::kernels::cuda::DeviceSplit(layout_of(65536, 32769, first, rank, server)),
                    Catch::Contains("65536 ranks x 32769 experts of counts do not fit int offsets"));
}

TEST_CASE("packed labels order as (distance, arcs, last arc) up to their bounds", "[batch-split]") {
  // detail::PackedLabels against std::tuple's order: at the extremes a label of the tie-breaks can
  // take (|distance| <= (G + 1)(A + 1), arcs <= G + 1, last arc < n_arcs), for the largest A that
  // fits and a few below it; the next A must not fit.
  using moe::kernels::cuda::detail::PackedLabels;
  for (int G : {1, 2, 31, 32, 48, 256, 1023})
    for (int arcs : {1, 2, 76, 1000, 1 << 20}) {
      long long lo = 0, hi = 1LL << 62;  // the largest A that fits, by bisection
      REQUIRE(PackedLabels(G, arcs, lo).fits);
      while (hi - lo > 1) {
        long long mid = lo + (hi - lo) / 2;
        (PackedLabels(G, arcs, mid).fits ? lo : hi) = mid;
      }
      INFO("G " << G << ", arcs " << arcs << ", largest A " << lo);
      CHECK_FALSE(PackedLabels(G, arcs, lo + 1).fits);
      for (long long A : {lo, lo / 2 + 1, 1LL}) {
        PackedLabels P(G, arcs, A);
        REQUIRE(P.fits);
        long long reach = (G + 1LL) * (A + 1);
        std::vector<std::tuple<long long, long long, int>> labels;
        for (long long d : {-reach, -reach + 1, -1LL, 0LL, 1LL, reach - 1, reach})
          for (long long h : {0LL, 1LL, G + 1LL})
            for (int a : {0, arcs - 1}) labels.emplace_back(d, h, a);
        for (auto const& x : labels) {
          auto [d, h, a] = x;
          long long k = P.pack(d, h, a);
          REQUIRE(k >= 0);
          REQUIRE(k < PackedLabels::none);
          REQUIRE(P.dist(k) == d);
          REQUIRE(P.hops(k) == h);
          REQUIRE(P.arc(k) == a);
          for (auto const& y : labels) {
            auto [e, i, b] = y;
            REQUIRE((k < P.pack(e, i, b)) == (x < y));
          }
        }
      }
    }
}

// ---- The split over an engine's slots (kernels::cuda::DeviceSlotSplit, moe/kernels/slot_split.cuh)

namespace {

/// An engine layer: phy2log of G GPUs x S slots (every expert at least once, the rest random,
/// so that an expert may hold two slots of one GPU), and each rank's top-k ids (token-major), some
/// padding (-1) and, with `stray`, ids past the experts.
struct SlotCase {
  int G = 1, per_server = 1, S = 1, E = 1, K = 1;
  std::vector<std::int64_t> phy2log;
  std::vector<std::vector<std::int64_t>> ids;  // per rank
};

SlotCase slot_case(std::mt19937& rng, bool stray) {
  SlotCase c;
  c.per_server = 1 + static_cast<int>(rng() % 4);
  c.G = c.per_server * (1 + static_cast<int>(rng() % 4));
  c.S = 1 + static_cast<int>(rng() % 6);
  int P = c.G * c.S;
  c.E = 1 + static_cast<int>(rng() % static_cast<unsigned>(P));
  c.phy2log.resize(static_cast<std::size_t>(P));
  for (int p = 0; p < P; ++p) c.phy2log[static_cast<std::size_t>(p)] = p < c.E ? p : static_cast<std::int64_t>(rng() % c.E);
  std::shuffle(c.phy2log.begin(), c.phy2log.end(), rng);
  c.K = 1 + static_cast<int>(rng() % 4);
  std::gamma_distribution<double> gam(0.6, 1.0);
  std::vector<double> w(static_cast<std::size_t>(c.E));
  for (auto& x : w) x = gam(rng) + 1e-9;
  std::discrete_distribution<int> pick(w.begin(), w.end());
  for (int r = 0; r < c.G; ++r) {
    int T = static_cast<int>(rng() % 40);  // zero tokens on some ranks
    std::vector<std::int64_t> v;
    for (int t = 0; t < T * c.K; ++t) {
      unsigned u = rng() % 20;
      v.push_back(u == 0 ? -1 : stray && u == 1 ? c.E + static_cast<std::int64_t>(rng() % 3) : pick(rng));
    }
    c.ids.push_back(std::move(v));
  }
  return c;
}

/// Runs the device slot split on the case (ids as Id, physical ids as Out) and checks it against
/// the host: EngineSlots + BatchSplit (plan_batch, deal, slot_of) bit for bit, and, without the
/// split's code, that every pair lands in a slot holding its expert and the slots' GPUs receive
/// the loads the plan reports.
template <class Id, class Out>
void compare_slots(SlotCase const& c) {
  using moe::replication::EngineSlots;
  using moe::test::Stream;
  EngineSlots slots(c.phy2log, c.G, c.per_server);
  REQUIRE(slots.experts() == c.E);
  long long most = 1;
  for (auto const& v : c.ids) most = std::max<long long>(most, static_cast<long long>(v.size()));
  moe::kernels::cuda::DeviceSlotSplit dev(slots, most);
  Stream s;
  // counts: every rank's row from its ids, as the engine's all-gather would put them
  Device<std::int32_t> counts(static_cast<std::size_t>(c.G * c.E));
  counts.poison();
  std::vector<Device<Id>> ids;
  for (int r = 0; r < c.G; ++r) {
    std::vector<Id> v(c.ids[static_cast<std::size_t>(r)].begin(), c.ids[static_cast<std::size_t>(r)].end());
    ids.emplace_back(v.empty() ? std::vector<Id>{0} : v);
    dev.count(ids.back().get(), static_cast<long long>(v.size()), counts.get() + static_cast<std::size_t>(r * c.E), s);
  }
  dev.plan(counts.get(), s);
  std::vector<Device<Out>> out;
  for (int r = 0; r < c.G; ++r) {
    out.emplace_back(std::max<std::size_t>(c.ids[static_cast<std::size_t>(r)].size(), 1));
    out.back().poison();
    dev.dispatch(r, ids[static_cast<std::size_t>(r)].get(), static_cast<long long>(c.ids[static_cast<std::size_t>(r)].size()),
                 out.back().get(), s);
  }
  auto dcounts = counts.download();
  std::vector<long long> dload(static_cast<std::size_t>(c.G));
  Outcome dout{};
  moe::kernels::cuda::check_cuda(cudaMemcpy(dload.data(), dev.load(), dload.size() * sizeof(long long), cudaMemcpyDeviceToHost), "load");
  moe::kernels::cuda::check_cuda(cudaMemcpy(&dout, dev.outcome(), sizeof dout, cudaMemcpyDeviceToHost), "outcome");

  // the counts, by a loop of the test's own
  std::vector<std::int32_t> want(static_cast<std::size_t>(c.G * c.E), 0);
  for (int r = 0; r < c.G; ++r)
    for (auto e : c.ids[static_cast<std::size_t>(r)])
      if (e >= 0 && e < c.E) ++want[static_cast<std::size_t>(r * c.E + e)];
  REQUIRE(dcounts == want);
  // the host's split of the same counts
  auto host = slots.split();
  auto hout = host.plan_batch(want);
  REQUIRE(dout.bad == 0);
  CHECK(dout.max_load == hout.max_load);
  CHECK(dout.local == hout.local);
  CHECK(dout.same_server == hout.same_server);
  CHECK(dload == host.load());
  std::vector<long long> got_load(static_cast<std::size_t>(c.G), 0);
  for (int r = 0; r < c.G; ++r) {
    auto const& v = c.ids[static_cast<std::size_t>(r)];
    auto phys = out[static_cast<std::size_t>(r)].download(v.size());
    std::vector<int> pairs, serving;
    for (auto e : v)
      if (e >= 0 && e < c.E) pairs.push_back(static_cast<int>(e));
    serving.resize(pairs.size());
    host.deal(r, pairs, serving);
    std::size_t j = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      INFO("rank " << r << ", pair " << i << ", id " << v[i]);
      if (v[i] < 0 || v[i] >= c.E) {
        REQUIRE(phys[i] == -1);
        continue;
      }
      REQUIRE(phys[i] == slots.slot_of(static_cast<int>(v[i]), serving[j++]));
      REQUIRE(phys[i] >= 0);
      REQUIRE(phys[i] < static_cast<Out>(c.phy2log.size()));
      REQUIRE(c.phy2log[static_cast<std::size_t>(phys[i])] == v[i]);  // a slot holding the pair's expert
      ++got_load[static_cast<std::size_t>(phys[i] / c.S)];
    }
  }
  CHECK(got_load == dload);
  CHECK(*std::max_element(got_load.begin(), got_load.end()) == dout.max_load);
}

}  // namespace

TEST_CASE("device slot split equals the host's engine-slot split", "[batch-split][slots]") {
#if defined(MOE_EMU_TSAN)
  constexpr unsigned seeds = 8;
#else
  constexpr unsigned seeds = 60;
#endif
  for (unsigned seed = 1; seed <= seeds; ++seed) {
    std::mt19937 rng(seed);
    auto c = slot_case(rng, seed % 3 == 0);
    INFO("seed " << seed << ": G " << c.G << " (" << c.per_server << " a server), " << c.S << " slots a GPU, E " << c.E
                 << ", top-" << c.K);
    switch (seed % 4) {
      case 0: compare_slots<std::int64_t, std::int64_t>(c); break;
      case 1: compare_slots<std::int32_t, std::int32_t>(c); break;
      case 2: compare_slots<std::int64_t, std::int32_t>(c); break;
      default: compare_slots<std::int32_t, std::int64_t>(c); break;
    }
  }
}

TEST_CASE("device slot split on the edge cases", "[batch-split][slots]") {
  std::mt19937 rng(99);
  SECTION("every pair to one expert with three copies, one of them twice on a GPU") {
    SlotCase c;
    c.G = 4, c.per_server = 2, c.S = 2, c.E = 5, c.K = 2;
    c.phy2log = {0, 1, 0, 0, 2, 3, 4, 0};  // expert 0: GPU 0, GPU 1 (two slots), GPU 3
    for (int r = 0; r < c.G; ++r) c.ids.emplace_back(static_cast<std::size_t>(2 * (r + 3)), 0);
    compare_slots<std::int64_t, std::int64_t>(c);
  }
  SECTION("no pairs anywhere, and only padding") {
    SlotCase c;
    c.G = 2, c.per_server = 1, c.S = 2, c.E = 3, c.K = 1;
    c.phy2log = {0, 1, 2, 1};
    c.ids = {{}, {-1, -1, -1}};
    compare_slots<std::int32_t, std::int32_t>(c);
  }
  SECTION("an expert alone on a GPU that holds it in all four slots") {
    SlotCase c;
    c.G = 3, c.per_server = 3, c.S = 4, c.E = 5, c.K = 2;
    c.phy2log = {0, 1, 2, 3, 4, 4, 4, 4, 0, 1, 2, 3};
    c.ids.resize(static_cast<std::size_t>(c.G));
    for (auto& v : c.ids)
      for (int t = 0; t < 30 * c.K; ++t) v.push_back(static_cast<std::int64_t>(rng() % 5));
    compare_slots<std::int64_t, std::int32_t>(c);
  }
  SECTION("bad calls are refused with a message") {
    std::vector<std::int64_t> phy2log = {0, 1, 1, 0};
    moe::replication::EngineSlots slots(phy2log, 2, 1);
    moe::kernels::cuda::DeviceSlotSplit dev(slots, 4);
    Device<std::int64_t> ids(std::vector<std::int64_t>{0, 1, 0, 1, 0});
    Device<std::int64_t> out(5);
    CHECK_THROWS_WITH(dev.dispatch(0, ids.get(), 5, out.get(), nullptr),
                      Catch::Contains("dispatch of 5 pairs; this split was built for at most 4"));
    CHECK_THROWS_WITH(dev.dispatch(2, ids.get(), 4, out.get(), nullptr), Catch::Contains("dispatch for rank 2, outside [0, 2)"));
    CHECK_THROWS_WITH(moe::kernels::cuda::DeviceSlotSplit(slots, 0), Catch::Contains("max_pairs must be in [1, "));
    CHECK_THROWS_WITH(moe::replication::EngineSlots(std::vector<std::int64_t>{0, 2, 2, 0}, 2, 1),
                      Catch::Contains("phy2log has no slot for expert 1"));
  }
}
