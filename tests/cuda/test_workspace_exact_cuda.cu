// Exact workspace sizes of the device components (issue 15; the host ones are
// tests/layer/test_workspace_exact.cpp): the device moe::Layer on one GPU (collective::SingleGpu) and on several
// ranks of one GPU (moe::test::StagedDevice, both exchanges), the co-located
// schedule::FinDepCudaExecutor, and schedule::FinDepCudaExecutor with the PointToPoint link on its AG and EG ranks (over
// StagedDevice). For each component and shape the test
//   1. records, with core::CarveLog, every piece workspace_size() counts (offset and bytes), and
//      names them in carve order (the count must match, so a new piece needs a name here);
//   2. fills the device workspace with a poison byte (cudaMemset), runs the worst-case inputs one
//      after the other (the most tokens the component was built for, every token routed by the
//      biased gate so that each buffer reaches its bound in at least one input), downloads the
//      workspace and marks each byte that no longer holds the poison; twice, with two poison bytes;
//   3. requires every byte of every piece to be written, except the few listed as not written in
//      the worst case, each with the reason, and workspace_size() to be the end of the last piece
//      plus the Carver's slack (nothing counted after the pieces);
//   4. requires each run's output to match the host reference forward (moe::reference_forward).
// The routes are far from ties (chosen logits 6, 5, 4; the others about -2), so the GPU and the
// host pick the same experts. Exits 77 (skipped) without a GPU; runs on the CUDA emulator.

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cuda_test_support.cuh"
#include "layer_test_support.cuh"
#include "moe/layer/paths/device.cuh"
#include "moe/moe.hpp"
#include "moe/layer/findep_cuda_executor.cuh"
#include "staged_collective.cuh"

using moe::test::Device;
using moe::test::DeviceWeights;
namespace kc = moe::kernels::cuda;

namespace {

constexpr std::array<unsigned char, 2> kPoison = {0xA5, 0x5A};

// The cuBLAS workspace (DeviceOptions / FinDepCudaOptions::cublas_workspace, 8 MiB by default) is
// library scratch, exempt below, yet every byte of it is poisoned, downloaded and scanned twice per
// case: under a sanitizer that was most of this test's time. There it is 64 KiB, still a piece of
// the workspace that cuBLAS is handed; the layer's own pieces are the same either way.
constexpr std::size_t cublas_bytes =
    moe::test::full_or(moe::cuda::DeviceOptions{}.cublas_workspace, std::size_t{64} << 10);

// Shapes: every width a multiple of 16 bytes of the storage type and hidden >= experts (the
// router weights copy the first `experts` coordinates of a token into its logits).
// Softmax top-2 of 8 experts with a shared expert wider than a routed one.
struct SharedWide {
  static constexpr std::string_view name = "shared-wide";
  static constexpr moe::ShapeSpec spec = {.hidden = 32,
                                          .expert_ffn = 24,
                                          .experts = 8,
                                          .top_k = 2,
                                          .shared_experts = 1,
                                          .shared_ffn = 48,
                                          .moe_layers = 1,
                                          .scoring = moe::Scoring::softmax,
                                          .renormalize = true,
                                          .dtype = moe::DType::f32};
};
// Softmax top-3 of 4 experts in bf16, no shared expert.
struct Top3Bf16 {
  static constexpr std::string_view name = "top3-bf16";
  static constexpr moe::ShapeSpec spec = {
      .hidden = 64, .expert_ffn = 16, .experts = 4, .top_k = 3, .moe_layers = 1, .dtype = moe::DType::bf16};
};

using Router = moe::router::SoftmaxTopK;

template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, float> ? 1e-4 : 3e-2;
}

/// workspace_size() (called by `size`) and the pieces it counted.
template <class F>
std::pair<std::size_t, std::vector<moe::core::CarvePiece>> measure(F&& size) {
  moe::core::CarveLog log;
  std::size_t bytes = size();
  return {bytes, log.pieces};
}

