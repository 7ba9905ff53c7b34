// Policies a user writes in their own file: a collective with the Exchange capability alone (no
// send / recv, no reductions) and a phased schedule of its own, run through moe::Layer's host path
// against the single-process reference.
#include <catch2/catch.hpp>

#include <atomic>

#include "layer_check.hpp"

using namespace moe;

namespace {

/// Exchange only, over an InProcess collective it does not own; counts its calls.
template <int N>
class ExchangeOnly {
public:
  static constexpr collective::Memory memory = collective::Memory::host;
  explicit ExchangeOnly(collective::InProcess<N>& inner) : inner_(&inner) {}
  [[nodiscard]] int rank() const { return inner_->rank(); }
  [[nodiscard]] int size() const { return inner_->size(); }
  void all_to_all(std::span<std::byte const> in, std::span<std::byte> out, std::size_t block) {
    ++calls;
    inner_->all_to_all(in, out, block);
  }
  void all_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> sc, std::span<std::byte> out,
                    std::span<std::size_t const> rc) {
    ++calls;
    inner_->all_to_all_v(in, sc, out, rc);
  }
  void all_gather_v(std::span<std::byte const> in, std::span<std::byte> out, std::span<std::size_t const> counts) {
    ++calls;
    inner_->all_gather_v(in, out, counts);
  }
  [[nodiscard]] collective::Counters const& counters() const { return inner_->counters(); }
  void reset_counters() { inner_->reset_counters(); }
  int calls = 0;

private:
  collective::InProcess<N>* inner_;
};
static_assert(collective::Exchange<ExchangeOnly<2>> && !collective::PointToPoint<ExchangeOnly<2>> &&
              !collective::Reduce<ExchangeOnly<2>>);

/// A phased schedule of the user's: the phases in their order, and a count of the passes.
struct CountingSchedule {
  static constexpr std::string_view name = "counting";
  static inline std::atomic<int> passes{0};  // the ranks' threads add to it at once
  template <class Pass>
  static void run(Pass& pass) {
    ++passes;
    pass.route();
    pass.dispatch();
    pass.compute();
    pass.combine();
  }
};
static_assert(schedule::PhasedPolicy<CountingSchedule> && !schedule::DisaggregatedPolicy<CountingSchedule>);

}  // namespace

TEST_CASE("a user's collective and schedule run through the host path", "[layer][extending]") {
  using S = models::Reduced<models::Mixtral8x7B, 32, 16, DType::f32>;
  using L = Layer<S, router::SoftmaxTopK, placement::Table, replication::None, CountingSchedule, ExchangeOnly<4>>;
  static_assert(L::path == ExecutionPath::host);
  RandomLayerWeights<float> w(S::spec, 11);
  int const per_rank = 6, total = 4 * per_rank;
  auto x = test::random_tokens<float>(total, S::spec.hidden, 12);
  std::vector<float> ref(x.size()), y(x.size());
  std::vector<int> ids(static_cast<std::size_t>(total) * S::spec.top_k);
  std::vector<float> gw(ids.size());
  reference_forward<router::SoftmaxTopK>(S::spec, w.view(), total, x.data(), ref.data(), ids, gw);
  CountingSchedule::passes = 0;
  std::array<int, 4> calls{};
  collective::run_in_process<4>([&](collective::InProcess<4>& inner) {
    ExchangeOnly<4> comm(inner);
    L layer(comm, placement::Table::contiguous(S::spec.experts, 4), {}, w.view(), {.max_tokens = per_rank});
    std::vector<std::byte> ws(layer.workspace_size());
    auto at = static_cast<std::size_t>(inner.rank() * per_rank) * S::spec.hidden;
    layer.run({.tokens = per_rank, .x = x.data() + at, .y = y.data() + at}, ws);
    calls[static_cast<std::size_t>(inner.rank())] = comm.calls;
  });
  CHECK(test::max_relative_error(y, ref) < 1e-5);
  CHECK(CountingSchedule::passes.load() == 4);  // one pass per rank
  for (int c : calls) CHECK(c >= 4);     // agreement, counts, records, partials
}
