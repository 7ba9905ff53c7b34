// Exact workspace sizes of the host components. For each component and shape the test
//   1. records, with core::CarveLog, every piece workspace_size() counts (offset and bytes);
//   2. fills the caller's workspace with a poison byte, runs the worst-case inputs one after the
//      other (the most tokens the component was built for, routed so that each buffer reaches its
//      bound in at least one of them), and marks each byte that no longer holds the poison; it does
//      this twice, with two different poison bytes, so a byte written with the poison's value is
//      still seen as written in the other pass;
//   3. requires every byte of every piece to be written, and workspace_size() to be the end of the
//      last piece plus the Carver's slack for an unaligned buffer (nothing counted after the
//      pieces); the padding between pieces is the only part not checked, and it is the Carver's
//      alignment, not a component's sizing;
//   4. requires each run's output to match the fp64 textbook layer (tests/support/textbook.hpp).
// A buffer sized above what any input can use fails step 3; one sized below it fails the
// component's own overflow checks or the sanitizer runs. Records are padded to 16 bytes, so the
// shapes keep hidden * sizeof(T) a multiple of 16 (a record's tail padding is never written).
#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "moe/moe.hpp"
#include "moe/replication/reactive.hpp"
#include "moe/layer/findep_executor.hpp"
#include "textbook.hpp"

using namespace moe;
namespace textbook = moe::test::textbook;

namespace {

constexpr std::array<std::byte, 2> kPoison = {std::byte{0xA5}, std::byte{0x5A}};

/// A caller's buffer of exactly `bytes` bytes whose address is `misalign` past a 256-byte boundary.
struct Buffer {
  std::vector<std::byte> storage;
  std::span<std::byte> span;
  Buffer(std::size_t bytes, std::size_t misalign) : storage(bytes + 2 * core::Carver::alignment) {
    auto address = reinterpret_cast<std::uintptr_t>(storage.data());
    std::size_t a = core::Carver::alignment;
    span = {storage.data() + (misalign + a - address % a) % a, bytes};
  }
};

/// Index in `buffer` where a Carver over buffer.subspan(from) puts its first piece.
std::size_t carver_start(std::span<std::byte> buffer, std::size_t from) {
  auto address = reinterpret_cast<std::uintptr_t>(buffer.data() + from);
  std::size_t a = core::Carver::alignment;
  return from + (a - address % a) % a;
}

/// What one rank found: unwritten bytes per piece, and the output errors.
struct Finding {
  std::vector<std::string> problems;
  std::vector<double> errors;  // one per run, against the textbook
  std::size_t pieces = 0;
};

/// Pieces of one carver (in the order of take()) placed at `start` in the buffer: reports every
/// piece with a byte left unwritten.
void check_pieces(std::vector<core::CarvePiece> const& pieces, std::size_t start, std::vector<bool> const& written,
                  char const* who, Finding& f) {
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    std::size_t missing = 0, first = 0;
    for (std::size_t b = 0; b < pieces[i].bytes; ++b)
      if (!written[start + pieces[i].offset + b] && missing++ == 0) first = b;
    if (missing)
      f.problems.push_back(std::string(who) + ": piece " + std::to_string(i) + " of " + std::to_string(pieces.size()) +
                           " (" + std::to_string(pieces[i].bytes) + " bytes) has " + std::to_string(missing) +
                           " bytes never written, the first at byte " + std::to_string(first));
  }
  f.pieces += pieces.size();
}

/// workspace_size() of a single carver must be the end of its last piece plus the alignment slack.
std::size_t carver_used(std::vector<core::CarvePiece> const& pieces) {
  return pieces.empty() ? core::Carver::alignment
                        : pieces.back().offset + pieces.back().bytes + core::Carver::alignment;
}

/// workspace_size() (called by `size`) and the pieces it counted.
template <class F>
std::pair<std::size_t, std::vector<core::CarvePiece>> measure(F&& size) {
  core::CarveLog log;
  std::size_t bytes = size();
  return {bytes, log.pieces};
}

/// Poisons `buffer`, calls `runs` (every worst-case input once) and returns the written bytes,
/// over both poison values.
std::vector<bool> written_bytes(std::span<std::byte> buffer, std::function<void()> const& runs) {
  std::vector<bool> written(buffer.size(), false);
  for (std::byte p : kPoison) {
    std::fill(buffer.begin(), buffer.end(), p);
    runs();
    for (std::size_t i = 0; i < buffer.size(); ++i) written[i] = written[i] || buffer[i] != p;
  }
  return written;
}