/// A device buffer of exactly `bytes` bytes whose address is `misalign` past a 256-byte boundary.
struct DeviceBuffer {
  Device<std::byte> storage;
  std::span<std::byte> span;
  DeviceBuffer(std::size_t bytes, std::size_t misalign) : storage(bytes + 2 * moe::core::Carver::alignment) {
    auto address = reinterpret_cast<std::uintptr_t>(storage.get());
    std::size_t a = moe::core::Carver::alignment;
    span = {storage.get() + (misalign + a - address % a) % a, bytes};
  }
  void fill(unsigned char v) { kc::check_cuda(cudaMemset(span.data(), v, span.size()), "cudaMemset (poison)"); }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(span.size());
    kc::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    kc::check_cuda(cudaMemcpy(out.data(), span.data(), span.size(), cudaMemcpyDeviceToHost), "download workspace");
    return out;
  }
  /// Index in `span` of the Carver's first piece.
  [[nodiscard]] std::size_t carver_start() const {
    auto address = reinterpret_cast<std::uintptr_t>(span.data());
    std::size_t a = moe::core::Carver::alignment;
    return (a - address % a) % a;
  }
};

/// Says whether byte `b` of the piece named `name` may stay unwritten in the worst case.
using MayStayUnwritten = std::function<bool(std::string const& name, std::size_t b)>;

/// Problems of one rank: the pieces with bytes never written, a wrong total, output errors.
struct Finding {
  std::vector<std::string> problems;
  std::vector<double> errors;  // one per worst-case input, against the host reference
  std::size_t pieces_checked = 0;
};

void check_pieces(char const* who, std::vector<moe::core::CarvePiece> const& pieces,
                  std::vector<std::string> const& names, std::size_t size, std::size_t start,
                  std::vector<bool> const& written, MayStayUnwritten const& exempt, Finding& f) {
  if (pieces.size() != names.size()) {
    f.problems.push_back(std::string(who) + ": workspace_size() counted " + std::to_string(pieces.size()) +
                         " pieces, the test names " + std::to_string(names.size()));
    return;
  }
  std::size_t used = pieces.empty() ? moe::core::Carver::alignment
                                    : pieces.back().offset + pieces.back().bytes + moe::core::Carver::alignment;
  if (size != used)
    f.problems.push_back(std::string(who) + ": workspace_size() = " + std::to_string(size) +
                         " is not the end of its pieces + slack (" + std::to_string(used) + ")");
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    std::size_t missing = 0, first = 0;
    for (std::size_t b = 0; b < pieces[i].bytes; ++b)
      if (!written[start + pieces[i].offset + b] && !exempt(names[i], b) && missing++ == 0) first = b;
    if (missing)
      f.problems.push_back(std::string(who) + ": piece " + std::to_string(i) + " '" + names[i] + "' (" +
                           std::to_string(pieces[i].bytes) + " bytes) has " + std::to_string(missing) +
                           " bytes never written, the first at byte " + std::to_string(first));
  }
  f.pieces_checked += pieces.size();
}

/// Poisons `ws` with each poison byte in turn, calls `runs` (every worst-case input once) and
/// returns the bytes written in either pass.
std::vector<bool> written_bytes(DeviceBuffer& ws, std::function<void()> const& runs) {
  std::vector<bool> written(ws.span.size(), false);
  for (unsigned char p : kPoison) {
    ws.fill(p);
    runs();
    auto bytes = ws.download();
    for (std::size_t i = 0; i < bytes.size(); ++i) written[i] = written[i] || bytes[i] != p;
  }
  return written;
}

/// Tokens whose logits (under identity_router) pick `chosen[t]` in that order; other coordinates random.
template <class T>
std::vector<T> routed_tokens(moe::ShapeSpec const& s, std::vector<std::vector<int>> const& chosen, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.5f);
  auto h = static_cast<std::size_t>(s.hidden);
  std::vector<T> x(std::max<std::size_t>(chosen.size(), 1) * h);
  for (std::size_t t = 0; t < chosen.size(); ++t) {
    std::vector<float> row(h);
    for (auto& v : row) v = d(rng);
    for (int e = 0; e < s.experts; ++e) row[static_cast<std::size_t>(e)] = -2.0f + 0.1f * d(rng);
    for (std::size_t j = 0; j < chosen[t].size(); ++j)
      row[static_cast<std::size_t>(chosen[t][j])] = 6.0f - static_cast<float>(j);
    for (std::size_t i = 0; i < h; ++i) x[t * h + i] = moe::from_float<T>(row[i]);
  }
  return x;
}

/// Router weights with logit_e = x_e (needs hidden >= experts).
template <class T>
std::vector<T> identity_router(moe::ShapeSpec const& s) {
  std::vector<T> w(static_cast<std::size_t>(s.experts) * static_cast<std::size_t>(s.hidden), moe::from_float<T>(0.0f));
  for (int e = 0; e < s.experts; ++e)
    w[static_cast<std::size_t>(e) * static_cast<std::size_t>(s.hidden) + static_cast<std::size_t>(e)] =
        moe::from_float<T>(1.0f);
  return w;
}

