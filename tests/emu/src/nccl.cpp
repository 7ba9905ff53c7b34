// moe-emu in-process NCCL (see emu/nccl.hpp for the contract it enforces).
//
// Matching: a point-to-point operation gets a sequence number per (sender, receiver) pair when it is
// issued, a collective one per communicator; peers meet in a slot keyed by that number. The slots
// live in the clique (all ranks of one communicator) under its mutex, an ordinary lock: the
// hand-over of data between ranks is exactly the ordering NCCL's completion gives, and what
// ThreadSanitizer should see.

#include "emu/nccl.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_bf16.h"
#include "internal.hpp"

struct ncclComm;

namespace emu::nccl {
namespace {

std::size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
  }
  return 0;
}

std::chrono::seconds timeout() {
  static long const s = [] {
    char const* e = std::getenv("MOE_EMU_NCCL_TIMEOUT");
    long v = e ? std::atol(e) : 60;
    return v > 0 ? v : 60;
  }();
  return std::chrono::seconds(s);
}

struct P2pSlot {
  void const* send = nullptr;
  std::size_t send_bytes = 0;
  ncclDataType_t send_type = ncclUint8;
  bool posted = false;
  bool consumed = false;
};

struct CollSlot {
  int arrived = 0;
  bool done = false;
  int kind = 0;  // 1 all-reduce, 2 reduce, 3 broadcast, 4 all-gather
  std::size_t count = 0;
  ncclDataType_t type = ncclUint8;
  ncclRedOp_t op = ncclSum;
  int root = 0;
  std::vector<void const*> send;
  std::vector<void*> recv;
  std::string mismatch;
};

struct SplitSlot {
  int arrived = 0;
  bool done = false;
  std::vector<int> color, key;
  std::vector<ncclComm*> result;
};

struct Clique {
  std::mutex m;
  std::condition_variable cv;
  int nranks = 0;
  int joined = 0;
  bool aborted = false;
  std::vector<ncclComm*> comms;
  std::map<std::tuple<int, int, std::uint64_t>, P2pSlot> p2p;  // (src, dst, seq)
  std::map<std::uint64_t, CollSlot> colls;
  std::map<std::uint64_t, SplitSlot> splits;
};

struct Registry {
  std::mutex m;
  std::map<std::uint64_t, Clique*> by_id;
  std::vector<std::unique_ptr<Clique>> cliques;  // kept for the process's life (reachable)
  std::vector<std::unique_ptr<ncclComm>> comms;
  std::atomic<std::uint64_t> next_id{1};
};
Registry& reg() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace
}  // namespace emu::nccl

struct ncclComm {
  emu::nccl::Clique* clique = nullptr;
  int rank = 0;
  int nranks = 0;
  int device = 0;
  std::atomic<int> async{ncclSuccess};
  bool destroyed = false;
  // Issue-order counters (host side, the calling thread of this rank).
  std::vector<std::uint64_t> sent, received;
  std::uint64_t colls = 0;
  std::uint64_t splits = 0;
};

