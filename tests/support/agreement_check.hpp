#pragma once
// The ranks' agreement on a pass (moe::Layer::run): one rank passes bad arguments, the others good
// ones; every rank must throw, with the same message, and none may be left waiting. Shared by the
// InProcess, MPI and emulated-NCCL tests.

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

/// The host path on any host collective: `bad` passes max_tokens + 1 tokens, the rest max_tokens.
/// Returns this rank's message.
template <class Comm>
std::string host_path_bad_rank(Comm& comm, int bad) {
  using S = AgreementShape;
  using L = Layer<S, router::SoftmaxTopK, placement::Table, replication::None, schedule::Sequential, Comm>;
  static RandomLayerWeights<float> const w(S::spec, 5);
  int const m = 4;
  std::vector<float> x(static_cast<std::size_t>(m + 1) * S::spec.hidden, 0.5f), y(x.size());
  L layer(comm, placement::Table::contiguous(S::spec.experts, comm.size()), {}, w.view(), {.max_tokens = m});
  std::vector<std::byte> ws(layer.workspace_size());
  int tokens = comm.rank() == bad ? m + 1 : m;
  return run_message(layer, {.tokens = tokens, .x = x.data(), .y = y.data()}, ws);
}

/// The host disaggregated path (FinDEP, one attention rank): `bad` passes a token count the
/// schedule cannot split (an AG rank) or tokens it must not hold (an EG rank).
template <class Comm>
std::string disaggregated_path_bad_rank(Comm& comm, int bad) {
  using S = AgreementShape;
  using L = Layer<S, router::SoftmaxTopK, placement::Table, replication::None, schedule::FinDep, Comm>;
  static RandomLayerWeights<float> const w(S::spec, 5);
  int const m = 8, eg = comm.size() - 1;
  std::vector<float> x(static_cast<std::size_t>(m) * S::spec.hidden, 0.5f), y(x.size());
  L layer(comm, placement::Table::round_robin(S::spec.experts, eg), {}, w.view(),
          {.max_tokens = m, .schedule = {.ag = 1, .order = schedule::Order::aass, .r1 = 2, .r2 = 2}});
  std::vector<std::byte> ws(layer.workspace_size());
  bool ag = layer.is_attention_rank();
  int tokens = ag ? (comm.rank() == bad ? 6 : m) : (comm.rank() == bad ? 3 : 0);
  return run_message(layer, {.tokens = tokens, .x = ag ? x.data() : nullptr, .y = ag ? y.data() : nullptr}, ws);
}

}  // namespace moe::test
