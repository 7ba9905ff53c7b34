#pragma once
// The Collective concept: the communication operations the Layer and the schedules use, with one
// rank per participant. Three implementations: InProcess<N> (threads), Mpi (processes), Nccl (GPUs).
//
// Buffers are spans of bytes (or of float for reductions) in the backend's memory space: host
// memory for InProcess and Mpi, device memory for Nccl. Counts are per peer, in bytes for the
// byte-wise operations and in elements for the reductions. Displacements are implied: the blocks
// for peers 0..N-1 lie back to back.
//
// Every implementation counts what it sends so tests can assert volumes. The counts are the bytes a
// rank hands to the network under the textbook algorithms, which is what the papers' volume formulas
// count (with n the bytes of a rank's buffer and N ranks):
//   all_to_all(_v):     the bytes addressed to other ranks (the block addressed to itself is a local copy)
//   reduce_scatter_v:   the bytes of the blocks that belong to other ranks      ((N-1)/N * n when equal)
//   all_gather_v:       (N-1) * the bytes of its own block                       ((N-1)/N * n of the output)
//   all_reduce:         2 (N-1)/N * n (ring: a reduce-scatter then an all-gather)
//   send:               the message size
// A message to oneself is counted in `bytes_self`, never in `bytes_sent`.

#include <array>
#include <concepts>
#include <cstddef>
#include <span>

namespace moe::collective {

/// Operations counted separately.
enum class Op { all_to_all, all_to_all_v, reduce_scatter, all_gather, all_reduce, send, count_ };

struct Counters {
  static constexpr std::size_t ops = static_cast<std::size_t>(Op::count_);
  std::array<std::size_t, ops> bytes{};  ///< bytes sent to other ranks, per operation
  std::array<std::size_t, ops> calls{};  ///< calls, per operation
  std::size_t bytes_self = 0;            ///< bytes a rank addressed to itself (local copies)

  [[nodiscard]] std::size_t bytes_sent() const {
    std::size_t total = 0;
    for (auto b : bytes) total += b;
    return total;
  }
  [[nodiscard]] std::size_t operator[](Op op) const { return bytes[static_cast<std::size_t>(op)]; }
  void add(Op op, std::size_t sent) {
    bytes[static_cast<std::size_t>(op)] += sent;
    calls[static_cast<std::size_t>(op)] += 1;
  }
};

/// Memory space a collective's buffers live in.
enum class Memory { host, device };

template <class C>
concept Collective = requires(C& c, C const& cc, std::span<std::byte const> in, std::span<std::byte> out,
                              std::span<std::size_t const> counts, std::span<float const> fin,
                              std::span<float> fout, std::size_t block, int peer, int tag) {
  { C::memory } -> std::convertible_to<Memory>;
  { cc.rank() } -> std::same_as<int>;
  { cc.size() } -> std::same_as<int>;
  c.all_to_all(in, out, block);               // the same `block` bytes to every peer
  c.all_to_all_v(in, counts, out, counts);    // send counts, then receive counts (bytes per peer)
  c.reduce_scatter_v(fin, fout, counts);      // sum; counts = elements each rank keeps
  c.all_gather_v(in, out, counts);            // counts = bytes each rank contributes
  c.all_reduce(fout);                         // in place sum
  c.send(in, peer, tag);
  c.recv(out, peer, tag);
  c.barrier();
  { cc.counters() } -> std::convertible_to<Counters const&>;
  c.reset_counters();
};

}  // namespace moe::collective
