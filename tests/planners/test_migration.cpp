// The minimal-move rebalance (moe/replication/migration.hpp) against an independent brute force:
// on small layers every slot layout is enumerated, and the fewest slots needing a copy among the
// layouts within the balance target is the reference. Also: the transfers rebuild the new layout
// exactly, an unchanged layer moves nothing, the copy cap holds, bad input is refused, and the
// modelled transfer time matches a hand-worked case.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>

#include "moe/replication/migration.hpp"

using namespace moe::replication;

namespace {

// Largest GPU load of a layout, recomputed here (load / copies per slot, summed per GPU).
double max_load(std::vector<float> const& w, std::vector<int> const& row, int G) {
  int E = static_cast<int>(w.size()), P = static_cast<int>(row.size()), S = P / G;
  std::vector<int> cnt(E, 0);
  for (int e : row) ++cnt[e];
  for (int c : cnt)
    if (c == 0) return -1;  // an expert without a slot: not a valid layout
  std::vector<double> L(G, 0.0);
  for (int p = 0; p < P; ++p) L[p / S] += static_cast<double>(w[row[p]]) / cnt[row[p]];
  return *std::max_element(L.begin(), L.end());
}

// Slots whose GPU held no copy of their expert in the old layout.
int copies(std::vector<int> const& old, std::vector<int> const& row, int G) {
  int P = static_cast<int>(row.size()), S = P / G, n = 0;
  for (int p = 0; p < P; ++p) {
    int g = p / S;
    n += std::find(old.begin() + g * S, old.begin() + (g + 1) * S, row[p]) == old.begin() + (g + 1) * S;
  }
  return n;
}

// The fewest copies over all layouts whose max load is <= target (multisets per GPU suffice: the
// order of slots inside a GPU changes neither load nor copies).
int brute_force(std::vector<float> const& w, std::vector<int> const& old, int G, double target) {
  int E = static_cast<int>(w.size()), P = static_cast<int>(old.size());
  std::vector<int> row(P, 0);
  int best = P + 1;
  while (true) {
    double m = max_load(w, row, G);
    if (m >= 0 && m <= target) best = std::min(best, copies(old, row, G));
    int i = 0;
    while (i < P && row[i] == E - 1) row[i++] = 0;
    if (i == P) break;
    ++row[i];
  }
  return best;
}

std::vector<int> random_layout(std::mt19937& rng, int E, int P) {
  std::vector<int> row(P);
  for (int p = 0; p < P; ++p) row[p] = p % E;
  std::shuffle(row.begin(), row.end(), rng);
  return row;
}

}  // namespace

TEST_CASE("migration: within the target, and close to the brute-force fewest copies") {
  struct Shape {
    int E, G, S;
  };
  std::mt19937 rng(7);
  int cases = 0, optimal = 0, excess = 0;
  for (Shape sh : {Shape{3, 2, 2}, Shape{4, 2, 3}, Shape{4, 3, 2}, Shape{5, 2, 3}, Shape{5, 2, 4}}) {
    int P = sh.G * sh.S;
    for (int rep = 0; rep < 12; ++rep) {
      std::gamma_distribution<double> gam(0.7, 100.0);
      eplb::Matrix<float> w(1, sh.E);
      for (auto& x : w.v) x = static_cast<float>(1.0 + gam(rng));
      eplb::Matrix<int> old(1, P);
      old.v = random_layout(rng, sh.E, P);
      double tol = rep % 3 == 0 ? 0.0 : rep % 3 == 1 ? 0.05 : 0.2;
      migration::Options o;
      o.tolerance = tol;
      auto r = migration::rebalance(w, old, sh.G, o);
      auto ref = migration::eplb_reference(w, P, 1, 1, sh.G);
      double target = (1 + tol) * max_load(w.v, ref.phy2log.v, sh.G);
      std::vector<int> row = r.phy2log.v;
      INFO("E " << sh.E << " G " << sh.G << " S " << sh.S << " rep " << rep);
      REQUIRE(max_load(w.v, row, sh.G) <= target * (1 + 1e-12));
      CHECK(r.layers[0].copies == copies(old.v, row, sh.G));
      int best = brute_force(w.v, old.v, sh.G, target * (1 + 1e-12));
      CHECK(r.layers[0].copies >= best);
      CHECK(r.layers[0].copies <= best + sh.S);  // never worse than one GPU's worth of extra copies
      ++cases;
      optimal += r.layers[0].copies == best;
      excess += r.layers[0].copies - best;
    }
  }
  WARN("migration vs brute force: " << optimal << " of " << cases << " optimal, " << excess << " extra copies in all");
  CHECK(optimal * 10 >= cases * 7);  // at least 70% of the small cases optimal
}

