// Route profiles: recording, aggregation, TSV loading and writing, bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <tuple>
#include <vector>

#include "moe/speculative/cocluster.hpp"
#include "moe/profile/olmoe_tokens.hpp"
#include "moe/profile/route_profile.hpp"
#include "moe/profile/route_split.hpp"
#include "moe/profile/route_synthetic.hpp"

using moe::profile::RouteProfile;
using moe::profile::RouteRecorder;

namespace {
RouteProfile load_string(std::string const& text, int experts = 4, int top_k = 2) {
  std::istringstream is(text);
  moe::core::TsvReader in(is, "mem.tsv");
  RouteRecorder rec(experts, top_k);
  moe::profile::load_token_expert_counts(in, rec);
  return rec.profile();
}
}  // namespace

TEST_CASE("record aggregates token -> expert counts like a plain map", "[speculative][profile]") {
  moe::core::Rng rng(7);
  RouteRecorder rec(8, 3, /*keep_paths=*/true);
  std::map<std::tuple<int, int, int>, long> ref;  // (layer, token, expert) -> count
  std::vector<int> tokens;
  for (int n = 0; n < 500; ++n) tokens.push_back(static_cast<int>(rng.below(40)));
  for (int layer : {3, 1}) {
    for (int t : tokens) {
      std::vector<int> ex;
      while (ex.size() < 3) {
        int e = static_cast<int>(rng.below(8));
        if (std::find(ex.begin(), ex.end(), e) == ex.end()) ex.push_back(e);
      }
      rec.record(t, layer, ex);
      for (int e : ex) ++ref[{layer, t, e}];
    }
  }
  auto p = rec.profile();
  REQUIRE(p.layers() == std::vector<int>{1, 3});
  REQUIRE(p.top_k() == 3);
  std::map<std::tuple<int, int, int>, long> got;
  for (int l : p.layers()) {
    auto const& lc = p.layer(l);
    for (std::size_t r = 0; r < lc.rows(); ++r) {
      if (r > 0) REQUIRE(lc.tokens[r - 1] < lc.tokens[r]);
      for (auto j = lc.offsets[r]; j < lc.offsets[r + 1]; ++j)
        got[{l, lc.tokens[r], lc.expert[static_cast<std::size_t>(j)]}] += lc.count[static_cast<std::size_t>(j)];
    }
  }
  REQUIRE(got == ref);
  // Paths keep the occurrence order of each layer.
  REQUIRE(p.paths(1).tokens == std::vector<std::int32_t>(tokens.begin(), tokens.end()));
  REQUIRE(p.paths(3).experts.size() == tokens.size() * 3);
  // Occurrences of a row = activations / top_k.
  auto const& l1 = p.layer(1);
  auto row = l1.find(tokens[0]);
  REQUIRE(row >= 0);
  auto occ = std::count(tokens.begin(), tokens.end(), tokens[0]);
  REQUIRE(p.occurrences(l1, static_cast<std::size_t>(row)) == Approx(static_cast<double>(occ)));
  REQUIRE(l1.find(1000) == -1);
}

TEST_CASE("record_batch equals one record per token", "[speculative][profile]") {
  RouteRecorder a(4, 2), b(4, 2);
  std::vector<int> toks{5, 6, 5};
  std::vector<int> ex{0, 1, 2, 3, 1, 0};
  a.record_batch(0, toks, ex);
  for (std::size_t n = 0; n < toks.size(); ++n) b.record(toks[n], 0, std::span<int const>(ex).subspan(n * 2, 2));
  auto pa = a.profile(), pb = b.profile();
  REQUIRE(pa.layer(0).tokens == pb.layer(0).tokens);
  REQUIRE(pa.layer(0).count == pb.layer(0).count);
  REQUIRE(pa.layer(0).count == std::vector<std::int64_t>{2, 2, 1, 1});
  REQUIRE_THROWS_AS(a.record_batch(0, toks, std::vector<int>{0, 1}), moe::Error);
}

TEST_CASE("record rejects bad routes", "[speculative][profile][errors]") {
  RouteRecorder rec(4, 2);
  std::vector<int> three{0, 1, 2}, dup{1, 1}, out{0, 4}, ok{0, 1};
  REQUIRE_THROWS_WITH(rec.record(1, 0, three), Catch::Contains("expected top_k = 2"));
  REQUIRE_THROWS_WITH(rec.record(1, 0, dup), Catch::Contains("twice"));
  REQUIRE_THROWS_WITH(rec.record(1, 0, out), Catch::Contains("outside [0, 4)"));
  REQUIRE_THROWS_WITH(rec.record(-1, 0, ok), Catch::Contains("negative"));
  REQUIRE_THROWS_AS(RouteRecorder(0, 1), moe::Error);
  REQUIRE_THROWS_AS(RouteRecorder(4, 5), moe::Error);
}

