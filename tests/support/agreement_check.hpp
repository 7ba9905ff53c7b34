#pragma once
// The ranks' agreement on a pass (moe::Layer::run): one rank passes bad arguments, or was built with
// other tables, the others good ones; every rank must throw, with the same message, and none may be
// left waiting. Shared by the InProcess and MPI tests.

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "moe/moe.hpp"

namespace moe::test {

/// A small host shape for the agreement tests: 8 experts of top-2.
using AgreementShape = models::Reduced<models::Mixtral8x7B, 16, 8, DType::f32>;

/// What run() threw on this rank ("" when it returned).
template <class L>
std::string run_message(L& layer, typename L::Arguments const& args, std::span<std::byte> ws) {
  try {
    layer.run(args, ws);
  } catch (Error const& e) {
    return e.what();
  }
  return {};
}

/// Every rank's message, gathered over a host collective (fixed 512-byte blocks).
template <class Comm>
std::vector<std::string> gather_messages(Comm& comm, std::string const& mine) {
  constexpr std::size_t block = 512;
  std::vector<char> in(block, '\0'), out(block * static_cast<std::size_t>(comm.size()), '\0');
  std::memcpy(in.data(), mine.data(), std::min(mine.size(), block - 1));
  std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()), block);
  comm.all_gather_v(std::as_bytes(std::span(in)), std::as_writable_bytes(std::span(out)), counts);
  std::vector<std::string> all;
  for (int r = 0; r < comm.size(); ++r) all.emplace_back(out.data() + static_cast<std::size_t>(r) * block);
  return all;
}

/// One pass of the host path with replication::Table on any host collective, `max_tokens` 4: this
/// rank passes `tokens` tokens from `first_token`, on a layer built from `placement` and `copies`.
/// Returns this rank's message.
template <class Comm>
std::string host_pass(Comm& comm, placement::Table const& placement, std::vector<std::vector<int>> const& copies,
                      int tokens, int first_token) {
  using S = AgreementShape;
  using L = Layer<S, router::SoftmaxTopK, placement::Table, replication::Table, schedule::Sequential, Comm>;
  static RandomLayerWeights<float> const w(S::spec, 5);
  int const m = 4;
  std::vector<float> x(static_cast<std::size_t>(m + 1) * S::spec.hidden, 0.5f), y(x.size());
  L layer(comm, placement, replication::Table(copies), w.view(), {.max_tokens = m});
  std::vector<std::byte> ws(layer.workspace_size());
  return run_message(layer, {.tokens = tokens, .x = x.data(), .y = y.data(), .first_token = first_token}, ws);
}

/// One pass of the host disaggregated path (FinDEP, one attention rank, `max_tokens` 8) built from
/// `placement` over the expert-group ranks: an attention rank passes `ag_tokens`, an expert-group
/// rank `eg_tokens`. Returns this rank's message.
template <class Comm>
std::string disaggregated_pass(Comm& comm, placement::Table const& placement, int ag_tokens, int eg_tokens) {
  using S = AgreementShape;
  using L = Layer<S, router::SoftmaxTopK, placement::Table, replication::None, schedule::FinDep, Comm>;
  static RandomLayerWeights<float> const w(S::spec, 5);
  int const m = 8;
  std::vector<float> x(static_cast<std::size_t>(m) * S::spec.hidden, 0.5f), y(x.size());
  L layer(comm, placement, {}, w.view(),
          {.max_tokens = m, .schedule = {.ag = 1, .order = schedule::Order::aass, .r1 = 2, .r2 = 2}});
  std::vector<std::byte> ws(layer.workspace_size());
  bool ag = layer.is_attention_rank();
  return run_message(layer,
                     {.tokens = ag ? ag_tokens : eg_tokens, .x = ag ? x.data() : nullptr, .y = ag ? y.data() : nullptr},
                     ws);
}

/// Each expert on the rank of placement::Table::contiguous, one copy each.
inline std::vector<std::vector<int>> primary_copies(placement::Table const& placement, int experts) {
  std::vector<std::vector<int>> copies(static_cast<std::size_t>(experts));
  for (int e = 0; e < experts; ++e) copies[static_cast<std::size_t>(e)] = {placement.rank_of(e)};
  return copies;
}

/// The host path: `bad` passes max_tokens + 1 tokens, the rest max_tokens. Returns this rank's message.
template <class Comm>
std::string host_path_bad_rank(Comm& comm, int bad) {
  int const experts = AgreementShape::spec.experts;
  auto placement = placement::Table::contiguous(experts, comm.size());
  return host_pass(comm, placement, primary_copies(placement, experts), comm.rank() == bad ? 5 : 4, 0);
}

/// The host disaggregated path: `bad` passes a token count the schedule cannot split (an AG rank)
/// or tokens it must not hold (an EG rank).
template <class Comm>
std::string disaggregated_path_bad_rank(Comm& comm, int bad) {
  bool me = comm.rank() == bad;
  return disaggregated_pass(comm, placement::Table::round_robin(AgreementShape::spec.experts, comm.size() - 1),
                            me ? 6 : 8, me ? 3 : 0);
}

/// The host path, every pass good: rank `odd` builds its layer with another copy list than the
/// others (expert 0 also on the last rank). Returns this rank's message.
template <class Comm>
std::string host_path_other_tables(Comm& comm, int odd) {
  int const experts = AgreementShape::spec.experts;
  auto placement = placement::Table::contiguous(experts, comm.size());
  auto copies = primary_copies(placement, experts);
  if (comm.rank() == odd) copies[0].push_back(comm.size() - 1);
  return host_pass(comm, placement, copies, 4, 4 * comm.rank());
}

/// The host disaggregated path, every pass good: rank `odd` places experts 0 and 1 on each other's
/// expert-group rank. Returns this rank's message.
template <class Comm>
std::string disaggregated_path_other_tables(Comm& comm, int odd) {
  int const experts = AgreementShape::spec.experts, eg = comm.size() - 1;
  std::vector<int> t(static_cast<std::size_t>(experts));
  for (int e = 0; e < experts; ++e) t[static_cast<std::size_t>(e)] = e % eg;
  if (comm.rank() == odd) std::swap(t[0], t[1]);
  return disaggregated_pass(comm, placement::Table(t), 8, 0);
}

/// What every rank must throw when rank `odd` was built with other tables than the others: the
/// first rank whose tables differ from rank 0's is named (rank 1 when rank 0 is the odd one).
inline std::string other_tables_message(int odd) {
  return detail::concat("every rank must build its layer with the same placement and replica tables: rank ",
                        odd == 0 ? 1 : odd, "'s differ from rank 0's");
}

}  // namespace moe::test
