#pragma once
// collective::Nccl: one rank per GPU over an NCCL communicator. Buffers are device memory and every
// operation is enqueued on the stream set with set_stream(); nothing here synchronises the host
// except barrier(). Compiles with g++ (it needs only the CUDA runtime and NCCL headers); world size
// 1 runs on a single GPU.
//
// Bootstrapping: either pass a communicator the host engine already owns (not destroyed here), or
// create one from an ncclUniqueId that rank 0 made and the others received (collective/nccl_mpi.hpp
// broadcasts it over MPI).

#include <cuda_runtime.h>
#include <nccl.h>

#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"

namespace moe::collective {

namespace detail {
inline void nccl_call(ncclResult_t r, char const* what) {
  if (r != ncclSuccess) fail(what, " failed: ", ncclGetErrorString(r));
}
inline void cuda_call(cudaError_t r, char const* what) {
  if (r != cudaSuccess) fail(what, " failed: ", cudaGetErrorString(r));
}
}  // namespace detail

class Nccl {
public:
  static constexpr Memory memory = Memory::device;

  /// Wraps a communicator owned by the caller.
  explicit Nccl(ncclComm_t comm, cudaStream_t stream = nullptr) : comm_(comm), stream_(stream) { init(); }

  /// Creates (and owns) a communicator of `size` ranks from a shared unique id.
  static Nccl create(int rank, int size, ncclUniqueId const& id, cudaStream_t stream = nullptr) {
    check(size > 0 && rank >= 0 && rank < size, "Nccl::create: rank ", rank, " of ", size, " is invalid");
    ncclComm_t comm = nullptr;
    detail::nccl_call(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
    Nccl n(comm, stream);
    n.owns_ = true;
    return n;
  }

  /// A fresh unique id (call on rank 0 and share it).
  static ncclUniqueId unique_id() {
    ncclUniqueId id;
    detail::nccl_call(ncclGetUniqueId(&id), "ncclGetUniqueId");
    return id;
  }

  /// A second communicator over the same ranks, owned by the result (ncclCommSplit with one colour
  /// and the same rank order), for work that must not queue behind this one's operations (NCCL runs
  /// the operations of one communicator in issue order). A collective call: every rank calls it.
  [[nodiscard]] Nccl duplicate() const {
    ncclComm_t comm = nullptr;
    detail::nccl_call(ncclCommSplit(comm_, 0, rank_, &comm, nullptr), "ncclCommSplit");
    check(comm != nullptr, "Nccl::duplicate: ncclCommSplit returned no communicator");
    Nccl n(comm, stream_);
    n.owns_ = true;
    return n;
  }

  Nccl(Nccl const&) = delete;
  Nccl& operator=(Nccl const&) = delete;
  Nccl(Nccl&& o) noexcept { *this = std::move(o); }
  Nccl& operator=(Nccl&& o) noexcept {
    std::swap(comm_, o.comm_);
    std::swap(stream_, o.stream_);
    std::swap(rank_, o.rank_);
    std::swap(size_, o.size_);
    std::swap(owns_, o.owns_);
    std::swap(scratch_, o.scratch_);
    std::swap(ledger_, o.ledger_);
    return *this;
  }
  ~Nccl() {
    if (scratch_) cudaFree(scratch_);
    if (owns_ && comm_) ncclCommDestroy(comm_);
  }

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] ncclComm_t comm() const { return comm_; }
  [[nodiscard]] cudaStream_t stream() const { return stream_; }
  void set_stream(cudaStream_t s) { stream_ = s; }
  [[nodiscard]] Counters const& counters() const { return ledger_.counters(); }
  void reset_counters() { ledger_.reset(); }

  /// A one-element all-reduce, then a wait for the stream: every rank has arrived.
  void barrier() {
    detail::nccl_call(ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce");
    detail::cuda_call(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  void all_to_all(std::span<std::byte const> in, std::span<std::byte> out, std::size_t block) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(size_), block);
    exchange(in, counts, out, counts, Op::all_to_all);
  }

  void all_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts,
                    std::span<std::byte> out, std::span<std::size_t const> recv_counts) {
    exchange(in, send_counts, out, recv_counts, Op::all_to_all_v);
  }

