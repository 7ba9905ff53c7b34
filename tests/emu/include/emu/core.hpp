#pragma once
// moe-emu core: the CUDA execution model on the CPU, for the project's tests only (never installed).
//
// A kernel launch runs its blocks one after another on the stream's worker thread; the threads of
// a block are fibers scheduled cooperatively on that worker (a fiber runs until it waits at a
// barrier, a warp collective or exits). `__shared__` variables are `static thread_local`, which is
// correct because one OS thread runs one block at a time. Everything here is plain C++20 (g++ 12 or
// clang 14 on); the CUDA headers the library includes (<cuda_runtime.h>, <cublas_v2.h>, <nccl.h>, <mma.h>,
// <cub/...>) are replaced by the headers in tests/emu/include, which forward to this one.
//
// The shims for CUDA libraries (CUB, cuBLAS, WMMA, NCCL, the sm_90 PTX models) are written on the
// primitives declared in namespace emu below: enqueue() for stream-ordered host work,
// warp_collective() / group_collective() for operations a warp or warpgroup performs together,
// kernel_fail() for contract violations found inside a kernel, and the allocation registry for
// checking device pointers.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

#include "emu/where.hpp"

// ---------------------------------------------------------------------------------------------
// Keywords. nvcc's execution-space and memory-space specifiers become plain C++.
// ---------------------------------------------------------------------------------------------
#define MOE_CUDA_EMULATOR 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static thread_local
#define __constant__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/// Dynamic shared memory: `MOE_EXTERN_SHARED(unsigned char, name);` declares `name` as the launch's
/// dynamic shared-memory buffer (nvcc: `extern __shared__ unsigned char name[];`).
#define MOE_EMU_EXTERN_SHARED(type, name) type* const name = static_cast<type*>(::emu::dynamic_shared())

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x, y, z;
};

namespace emu {

/// Where a fiber is: its indices and the launch it belongs to. Valid only inside a kernel.
struct ThreadInfo {
  uint3 thread;         ///< threadIdx
  uint3 block;          ///< blockIdx
  dim3 block_dim;       ///< blockDim
  dim3 grid_dim;        ///< gridDim
  int linear;           ///< thread index in the block, x fastest
  int lane;             ///< linear % 32
  int warp;             ///< linear / 32
  int block_threads;    ///< threads in the block
  char const* kernel;   ///< demangled kernel name (or its address)
};

/// The calling fiber's indices. Calling it outside a kernel is an emulator error.
ThreadInfo const& self();
/// True inside a kernel (on a fiber).
bool in_kernel();

/// Emulator error inside a kernel: prints "moe-emu: <kernel> block (x,y,z) thread (x,y,z): what" to
/// stderr, abandons the launch (the other threads of the block stop where they are, later blocks
/// do not run), and makes cudaErrorLaunchFailure sticky, as a device fault would. Outside a kernel
/// it throws std::logic_error.
[[noreturn]] void kernel_fail(std::string const& what);

/// __syncthreads() with the call site used to detect threads waiting at different barriers.
void block_barrier(::emu::Where where);

/// A non-owning reference to a callable taking the participants' pointers. The collectives run it
/// before they return, so the referenced lambda outlives every use. Unlike std::function it never
/// allocates: when a kernel fails, the emulator abandons its waiting fibers without unwinding them,
/// and an owning wrapper on such a fiber's stack would leak (LeakSanitizer reported exactly that for
/// a capture too large for std::function's inline buffer).
class CollectiveFn {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, CollectiveFn> && std::is_invocable_v<F&, void* const*>)
  CollectiveFn(F&& f) noexcept  // NOLINT(google-explicit-constructor): built from a lambda at each call
      : obj_(const_cast<void*>(static_cast<void const*>(&f))),
        call_([](void* o, void* const* p) { (*static_cast<std::remove_reference_t<F>*>(o))(p); }) {}
  void operator()(void* const* p) const { call_(obj_, p); }

 private:
  void* obj_;
  void (*call_)(void*, void* const*);
};

/// A warp-level rendezvous. Every lane named in `mask` calls it (the caller must be in `mask`; every
/// lane in `mask` must exist and must not have exited). `mine` is this lane's contribution. When
/// the last lane arrives, `fn(lanes)` runs once, on that lane's fiber, with `lanes[l]` = the `mine`
/// pointer of lane l (nullptr for lanes outside the mask); then every lane continues. `what` names
/// the operation in error messages (lanes meeting at different operations, or the same operation
/// with different masks, are a divergence error).
void warp_collective(unsigned mask, char const* what, void* mine,
                     CollectiveFn fn, ::emu::Where where);

/// The same for a group of `count` consecutive threads starting at a multiple of `count` (count =
/// 128: a Hopper warpgroup). Every thread of the group must call it. `threads[i]` is the pointer of
/// the group's i-th thread.
void group_collective(int count, char const* what, void* mine, CollectiveFn fn,
                      ::emu::Where where);

/// A number that identifies the block in progress on this worker, unique in the process (shims keep
/// per-block state, e.g. the sm_90 models' pending cp.async and wgmma groups, and reset it when the
/// number changes).
std::uint64_t block_serial();

/// The launch's dynamic shared memory (the bytes given to the launch; 0 bytes gives a valid pointer
/// to an empty buffer). Its first byte is at shared-window address 0 (see shared_address()).
void* dynamic_shared();
std::size_t dynamic_shared_bytes();
/// The 32-bit shared-window address of a pointer into the dynamic shared memory
/// (__cvta_generic_to_shared); kernel_fail for any other pointer.
std::uint32_t shared_address(void const* p);
/// The pointer for a shared-window address and a length; kernel_fail when it leaves the buffer.
void* shared_pointer(std::uint32_t addr, std::size_t bytes);

// ---------------------------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------------------------

/// One allocation of device (cudaMalloc) or pinned host (cudaMallocHost) memory.
struct Allocation {
  void* base = nullptr;
  std::size_t bytes = 0;
  int device = -1;       ///< -1 for pinned host memory
};
/// The live allocation holding [p, p + bytes), if any (bytes = 0: the one holding p).
bool find_allocation(void const* p, std::size_t bytes, Allocation* out);
/// True when [p, p + bytes) lies inside one live cudaMalloc allocation.
bool is_device_range(void const* p, std::size_t bytes);

/// Opaque stream handle (cudaStream_t is `emu::Stream*`; nullptr is the legacy default stream).
struct Stream;
/// Stream-ordered host work: `fn` runs on the stream's worker after everything enqueued before it
/// (and, for the legacy stream, after the blocking streams' earlier work). While the stream
/// captures a graph, `fn` becomes a graph node instead and runs at each cudaGraphLaunch. Returns
/// cudaSuccess or the error the call must report (e.g. a sticky error, a capture violation). The
/// value is a cudaError_t.
int enqueue(Stream* s, char const* what, std::function<void()> fn);
/// The device the calling host thread uses (cudaSetDevice), and the stream's device.
int current_device();
int stream_device(Stream* s);

/// Prints "moe-emu: <msg>" on stderr (a diagnostic accompanying an error code a shim returns).
void diagnose(std::string const& msg);

}  // namespace emu
