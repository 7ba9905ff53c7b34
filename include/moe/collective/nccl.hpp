#pragma once
// collective::Nccl: one rank per GPU over an NCCL communicator. Buffers are device memory and every
// operation is enqueued on the stream set with set_stream(); nothing here synchronises the host
// except barrier(). Compiles with g++ (it needs only the CUDA runtime and NCCL headers); world size
// 1 runs on a single GPU.
//
// Bootstrapping: either pass a communicator the host engine already owns (not destroyed here), or
// create one from an ncclUniqueId that rank 0 made and the others received (collective/nccl_mpi.hpp
// broadcasts it over MPI).
//
// Non-blocking communicators (ncclConfig_t::blocking = 0) are accepted: when NCCL answers
// ncclInProgress, the call waits here (polling ncclCommGetAsyncError) until the communicator has
// settled, so every member returns with the operation enqueued, or throws moe::Error.
//
// Errors: a failed call throws moe::Error. Grouped operations (all_to_all(_v), reduce_scatter_v,
// all_gather_v) always close their NCCL group, also when one call inside it fails, so the thread is
// never left inside a group. After an NCCL error the communicator should be considered broken: call
// abort() (ncclCommAbort) rather than letting the destructor run ncclCommDestroy, which waits for
// the peers and can hang when one of them is gone.
//
// send/recv ignore the tag: NCCL has none. Messages between one pair of ranks on one communicator
// are matched in the order they are issued; use duplicate() for traffic that must not mix.
//
// counters() are updated when an operation is issued (after NCCL accepted it), not when it runs:
// work captured in a CUDA graph is counted once at capture, and replays of the graph add nothing.

#include <cuda_runtime.h>
#include <nccl.h>

#include <thread>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"

namespace moe::collective {

namespace detail {

/// The state of `comm` once it is no longer ncclInProgress: a non-blocking communicator reports
/// ncclInProgress while it still carries out an earlier call (group end, split, initialisation).
inline ncclResult_t settled_state(ncclComm_t comm) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    std::this_thread::yield();
  }
}

/// Throws unless `r` (or, for ncclInProgress, the state `comm` settles in) is ncclSuccess.
inline void nccl_call(ncclComm_t comm, ncclResult_t r, char const* what) {
  if (r == ncclInProgress && comm) r = settled_state(comm);
  if (r != ncclSuccess) fail(what, " failed: ", ncclGetErrorString(r));
}
inline void nccl_call(ncclResult_t r, char const* what) { nccl_call(nullptr, r, what); }

inline void cuda_call(cudaError_t r, char const* what) {
  if (r != cudaSuccess) fail(what, " failed: ", cudaGetErrorString(r));
}

/// An open NCCL group on this thread. end() closes it and reports its error; if an exception leaves
/// the scope first, the destructor closes it and drops any second error. NCCL cancels the whole
/// group when a call inside it failed, so nothing of a half-built group is launched.
class NcclGroup {
public:
  explicit NcclGroup(ncclComm_t comm) : comm_(comm) { nccl_call(ncclGroupStart(), "ncclGroupStart"); }
  NcclGroup(NcclGroup const&) = delete;
  NcclGroup& operator=(NcclGroup const&) = delete;
  ~NcclGroup() {
    if (open_ && ncclGroupEnd() == ncclInProgress) (void)settled_state(comm_);
  }
  void end() {
    open_ = false;
    nccl_call(comm_, ncclGroupEnd(), "ncclGroupEnd");
  }

private:
  ncclComm_t comm_;
  bool open_ = true;
};

}  // namespace detail

class Nccl {
public:
  static constexpr Memory memory = Memory::device;

  /// Wraps a communicator owned by the caller.
  explicit Nccl(ncclComm_t comm, cudaStream_t stream = nullptr) : Nccl(comm, stream, false) {}

