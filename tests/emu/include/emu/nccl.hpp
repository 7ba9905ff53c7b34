#pragma once
// moe-emu in-process NCCL: the ranks of a communicator are threads of this process (each with its
// device and streams). Every operation is stream-ordered: it runs on the stream's worker and meets
// its peers there. Contracts as NCCL documents them, with errors instead of hangs:
//  - ncclCommInitRank blocks until all ranks of the unique id joined;
//  - between ncclGroupStart and ncclGroupEnd (nesting counts) operations are only recorded; the
//    outermost ncclGroupEnd issues them, per stream, as one unit in which every send is posted
//    before any receive waits, so the point-to-point exchanges of a group cannot deadlock; a group
//    that is never ended never issues its operations;
//  - send and receive match in issue order per (sender, receiver) pair; their sizes and types must
//    be equal; collectives match in issue order per communicator and must agree on operation,
//    count, type and root;
//  - buffers are device memory of the stated size; the stream belongs to the communicator's device;
//  - a peer that does not arrive within MOE_EMU_NCCL_TIMEOUT seconds (default 60), or an aborted
//    communicator, fails the operation: the communicator's asynchronous error is set, a message
//    names the rank, the peer and the operation, and the CUDA device gets a sticky error.

#include <cstddef>
#include <cstdint>

#include "emu/runtime.hpp"

enum ncclResult_t : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
enum ncclDataType_t : int {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
};
enum ncclRedOp_t : int { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

#define NCCL_UNIQUE_ID_BYTES 128
struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};
struct ncclConfig_t {
  int blocking = 1;
};
#define NCCL_CONFIG_INITIALIZER \
  {}
#define NCCL_SPLIT_NOCOLOR (-1)

struct ncclComm;
using ncclComm_t = ncclComm*;

char const* ncclGetErrorString(ncclResult_t r);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config);
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, int const* devlist);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state);
ncclResult_t ncclCommCount(ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank);
ncclResult_t ncclCommCuDevice(ncclComm_t comm, int* device);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t ncclSend(void const* buf, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclRecv(void* buf, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclAllReduce(void const* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclReduce(void const* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclBroadcast(void const* send, void* recv, std::size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclAllGather(void const* send, void* recv, std::size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t s);