/// Host weights with the identity router.
template <class T>
struct Weights {
  moe::RandomLayerWeights<T> random;
  std::vector<T> router;
  moe::LayerWeights<T> view;
  Weights(moe::ShapeSpec const& s, std::uint64_t seed) : random(s, seed), router(identity_router<T>(s)) {
    view = random.view();
    view.router = router.data();
  }
};

/// Relative error (max |y - ref| / max |ref|) of `y` against `ref` (same length).
template <class T>
double relative_error(std::span<T const> y, std::span<T const> ref) {
  double diff = 0, scale = 1e-6;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    double g = moe::to_float(y[i]), r = moe::to_float(ref[i]);
    diff = std::isfinite(g) ? std::max(diff, std::abs(g - r)) : 1e30;
    scale = std::max(scale, std::abs(r));
  }
  return diff / scale;
}

/// relative_error of the device output `y` against the host reference on the tokens `x`.
template <class T>
double error_against_reference(moe::ShapeSpec const& s, moe::LayerWeights<T> const& w, int tokens,
                               std::vector<T> const& x, std::vector<T> const& y) {
  std::vector<T> ref(static_cast<std::size_t>(tokens) * static_cast<std::size_t>(s.hidden));
  moe::reference_forward<Router>(s, w, tokens, x.data(), ref.data());
  return relative_error<T>(y, ref);
}

void expect_clean(std::vector<Finding> const& found, double tol) {
  for (std::size_t r = 0; r < found.size(); ++r) {
    INFO("rank " << r);
    for (auto const& p : found[r].problems) FAIL_CHECK(p);
    for (double e : found[r].errors) CHECK(e < tol);
  }
  CHECK(found[0].pieces_checked > 0);
}

/// The pieces the device moe::Layer carves from its workspace, in order.
std::vector<std::string> const layer_pieces = {
    "logits",      "ids",         "dest",          "weights",    "rec_count", "rec_pos",      "scan_temp",
    "counts",      "send_base",   "recv_base",     "recv_n",     "send",      "recv",         "keys",
    "values",      "sorted_keys", "sorted_values", "position",   "sort_temp", "offsets",      "tile_starts",
    "inter",       "expert_out",  "back",          "returned",   "shared_inter", "shared_acc", "cublas"};

/// Scratch whose size the component does not choose: CUB's temporary storage (the size its query
/// returns, used as CUB sees fit) and the cuBLAS workspace (LayerOptions::cublas_workspace,
/// handed to the handle). Neither is a sizing of the layer's own buffers.
bool library_scratch(std::string const& name) {
  return name == "scan_temp" || name == "sort_temp" || name == "cublas";
}

/// `position` is the inverse of the grouping's sort, indexed by item = record * k + slot. A
/// record names at most `per_record` experts (1 without de-duplication; with it, min(k, experts
/// this rank holds)), so the entries of slots per_record..k-1 are never written (nor read). The
/// indexing, not the size, is what leaves them (keys and values hold a sentinel there instead).
MayStayUnwritten layer_exemptions(int per_record, int k) {
  return [per_record, k](std::string const& name, std::size_t b) {
    if (library_scratch(name)) return true;
    if (name == "position") return static_cast<int>((b / sizeof(int)) % static_cast<std::size_t>(k)) >= per_record;
    return false;
  };
}

/// One GPU: every one of the max_tokens tokens picks experts 0..k-1 (all served here).
template <class Model>
Finding single_gpu_case(bool dedup, int m, std::size_t misalign) {
  using L = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential, moe::collective::SingleGpu>;
  using T = typename L::element_type;
  constexpr moe::ShapeSpec s = Model::spec;
  Weights<T> w(s, 7);
  DeviceWeights<T> dw(s, w.view);
  moe::collective::SingleGpu gpu;
  L layer(gpu, moe::placement::Table::contiguous(s.experts, 1), {}, dw.view(),
          {.max_tokens = m, .deduplicate = dedup, .device = {.cublas_workspace = cublas_bytes}});
  auto [size, pieces] = measure([&] { return layer.workspace_size(); });
  Finding f;
  std::vector<int> first(static_cast<std::size_t>(s.top_k));
  std::iota(first.begin(), first.end(), 0);
  auto x = routed_tokens<T>(s, std::vector<std::vector<int>>(static_cast<std::size_t>(m), first), 11);
  Device<T> dx(x), dy(x.size());
  DeviceBuffer ws(size, misalign);
  bool record = true;
  auto written = written_bytes(ws, [&] {
    dy.poison();
    layer.run({.tokens = m, .x = dx.get(), .y = dy.get()}, ws.span);
    if (layer.errors() != 0u) f.problems.push_back("device error bits " + std::to_string(layer.errors()));
    if (record) f.errors.push_back(error_against_reference(s, w.view, m, x, dy.download()));
    record = false;
  });
  check_pieces("moe::Layer<SingleGpu>", pieces, layer_pieces, size, ws.carver_start(), written,
               layer_exemptions(dedup ? s.top_k : 1, s.top_k), f);
  return f;
}

}  // namespace

