// A placement policy of one's own: Strided puts expert e on rank (e / stride) mod ranks, so runs of
// `stride` neighbouring experts share a rank and the runs go round the ranks. moe::Layer calls
// validate(experts, ranks) once, in its constructor (a bad table is a moe::Error there), then
// rank_of(e) for every expert to build its expert -> rank table; run() uses only that table.
// (The planners' tables are moe::placement::Table, built from any std::vector<int>: the second
// half below builds one from a vector and checks that it gives the same result.)
//
// Checks: the layer on 4 in-process ranks matches moe::reference_forward; on every rank the
// number of token-expert pairs served locally equals the count from the reference's routes and
// the placement rule written out here; a table naming a rank out of range is refused.
#include <string>

#include "check.hpp"

class Strided {
public:
  Strided(int stride, int ranks) : stride_(stride), ranks_(ranks) {}

  /// The rank that serves expert `expert` (its primary copy).
  [[nodiscard]] int rank_of(int expert) const { return (expert / stride_) % ranks_; }

  /// Throws moe::Error when the policy cannot place `experts` experts on `ranks` ranks.
  void validate(int experts, int ranks) const {
    moe::check(stride_ > 0, "Strided placement: stride must be positive, got ", stride_);
    moe::check(ranks == ranks_, "Strided placement: made for ", ranks_, " ranks, the collective has ", ranks);
    moe::check(experts >= stride_ * ranks, "Strided placement: ", experts, " experts leave a rank empty at stride ",
               stride_);
  }

private:
  int stride_, ranks_;
};
static_assert(moe::placement::Policy<Strided>);

int main() {
  using namespace extending;
  using Router = moe::router::ForModel<Model>;
  constexpr int ranks = 4, tokens = 16;
  bool ok = true;

  Strided strided(4, ranks);
  auto run = run_layer<Router, Strided, moe::replication::None, moe::schedule::Sequential, ranks>(strided, {}, tokens);
  std::printf("Strided(4): relative error %.2e\n", run.relative_error());
  ok &= expect(run.relative_error() < 1e-5, "layer with Strided matches the reference");

  // Pairs served on their own rank, from the reference's routes and the rule (e / 4) mod 4.
  bool local_ok = true;
  for (int r = 0; r < ranks; ++r) {
    long long expected = 0;
    for (int t = r * tokens; t < (r + 1) * tokens; ++t)
      for (int j = 0; j < shape.top_k; ++j)
        expected += (run.ids[static_cast<std::size_t>(t * shape.top_k + j)] / 4) % 4 == r;
    auto const& st = run.stats[static_cast<std::size_t>(r)];
    std::printf("rank %d: %lld of %lld pairs local (expected %lld)\n", r, st.local_assignments, st.assignments, expected);
    local_ok = local_ok && st.local_assignments == expected;
  }
  ok &= expect(local_ok, "local pairs per rank follow the placement");

  // The same layout as a placement::Table from one's own vector: the same output.
  std::vector<int> ranks_of(static_cast<std::size_t>(shape.experts));
  for (int e = 0; e < shape.experts; ++e) ranks_of[static_cast<std::size_t>(e)] = strided.rank_of(e);
  auto as_table = run_layer<Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential, ranks>(
      moe::placement::Table(ranks_of), {}, tokens);
  ok &= expect(as_table.y == run.y, "placement::Table from the same vector gives the same output");

  // A bad table is refused when the layer is built, naming the problem.
  ranks_of[5] = ranks;
  std::string message;
  try {
    (void)run_layer<Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential, ranks>(
        moe::placement::Table(ranks_of), {}, tokens);
  } catch (moe::Error const& e) {
    message = e.what();
  }
  std::printf("bad table: %s\n", message.c_str());
  ok &= expect(message.find("expert 5 on rank 4, outside [0, 4)") != std::string::npos, "a rank out of range is refused");
  return ok ? 0 : 1;
}
