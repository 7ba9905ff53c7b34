#pragma once
// Replica policy `replication::Routed`: which copy serves a token depends on where the token is.
// For every (source server, expert) the policy holds the copies that serve that server's tokens and
// the share of them each copy takes; a token picks its copy by a hash of its index against the
// cumulative shares, so over many tokens every copy receives its share, and a rank reproduces the
// choice from (source rank, token) alone. replication::Table picks among all copies whatever their
// distance; the joint planner (placement/joint.hpp) computes shares that keep tokens as close to
// their copies as balance allows.
//
// Host layer only: the CUDA layer's device tables implement replication::Table's rule.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "moe/config.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/topology/topology.hpp"

namespace moe::replication {

/// One (copy, share) entry of a route: the GPU of the copy and the fraction of the tokens it takes.
struct RouteShare {
  int gpu = 0;
  double share = 0;
};

class Routed {
 public:
  Routed() = default;
  /// `replicas`: copies per expert (as replication::Table); `routes[s][e]`: the copies serving
  /// server s's tokens of expert e with their shares (each a copy of e, shares > 0 summing to 1).
  Routed(std::vector<std::vector<int>> replicas, topology::Topology const& topo,
         std::vector<std::vector<std::vector<RouteShare>>> const& routes)
      : table_(std::move(replicas)) {
    check(topo.finalized(), "routed replicas: the topology is not finalized");
    G_ = topo.gpus();
    int S = topo.servers();
    auto E = table_.replicas().size();
    check(routes.size() == static_cast<std::size_t>(S), "routed replicas: routes for ", routes.size(),
          " servers, the topology has ", S);
    for (int g = 0; g < G_; ++g) server_.push_back(topo.server_of(g));
    first_.push_back(0);
    for (int s = 0; s < S; ++s) {
      check(routes[static_cast<std::size_t>(s)].size() == E, "routed replicas: server ", s, " has routes for ",
            routes[static_cast<std::size_t>(s)].size(), " experts, expected ", E);
      for (std::size_t e = 0; e < E; ++e) {
        double sum = 0;
        for (auto const& r : routes[static_cast<std::size_t>(s)][e]) {
          check(table_.holds(static_cast<int>(e), 0, r.gpu), "routed replicas: server ", s, " routes expert ", e,
                " to GPU ", r.gpu, ", which holds no copy of it");
          check(std::isfinite(r.share) && r.share > 0, "routed replicas: server ", s, ", expert ", e, ": share ",
                r.share, " of GPU ", r.gpu, " is not positive");
          sum += r.share;
          entries_.push_back({r.gpu, sum});
        }
        check(!routes[static_cast<std::size_t>(s)][e].empty() && std::abs(sum - 1.0) < 1e-9, "routed replicas: server ",
              s, ", expert ", e, ": shares sum to ", sum, ", not 1");
        entries_.back().share = 1.0;  // cumulative: the last entry closes the interval exactly
        first_.push_back(static_cast<long long>(entries_.size()));
      }
    }
  }

  /// The copies serving `source_rank`'s tokens of `expert`, with cumulative shares (last = 1).
  [[nodiscard]] std::span<RouteShare const> route(int expert, int source_rank) const {
    auto i = static_cast<std::size_t>(server_[static_cast<std::size_t>(source_rank)]) * table_.replicas().size() +
             static_cast<std::size_t>(expert);
    return {entries_.data() + first_[i], static_cast<std::size_t>(first_[i + 1] - first_[i])};
  }

  /// A point in [0, 1) for a token: a multiplicative hash of (token, rank), so consecutive tokens of
  /// a rank spread evenly over the interval.
  [[nodiscard]] static double token_point(int source_rank, long long token) {
    auto x = static_cast<std::uint64_t>(token) * 0x9E3779B97F4A7C15ULL +
             static_cast<std::uint64_t>(source_rank) * 0xD1B54A32D192ED03ULL;
    return static_cast<double>(x >> 11) * 0x1.0p-53;
  }

  [[nodiscard]] int choose(int expert, int, int source_rank, long long token) const {
    auto r = route(expert, source_rank);
    if (r.size() == 1) return r[0].gpu;
    double u = token_point(source_rank, token);
    for (auto const& c : r)
      if (u < c.share) return c.gpu;
    return r.back().gpu;
  }
  [[nodiscard]] bool holds(int expert, int primary, int rank) const { return table_.holds(expert, primary, rank); }
  void validate(int experts, int ranks, std::span<int const> placement) const {
    check(ranks == G_, "routed replicas: built for ", G_, " GPUs, the layer has ", ranks, " ranks");
    table_.validate(experts, ranks, placement);
  }
  [[nodiscard]] Table const& table() const { return table_; }

 private:
  Table table_;
  int G_ = 0;
  std::vector<int> server_;
  std::vector<long long> first_;
  std::vector<RouteShare> entries_;  ///< share = cumulative share
};

static_assert(Policy<Routed>);

}  // namespace moe::replication
