// moe-emu runtime: memory, streams, events, graphs, errors and device attributes.
//
// Streams. Each stream has a worker thread that runs its operations in order. An operation may
// depend on other streams' operations (stream, sequence number): the legacy default stream's
// operations depend on everything enqueued before on the device's blocking streams, and a blocking
// stream's operations on everything enqueued before on the legacy stream (the legacy default-stream
// semantics); cudaStreamWaitEvent adds a dependency on the event's record. Nothing else orders two
// streams: the emulator's locks are hidden from ThreadSanitizer (san::IgnoreSync) and the intended
// orderings are explicit happens-before edges, so a missing cudaStreamWaitEvent leaves two streams'
// accesses unordered, and TSan reports them.
//
// Graphs. While a stream captures, its operations become graph nodes whose dependencies follow
// the capture (the stream's last nodes, joined streams through events). A launch runs the nodes
// that came from different streams on different threads, honouring exactly the captured
// dependencies, so a dependency missing in the capture is as visible as a missing event wait.
//
// Errors. Configuration errors are returned and recorded as the thread's last error (non-sticky);
// a kernel error (divergence, failed contract, trap, exception) is sticky for the device: every
// later call on it returns cudaErrorLaunchFailure, as after a device fault.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "internal.hpp"
#include "sanitizer.hpp"

namespace emu {

namespace detail {
struct Node;
struct Capture;
}  // namespace detail

struct Stream {
  int device = 0;
  bool legacy = false;
  bool blocking = true;
  std::mutex m;
  std::condition_variable cv;
  struct Op {
    std::function<void()> fn;
    char const* what;
    std::vector<std::pair<Stream*, std::uint64_t>> deps;
    std::uint64_t seq;
    bool stop = false;
  };
  // Queued operations. The worker takes them by index and never frees the queue's memory: every
  // allocation the worker releases (an Op and what it holds) was made before the enqueue's
  // happens-before edge (see put()).
  std::vector<std::unique_ptr<Op>> q;  // guarded by m
  std::size_t head = 0;                // guarded by m
  std::uint64_t enqueued = 0;   // guarded by m
  std::uint64_t completed = 0;  // guarded by m
  std::thread worker;
  // Capture state (guarded by the runtime's capture lock).
  detail::Capture* capture = nullptr;
  std::vector<detail::Node*> frontier;
  // Happens-before objects of completed work (worker -> waiters), by sequence number modulo 1024.
  char done_hb[1024] = {};
};

}  // namespace emu

struct CUevent_st {
  int device = 0;
  unsigned flags = 0;
  emu::Stream* stream = nullptr;  // last record (not captured)
  std::uint64_t seq = 0;
  std::atomic<double> time_ms{0.0};
  // Captured record.
  emu::detail::Capture* capture = nullptr;
  std::vector<emu::detail::Node*> nodes;
};

namespace emu::detail {

struct Node {
  std::function<void()> fn;
  char const* what = "";
  std::vector<Node*> deps;
  Stream* origin = nullptr;  // the stream whose capture issued it (its replay lane)
  int index = 0;
};

struct Capture {
  CUgraph_st* graph = nullptr;
  Stream* origin = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  bool invalidated = false;
  std::vector<Stream*> streams;
};

}  // namespace emu::detail

struct CUgraph_st {
  std::vector<std::unique_ptr<emu::detail::Node>> nodes;
};
struct CUgraphExec_st {
  struct Step {
    std::function<void()> fn;
    char const* what;
    std::vector<int> deps;  // node indices
    int lane;
  };
  std::vector<Step> steps;  // in capture order (a topological order)
  int lanes = 0;
};

namespace emu::detail {
namespace {

using Lock = std::unique_lock<std::mutex>;

struct DeviceState {
  std::atomic<int> sticky{0};
  std::string sticky_msg;
  Stream* legacy = nullptr;
  std::vector<Stream*> streams;  // every live stream of the device, legacy included
  std::map<void const*, int> func_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize
  std::size_t allocated = 0;
};

struct Runtime {
  // Devices' stream lists, allocations, captures, function attributes. An ordinary lock: it orders
  // host threads' use of the runtime (never a stream worker's device work).
  std::mutex m;
  std::vector<DeviceState> devices;
  std::map<std::uintptr_t, Allocation> allocations;  // by base address
  std::vector<Capture*> captures;
  std::vector<Stream*> zombies;  // destroyed streams whose workers may still be finishing
  // Destroyed events and executable graphs: queued work may still use them, so they are kept
  // (reachable, for LeakSanitizer) until the process ends.
  std::vector<std::unique_ptr<CUevent_st>> dead_events;
  std::vector<std::unique_ptr<CUgraphExec_st>> dead_execs;
  std::atomic<std::uint64_t> kernels{0}, blocks{0}, switches{0};
  std::atomic<std::uint64_t> host_syncs{0}, device_to_host{0};  // see emu::Counters
  Runtime() : devices(static_cast<std::size_t>(device_count())) {}
};

Runtime& rt() {
  static Runtime* r = new Runtime();  // never destroyed: workers may outlive static destruction
  return *r;
}
// Built before main, on the main thread: the first CUDA call of a rank thread may come inside a
// region where ThreadSanitizer ignores synchronisation, which would hide the guard of the
// function-local static from it and report the construction as a race.
[[maybe_unused]] Runtime& runtime_at_start = rt();

thread_local int tl_device = 0;
thread_local cudaError_t tl_last = cudaSuccess;

cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) tl_last = e;
  return e;
}
cudaError_t fail(cudaError_t e, std::string const& msg) {
  diagnose(msg);
  return record(e);
}
cudaError_t sticky(int device) {
  return static_cast<cudaError_t>(rt().devices[static_cast<std::size_t>(device)].sticky.load());
}