  /// Creates (and owns) a communicator of `size` ranks from a shared unique id.
  static Nccl create(int rank, int size, ncclUniqueId const& id, cudaStream_t stream = nullptr) {
    check(size > 0 && rank >= 0 && rank < size, "Nccl::create: rank ", rank, " of ", size, " is invalid");
    ncclComm_t comm = nullptr;
    detail::nccl_call(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
    return Nccl(comm, stream, true);
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
  /// The new communicator inherits this one's configuration (blocking or not).
  [[nodiscard]] Nccl duplicate() const {
    usable();
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommSplit(comm_, 0, rank_, &comm, nullptr);
    if (r == ncclInProgress && comm) r = detail::settled_state(comm);
    if (r != ncclSuccess) {
      if (comm) (void)ncclCommAbort(comm);
      fail("ncclCommSplit failed: ", ncclGetErrorString(r));
    }
    check(comm != nullptr, "Nccl::duplicate: ncclCommSplit returned no communicator");
    return Nccl(comm, stream_, true);  // owns `comm` from here, also if its constructor throws
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
  ~Nccl() { release(); }

  /// For error paths: aborts an owned communicator (ncclCommAbort, which stops its pending work and
  /// does not wait for the peers) and frees the scratch memory. A communicator wrapped from the
  /// caller is only let go of: the caller aborts its own. The object is unusable afterwards: every
  /// communication member throws moe::Error; destroy it or assign a new one to it.
  void abort() noexcept {
    if (owns_ && comm_) (void)ncclCommAbort(comm_);
    if (scratch_) (void)cudaFree(scratch_);
    comm_ = nullptr;
    scratch_ = nullptr;
    owns_ = false;
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
    usable();
    detail::nccl_call(comm_, ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_),
                      "ncclAllReduce");
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
    usable();
    detail::Ledger next = ledger_;  // checks now, counts once the group is enqueued
    next.reduce_scatter(in.size(), out.size(), counts, sizeof(float));
    detail::NcclGroup group(comm_);
    std::size_t offset = 0;
    for (int p = 0; p < size_; ++p) {
      std::size_t n = counts[static_cast<std::size_t>(p)];
      if (n) {
        detail::nccl_call(comm_,
                          ncclReduce(in.data() + offset, p == rank_ ? out.data() : nullptr, n, ncclFloat, ncclSum,
                                     p, comm_, stream_),
                          "ncclReduce");
      }
      offset += n;
    }
    group.end();
    ledger_ = next;
  }

  /// Variable-count all-gather as one group of ncclBroadcast calls, one rooted at each rank.
  void all_gather_v(std::span<std::byte const> in, std::span<std::byte> out, std::span<std::size_t const> counts) {
    usable();
    detail::Ledger next = ledger_;
    next.all_gather(in.size(), out.size(), counts);
    detail::NcclGroup group(comm_);
    std::size_t offset = 0;
    for (int p = 0; p < size_; ++p) {
      std::size_t n = counts[static_cast<std::size_t>(p)];
      if (n) {
        detail::nccl_call(comm_,
                          ncclBroadcast(p == rank_ ? in.data() : nullptr, out.data() + offset, n, ncclUint8, p,
                                        comm_, stream_),
                          "ncclBroadcast");
      }
      offset += n;
    }
    group.end();
    ledger_ = next;
  }

  void all_reduce(std::span<float> data) {
    usable();
    detail::nccl_call(comm_,
                      ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum, comm_, stream_),
                      "ncclAllReduce");
    ledger_.all_reduce(data.size_bytes());
  }

  /// `tag` is ignored (see the header comment): messages to one peer match in issue order.
  void send(std::span<std::byte const> in, int peer, int tag) {
    (void)tag;
    usable();
    detail::Ledger next = ledger_;
    next.send(peer, in.size());
    detail::nccl_call(comm_, ncclSend(in.data(), in.size(), ncclUint8, peer, comm_, stream_), "ncclSend");
    ledger_ = next;
  }

  /// `tag` is ignored; `out` must have the size of the matching send (NCCL cannot check it).
  void recv(std::span<std::byte> out, int peer, int tag) {
    (void)tag;
    usable();
    ledger_.check_peer(peer, "recv");
    detail::nccl_call(comm_, ncclRecv(out.data(), out.size(), ncclUint8, peer, comm_, stream_), "ncclRecv");
  }

private:
  // Takes ownership of `comm` first when `owns`, so it is destroyed if anything below throws.
  Nccl(ncclComm_t comm, cudaStream_t stream, bool owns) : comm_(comm), stream_(stream), owns_(owns) {
    try {
      init();
    } catch (...) {
      release();
      throw;
    }
  }

  void init() {
    check(comm_ != nullptr, "Nccl: null communicator");
    ncclResult_t state = detail::settled_state(comm_);  // a non-blocking one may still be initialising
    check(state == ncclSuccess, "Nccl: the communicator reports an error: ", ncclGetErrorString(state));
    detail::nccl_call(comm_, ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    detail::nccl_call(comm_, ncclCommCount(comm_, &size_), "ncclCommCount");
    ledger_ = detail::Ledger(rank_, size_);
    detail::cuda_call(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
    // barrier() all-reduces this value; start from a defined one.
    detail::cuda_call(cudaMemsetAsync(scratch_, 0, sizeof(float), stream_), "cudaMemsetAsync");
    detail::cuda_call(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  void release() noexcept {
    if (scratch_) (void)cudaFree(scratch_);
    if (owns_ && comm_) (void)ncclCommDestroy(comm_);
    scratch_ = nullptr;
    comm_ = nullptr;
    owns_ = false;
  }

  void usable() const { check(comm_ != nullptr, "Nccl: the communicator was aborted or moved from"); }

  void exchange(std::span<std::byte const> in, std::span<std::size_t const> send_counts, std::span<std::byte> out,
                std::span<std::size_t const> recv_counts, Op op) {
    usable();
    detail::Ledger next = ledger_;
    next.exchange(op, in.size(), send_counts, out.size(), recv_counts);
    detail::NcclGroup group(comm_);
    std::size_t so = 0, ro = 0;
    for (int p = 0; p < size_; ++p) {
      std::size_t sn = send_counts[static_cast<std::size_t>(p)], rn = recv_counts[static_cast<std::size_t>(p)];
      if (sn) detail::nccl_call(comm_, ncclSend(in.data() + so, sn, ncclUint8, p, comm_, stream_), "ncclSend");
      if (rn) detail::nccl_call(comm_, ncclRecv(out.data() + ro, rn, ncclUint8, p, comm_, stream_), "ncclRecv");
      so += sn;
      ro += rn;
    }
    group.end();
    ledger_ = next;
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