TEST_CASE("device Layer on one GPU: the worst case writes every byte its workspace_size() counts",
          "[cuda][layer][workspace]") {
  for (bool dedup : {true, false}) {
    for (std::size_t misalign : {std::size_t{0}, std::size_t{16}}) {
      INFO("deduplicate " << dedup << ", buffer " << misalign << " bytes past a 256-byte boundary");
      {
        INFO(SharedWide::name);
        expect_clean({single_gpu_case<SharedWide>(dedup, 5, misalign)}, tolerance<float>());
      }
      {
        INFO(Top3Bf16::name);
        expect_clean({single_gpu_case<Top3Bf16>(dedup, 3, misalign)}, tolerance<moe::bf16>());
      }
    }
  }
}

// -----------------------------------------------------------------------------------------------
// Several ranks on one GPU (moe::test::StagedDevice), as test_cuda_layer.cu drives them.
// -----------------------------------------------------------------------------------------------
namespace {

using Routing = std::function<std::vector<int>(int rank, int token)>;

/// Worst cases on rank 0, for a placement that puts experts 0..k-1 on rank 0 (or as many as it holds):
///   all-to-rank-0  every token of every rank picks experts 0..k-1: rank 0 receives the most
///                  records (recv, grouping, GEMM rows, back);
///   spread         rank 0's tokens pick `spread` (experts on every rank): rank 0 sends the most
///                  records (send, returned; with Exchange::padded every peer's region is full,
///                  which needs top_k >= ranks).
template <class Model, int R>
std::vector<Finding> ranks_case(moe::placement::Table const& table, std::vector<int> const& spread, bool dedup,
                                moe::cuda::Exchange exchange, int m) {
  constexpr moe::ShapeSpec s = Model::spec;
  using L = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential, moe::test::StagedDevice<R>>;
  using T = typename L::element_type;
  auto h = static_cast<std::size_t>(s.hidden);
  Weights<T> w(s, 7);
  DeviceWeights<T> dw(s, w.view);
  std::vector<int> all_first(static_cast<std::size_t>(s.top_k));
  std::iota(all_first.begin(), all_first.end(), 0);
  std::vector<Routing> inputs = {[&](int, int) { return all_first; },
                                 [&](int r, int) { return r == 0 ? spread : all_first; }};
  // Every rank's tokens of each input, in rank order (the reference runs them as one batch).
  std::vector<std::vector<T>> xs;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<int>> chosen;
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < m; ++t) chosen.push_back(inputs[i](r, t));
    xs.push_back(routed_tokens<T>(s, chosen, 100 + i));
  }
  std::vector<Finding> found(R);
  std::vector<std::vector<T>> ys(inputs.size(), std::vector<T>(static_cast<std::size_t>(R * m) * h));
  moe::collective::run_in_process<R>([&](moe::collective::InProcess<R>& host) {
    moe::test::StagedDevice<R> comm(host);
    int rank = host.rank();
    auto mine = static_cast<std::size_t>(rank * m) * h, n = static_cast<std::size_t>(m) * h;
    L layer(comm, table, {}, dw.view(),
            {.max_tokens = m, .deduplicate = dedup, .device = {.cublas_workspace = cublas_bytes, .exchange = exchange}});
    auto [size, pieces] = measure([&] { return layer.workspace_size(); });
    Finding& f = found[static_cast<std::size_t>(rank)];
    DeviceBuffer ws(size, 16);
    moe::test::Stream st;
    bool record = true;
    auto written = written_bytes(ws, [&] {
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        Device<T> dx(std::vector<T>(xs[i].begin() + static_cast<std::ptrdiff_t>(mine),
                                    xs[i].begin() + static_cast<std::ptrdiff_t>(mine + n))),
            dy(n);
        dy.poison();
        layer.run({.tokens = m, .x = dx.get(), .y = dy.get(), .first_token = rank * m, .stream = st}, ws.span);
        st.synchronize("rank run");
        if (layer.errors() != 0u) f.problems.push_back("device error bits " + std::to_string(layer.errors()));
        if (record) {
          auto y = dy.download();
          std::copy(y.begin(), y.end(), ys[i].begin() + static_cast<std::ptrdiff_t>(mine));
        }
      }
      record = false;
    });
    int held0 = 0;  // experts rank 0 holds
    for (int e = 0; e < s.experts; ++e) held0 += table.rank_of(e) == 0 ? 1 : 0;
    MayStayUnwritten exempt = layer_exemptions(dedup ? std::min(s.top_k, held0) : 1, s.top_k);
    if (exchange == moe::cuda::Exchange::padded && !dedup) {
      // Without de-duplication a token sends a peer one record per expert of the peer it picked:
      // at most min(k, experts the peer holds). The padded exchange is one all_to_all, so every
      // peer's region (send records, returned rows) has the stride of the peer holding the most
      // experts; the tail of a region of a peer holding fewer is padding no input fills (nor can
      // the rows it returns: they come from that peer's equally unfilled region).
      std::vector<int> held(R, 0);
      for (int e = 0; e < s.experts; ++e) ++held[static_cast<std::size_t>(table.rank_of(e))];
      auto per_token = [&](int n) { return static_cast<std::size_t>(std::min(s.top_k, n)); };
      std::size_t cap = static_cast<std::size_t>(m) * per_token(*std::max_element(held.begin(), held.end()));
      std::size_t rec = layer.stats().record_bytes, row = h * sizeof(T);
      exempt = [exempt, held, per_token, cap, rec, row, m](std::string const& name, std::size_t b) {
        if (name != "send" && name != "returned") return exempt(name, b);
        std::size_t stride = name == "send" ? rec : row;
        std::size_t peer = b / (cap * stride), record = b % (cap * stride) / stride;
        return record >= static_cast<std::size_t>(m) * per_token(held[peer]) || exempt(name, b);
      };
    }
    if (rank == 0)
      check_pieces("moe::Layer<StagedDevice>", pieces, layer_pieces, size, ws.carver_start(), written, exempt, f);
  });
  for (std::size_t i = 0; i < inputs.size(); ++i)
    found[0].errors.push_back(error_against_reference(s, w.view, R * m, xs[i], ys[i]));
  return found;
}

}  // namespace