void worker_loop(Stream* s) {
  for (;;) {
    std::unique_ptr<Stream::Op> next;
    {
      san::IgnoreSync quiet;
      Lock lock(s->m);
      san::IgnoreAccesses unseen;  // the queue's storage, which s->m guards (see put)
      s->cv.wait(lock, [&] { return s->head < s->q.size(); });
      next = std::move(s->q[s->head++]);
    }
    san::acquire(next.get());
    Stream::Op& op = *next;
    if (op.stop) return;
    for (auto& [d, seq] : op.deps) {
      {
        san::IgnoreSync quiet;
        Lock lock(d->m);
        d->cv.wait(lock, [&done = d->completed, after = seq] { return done >= after; });
      }
      san::acquire(&d->done_hb[seq % 1024]);
    }
    if (op.fn && sticky(s->device) == cudaSuccess) {
      try {
        op.fn();
      } catch (std::exception const& e) {
        set_sticky(s->device, cudaErrorLaunchFailure, std::string("moe-emu: ") + op.what + " failed: " + e.what());
      }
    }
    san::release(&s->done_hb[op.seq % 1024]);
    {
      san::IgnoreSync quiet;
      Lock lock(s->m);
      s->completed = op.seq;
    }
    s->cv.notify_all();
  }
}

Stream* new_stream(int device, bool legacy, bool blocking) {
  auto* s = new Stream();
  s->device = device;
  s->legacy = legacy;
  s->blocking = blocking;
  s->worker = std::thread(worker_loop, s);
  return s;
}

Stream* legacy_stream(int device) {
  auto& R = rt();
  auto& d = R.devices[static_cast<std::size_t>(device)];
  {
    Lock lock(R.m);
    if (d.legacy) return d.legacy;
  }
  // The worker thread is started outside IgnoreSync: its creation orders the stream's set-up.
  static std::mutex create;
  std::lock_guard once(create);
  {
    Lock lock(R.m);
    if (d.legacy) return d.legacy;
  }
  Stream* s = new_stream(device, true, true);
  Lock lock(R.m);
  d.legacy = s;
  d.streams.push_back(s);
  return s;
}

Stream* resolve(cudaStream_t s) { return s ? s : legacy_stream(tl_device); }

std::uint64_t enqueued(Stream* s) {
  san::IgnoreSync quiet;
  Lock lock(s->m);
  return s->enqueued;
}

void wait_for(Stream* s, std::uint64_t seq) {
  {
    san::IgnoreSync quiet;
    Lock lock(s->m);
    s->cv.wait(lock, [&] { return s->completed >= seq; });
  }
  san::acquire(&s->done_hb[seq % 1024]);
}

bool done(Stream* s, std::uint64_t seq) {
  san::IgnoreSync quiet;
  Lock lock(s->m);
  return s->completed >= seq;
}

/// Appends a prepared operation to the stream's queue and returns its sequence number. Everything
/// the operation holds was allocated before the happens-before edge to the worker made here (not
/// inside IgnoreSync, which would drop the edge). The queue's storage is guarded by s->m, a lock
/// ThreadSanitizer does not see (IgnoreSync), and any host thread may grow it (two in-process
/// ranks on one device share its legacy stream), so ThreadSanitizer does not see those accesses
/// either: the lock orders them, and an edge between the enqueuers would hide races between their
/// own work.
std::uint64_t put(Stream* s, std::unique_ptr<Stream::Op> op) {
  std::uint64_t seq = 0;
  san::release(op.get());  // the worker acquires the same object when it takes the operation
  {
    san::IgnoreSync quiet;
    Lock lock(s->m);
    seq = op->stop ? 0 : ++s->enqueued;
    op->seq = seq;
    san::IgnoreAccesses unseen;
    if (s->head == s->q.size() && s->head > 256) {
      s->q.clear();
      s->head = 0;
    }
    s->q.push_back(std::move(op));
  }
  s->cv.notify_all();
  return seq;
}

/// Pushes an operation (no capture handling). Returns its sequence number.
std::uint64_t push(Stream* s, char const* what, std::function<void()> fn) {
  std::vector<std::pair<Stream*, std::uint64_t>> deps;
  if (s->legacy || s->blocking) {
    std::vector<Stream*> others;
    {
      auto& R = rt();
      Lock lock(R.m);
      auto& d = R.devices[static_cast<std::size_t>(s->device)];
      for (Stream* o : d.streams)
        if (o != s && o->blocking && (s->legacy || o->legacy)) others.push_back(o);
    }
    for (Stream* o : others)
      if (std::uint64_t n = enqueued(o); n > 0) deps.emplace_back(o, n);
  }
  return put(s, std::make_unique<Stream::Op>(Stream::Op{std::move(fn), what, std::move(deps), 0, false}));
}

// ---------------------------------------------------------------------------------------------
// Capture.
// ---------------------------------------------------------------------------------------------

/// A capture that forbids an unsafe call from this thread (global mode: any thread; thread-local
/// mode: the capturing thread). Invalidates it. Caller holds R.m.
Capture* forbidding_capture() {
  for (Capture* c : rt().captures)
    if (!c->invalidated && (c->mode == cudaStreamCaptureModeGlobal ||
                            (c->mode == cudaStreamCaptureModeThreadLocal && c->thread == std::this_thread::get_id())))
      return c;
  return nullptr;
}

/// An unsafe call (synchronous memory operation, allocation, device synchronisation) while a
/// capture forbids it: cudaErrorStreamCaptureUnsupported, and the capture is invalidated.
cudaError_t unsafe_call(char const* api) {
  auto& R = rt();
  Lock lock(R.m);
  if (Capture* c = forbidding_capture()) {
    c->invalidated = true;
    lock.unlock();
    return fail(cudaErrorStreamCaptureUnsupported,
                std::string(api) + " is not allowed while a stream captures a graph in " +
                    (c->mode == cudaStreamCaptureModeGlobal ? "global" : "thread-local") + " mode; the capture is invalidated");
  }
  return cudaSuccess;
}

