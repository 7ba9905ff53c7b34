// A device layer whose constructor fails part way releases everything it had made: every creation
// the constructor makes (device arrays, the cuBLAS handle, the shared-expert stream and its two
// events, the pinned count buffer) is made to fail in turn through the emulator's fault injection
// (emu::fail_nth_call), and after each failure the emulator must hold exactly the streams, events,
// allocations and cuBLAS handles it held before. Under AddressSanitizer, LeakSanitizer checks the
// same at exit.
#include <catch2/catch.hpp>

#include <string>

#include "layer_test_support.cuh"
#include "moe/layer/paths/device.cuh"
#include "moe/moe.hpp"

namespace {

using Model = moe::models::Reduced<moe::models::DeepSeekV3, 64, 32, moe::DType::f32>;  // one shared expert
using Router = moe::router::ForModel<Model>;

/// A two-rank device collective that is only ever constructed against: the layer's constructor asks
/// for the rank and the size and nothing else (every operation fails the test if called).
struct TwoRanks {
  static constexpr moe::collective::Memory memory = moe::collective::Memory::device;
  int rank() const { return 0; }
  int size() const { return 2; }
  [[noreturn]] static void unused() { moe::fail("TwoRanks: a constructor must not communicate"); }
  void set_stream(cudaStream_t) {}
  void all_to_all(std::span<std::byte const>, std::span<std::byte>, std::size_t) { unused(); }
  void all_to_all_v(std::span<std::byte const>, std::span<std::size_t const>, std::span<std::byte>,
                    std::span<std::size_t const>) {
    unused();
  }
  void reduce_scatter_v(std::span<float const>, std::span<float>, std::span<std::size_t const>) { unused(); }
  void all_gather_v(std::span<std::byte const>, std::span<std::byte>, std::span<std::size_t const>) { unused(); }
  void all_reduce(std::span<float>) { unused(); }
  void send(std::span<std::byte const>, int, int) { unused(); }
  void recv(std::span<std::byte>, int, int) { unused(); }
  void barrier() { unused(); }
  moe::collective::Counters const& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }
  moe::collective::Counters counters_;
};

struct Held {
  emu::Resources resources;
  std::size_t cublas = 0;
  bool operator==(Held const&) const = default;
};
Held held() { return {emu::live_resources(), emu::blas::live_handles()}; }

/// Makes the n-th call of `api` fail for every n the constructor reaches; returns how many
/// failures were seen. `build` constructs (and destroys) one layer.
template <class Build>
int fail_each_call(char const* api, Build build) {
  int failures = 0;
  for (int nth = 1; nth < 200; ++nth) {
    Held before = held();
    emu::fail_nth_call(api, nth);
    bool threw = false;
    try {
      build();
    } catch (moe::Error const& e) {
      threw = true;
      INFO(api << " call " << nth << ": " << e.what());
      CHECK(std::string(e.what()).find(api == std::string("cublasCreate") ? "cublasCreate" : "out of") !=
            std::string::npos);
    }
    emu::fail_nth_call(api, 0);
    INFO(api << " call " << nth << " failed: the constructor must release what it made");
    Held after = held();
    CHECK(after.resources.streams == before.resources.streams);
    CHECK(after.resources.events == before.resources.events);
    CHECK(after.resources.host_allocations == before.resources.host_allocations);
    CHECK(after.resources.device_allocations == before.resources.device_allocations);
    CHECK(after.cublas == before.cublas);
    if (!threw) break;  // the constructor made fewer than nth such calls
    ++failures;
  }
  (void)cudaGetLastError();  // the injected failures are not sticky; clear the last one
  return failures;
}

}  // namespace

TEST_CASE("a device layer whose construction fails part way leaks nothing", "[emu][layer][leaks]") {
  constexpr moe::ShapeSpec s = Model::spec;
  moe::RandomLayerWeights<float> weights(s, 3);
  moe::test::DeviceWeights<float> dw(s, weights.view());
  moe::LayerWeights<float> view = dw.view();

  auto single = [&] {
    using L = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential,
                         moe::collective::SingleGpu>;
    moe::collective::SingleGpu gpu;
    L layer(gpu, moe::placement::Table::contiguous(s.experts, 1), {}, view, {.max_tokens = 16});
  };
  auto two = [&] {
    using L = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential,
                         TwoRanks>;
    TwoRanks comm;
    L layer(comm, moe::placement::Table::contiguous(s.experts, 2), {}, view, {.max_tokens = 16});
  };
  Held start = held();
  // The constructors' creations, each made to fail at every call in turn.
  CHECK(fail_each_call("cudaMalloc", single) >= 8);  // replica lists, mask, pointer tables, error word
  CHECK(fail_each_call("cublasCreate", single) == 1);
  CHECK(fail_each_call("cudaStreamCreateWithFlags", single) == 1);  // the shared experts' stream
  CHECK(fail_each_call("cudaEventCreateWithFlags", single) == 2);   // fork and join
  CHECK(fail_each_call("cudaMallocHost", two) == 2);  // the pinned record counts and the ranks' votes
  CHECK(fail_each_call("cudaMallocHost", single) == 0);              // one GPU exchanges no counts
  CHECK(held() == start);
}

TEST_CASE("a live device layer: each creation of its window and arena tables fails in turn, nothing leaks",
          "[emu][layer][leaks][live]") {
  constexpr moe::ShapeSpec s = Model::spec;
  moe::RandomLayerWeights<float> weights(s, 3);
  moe::test::DeviceWeights<float> dw(s, weights.view());
  moe::LayerWeights<float> view = dw.view();
  using L = moe::Layer<Model, Router, moe::placement::Table, moe::replication::Table, moe::schedule::Sequential,
                       moe::collective::SingleGpu>;
  std::vector<std::vector<int>> copies(static_cast<std::size_t>(s.experts), std::vector<int>{0});
  moe::live::Options live{.window = 4, .spare_slots = 1, .migration_bytes_per_pass = 1024};
  auto build = [&] {
    moe::collective::SingleGpu gpu;
    L layer(gpu, moe::placement::Table::contiguous(s.experts, 1), moe::replication::Table(copies), view,
            {.max_tokens = 16, .live = live});
  };
  // After the constructor's own creations fail in turn, attach_arena's: the new pointer tables.
  int made = 0;
  auto attach = [&] {
    moe::collective::SingleGpu gpu;
    L layer(gpu, moe::placement::Table::contiguous(s.experts, 1), moe::replication::Table(copies), view,
            {.max_tokens = 16, .live = live});
    moe::test::Device<float> arena(layer.arena_elements());
    ++made;
    layer.attach_arena({arena.get(), arena.size()});
  };
  Held start = held();
  CHECK(fail_each_call("cudaMallocHost", build) == 1);            // the window's pinned counts
  CHECK(fail_each_call("cudaEventCreateWithFlags", build) == 3);  // fork, join, the counts' event
  int constructor = fail_each_call("cudaMalloc", build);
  CHECK(constructor >= 8);
  made = 0;
  int with_attach = fail_each_call("cudaMalloc", attach);
  // the arena itself, then the pointer tables attach_arena uploads
  CHECK(with_attach >= constructor + 1 + 5);
  CHECK(made >= 6);
  CHECK(held() == start);
}
