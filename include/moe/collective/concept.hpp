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
#include <numeric>
#include <span>

#include "moe/config.hpp"

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

namespace detail {

inline std::size_t sum(std::span<std::size_t const> v) { return std::accumulate(v.begin(), v.end(), std::size_t{0}); }

/// The argument checks and the volume accounting every Collective implementation shares, so all
/// backends reject the same bad calls with the same messages and count bytes the same way.
class Ledger {
public:
  Ledger(int rank, int size) : rank_(rank), size_(size) {}

  [[nodiscard]] Counters const& counters() const { return counters_; }
  void reset() { counters_ = {}; }

  struct Totals {
    std::size_t send = 0, recv = 0;
  };
  /// all_to_all(_v): counts per peer in bytes. Returns the send and receive totals.
  Totals exchange(Op op, std::size_t in_bytes, std::span<std::size_t const> send_counts, std::size_t out_bytes,
                  std::span<std::size_t const> recv_counts) {
    check(send_counts.size() == ranks() && recv_counts.size() == ranks(), "all_to_all: need ", size_,
          " send and receive counts, got ", send_counts.size(), " and ", recv_counts.size());
    Totals t{sum(send_counts), sum(recv_counts)};
    check(t.send <= in_bytes, "all_to_all: send counts add up to ", t.send, " bytes but the send buffer holds ",
          in_bytes);
    check(t.recv <= out_bytes, "all_to_all: receive counts add up to ", t.recv,
          " bytes but the receive buffer holds ", out_bytes);
    std::size_t self = send_counts[me()];
    counters_.add(op, t.send - self);
    counters_.bytes_self += self;
    return t;
  }

  struct Slice {
    std::size_t offset = 0, count = 0, total = 0;
  };
  /// reduce_scatter_v: counts in elements of `element` bytes. Returns this rank's slice of the input.
  Slice reduce_scatter(std::size_t in_elements, std::size_t out_elements, std::span<std::size_t const> counts,
                       std::size_t element) {
    check(counts.size() == ranks(), "reduce_scatter_v: ", counts.size(), " counts for ", size_, " ranks");
    Slice s{sum(counts.first(me())), counts[me()], sum(counts)};
    check(in_elements == s.total, "reduce_scatter_v: input holds ", in_elements, " elements but the counts add up to ",
          s.total);
    check(out_elements >= s.count, "reduce_scatter_v: output holds ", out_elements, " elements, rank ", rank_,
          " receives ", s.count);
    counters_.add(Op::reduce_scatter, (s.total - s.count) * element);
    counters_.bytes_self += s.count * element;
    return s;
  }

  /// all_gather_v: counts in bytes. Returns the total.
  std::size_t all_gather(std::size_t in_bytes, std::size_t out_bytes, std::span<std::size_t const> counts) {
    check(counts.size() == ranks(), "all_gather_v: ", counts.size(), " counts for ", size_, " ranks");
    check(in_bytes == counts[me()], "all_gather_v: rank ", rank_, " contributes ", in_bytes,
          " bytes but its count says ", counts[me()]);
    std::size_t total = sum(counts);
    check(out_bytes >= total, "all_gather_v: output holds ", out_bytes, " bytes, needs ", total);
    counters_.add(Op::all_gather, (ranks() - 1) * in_bytes);
    counters_.bytes_self += in_bytes;
    return total;
  }

  void all_reduce(std::size_t bytes) { counters_.add(Op::all_reduce, 2 * (ranks() - 1) * bytes / ranks()); }

  void send(int peer, std::size_t bytes) {
    check_peer(peer, "send");
    if (peer == rank_) {
      counters_.bytes_self += bytes;
    } else {
      counters_.add(Op::send, bytes);
    }
  }
  void check_peer(int peer, char const* what) const {
    check(peer >= 0 && peer < size_, what, ": peer ", peer, " out of range [0, ", size_, ")");
  }

private:
  [[nodiscard]] std::size_t ranks() const { return static_cast<std::size_t>(size_); }
  [[nodiscard]] std::size_t me() const { return static_cast<std::size_t>(rank_); }

  int rank_;
  int size_;
  Counters counters_;
};

}  // namespace detail

/// Memory space a collective's buffers live in.
enum class Memory { host, device };

/// The least a Layer needs to know of its communication backend: the memory space and the ranks.
/// (SingleGpu, collective/single_gpu.hpp, is a Communicator and nothing more: one GPU, nothing to
/// exchange.)
template <class C>
concept Communicator = requires(C const& cc) {
  { C::memory } -> std::convertible_to<Memory>;
  { cc.rank() } -> std::same_as<int>;
  { cc.size() } -> std::same_as<int>;
};

// The capabilities, each with the layer paths that need it:
//
//   capability      operations                            needed by
//   Exchange        all_to_all, all_to_all_v,             host path; device path on more than one
//                   all_gather_v, counters                rank; every path's agreement on a pass
//   PointToPoint    send, recv (tagged)                   both disaggregated paths
//   Reduce          reduce_scatter_v, all_reduce          the shuffled layer (s-MoE), the planners'
//                                                         collective tests
//   StreamOrdered   set_stream(stream): operations are    the device paths (with Memory::device)
//                   enqueued on the caller's stream
//   Duplicable      duplicate(): a second communicator    the device disaggregated path's
//                   over the same ranks                   one-communicator constructor

template <class C>
concept Exchange = Communicator<C> && requires(C& c, C const& cc, std::span<std::byte const> in,
                                               std::span<std::byte> out, std::span<std::size_t const> counts,
                                               std::size_t block) {
  c.all_to_all(in, out, block);             // the same `block` bytes to every peer
  c.all_to_all_v(in, counts, out, counts);  // send counts, then receive counts (bytes per peer)
  c.all_gather_v(in, out, counts);          // counts = bytes each rank contributes
  { cc.counters() } -> std::convertible_to<Counters const&>;
  c.reset_counters();
};

template <class C>
concept PointToPoint = Communicator<C> && requires(C& c, std::span<std::byte const> in, std::span<std::byte> out,
                                                   int peer, int tag) {
  c.send(in, peer, tag);
  c.recv(out, peer, tag);
};

template <class C>
concept Reduce = Communicator<C> && requires(C& c, std::span<float const> fin, std::span<float> fout,
                                             std::span<std::size_t const> counts) {
  c.reduce_scatter_v(fin, fout, counts);  // sum; counts = elements each rank keeps
  c.all_reduce(fout);                     // in place sum
};

template <class C, class Stream>
concept StreamOrdered = Communicator<C> && requires(C& c, Stream s) { c.set_stream(s); };

template <class C>
concept Duplicable = Communicator<C> && requires(C const& c) {
  { c.duplicate() } -> std::same_as<C>;
};

/// Everything at once: what InProcess, Mpi and Nccl are.
template <class C>
concept Collective = Exchange<C> && PointToPoint<C> && Reduce<C> && requires(C& c) { c.barrier(); };

}  // namespace moe::collective
