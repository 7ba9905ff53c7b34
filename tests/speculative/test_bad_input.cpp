// Bad-input paths of the s-MoE headers (predictors, co-clustering, shuffle plan, volume model) that
// had no message-asserting test: each checks a moe::Error whose message names the problem.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <vector>

#include "moe/placement/cocluster.hpp"
#include "moe/speculative/comm_volume.hpp"
#include "moe/speculative/predictor.hpp"
#include "moe/speculative/shuffle_plan.hpp"

namespace sp = moe::speculative;
namespace pl = moe::placement;
using Catch::Contains;

namespace {
/// Two tokens over four experts on two devices (a valid problem to break one field at a time).
pl::CoclusterProblem tiny_problem() {
  pl::CoclusterProblem p;
  p.experts = 4;
  p.devices = 2;
  p.tokens = {0, 1};
  p.frequency = {1, 2};
  p.offsets = {0, 2, 4};
  p.expert = {0, 1, 2, 3};
  p.weight = {1, 1, 2, 2};
  return p;
}
}  // namespace

TEST_CASE("predictor tables check sizes before allocating and reject NaN confidences",
          "[speculative][bad-input]") {
  // A negative vocabulary threw std::length_error from the vector constructor before the check.
  CHECK_THROWS_WITH(sp::TokenDeviceTable(-1, 2), Contains("vocabulary size must be positive, got -1"));
  CHECK_THROWS_WITH(sp::TokenDeviceTable(4, 0), Contains("devices must be in [1, 32767], got 0"));
  sp::TokenDeviceTable t(4, 2);
  // NaN went through std::clamp and lround and was stored as confidence 0.
  CHECK_THROWS_WITH(t.set(1, 1, std::numeric_limits<double>::quiet_NaN()), Contains("confidence is NaN"));
  CHECK_THROWS_WITH(t.set(1, 2, 0.5), Contains("device 2 outside [0, 2)"));
  // 64 devices with lookback 4: 64^5 doubles (8.6 GB) were allocated.
  CHECK_THROWS_WITH(sp::DeviceSequenceTable(64, 4), Contains("64 devices with lookback 4 need 1073741824 cells"));
  CHECK_THROWS_WITH(sp::DeviceSequenceTable(300, 1), Contains("devices must be in [1, 256], got 300"));
  CHECK_THROWS_WITH(sp::DeviceSequenceTable(2, 5), Contains("lookback must be in [1, 4], got 5"));
  sp::DeviceSequenceTable seq(2, 2);
  std::vector<int> one{0};
  CHECK_THROWS_WITH(seq.lookup(one), Contains("expected 2 previous devices, got 1"));
  CHECK_THROWS_WITH(sp::Predictor(t, sp::DeviceSequenceTable(3, 2)), Contains("token table has 2 devices, sequence table 3"));
  sp::Predictor no_history(t);
  std::vector<int> toks{0, 1}, out(1), hist{0, 0, 0, 0};
  CHECK_THROWS_WITH(no_history.predict_devices(toks, out), Contains("output has 1 slots for 2 tokens"));
  std::vector<int> out2(2);
  CHECK_THROWS_WITH(no_history.predict_devices(toks, hist, out2), Contains("history given but no device-sequence table"));
  sp::Predictor with_history(t, sp::DeviceSequenceTable(2, 2));
  CHECK_THROWS_WITH(with_history.predict_devices(toks, one, out2), Contains("batch of 2 tokens needs 4 history entries"));
  CHECK_THROWS_WITH(sp::cosine_nearest(std::vector<float>(7), 2, t), Contains("embeddings hold 7 values, expected vocab x hidden = 8"));
  CHECK_THROWS_WITH(sp::cosine_nearest(std::vector<float>(8), 0, t), Contains("hidden must be positive"));
  moe::placement::Table rr = moe::placement::Table::round_robin(4, 2);
  std::vector<std::int16_t> experts{0, 5};
  CHECK_THROWS_WITH(sp::main_device(experts, rr, 2), Contains("expert 5 outside the placement [0, 4)"));
  CHECK_THROWS_WITH(sp::main_device(std::vector<std::int16_t>{0}, rr, 0), Contains("devices must be in [1, 256], got 0"));
}

TEST_CASE("co-clustering problems with malformed arrays are rejected", "[speculative][bad-input]") {
  REQUIRE_NOTHROW(tiny_problem().validate());
  auto p = tiny_problem();
  p.offsets = {0, 5, 4};  // decreasing: rows were read past the expert array before the check
  CHECK_THROWS_WITH(p.validate(), Contains("offsets decrease at row 1 (5 > 4)"));
  CHECK_THROWS_WITH(pl::solve_cross_entropy(p), Contains("offsets decrease"));
  p = tiny_problem();
  p.offsets = {1, 2, 4};
  CHECK_THROWS_WITH(p.validate(), Contains("offsets must start at 0, got 1"));
  p = tiny_problem();
  p.weight[1] = -1;  // a negative count with a positive total was silently used
  CHECK_THROWS_WITH(p.validate(), Contains("activation count -1 is negative or not finite"));
  p.weight[1] = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(pl::balanced_kmeans(p), Contains("is negative or not finite"));
  p = tiny_problem();
  p.frequency[0] = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH(p.validate(), Contains("has frequency inf (must be positive and finite)"));
  p = tiny_problem();
  p.weight.pop_back();
  CHECK_THROWS_WITH(p.validate(), Contains("inconsistent problem arrays"));
  p = tiny_problem();
  p.expert[3] = 4;
  CHECK_THROWS_WITH(p.validate(), Contains("expert 4 outside [0, 4)"));
}