/// Whether a blocking stream of `device` captures (the legacy stream may not be used then).
Capture* capturing_blocking_stream(int device) {
  auto& R = rt();
  for (Stream* s : R.devices[static_cast<std::size_t>(device)].streams)
    if (s->blocking && !s->legacy && s->capture) return s->capture;
  return nullptr;
}

Node* add_node(Stream* s, char const* what, std::function<void()> fn) {
  Capture* c = s->capture;
  auto n = std::make_unique<Node>();
  n->fn = std::move(fn);
  n->what = what;
  n->deps = s->frontier;
  n->origin = s;
  n->index = static_cast<int>(c->graph->nodes.size());
  Node* p = n.get();
  c->graph->nodes.push_back(std::move(n));
  s->frontier = {p};
  return p;
}

}  // namespace

void set_sticky(int device, cudaError_t e, std::string const& msg) {
  auto& d = rt().devices[static_cast<std::size_t>(device)];
  {
    Lock lock(rt().m);
    if (d.sticky.load() == 0) d.sticky_msg = msg;
  }
  int expected = 0;
  d.sticky.compare_exchange_strong(expected, static_cast<int>(e));
  std::fprintf(stderr, "%s\n", msg.c_str());
  std::fflush(stderr);
}

void count(std::uint64_t kernels, std::uint64_t blocks, std::uint64_t switches) {
  rt().kernels += kernels;
  rt().blocks += blocks;
  rt().switches += switches;
}

namespace {
/// Enqueue with capture rules; returns the error to report.
cudaError_t enqueue_impl(cudaStream_t handle, char const* what, std::function<void()> fn, std::uint64_t* seq_out) {
  Stream* s = resolve(handle);
  if (cudaError_t e = sticky(s->device)) return record(e);
  auto& R = rt();
  {
    Lock lock(R.m);
    if (s->capture) {
      if (s->capture->invalidated) return record(cudaErrorStreamCaptureInvalidated);
      add_node(s, what, std::move(fn));
      if (seq_out) *seq_out = 0;
      return cudaSuccess;
    }
    if (s->legacy) {
      if (Capture* c = capturing_blocking_stream(s->device)) {
        c->invalidated = true;
        lock.unlock();
        return fail(cudaErrorStreamCaptureImplicit,
                    std::string(what) + " on the legacy default stream while a blocking stream captures a graph "
                                        "(it would synchronise with the capturing stream); the capture is invalidated");
      }
    }
  }
  std::uint64_t seq = push(s, what, std::move(fn));
  if (seq_out) *seq_out = seq;
  return cudaSuccess;
}

bool host_sync_ok(Stream* s, char const* api, cudaError_t* err) {
  auto& R = rt();
  Lock lock(R.m);
  if (s->capture) {
    s->capture->invalidated = true;
    lock.unlock();
    *err = fail(cudaErrorStreamCaptureUnsupported, std::string(api) + " on a capturing stream; the capture is invalidated");
    return false;
  }
  if (s->legacy) {
    if (Capture* c = capturing_blocking_stream(s->device)) {
      c->invalidated = true;
      lock.unlock();
      *err = fail(cudaErrorStreamCaptureImplicit, std::string(api) + " on the legacy stream while a blocking stream captures");
      return false;
    }
  }
  return true;
}

cudaError_t sync_stream(Stream* s, char const* api) {
  cudaError_t err = cudaSuccess;
  if (!host_sync_ok(s, api, &err)) return err;
  ++rt().host_syncs;
  std::uint64_t seq = 0;
  if (s->legacy) {
    seq = push(s, api, nullptr);  // a marker that also waits for the blocking streams
  } else {
    seq = enqueued(s);
  }
  if (seq) wait_for(s, seq);
  return record(sticky(s->device));
}

}  // namespace
}  // namespace emu::detail

