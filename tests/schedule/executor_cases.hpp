#pragma once
// The FinDEP executor scenarios run by both the InProcess and the MPI tests. A scenario runs on
// every rank of a collective (run_executor_cases) and returns this rank's errors; the checks happen
// afterwards (on the test thread for InProcess, since Catch2's assertions are not thread-safe, and
// on each process for MPI after the worst error over the ranks is agreed).
//
// For one model and one AG/EG split of the collective's ranks, every AG rank holds 24 tokens (seeded
// normal values). The executor runs every configuration of configs() (FinDEP AASS and ASAS over
// several (r1, r2), PPPipe over several r1) with ONE executor object, so tags and buffers are
// reused across runs. Each AG rank's output is compared with two independent references:
//   - moe::reference_forward on the same tokens in one process (token by token, no communication);
//   - the expert-parallel moe::Layer with the Sequential schedule over ALL ranks of the same
//     collective (tokens spread over every rank, round-robin expert placement), gathered with
//     all_gather_v.
// The error is the normwise relative error max|y - ref| / max|ref| over the rank's tokens.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "moe/layer/paths/host.hpp"
#include "moe/layer/reference.hpp"
#include "moe/models/models.hpp"
#include "../support/textbook.hpp"
#include "moe/layer/findep_executor.hpp"

namespace moe::test::findep {

using namespace moe::schedule;

// DeepSeek-V2 routing (160 experts, top-6, 8 groups / 3, 2 shared experts) and Mixtral routing
// (8 experts, top-2, no shared expert) at reduced widths, fp32.
using DeepSeekSmall = models::Reduced<models::DeepSeekV2, 64, 32, DType::f32>;
using MixtralSmall = models::Reduced<models::Mixtral8x7B, 64, 48, DType::f32>;

inline constexpr int tokens_per_ag = 24;
inline constexpr double tolerance = 1e-5;

inline std::vector<float> random_tokens(int tokens, int hidden, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(tokens) * static_cast<std::size_t>(hidden));
  for (auto& v : x) v = d(rng);
  return x;
}

inline double rel_error(float const* a, float const* b, std::size_t n) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

/// Expert e on rank e * ranks / experts: contiguous blocks of nearly equal size (any rank count).
inline placement::Table blocks(int experts, int ranks) {
  std::vector<int> table(static_cast<std::size_t>(experts));
  for (int e = 0; e < experts; ++e)
    table[static_cast<std::size_t>(e)] = static_cast<int>(static_cast<long long>(e) * ranks / experts);
  return placement::Table(table);
}

/// The configurations tried: every (r1, r2) below divides the 24 tokens of an AG rank.
inline std::vector<Config> configs() {
  std::vector<Config> out;
  std::pair<int, int> const pairs[] = {{1, 1}, {1, 4}, {2, 3}, {3, 2}, {4, 3}, {6, 4}, {24, 1}};
  for (auto [r1, r2] : pairs)
    for (Order o : {Order::aass, Order::asas}) out.push_back(Config{Pipeline::findep, o, r1, 1, r2});
  for (int r1 : {1, 2, 3, 8}) out.push_back(Config{Pipeline::pppipe, Order::asas, r1, 1, 1});
  return out;
}

inline std::string describe(Config const& c, int ag, int eg) {
  std::ostringstream o;
  o << pipeline_name(c.pipeline) << " " << order_name(c.order) << " r1 " << c.r1 << " r2 " << c.r2 << ", " << ag
    << " AG + " << eg << " EG ranks";
  return o.str();
}

/// One rank's outcome of one configuration (AG ranks; EG ranks report nothing).
struct Result {
  std::string what;
  double vs_reference = 0;  ///< against moe::reference_forward
  double vs_textbook = 0;   ///< against the independent fp64 textbook layer (tests/support/textbook.hpp)
  double vs_layer = 0;      ///< against the sequential moe::Layer on the same collective
};