TEST_CASE("empty profiles are reported", "[speculative][profile][errors]") {
  RouteRecorder rec(4, 2);
  REQUIRE_THROWS_WITH(rec.profile(), Catch::Contains("empty"));
  RouteProfile none;
  REQUIRE(none.empty());
  REQUIRE_THROWS_WITH(none.layer(0), Catch::Contains("empty"));
  RouteRecorder one(4, 2);
  std::vector<int> ok{0, 1};
  one.record(3, 0, ok);
  auto p = one.profile();
  REQUIRE_THROWS_WITH(p.layer(7), Catch::Contains("no layer 7"));
  REQUIRE_THROWS_WITH(p.paths(0), Catch::Contains("paths"));
  REQUIRE_THROWS_WITH(p.crosslayer(0, 1), Catch::Contains("cross-layer"));
}

TEST_CASE("paths of different layers must describe the same occurrences", "[speculative][profile][errors]") {
  RouteRecorder rec(4, 2, true);
  std::vector<int> ok{0, 1};
  rec.record(3, 0, ok);
  rec.record(4, 0, ok);
  rec.record(3, 1, ok);
  rec.record(5, 1, ok);
  REQUIRE_THROWS_WITH(rec.profile(), Catch::Contains("same token order"));
}

TEST_CASE("token_expert_counts TSV: header, comments, merge of duplicates", "[speculative][profile]") {
  auto p = load_string(
      "layer\ttoken_id\texpert\tcount\n"
      "# a comment\n"
      "0\t7\t1\t3\n"
      "0\t7\t2\t1\n"
      "\n"
      "0 7 2 2\n"  // spaces are accepted, duplicates add up
      "2\t1\t0\t2\n");
  REQUIRE(p.layers() == std::vector<int>{0, 2});
  auto const& l0 = p.layer(0);
  REQUIRE(l0.tokens == std::vector<std::int32_t>{7});
  REQUIRE(l0.expert == std::vector<std::int32_t>{1, 2});
  REQUIRE(l0.count == std::vector<std::int64_t>{3, 3});
  REQUIRE(l0.expert_load() == std::vector<std::int64_t>{0, 3, 3, 0});
  // Round trip through the writer.
  std::ostringstream os;
  moe::profile::write_token_expert_counts(p, os);
  auto q = load_string(os.str());
  REQUIRE(q.layer(0).count == l0.count);
  REQUIRE(q.layer(2).tokens == p.layer(2).tokens);
}

TEST_CASE("malformed TSV files give file:line errors", "[speculative][profile][errors]") {
  REQUIRE_THROWS_WITH(load_string("0\t1\t2\n"), Catch::Contains("mem.tsv:1") && Catch::Contains("expected 4 fields"));
  REQUIRE_THROWS_WITH(load_string("layer\ttoken_id\texpert\tcount\n0\tx\t2\t1\n"),
                      Catch::Contains("mem.tsv:2") && Catch::Contains("token_id"));
  REQUIRE_THROWS_WITH(load_string("0\t1\t9\t1\n"), Catch::Contains("mem.tsv:1") && Catch::Contains("expert 9"));
  REQUIRE_THROWS_WITH(load_string("0\t1\t1\t-2\n"), Catch::Contains("negative"));
  REQUIRE_THROWS_WITH(load_string("-1\t1\t1\t2\n"), Catch::Contains("mem.tsv:1: column 1 (layer): -1 outside [0, 4095]"));
  REQUIRE_THROWS_WITH(load_string("# only a comment\n"), Catch::Contains("empty file"));
  REQUIRE_THROWS_WITH(load_string("0\t1\t1\t3\n"), Catch::Contains("not a multiple of top_k"));
  RouteRecorder rec(4, 2);
  REQUIRE_THROWS_AS(moe::profile::load_token_expert_counts("/nonexistent/file.tsv", rec), moe::Error);
}

TEST_CASE("crosslayer TSV", "[speculative][profile]") {
  std::istringstream is("layer_a\tlayer_b\texpert_a\texpert_b\tcount\n0\t7\t1\t2\t5\n0\t7\t1\t2\t1\n0\t7\t3\t0\t2\n");
  moe::core::TsvReader in(is, "x.tsv");
  RouteRecorder rec(4, 2);
  moe::profile::load_crosslayer_counts(in, rec);
  std::vector<int> ok{0, 1};
  rec.record(0, 0, ok);
  auto p = rec.profile();
  auto const& m = p.crosslayer(0, 7);
  REQUIRE(m.size() == 16);
  REQUIRE(m[1 * 4 + 2] == 6);
  REQUIRE(m[3 * 4 + 0] == 2);
  REQUIRE(std::accumulate(m.begin(), m.end(), std::int64_t{0}) == 8);
  std::istringstream bad("0\t7\t1\t2\n");
  moe::core::TsvReader in2(bad, "bad.tsv");
  REQUIRE_THROWS_WITH(moe::profile::load_crosslayer_counts(in2, rec), Catch::Contains("bad.tsv:1"));
}

