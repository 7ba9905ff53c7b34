// Predictor table files: round trips and bad input.
#include <catch2/catch.hpp>

#include <sstream>
#include <vector>

#include "moe/speculative/cocluster.hpp"
#include "moe/speculative/table_io.hpp"

namespace sp = moe::speculative;

namespace {
sp::TokenDeviceTable read_tokens(std::string const& text) {
  std::istringstream is(text);
  moe::core::TsvReader in(is, "t.tsv");
  return sp::read_token_table(in);
}
sp::DeviceSequenceTable read_seq(std::string const& text) {
  std::istringstream is(text);
  moe::core::TsvReader in(is, "s.tsv");
  return sp::read_sequence_table(in);
}
}  // namespace

TEST_CASE("token table file round trip", "[speculative][io]") {
  moe::core::Rng rng(6);
  sp::TokenDeviceTable t(1000, 8);
  for (int i = 0; i < 300; ++i)
    t.set(static_cast<int>(rng.below(1000)), static_cast<int>(rng.below(8)), rng.uniform());
  std::ostringstream os;
  sp::write_token_table(os, t);
  auto back = read_tokens(os.str());
  REQUIRE(back.vocab() == 1000);
  REQUIRE(back.devices() == 8);
  REQUIRE(back.devices_array() == t.devices_array());
  REQUIRE(back.confidence_array() == t.confidence_array());
}

TEST_CASE("sequence table file round trip", "[speculative][io]") {
  moe::core::Rng rng(8);
  sp::DeviceSequenceTable t(3, 2);
  for (int i = 0; i < 12; ++i) {
    std::vector<int> prev{static_cast<int>(rng.below(3)), static_cast<int>(rng.below(3))};
    t.add(prev, static_cast<int>(rng.below(3)), 1 + rng.uniform());
  }
  t.finalize();
  std::ostringstream os;
  sp::write_sequence_table(os, t);
  auto back = read_seq(os.str());
  REQUIRE(back.lookback() == 2);
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) {
      std::vector<int> prev{a, b};
      REQUIRE(back.lookup(prev).device == t.lookup(prev).device);
      REQUIRE(back.lookup(prev).confidence == t.lookup(prev).confidence);
    }
}

TEST_CASE("malformed table files give file:line errors", "[speculative][io][errors]") {
  REQUIRE_THROWS_WITH(read_tokens(""), Catch::Contains("empty file"));
  REQUIRE_THROWS_WITH(read_tokens("moe-plan\t1\t10\t2\n"), Catch::Contains("t.tsv:1") && Catch::Contains("moe-token-table"));
  REQUIRE_THROWS_WITH(read_tokens("moe-token-table\t2\t10\t2\n"), Catch::Contains("unsupported version 2"));
  REQUIRE_THROWS_WITH(read_tokens("moe-token-table\t1\t0\t2\n"), Catch::Contains("must be positive"));
  REQUIRE_THROWS_WITH(read_tokens("moe-token-table\t1\t10\t2\n3\t1\n"), Catch::Contains("t.tsv:2") && Catch::Contains("expected 3 fields"));
  REQUIRE_THROWS_WITH(read_tokens("moe-token-table\t1\t10\t2\n10\t1\t5\n"), Catch::Contains("token id 10 outside [0, 10)"));
  REQUIRE_THROWS_WITH(read_tokens("moe-token-table\t1\t10\t2\n3\t2\t5\n"), Catch::Contains("device 2 outside [0, 2)"));
  REQUIRE_THROWS_WITH(read_tokens("moe-token-table\t1\t10\t2\n3\t1\t40000\n"), Catch::Contains("confidence 40000"));
  REQUIRE_THROWS_WITH(read_tokens("moe-token-table\t1\t10\t2\n3\t1\t5\n3\t0\t5\n"), Catch::Contains("t.tsv:3") && Catch::Contains("twice"));
  REQUIRE_THROWS_WITH(read_seq("moe-sequence-table\t1\t2\t5\n"), Catch::Contains("lookback"));
  REQUIRE_THROWS_WITH(read_seq("moe-sequence-table\t1\t2\t2\n0\t2\t1\t5\n"), Catch::Contains("s.tsv:2") && Catch::Contains("previous device 2"));
  REQUIRE_THROWS_WITH(read_seq("moe-sequence-table\t1\t2\t2\n0\t1\t1\n"), Catch::Contains("expected 4 fields"));
  REQUIRE_THROWS_WITH(read_seq("moe-sequence-table\t1\t2\t2\n0\t1\t1\t5\n0\t1\t0\t5\n"), Catch::Contains("twice"));
  REQUIRE_THROWS_AS(sp::read_token_table("/nonexistent/table.tsv"), moe::Error);
  // Sizes in the header that would allocate gigabytes (a corrupt file) are errors with file:line.
  REQUIRE_THROWS_WITH(read_tokens("moe-token-table\t1\t2000000000\t2\n"),
                      Catch::Contains("t.tsv:1") && Catch::Contains("vocabulary size 2000000000 is above the limit"));
  REQUIRE_THROWS_WITH(read_seq("moe-sequence-table\t1\t64\t4\n"),
                      Catch::Contains("s.tsv:1") && Catch::Contains("need 1073741824 cells"));
}
