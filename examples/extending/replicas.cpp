// A replica policy of one's own: HotEverywhere keeps a copy of each "hot" expert on every rank and
// serves a token's pair with a hot expert on the token's own rank; every other expert has its one
// copy on the rank the placement names. moe::Layer calls validate(experts, ranks, placement) in
// its constructor, holds(expert, primary, rank) there too (which weights this rank must have) and
// on each received record, and choose(expert, primary, source_rank, token) in run() for every
// token-expert pair of this rank's tokens, before the dispatch. The policy is in
// hot_everywhere.hpp, which device.cu shares (it adds the policy's device form).
//
// Checks: the layer on 4 in-process ranks matches moe::reference_forward; on every rank the
// number of pairs served locally equals the count from the reference's routes (a pair is local
// when its expert is hot or placed on the token's rank); with every expert hot nothing is sent.
#include <algorithm>
#include <span>
#include <vector>

#include "check.hpp"
#include "hot_everywhere.hpp"

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
