// A replica policy of one's own: HotEverywhere keeps a copy of each "hot" expert on every rank and
// serves a token's pair with a hot expert on the token's own rank; every other expert has its one
// copy on the rank the placement names. moe::Layer calls validate(experts, ranks, placement) in
// its constructor, holds(expert, primary, rank) there too (which weights this rank must have) and
// on each received record, and choose(expert, primary, source_rank, token) in run() for every
// token-expert pair of this rank's tokens, before the dispatch.
//
// Checks: the layer on 4 in-process ranks matches moe::reference_forward; on every rank the
// number of pairs served locally equals the count from the reference's routes (a pair is local
// when its expert is hot or placed on the token's rank); with every expert hot nothing is sent.
#include <algorithm>
#include <span>
#include <vector>

#include "check.hpp"

class HotEverywhere {
public:
  explicit HotEverywhere(std::vector<int> hot) : hot_(std::move(hot)) {}

  /// The rank that serves this (token, expert) pair; `token` is the global token index.
  [[nodiscard]] int choose(int expert, int primary, int source_rank, long long /*token*/) const {
    return is_hot(expert) ? source_rank : primary;
  }
  /// Whether `rank` holds a copy of `expert` (whose primary copy is on `primary`).
  [[nodiscard]] bool holds(int expert, int primary, int rank) const { return is_hot(expert) || primary == rank; }
  /// Throws moe::Error when the policy does not fit the layer.
  void validate(int experts, int /*ranks*/, std::span<int const> /*placement*/) const {
    for (int e : hot_) moe::check(e >= 0 && e < experts, "HotEverywhere: hot expert ", e, " outside [0, ", experts, ")");
  }

private:
  [[nodiscard]] bool is_hot(int expert) const { return std::find(hot_.begin(), hot_.end(), expert) != hot_.end(); }
  std::vector<int> hot_;
};
static_assert(moe::replication::Policy<HotEverywhere>);

int main() {
  using namespace extending;
  using Router = moe::router::ForModel<Model>;
  constexpr int ranks = 4, tokens = 16;
  auto placement = moe::placement::Table::contiguous(shape.experts, ranks);
  bool ok = true;

  std::vector<int> hot = {3, 17, 40, 63};
  auto run = run_layer<Router, moe::placement::Table, HotEverywhere, moe::schedule::Sequential, ranks>(
      placement, HotEverywhere(hot), tokens);
  std::printf("HotEverywhere {3, 17, 40, 63}: relative error %.2e\n", run.relative_error());
  ok &= expect(run.relative_error() < 1e-5, "layer with HotEverywhere matches the reference");

  bool local_ok = true;
  for (int r = 0; r < ranks; ++r) {
    long long expected = 0;
    for (int t = r * tokens; t < (r + 1) * tokens; ++t)
      for (int j = 0; j < shape.top_k; ++j) {
        int e = run.ids[static_cast<std::size_t>(t * shape.top_k + j)];
        expected += std::count(hot.begin(), hot.end(), e) > 0 || e / (shape.experts / ranks) == r;
      }
    auto const& st = run.stats[static_cast<std::size_t>(r)];
    std::printf("rank %d: %lld of %lld pairs local (expected %lld)\n", r, st.local_assignments, st.assignments, expected);
    local_ok = local_ok && st.local_assignments == expected;
  }
  ok &= expect(local_ok, "local pairs per rank: hot experts and the rank's own");

  // Every expert hot: every pair is served where its token is, and the dispatch sends nothing.
  std::vector<int> all(static_cast<std::size_t>(shape.experts));
  for (int e = 0; e < shape.experts; ++e) all[static_cast<std::size_t>(e)] = e;
  auto local = run_layer<Router, moe::placement::Table, HotEverywhere, moe::schedule::Sequential, ranks>(
      placement, HotEverywhere(all), tokens);
  bool silent = local.relative_error() < 1e-5;
  for (auto const& st : local.stats) silent = silent && st.dispatch_bytes == 0 && st.combine_bytes == 0;
  ok &= expect(silent, "every expert everywhere: right output, no dispatch or combine bytes");
  return ok ? 0 : 1;
}
