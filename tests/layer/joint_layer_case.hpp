#pragma once
// A joint plan (placement/joint.hpp) built from real OLMoE routing statistics, written to a plan
// file and read back; the expert-parallel layer then runs each planned layer on 4 ranks with the
// plan's routing (replication::Routed, rebuilt from the file's copies and the topology), or with
// routing that reacts to each batch (replication::Reactive on the same copies). Shared by the
// in-process and the MPI test.

#include <sstream>
#include <string>

#include "layer_check.hpp"
#include "moe/placement/joint.hpp"
#include "moe/plan/plan_io.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/replication/reactive.hpp"

namespace moe::test {

/// OLMoE routing (64 experts, top-8) at reduced width.
using JointModel = models::Reduced<models::OLMoE_1B_7B, 32, 16, DType::f32>;

/// 2 servers x 2 GPUs on one leaf switch: the cluster of the 4 ranks.
inline topology::Topology joint_cluster() { return topology::fat_tree(1, 2, 2, 1); }

/// The joint plan for the arxiv marginals of OLMoE layers 0, 7 and 15 (per-batch loads drawn from
/// them, seeded), through a plan file.
inline placement::LoadedPlan joint_plan_from_file() {
  auto marginals = profile::marginals_from_olmoe(std::string(MOE_SHARED_DATA_DIR) +
                                                 "/olmoe-routing/olmoe-1b-7b/arxiv/expert_counts.tsv");
  auto prof = profile::sample_profile(marginals, {.batches = 40, .tokens_per_batch = 512, .top_k = 8, .seed = 3});
  auto topo = joint_cluster();
  auto j = placement::joint::plan(topo, prof.totals(), prof.layers(), prof.experts());
  std::stringstream file;
  placement::write_plan(file, j.plan, topo.gpus());
  core::TsvReader reader(file, "joint.plan");
  return placement::read_plan(reader);
}

/// Layer l of the plan on this rank: tokens 13, 7, 0, 20 on ranks 0..3.
template <class Comm>
Outcome run_joint_layer(Comm& comm, placement::LoadedPlan const& plan, std::size_t l) {
  auto topo = joint_cluster();
  auto const& lp = plan.layers[l];
  Scenario sc{.tokens_per_rank = {13, 7, 0, 20}, .placement = lp.placement, .seed = 100 + l};
  return run_scenario<JointModel, router::SoftmaxTopK>(comm, sc, placement::joint::routed_policy(lp.replicas, topo));
}

/// The same layer with replication::Reactive on the plan's copies (balance bound `eps`).
template <class Comm>
Outcome run_reactive_layer(Comm& comm, placement::LoadedPlan const& plan, std::size_t l, double eps = 0.05) {
  auto const& lp = plan.layers[l];
  Scenario sc{.tokens_per_rank = {13, 7, 0, 20}, .placement = lp.placement, .seed = 100 + l};
  return run_scenario<JointModel, router::SoftmaxTopK>(
      comm, sc, replication::Reactive(lp.replicas.replicas(), joint_cluster(), eps));
}

/// Bytes a rank's collectives send for the control of one reactive layer pass on 4 ranks: the
/// all-gather of its per-expert int32 counts to 3 peers, then the record-count all-to-all (one
/// uint64 to each of 3 peers).
constexpr std::size_t reactive_control_bytes = 3 * 64 * 4 + 3 * 8;

}  // namespace moe::test
