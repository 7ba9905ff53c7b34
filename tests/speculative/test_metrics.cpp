// Metrics (LAR, balance, accuracy, precision/recall, remote traffic) and the 3.2 volume formulas.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <vector>

#include "moe/speculative/cocluster.hpp"
#include "moe/profile/route_profile.hpp"
#include "moe/speculative/comm_volume.hpp"
#include "moe/speculative/metrics.hpp"

namespace sp = moe::speculative;
using moe::placement::Table;
using moe::profile::RouteRecorder;

namespace {
struct Activation {
  int token, expert;
};
}  // namespace

TEST_CASE("LAR and token balance against a list of activations", "[speculative][metrics]") {
  moe::core::Rng rng(9);
  int const E = 12, D = 4, K = 3;
  RouteRecorder rec(E, K);
  std::vector<Activation> acts;
  std::vector<int> occurrences(30, 0);
  for (int o = 0; o < 800; ++o) {
    int t = static_cast<int>(rng.below(30));
    ++occurrences[static_cast<std::size_t>(t)];
    std::vector<int> ex;
    while (ex.size() < K) {
      int e = static_cast<int>(rng.below(E));
      if (std::find(ex.begin(), ex.end(), e) == ex.end()) ex.push_back(e);
    }
    rec.record(t, 0, ex);
    for (int e : ex) acts.push_back({t, e});
  }
  auto p = rec.profile();
  std::vector<int> perm(E);
  std::iota(perm.begin(), perm.end(), 0);
  rng.shuffle(perm);
  std::vector<int> ed(E);
  for (int e = 0; e < E; ++e) ed[static_cast<std::size_t>(perm[static_cast<std::size_t>(e)])] = e / (E / D);
  Table placement(ed);
  auto dev = [](int t) { return (t * 7) % 4; };
  std::size_t local = 0;
  for (auto a : acts) local += placement.rank_of(a.expert) == dev(a.token);
  REQUIRE(sp::local_activation_rate(p.layer(0), placement, dev) == Approx(double(local) / double(acts.size())));
  auto bal = sp::token_balance(p.layer(0), K, D, dev);
  std::vector<double> ref(D, 0.0);
  for (int t = 0; t < 30; ++t) ref[static_cast<std::size_t>(dev(t))] += occurrences[static_cast<std::size_t>(t)];
  for (int d = 0; d < D; ++d) REQUIRE(bal.load[static_cast<std::size_t>(d)] == Approx(ref[static_cast<std::size_t>(d)]));
  double mx = *std::max_element(ref.begin(), ref.end());
  REQUIRE(bal.imbalance == Approx(mx / (800.0 / D) - 1));
  // Without shuffling, equal shares give exactly 1/D whatever the placement.
  std::vector<double> eq(D, 0.25), skew{0.7, 0.1, 0.1, 0.1};
  REQUIRE(sp::local_activation_rate_unshuffled(p.layer(0), placement, eq) == Approx(0.25));
  auto load = p.layer(0).expert_load();
  double num = 0;
  for (int e = 0; e < E; ++e)
    num += skew[static_cast<std::size_t>(placement.rank_of(e))] * static_cast<double>(load[static_cast<std::size_t>(e)]);
  REQUIRE(sp::local_activation_rate_unshuffled(p.layer(0), placement, skew) == Approx(num / (800.0 * K)));
  REQUIRE_THROWS_AS(sp::token_balance(p.layer(0), K, D, [](int) { return 4; }), moe::Error);
  moe::profile::LayerCounts empty;
  REQUIRE_THROWS_WITH(sp::local_activation_rate(empty, placement, dev), Catch::Contains("empty"));
}

TEST_CASE("expert precision / recall by hand", "[speculative][metrics]") {
  RouteRecorder fit(4, 2), eval(4, 2);
  fit.add(0, 1, 0, 3);
  fit.add(0, 1, 2, 2);
  fit.add(0, 1, 3, 1);
  fit.add(0, 5, 1, 2);  // token 5 is unseen in eval, token 2 unseen in fit
  eval.add(0, 1, 0, 6);
  eval.add(0, 1, 1, 2);
  eval.add(0, 1, 2, 2);  // token 1: 5 occurrences
  eval.add(0, 2, 1, 3);
  eval.add(0, 2, 3, 3);  // token 2: 3 occurrences
  auto pf = fit.profile(), pe = eval.profile();
  sp::TokenExpertTable table(pf.layer(0), 2, 8);  // token 1 -> {0, 2}
  auto pr = sp::expert_precision_recall(pe.layer(0), 2, table);
  REQUIRE(pr.precision == Approx(8.0 / 10.0));  // hits 6 + 2 of 5 occurrences * 2 predicted
  REQUIRE(pr.recall == Approx(8.0 / 16.0));
  REQUIRE(pr.coverage == Approx(5.0 / 8.0));
}