TEST_CASE("migration: an unchanged layer moves nothing; the transfers rebuild the layout") {
  std::mt19937 rng(11);
  int L = 6, E = 32, G = 8, P = 40;
  eplb::Matrix<float> w(L, E);
  std::gamma_distribution<double> gam(0.7, 100.0);
  for (auto& x : w.v) x = static_cast<float>(gam(rng));
  auto start = migration::eplb_reference(w, P, 4, 2, G).phy2log;
  migration::Options o;
  o.num_groups = 4;
  o.num_nodes = 2;
  auto same = migration::rebalance(w, start, G, o);
  CHECK(same.copies() == 0);
  CHECK(same.transfers.empty());
  CHECK(same.phy2log.v == start.v);

  std::uniform_real_distribution<double> drift(0.5, 1.5);
  for (auto& x : w.v) x = static_cast<float>(x * drift(rng));
  auto r = migration::rebalance(w, start, G, o);
  int S = P / G;
  std::vector<int> rebuilt(start.v.size(), -1);
  std::set<std::pair<int, int>> seen;
  for (auto const& t : r.transfers) {
    REQUIRE(seen.insert({t.layer, t.slot}).second);
    CHECK(t.dst == t.slot / S);
    CHECK(t.src != t.dst);
    auto const* o_src = start.v.data() + t.layer * P + t.src * S;
    CHECK(std::find(o_src, o_src + S, t.expert) != o_src + S);
    rebuilt[t.layer * P + t.slot] = t.expert;
  }
  for (int l = 0; l < L; ++l)
    for (int p = 0; p < P; ++p) {
      int g = p / S;
      auto const* o_dst = start.v.data() + l * P + g * S;
      if (rebuilt[l * P + p] < 0) {
        CHECK(std::find(o_dst, o_dst + S, r.phy2log(l, p)) != o_dst + S);  // already on the GPU
        rebuilt[l * P + p] = r.phy2log(l, p);
      }
    }
  // Experts that stay on a GPU keep their slots: per GPU and expert, min(old copies, new copies)
  // slots hold it before and after.
  for (int l = 0; l < L; ++l)
    for (int g = 0; g < G; ++g)
      for (int e = 0; e < E; ++e) {
        int before = 0, after = 0, kept = 0;
        for (int p = g * S; p < (g + 1) * S; ++p) {
          before += start(l, p) == e;
          after += r.phy2log(l, p) == e;
          kept += start(l, p) == e && r.phy2log(l, p) == e;
        }
        CHECK(kept == std::min(before, after));
      }
  CHECK(rebuilt == r.phy2log.v);
}

TEST_CASE("migration: the copy cap is a hard limit") {
  std::mt19937 rng(3);
  int L = 4, E = 16, G = 4, P = 20;
  eplb::Matrix<float> w(L, E);
  std::gamma_distribution<double> gam(0.5, 100.0);
  for (auto& x : w.v) x = static_cast<float>(gam(rng));
  eplb::Matrix<int> old(L, P);
  for (int l = 0; l < L; ++l) {
    auto row = random_layout(rng, E, P);
    std::copy(row.begin(), row.end(), old.v.begin() + l * P);
  }
  for (long long cap : {0LL, 1LL, 3LL}) {
    migration::Options o;
    o.max_copies_per_layer = cap;
    auto r = migration::rebalance(w, old, G, o);
    for (auto const& s : r.layers) {
      CHECK(s.copies <= cap);
      CHECK(s.max_load <= s.old_max_load + 1e-9);
    }
    if (cap == 0) CHECK(r.transfers.empty());  // only moves inside a GPU (a second copy of a local expert)
  }
}

// Copies of a new layout (G GPUs of S slots) against an old one of any width (-1: empty slot):
// slots whose GPU held no copy of their expert; GPUs past the old width held nothing.
int copies_elastic(std::vector<int> const& old, std::vector<int> const& row, int S) {
  int P = static_cast<int>(row.size()), Pold = static_cast<int>(old.size()), n = 0;
  for (int p = 0; p < P; ++p) {
    int g = p / S;
    bool held = false;
    for (int q = g * S; q < (g + 1) * S && q < Pold; ++q) held = held || old[q] == row[p];
    n += !held;
  }
  return n;
}

// The fewest copies over all P-slot layouts within the target (every expert placed).
int brute_force_elastic(std::vector<float> const& w, std::vector<int> const& old, int G, int P, double target) {
  int E = static_cast<int>(w.size()), S = P / G;
  std::vector<int> row(P, 0);
  int best = P + 1;
  while (true) {
    double m = max_load(w, row, G);
    if (m >= 0 && m <= target) best = std::min(best, copies_elastic(old, row, S));
    int i = 0;
    while (i < P && row[i] == E - 1) row[i++] = 0;
    if (i == P) break;
    ++row[i];
  }
  return best;
}