TEST_CASE("device Layer on several ranks: the worst case writes every byte its workspace_size() counts",
          "[cuda][layer][ranks][workspace]") {
  using moe::cuda::Exchange;
  for (Exchange ex : {Exchange::exact, Exchange::padded}) {
    for (bool dedup : {true, false}) {
      INFO("exchange " << (ex == Exchange::exact ? "exact" : "padded") << ", deduplicate " << dedup);
      {
        // top_k 3 >= 2 ranks: rank 0's spread tokens fill every peer's padded region.
        INFO(Top3Bf16::name << " on 2 ranks, experts 0..2 on rank 0");
        auto found = ranks_case<Top3Bf16, 2>(moe::placement::Table({0, 0, 0, 1}), {0, 3, 1}, dedup, ex, 3);
        expect_clean(found, tolerance<moe::bf16>());
      }
      {
        // Each rank holds 2 experts, fewer than top_k 3: without de-duplication a token sends a
        // peer at most 2 records (the padded region and the exact receive buffer follow that).
        INFO(Top3Bf16::name << " on 2 ranks, experts 0 and 1 on rank 0");
        auto found = ranks_case<Top3Bf16, 2>(moe::placement::Table({0, 0, 1, 1}), {2, 3, 0}, dedup, ex, 3);
        expect_clean(found, tolerance<moe::bf16>());
      }
      if (ex == Exchange::exact) {
        // top_k 2 < 4 ranks: the padded regions of two peers cannot fill at once (not run padded).
        INFO(SharedWide::name << " on 4 ranks, contiguous placement (rank 0 holds experts 0 and 1)");
        auto found = ranks_case<SharedWide, 4>(moe::placement::Table::contiguous(8, 4), {0, 2}, dedup, ex, 5);
        expect_clean(found, tolerance<float>());
      }
    }
  }
}