TEST_CASE("device top-1 accuracy and LAR on recorded paths", "[speculative][metrics]") {
  RouteRecorder rec(4, 2, true);
  std::vector<std::vector<int>> routes{{0, 2}, {1, 3}, {0, 1}, {2, 1}};
  for (std::size_t o = 0; o < routes.size(); ++o) rec.record(static_cast<int>(o), 0, routes[o]);
  auto p = rec.profile();
  auto rr = Table::round_robin(4, 2);  // experts 0,2 on device 0; 1,3 on device 1
  std::vector<int> pred{0, 0, 1, 0};   // correct, wrong, tie (both correct), tie
  REQUIRE(sp::device_top1_accuracy(p.paths(0), 2, rr, 2, pred) == Approx(0.75));
  REQUIRE(sp::local_activation_rate(p.paths(0), 2, rr, pred) == Approx((2 + 0 + 1 + 1) / 8.0));
  // Aggregated proxy on the same data equals the exact one here (one occurrence per token).
  auto dev = [&](int t) { return pred[static_cast<std::size_t>(t)]; };
  REQUIRE(sp::device_top1_accuracy(p.layer(0), rr, 2, dev) == Approx(0.75));
  REQUIRE_THROWS_AS(sp::device_top1_accuracy(p.paths(0), 2, rr, 2, std::vector<int>{0}), moe::Error);
  // A placement over more devices than given, or the wrong top_k, once indexed past the per-device
  // counts or the recorded expert ids.
  auto four = Table::round_robin(4, 4);
  REQUIRE_THROWS_WITH(sp::device_top1_accuracy(p.paths(0), 2, four, 2, pred),
                      Catch::Contains("puts expert 2 on rank 2, outside [0, 2)"));
  REQUIRE_THROWS_WITH(sp::device_top1_accuracy(p.paths(0), 3, rr, 2, pred),
                      Catch::Contains("paths hold 8 expert ids for 4 occurrences of top_k = 3"));
  REQUIRE_THROWS_WITH(sp::local_activation_rate(p.paths(0), 3, rr, pred), Catch::Contains("top_k = 3"));
  REQUIRE_THROWS_WITH(sp::local_activation_rate(p.paths(0), 2, Table::round_robin(2, 2), pred),
                      Catch::Contains("LAR: expert 2 outside the placement [0, 2)"));
  REQUIRE_THROWS_WITH(sp::device_top1_accuracy(p.paths(0), 2, rr, 0, pred), Catch::Contains("devices must be positive"));
  // The same on aggregated counts, and a placement of the wrong size for the unshuffled LAR.
  REQUIRE_THROWS_WITH(sp::device_top1_accuracy(p.layer(0), four, 2, dev), Catch::Contains("outside [0, 2)"));
  REQUIRE_THROWS_WITH(sp::device_top1_accuracy(p.layer(0), Table::round_robin(3, 2), 2, dev),
                      Catch::Contains("placement table has 3 entries but the layer has 4 experts"));
  std::vector<double> halves{0.5, 0.5};
  REQUIRE_THROWS_WITH(sp::local_activation_rate_unshuffled(p.layer(0), Table::round_robin(3, 2), halves),
                      Catch::Contains("LAR: placement has 3 experts, counts 4"));
  moe::profile::LayerPaths none;
  REQUIRE_THROWS_WITH(sp::local_activation_rate(none, 2, rr, std::vector<int>{}), Catch::Contains("LAR: no recorded occurrences"));
  REQUIRE_THROWS_WITH(sp::local_activation_rate(p.paths(0), 2, rr, std::vector<int>{0}),
                      Catch::Contains("LAR: 1 devices for 4 occurrences"));
}

TEST_CASE("remote traffic counts remote pairs and de-duplicated sends", "[speculative][metrics]") {
  auto placement = Table::contiguous(8, 4);  // expert e on device e / 2
  std::vector<int> device{0, 1, 3};
  std::vector<int> experts{0, 1, 2, 3,   // token 0 on dev 0: local 0,1; remote 2,3 (both dev 1)
                           2, 3, 4, 6,   // token 1 on dev 1: local 2,3; remote dev 2, dev 3
                           0, 2, 4, 5};  // token 2 on dev 3: all remote: dev 0, 1, 2, 2
  auto r = sp::remote_traffic(device, experts, 4, placement, 4);
  REQUIRE(r.tokens == 3);
  REQUIRE(r.pairs == 12);
  REQUIRE(r.remote_pairs == 2 + 2 + 4);
  REQUIRE(r.remote_token_devices == 1 + 2 + 3);
  REQUIRE(r.local_rate() == Approx(4.0 / 12.0));
  REQUIRE_THROWS_AS(sp::remote_traffic(device, std::vector<int>(11), 4, placement, 4), moe::Error);
}

