// The s-TS kernels (moe/kernels/shuffle.cuh) against the host predictor and shuffle plan
// (moe/speculative/predictor.hpp, shuffle_plan.hpp): token-table lookup, the plan (counts, offsets,
// permutation, inverse, aligned offsets), and the row moves, on seeded random batches and on a
// token table built from the real OLMoE routing counts (tests/data). Every output buffer (the
// whole plan workspace included) is poisoned (all bits set) before the kernels run.
// Exits 77 (skipped) without a GPU.

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cuda_test_support.cuh"
#include "moe/kernels/shuffle.cuh"
#include "moe/moe.hpp"

namespace kc = moe::kernels::cuda;
namespace sp = moe::speculative;
using moe::test::Device;

namespace {

void sync() { kc::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

template <class T>
std::vector<T> download(T const* p, std::size_t n) {
  std::vector<T> out(n);
  sync();
  if (n) kc::check_cuda(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return out;
}

/// "" when the vectors are equal, else where they first differ (keeps Catch2's failure output short).
template <class A, class B>
std::string mismatch(std::vector<A> const& got, std::vector<B> const& want) {
  if (got.size() != want.size())
    return "sizes differ: got " + std::to_string(got.size()) + ", want " + std::to_string(want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      return "at " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " + std::to_string(want[i]);
  return "";
}

unsigned read_errors(Device<unsigned> const& e) { return e.download()[0]; }
void clear_errors(Device<unsigned>& e) { kc::check_cuda(cudaMemset(e.get(), 0, sizeof(unsigned)), "cudaMemset"); }

/// Seeded random token table: each id known with probability `known`, device uniform, confidence
/// uniform in [0, 32767] with the extremes 0 and 32767 over-represented.
sp::TokenDeviceTable random_table(int vocab, int devices, double known, std::uint64_t seed) {
  sp::TokenDeviceTable t(vocab, devices);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::uniform_int_distribution<int> dev(0, devices - 1), conf(0, 32767), pick(0, 9);
  for (int id = 0; id < vocab; ++id) {
    if (u(rng) >= known) continue;
    int p = pick(rng);
    auto c = static_cast<sp::Q15>(p == 0 ? 0 : p == 1 ? 32767 : conf(rng));
    t.set_q15(id, dev(rng), c);
  }
  return t;
}

std::vector<int> random_tokens(int n, int vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  std::vector<int> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = id(rng);
  return v;
}

enum class Spread { uniform, skewed, one_device, even_only };

/// Seeded predicted devices: uniform, skewed (D * u^3: low devices crowded, high ones nearly
/// empty), all on device D - 1, or only even devices (odd groups empty).
std::vector<int> random_devices(int n, int devices, Spread s, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int> v(static_cast<std::size_t>(n));
  for (auto& d : v) {
    double x = u(rng);
    switch (s) {
      case Spread::uniform: d = static_cast<int>(x * devices); break;
      case Spread::skewed: d = static_cast<int>(x * x * x * devices); break;
      case Spread::one_device: d = devices - 1; break;
      case Spread::even_only: d = static_cast<int>(x * devices) / 2 * 2; break;
    }
    d = std::min(d, devices - 1);
  }
  return v;
}

/// The plan's buffers in one caller-owned workspace.
struct PlanBuffers {
  Device<std::byte> ws;
  kc::DeviceShufflePlan p;
  PlanBuffers(int max_tokens, int devices) : ws(kc::shuffle_plan_workspace_bytes(max_tokens, devices)) {
    p = kc::make_device_shuffle_plan(std::span<std::byte>(ws.get(), ws.size()), max_tokens, devices);
  }
};

void require_plan(sp::ShufflePlan const& want, kc::DeviceShufflePlan const& p, std::vector<int> const& predicted) {
  auto n = want.tokens();
  auto D = static_cast<std::size_t>(want.devices);
  REQUIRE(p.devices == want.devices);
  CHECK(mismatch(download(p.counts, D), want.counts) == "");
  CHECK(mismatch(download(p.offsets, D + 1), want.offsets) == "");
  CHECK(mismatch(download(p.aligned_offsets, D + 1), want.aligned_offsets) == "");
  CHECK(mismatch(download(p.permutation, n), want.permutation) == "");
  CHECK(mismatch(download(p.inverse, n), want.inverse) == "");
  std::vector<int> group(n);  // device of each packed row
  for (std::size_t j = 0; j < n; ++j) group[j] = predicted[static_cast<std::size_t>(want.permutation[j])];
  CHECK(mismatch(download(p.group, n), group) == "");
}

struct HostPrediction {
  std::vector<int> device;
  std::vector<std::int16_t> confidence;
};

HostPrediction host_predict(sp::Predictor const& pred, std::vector<int> const& tokens) {
  HostPrediction h;
  for (int t : tokens) {
    auto p = pred.predict(t);
    h.device.push_back(p.device);
    h.confidence.push_back(p.confidence);
  }
  return h;
}

// ---------------------------------------------------------------------------------------------
// Lookup
// ---------------------------------------------------------------------------------------------

void check_predict(int vocab, int devices, double known, int n, std::uint64_t seed) {
  auto table = random_table(vocab, devices, known, seed);
  auto tokens = random_tokens(n, vocab, seed + 1);
  auto want = host_predict(sp::Predictor(table), tokens);
  kc::DeviceTokenTable dt(table);
  REQUIRE(dt.vocab() == vocab);
  REQUIRE(dt.devices() == devices);
  Device<int> dtok(tokens.empty() ? std::vector<int>{0} : tokens);
  Device<int> ddev(std::max<std::size_t>(tokens.size(), 1));
  Device<std::int16_t> dconf(ddev.size());
  Device<unsigned> err(std::vector<unsigned>{0});
  ddev.poison();
  dconf.poison();
  kc::predict_devices(nullptr, dt.view(), dtok.get(), n, ddev.get(), dconf.get(), err.get());
  INFO("vocab " << vocab << " devices " << devices << " known " << known << " tokens " << n);
  CHECK(read_errors(err) == 0u);
  CHECK(mismatch(ddev.download(tokens.size()), want.device) == "");
  CHECK(mismatch(dconf.download(tokens.size()), want.confidence) == "");
  // Without a confidence output.
  ddev.poison();
  kc::predict_devices(nullptr, dt.view(), dtok.get(), n, ddev.get(), nullptr, err.get());
  CHECK(mismatch(ddev.download(tokens.size()), want.device) == "");
  CHECK(read_errors(err) == 0u);
}

}  // namespace

TEST_CASE("predict_devices follows the host predictor's token-table rules", "[cuda][shuffle][predict]") {
  std::uint64_t seed = 100;
  for (int devices : {1, 3, 8, 64})
    for (int vocab : {1, 1000, 50304})
      for (int n : {1, 255, 256, 257, 5000}) check_predict(vocab, devices, 0.7, n, seed++);
  // Every id known, and none known (every token takes the id mod D default).
  check_predict(2000, 8, 1.0, 4096, 7);
  check_predict(2000, 8, 0.0, 4096, 8);
  check_predict(2000, 7, 0.0, 4096, 9);
}

TEST_CASE("predict_devices: ids outside the vocabulary raise error_bad_token and go to device 0",
          "[cuda][shuffle][predict][bad-input]") {
  int vocab = 100, devices = 4;
  auto table = random_table(vocab, devices, 0.5, 3);
  sp::Predictor pred(table);
  std::vector<int> tokens{5, -1, 100, INT_MAX, INT_MIN, 99, 0, 37};
  kc::DeviceTokenTable dt(table);
  Device<int> dtok(tokens), ddev(tokens.size());
  Device<std::int16_t> dconf(tokens.size());
  Device<unsigned> err(std::vector<unsigned>{0});
  ddev.poison();
  dconf.poison();
  kc::predict_devices(nullptr, dt.view(), dtok.get(), static_cast<int>(tokens.size()), ddev.get(), dconf.get(),
                      err.get());
  CHECK(read_errors(err) == unsigned(kc::error_bad_token));
  auto dev = ddev.download();
  auto conf = dconf.download();
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    INFO("token " << tokens[i]);
    if (tokens[i] >= 0 && tokens[i] < vocab) {
      auto p = pred.predict(tokens[i]);
      CHECK(dev[i] == p.device);
      CHECK(conf[i] == p.confidence);
    } else {
      REQUIRE_THROWS_AS(pred.predict(tokens[i]), moe::Error);  // the host rule the kernel replaces
      CHECK(dev[i] == 0);
      CHECK(conf[i] == 0);
    }
  }
  // The same batch without the bad ids leaves the word clear.
  clear_errors(err);
  std::vector<int> good{5, 99, 0, 37};
  Device<int> dgood(good);
  kc::predict_devices(nullptr, dt.view(), dgood.get(), 4, ddev.get(), dconf.get(), err.get());
  CHECK(read_errors(err) == 0u);
}

// ---------------------------------------------------------------------------------------------
// Plan
// ---------------------------------------------------------------------------------------------

TEST_CASE("shuffle_plan equals make_shuffle_plan", "[cuda][shuffle][plan]") {
  constexpr int max_tokens = 16387;
  // Under a sanitizer without 4096 tokens: the sizes below and above it remain.
  std::vector<int> const sizes = moe::test::full_or<std::vector<int>>({0, 1, 100, 4096, max_tokens},
                                                                      {0, 1, 100, max_tokens});
  std::uint64_t seed = 1000;
  for (int devices : {1, 2, 7, 8, 64, 300, 4096}) {
    PlanBuffers b(max_tokens, devices);
    Device<int> dpred(static_cast<std::size_t>(max_tokens));
    Device<unsigned> err(std::vector<unsigned>{0});
    for (int n : sizes)
      for (Spread s : {Spread::uniform, Spread::skewed, Spread::one_device, Spread::even_only})
        for (int alignment : {1, 16, 128}) {
          auto pred = random_devices(n, devices, s, seed++);
          auto want = sp::make_shuffle_plan(pred, devices, alignment);
          if (n) dpred.upload(pred);
          b.ws.poison();
          kc::shuffle_plan(nullptr, dpred.get(), n, alignment, b.p, err.get());
          INFO("devices " << devices << " tokens " << n << " spread " << int(s) << " alignment " << alignment);
          require_plan(want, b.p, pred);
          REQUIRE(read_errors(err) == 0u);
        }
  }
}

TEST_CASE("shuffle_plan: predictions outside [0, devices) raise error_bad_device and are planned on device 0",
          "[cuda][shuffle][plan][bad-input]") {
  int devices = 4;
  std::vector<int> pred{3, -1, 4, 0, 2, INT_MAX, 1, INT_MIN};
  std::vector<int> as_planned = pred;
  for (auto& d : as_planned)
    if (d < 0 || d >= devices) d = 0;
  REQUIRE_THROWS_AS(sp::make_shuffle_plan(pred, devices), moe::Error);  // the host rule the kernel replaces
  auto want = sp::make_shuffle_plan(as_planned, devices, 2);
  PlanBuffers b(16, devices);
  Device<int> dpred(pred);
  Device<unsigned> err(std::vector<unsigned>{0});
  b.ws.poison();
  kc::shuffle_plan(nullptr, dpred.get(), static_cast<int>(pred.size()), 2, b.p, err.get());
  CHECK(read_errors(err) == unsigned(kc::error_bad_device));
  require_plan(want, b.p, as_planned);
}

TEST_CASE("predict_and_plan on the OLMoE token table matches the host predictor and plan", "[cuda][shuffle][olmoe]") {
  namespace olmoe = moe::profile::olmoe;
  auto prof = olmoe::load(MOE_SHARED_DATA_DIR, {"arxiv"}, {.token_counts = true, .crosslayer = false, .only_layer = 0});
  auto const& lc = prof.layer(0);
  // Batches drawn from the profiled occurrences (real token frequencies); every 8th token is
  // replaced by a seeded uniform id, most of which the profile never saw (the mod-D default).
  std::vector<int> pool;
  for (std::size_t r = 0; r < lc.rows(); ++r)
    for (std::int64_t o = 0; o < lc.row_total(r) / olmoe::top_k; ++o) pool.push_back(lc.tokens[r]);
  REQUIRE(pool.size() >= 16384);
  std::mt19937_64 rng(42);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::uniform_int_distribution<int> any(0, olmoe::vocab - 1);
  for (std::size_t i = 0; i < pool.size(); i += 8) pool[i] = any(rng);

  for (int devices : {8, 64}) {
    auto table = sp::TokenDeviceTable::from_counts(lc, moe::placement::Table::contiguous(olmoe::experts, devices),
                                                   devices, olmoe::vocab);
    sp::Predictor pred(table);
    kc::DeviceTokenTable dt(table);
    PlanBuffers b(16384, devices);
    Device<int> dtok(16384), ddev(16384);
    Device<std::int16_t> dconf(16384);
    Device<unsigned> err(std::vector<unsigned>{0});
    for (int n : {128, 4096, 16384})
      for (int alignment : {1, 16}) {
        std::vector<int> tokens(pool.begin(), pool.begin() + n);
        auto want = host_predict(pred, tokens);
        auto unseen = std::count_if(tokens.begin(), tokens.end(), [&](int t) { return !table.known(t); });
        REQUIRE(unseen > 0);  // the default rule is exercised
        auto want_plan = sp::make_shuffle_plan(want.device, devices, alignment);
        dtok.upload(tokens);
        INFO("devices " << devices << " tokens " << n << " alignment " << alignment << " unseen " << unseen);
        // With the token-order outputs.
        b.ws.poison();
        ddev.poison();
        dconf.poison();
        kc::predict_and_plan(nullptr, dt.view(), dtok.get(), n, alignment, b.p, ddev.get(), dconf.get(), err.get());
        CHECK(mismatch(ddev.download(tokens.size()), want.device) == "");
        CHECK(mismatch(dconf.download(tokens.size()), want.confidence) == "");
        require_plan(want_plan, b.p, want.device);
        // Plan only (predictions kept in the workspace).
        b.ws.poison();
        kc::predict_and_plan(nullptr, dt.view(), dtok.get(), n, alignment, b.p, nullptr, nullptr, err.get());
        require_plan(want_plan, b.p, want.device);
        // The two-step path gives the same plan.
        b.ws.poison();
        kc::predict_devices(nullptr, dt.view(), dtok.get(), n, ddev.get(), nullptr, err.get());
        kc::shuffle_plan(nullptr, ddev.get(), n, alignment, b.p, err.get());
        require_plan(want_plan, b.p, want.device);
        REQUIRE(read_errors(err) == 0u);
      }
  }
}

TEST_CASE("edge cases: no tokens, one device, all tokens on one device, no known token", "[cuda][shuffle][edge]") {
  Device<unsigned> err(std::vector<unsigned>{0});
  SECTION("0 tokens: predict writes nothing, the plan is all zeros") {
    auto table = random_table(50, 4, 0.5, 5);
    kc::DeviceTokenTable dt(table);
    Device<int> dtok(1), ddev(1);
    ddev.poison();
    kc::predict_devices(nullptr, dt.view(), dtok.get(), 0, ddev.get(), nullptr, err.get());
    CHECK(ddev.download()[0] == -1);  // untouched poison
    PlanBuffers b(0, 4);
    b.ws.poison();
    kc::predict_and_plan(nullptr, dt.view(), nullptr, 0, 8, b.p, nullptr, nullptr, err.get());
    require_plan(sp::make_shuffle_plan(std::vector<int>{}, 4, 8), b.p, {});
    b.ws.poison();
    kc::shuffle_plan(nullptr, nullptr, 0, 1, b.p, err.get());
    require_plan(sp::make_shuffle_plan(std::vector<int>{}, 4, 1), b.p, {});
    CHECK(read_errors(err) == 0u);
  }
  SECTION("one device: the identity permutation") {
    auto table = random_table(300, 1, 0.5, 6);
    auto tokens = random_tokens(1000, 300, 7);
    auto want = host_predict(sp::Predictor(table), tokens);
    kc::DeviceTokenTable dt(table);
    PlanBuffers b(1000, 1);
    Device<int> dtok(tokens), ddev(tokens.size());
    b.ws.poison();
    kc::predict_and_plan(nullptr, dt.view(), dtok.get(), 1000, 64, b.p, ddev.get(), nullptr, err.get());
    auto plan = sp::make_shuffle_plan(want.device, 1, 64);
    require_plan(plan, b.p, want.device);
    auto perm = download(b.p.permutation, 1000);
    for (int j = 0; j < 1000; ++j) REQUIRE(perm[static_cast<std::size_t>(j)] == j);
    CHECK(mismatch(download(b.p.aligned_offsets, 2), std::vector<int>{0, 1024}) == "");
  }
  SECTION("every token known on the same device") {
    sp::TokenDeviceTable table(64, 8);
    for (int id = 0; id < 64; ++id) table.set(id, 5, 0.75);
    auto tokens = random_tokens(3000, 64, 8);
    kc::DeviceTokenTable dt(table);
    PlanBuffers b(3000, 8);
    Device<int> dtok(tokens), ddev(tokens.size());
    Device<std::int16_t> dconf(tokens.size());
    b.ws.poison();
    kc::predict_and_plan(nullptr, dt.view(), dtok.get(), 3000, 16, b.p, ddev.get(), dconf.get(), err.get());
    auto want = host_predict(sp::Predictor(table), tokens);
    CHECK(mismatch(ddev.download(), want.device) == "");
    CHECK(mismatch(dconf.download(), want.confidence) == "");
    require_plan(sp::make_shuffle_plan(want.device, 8, 16), b.p, want.device);
    CHECK(mismatch(download(b.p.counts, 8), std::vector<int>{0, 0, 0, 0, 0, 3000, 0, 0}) == "");
  }
  SECTION("no known token: device = id mod D, confidence 0") {
    sp::TokenDeviceTable table(1000, 6);
    auto tokens = random_tokens(2000, 1000, 9);
    kc::DeviceTokenTable dt(table);
    Device<int> dtok(tokens), ddev(tokens.size());
    Device<std::int16_t> dconf(tokens.size());
    ddev.poison();
    dconf.poison();
    kc::predict_devices(nullptr, dt.view(), dtok.get(), 2000, ddev.get(), dconf.get(), err.get());
    auto dev = ddev.download();
    auto conf = dconf.download();
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      REQUIRE(dev[i] == tokens[i] % 6);  // the documented default, independently of the host code
      REQUIRE(conf[i] == 0);
    }
  }
  CHECK(read_errors(err) == 0u);
}

// ---------------------------------------------------------------------------------------------
// Row moves
// ---------------------------------------------------------------------------------------------

namespace {

/// Random bit patterns (NaNs and infinities included): the moves must not touch the bits.
template <class T>
std::vector<T> random_bits(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> v(n);
  for (auto& x : v) {
    if constexpr (std::is_same_v<T, float>) {
      x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    } else {
      x.bits = static_cast<std::uint16_t>(rng());
    }
  }
  return v;
}

template <class T>
bool same_bits(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// pack then unpack n rows of `width`, with the buffers starting `shift` elements into their
/// allocations (a shift makes the pointers miss 16-byte alignment: a narrower unit is used).
template <class T>
void check_pack(int n, int width, int shift, std::uint64_t seed) {
  auto rows_per = static_cast<std::size_t>(width);
  auto total = static_cast<std::size_t>(n) * rows_per;
  auto x = random_bits<T>(total, seed);
  auto pred = random_devices(n, 8, Spread::skewed, seed + 1);
  auto plan = sp::make_shuffle_plan(pred, 8);
  std::vector<T> want(total);
  sp::pack_rows<T>(plan, x, want, rows_per);

  auto s = static_cast<std::size_t>(shift);
  Device<T> dx(total + s + 1), dpacked(total + s + 1), dback(total + s + 1);
  if (total) kc::check_cuda(cudaMemcpy(dx.get() + s, x.data(), total * sizeof(T), cudaMemcpyHostToDevice), "upload");
  Device<int> dperm(plan.permutation.empty() ? std::vector<int>{0} : plan.permutation);
  Device<int> dinv(plan.inverse.empty() ? std::vector<int>{0} : plan.inverse);
  Device<unsigned> err(std::vector<unsigned>{0});
  dpacked.poison();
  dback.poison();
  kc::pack_rows<T>(nullptr, dx.get() + s, n, width, dperm.get(), dpacked.get() + s, err.get());
  auto got = download(dpacked.get() + s, total);
  INFO("rows " << n << " width " << width << " element bytes " << sizeof(T) << " shift " << shift);
  CHECK(same_bits(got, want));
  kc::unpack_rows<T>(nullptr, dpacked.get() + s, n, width, dinv.get(), dback.get() + s, err.get());
  auto back = download(dback.get() + s, total);
  CHECK(same_bits(back, x));
  CHECK(read_errors(err) == 0u);
  // Nothing written outside the rows.
  auto after = download(dback.get() + s + total, 1);
  std::vector<T> poison(1);
  std::memset(static_cast<void*>(poison.data()), 0xff, sizeof(T));
  CHECK(same_bits(after, poison));
}

}  // namespace

TEST_CASE("pack_rows and unpack_rows move rows bit-exactly (bf16 and fp32)", "[cuda][shuffle][pack]") {
  std::uint64_t seed = 5000;
  // Under a sanitizer 129 rows instead of 777: a block per row either way, a sixth of the blocks.
  for (int n : {0, 1, moe::test::full_or(777, 129)}) {
    // bf16: 16-byte vectors (2048, 7168), 8-byte (4), 4-byte (6), 2-byte (3, 1) units.
    for (int width : {2048, 7168, 4, 6, 3, 1}) check_pack<moe::bf16>(n, width, 0, seed++);
    // fp32: 16-byte vectors (2048, 7168), 8-byte (2), 4-byte (3, 1).
    for (int width : {2048, 7168, 2, 3, 1}) check_pack<float>(n, width, 0, seed++);
    // Pointers off 16-byte alignment: narrower units for the same widths.
    check_pack<moe::bf16>(n, 2048, 1, seed++);
    check_pack<moe::bf16>(n, 2048, 2, seed++);
    check_pack<moe::bf16>(n, 2048, 4, seed++);
    check_pack<float>(n, 2048, 1, seed++);
    check_pack<float>(n, 2048, 2, seed++);
  }
}

TEST_CASE("pack_rows: an index outside [0, n) raises error_bad_index instead of reading out of bounds",
          "[cuda][shuffle][pack][bad-input]") {
  int n = 4, width = 8;
  auto x = random_bits<float>(static_cast<std::size_t>(n * width), 1);
  Device<float> dx(x), dout(x.size());
  Device<int> dperm(std::vector<int>{2, -1, 4, 0});
  Device<unsigned> err(std::vector<unsigned>{0});
  dout.poison();
  kc::pack_rows<float>(nullptr, dx.get(), n, width, dperm.get(), dout.get(), err.get());
  CHECK(read_errors(err) == unsigned(kc::error_bad_index));
  auto got = dout.download();
  // Rows 0 and 3 are moved; rows 1 and 2 stay poisoned.
  for (int c = 0; c < width; ++c) {
    CHECK(std::bit_cast<std::uint32_t>(got[static_cast<std::size_t>(c)]) ==
          std::bit_cast<std::uint32_t>(x[static_cast<std::size_t>(2 * width + c)]));
    CHECK(std::bit_cast<std::uint32_t>(got[static_cast<std::size_t>(3 * width + c)]) ==
          std::bit_cast<std::uint32_t>(x[static_cast<std::size_t>(c)]));
    CHECK(std::bit_cast<std::uint32_t>(got[static_cast<std::size_t>(width + c)]) == 0xffffffffu);
    CHECK(std::bit_cast<std::uint32_t>(got[static_cast<std::size_t>(2 * width + c)]) == 0xffffffffu);
  }
}

// ---------------------------------------------------------------------------------------------
// Host-side argument checks, workspace, graph capture
// ---------------------------------------------------------------------------------------------

TEST_CASE("launchers reject bad arguments with moe::Error before enqueuing", "[cuda][shuffle][bad-input]") {
  auto table = random_table(100, 4, 0.5, 11);
  kc::DeviceTokenTable dt(table);
  PlanBuffers b(64, 4);
  Device<int> dtok(64), ddev(64);
  Device<float> dx(64 * 8), dy(64 * 8);
  Device<unsigned> err(std::vector<unsigned>{0});
  REQUIRE_THROWS_AS(kc::DeviceTokenTable(sp::TokenDeviceTable{}), moe::Error);  // empty table
  REQUIRE_THROWS_AS(kc::shuffle_plan(nullptr, ddev.get(), 65, 1, b.p, err.get()), moe::Error);   // > max_tokens
  REQUIRE_THROWS_AS(kc::shuffle_plan(nullptr, ddev.get(), -1, 1, b.p, err.get()), moe::Error);   // negative
  REQUIRE_THROWS_AS(kc::shuffle_plan(nullptr, ddev.get(), 64, 0, b.p, err.get()), moe::Error);   // alignment
  REQUIRE_THROWS_AS(kc::shuffle_plan(nullptr, ddev.get(), 64, 1, b.p, nullptr), moe::Error);     // error word
  REQUIRE_THROWS_AS(kc::shuffle_plan(nullptr, ddev.get(), 64, 1, kc::DeviceShufflePlan{}, err.get()),
                    moe::Error);  // not carved
  REQUIRE_THROWS_AS(kc::shuffle_plan(nullptr, ddev.get(), 64, INT_MAX / 2, b.p, err.get()), moe::Error);  // overflow
  PlanBuffers b8(64, 8);
  REQUIRE_THROWS_AS(kc::predict_and_plan(nullptr, dt.view(), dtok.get(), 64, 1, b8.p, nullptr, nullptr, err.get()),
                    moe::Error);  // table has 4 devices, plan 8
  REQUIRE_THROWS_AS(kc::predict_devices(nullptr, kc::TokenTableView{}, dtok.get(), 64, ddev.get(), nullptr, err.get()),
                    moe::Error);
  REQUIRE_THROWS_AS(kc::predict_devices(nullptr, dt.view(), dtok.get(), 64, nullptr, nullptr, err.get()), moe::Error);
  REQUIRE_THROWS_AS(kc::pack_rows<float>(nullptr, dx.get(), 64, 0, dtok.get(), dy.get(), err.get()), moe::Error);
  REQUIRE_THROWS_AS(kc::pack_rows<float>(nullptr, dx.get(), 64, 8, dtok.get(), dx.get(), err.get()), moe::Error);
  REQUIRE_THROWS_AS(kc::unpack_rows<float>(nullptr, dx.get(), 64, 8, nullptr, dy.get(), err.get()), moe::Error);
  REQUIRE_THROWS_AS(kc::unpack_rows<float>(nullptr, dx.get(), 64, 8, dtok.get(), dy.get(), nullptr), moe::Error);
  // A workspace below the size query is refused by the carver.
  auto bytes = kc::shuffle_plan_workspace_bytes(64, 4);
  REQUIRE(bytes > 0);
  REQUIRE_THROWS_AS(kc::make_device_shuffle_plan(std::span<std::byte>(b.ws.get(), bytes / 2), 64, 4), moe::Error);
  CHECK(read_errors(err) == 0u);
}

TEST_CASE("lookup, plan, pack and unpack replay from a CUDA graph", "[cuda][shuffle][graph]") {
  // Under a sanitizer 1024 tokens: the same kernels captured and replayed, a quarter of the blocks.
  constexpr int n = moe::test::full_or(4096, 1024), width = 2048, devices = 8;
  auto table = random_table(50304, devices, 0.8, 21);
  sp::Predictor pred(table);
  kc::DeviceTokenTable dt(table);
  PlanBuffers b(n, devices);
  Device<int> dtok(static_cast<std::size_t>(n));
  Device<std::int16_t> dconf(static_cast<std::size_t>(n));
  Device<moe::bf16> dx(static_cast<std::size_t>(n) * width), dpacked(dx.size()), dback(dx.size());
  Device<unsigned> err(std::vector<unsigned>{0});
  moe::test::Stream st;
  auto enqueue = [&] {
    kc::predict_and_plan(st, dt.view(), dtok.get(), n, 16, b.p, nullptr, dconf.get(), err.get());
    kc::pack_rows<moe::bf16>(st, dx.get(), n, width, b.p.permutation, dpacked.get(), err.get());
    kc::unpack_rows<moe::bf16>(st, dpacked.get(), n, width, b.p.inverse, dback.get(), err.get());
  };
  dtok.upload(random_tokens(n, 50304, 22));
  enqueue();  // once outside the capture (lazy initialisation)
  st.synchronize("warm-up");
  moe::test::CapturedGraph graph(st, enqueue, cudaStreamCaptureModeGlobal);
  for (std::uint64_t round = 0; round < 2; ++round) {
    auto tokens = random_tokens(n, 50304, 30 + round);
    auto x = random_bits<moe::bf16>(dx.size(), 40 + round);
    dtok.upload(tokens);
    dx.upload(x);
    b.ws.poison();
    dconf.poison();
    dpacked.poison();
    dback.poison();
    graph.launch(st);
    st.synchronize("graph replay");
    auto want = host_predict(pred, tokens);
    auto plan = sp::make_shuffle_plan(want.device, devices, 16);
    INFO("replay " << round);
    CHECK(mismatch(dconf.download(), want.confidence) == "");
    require_plan(plan, b.p, want.device);
    std::vector<moe::bf16> packed(x.size());
    sp::pack_rows<moe::bf16>(plan, x, packed, width);
    CHECK(same_bits(dpacked.download(), packed));
    CHECK(same_bits(dback.download(), x));
  }
  CHECK(read_errors(err) == 0u);
}