TEST_CASE("device Layer on several ranks: ranks with different options cannot overrun the exact buffers",
          "[cuda][layer][ranks][workspace]") {
  // Rank 0 holds experts 0 and 1 and takes 2 tokens without de-duplication: its receive buffer
  // holds 2 ranks x 2 tokens x 2 records (a token sends a peer at most one record per expert the
  // peer holds). Rank 1 was built for 4 tokens and would send it 8 records; with rank 0's own 4
  // that is 12. The ranks' agreement on the pass sees the different options before any record
  // moves (behind it, the exact exchange would stop at the count instead of writing past the buffer).
  constexpr moe::ShapeSpec s = Top3Bf16::spec;
  using L = moe::Layer<Top3Bf16, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential, moe::test::StagedDevice<2>>;
  Weights<moe::bf16> w(s, 3);
  DeviceWeights<moe::bf16> dw(s, w.view);
  std::string message;
  try {
    moe::collective::run_in_process<2>([&](moe::collective::InProcess<2>& host) {
      moe::test::StagedDevice<2> comm(host);
      int m = host.rank() == 0 ? 2 : 4;
      L layer(comm, moe::placement::Table({0, 0, 1, 1}), {}, dw.view(), {.max_tokens = m, .deduplicate = false});
      Device<std::byte> ws(layer.workspace_size());
      auto x = routed_tokens<moe::bf16>(s, std::vector<std::vector<int>>(static_cast<std::size_t>(m), {0, 1, 2}), 1);
      Device<moe::bf16> dx(x), dy(x.size());
      layer.run({.tokens = m, .x = dx.get(), .y = dy.get()}, ws.bytes());
    });
  } catch (moe::Error const& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("every rank must build its layer with the same options: rank 0 has max_tokens 2") &&
                          Catch::Contains("rank 1 has max_tokens 4"));
}

// -----------------------------------------------------------------------------------------------
// The FinDEP executor: pieces and record-count regions of both links.
// -----------------------------------------------------------------------------------------------
namespace {

/// The pieces of schedule::FinDepCudaExecutor::carve, in order, on an AG and on an EG rank (co-located: both).
std::vector<std::string> const ag_pieces = {"logits",  "ids",       "dest",       "gate_w",    "shared_inter",
                                                "shared_acc", "cublas", "rec_count",  "rec_pos",   "scan_temp",
                                                "send_count", "send_base", "send",    "returned"};
std::vector<std::string> const eg_pieces = {"counts", "recv",          "back",     "recv_base", "recv_n",
                                                "keys",   "values",        "sorted_keys", "sorted_values",
                                                "position", "sort_temp",   "offsets",  "tile_starts", "inter",
                                                "expert_out"};

/// The ints of the AG's record-count regions (rec_count, rec_pos) that some run lays out: a run of
/// q chunks of n tokens puts chunk j's eg x n ints at j times eg x n rounded up to 64 ints (256
/// bytes, for the CUB scan). Runs of q = 1..chunks chunks of m / q tokens; the ints between the
/// regions are that rounding, which no run writes.
std::vector<bool> laid_out_count_ints(int eg, int m, int chunks) {
  std::vector<bool> laid;
  for (int q = 1; q <= chunks; ++q) {
    auto n = static_cast<std::size_t>(m / q), w = static_cast<std::size_t>(eg) * n;
    std::size_t stride = (w + 63) / 64 * 64;
    for (std::size_t j = 0; j < static_cast<std::size_t>(q); ++j) {
      if (laid.size() < j * stride + w) laid.resize(j * stride + w, false);
      std::fill_n(laid.begin() + static_cast<std::ptrdiff_t>(j * stride), w, true);
    }
  }
  return laid;
}

/// The co-located executor (one AG and one EG on this GPU): every one of m tokens picks experts
/// 0..k-1 (a record names k experts), run at every chunk count q = 1..m (r1 = q, m / q tokens per
/// chunk), which together reach every per-chunk region; q = 1 fills the EG scratch sized for the
/// largest chunk (max_chunks keeps its default, 64, above m).
template <class Model>
Finding findep_case(int m, std::size_t misalign) {
  using Ex = moe::schedule::FinDepCudaExecutor<Model, Router>;
  using T = typename Ex::element_type;
  namespace ms = moe::schedule;
  constexpr moe::ShapeSpec s = Model::spec;
  Weights<T> w(s, 13);
  DeviceWeights<T> dw(s, w.view);
  Ex ex(dw.view(), {.max_tokens = m, .cublas_workspace = cublas_bytes});
  auto [size, pieces] = measure([&] { return ex.workspace_size(); });
  Finding f;
  std::vector<int> first(static_cast<std::size_t>(s.top_k));
  std::iota(first.begin(), first.end(), 0);
  auto x = routed_tokens<T>(s, std::vector<std::vector<int>>(static_cast<std::size_t>(m), first), 17);
  Device<T> dx(x), dy(x.size());
  DeviceBuffer ws(size, misalign);
  bool record = true;
  auto written = written_bytes(ws, [&] {
    for (int q = 1; q <= m; ++q) {
      int t = q * (m / q);  // q chunks of m / q tokens
      dy.poison();
      ex.run({.tokens = t, .x = dx.get(), .y = dy.get()}, {ms::Pipeline::findep, ms::Order::asas, q, 1, 1}, ws.span);
      if (ex.errors() != 0u) f.problems.push_back("device error bits " + std::to_string(ex.errors()));
      if (record && t == m) f.errors.push_back(error_against_reference(s, w.view, m, x, dy.download()));
    }
    record = false;
  });
  std::vector<std::string> names = ag_pieces;
  names.insert(names.end(), eg_pieces.begin(), eg_pieces.end());
  auto laid = laid_out_count_ints(1, m, m);
  MayStayUnwritten eg = layer_exemptions(s.top_k, s.top_k);
  check_pieces("FinDepCudaExecutor (co-located)", pieces, names, size, ws.carver_start(), written,
               [&](std::string const& name, std::size_t b) {
                 if (name == "rec_count" || name == "rec_pos")
                   return b / sizeof(int) < laid.size() && !laid[b / sizeof(int)];
                 return eg(name, b);
               },
               f);
  return f;
}

}  // namespace