/// Tokens whose router logits (see identity_router) pick `chosen` in that order; an empty choice
/// leaves the token's routing to its random values. Other coordinates are random.
template <class T>
std::vector<T> routed_tokens(ShapeSpec const& s, std::vector<std::vector<int>> const& chosen, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.5f);
  auto h = static_cast<std::size_t>(s.hidden);
  std::vector<T> x(chosen.size() * h);
  for (std::size_t t = 0; t < chosen.size(); ++t) {
    std::vector<float> row(h);
    for (auto& v : row) v = d(rng);
    if (!chosen[t].empty()) {
      for (int e = 0; e < s.experts; ++e) row[static_cast<std::size_t>(e)] = -2.0f + 0.1f * d(rng);
      for (std::size_t j = 0; j < chosen[t].size(); ++j)
        row[static_cast<std::size_t>(chosen[t][j])] = 6.0f - static_cast<float>(j);
    }
    for (std::size_t i = 0; i < h; ++i) x[t * h + i] = from_float<T>(row[i]);
  }
  return x;
}

/// Router weights with logit_e = x_e (needs hidden >= experts).
template <class T>
std::vector<T> identity_router(ShapeSpec const& s) {
  std::vector<T> w(static_cast<std::size_t>(s.experts) * static_cast<std::size_t>(s.hidden), from_float<T>(0.0f));
  for (int e = 0; e < s.experts; ++e)
    w[static_cast<std::size_t>(e) * static_cast<std::size_t>(s.hidden) + static_cast<std::size_t>(e)] =
        from_float<T>(1.0f);
  return w;
}

template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, float> ? textbook::fp32_tolerance : textbook::bf16_tolerance;
}

// Shapes. Both have hidden * sizeof(T) a multiple of 16 and hidden >= experts.
// Softmax top-2 of 8 experts with a shared expert wider than a routed one (the scratch of the
// shared expert, m x shared_ffn, and of the routed experts, ranks * m x expert_ffn, differ).
struct SharedWide {
  static constexpr std::string_view name = "shared-wide";
  static constexpr ShapeSpec spec = {.hidden = 32,
                                     .expert_ffn = 24,
                                     .experts = 8,
                                     .top_k = 2,
                                     .shared_experts = 1,
                                     .shared_ffn = 48,
                                     .moe_layers = 1,
                                     .scoring = Scoring::softmax,
                                     .renormalize = true,
                                     .dtype = DType::f32};
};
// Softmax top-3 of 4 experts in bf16, no shared expert: top_k above the 2 ranks, so a token sends
// at most 2 de-duplicated records.
struct Top3Bf16 {
  static constexpr std::string_view name = "top3-bf16";
  static constexpr ShapeSpec spec = {
      .hidden = 64, .expert_ffn = 16, .experts = 4, .top_k = 3, .moe_layers = 1, .dtype = DType::bf16};
};

/// Routing of one worst-case input: the experts each token of each rank picks.
using Routing = std::function<std::vector<int>(int rank, int token)>;