namespace emu::nccl {
namespace {

using Clock = std::chrono::steady_clock;

/// One recorded operation.
struct Op {
  enum Kind { send, recv, allreduce, reduce, broadcast, allgather } kind;
  ncclComm* comm;
  cudaStream_t stream;
  void const* sbuf;
  void* rbuf;
  std::size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int peer;  // send/recv peer, or root
  std::uint64_t seq;
};

thread_local int tl_depth = 0;
thread_local std::vector<Op> tl_pending;

char const* op_name(Op::Kind k) {
  static char const* names[] = {"ncclSend", "ncclRecv", "ncclAllReduce", "ncclReduce", "ncclBroadcast", "ncclAllGather"};
  return names[k];
}

ncclResult_t bad(ncclResult_t r, std::string const& msg) {
  ::emu::diagnose(msg);
  return r;
}

[[noreturn]] void op_fail(Op const& o, std::string const& why) {
  o.comm->async = ncclSystemError;
  std::string msg = std::string("moe-emu: ") + op_name(o.kind) + " on rank " + std::to_string(o.comm->rank) + " of " +
                    std::to_string(o.comm->nranks) + ": " + why;
  ::emu::detail::set_sticky(o.comm->device, cudaErrorLaunchFailure, msg);
  throw std::runtime_error(msg);
}

template <class Pred>
void wait(Clique& c, std::unique_lock<std::mutex>& lock, Op const& o, char const* what, Pred pred) {
  auto deadline = Clock::now() + timeout();
  while (!pred()) {
    if (c.aborted) op_fail(o, std::string("the communicator was aborted while waiting for ") + what);
    if (c.cv.wait_until(lock, deadline) == std::cv_status::timeout && !pred())
      op_fail(o, std::string("no ") + what + " within " + std::to_string(timeout().count()) +
                     " s (a peer never issued it: a missing ncclGroupEnd, or calls that do not match)");
  }
}

template <class T>
void reduce_into(std::vector<void const*> const& in, std::size_t n, ncclRedOp_t op, T* out) {
  for (std::size_t i = 0; i < n; ++i) {
    T acc = static_cast<T const*>(in[0])[i];
    for (std::size_t r = 1; r < in.size(); ++r) {
      T v = static_cast<T const*>(in[r])[i];
      switch (op) {
        case ncclSum:
        case ncclAvg: acc = static_cast<T>(acc + v); break;
        case ncclProd: acc = static_cast<T>(acc * v); break;
        case ncclMax: acc = std::max(acc, v); break;
        case ncclMin: acc = std::min(acc, v); break;
      }
    }
    if (op == ncclAvg) acc = static_cast<T>(acc / static_cast<T>(in.size()));
    out[i] = acc;
  }
}

/// The last rank to arrive computes the collective for everybody.
void compute(CollSlot& s) {
  std::size_t const bytes = s.count * type_bytes(s.type);
  int const n = static_cast<int>(s.send.size());
  if (s.kind == 3) {  // broadcast
    for (int r = 0; r < n; ++r)
      if (s.recv[r] != s.send[s.root]) std::memmove(s.recv[r], s.send[s.root], bytes);
    return;
  }
  if (s.kind == 4) {  // all-gather
    std::vector<unsigned char> all(bytes * static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) std::memcpy(all.data() + bytes * r, s.send[r], bytes);
    for (int r = 0; r < n; ++r) std::memcpy(s.recv[r], all.data(), all.size());
    return;
  }
  std::vector<unsigned char> out(bytes);
  switch (s.type) {
    case ncclFloat32: reduce_into(s.send, s.count, s.op, reinterpret_cast<float*>(out.data())); break;
    case ncclFloat64: reduce_into(s.send, s.count, s.op, reinterpret_cast<double*>(out.data())); break;
    case ncclInt32: reduce_into(s.send, s.count, s.op, reinterpret_cast<std::int32_t*>(out.data())); break;
    case ncclUint32: reduce_into(s.send, s.count, s.op, reinterpret_cast<std::uint32_t*>(out.data())); break;
    case ncclInt64: reduce_into(s.send, s.count, s.op, reinterpret_cast<std::int64_t*>(out.data())); break;
    case ncclUint64: reduce_into(s.send, s.count, s.op, reinterpret_cast<std::uint64_t*>(out.data())); break;
    case ncclInt8: reduce_into(s.send, s.count, s.op, reinterpret_cast<std::int8_t*>(out.data())); break;
    case ncclUint8: reduce_into(s.send, s.count, s.op, reinterpret_cast<std::uint8_t*>(out.data())); break;
    default: s.mismatch = "reductions of 16-bit types are not modelled"; return;
  }
  for (int r = 0; r < n; ++r)
    if (s.kind == 1 || r == s.root) std::memcpy(s.recv[r], out.data(), bytes);
}

void run_collective(Op const& o) {
  Clique& c = *o.comm->clique;
  std::unique_lock lock(c.m);
  CollSlot& s = c.colls[o.seq];
  int const kind = o.kind == Op::allreduce ? 1 : o.kind == Op::reduce ? 2 : o.kind == Op::broadcast ? 3 : 4;
  if (s.arrived == 0) {
    s.kind = kind;
    s.count = o.count;
    s.type = o.type;
    s.op = o.op;
    s.root = o.peer;
    s.send.assign(static_cast<std::size_t>(c.nranks), nullptr);
    s.recv.assign(static_cast<std::size_t>(c.nranks), nullptr);
  } else if (s.kind != kind || s.count != o.count || s.type != o.type || s.root != o.peer ||
             (kind <= 2 && s.op != o.op)) {
    s.mismatch = std::string("collective number ") + std::to_string(o.seq) + " differs between ranks (" + op_name(o.kind) +
                 " with count " + std::to_string(o.count) + " on rank " + std::to_string(o.comm->rank) + ")";
  }
  s.send[static_cast<std::size_t>(o.comm->rank)] = o.sbuf;
  s.recv[static_cast<std::size_t>(o.comm->rank)] = o.rbuf;
  if (++s.arrived == c.nranks) {
    if (s.mismatch.empty()) compute(s);
    s.done = true;
    c.cv.notify_all();
  } else {
    wait(c, lock, o, "arrival of every rank at the collective", [&] { return s.done; });
  }
  std::string mismatch = s.mismatch;
  if (mismatch.empty()) return;
  lock.unlock();
  op_fail(o, mismatch);
}

/// The operations of one group issued on one stream, in the order that cannot deadlock.
void run_group(std::vector<Op> const& ops) {
  // 1. Post every send.
  for (auto const& o : ops) {
    if (o.kind != Op::send) continue;
    Clique& c = *o.comm->clique;
    std::lock_guard lock(c.m);
    P2pSlot& s = c.p2p[{o.comm->rank, o.peer, o.seq}];
    s.send = o.sbuf;
    s.send_bytes = o.count * type_bytes(o.type);
    s.send_type = o.type;
    s.posted = true;
    c.cv.notify_all();
  }
  // 2. Collectives, in issue order.
  for (auto const& o : ops)
    if (o.kind != Op::send && o.kind != Op::recv) run_collective(o);
  // 3. Receives.
  for (auto const& o : ops) {
    if (o.kind != Op::recv) continue;
    Clique& c = *o.comm->clique;
    std::unique_lock lock(c.m);
    auto key = std::make_tuple(o.peer, o.comm->rank, o.seq);
    wait(c, lock, o, ("matching ncclSend from rank " + std::to_string(o.peer)).c_str(), [&] { return c.p2p[key].posted; });
    P2pSlot& s = c.p2p[key];
    std::size_t const bytes = o.count * type_bytes(o.type);
    if (s.send_bytes != bytes || s.send_type != o.type) {
      std::string why = "receives " + std::to_string(bytes) + " bytes from rank " + std::to_string(o.peer) +
                        ", which sends " + std::to_string(s.send_bytes) + " (type " + std::to_string(s.send_type) + " vs " +
                        std::to_string(o.type) + ")";
      s.consumed = true;
      c.cv.notify_all();
      lock.unlock();
      op_fail(o, why);
    }
    if (bytes) std::memcpy(o.rbuf, s.send, bytes);
    s.consumed = true;
    c.cv.notify_all();
  }
  // 4. A send completes when its receiver has taken the data (the buffer may be reused after).
  for (auto const& o : ops) {
    if (o.kind != Op::send) continue;
    Clique& c = *o.comm->clique;
    std::unique_lock lock(c.m);
    auto key = std::make_tuple(o.comm->rank, o.peer, o.seq);
    wait(c, lock, o, ("matching ncclRecv on rank " + std::to_string(o.peer)).c_str(), [&] { return c.p2p[key].consumed; });
    c.p2p.erase(key);
  }
  for (auto const& o : ops) {
    if (o.kind != Op::recv) continue;
    Clique& c = *o.comm->clique;
    std::lock_guard lock(c.m);
    // the sender erases its slot after seeing it consumed; nothing else to do
    (void)c;
  }
}

ncclResult_t issue(std::vector<Op> ops) {
  // One unit per stream, each in issue order.
  std::vector<cudaStream_t> streams;
  for (auto const& o : ops)
    if (std::find(streams.begin(), streams.end(), o.stream) == streams.end()) streams.push_back(o.stream);
  for (cudaStream_t st : streams) {
    std::vector<Op> mine;
    for (auto const& o : ops)
      if (o.stream == st) mine.push_back(o);
    int r = ::emu::enqueue(st, "nccl group", [mine = std::move(mine)] { run_group(mine); });
    if (r != cudaSuccess) return bad(ncclUnhandledCudaError, "moe-emu: NCCL: the stream refused the operation (a CUDA error)");
  }
  return ncclSuccess;
}

ncclResult_t record(Op o) {
  if (tl_depth > 0) {
    tl_pending.push_back(o);
    return ncclSuccess;
  }
  return issue({o});
}

ncclResult_t check_comm(ncclComm* c, char const* api) {
  if (!c || c->destroyed) return bad(ncclInvalidArgument, std::string(api) + ": invalid or destroyed communicator");
  if (c->clique->aborted) return bad(ncclInvalidUsage, std::string(api) + ": the communicator was aborted");
  return ncclSuccess;
}

ncclResult_t check_stream(ncclComm* c, cudaStream_t s, char const* api) {
  if (::emu::stream_device(s) != c->device)
    return bad(ncclInvalidUsage, std::string(api) + ": the stream belongs to device " + std::to_string(::emu::stream_device(s)) +
                                     ", the communicator to device " + std::to_string(c->device));
  return ncclSuccess;
}

ncclResult_t check_buffer(void const* p, std::size_t count, ncclDataType_t t, char const* api, char const* which) {
  if (type_bytes(t) == 0) return bad(ncclInvalidArgument, std::string(api) + ": unknown data type");
  if (count == 0) return ncclSuccess;
  if (!::emu::is_device_range(p, count * type_bytes(t)))
    return bad(ncclInvalidArgument, std::string(api) + ": " + which + " is not " + std::to_string(count * type_bytes(t)) +
                                        " bytes of device memory");
  return ncclSuccess;
}

ncclComm* make_comm(Clique* c, int rank, int device) {
  auto comm = std::make_unique<ncclComm>();
  comm->clique = c;
  comm->rank = rank;
  comm->nranks = c->nranks;
  comm->device = device;
  comm->sent.assign(static_cast<std::size_t>(c->nranks), 0);
  comm->received.assign(static_cast<std::size_t>(c->nranks), 0);
  ncclComm* p = comm.get();
  std::lock_guard lock(reg().m);
  reg().comms.push_back(std::move(comm));
  return p;
}

}  // namespace
}  // namespace emu::nccl

