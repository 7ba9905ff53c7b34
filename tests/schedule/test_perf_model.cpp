// Performance models: least-squares fit against hand-computed values, model file round trip and
// every bad-input path of the file reader and the fit.
#include <catch2/catch.hpp>

#include <random>
#include <sstream>

#include "moe/schedule/perf_model.hpp"

using namespace moe::schedule;

TEST_CASE("fit_linear matches the hand-computed least-squares line and R^2", "[schedule][perf]") {
  // (0,1) (1,3) (2,4): mean x 1, mean y 8/3, Sxy 3, Sxx 2 -> beta 3/2, alpha 7/6;
  // SS_res = 1/6, SS_tot = 42/9 -> R^2 = 1 - 9/252 = 27/28.
  Fit f = fit_linear({{0, 1}, {1, 3}, {2, 4}});
  CHECK(f.model.beta == Approx(1.5));
  CHECK(f.model.alpha == Approx(7.0 / 6.0));
  CHECK(f.r2 == Approx(27.0 / 28.0));
  CHECK(f.samples == 3);
  CHECK_FALSE(f.alpha_clamped);
}

TEST_CASE("fit_linear recovers an exact alpha-beta line from noiseless samples", "[schedule][perf]") {
  std::vector<Sample> s;
  for (int i = 1; i <= 20; ++i) s.push_back({1e6 * i, 7.5 + 2e-6 * 1e6 * i});
  Fit f = fit_linear(s);
  CHECK(f.model.alpha == Approx(7.5));
  CHECK(f.model.beta == Approx(2e-6));
  CHECK(f.r2 == Approx(1.0));
}

TEST_CASE("fit_linear refits through the origin when the free intercept is negative", "[schedule][perf]") {
  // Free fit: beta 1.5, alpha -1. Through the origin: beta = sum(xy) / sum(x^2) = 15 / 14.
  Fit f = fit_linear({{1, 0.5}, {2, 2}, {3, 3.5}});
  CHECK(f.alpha_clamped);
  CHECK(f.model.alpha == 0.0);
  CHECK(f.model.beta == Approx(15.0 / 14.0));
}

TEST_CASE("fit_linear rejects unusable samples", "[schedule][perf][bad-input]") {
  CHECK_THROWS_WITH(fit_linear({{1, 2}}), Catch::Contains("at least 2 samples"));
  CHECK_THROWS_WITH(fit_linear({{3, 2}, {3, 4}}), Catch::Contains("same work"));
  CHECK_THROWS_WITH(fit_linear({{1, 5}, {2, 3}, {3, 1}}), Catch::Contains("not positive"));
  CHECK_THROWS_WITH(fit_linear({{1, -5}, {2, 3}}), Catch::Contains("non-negative"));
}

TEST_CASE("model files round-trip", "[schedule][perf]") {
  PerfModels m = h100_cluster_reference();
  m.r2[0] = 0.9987;
  m.samples[0] = 12;
  std::stringstream ss;
  write_models(ss, m);
  PerfModels back = read_models(ss, "mem");
  for (Op op : all_ops) {
    CHECK(back[op] == m[op]);
    auto i = static_cast<std::size_t>(op);
    CHECK(back.samples[i] == m.samples[i]);
  }
  CHECK(back.r2[0] == Approx(0.9987));
  CHECK(std::isnan(back.r2[1]));
  CHECK(back.time(Op::gemm, 650e6) == Approx(8.0 + 1.0));
}

namespace {
std::string good_file() {
  std::stringstream ss;
  write_models(ss, h100_cluster_reference());
  return ss.str();
}
PerfModels parse(std::string const& text) {
  std::istringstream in(text);
  return read_models(in, "models.tsv");
}
std::string replace_line(std::string text, std::string const& op, std::string const& line) {
  auto pos = text.find("\n" + op + "\t");
  REQUIRE(pos != std::string::npos);
  auto end = text.find('\n', pos + 1);
  return text.substr(0, pos + 1) + line + text.substr(end);
}
}  // namespace

TEST_CASE("model file reader rejects bad input with file and line", "[schedule][perf][bad-input]") {
  std::string g = good_file();
  REQUIRE_NOTHROW(parse(g));
  CHECK_THROWS_WITH(parse(""), Catch::Contains("empty model file"));
  CHECK_THROWS_WITH(parse("gemm\t1\t1\tflop\tnan\t0\n"), Catch::Contains("expected the header"));
  CHECK_THROWS_WITH(parse(replace_line(g, "gemm", "matmul\t1\t1\tflop\tnan\t0")),
                    Catch::Contains("unknown operation 'matmul'"));
  CHECK_THROWS_WITH(parse(replace_line(g, "e2a", "a2e\t1\t1\tbyte\tnan\t0")), Catch::Contains("appears twice"));
  CHECK_THROWS_WITH(parse(replace_line(g, "e2a", "# e2a removed")), Catch::Contains("'e2a' is missing"));
  CHECK_THROWS_WITH(parse(replace_line(g, "shared", "shared\t-1\t1e-9\tflop\tnan\t0")),
                    Catch::Contains("alpha_us of 'shared' is negative"));
  CHECK_THROWS_WITH(parse(replace_line(g, "shared", "shared\t1\t0\tflop\tnan\t0")),
                    Catch::Contains("must be positive"));
  CHECK_THROWS_WITH(parse(replace_line(g, "a2e", "a2e\t1\t1\tflop\tnan\t0")), Catch::Contains("unit of 'a2e'"));
  CHECK_THROWS_WITH(parse(replace_line(g, "gemm", "gemm\tfast\t1\tflop\tnan\t0")), Catch::Contains("not a number"));
  CHECK_THROWS_WITH(parse(replace_line(g, "gemm", "gemm\t1\t1\tflop\tnan")), Catch::Contains("expected 6 fields"));
  CHECK_THROWS_WITH(parse(replace_line(g, "gemm", "gemm\t1\t1\tflop\t1.5\t3")), Catch::Contains("above 1"));
  CHECK_THROWS_WITH(parse(replace_line(g, "gemm", "gemm\t1\t1\tflop\t0.9\t-3")), Catch::Contains("not an integer"));
  CHECK_THROWS_WITH(parse(replace_line(g, "gemm", "gemm\t1\tinf\tflop\t0.9\t3")), Catch::Contains("models.tsv:"));
  CHECK_THROWS_WITH(read_models(std::string("/nonexistent/models.tsv")), Catch::Contains("cannot open"));
}

TEST_CASE("PerfModels::validate rejects negative or zero coefficients", "[schedule][perf][bad-input]") {
  PerfModels m = h100_cluster_reference();
  REQUIRE_NOTHROW(m.validate());
  m[Op::experts].beta = 0;
  CHECK_THROWS_WITH(m.validate(), Catch::Contains("'experts'"));
}