namespace {
// Independent reference: ring all-reduce on D devices holding `n` elements each (D chunks);
// counts every element sent and checks the reduced values.
double ring_all_reduce_elements(int D, int n) {
  std::vector<std::vector<double>> buf(static_cast<std::size_t>(D), std::vector<double>(static_cast<std::size_t>(n)));
  for (int d = 0; d < D; ++d)
    for (int i = 0; i < n; ++i) buf[static_cast<std::size_t>(d)][static_cast<std::size_t>(i)] = d + 1;
  auto at = [&](int c, int i) { return static_cast<std::size_t>(c * (n / D) + i); };
  double sent = 0;
  for (int step = 0; step < D - 1; ++step) {  // reduce-scatter
    auto snap = buf;
    for (int d = 0; d < D; ++d) {
      int c = ((d - step) % D + D) % D, to = (d + 1) % D;
      for (int i = 0; i < n / D; ++i) {
        buf[static_cast<std::size_t>(to)][at(c, i)] += snap[static_cast<std::size_t>(d)][at(c, i)];
        ++sent;
      }
    }
  }
  for (int step = 0; step < D - 1; ++step) {  // all-gather
    auto snap = buf;
    for (int d = 0; d < D; ++d) {
      int c = ((d + 1 - step) % D + D) % D, to = (d + 1) % D;
      for (int i = 0; i < n / D; ++i) {
        buf[static_cast<std::size_t>(to)][at(c, i)] = snap[static_cast<std::size_t>(d)][at(c, i)];
        ++sent;
      }
    }
  }
  double want = D * (D + 1) / 2.0;
  for (auto const& b : buf)
    for (double v : b) REQUIRE(v == want);
  return sent;
}
}  // namespace

TEST_CASE("3.2 volume formulas against simulated collectives", "[speculative][metrics][volume]") {
  int const D = 4, T = 64, H = 3, K = 2;
  sp::VolumeModel m{.devices = D, .tokens = T, .hidden = H, .top_k = K, .bytes_per_element = 2};
  // All-reduce: ring simulation on T*H elements of 2 bytes.
  REQUIRE(m.all_reduce() == Approx(ring_all_reduce_elements(D, T * H) * 2));
  // Shuffled reduce-scatter with uneven groups: device d receives its n_d rows from D-1 others.
  moe::core::Rng rng(2);
  std::vector<int> pred(T);
  for (auto& d : pred) d = rng.uniform() < 0.5 ? 0 : static_cast<int>(rng.below(D));  // skewed
  double srs = 0;
  for (int d = 0; d < D; ++d) srs += static_cast<double>(std::count(pred.begin(), pred.end(), d)) * (D - 1) * H * 2;
  REQUIRE(m.reduce_scatter() == Approx(srs));
  REQUIRE(m.all_gather() == Approx(srs));  // the shuffled all-gather moves the same rows back
  // All-to-all: random routes, tokens on their predicted devices, measured LAR.
  auto placement = Table::contiguous(8, D);
  std::vector<int> experts;
  for (int t = 0; t < T; ++t) {
    int a = static_cast<int>(rng.below(8)), b;
    do b = static_cast<int>(rng.below(8));
    while (b == a);
    experts.push_back(a);
    experts.push_back(b);
  }
  auto r = sp::remote_traffic(pred, experts, K, placement, D);
  REQUIRE(m.all_to_all(r.local_rate()) == Approx(static_cast<double>(r.remote_pairs) * H * 2));
  REQUIRE(m.all_to_all_rows(static_cast<std::int64_t>(r.remote_token_devices)) ==
          Approx(static_cast<double>(r.remote_token_devices) * H * 2));
  // Pipelines: the shuffled one saves one all-gather plus the extra local activations.
  double lar0 = 0.25, lar1 = 0.6;
  auto b = sp::baseline_volume(m, lar0), s = sp::speculative_volume(m, lar1);
  REQUIRE(b.total() == Approx(m.all_reduce() + 2 * m.all_to_all(lar0) + m.all_gather()));
  REQUIRE(b.total() - s.total() == Approx(m.all_gather() + 2.0 * K * T * H * 2 * (lar1 - lar0)));
  REQUIRE(sp::volume_saving(m, lar0, lar0) == Approx(m.all_gather() / b.total()));
  REQUIRE_THROWS_AS(m.all_to_all(1.5), moe::Error);
  sp::VolumeModel bad = m;
  bad.devices = 0;
  REQUIRE_THROWS_AS(sp::baseline_volume(bad, 0.5), moe::Error);
}