/// The Layer's worst cases on rank 0, for a placement that puts experts 0..k-1 on rank 0:
///   all-to-rank-0  every token of every rank picks experts 0..k-1: rank 0 receives the most
///                  records (one per token and rank, or one per token, rank and expert without
///                  de-duplication), each with k experts, and one expert gets every record;
///   spread         rank 0's tokens pick `spread` (experts on min(k, ranks) different ranks):
///                  rank 0 sends the most records.
/// With `batch_aware`, the replicas are replication::Reactive with the placement's single copies on
/// one-GPU servers (the same routes, plus the count all-gather's buffers).
template <class Model, int R, bool batch_aware = false>
std::vector<Finding> layer_case(placement::Table const& table, std::vector<int> const& spread, bool dedup, int m,
                                std::size_t misalign) {
  constexpr ShapeSpec s = Model::spec;
  std::vector<Finding> found(R);
  collective::run_in_process<R>([&](auto& comm) {
    using Comm = std::remove_cvref_t<decltype(comm)>;
    auto replicas = [&] {
      if constexpr (batch_aware) {
        std::vector<std::vector<int>> copies;
        for (int e = 0; e < s.experts; ++e) copies.push_back({table.rank_of(e)});
        return replication::Reactive(copies, topology::fat_tree(1, R, 1));
      } else {
        return replication::None{};
      }
    }();
    using L = Layer<Model, router::SoftmaxTopK, placement::Table, decltype(replicas), schedule::Sequential, Comm>;
    using T = typename L::element_type;
    int rank = comm.rank();
    RandomLayerWeights<T> weights(s, 7);
    auto router = identity_router<T>(s);
    auto view = weights.view();
    view.router = router.data();
    L layer(comm, table, replicas, view, {.max_tokens = m, .deduplicate = dedup});
    auto [size, pieces] = measure([&] { return layer.workspace_size(); });
    Finding& f = found[static_cast<std::size_t>(rank)];
    if (size != carver_used(pieces)) f.problems.push_back("workspace_size() is not the end of its pieces + slack");

    std::vector<int> all_first(static_cast<std::size_t>(s.top_k));
    std::iota(all_first.begin(), all_first.end(), 0);
    std::vector<Routing> inputs = {[&](int, int) { return all_first; },
                                   [&](int r, int) { return r == 0 ? spread : std::vector<int>{}; }};
    Buffer ws(size, misalign);
    bool record = true;
    auto runs = [&] {
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        std::vector<std::vector<int>> chosen;
        for (int t = 0; t < m; ++t) chosen.push_back(inputs[i](rank, t));
        auto x = routed_tokens<T>(s, chosen, 100 + 10 * i + static_cast<std::size_t>(rank));
        std::vector<T> y(x.size());
        layer.run({.tokens = m, .x = x.data(), .y = y.data(), .first_token = static_cast<long long>(rank) * m},
                  ws.span);
        if (record) {
          auto book = textbook::forward(s, view, m, x.data());
          f.errors.push_back(textbook::relative_error(y.data(), book.data(), y.size()));
        }
      }
      record = false;
    };
    auto written = written_bytes(ws.span, runs);
    if (rank == 0) check_pieces(pieces, carver_start(ws.span, 0), written, "moe::Layer", f);
  });
  return found;
}

void expect_clean(std::vector<Finding> const& found, double tol, bool check_rank0_pieces = true) {
  for (std::size_t r = 0; r < found.size(); ++r) {
    INFO("rank " << r);
    for (auto const& p : found[r].problems) FAIL_CHECK(p);
    for (double e : found[r].errors) CHECK(e < tol);
  }
  if (check_rank0_pieces) CHECK(found[0].pieces > 0);
}

}  // namespace

TEST_CASE("moe::Layer: the worst case writes every byte its workspace_size() counts", "[layer][workspace]") {
  for (bool dedup : {true, false}) {
    for (std::size_t misalign : {std::size_t{0}, std::size_t{16}}) {
      INFO("deduplicate " << dedup << ", buffer " << misalign << " bytes past a 256-byte boundary");
      {
        INFO(SharedWide::name << " on 4 ranks, contiguous placement (rank 0 holds experts 0 and 1)");
        auto found = layer_case<SharedWide, 4>(placement::Table::contiguous(8, 4), {0, 2}, dedup, 5, misalign);
        expect_clean(found, tolerance<float>());
      }
      {
        INFO(Top3Bf16::name << " on 2 ranks, experts 0..2 on rank 0");
        auto found = layer_case<Top3Bf16, 2>(placement::Table({0, 0, 0, 1}), {0, 3, 1}, dedup, 3, misalign);
        expect_clean(found, tolerance<bf16>());
      }
    }
  }
}

TEST_CASE("moe::Layer with batch-aware replicas: the worst case writes every byte of its workspace",
          "[layer][workspace][reactive]") {
  for (bool dedup : {true, false}) {
    INFO("deduplicate " << dedup);
    {
      INFO(SharedWide::name << " on 4 ranks, replication::Reactive");
      auto found = layer_case<SharedWide, 4, true>(placement::Table::contiguous(8, 4), {0, 2}, dedup, 5, 16);
      expect_clean(found, tolerance<float>());
    }
    {
      INFO(Top3Bf16::name << " on 2 ranks, replication::Reactive");
      auto found = layer_case<Top3Bf16, 2, true>(placement::Table({0, 0, 0, 1}), {0, 3, 1}, dedup, 3, 0);
      expect_clean(found, tolerance<bf16>());
    }
  }
}

