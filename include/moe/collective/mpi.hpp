#pragma once
// collective::Mpi: one rank per process over an MPI communicator (OpenMPI from Debian on CPUs).
// The caller initialises MPI (or uses MpiSession below); Mpi does not own the communicator.

#include <climits>
#include <numeric>

// The C API is all we use; skip the deprecated C++ bindings.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"

namespace moe::collective {

/// MPI_Init_thread / MPI_Finalize for programs that have no MPI setup of their own. Asks for
/// MPI_THREAD_MULTIPLE (schedules that drive links from several threads need it); `thread_level()`
/// says what the library granted.
class MpiSession {
public:
  MpiSession(int* argc, char*** argv, int required = MPI_THREAD_MULTIPLE) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      MPI_Init_thread(argc, argv, required, &provided_);
      owns_ = true;
    } else {
      MPI_Query_thread(&provided_);
    }
  }
  [[nodiscard]] int thread_level() const { return provided_; }
  MpiSession(MpiSession const&) = delete;
  MpiSession& operator=(MpiSession const&) = delete;
  ~MpiSession() {
    if (owns_) MPI_Finalize();
  }

private:
  bool owns_ = false;
  int provided_ = MPI_THREAD_SINGLE;
};

class Mpi {
public:
  static constexpr Memory memory = Memory::host;

  explicit Mpi(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    call(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    call(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    ledger_ = detail::Ledger(rank_, size_);
  }

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] MPI_Comm comm() const { return comm_; }
  [[nodiscard]] Counters const& counters() const { return ledger_.counters(); }
  void reset_counters() { ledger_.reset(); }

  void barrier() { call(MPI_Barrier(comm_), "MPI_Barrier"); }

  void all_to_all(std::span<std::byte const> in, std::span<std::byte> out, std::size_t block) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(size_), block);
    exchange(in, counts, out, counts, Op::all_to_all);
  }

  void all_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts,
                    std::span<std::byte> out, std::span<std::size_t const> recv_counts) {
    exchange(in, send_counts, out, recv_counts, Op::all_to_all_v);
  }

  void reduce_scatter_v(std::span<float const> in, std::span<float> out, std::span<std::size_t const> counts) {
    std::vector<int> c = to_int(counts, "reduce_scatter_v");  // before the ledger counts the call
    ledger_.reduce_scatter(in.size(), out.size(), counts, sizeof(float));
    call(MPI_Reduce_scatter(in.data(), out.data(), c.data(), MPI_FLOAT, MPI_SUM, comm_), "MPI_Reduce_scatter");
  }

  void all_gather_v(std::span<std::byte const> in, std::span<std::byte> out, std::span<std::size_t const> counts) {
    std::size_t mine = in.size();
    Units send(std::span<std::size_t const>(&mine, 1), "all_gather_v"), recv(counts, "all_gather_v");
    ledger_.all_gather(in.size(), out.size(), counts);
    call(MPI_Allgatherv(in.data(), send.counts[0], send.type, out.data(), recv.counts.data(), recv.displs.data(),
                        recv.type, comm_),
         "MPI_Allgatherv");
  }

  void all_reduce(std::span<float> data) {
    check(data.size() <= INT_MAX, "all_reduce: ", data.size(), " elements exceed MPI's int count");
    call(MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM, comm_),
         "MPI_Allreduce");
    ledger_.all_reduce(data.size_bytes());
  }

  void send(std::span<std::byte const> in, int peer, int tag) {
    check(in.size() <= INT_MAX, "send: ", in.size(), " bytes exceed MPI's int count");
    ledger_.send(peer, in.size());
    call(MPI_Send(in.data(), static_cast<int>(in.size()), MPI_BYTE, peer, tag, comm_), "MPI_Send");
  }

  void recv(std::span<std::byte> out, int peer, int tag) {
    ledger_.check_peer(peer, "recv");
    check(out.size() <= INT_MAX, "recv: ", out.size(), " bytes exceed MPI's int count");
    MPI_Status status;
    call(MPI_Recv(out.data(), static_cast<int>(out.size()), MPI_BYTE, peer, tag, comm_, &status), "MPI_Recv");
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    check(static_cast<std::size_t>(got) == out.size(), "recv: rank ", rank_, " expected ", out.size(),
          " bytes from rank ", peer, " (tag ", tag, ") but the message has ", got);
  }

