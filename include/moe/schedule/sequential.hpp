#pragma once
// The schedule `schedule::Sequential` (schedule::PhasedPolicy, schedule/policy.hpp): the phases of
// one forward pass run one after the other on the whole batch (route, dispatch, expert compute,
// combine). FinDEP and PPPipe split them over two groups of ranks (schedule/disaggregated.hpp).

#include <string_view>

#include "moe/schedule/policy.hpp"

namespace moe::schedule {

struct Sequential {
  static constexpr std::string_view name = "sequential";

  template <class Pass>
  static void run(Pass& pass) {
    pass.route();
    pass.dispatch();
    pass.compute();
    pass.combine();
  }
};

static_assert(PhasedPolicy<Sequential>);

}  // namespace moe::schedule