/// Runs every configuration of configs() on this rank with `ag` AG ranks; returns one Result per
/// configuration on an AG rank (the same list, with zero errors, on an EG rank so that every rank
/// holds as many entries). Every rank of `comm` must call it with the same arguments.
template <class Model, class Comm>
std::vector<Result> run_executor_cases(Comm& comm, int ag, std::uint64_t seed) {
  using Router = router::ForModel<Model>;
  constexpr ShapeSpec s = Model::spec;
  int world = comm.size(), rank = comm.rank(), eg = world - ag;
  auto h = static_cast<std::size_t>(s.hidden);
  RandomLayerWeights<float> weights(s, seed);
  int total = ag * tokens_per_ag;
  auto x = random_tokens(total, s.hidden, seed + 7);

  // The sequential expert-parallel Layer over every rank; rank r holds tokens [lo(r), lo(r + 1)).
  auto lo = [&](int r) { return static_cast<int>(static_cast<long long>(total) * r / world); };
  std::vector<float> y_layer(x.size());
  {
    using Lyr = Layer<Model, Router, placement::Table, replication::None, schedule::Sequential, Comm>;
    placement::Table ep = placement::Table::round_robin(s.experts, world);
    auto view = weights.view();
    auto local = weights.experts_where([&](int e) { return ep.rank_of(e) == rank; });
    view.experts = local;
    int mine = lo(rank + 1) - lo(rank), most = 1;
    for (int r = 0; r < world; ++r) most = std::max(most, lo(r + 1) - lo(r));
    Lyr layer(comm, ep, replication::None{}, view, {.max_tokens = most});
    std::vector<std::byte> ws(layer.workspace_size());
    std::vector<float> y(static_cast<std::size_t>(mine) * h);
    std::size_t first = static_cast<std::size_t>(lo(rank)) * h;
    layer.run({.tokens = mine, .x = x.data() + first, .y = y.data(), .first_token = lo(rank)}, ws);
    std::vector<std::size_t> counts(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r)
      counts[static_cast<std::size_t>(r)] = static_cast<std::size_t>(lo(r + 1) - lo(r)) * h * sizeof(float);
    comm.all_gather_v(std::as_bytes(std::span(y)), std::as_writable_bytes(std::span(y_layer)), counts);
  }

  // The executor: an AG rank holds the router and the shared experts, an EG rank only its experts.
  placement::Table on_eg = ag % 2 ? placement::Table::round_robin(s.experts, eg)
                                  : blocks(s.experts, eg);
  bool is_ag = rank < ag;
  auto view = weights.view();
  std::vector<ExpertWeights<float>> experts(static_cast<std::size_t>(s.experts));
  std::vector<ExpertWeights<float>> no_shared(static_cast<std::size_t>(s.shared_experts));
  if (!is_ag) {
    experts = weights.experts_where([&](int e) { return on_eg.rank_of(e) == rank - ag; });
    view.router = nullptr;
    view.router_bias = nullptr;
    view.shared = no_shared;
  }
  view.experts = experts;
  FinDepExecutor<Router, float, Comm> ex(comm, s, ag, on_eg, view, tokens_per_ag);
  std::vector<std::byte> ws(ex.workspace_size());  // caller-owned, reused by every run

  std::size_t first = is_ag ? static_cast<std::size_t>(rank) * tokens_per_ag * h : 0;
  std::size_t n = is_ag ? static_cast<std::size_t>(tokens_per_ag) * h : 0;
  std::vector<float> ref(n);
  if (is_ag) reference_forward<Router>(s, weights.view(), tokens_per_ag, x.data() + first, ref.data());
  auto book = is_ag ? textbook::forward(s, weights.view(), tokens_per_ag, x.data() + first) : std::vector<double>{};

  std::vector<Result> out;
  for (Config const& c : configs()) {
    std::vector<float> y(n, -1.0f);
    typename FinDepExecutor<Router, float, Comm>::Arguments a;
    if (is_ag) a = {tokens_per_ag, x.data() + first, y.data()};
    ex.run(a, c, ws);
    Result r{describe(c, ag, eg)};
    if (is_ag) {
      r.vs_reference = rel_error(y.data(), ref.data(), n);
      r.vs_layer = rel_error(y.data(), y_layer.data() + first, n);
      r.vs_textbook = textbook::relative_error(y.data(), book.data(), n);
    }
    out.push_back(r);
  }
  return out;
}

/// Bad input on ONE rank: every rank runs the executor with r1 = 2 and 24 tokens per AG rank,
/// except `bad_rank`, which is given 23 tokens (an AG rank: r1 does not divide them) or one token
/// (an EG rank: tokens live on the AG ranks). Returns the message of the moe::Error this rank
/// caught ("" when run() returned). Every rank must throw: if the others did not learn of the
/// bad rank, they would wait for its messages forever (the test would then time out).
template <class Model, class Comm>
std::string reject_on_one_rank(Comm& comm, int ag, int bad_rank) {
  using Router = router::ForModel<Model>;
  constexpr ShapeSpec s = Model::spec;
  RandomLayerWeights<float> weights(s, 77);
  FinDepExecutor<Router, float, Comm> ex(comm, s, ag, blocks(s.experts, comm.size() - ag), weights.view(),
                                         tokens_per_ag);
  auto x = random_tokens(tokens_per_ag, s.hidden, 78);
  std::vector<float> y(x.size());
  typename FinDepExecutor<Router, float, Comm>::Arguments a;
  bool is_ag = comm.rank() < ag;
  if (is_ag) a = {comm.rank() == bad_rank ? tokens_per_ag - 1 : tokens_per_ag, x.data(), y.data()};
  else if (comm.rank() == bad_rank) a.tokens = 1;
  try {
    ex.run(a, Config{Pipeline::findep, Order::aass, 2, 1, 2});
  } catch (Error const& e) {
    return e.what();
  }
  return "";
}

}  // namespace moe::test::findep
