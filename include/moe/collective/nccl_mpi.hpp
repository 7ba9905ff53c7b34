#pragma once
// Bootstraps collective::Nccl from an MPI communicator: rank 0 makes the ncclUniqueId and MPI
// broadcasts it; every rank then joins the NCCL communicator on its current CUDA device.

#include "moe/collective/mpi.hpp"
#include "moe/collective/nccl.hpp"

namespace moe::collective {

inline Nccl nccl_from_mpi(Mpi const& mpi, cudaStream_t stream = nullptr) {
  ncclUniqueId id{};
  if (mpi.rank() == 0) id = Nccl::unique_id();
  int rc = MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi.comm());
  check(rc == MPI_SUCCESS, "nccl_from_mpi: MPI_Bcast of the NCCL unique id failed");
  return Nccl::create(mpi.rank(), mpi.size(), id, stream);
}

}  // namespace moe::collective
