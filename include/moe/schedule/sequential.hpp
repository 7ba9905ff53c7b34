#pragma once
// Schedule policy (schedule::Policy) `schedule::Sequential`: the phases of one forward pass run one after the
// other on the whole batch (route, dispatch, expert compute, combine). FinDEP and PPPipe reorder and
// split these phases (see schedule/findep*.hpp).

#include <concepts>
#include <string_view>

namespace moe::schedule {

/// A pipeline schedule names itself and drives the phases of a forward pass.
template <class S>
concept Policy = requires {
  { S::name } -> std::convertible_to<std::string_view>;
};

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

static_assert(Policy<Sequential>);

}  // namespace moe::schedule
