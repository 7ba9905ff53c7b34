// The expert-parallel Layer on InProcess<4> against the single-process reference.
#include <array>

#include "layer_scenarios.hpp"

TEST_CASE("Layer on InProcess<4> equals the single-process reference", "[layer][in_process]") {
  using namespace moe::test;
  for (Case c : all_cases) {
    std::array<std::vector<Outcome>, 4> outcomes;
    moe::collective::run_in_process<4>([&](auto& comm) { outcomes[static_cast<std::size_t>(comm.rank())] = run_case(comm, c); });
    for (int r = 0; r < 4; ++r) check_case(c, r, outcomes[static_cast<std::size_t>(r)]);
  }
}