TEST_CASE("OLMoE arxiv profile matches the data set's README and expert_counts.tsv", "[speculative][profile][olmoe]") {
  // README: 208,896 tokens per layer and domain, top-8 -> 1,671,168 assignments per layer.
  auto p = moe::profile::olmoe::load(MOE_SHARED_DATA_DIR, {"arxiv"}, {.token_counts = true, .crosslayer = true});
  REQUIRE(p.layers() == std::vector<int>{0, 7, 15});
  for (int l : p.layers()) {
    auto const& lc = p.layer(l);
    REQUIRE(lc.total() == 1671168);
    double occ = 0;
    for (std::size_t r = 0; r < lc.rows(); ++r) occ += p.occurrences(lc, r);
    REQUIRE(occ == Approx(208896.0));
    REQUIRE(lc.tokens.back() < moe::profile::olmoe::vocab);
  }
  // Expert loads agree with the data set's separate expert_counts.tsv. The two upstream files are
  // not exactly consistent (per-expert differences of up to ~100 activations, 0.07 % in all for
  // arxiv), so the check allows 0.2 % of the layer's activations in summed absolute difference.
  moe::core::TsvReader ec(moe::profile::olmoe::domain_dir(MOE_SHARED_DATA_DIR, "arxiv") + "/expert_counts.tsv");
  std::map<int, std::vector<std::int64_t>> loads;
  for (int l : p.layers()) loads[l] = p.layer(l).expert_load();
  std::map<int, double> diff;
  int lines = 0;
  while (ec.next()) {
    if (ec.is_header("layer")) continue;
    auto l = ec.get_int<int>(0, "layer");
    auto e = ec.get_int<int>(1, "expert");
    diff[l] += std::abs(static_cast<double>(loads.at(l)[static_cast<std::size_t>(e)] - ec.get_int<std::int64_t>(2, "count")));
    ++lines;
  }
  REQUIRE(lines == 3 * 64);
  for (auto [l, d] : diff) REQUIRE(d <= 0.002 * 1671168);
  auto const& x = p.crosslayer(0, 7);
  REQUIRE(std::accumulate(x.begin(), x.end(), std::int64_t{0}) == 1671168);
  REQUIRE_THROWS_AS(moe::profile::olmoe::load(MOE_SHARED_DATA_DIR, {"c4"}), moe::Error);  // no token file
  REQUIRE_THROWS_AS(moe::profile::olmoe::load(MOE_SHARED_DATA_DIR, {}), moe::Error);
}

TEST_CASE("seeded split of aggregated counts", "[speculative][profile]") {
  moe::profile::synthetic::Spec s{.vocab = 300, .experts = 8, .top_k = 2, .topics = 2, .occurrences = 20000, .seed = 3};
  auto p = moe::profile::synthetic::generate(s);
  auto [fit, held] = moe::profile::split_profile(p, 0.2, 7);
  auto const& all = p.layer(0);
  double fit_occ = 0;
  for (std::size_t r = 0; r < all.rows(); ++r) {
    auto t = all.tokens[r];
    auto fr = fit.layer(0).find(t), hr = held.layer(0).find(t);
    std::int64_t ft = fr >= 0 ? fit.layer(0).row_total(static_cast<std::size_t>(fr)) : 0;
    std::int64_t ht = hr >= 0 ? held.layer(0).row_total(static_cast<std::size_t>(hr)) : 0;
    REQUIRE(ft + ht == all.row_total(r));  // every activation lands in exactly one part
    REQUIRE(ft % 2 == 0);                  // whole occurrences
    fit_occ += static_cast<double>(ft) / 2;
    for (auto j = all.offsets[r]; j < all.offsets[r + 1]; ++j) {
      auto e = all.expert[static_cast<std::size_t>(j)];
      std::int64_t a = 0, b = 0;
      auto get = [&](moe::profile::LayerCounts const& lc, std::ptrdiff_t row) {
        if (row < 0) return std::int64_t{0};
        for (auto k = lc.offsets[static_cast<std::size_t>(row)]; k < lc.offsets[static_cast<std::size_t>(row) + 1]; ++k)
          if (lc.expert[static_cast<std::size_t>(k)] == e) return lc.count[static_cast<std::size_t>(k)];
        return std::int64_t{0};
      };
      a = get(fit.layer(0), fr);
      b = get(held.layer(0), hr);
      REQUIRE(a + b == all.count[static_cast<std::size_t>(j)]);
    }
  }
  // Binomial(20000, 0.2): mean 4000, sd 57.
  REQUIRE(fit_occ == Approx(4000).margin(300));
  auto again = moe::profile::split_profile(p, 0.2, 7);
  REQUIRE(again.first.layer(0).count == fit.layer(0).count);
  REQUIRE_THROWS_AS(moe::profile::split_profile(p, 1.0, 7), moe::Error);
  REQUIRE_THROWS_AS(moe::profile::split_profile(RouteProfile{}, 0.5, 7), moe::Error);
}
