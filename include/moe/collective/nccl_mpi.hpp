#pragma once
// Bootstraps collective::Nccl from an MPI communicator: rank 0 makes the ncclUniqueId and MPI
// broadcasts it; every rank then joins the NCCL communicator on its current CUDA device.
//
// Rank 0 broadcasts whether it could make the id together with the id itself, so when it fails
// every rank throws moe::Error (with rank 0's reason) instead of the others waiting for the id.

#include <cstdio>
#include <exception>

#include "moe/collective/mpi.hpp"
#include "moe/collective/nccl.hpp"

namespace moe::collective {

inline Nccl nccl_from_mpi(Mpi const& mpi, cudaStream_t stream = nullptr) {
  struct Message {
    ncclUniqueId id;
    int ok;
    char reason[240];
  };
  Message m{};
  if (mpi.rank() == 0) {
    try {
      m.id = Nccl::unique_id();
      m.ok = 1;
    } catch (std::exception const& e) {
      std::snprintf(m.reason, sizeof(m.reason), "%s", e.what());
    }
  }
  int rc = MPI_Bcast(&m, static_cast<int>(sizeof(m)), MPI_BYTE, 0, mpi.comm());
  check(rc == MPI_SUCCESS, "nccl_from_mpi: MPI_Bcast of the NCCL unique id failed");
  check(m.ok == 1, "nccl_from_mpi: rank 0 could not make the NCCL unique id: ", m.reason);
  return Nccl::create(mpi.rank(), mpi.size(), m.id, stream);
}

}  // namespace moe::collective
