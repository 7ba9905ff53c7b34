#pragma once
// The host layer with replication::BatchSplit (per-batch split of each expert's pairs over its
// copies) on 4 ranks in 2 servers, against the single-process reference; shared by the InProcess
// and MPI tests. The test's own walk of the split (layer_check.hpp) gives the serving rank of every
// pair, so the bytes each rank sends are checked against it too.

#include <vector>

#include "joint_layer_case.hpp"
#include "moe/replication/batch_split.hpp"

namespace moe::test {

/// Copies of the model's experts on 4 ranks (2 servers of 2): expert e's primary on e % 4, every
/// third expert also on the other server, expert 0 on every rank (a fixed layout, not data).
inline std::vector<std::vector<int>> batch_split_copies() {
  std::vector<std::vector<int>> copies(static_cast<std::size_t>(JointModel::spec.experts));
  for (int e = 0; e < JointModel::spec.experts; ++e) {
    auto& c = copies[static_cast<std::size_t>(e)];
    c = {e % 4};
    if (e == 0) c = {0, 1, 2, 3};
    else if (e % 3 == 0) c.push_back((e % 4 + 2) % 4);
  }
  return copies;
}

/// The token counts per rank of the cases: uneven, one rank with all, one with none, none at all.
inline std::vector<std::vector<int>> batch_split_counts() { return {{13, 7, 0, 20}, {40, 0, 0, 0}, {5, 5, 5, 5}, {0, 0, 0, 0}}; }

template <class Comm>
Outcome run_batch_split_case(Comm& comm, std::vector<int> const& tokens, std::uint64_t seed) {
  auto copies = batch_split_copies();
  std::vector<int> primary(copies.size());
  for (std::size_t e = 0; e < copies.size(); ++e) primary[e] = copies[e][0];
  Scenario sc{.tokens_per_rank = tokens, .placement = placement::Table(primary), .seed = seed};
  return run_scenario<JointModel, router::SoftmaxTopK>(comm, sc, replication::BatchSplit(copies, joint_cluster()));
}

}  // namespace moe::test