TEST_CASE("ShuffledLayer: the worst case writes every byte of its own workspace", "[layer][workspace]") {
  // The ShuffledLayer's pieces come first, then the inner Layer's workspace (whose exactness is
  // the test above: with every token predicted for rank 0, rank 0's inner layer receives only its
  // own records, not the worst case of a Layer). Worst case for rank 0: every token predicted for
  // it, so its reduced rows, its layer input and output and the packed output are all full.
  constexpr int R = 4, batch = 6;
  constexpr ShapeSpec s = SharedWide::spec;
  std::vector<Finding> found(R);
  collective::run_in_process<R>([&](auto& comm) {
    using Comm = std::remove_cvref_t<decltype(comm)>;
    using L = Layer<SharedWide, router::SoftmaxTopK, placement::Table, replication::None, schedule::Sequential, Comm>;
    int rank = comm.rank();
    RandomLayerWeights<float> weights(s, 9);
    L layer(comm, placement::Table::contiguous(8, R), replication::None{}, weights.view(), {.max_tokens = batch});
    ShuffledLayer<L> shuffled(layer, batch);
    auto [inner_size, inner_pieces] = measure([&] { return layer.workspace_size(); });
    auto [size, all_pieces] = measure([&] { return shuffled.workspace_size(); });
    Finding& f = found[static_cast<std::size_t>(rank)];
    std::size_t own_pieces = all_pieces.size() - inner_pieces.size();
    std::vector<core::CarvePiece> own(all_pieces.begin(), all_pieces.begin() + static_cast<std::ptrdiff_t>(own_pieces));
    if (size != carver_used(own) + inner_size)
      f.problems.push_back("workspace_size() is not its own pieces + slack + the inner layer's workspace");

    // x = the sum of the ranks' partials, exactly (each partial is x / 4).
    std::vector<float> x(static_cast<std::size_t>(batch * s.hidden));
    std::mt19937_64 rng(5);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : x) v = d(rng);
    std::vector<float> partial(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) partial[i] = x[i] / 4.0f;
    std::vector<int> predicted(batch, 0);
    Buffer ws(size, 16);
    bool record = true;
    auto runs = [&] {
      std::vector<float> y(x.size());
      shuffled.run_shuffled({.tokens = batch, .partial = partial.data(), .y = y.data(), .predicted = predicted},
                            ws.span);
      if (record) {
        auto book = textbook::forward(s, weights.view(), batch, x.data());
        f.errors.push_back(textbook::relative_error(y.data(), book.data(), y.size()));
      }
      record = false;
    };
    auto written = written_bytes(ws.span, runs);
    if (rank == 0) check_pieces(own, carver_start(ws.span, 0), written, "ShuffledLayer", f);
  });
  expect_clean(found, tolerance<float>());
}

namespace {

/// Top3Bf16 on 2 ranks built for different token counts (2 on rank 0, 4 on rank 1), every token
/// picking experts 0..2 (on rank 0), rank 0 de-duplicating or not; the error the layer stopped with.
template <class Replicas>
std::string mismatched_ranks(Replicas const& replicas, bool rank0_deduplicates) {
  constexpr ShapeSpec s = Top3Bf16::spec;
  std::string message;
  try {
    collective::run_in_process<2>([&](auto& comm) {
      using Comm = std::remove_cvref_t<decltype(comm)>;
      using L = Layer<Top3Bf16, router::SoftmaxTopK, placement::Table, Replicas, schedule::Sequential, Comm>;
      int rank = comm.rank(), m = rank == 0 ? 2 : 4;
      RandomLayerWeights<bf16> weights(s, 3);
      auto router = identity_router<bf16>(s);
      auto view = weights.view();
      view.router = router.data();
      L layer(comm, placement::Table({0, 0, 0, 1}), replicas, view,
              {.max_tokens = m, .deduplicate = rank == 1 || rank0_deduplicates});
      std::vector<std::byte> ws(layer.workspace_size());
      auto x = routed_tokens<bf16>(s, std::vector<std::vector<int>>(static_cast<std::size_t>(m), {0, 1, 2}), 1);
      std::vector<bf16> y(x.size());
      layer.run({.tokens = m, .x = x.data(), .y = y.data()}, ws);
    });
  } catch (Error const& e) {
    message = e.what();
  }
  return message;
}

}  // namespace