// =============================================================================================
// Public API.
// =============================================================================================
namespace emu {

using namespace detail;

int device_count() {
  static int const n = [] {
    int v = 8;
    if (char const* e = std::getenv("MOE_EMU_DEVICES")) v = std::atoi(e);
    return std::clamp(v, 0, 64);
  }();
  return n;
}

int current_device() { return tl_device; }
int stream_device(Stream* s) { return s ? s->device : tl_device; }

void diagnose(std::string const& msg) {
  std::fprintf(stderr, "moe-emu: %s\n", msg.c_str());
  std::fflush(stderr);
}

int enqueue(Stream* s, char const* what, std::function<void()> fn) {
  return enqueue_impl(s, what, std::move(fn), nullptr);
}

bool find_allocation(void const* p, std::size_t bytes, Allocation* out) {
  auto& R = rt();
  auto a = reinterpret_cast<std::uintptr_t>(p);
  Lock lock(R.m);
  auto it = R.allocations.upper_bound(a);
  if (it == R.allocations.begin()) return false;
  --it;
  Allocation const& al = it->second;
  auto base = reinterpret_cast<std::uintptr_t>(al.base);
  if (a < base || a - base >= al.bytes) return false;  // a one-past-the-end pointer belongs to the next object
  if (bytes > al.bytes - (a - base)) return false;
  if (out) *out = al;
  return true;
}

bool is_device_range(void const* p, std::size_t bytes) {
  Allocation a;
  return find_allocation(p, bytes, &a) && a.device >= 0;
}

cudaError_t launch_kernel(LaunchSpec const& spec, std::function<void()> thread_body) {
  int dev = stream_device(spec.stream);
  if (cudaError_t e = sticky(dev)) return record(e);
  char const* name = kernel_name(spec.kernel);
  dim3 const g = spec.grid, b = spec.block;
  auto bad = [&](cudaError_t e, std::string const& why) {
    return fail(e, std::string("launch of ") + name + ": " + why);
  };
  unsigned long long threads = 1ull * b.x * b.y * b.z;
  if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64)
    return bad(cudaErrorInvalidConfiguration, "block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," +
                                                  std::to_string(b.z) + ") exceeds the limits (at most 1024 threads; "
                                                  "x, y <= 1024, z <= 64) or is empty");
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535)
    return bad(cudaErrorInvalidConfiguration, "grid (" + std::to_string(g.x) + "," + std::to_string(g.y) + "," +
                                                  std::to_string(g.z) + ") is empty or exceeds (2^31-1, 65535, 65535)");
  int allowed = 48 * 1024;
  {
    Lock lock(rt().m);
    auto& fs = rt().devices[static_cast<std::size_t>(dev)].func_smem;
    if (auto it = fs.find(spec.kernel); it != fs.end()) allowed = it->second;
  }
  if (spec.shared_bytes > static_cast<std::size_t>(allowed))
    return bad(cudaErrorInvalidValue, std::to_string(spec.shared_bytes) + " bytes of dynamic shared memory, but the "
                                          "kernel's cudaFuncAttributeMaxDynamicSharedMemorySize is " + std::to_string(allowed));
  auto run = std::make_shared<KernelRun>();
  run->kernel = spec.kernel;
  run->name = name;
  run->grid = g;
  run->block = b;
  run->shared_bytes = spec.shared_bytes;
  run->body = std::move(thread_body);
  // The operation holds the only reference, so the worker (not this thread) releases the launch.
  cudaError_t e = enqueue_impl(spec.stream, name, [run = std::move(run), dev] {
    std::string error;
    if (!run_kernel(*run, &error)) set_sticky(dev, cudaErrorLaunchFailure, error);
  }, nullptr);
  return e == cudaSuccess ? e : record(e);
}

std::string last_kernel_error() {
  Lock lock(rt().m);
  return rt().devices[static_cast<std::size_t>(tl_device)].sticky_msg;
}

void reset_errors() {
  cudaDeviceSynchronize();
  Lock lock(rt().m);
  for (auto& d : rt().devices) {
    d.sticky = 0;
    d.sticky_msg.clear();
  }
  tl_last = cudaSuccess;
}

Counters counters() {
  return {rt().kernels.load(), rt().blocks.load(), rt().switches.load(), rt().host_syncs.load(), rt().device_to_host.load()};
}

namespace {
std::mutex g_inject_m;
// (API, device or -1 for any device) -> calls left until the one that fails
std::map<std::pair<std::string, int>, int> g_inject;
std::atomic<long long> g_live_streams{0}, g_live_events{0};
}  // namespace

void fail_nth_call_on_device(std::string const& api, int device, int nth) {
  std::lock_guard<std::mutex> lock(g_inject_m);
  if (nth <= 0)
    g_inject.erase({api, device});
  else
    g_inject[{api, device}] = nth;
}

void fail_nth_call(std::string const& api, int nth) { fail_nth_call_on_device(api, -1, nth); }

bool injected_failure(char const* api) {
  std::lock_guard<std::mutex> lock(g_inject_m);
  bool fails = false;
  for (int device : {-1, tl_device}) {  // every armed count that this call falls under counts it
    auto it = g_inject.find({api, device});
    if (it == g_inject.end()) continue;
    if (--it->second > 0) continue;
    g_inject.erase(it);
    fails = true;
  }
  return fails;
}

Resources live_resources() {
  Resources r;
  r.streams = g_live_streams.load();
  r.events = g_live_events.load();
  Lock lock(rt().m);
  for (auto const& [base, a] : rt().allocations) (a.device >= 0 ? r.device_allocations : r.host_allocations) += 1;
  return r;
}

}  // namespace emu

using namespace emu;
using namespace emu::detail;

// ---------------------------------------------------------------------------------------------
// Errors.
// ---------------------------------------------------------------------------------------------
char const* cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define MOE_EMU_NAME(x) \
  case x:               \
    return #x;
    MOE_EMU_NAME(cudaSuccess)
    MOE_EMU_NAME(cudaErrorInvalidValue)
    MOE_EMU_NAME(cudaErrorMemoryAllocation)
    MOE_EMU_NAME(cudaErrorInitializationError)
    MOE_EMU_NAME(cudaErrorInvalidConfiguration)
    MOE_EMU_NAME(cudaErrorInvalidPitchValue)
    MOE_EMU_NAME(cudaErrorInvalidSymbol)
    MOE_EMU_NAME(cudaErrorInvalidDevicePointer)
    MOE_EMU_NAME(cudaErrorInvalidMemcpyDirection)
    MOE_EMU_NAME(cudaErrorInvalidDeviceFunction)
    MOE_EMU_NAME(cudaErrorNoDevice)
    MOE_EMU_NAME(cudaErrorInvalidDevice)
    MOE_EMU_NAME(cudaErrorNoKernelImageForDevice)
    MOE_EMU_NAME(cudaErrorInvalidResourceHandle)
    MOE_EMU_NAME(cudaErrorNotReady)
    MOE_EMU_NAME(cudaErrorIllegalAddress)
    MOE_EMU_NAME(cudaErrorLaunchOutOfResources)
    MOE_EMU_NAME(cudaErrorAssert)
    MOE_EMU_NAME(cudaErrorIllegalInstruction)
    MOE_EMU_NAME(cudaErrorLaunchFailure)
    MOE_EMU_NAME(cudaErrorNotPermitted)
    MOE_EMU_NAME(cudaErrorNotSupported)
    MOE_EMU_NAME(cudaErrorStreamCaptureUnsupported)
    MOE_EMU_NAME(cudaErrorStreamCaptureInvalidated)
    MOE_EMU_NAME(cudaErrorStreamCaptureMerge)
    MOE_EMU_NAME(cudaErrorStreamCaptureUnmatched)
    MOE_EMU_NAME(cudaErrorStreamCaptureUnjoined)
    MOE_EMU_NAME(cudaErrorStreamCaptureIsolation)
    MOE_EMU_NAME(cudaErrorStreamCaptureImplicit)
    MOE_EMU_NAME(cudaErrorCapturedEvent)
    MOE_EMU_NAME(cudaErrorStreamCaptureWrongThread)
    MOE_EMU_NAME(cudaErrorUnknown)
