// Bad-input paths of the s-MoE headers (predictors, co-clustering, shuffle plan, volume model) that
// had no message-asserting test: each checks a moe::Error whose message names the problem.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <sstream>
#include <vector>

#include "moe/speculative/cocluster.hpp"
#include "moe/profile/route_profile.hpp"
#include "moe/profile/route_split.hpp"
#include "moe/profile/route_synthetic.hpp"
#include "moe/speculative/comm_volume.hpp"
#include "moe/speculative/predictor.hpp"
#include "moe/speculative/shuffle_plan.hpp"

namespace sp = moe::speculative;
namespace pl = moe::placement;
using Catch::Contains;

namespace {
/// Two tokens over four experts on two devices (a valid problem to break one field at a time).
moe::speculative::CoclusterProblem tiny_problem() {
  moe::speculative::CoclusterProblem p;
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
  CHECK_THROWS_WITH(sp::TokenDeviceTable(sp::TokenDeviceTable::max_vocab + 1, 2), Contains("is above the limit of"));
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
  CHECK_THROWS_WITH(moe::speculative::solve_cross_entropy(p), Contains("offsets decrease"));
  p = tiny_problem();
  p.offsets = {1, 2, 4};
  CHECK_THROWS_WITH(p.validate(), Contains("offsets must start at 0, got 1"));
  p = tiny_problem();
  p.weight[1] = -1;  // a negative count with a positive total was silently used
  CHECK_THROWS_WITH(p.validate(), Contains("activation count -1 is negative or not finite"));
  p.weight[1] = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(moe::speculative::balanced_kmeans(p), Contains("is negative or not finite"));
  p = tiny_problem();
  p.frequency[0] = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH(p.validate(), Contains("has frequency inf (must be positive and finite)"));
  p = tiny_problem();
  p.weight.pop_back();
  CHECK_THROWS_WITH(p.validate(), Contains("inconsistent problem arrays"));
  p = tiny_problem();
  p.expert[3] = 4;
  CHECK_THROWS_WITH(p.validate(), Contains("expert 4 outside [0, 4)"));
  // Evaluation helpers index by the given devices: wrong sizes or devices were read/written out of
  // bounds before they were checked.
  p = tiny_problem();
  std::vector<int> experts{0, 0, 1, 1}, tokens{0, 1};
  // By hand: token 0 (weights 1, 1 on experts 0, 1) local on device 0; token 1 (2, 2 on experts 2, 3)
  // on device 0 too, remote: 2 of 6.
  CHECK(moe::speculative::local_rate(p, experts, std::vector<int>{0, 0}) == Approx(2.0 / 6.0));
  CHECK_THROWS_WITH(moe::speculative::local_rate(p, std::vector<int>{0, 1}, tokens), Contains("needs 4 expert devices and 2 token devices, got 2 and 2"));
  CHECK_THROWS_WITH(moe::speculative::device_token_load(p, std::vector<int>{0, 2}), Contains("token 1 on device 2, outside [0, 2)"));
  CHECK_THROWS_WITH(moe::speculative::objective(p, experts, std::vector<int>{0}, 1.0), Contains("1 token devices for 2 tokens"));
}

TEST_CASE("co-clustering options out of range are named", "[speculative][bad-input]") {
  auto p = tiny_problem();
  moe::speculative::CrossEntropyOptions ce;
  ce.iterations = 0;
  CHECK_THROWS_WITH(moe::speculative::solve_cross_entropy(p, ce), Contains("iterations and samples must be positive"));
  ce = {};
  ce.elite_fraction = 1.5;
  CHECK_THROWS_WITH(moe::speculative::solve_cross_entropy(p, ce), Contains("elite_fraction must be in (0, 1]"));
  ce = {};
  ce.smoothing = 0;
  CHECK_THROWS_WITH(moe::speculative::solve_cross_entropy(p, ce), Contains("smoothing must be in (0, 1]"));
  ce = {};
  ce.balance_factor = 0.5;
  CHECK_THROWS_WITH(moe::speculative::solve_cross_entropy(p, ce), Contains("balance_factor must be >= 1"));
  ce = {};
  ce.balance_factor = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(moe::speculative::solve_cross_entropy(p, ce), Contains("balance_factor must be >= 1"));
  moe::speculative::KMeansOptions km;
  km.balance_factor = 0.9;
  CHECK_THROWS_WITH(moe::speculative::balanced_kmeans(p, km), Contains("balanced k-means: balance_factor must be >= 1"));
  km = {};
  km.iterations = 0;
  CHECK_THROWS_WITH(moe::speculative::balanced_kmeans(p, km), Contains("balanced k-means: iterations must be positive"));
}

TEST_CASE("shuffle plan and volume model name their bad input", "[speculative][bad-input]") {
  std::vector<int> pred{0, 1, 1};
  CHECK_THROWS_WITH(sp::make_shuffle_plan(pred, 0), Contains("devices must be positive, got 0"));
  CHECK_THROWS_WITH(sp::make_shuffle_plan(pred, 2, 0), Contains("alignment must be positive, got 0"));
  CHECK_THROWS_WITH(sp::make_shuffle_plan(std::vector<int>{0, -1}, 2), Contains("token 1 is predicted for device -1"));
  CHECK_THROWS_WITH(sp::cap_predictions(pred, {}, 2, -1), Contains("capacity must be >= 0, got -1"));
  CHECK_THROWS_WITH(sp::cap_predictions(pred, std::vector<std::int16_t>(2), 2, 2), Contains("2 confidences for 3 tokens"));
  CHECK_THROWS_WITH(sp::cap_predictions(pred, {}, 2, 1), Contains("3 tokens do not fit in 2 devices x 1"));
  CHECK_THROWS_WITH(sp::cap_predictions(pred, {}, 0, 1), Contains("devices must be positive"));
  auto plan = sp::make_shuffle_plan(pred, 2);
  std::vector<float> rows(6), packed(4);
  CHECK_THROWS_WITH(sp::pack_rows<float>(plan, rows, packed, 2), Contains("pack_rows needs 3 rows of 2 elements"));
  CHECK_THROWS_WITH(sp::unpack_rows<float>(plan, packed, rows, 2), Contains("unpack_rows needs 3 rows of 2 elements"));
  sp::VolumeModel m;
  m.devices = 4;
  m.tokens = 16;
  m.hidden = 8;
  m.all_to_all_passes = -1;
  CHECK_THROWS_WITH(m.validate(), Contains("all_to_all_passes must be >= 0"));
  m.all_to_all_passes = 2;
  m.hidden = 0;
  CHECK_THROWS_WITH(m.validate(), Contains("must be positive"));
  m.hidden = 8;
  CHECK_THROWS_WITH(m.all_to_all(-0.1), Contains("local activation rate -0.1 outside [0, 1]"));
}

TEST_CASE("route recording, splitting and table building name their bad input", "[speculative][bad-input]") {
  moe::profile::RouteRecorder unknown_k(4, 0);
  std::vector<int> two{0, 1};
  CHECK_THROWS_WITH(unknown_k.record(0, 0, two), Contains("record() needs top_k > 0"));
  CHECK_THROWS_WITH(unknown_k.record_batch(0, two, two), Contains("record_batch() needs top_k > 0"));
  unknown_k.add(0, 1, 2, 3);
  auto prof = unknown_k.profile();
  CHECK_THROWS_WITH(moe::profile::split_profile(prof, 0.5, 1), Contains("split: the profile's top_k is unknown"));
  moe::profile::RouteRecorder rec(4, 2);
  rec.record(0, 0, two);
  CHECK_THROWS_WITH(moe::profile::split_profile(rec.profile(), 1.0, 1), Contains("fraction must be in (0, 1), got 1"));
  CHECK_THROWS_WITH(moe::profile::split_profile(moe::profile::RouteProfile{}, 0.5, 1), Contains("the route profile is empty"));
  moe::profile::synthetic::Spec spec;
  spec.top_k = 0;
  CHECK_THROWS_WITH(moe::profile::synthetic::generate(spec), Contains("synthetic profile: invalid spec"));
  spec = {};
  spec.affinity = 1;
  spec.topics = 16;  // one expert per topic, top_k 2
  CHECK_THROWS_WITH(moe::profile::synthetic::generate(spec), Contains("every topic needs at least top_k experts"));
  // A co-clustering result whose arrays do not match the problem (confidences were read past the end).
  auto p = tiny_problem();
  auto r = moe::speculative::assign_tokens_to(p, moe::placement::Table::contiguous(4, 2));
  REQUIRE_NOTHROW(sp::TokenDeviceTable::from_cocluster(p, r, 4));
  r.token_confidence.pop_back();
  CHECK_THROWS_WITH(sp::TokenDeviceTable::from_cocluster(p, r, 4), Contains("2 token devices and 1 confidences, the problem 2 tokens"));
  // Device-sequence paths of different lengths.
  moe::profile::LayerPaths a, b;
  a.layer = 0;
  a.tokens = {0, 1};
  a.experts = {0, 1, 2, 3};
  b.layer = 1;
  b.tokens = {0};
  b.experts = {0, 1};
  auto rr = moe::placement::Table::round_robin(4, 2);
  std::vector<moe::profile::LayerPaths const*> paths{&a, &b};
  std::vector<moe::placement::Table const*> placements{&rr, &rr};
  CHECK_THROWS_WITH(sp::DeviceSequenceTable::from_paths(paths, placements, 2, 2), Contains("layer 1 has a different number of occurrences"));
  std::vector<moe::placement::Table const*> one_placement{&rr};
  CHECK_THROWS_WITH(sp::DeviceSequenceTable::from_paths(paths, one_placement, 2, 2), Contains("one placement per layer"));
}

TEST_CASE("route profile files: counts whose sums leave int64 are errors with file:line:column",
          "[speculative][bad-input]") {
  // Two lines of INT64_MAX for one (layer, token, expert) were merged into -2 (signed overflow).
  std::istringstream same("0\t1\t2\t9223372036854775807\n0\t1\t2\t9223372036854775807\n");
  moe::core::TsvReader r1(same, "routes.tsv");
  moe::profile::RouteRecorder rec1(4, 0);
  CHECK_THROWS_WITH(moe::profile::load_token_expert_counts(r1, rec1),
                    Contains("routes.tsv:2: column 4 (count)") && Contains("overflows int64"));
  // Different entries that only overflow in a row total or an expert load are caught the same way.
  std::istringstream spread("0\t1\t2\t9223372036854775000\n0\t7\t2\t9223372036854775000\n");
  moe::core::TsvReader r2(spread, "routes.tsv");
  moe::profile::RouteRecorder rec2(4, 0);
  CHECK_THROWS_WITH(moe::profile::load_token_expert_counts(r2, rec2), Contains("routes.tsv:2: column 4 (count)"));
  std::istringstream cross("0\t1\t0\t0\t9223372036854775807\n0\t1\t1\t1\t1\n");
  moe::core::TsvReader r3(cross, "cross.tsv");
  moe::profile::RouteRecorder rec3(4, 0);
  CHECK_THROWS_WITH(moe::profile::load_crosslayer_counts(r3, rec3),
                    Contains("cross.tsv:2: column 5 (count)") && Contains("overflows int64"));
  // Layer ids are bounded; distinct cross-layer pairs each hold an E x E matrix, so they are bounded too.
  std::istringstream far("70000\t1\t0\t0\t1\n");
  moe::core::TsvReader r4(far, "cross.tsv");
  CHECK_THROWS_WITH(moe::profile::load_crosslayer_counts(r4, rec3), Contains("cross.tsv:1: column 1 (layer_a): 70000 outside"));
  std::string many;
  for (int a = 0; a < 40; ++a)
    for (int b = 0; b < 40; ++b) many += std::to_string(a) + "\t" + std::to_string(b) + "\t0\t0\t1\n";
  std::istringstream pairs(many);
  moe::core::TsvReader r5(pairs, "cross.tsv");
  moe::profile::RouteRecorder wide(128, 0);  // 128 x 128 counts per pair: 1024 pairs fit in 2^24
  CHECK_THROWS_WITH(moe::profile::load_crosslayer_counts(r5, wide),
                    Contains("cross.tsv:1025: column 5 (count)") && Contains("would exceed 16777216"));
}