TEST_CASE("migration: elastic scale-down and scale-up against brute force") {
  // Scale-down: the old layout is wider (GPUs >= G leave); scale-up: new GPUs' slots are -1.
  std::mt19937 rng(19);
  int cases = 0, optimal = 0;
  struct Shape {
    int E, Gold, G, S;
  };
  for (Shape sh : {Shape{3, 3, 2, 2}, Shape{4, 3, 2, 3}, Shape{4, 2, 3, 2}, Shape{3, 1, 2, 3}, Shape{5, 3, 2, 3}}) {
    for (int rep = 0; rep < 8; ++rep) {
      int Pold = sh.Gold * sh.S, P = sh.G * sh.S;
      std::gamma_distribution<double> gam(0.7, 100.0);
      eplb::Matrix<float> w(1, sh.E);
      for (auto& x : w.v) x = static_cast<float>(1.0 + gam(rng));
      eplb::Matrix<int> old(1, sh.G > sh.Gold ? P : Pold);
      std::fill(old.v.begin(), old.v.end(), -1);  // scale-up: padded to the new width with -1
      auto lay = random_layout(rng, sh.E, Pold);
      std::copy(lay.begin(), lay.end(), old.v.begin());
      double tol = rep % 2 ? 0.05 : 0.0;
      migration::Options o;
      o.tolerance = tol;
      o.num_replicas = P;
      auto r = migration::rebalance(w, old, sh.G, o);
      auto ref = migration::eplb_reference(w, P, 1, 1, sh.G);
      double target = (1 + tol) * max_load(w.v, ref.phy2log.v, sh.G);
      INFO("E " << sh.E << " old GPUs " << sh.Gold << " GPUs " << sh.G << " S " << sh.S << " rep " << rep);
      REQUIRE(static_cast<int>(r.phy2log.v.size()) == P);
      REQUIRE(max_load(w.v, r.phy2log.v, sh.G) >= 0);  // every expert placed
      REQUIRE(max_load(w.v, r.phy2log.v, sh.G) <= target * (1 + 1e-12));
      CHECK(r.layers[0].copies == copies_elastic(old.v, r.phy2log.v, sh.S));
      CHECK(static_cast<int>(r.transfers.size()) == r.layers[0].copies);
      for (auto const& t : r.transfers) {  // sources held the expert, departed GPUs included
        auto const* src = old.v.data() + t.src * sh.S;
        CHECK(std::find(src, src + sh.S, t.expert) != src + sh.S);
        CHECK(t.dst == t.slot / sh.S);
      }
      int best = brute_force_elastic(w.v, old.v, sh.G, P, target * (1 + 1e-12));
      CHECK(r.layers[0].copies >= best);
      CHECK(r.layers[0].copies <= best + sh.S);
      ++cases;
      optimal += r.layers[0].copies == best;
    }
  }
  WARN("elastic migration vs brute force: " << optimal << " of " << cases << " optimal");
  CHECK(optimal * 10 >= cases * 6);
}

TEST_CASE("migration: the group-to-node rule is kept when EPLB is hierarchical") {
  std::mt19937 rng(23);
  int L = 8, E = 32, G = 8, P = 40, groups = 8, nodes = 2;
  eplb::Matrix<float> w(L, E);
  std::gamma_distribution<double> gam(0.7, 100.0);
  for (auto& x : w.v) x = static_cast<float>(gam(rng));
  migration::Options o;
  o.num_groups = groups;
  o.num_nodes = nodes;
  // From a random layout (groups scattered everywhere) and from EPLB's, over drifting loads.
  eplb::Matrix<int> old(L, P);
  for (int l = 0; l < L; ++l) {
    auto row = random_layout(rng, E, P);
    std::copy(row.begin(), row.end(), old.v.begin() + l * P);
  }
  std::uniform_real_distribution<double> drift(0.75, 1.25);
  for (int step = 0; step < 4; ++step) {
    for (auto& x : w.v) x = static_cast<float>(x * drift(rng));
    auto r = migration::rebalance(w, old, G, o);
    CHECK(r.group_rule);
    for (int l = 0; l < L; ++l) {
      INFO("step " << step << " layer " << l);
      // Independent count: per group, the set of nodes holding any of its experts' slots.
      std::vector<std::set<int>> at(groups);
      for (int p = 0; p < P; ++p) at[r.phy2log(l, p) / (E / groups)].insert((p / (P / G)) / (G / nodes));
      for (auto const& s : at) CHECK(s.size() == 1);
      CHECK(r.layers[l].scattered_groups == 0);
      CHECK(r.layers[l].max_load <= r.layers[l].eplb_max_load * 1.01 * (1 + 1e-12));
      std::vector<int> row(r.phy2log.v.begin() + l * P, r.phy2log.v.begin() + (l + 1) * P);
      CHECK(max_load(std::vector<float>(w.v.begin() + l * E, w.v.begin() + (l + 1) * E), row, G) ==
            Approx(r.layers[l].max_load).epsilon(1e-9));
    }
    old = r.phy2log;
  }
  // 4 groups over 3 nodes: EPLB's global policy, and the result says the rule does not apply.
  eplb::Matrix<int> start = migration::eplb_reference(w, 48, 1, 1, 8).phy2log;
  migration::Options flat;
  flat.num_groups = 4;
  flat.num_nodes = 3;  // 8 GPUs do not split over 3 nodes: allowed, as eplb.py's global policy
  auto f = migration::rebalance(w, start, 8, flat);
  CHECK_FALSE(f.group_rule);
}