private:
  void exchange(std::span<std::byte const> in, std::span<std::size_t const> send_counts, std::span<std::byte> out,
                std::span<std::size_t const> recv_counts, Op op) {
    Units send(send_counts, "all_to_all"), recv(recv_counts, "all_to_all");
    ledger_.exchange(op, in.size(), send_counts, out.size(), recv_counts);
    call(MPI_Alltoallv(in.data(), send.counts.data(), send.displs.data(), send.type, out.data(), recv.counts.data(),
                       recv.displs.data(), recv.type, comm_),
         "MPI_Alltoallv");
  }

  /// One side of a byte exchange (this rank's sends, or its receives) in MPI's int counts and
  /// displacements: in bytes while they add up to at most INT_MAX; past that in units of the
  /// greatest common divisor of the counts, a datatype of that many bytes. Every side decides alone
  /// (a rank may receive more than 2^31 bytes from peers that each send less): the type signatures
  /// still match, a sequence of bytes on both sides, whatever unit each uses. Refuses (on this rank
  /// alone) only what does not fit an int even so.
  struct Units {
    std::vector<int> counts, displs;
    MPI_Datatype type = MPI_BYTE;

    Units(std::span<std::size_t const> bytes, char const* what) : counts(bytes.size()), displs(bytes.size()) {
      std::size_t total = 0, unit = 0;
      for (auto b : bytes) total += b, unit = std::gcd(unit, b);
      if (total <= static_cast<std::size_t>(INT_MAX)) unit = 1;
      check(total / unit <= static_cast<std::size_t>(INT_MAX), what, ": ", total, " bytes in blocks of ", unit,
            " bytes exceed MPI's int counts");
      std::size_t at = 0;
      for (std::size_t i = 0; i < bytes.size(); ++i) {
        counts[i] = static_cast<int>(bytes[i] / unit);
        displs[i] = static_cast<int>(at);
        at += bytes[i] / unit;
      }
      if (unit > 1) type = bytes_type(unit);
    }
    ~Units() {
      if (type != MPI_BYTE) MPI_Type_free(&type);
    }
    Units(Units const&) = delete;
    Units& operator=(Units const&) = delete;

    /// A datatype of `n` bytes (n > 1; past INT_MAX, blocks of 2^30 bytes and the rest).
    static MPI_Datatype bytes_type(std::size_t n) {
      MPI_Datatype t = MPI_BYTE;
      if (n <= static_cast<std::size_t>(INT_MAX)) {
        call(MPI_Type_contiguous(static_cast<int>(n), MPI_BYTE, &t), "MPI_Type_contiguous");
      } else {
        constexpr std::size_t block = std::size_t{1} << 30;
        MPI_Datatype blocks = MPI_BYTE, whole = MPI_BYTE;
        call(MPI_Type_contiguous(static_cast<int>(block), MPI_BYTE, &blocks), "MPI_Type_contiguous");
        int lengths[2] = {static_cast<int>(n / block), static_cast<int>(n % block)};
        MPI_Aint at[2] = {0, static_cast<MPI_Aint>(n / block * block)};
        MPI_Datatype types[2] = {blocks, MPI_BYTE};
        call(MPI_Type_create_struct(2, lengths, at, types, &whole), "MPI_Type_create_struct");
        call(MPI_Type_create_resized(whole, 0, static_cast<MPI_Aint>(n), &t), "MPI_Type_create_resized");
        MPI_Type_free(&whole);
        MPI_Type_free(&blocks);
      }
      call(MPI_Type_commit(&t), "MPI_Type_commit");
      return t;
    }
  };

  /// MPI counts and displacements are ints: the whole message must stay under 2^31 elements.
  static std::vector<int> to_int(std::span<std::size_t const> counts, char const* what) {
    std::vector<int> out(counts.size());
    std::size_t total = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      total += counts[i];
      check(total <= INT_MAX, what, ": messages of 2^31 elements or more are not supported by this MPI binding");
      out[i] = static_cast<int>(counts[i]);
    }
    return out;
  }

  static void call(int code, char const* what) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, text, &len);
    fail(what, " failed: ", std::string(text, static_cast<std::size_t>(len)));
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  detail::Ledger ledger_{0, 1};
};

static_assert(Collective<Mpi>);

}  // namespace moe::collective
