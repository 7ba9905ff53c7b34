#pragma once
// What a schedule (the schedule policy of a moe::Layer) is. Two kinds, and the paths that take them:
//
//   PhasedPolicy         a static run(pass) that calls the pass's phases route(), dispatch(),
//                        compute() and combine() in the order it chooses, once each (the host path
//                        runs any; the device path runs its phases in one fixed order and takes
//                        schedule::Sequential alone)
//   DisaggregatedPolicy  attention and experts on different ranks, pipelined: the type names the
//                        pipeline (FinDEP or PPPipe), the value carries the attention-group size
//                        and the solved configuration (the two disaggregated paths)
//
// A schedule a path cannot honour is a compile-time error of that path naming the schedule.

#include <concepts>
#include <string_view>

#include "moe/schedule/problem.hpp"

namespace moe::schedule {

/// The phases a PhasedPolicy may call (only declared: the concept checks that the calls compile).
struct PassProbe {
  void route();
  void dispatch();
  void compute();
  void combine();
};

template <class S>
concept Named = requires {
  { S::name } -> std::convertible_to<std::string_view>;
};

template <class S>
concept PhasedPolicy = Named<S> && requires(PassProbe& pass) { S::run(pass); };

template <class S>
concept DisaggregatedPolicy = Named<S> && requires(S const& s) {
  { S::pipeline } -> std::convertible_to<Pipeline>;
  { s.ag } -> std::convertible_to<int>;
  { s.config() } -> std::same_as<Config>;
};

template <class S>
concept Policy = PhasedPolicy<S> || DisaggregatedPolicy<S>;

}  // namespace moe::schedule
