#pragma once
// The host layer with replication::BatchSplit (per-batch split of each expert's pairs over its
// copies) on 4 ranks in 2 servers, against the single-process reference; shared by the InProcess
// and MPI tests. The test's own walk of the split (layer_check.hpp) gives the serving rank of every
// pair, so the bytes each rank sends are checked against it too.

#include <algorithm>
#include <span>
#include <string_view>
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

/// A test router (not a model's): softmax top-k, then expert Hot in the last slot of every token that
/// did not pick it, so that one expert takes all tokens. The reference routes with it too.
template <int Hot>
struct EveryTokenTo {
  static constexpr std::string_view name = "every-token-to";
  static constexpr bool fits(ShapeSpec const& s) { return router::SoftmaxTopK::fits(s) && Hot < s.experts; }
  static void route(ShapeSpec const& s, std::span<float const> logits, std::span<float const> bias, std::span<int> ids,
                    std::span<float> weights) {
    router::SoftmaxTopK::route(s, logits, bias, ids, weights);
    auto k = static_cast<std::size_t>(s.top_k);
    if (std::find(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), Hot) == ids.begin() + static_cast<std::ptrdiff_t>(k))
      ids[k - 1] = Hot;
  }
};

/// One case on this rank. `hot`: -1 routes by softmax top-k; 0 or 1 sends every token to that
/// expert as well (expert 0 has a copy on every rank, expert 1 one copy, on rank 1).
template <class Comm>
Outcome run_batch_split_case(Comm& comm, std::vector<int> const& tokens, std::uint64_t seed, int hot = -1) {
  auto copies = batch_split_copies();
  std::vector<int> primary(copies.size());
  for (std::size_t e = 0; e < copies.size(); ++e) primary[e] = copies[e][0];
  Scenario sc{.tokens_per_rank = tokens, .placement = placement::Table(primary), .seed = seed};
  replication::BatchSplit split(copies, joint_cluster());
  if (hot == 0) return run_scenario<JointModel, EveryTokenTo<0>>(comm, sc, split);
  if (hot == 1) return run_scenario<JointModel, EveryTokenTo<1>>(comm, sc, split);
  return run_scenario<JointModel, router::SoftmaxTopK>(comm, sc, split);
}

}  // namespace moe::test