  /// Variable-count reduce-scatter as one group of ncclReduce calls, one rooted at each rank.
  void reduce_scatter_v(std::span<float const> in, std::span<float> out, std::span<std::size_t const> counts) {
    ledger_.reduce_scatter(in.size(), out.size(), counts, sizeof(float));
    detail::nccl_call(ncclGroupStart(), "ncclGroupStart");
    std::size_t offset = 0;
    for (int p = 0; p < size_; ++p) {
      std::size_t n = counts[static_cast<std::size_t>(p)];
      if (n) {
        detail::nccl_call(ncclReduce(in.data() + offset, p == rank_ ? out.data() : nullptr, n, ncclFloat, ncclSum,
                                     p, comm_, stream_),
                          "ncclReduce");
      }
      offset += n;
    }
    detail::nccl_call(ncclGroupEnd(), "ncclGroupEnd");
  }

  /// Variable-count all-gather as one group of ncclBroadcast calls, one rooted at each rank.
  void all_gather_v(std::span<std::byte const> in, std::span<std::byte> out, std::span<std::size_t const> counts) {
    ledger_.all_gather(in.size(), out.size(), counts);
    detail::nccl_call(ncclGroupStart(), "ncclGroupStart");
    std::size_t offset = 0;
    for (int p = 0; p < size_; ++p) {
      std::size_t n = counts[static_cast<std::size_t>(p)];
      if (n) {
        detail::nccl_call(ncclBroadcast(p == rank_ ? in.data() : nullptr, out.data() + offset, n, ncclUint8, p,
                                        comm_, stream_),
                          "ncclBroadcast");
      }
      offset += n;
    }
    detail::nccl_call(ncclGroupEnd(), "ncclGroupEnd");
  }

  void all_reduce(std::span<float> data) {
    detail::nccl_call(ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum, comm_, stream_),
                      "ncclAllReduce");
    ledger_.all_reduce(data.size_bytes());
  }

  void send(std::span<std::byte const> in, int peer, int tag) {
    (void)tag;  // NCCL orders messages per peer and stream; tags are not needed
    ledger_.send(peer, in.size());
    detail::nccl_call(ncclSend(in.data(), in.size(), ncclUint8, peer, comm_, stream_), "ncclSend");
  }

  void recv(std::span<std::byte> out, int peer, int tag) {
    (void)tag;
    ledger_.check_peer(peer, "recv");
    detail::nccl_call(ncclRecv(out.data(), out.size(), ncclUint8, peer, comm_, stream_), "ncclRecv");
  }

private:
  void init() {
    check(comm_ != nullptr, "Nccl: null communicator");
    detail::nccl_call(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    detail::nccl_call(ncclCommCount(comm_, &size_), "ncclCommCount");
    ledger_ = detail::Ledger(rank_, size_);
    detail::cuda_call(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
  }

  void exchange(std::span<std::byte const> in, std::span<std::size_t const> send_counts, std::span<std::byte> out,
                std::span<std::size_t const> recv_counts, Op op) {
    ledger_.exchange(op, in.size(), send_counts, out.size(), recv_counts);
    detail::nccl_call(ncclGroupStart(), "ncclGroupStart");
    std::size_t so = 0, ro = 0;
    for (int p = 0; p < size_; ++p) {
      std::size_t sn = send_counts[static_cast<std::size_t>(p)], rn = recv_counts[static_cast<std::size_t>(p)];
      if (sn) detail::nccl_call(ncclSend(in.data() + so, sn, ncclUint8, p, comm_, stream_), "ncclSend");
      if (rn) detail::nccl_call(ncclRecv(out.data() + ro, rn, ncclUint8, p, comm_, stream_), "ncclRecv");
      so += sn;
      ro += rn;
    }
    detail::nccl_call(ncclGroupEnd(), "ncclGroupEnd");
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
  bool owns_ = false;
  float* scratch_ = nullptr;
  detail::Ledger ledger_{0, 1};
};

static_assert(Collective<Nccl>);

}  // namespace moe::collective
