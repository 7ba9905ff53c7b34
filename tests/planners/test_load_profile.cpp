// Load profiles: TSV round trip, the real OLMoE marginals, the seeded sampler, and bad input.
#include <catch2/catch.hpp>

#include <sstream>

#include "moe/profile/load_profile.hpp"

using namespace moe::profile;

static LoadProfile read_string(std::string const& s) {
  std::istringstream in(s);
  moe::core::TsvReader r(in, "test.tsv");
  return read_profile(r);
}

TEST_CASE("load profile round-trips through its TSV format") {
  LoadProfile p(3, 2, 5);
  for (int b = 0; b < 3; ++b)
    for (int l = 0; l < 2; ++l)
      for (int e = 0; e < 5; ++e) p.at(b, l, e) = b * 100 + l * 10 + e + 0.25 * e;
  std::ostringstream os;
  write_profile(os, p);
  LoadProfile q = read_string(os.str());
  CHECK(q == p);
  auto t = p.totals();
  CHECK(t[0 * 5 + 3] == Approx(0 + 100 + 200 + 3 * 3 + 3 * 0.75));
  auto s = p.slice(1, 3);
  CHECK(s.batches() == 2);
  CHECK(s.at(0, 1, 4) == p.at(1, 1, 4));
}

TEST_CASE("load profile rejects malformed, truncated and invalid files") {
  std::string head = "moe-load-profile\t1\t2\t1\t3\n";
  CHECK_THROWS_WITH(read_string(""), Catch::Contains("empty"));
  CHECK_THROWS_WITH(read_string("profile\t1\t2\t1\t3\n"), Catch::Contains("header"));
  CHECK_THROWS_WITH(read_string("moe-load-profile\t2\t2\t1\t3\n"), Catch::Contains("version"));
  CHECK_THROWS_WITH(read_string(head + "0\t0\t1\t2\t3\n"), Catch::Contains("truncated"));
  CHECK_THROWS_WITH(read_string(head + "0\t0\t1\t2\n1\t0\t1\t2\t3\n"), Catch::Contains("expected 5 fields"));
  CHECK_THROWS_WITH(read_string(head + "0\t0\t1\t-2\t3\n1\t0\t1\t2\t3\n"), Catch::Contains("negative"));
  CHECK_THROWS_WITH(read_string(head + "0\t0\t1\tnan\t3\n1\t0\t1\t2\t3\n"), Catch::Contains("not"));
  CHECK_THROWS_WITH(read_string(head + "0\t0\t1\tinf\t3\n1\t0\t1\t2\t3\n"), Catch::Contains("not"));
  CHECK_THROWS_WITH(read_string(head + "0\t0\t1\tx\t3\n1\t0\t1\t2\t3\n"), Catch::Contains("not a number"));
  CHECK_THROWS_WITH(read_string(head + "1\t0\t1\t2\t3\n0\t0\t1\t2\t3\n"), Catch::Contains("expected batch 0"));
  CHECK_THROWS_WITH(read_string(head + "0\t0\t1\t2\t3\n1\t0\t1\t2\t3\n1\t1\t1\t2\t3\n"), Catch::Contains("extra"));
  CHECK_NOTHROW(read_string(head + "0\t0\t1\t2\t3\n1\t0\t1\t2\t3\n"));
  // A header with huge counts is rejected field by field against core::limits (not a 10^27-double
  // allocation, nor a B * L int overflow); one within the limits but without data is truncated.
  CHECK_THROWS_WITH(read_string("moe-load-profile\t1\t2000000000\t2000000000\t2000000000\n"),
                    Catch::Contains("test.tsv:1: column 3 (batches): 2000000000 outside [1, 1048576]"));
  CHECK_THROWS_WITH(read_string("moe-load-profile\t1\t1048576\t4096\t65536\n"),
                    Catch::Contains("truncated") && Catch::Contains("4294967296 data lines"));
  LoadProfile p(1, 1, 2);
  p.at(0, 0, 1) = -1;
  CHECK_THROWS_AS(p.validate(), moe::Error);
}

TEST_CASE("real OLMoE marginals load and keep their totals") {
  auto m = marginals_from_olmoe(std::string(MOE_SHARED_DATA_DIR) + "/olmoe-routing/olmoe-1b-7b/arxiv/expert_counts.tsv");
  CHECK(m.layers == 3);
  CHECK(m.experts == 64);
  for (int l = 0; l < 3; ++l) {
    double s = 0;
    for (int e = 0; e < 64; ++e) s += m.at(l, e);
    CHECK(s == 1671168.0);  // 208,896 tokens x top-8 (data README)
  }
}

TEST_CASE("seeded sampler follows its marginals and is deterministic") {
  Marginals m = zipf_marginals(2, 16, 1.0, 1.0, 7);
  SampleOptions o;
  o.batches = 400;
  o.tokens_per_batch = 1000;
  o.top_k = 2;
  o.seed = 3;
  auto p = sample_profile(m, o);
  auto q = sample_profile(m, o);
  CHECK(p == q);
  p.validate();
  auto t = p.totals();
  for (int l = 0; l < 2; ++l) {
    double ms = 0;
    for (int e = 0; e < 16; ++e) ms += m.at(l, e);
    for (int e = 0; e < 16; ++e) {
      double expect = m.at(l, e) / ms;
      double got = t[l * 16 + e] / (400.0 * 2000.0);
      CHECK(got == Approx(expect).margin(0.005));
    }
  }
  o.seed = 4;
  CHECK_FALSE(sample_profile(m, o) == p);
  CHECK_THROWS_AS(zipf_marginals(2, 4, 1.0, 0.5, 1), moe::Error);
}

TEST_CASE("a profile from the real routing data: one batch per OLMoE / Mixtral domain") {
  for (std::string model : {"olmoe-1b-7b", "mixtral-8x7b"}) {
    std::vector<Marginals> domains;
    for (std::string d : {"arxiv", "book", "c4", "github"})
      domains.push_back(marginals_from_olmoe(std::string(MOE_SHARED_DATA_DIR) + "/olmoe-routing/" + model + "/" + d +
                                             "/expert_counts.tsv"));
    auto p = profile_from_marginals(domains);
    CHECK(p.batches() == 4);
    CHECK(p.layers() == 3);
    int k = model == "olmoe-1b-7b" ? 8 : 2;
    CHECK(p.experts() == (k == 8 ? 64 : 8));
    for (int b = 0; b < 4; ++b)
      for (int l = 0; l < 3; ++l) {
        double s = 0;
        for (int e = 0; e < p.experts(); ++e) s += p.at(b, l, e);
        CHECK(s == 208896.0 * k);  // tokens per layer and domain x top-k (data README)
      }
    // Skew as the README reports: OLMoE max/mean between 2.5x and 7.8x, Mixtral 1.1x to 1.3x.
    for (int b = 0; b < 4; ++b)
      for (int l = 0; l < 3; ++l) {
        double mx = 0, s = 0;
        for (int e = 0; e < p.experts(); ++e) mx = std::max(mx, p.at(b, l, e)), s += p.at(b, l, e);
        double skew = mx / (s / p.experts());
        if (k == 8) CHECK((skew > 2.4 && skew < 7.9));
        else CHECK((skew > 1.0 && skew < 1.35));
      }
  }
  Marginals a = zipf_marginals(2, 4, 1, 1, 1), b = zipf_marginals(3, 4, 1, 1, 1);
  CHECK_THROWS_AS(profile_from_marginals({a, b}), moe::Error);
}