#undef MOE_EMU_NAME
  }
  return "cudaErrorUnknown";
}
char const* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnjoined: return "capture was not joined with the origin stream";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorStreamCaptureUnmatched: return "the capture was not initiated in this stream";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    default: return cudaGetErrorName(e);
  }
}
cudaError_t cudaGetLastError() {
  if (cudaError_t s = sticky(tl_device)) return s;
  cudaError_t e = tl_last;
  tl_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  if (cudaError_t s = sticky(tl_device)) return s;
  return tl_last;
}

// ---------------------------------------------------------------------------------------------
// Devices.
// ---------------------------------------------------------------------------------------------
cudaError_t cudaGetDeviceCount(int* n) {
  if (!n) return record(cudaErrorInvalidValue);
  *n = device_count();
  return *n > 0 ? cudaSuccess : record(cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(d) + "): no such device");
  tl_device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  if (!d) return record(cudaErrorInvalidValue);
  *d = tl_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (!p) return record(cudaErrorInvalidValue);
  if (d < 0 || d >= device_count()) return record(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3 (moe-emu)");
  p->totalGlobalMem = 85520809984ull;
  p->sharedMemPerBlock = 49152;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->clockRate = 1980000;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->memoryClockRate = 2619000;
  p->memoryBusWidth = 5120;
  p->l2CacheSize = 52428800;
  p->maxThreadsPerMultiProcessor = 2048;
  p->sharedMemPerBlockOptin = 232448;
  p->sharedMemPerMultiprocessor = 233472;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
  if (!v) return record(cudaErrorInvalidValue);
  cudaDeviceProp p;
  if (cudaError_t e = cudaGetDeviceProperties(&p, d)) return e;
  switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *v = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxGridDimX: *v = p.maxGridSize[0]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrClockRate: *v = p.clockRate; break;
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrL2CacheSize: *v = p.l2CacheSize; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *v = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = static_cast<int>(p.sharedMemPerMultiprocessor); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = static_cast<int>(p.sharedMemPerBlockOptin); break;
    default: return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute " + std::to_string(a) + " is not modelled");
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  if (cudaError_t e = unsafe_call("cudaDeviceSynchronize")) return e;
  ++rt().host_syncs;
  std::vector<Stream*> streams;
  {
    Lock lock(rt().m);
    streams = rt().devices[static_cast<std::size_t>(tl_device)].streams;
  }
  for (Stream* s : streams)
    if (std::uint64_t n = enqueued(s)) wait_for(s, n);
  return record(sticky(tl_device));
}
cudaError_t cudaDeviceReset() {
  cudaDeviceSynchronize();
  emu::reset_errors();
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  std::size_t total = 85520809984ull, used;
  {
    Lock lock(rt().m);
    used = rt().devices[static_cast<std::size_t>(tl_device)].allocated;
  }
  if (free_bytes) *free_bytes = used < total ? total - used : 0;
  if (total_bytes) *total_bytes = total;
  return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// Memory.
// ---------------------------------------------------------------------------------------------
namespace {
cudaError_t allocate(void** p, std::size_t bytes, int device, char const* api) {
  if (!p) return fail(cudaErrorInvalidValue, std::string(api) + ": null output pointer");
  if (cudaError_t e = sticky(tl_device)) return record(e);
  if (cudaError_t e = unsafe_call(api)) return e;
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  if (bytes > (std::size_t{1} << 40)) return fail(cudaErrorMemoryAllocation, std::string(api) + ": " + std::to_string(bytes) + " bytes");
  if (injected_failure(api)) return fail(cudaErrorMemoryAllocation, std::string(api) + ": out of memory (injected by the test)");
  void* m = nullptr;
  // The exact size: AddressSanitizer sees a one-byte overrun past the end.
  if (posix_memalign(&m, 256, bytes) != 0 || !m) return fail(cudaErrorMemoryAllocation, std::string(api) + ": out of memory");
  std::memset(m, 0xff, bytes);  // uninitialised device memory reads as NaN / -1
  {
    Lock lock(rt().m);
    rt().allocations[reinterpret_cast<std::uintptr_t>(m)] = Allocation{m, bytes, device};
    if (device >= 0) rt().devices[static_cast<std::size_t>(device)].allocated += bytes;
  }
  *p = m;
  return cudaSuccess;
}
cudaError_t release_memory(void* p, bool device, char const* api) {
  if (!p) return cudaSuccess;
  if (cudaError_t e = unsafe_call(api)) return e;
  // cudaFree synchronises the device: no queued work may still use the memory.
  if (device) cudaDeviceSynchronize();
  Allocation a;
  {
    Lock lock(rt().m);
    auto it = rt().allocations.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == rt().allocations.end() || (it->second.device >= 0) != device) {
      lock.unlock();
      return fail(cudaErrorInvalidValue, std::string(api) + ": the pointer was not returned by " +
                                             (device ? "cudaMalloc" : "cudaMallocHost") + " (or was freed already)");
    }
    a = it->second;
    rt().allocations.erase(it);
    if (a.device >= 0) rt().devices[static_cast<std::size_t>(a.device)].allocated -= a.bytes;
  }
  std::free(a.base);
  return cudaSuccess;
}

/// Checks a memcpy's ranges against its direction.
cudaError_t check_copy(void* dst, void const* src, std::size_t bytes, cudaMemcpyKind kind, char const* api) {
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue, std::string(api) + ": null pointer");
  Allocation a;
  bool const dst_dev = find_allocation(dst, 0, &a) && a.device >= 0;
  bool const src_dev = find_allocation(src, 0, &a) && a.device >= 0;
  bool need_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice || (kind == cudaMemcpyDefault && dst_dev);
  bool need_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice || (kind == cudaMemcpyDefault && src_dev);
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return fail(cudaErrorInvalidMemcpyDirection, std::string(api) + ": bad kind");
  if (need_dst && !is_device_range(dst, bytes))
    return fail(cudaErrorInvalidValue, std::string(api) + ": destination [" + std::to_string(reinterpret_cast<std::uintptr_t>(dst)) +
                                           ", +" + std::to_string(bytes) + ") is not inside one device allocation");
  if (need_src && !is_device_range(src, bytes))
    return fail(cudaErrorInvalidValue, std::string(api) + ": source of " + std::to_string(bytes) +
                                           " bytes is not inside one device allocation");
  if (kind == cudaMemcpyHostToDevice && src_dev)
    return fail(cudaErrorInvalidValue, std::string(api) + ": cudaMemcpyHostToDevice from device memory");
  if (kind == cudaMemcpyDeviceToHost && dst_dev)
    return fail(cudaErrorInvalidValue, std::string(api) + ": cudaMemcpyDeviceToHost into device memory");
  if (!dst_dev && (kind == cudaMemcpyDeviceToHost || (kind == cudaMemcpyDefault && src_dev))) ++rt().device_to_host;
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMalloc(void** p, std::size_t bytes) { return allocate(p, bytes, tl_device, "cudaMalloc"); }
cudaError_t cudaFree(void* p) { return release_memory(p, true, "cudaFree"); }
cudaError_t cudaMallocHost(void** p, std::size_t bytes) { return allocate(p, bytes, -1, "cudaMallocHost"); }
cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned) { return allocate(p, bytes, -1, "cudaHostAlloc"); }
cudaError_t cudaFreeHost(void* p) { return release_memory(p, false, "cudaFreeHost"); }

cudaError_t cudaMemcpyAsync(void* dst, void const* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  if (cudaError_t e = check_copy(dst, src, bytes, kind, "cudaMemcpyAsync")) return e;
  if (bytes == 0) return cudaSuccess;
  return static_cast<cudaError_t>(enqueue(s, "cudaMemcpyAsync", [dst, src, bytes] { std::memmove(dst, src, bytes); }));
}
cudaError_t cudaMemcpy(void* dst, void const* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (cudaError_t e = unsafe_call("cudaMemcpy")) return e;
  if (cudaError_t e = check_copy(dst, src, bytes, kind, "cudaMemcpy")) return e;
  ++rt().host_syncs;
  Stream* s = legacy_stream(tl_device);
  std::uint64_t seq = 0;
  if (cudaError_t e = enqueue_impl(s, "cudaMemcpy", [dst, src, bytes] { if (bytes) std::memmove(dst, src, bytes); }, &seq))
    return e;
  wait_for(s, seq);
  return record(sticky(tl_device));
}
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t s) {
  if (bytes == 0) return cudaSuccess;
  if (!is_device_range(p, bytes))
    return fail(cudaErrorInvalidValue, "cudaMemsetAsync: " + std::to_string(bytes) + " bytes are not inside one device allocation");
  return static_cast<cudaError_t>(enqueue(s, "cudaMemsetAsync", [p, value, bytes] { std::memset(p, value, bytes); }));
}
cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  if (cudaError_t e = unsafe_call("cudaMemset")) return e;
  return cudaMemsetAsync(p, value, bytes, nullptr);
}