TEST_CASE("migration: bad input names the problem") {
  eplb::Matrix<float> w(1, 4, 1.0f);
  eplb::Matrix<int> old(1, 6);
  old.v = {0, 1, 2, 3, 0, 1};
  CHECK_THROWS_WITH(migration::rebalance(w, old, 4), Catch::Contains("do not split over 4 GPUs"));
  auto missing = old;
  missing.v = {0, 1, 2, 0, 0, 1};
  CHECK_THROWS_WITH(migration::rebalance(w, missing, 2), Catch::Contains("no slot for expert 3"));
  auto outside = old;
  outside.v[5] = 9;
  CHECK_THROWS_WITH(migration::rebalance(w, outside, 2), Catch::Contains("outside [0, 4)"));
  auto below = old;
  below.v[5] = -2;
  CHECK_THROWS_WITH(migration::rebalance(w, below, 2), Catch::Contains("-1 marks an empty slot"));
  migration::Options narrow;
  narrow.num_replicas = 4;  // 2 slots per GPU: the old 6 slots are 3 GPUs, fine; 5 slots are not
  eplb::Matrix<int> five(1, 5);
  five.v = {0, 1, 2, 3, 0};
  CHECK_THROWS_WITH(migration::rebalance(w, five, 2, narrow), Catch::Contains("not whole GPUs of 2 slots"));
  auto nan = w;
  nan.v[1] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(migration::rebalance(nan, old, 2), Catch::Contains("not finite"));
  eplb::Matrix<int> two(2, 6);
  CHECK_THROWS_WITH(migration::rebalance(w, two, 2), Catch::Contains("expected layers x slots"));
  migration::Options o;
  o.tolerance = -0.1;
  CHECK_THROWS_WITH(migration::rebalance(w, old, 2, o), Catch::Contains("tolerance"));
}

TEST_CASE("migration: transfer time on a hand-worked cluster") {
  // Two servers of two GPUs under one switch: GPU 0 -> GPU 2 crosses GPU 0's NVLink, server 0's
  // uplink (2 GPUs x 50 GB/s = 100 GB/s), server 1's downlink and GPU 2's NVLink.
  auto topo = moe::topology::fat_tree(1, 2, 2, 1);
  moe::topology::TrafficModel model(topo);
  double B = 44e6;
  std::vector<migration::Transfer> one = {{0, 0, 0, 0, 2}};
  auto t = migration::transfer_time(model, one, 1, B);
  double lat = 2 * 1e-6 + 2 * 2e-6;  // two NVLink hops and two NIC hops
  CHECK(t.seconds == Approx(B / 100e9 + lat).epsilon(1e-12));
  CHECK(t.inter_node_bytes == B);
  // Two transfers out of server 0 share its uplink; one inside server 1 uses NVLink only.
  std::vector<migration::Transfer> three = {{0, 0, 0, 0, 2}, {0, 1, 1, 1, 3}, {1, 0, 2, 2, 3}};
  auto t3 = migration::transfer_time(model, three, 2, B);
  CHECK(t3.layer_seconds[0] == Approx(2 * B / 100e9 + lat).epsilon(1e-12));
  CHECK(t3.layer_seconds[1] == Approx(B / 450e9 + 2 * 1e-6).epsilon(1e-12));
  CHECK(t3.inter_node_bytes == 2 * B);
  std::vector<migration::Transfer> unsorted = {{1, 0, 0, 0, 2}, {0, 0, 0, 0, 2}};
  CHECK_THROWS_WITH(migration::transfer_time(model, unsorted, 2, B), Catch::Contains("not sorted"));
}