using namespace emu::nccl;

char const* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return bad(ncclInvalidArgument, "ncclGetUniqueId: null id");
  std::memset(id->internal, 0, sizeof id->internal);
  std::uint64_t v = reg().next_id++;
  std::memcpy(id->internal, "moe-emu", 7);
  std::memcpy(id->internal + 8, &v, sizeof v);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, ncclConfig_t*) {
  if (!out) return bad(ncclInvalidArgument, "ncclCommInitRank: null output");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return bad(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  if (std::memcmp(id.internal, "moe-emu", 7) != 0) return bad(ncclInvalidArgument, "ncclCommInitRank: not a unique id from ncclGetUniqueId");
  std::uint64_t key;
  std::memcpy(&key, id.internal + 8, sizeof key);
  Clique* c = nullptr;
  {
    std::lock_guard lock(reg().m);
    auto& slot = reg().by_id[key];
    if (!slot) {
      reg().cliques.push_back(std::make_unique<Clique>());
      slot = reg().cliques.back().get();
      slot->nranks = nranks;
      slot->comms.assign(static_cast<std::size_t>(nranks), nullptr);
    }
    c = slot;
  }
  if (c->nranks != nranks)
    return bad(ncclInvalidArgument, "ncclCommInitRank: nranks " + std::to_string(nranks) + " but the id's other ranks said " +
                                         std::to_string(c->nranks));
  ncclComm* comm = make_comm(c, rank, ::emu::current_device());
  std::unique_lock lock(c->m);
  if (c->comms[static_cast<std::size_t>(rank)])
    return bad(ncclInvalidUsage, "ncclCommInitRank: rank " + std::to_string(rank) + " joined twice");
  c->comms[static_cast<std::size_t>(rank)] = comm;
  ++c->joined;
  c->cv.notify_all();
  if (!c->cv.wait_for(lock, timeout(), [&] { return c->joined == c->nranks; }))
    return bad(ncclSystemError, "ncclCommInitRank: only " + std::to_string(c->joined) + " of " + std::to_string(nranks) +
                                    " ranks joined within the timeout");
  *out = comm;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, int const* devlist) {
  if (!comms || ndev < 1) return bad(ncclInvalidArgument, "ncclCommInitAll: bad arguments");
  Clique* c;
  {
    std::lock_guard lock(reg().m);
    reg().cliques.push_back(std::make_unique<Clique>());
    c = reg().cliques.back().get();
  }
  c->nranks = ndev;
  c->comms.assign(static_cast<std::size_t>(ndev), nullptr);
  for (int r = 0; r < ndev; ++r) {
    comms[r] = make_comm(c, r, devlist ? devlist[r] : r);
    c->comms[static_cast<std::size_t>(r)] = comms[r];
  }
  c->joined = ndev;
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t*) {
  if (ncclResult_t r = check_comm(comm, "ncclCommSplit")) return r;
  if (!newcomm) return bad(ncclInvalidArgument, "ncclCommSplit: null output");
  Clique& c = *comm->clique;
  std::uint64_t const seq = comm->splits++;
  std::unique_lock lock(c.m);
  SplitSlot& s = c.splits[seq];
  if (s.arrived == 0) {
    s.color.assign(static_cast<std::size_t>(c.nranks), NCCL_SPLIT_NOCOLOR);
    s.key.assign(static_cast<std::size_t>(c.nranks), 0);
    s.result.assign(static_cast<std::size_t>(c.nranks), nullptr);
  }
  s.color[static_cast<std::size_t>(comm->rank)] = color;
  s.key[static_cast<std::size_t>(comm->rank)] = key;
  if (++s.arrived == c.nranks) {
    std::map<int, std::vector<int>> groups;
    for (int r = 0; r < c.nranks; ++r)
      if (s.color[static_cast<std::size_t>(r)] != NCCL_SPLIT_NOCOLOR) groups[s.color[static_cast<std::size_t>(r)]].push_back(r);
    for (auto& [col, members] : groups) {
      std::stable_sort(members.begin(), members.end(),
                       [&](int a, int b) { return s.key[static_cast<std::size_t>(a)] < s.key[static_cast<std::size_t>(b)]; });
      Clique* nc;
      {
        std::lock_guard rl(reg().m);
        reg().cliques.push_back(std::make_unique<Clique>());
        nc = reg().cliques.back().get();
      }
      nc->nranks = static_cast<int>(members.size());
      nc->comms.assign(members.size(), nullptr);
      nc->joined = nc->nranks;
      for (std::size_t i = 0; i < members.size(); ++i) {
        ncclComm* m = make_comm(nc, static_cast<int>(i), c.comms[static_cast<std::size_t>(members[i])]->device);
        nc->comms[i] = m;
        s.result[static_cast<std::size_t>(members[i])] = m;
      }
    }
    s.done = true;
    c.cv.notify_all();
  } else if (!c.cv.wait_for(lock, timeout(), [&] { return s.done || c.aborted; }) || !s.done) {
    return bad(ncclSystemError, "ncclCommSplit: not every rank of the communicator called it (rank " +
                                    std::to_string(comm->rank) + ")");
  }
  *newcomm = s.result[static_cast<std::size_t>(comm->rank)];
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm || comm->destroyed) return bad(ncclInvalidArgument, "ncclCommDestroy: invalid or destroyed communicator");
  cudaDeviceSynchronize();  // outstanding operations finish first
  comm->destroyed = true;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  {
    std::lock_guard lock(comm->clique->m);
    comm->clique->aborted = true;
  }
  comm->clique->cv.notify_all();
  comm->destroyed = true;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (!comm || !state) return bad(ncclInvalidArgument, "ncclCommGetAsyncError: null argument");
  *state = static_cast<ncclResult_t>(comm->async.load());
  return ncclSuccess;
}
ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  if (ncclResult_t r = check_comm(comm, "ncclCommCount")) return r;
  *count = comm->nranks;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  if (ncclResult_t r = check_comm(comm, "ncclCommUserRank")) return r;
  *rank = comm->rank;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(ncclComm_t comm, int* device) {
  if (ncclResult_t r = check_comm(comm, "ncclCommCuDevice")) return r;
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++tl_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (tl_depth == 0) return bad(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--tl_depth > 0) return ncclSuccess;
  std::vector<Op> ops;
  ops.swap(tl_pending);
  return issue(std::move(ops));
}