// ---------------------------------------------------------------------------------------------
// Streams.
// ---------------------------------------------------------------------------------------------
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  if (!s) return record(cudaErrorInvalidValue);
  if (flags & ~cudaStreamNonBlocking) return fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: unknown flags");
  if (injected_failure("cudaStreamCreateWithFlags"))
    return fail(cudaErrorMemoryAllocation, "cudaStreamCreateWithFlags: out of resources (injected by the test)");
  ++g_live_streams;
  legacy_stream(tl_device);
  Stream* n = new_stream(tl_device, false, (flags & cudaStreamNonBlocking) == 0);
  {
    Lock lock(rt().m);
    rt().devices[static_cast<std::size_t>(tl_device)].streams.push_back(n);
  }
  *s = n;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: the legacy stream cannot be destroyed");
  {
    Lock lock(rt().m);
    auto& list = rt().devices[static_cast<std::size_t>(s->device)].streams;
    auto it = std::find(list.begin(), list.end(), s);
    if (it == list.end()) {
      lock.unlock();
      return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: not a live stream");
    }
    if (s->capture) {
      lock.unlock();
      return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamDestroy: the stream is capturing");
    }
    list.erase(it);
    rt().zombies.push_back(s);
  }
  --g_live_streams;
  // Work already queued still runs (the real call returns at once and releases the stream later).
  put(s, std::make_unique<Stream::Op>(Stream::Op{nullptr, "stop", {}, 0, true}));
  s->worker.detach();
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return sync_stream(resolve(s), "cudaStreamSynchronize"); }
cudaError_t cudaStreamQuery(cudaStream_t h) {
  Stream* s = resolve(h);
  cudaError_t err = cudaSuccess;
  if (!host_sync_ok(s, "cudaStreamQuery", &err)) return err;
  if (cudaError_t e = sticky(s->device)) return record(e);
  return done(s, enqueued(s)) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t h, cudaStreamCaptureMode mode) {
  if (!h) return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture: the legacy stream cannot capture");
  Lock lock(rt().m);
  if (h->capture) {
    lock.unlock();
    return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture: the stream already captures");
  }
  auto* c = new Capture();
  c->graph = new CUgraph_st();
  c->origin = h;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->streams.push_back(h);
  h->capture = c;
  h->frontier.clear();
  rt().captures.push_back(c);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t h, cudaGraph_t* g) {
  if (!g) return record(cudaErrorInvalidValue);
  *g = nullptr;
  Lock lock(rt().m);
  if (!h || !h->capture) {
    lock.unlock();
    return fail(cudaErrorInvalidValue, "cudaStreamEndCapture: the stream is not capturing");
  }
  Capture* c = h->capture;
  if (c->origin != h) {
    lock.unlock();
    return fail(cudaErrorStreamCaptureUnmatched, "cudaStreamEndCapture: called on a stream that joined the capture, not on its origin");
  }
  if (c->mode == cudaStreamCaptureModeThreadLocal && c->thread != std::this_thread::get_id()) {
    lock.unlock();
    return fail(cudaErrorStreamCaptureWrongThread, "cudaStreamEndCapture: a thread-local capture ended by another thread");
  }
  // Every joined stream's last work must be an ancestor of the origin's last work.
  std::set<Node*> reach;
  std::vector<Node*> stack(h->frontier.begin(), h->frontier.end());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (!reach.insert(n).second) continue;
    for (Node* d : n->deps) stack.push_back(d);
  }
  bool unjoined = false;
  for (Stream* s : c->streams)
    if (s != h)
      for (Node* n : s->frontier)
        if (!reach.count(n)) unjoined = true;
  for (Stream* s : c->streams) {
    s->capture = nullptr;
    s->frontier.clear();
  }
  auto& cs = rt().captures;
  cs.erase(std::remove(cs.begin(), cs.end(), c), cs.end());
  bool invalid = c->invalidated;
  CUgraph_st* graph = c->graph;
  delete c;
  lock.unlock();
  if (invalid) {
    delete graph;
    return fail(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture: the capture was invalidated by an earlier error");
  }
  if (unjoined) {
    delete graph;
    return fail(cudaErrorStreamCaptureUnjoined,
                "cudaStreamEndCapture: a stream that joined the capture was not joined back into the origin stream");
  }
  *g = graph;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t h, cudaStreamCaptureStatus* st) {
  if (!st) return record(cudaErrorInvalidValue);
  Stream* s = resolve(h);
  Lock lock(rt().m);
  if (s->legacy) {
    if (capturing_blocking_stream(s->device)) {
      lock.unlock();
      return record(cudaErrorStreamCaptureImplicit);
    }
    *st = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  *st = !s->capture ? cudaStreamCaptureStatusNone
                    : (s->capture->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive);
  return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// Events.
// ---------------------------------------------------------------------------------------------
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  if (!e) return record(cudaErrorInvalidValue);
  if (injected_failure("cudaEventCreateWithFlags"))
    return fail(cudaErrorMemoryAllocation, "cudaEventCreateWithFlags: out of resources (injected by the test)");
  ++g_live_events;
  auto* ev = new CUevent_st();
  ev->device = tl_device;
  ev->flags = flags;
  *e = ev;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return record(cudaErrorInvalidResourceHandle);
  // Pending records still complete; the event object is kept (the real one is released later).
  --g_live_events;
  Lock lock(rt().m);
  rt().dead_events.emplace_back(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t h) {
  if (!e) return record(cudaErrorInvalidResourceHandle);
  Stream* s = resolve(h);
  {
    Lock lock(rt().m);
    if (s->capture) {
      e->capture = s->capture;
      e->nodes = s->frontier;
      return cudaSuccess;
    }
  }
  std::uint64_t seq = 0;
  cudaError_t r = enqueue_impl(h, "cudaEventRecord", [e] {
    using namespace std::chrono;
    e->time_ms = duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
  }, &seq);
  if (r) return r;
  e->capture = nullptr;
  e->stream = s;
  e->seq = seq;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t e, unsigned) {
  if (!e) return record(cudaErrorInvalidResourceHandle);
  Stream* s = resolve(h);
  {
    Lock lock(rt().m);
    if (e->capture) {
      Capture* c = e->capture;
      if (std::find(rt().captures.begin(), rt().captures.end(), c) == rt().captures.end()) {
        lock.unlock();
        return fail(cudaErrorStreamCaptureIsolation, "cudaStreamWaitEvent: the event was recorded in a capture that has ended");
      }
      if (s->legacy) {
        lock.unlock();
        return fail(cudaErrorStreamCaptureImplicit, "cudaStreamWaitEvent: the legacy stream cannot join a capture");
      }
      if (s->capture && s->capture != c) {
        lock.unlock();
        return fail(cudaErrorStreamCaptureMerge, "cudaStreamWaitEvent: the stream captures another graph");
      }
      if (!s->capture) {  // the stream joins the capture
        s->capture = c;
        s->frontier = e->nodes;
        c->streams.push_back(s);
      } else {
        for (Node* n : e->nodes)
          if (std::find(s->frontier.begin(), s->frontier.end(), n) == s->frontier.end()) s->frontier.push_back(n);
      }
      return cudaSuccess;
    }
    if (s->capture) {
      if (!e->stream) return cudaSuccess;
      s->capture->invalidated = true;
      lock.unlock();
      return fail(cudaErrorStreamCaptureIsolation,
                  "cudaStreamWaitEvent: a capturing stream waits on an event recorded outside the capture");
    }
  }
  if (!e->stream) return cudaSuccess;  // never recorded: no dependency
  Stream* src = e->stream;
  std::uint64_t seq = e->seq;
  if (src == s) return cudaSuccess;
  if (cudaError_t r = sticky(s->device)) return record(r);
  // A no-op on s that depends on the record.
  put(s, std::make_unique<Stream::Op>(Stream::Op{nullptr, "cudaStreamWaitEvent", {{src, seq}}, 0, false}));
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return record(cudaErrorInvalidResourceHandle);
  if (e->capture) return fail(cudaErrorStreamCaptureUnsupported, "cudaEventSynchronize on an event recorded in a capture");
  if (cudaError_t r = unsafe_call("cudaEventSynchronize")) return r;
  ++rt().host_syncs;
  if (e->stream) wait_for(e->stream, e->seq);
  return record(sticky(e->device));
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return record(cudaErrorInvalidResourceHandle);
  if (!e->stream) return cudaSuccess;
  if (!done(e->stream, e->seq)) return cudaErrorNotReady;
  san::acquire(&e->stream->done_hb[e->seq % 1024]);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!ms || !a || !b) return record(cudaErrorInvalidValue);
  if ((a->flags | b->flags) & cudaEventDisableTiming)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was created with cudaEventDisableTiming");
  if (!a->stream || !b->stream) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was never recorded");
  if (!done(a->stream, a->seq) || !done(b->stream, b->seq)) return cudaErrorNotReady;
  *ms = static_cast<float>(b->time_ms.load() - a->time_ms.load());
  return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// Graphs.
// ---------------------------------------------------------------------------------------------
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long) {
  if (!exec || !g) return fail(cudaErrorInvalidValue, "cudaGraphInstantiate: null graph or output");
  auto* x = new CUgraphExec_st();
  std::map<Stream*, int> lanes;
  for (auto const& n : g->nodes) {
    auto [it, fresh] = lanes.emplace(n->origin, static_cast<int>(lanes.size()));
    CUgraphExec_st::Step st{n->fn, n->what, {}, it->second};
    for (Node* d : n->deps) st.deps.push_back(d->index);
    x->steps.push_back(std::move(st));
  }
  x->lanes = static_cast<int>(lanes.size());
  *exec = x;
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t h) {
  if (!x) return fail(cudaErrorInvalidValue, "cudaGraphLaunch: null executable graph");
  int dev = stream_device(h);
  return static_cast<cudaError_t>(enqueue(h, "cudaGraphLaunch", [x, dev] {
    std::size_t const n = x->steps.size();
    if (n == 0) return;
    // Lane l runs its nodes in capture order on its own thread; a node first waits for its
    // dependencies from other lanes.
    auto finished = std::make_unique<std::atomic<int>[]>(n);
    auto hb = std::make_unique<char[]>(n);
    std::mutex m;
    std::condition_variable cv;
    auto run_lane = [&](int lane) {
      cudaSetDevice(dev);
      for (std::size_t i = 0; i < n; ++i) {
        auto const& st = x->steps[i];
        if (st.lane != lane) continue;
        for (int d : st.deps) {
          {
            san::IgnoreSync quiet;
            std::unique_lock lock(m);
            cv.wait(lock, [&] { return finished[static_cast<std::size_t>(d)].load() != 0; });
          }
          san::acquire(&hb[static_cast<std::size_t>(d)]);
        }
        if (st.fn && sticky(dev) == cudaSuccess) {
          try {
            st.fn();
          } catch (std::exception const& e) {
            set_sticky(dev, cudaErrorLaunchFailure, std::string("moe-emu: graph node ") + st.what + " failed: " + e.what());
          }
        }
        san::release(&hb[i]);
        {
          san::IgnoreSync quiet;
          std::lock_guard lock(m);
          finished[i] = 1;
        }
        cv.notify_all();
      }
    };
    std::vector<std::thread> threads;
    for (int l = 1; l < x->lanes; ++l) threads.emplace_back(run_lane, l);
    run_lane(0);
    for (auto& t : threads) t.join();
    for (std::size_t i = 0; i < n; ++i) san::acquire(&hb[i]);
  }));
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
  // Launches still queued keep using it; executable graphs are small and kept until exit.
  if (!x) return record(cudaErrorInvalidValue);
  Lock lock(rt().m);
  rt().dead_execs.emplace_back(x);
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t* nodes, std::size_t* count) {
  if (!g || !count) return record(cudaErrorInvalidValue);
  if (nodes)
    for (std::size_t i = 0; i < std::min(*count, g->nodes.size()); ++i) nodes[i] = reinterpret_cast<cudaGraphNode_t>(g->nodes[i].get());
  *count = g->nodes.size();
  return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// Function attributes.
// ---------------------------------------------------------------------------------------------
cudaError_t cudaFuncSetAttribute(void const* fn, cudaFuncAttribute a, int value) {
  if (!fn) return record(cudaErrorInvalidDeviceFunction);
  if (a == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > 232448)
      return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: " + std::to_string(value) +
                                             " bytes of dynamic shared memory exceed the H100's 232448 (227 KB)");
    Lock lock(rt().m);
    rt().devices[static_cast<std::size_t>(tl_device)].func_smem[fn] = value;
    return cudaSuccess;
  }
  if (a == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
  return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute not modelled");
}
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, void const* fn) {
  if (!attr || !fn) return record(cudaErrorInvalidValue);
  attr->sharedSizeBytes = 0;
  attr->maxThreadsPerBlock = 1024;
  Lock lock(rt().m);
  auto& fs = rt().devices[static_cast<std::size_t>(tl_device)].func_smem;
  auto it = fs.find(fn);
  attr->maxDynamicSharedSizeBytes = it == fs.end() ? 48 * 1024 : it->second;
  return cudaSuccess;
}