TEST_CASE("moe::Layer: ranks with different options cannot overrun the exact buffers", "[layer][workspace]") {
  // Rank 0 (no de-duplication, 2 tokens) holds 12 assignments; rank 1 (de-duplicated, 4 tokens)
  // would send it 4 records of 3 experts each, 18 assignments. The ranks' agreement on the pass
  // sees the different options before any record moves, and every rank stops (the executor's own
  // bound on received assignments stays behind it as a second line).
  CHECK_THAT(mismatched_ranks(replication::None{}, false),
             Catch::Contains("every rank must build its layer with the same options: rank 0 has max_tokens 2, "
                             "deduplicate 0") &&
                 Catch::Contains("rank 1 has max_tokens 4, deduplicate 1"));
}

TEST_CASE("moe::Layer with batch-aware replicas: a rank reporting more pairs than max_tokens allows is refused",
          "[layer][workspace][reactive]") {
  // Rank 0 was built for 2 tokens (at most 6 pairs per rank), rank 1 for 4 and routes 4 tokens
  // (12 pairs). The agreement refuses the pass before any count is gathered (behind it, rank 0
  // would refuse the gathered counts before the rule works on them).
  CHECK_THAT(mismatched_ranks(replication::Reactive({{0}, {0}, {0}, {1}}, topology::fat_tree(1, 2, 1)), true),
             Catch::Contains("every rank must build its layer with the same options: rank 0 has max_tokens 2"));
}

TEST_CASE("FinDepExecutor: the worst case writes every byte of an AG and an EG rank's workspace",
          "[schedule][workspace]") {
  // 2 AG and 2 EG ranks; experts 0..3 on EG rank 0, 4..7 on EG rank 1. Worst cases:
  //   all to EG 0, one chunk    every token of both AG ranks picks experts 0 and 1: an AG rank packs
  //                             its whole batch for one EG rank and gets one partial per token
  //                             back; EG rank 0 receives every token, and expert 0 gets them all;
  //                             the micro-batch is the whole batch (logits, shared expert);
  //   spread, one chunk         the AG tokens pick experts 0 and 4: each goes to both EG ranks;
  //   either, r1 * r2 = tokens  one token per chunk: the most (chunk, EG rank) lists.
  // (The host disaggregated moe::Layer's workspace_size() is this executor's.)
  constexpr int R = 4, ag = 2, m = 4;
  constexpr ShapeSpec s = SharedWide::spec;
  using schedule::Config;
  using schedule::Pipeline;
  std::vector<Finding> found(R);
  collective::run_in_process<R>([&](auto& comm) {
    using Comm = std::remove_cvref_t<decltype(comm)>;
    using Ex = schedule::FinDepExecutor<router::SoftmaxTopK, float, Comm>;
    int rank = comm.rank();
    bool is_ag = rank < ag;
    RandomLayerWeights<float> weights(s, 13);
    auto router = identity_router<float>(s);
    auto view = weights.view();
    view.router = router.data();
    Ex ex(comm, s, ag, placement::Table({0, 0, 0, 0, 1, 1, 1, 1}), view, m);
    auto [size, pieces] = measure([&] { return ex.workspace_size(); });
    Finding& f = found[static_cast<std::size_t>(rank)];
    if (size != carver_used(pieces)) f.problems.push_back("workspace_size() is not the end of its pieces + slack");

    std::vector<std::vector<int>> inputs = {{0, 1}, {0, 4}};
    std::vector<Config> configs = {{.pipeline = Pipeline::findep, .r1 = 1, .r2 = 1},
                                   {.pipeline = Pipeline::findep, .r1 = 2, .r2 = 2}};
    Buffer ws(size, 16);
    bool record = true;
    auto runs = [&] {
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        for (Config const& c : configs) {
          auto x = routed_tokens<float>(s, std::vector<std::vector<int>>(m, inputs[i]), 50 + i);
          std::vector<float> y(x.size());
          typename Ex::Arguments a;
          if (is_ag) a = {m, x.data(), y.data()};
          ex.run(a, c, ws.span);
          if (record && is_ag) {
            auto book = textbook::forward(s, view, m, x.data());
            f.errors.push_back(textbook::relative_error(y.data(), book.data(), y.size()));
          }
        }
      }
      record = false;
    };
    auto written = written_bytes(ws.span, runs);
    if (rank == 0 || rank == ag)
      check_pieces(pieces, carver_start(ws.span, 0), written, is_ag ? "FinDepExecutor (AG)" : "FinDepExecutor (EG)", f);
  });
  expect_clean(found, tolerance<float>());
  CHECK(found[ag].pieces > 0);
}