ncclResult_t ncclSend(void const* buf, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t s) {
  if (ncclResult_t r = check_comm(comm, "ncclSend")) return r;
  if (peer < 0 || peer >= comm->nranks) return bad(ncclInvalidArgument, "ncclSend: peer " + std::to_string(peer) + " out of range");
  if (ncclResult_t r = check_stream(comm, s, "ncclSend")) return r;
  if (ncclResult_t r = check_buffer(buf, count, type, "ncclSend", "the send buffer")) return r;
  return record({Op::send, comm, s, buf, nullptr, count, type, ncclSum, peer, comm->sent[static_cast<std::size_t>(peer)]++});
}
ncclResult_t ncclRecv(void* buf, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t s) {
  if (ncclResult_t r = check_comm(comm, "ncclRecv")) return r;
  if (peer < 0 || peer >= comm->nranks) return bad(ncclInvalidArgument, "ncclRecv: peer " + std::to_string(peer) + " out of range");
  if (ncclResult_t r = check_stream(comm, s, "ncclRecv")) return r;
  if (ncclResult_t r = check_buffer(buf, count, type, "ncclRecv", "the receive buffer")) return r;
  return record({Op::recv, comm, s, nullptr, buf, count, type, ncclSum, peer, comm->received[static_cast<std::size_t>(peer)]++});
}
ncclResult_t ncclAllReduce(void const* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t s) {
  if (ncclResult_t r = check_comm(comm, "ncclAllReduce")) return r;
  if (ncclResult_t r = check_stream(comm, s, "ncclAllReduce")) return r;
  if (ncclResult_t r = check_buffer(send, count, type, "ncclAllReduce", "the send buffer")) return r;
  if (ncclResult_t r = check_buffer(recv, count, type, "ncclAllReduce", "the receive buffer")) return r;
  return record({Op::allreduce, comm, s, send, recv, count, type, op, 0, comm->colls++});
}
ncclResult_t ncclReduce(void const* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t s) {
  if (ncclResult_t r = check_comm(comm, "ncclReduce")) return r;
  if (root < 0 || root >= comm->nranks) return bad(ncclInvalidArgument, "ncclReduce: root out of range");
  if (ncclResult_t r = check_stream(comm, s, "ncclReduce")) return r;
  if (ncclResult_t r = check_buffer(send, count, type, "ncclReduce", "the send buffer")) return r;
  if (comm->rank == root)
    if (ncclResult_t r = check_buffer(recv, count, type, "ncclReduce", "the root's receive buffer")) return r;
  return record({Op::reduce, comm, s, send, recv, count, type, op, root, comm->colls++});
}
ncclResult_t ncclBroadcast(void const* send, void* recv, std::size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t s) {
  if (ncclResult_t r = check_comm(comm, "ncclBroadcast")) return r;
  if (root < 0 || root >= comm->nranks) return bad(ncclInvalidArgument, "ncclBroadcast: root out of range");
  if (ncclResult_t r = check_stream(comm, s, "ncclBroadcast")) return r;
  if (comm->rank == root)
    if (ncclResult_t r = check_buffer(send, count, type, "ncclBroadcast", "the root's send buffer")) return r;
  if (ncclResult_t r = check_buffer(recv, count, type, "ncclBroadcast", "the receive buffer")) return r;
  return record({Op::broadcast, comm, s, send, recv, count, type, ncclSum, root, comm->colls++});
}
ncclResult_t ncclAllGather(void const* send, void* recv, std::size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t s) {
  if (ncclResult_t r = check_comm(comm, "ncclAllGather")) return r;
  if (ncclResult_t r = check_stream(comm, s, "ncclAllGather")) return r;
  if (ncclResult_t r = check_buffer(send, count, type, "ncclAllGather", "the send buffer")) return r;
  if (ncclResult_t r = check_buffer(recv, count * static_cast<std::size_t>(comm->nranks), type, "ncclAllGather", "the receive buffer"))
    return r;
  return record({Op::allgather, comm, s, send, recv, count, type, ncclSum, 0, comm->colls++});
}
