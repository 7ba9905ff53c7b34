#pragma once
// Schedule policies of the disaggregated moe::Layer (include/moe/layer/host_disaggregated.hpp and
// device_disaggregated.cuh): the pipeline is picked at compile time by the type, the solved
// configuration travels as its value, in the layer's options.
//
//   using S = moe::schedule::FinDep;                        // or moe::schedule::PPPipe
//   S sched = S::from(moe::schedule::solve_findep(problem, models).config, problem.ag);
//   moe::Layer<Model, Router, Placement, moe::replication::None, S, Comm> layer(
//       comm, on_eg, {}, weights, {.max_tokens = n, .schedule = sched});
//
// `ag` is the size of the attention group: ranks [0, ag) of the collective hold the tokens, the
// router and the shared experts; ranks [ag, size) form the expert group. r1 micro-batches per AG
// rank (r1 must divide an AG rank's tokens), r2 token chunks per micro-batch (FinDEP only).

#include <concepts>
#include <string_view>

#include "moe/config.hpp"
#include "moe/schedule/problem.hpp"
#include "moe/schedule/policy.hpp"
#include "moe/schedule/sequential.hpp"

namespace moe::schedule {

/// A schedule policy for a disaggregated (AG / EG) layer: a Policy that names its pipeline and
/// carries the AG size and the configuration to run.
template <Pipeline P>
struct DisaggregatedSchedule {
  static constexpr Pipeline pipeline = P;
  static constexpr std::string_view name = P == Pipeline::findep ? "findep" : "pppipe";

  int ag = 1;                 ///< attention-group ranks (the first ag ranks of the collective)
  Order order = Order::asas;  ///< AASS or ASAS (PPPipe always alternates: A S A S)
  int r1 = 1;                 ///< micro-batches per AG rank
  int r2 = 1;                 ///< token chunks per micro-batch (PPPipe: 1)

  /// The executor's configuration (m_a is not used by the executor: a micro-batch is tokens / r1).
  [[nodiscard]] Config config() const { return Config{P, P == Pipeline::pppipe ? Order::asas : order, r1, 1, r2}; }

  /// Takes order, r1 and r2 from a solver's configuration (solve_findep / solve_pppipe).
  [[nodiscard]] static DisaggregatedSchedule from(Config const& c, int ag) {
    check(c.pipeline == P, "schedule::", name, ": the configuration is a ", pipeline_name(c.pipeline),
          " schedule, not ", pipeline_name(P));
    return DisaggregatedSchedule{ag, c.order, c.r1, c.r2};
  }
};

using FinDep = DisaggregatedSchedule<Pipeline::findep>;
using PPPipe = DisaggregatedSchedule<Pipeline::pppipe>;

static_assert(DisaggregatedPolicy<FinDep> && DisaggregatedPolicy<PPPipe>);
static_assert(!DisaggregatedPolicy<Sequential>);

}  // namespace moe::schedule