TEST_CASE("FinDepCudaExecutor, co-located: the worst case writes every byte its workspace_size() counts",
          "[cuda][findep][workspace]") {
  for (std::size_t misalign : {std::size_t{0}, std::size_t{16}}) {
    INFO("buffer " << misalign << " bytes past a 256-byte boundary");
    {
      INFO(SharedWide::name);
      expect_clean({findep_case<SharedWide>(5, misalign)}, tolerance<float>());
    }
    {
      INFO(Top3Bf16::name);
      expect_clean({findep_case<Top3Bf16>(3, misalign)}, tolerance<moe::bf16>());
    }
  }
}

// -----------------------------------------------------------------------------------------------
// The FinDEP executor with the AG and the EG on different ranks (moe::test::StagedDevice).
// -----------------------------------------------------------------------------------------------
namespace {

/// `N` ranks, the first `ag` AG ranks with up to `m` tokens each, the EG indices of the experts
/// `on_eg`. Worst-case inputs: for each EG rank g, every token picks min(k, experts g holds) of
/// g's experts (then experts of other ranks up to k): every AG token sends g a record naming the
/// most experts a record to g can name. Each input runs at every chunk count q = 1..min(m,
/// max_chunks) (r1 = q, m / q tokens per chunk), which together reach every per-chunk region.
template <class Model, int N>
std::vector<Finding> p2p_case(int ag, moe::placement::Table const& on_eg, int m) {
  using Ex = moe::schedule::FinDepCudaExecutor<Model, Router, moe::schedule::PointToPoint<moe::test::StagedDevice<N>>>;
  using T = typename Ex::element_type;
  namespace ms = moe::schedule;
  constexpr moe::ShapeSpec s = Model::spec;
  auto h = static_cast<std::size_t>(s.hidden);
  int eg = N - ag, k = s.top_k;
  std::vector<std::vector<int>> held(static_cast<std::size_t>(eg));
  for (int e = 0; e < s.experts; ++e) held[static_cast<std::size_t>(on_eg.rank_of(e))].push_back(e);
  std::vector<std::vector<int>> routes;
  for (auto const& mine : held) {
    std::vector<int> r(mine.begin(), mine.begin() + std::min<std::ptrdiff_t>(k, std::ssize(mine)));
    for (int e = 0; e < s.experts && std::ssize(r) < k; ++e)
      if (std::find(r.begin(), r.end(), e) == r.end()) r.push_back(e);
    routes.push_back(r);
  }
  Weights<T> w(s, 19);
  DeviceWeights<T> dw(s, w.view);
  // max_chunks keeps its default (64), above m
  ms::FinDepCudaOptions options{.max_tokens = m, .cublas_workspace = cublas_bytes};
  int chunks = std::min(options.max_chunks, m);
  // Every AG rank's m tokens of each input, in rank order, and the host reference on them.
  std::vector<std::vector<T>> xs, refs;
  for (std::size_t i = 0; i < routes.size(); ++i) {
    xs.push_back(routed_tokens<T>(s, std::vector<std::vector<int>>(static_cast<std::size_t>(ag * m), routes[i]), 200 + i));
    refs.emplace_back(xs.back().size());
    moe::reference_forward<Router>(s, w.view, ag * m, xs.back().data(), refs.back().data());
  }
  std::vector<Finding> found(N);
  moe::collective::run_in_process<N>([&](moe::collective::InProcess<N>& host) {
    moe::test::StagedDevice<N> a2e(host), e2a(host);
    int rank = host.rank();
    bool is_ag = rank < ag;
    Ex ex(a2e, e2a, ag, on_eg, dw.view(), options);
    auto [size, pieces] = measure([&] { return ex.workspace_size(); });
    Finding& f = found[static_cast<std::size_t>(rank)];
    DeviceBuffer ws(size, 16);
    moe::test::Stream st;
    bool record = true;
    auto written = written_bytes(ws, [&] {
      for (std::size_t i = 0; i < routes.size(); ++i)
        for (int q = 1; q <= chunks; ++q) {
          int t = q * (m / q);
          auto first = static_cast<std::size_t>(rank * m) * h, n = static_cast<std::size_t>(t) * h;
          Device<T> dx(is_ag ? std::vector<T>(xs[i].begin() + static_cast<std::ptrdiff_t>(first),
                                              xs[i].begin() + static_cast<std::ptrdiff_t>(first + n))
                             : std::vector<T>(h)),
              dy(is_ag ? n : h);
          dy.poison();
          ex.run({.tokens = t, .x = is_ag ? dx.get() : nullptr, .y = is_ag ? dy.get() : nullptr, .stream = st},
                 {ms::Pipeline::findep, ms::Order::asas, q, 1, 1}, ws.span);
          st.synchronize("rank run");
          if (!is_ag && ex.errors() != 0u) f.problems.push_back("device error bits " + std::to_string(ex.errors()));
          if (record && is_ag) {
            // This rank's t tokens against the reference rows of the same tokens.
            auto y = dy.download();
            f.errors.push_back(relative_error<T>(y, std::span<T const>(refs[i]).subspan(first, n)));
          }
        }
      record = false;
    });
    if (is_ag) {
      auto laid = laid_out_count_ints(eg, m, chunks);
      check_pieces("FinDepCudaExecutor (AG rank)", pieces, ag_pieces, size, ws.carver_start(), written,
                   [&laid](std::string const& name, std::size_t b) {
                     if (library_scratch(name)) return true;
                     // The rounding between two chunks' regions; past the last region nothing is exempt.
                     if (name == "rec_count" || name == "rec_pos")
                       return b / sizeof(int) < laid.size() && !laid[b / sizeof(int)];
                     return false;
                   },
                   f);
    } else {
      int rows = std::max(1, std::min(k, static_cast<int>(held[static_cast<std::size_t>(rank - ag)].size())));
      check_pieces("FinDepCudaExecutor (EG rank)", pieces, eg_pieces, size, ws.carver_start(), written,
                   layer_exemptions(rows, k), f);
    }
  });
  return found;
}

}  // namespace

TEST_CASE("FinDepCudaExecutor, point to point: the worst case writes every byte its workspace_size() counts, on AG and EG ranks",
          "[cuda][findep][p2p][workspace]") {
  {
    // Two AG ranks (shared expert on each), two EG ranks holding 4 experts each (>= top_k 2).
    INFO(SharedWide::name << ": 2 AG + 2 EG ranks, experts 0..3 and 4..7");
    expect_clean(p2p_case<SharedWide, 4>(2, moe::placement::Table::contiguous(8, 2), 5), tolerance<float>());
  }
  {
    // One AG rank; EG rank 1 holds one expert, fewer than top_k 3: a record to it yields one row.
    INFO(Top3Bf16::name << ": 1 AG + 2 EG ranks, experts 0..2 and 3");
    expect_clean(p2p_case<Top3Bf16, 3>(1, moe::placement::Table({0, 0, 0, 1}), 3), tolerance<moe::bf16>());
  }
}
