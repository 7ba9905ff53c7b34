// Core pieces: bf16 rounding, the TSV reader's errors, shapes and published model values, workspace.
#include <catch2/catch.hpp>
#include <bit>
#include <cmath>
#include <limits>
#include <sstream>

#include "moe/core/bf16.hpp"
#include "moe/core/tsv.hpp"
#include "moe/core/workspace.hpp"
#include "moe/models/models.hpp"

using namespace moe;

TEST_CASE("bf16 rounds to nearest even and keeps specials", "[core][bf16]") {
  CHECK(bf16(1.0f).bits == 0x3F80);
  CHECK(bf16(-2.0f).bits == 0xC000);
  CHECK(bf16(1.0f + 0x1p-8f).bits == 0x3F80);         // halfway, rounds down to even
  CHECK(bf16(1.0f + 3 * 0x1p-8f).bits == 0x3F82);     // halfway, rounds up to even
  CHECK(bf16(1.0f + 0x1p-8f + 0x1p-20f).bits == 0x3F81);  // above halfway
  CHECK(bf16(std::numeric_limits<float>::infinity()).bits == 0x7F80);
  CHECK(std::isnan(static_cast<float>(bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(static_cast<float>(bf16(3.140625f)) == 3.140625f);  // exactly representable
}

TEST_CASE("TSV reader parses and names bad lines", "[core][tsv]") {
  std::istringstream good("# comment\nlayer\texpert\tcount\n\n0\t1\t2.5\n 3  4 5\n");
  core::TsvReader r(good, "good.tsv");
  REQUIRE(r.next());
  CHECK(r.is_header("layer"));
  REQUIRE(r.next());
  CHECK(r.get_int<int>(0, "layer") == 0);
  CHECK(r.get_double(2, "count") == 2.5);
  REQUIRE(r.next());
  CHECK(r.get_int<int>(1, "expert") == 4);
  CHECK_FALSE(r.next());

  std::istringstream bad("1\tx\n");
  core::TsvReader b(bad, "bad.tsv");
  REQUIRE(b.next());
  CHECK_THROWS_WITH(b.get_int<int>(1, "expert"), Catch::Contains("bad.tsv:1") && Catch::Contains("expert"));
  CHECK_THROWS_WITH(b.expect_fields(3), Catch::Contains("expected 3 fields"));
  CHECK_THROWS_WITH(b.field(5), Catch::Contains("at least 6 fields"));

  std::istringstream inf("nan\t1e999\n");
  core::TsvReader c(inf, "inf.tsv");
  REQUIRE(c.next());
  CHECK_THROWS_WITH(c.get_double(0, "load"), Catch::Contains("not"));
  CHECK_THROWS_WITH(c.get_double(1, "load"), Catch::Contains("inf.tsv:1"));
  CHECK_THROWS_WITH(core::TsvReader("/nonexistent/file.tsv"), Catch::Contains("cannot open"));
}

TEST_CASE("published model shapes", "[core][models]") {
  // Values from each model's released config.json.
  constexpr auto v3 = models::DeepSeekV3::spec;
  STATIC_REQUIRE(v3.hidden == 7168);
  STATIC_REQUIRE(v3.expert_ffn == 2048);
  STATIC_REQUIRE(v3.experts == 256);
  STATIC_REQUIRE(v3.top_k == 8);
  STATIC_REQUIRE(v3.moe_layers == 58);
  STATIC_REQUIRE(v3.layers() == 61);
  STATIC_REQUIRE(v3.groups == 8);
  STATIC_REQUIRE(v3.groups_per_token == 4);
  STATIC_REQUIRE(models::DeepSeekR1::spec == v3);
  STATIC_REQUIRE(models::Mixtral8x7B::spec.expert_ffn == 14336);
  STATIC_REQUIRE(models::DeepSeekV2::spec.experts == 160);
  STATIC_REQUIRE(models::DeepSeekV2::spec.top_k == 6);
  STATIC_REQUIRE(models::DeepSeekMoE16B::spec.shared_experts == 2);
  STATIC_REQUIRE(models::Qwen3_235B_A22B::spec.moe_layers == 94);
  STATIC_REQUIRE(models::Qwen3_30B_A3B::spec.expert_ffn == 768);
  STATIC_REQUIRE(models::OLMoE_1B_7B::spec.experts == 64);
  STATIC_REQUIRE(models::KimiK2::spec.experts == 384);
  // Full-size DeepSeek-V3 expert: 3 x 7168 x 2048 bf16 = 88 MB.
  STATIC_REQUIRE(v3.expert_bytes() == 3LL * 7168 * 2048 * 2);
  for (auto s : {models::Mixtral8x7B::spec, models::DeepSeekMoE16B::spec, models::DeepSeekV2::spec, v3,
                 models::Qwen3_30B_A3B::spec, models::Qwen3_235B_A22B::spec, models::OLMoE_1B_7B::spec,
                 models::KimiK2::spec})
    CHECK_NOTHROW(validate(s));
  using Small = models::Reduced<models::DeepSeekV3, 64, 32, DType::f32>;
  STATIC_REQUIRE(Small::spec.hidden == 64 && Small::spec.experts == 256 && Small::spec.dtype == DType::f32);
}

TEST_CASE("shape validation names the bad field", "[core][models][errors]") {
  ShapeSpec s{.hidden = 8, .expert_ffn = 8, .experts = 4, .top_k = 5};
  CHECK_THROWS_WITH(validate(s), Catch::Contains("top-k (5)"));
  s.top_k = 2;
  s.groups = 3;
  CHECK_THROWS_WITH(validate(s), Catch::Contains("3 equal groups"));
  s.groups = 2;
  s.groups_per_token = 1;
  s.top_k = 3;
  CHECK_THROWS_WITH(validate(s), Catch::Contains("exceeds the experts reachable"));
  s = {.hidden = 0, .expert_ffn = 8, .experts = 4, .top_k = 1};
  CHECK_THROWS_WITH(validate(s), Catch::Contains("hidden size"));
  s = {.hidden = 8, .expert_ffn = 8, .experts = 4, .top_k = 1, .shared_experts = 1};
  CHECK_THROWS_WITH(validate(s), Catch::Contains("shared FFN size"));
}

TEST_CASE("workspace carving is aligned and bounded", "[core][workspace]") {
  core::Carver measure;
  measure.take<float>(10);
  measure.take<int>(3);
  std::vector<std::byte> buf(measure.used() + 8);
  for (std::size_t skew : {0u, 1u, 7u}) {
    // The measured size includes slack for a buffer that does not start on the alignment.
    core::Carver c(std::span<std::byte>(buf.data() + skew, measure.used()));
    auto a = c.take<float>(10);
    auto b = c.take<int>(3);
    CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % core::Carver::alignment == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % core::Carver::alignment == 0);
    CHECK(a.size() == 10);
    CHECK(b.size() == 3);
  }
  std::vector<std::byte> tiny(64);
  core::Carver small(tiny);
  CHECK_THROWS_WITH(small.take<float>(1000), Catch::Contains("workspace too small"));
}
