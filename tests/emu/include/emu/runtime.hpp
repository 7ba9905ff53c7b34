#pragma once
// moe-emu runtime: the subset of the CUDA runtime API the project uses, with the real API's
// contracts (legacy default-stream ordering, non-blocking streams, events as the only cross-stream
// ordering, graph capture and replay, sticky and non-sticky errors, function and device
// attributes of an H100 SXM: sm_90, 132 SMs, 227 KB of opt-in shared memory per block).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "emu/core.hpp"
#include "emu/device.hpp"

enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidPitchValue = 12,
  cudaErrorInvalidSymbol = 13,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoKernelImageForDevice = 209,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorAssert = 710,
  cudaErrorIllegalInstruction = 715,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotPermitted = 800,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureMerge = 902,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorUnknown = 999,
};

using cudaStream_t = emu::Stream*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
struct CUgraph_st;
using cudaGraph_t = CUgraph_st*;
struct CUgraphExec_st;
using cudaGraphExec_t = CUgraphExec_st*;
struct CUgraphNode_st;
using cudaGraphNode_t = CUgraphNode_st*;

enum cudaMemcpyKind : int {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaStreamCaptureStatus : int {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaStreamCaptureMode : int {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaFuncAttribute : int {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
enum cudaDeviceAttr : int {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxBlockDimX = 2,
  cudaDevAttrMaxGridDimX = 5,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrClockRate = 13,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrL2CacheSize = 38,
  cudaDevAttrMaxThreadsPerMultiProcessor = 39,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

inline constexpr unsigned cudaStreamDefault = 0x0;
inline constexpr unsigned cudaStreamNonBlocking = 0x1;
inline constexpr unsigned cudaEventDefault = 0x0;
inline constexpr unsigned cudaEventBlockingSync = 0x1;
inline constexpr unsigned cudaEventDisableTiming = 0x2;
inline constexpr unsigned cudaHostAllocDefault = 0x0;
#define cudaStreamLegacy (static_cast<cudaStream_t>(nullptr))

struct cudaDeviceProp {
  char name[256];
  std::size_t totalGlobalMem;
  std::size_t sharedMemPerBlock;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int clockRate;
  int major;
  int minor;
  int multiProcessorCount;
  int memoryClockRate;
  int memoryBusWidth;
  int l2CacheSize;
  int maxThreadsPerMultiProcessor;
  std::size_t sharedMemPerBlockOptin;
  std::size_t sharedMemPerMultiprocessor;
};
struct cudaFuncAttributes {
  std::size_t sharedSizeBytes;
  int maxThreadsPerBlock;
  int maxDynamicSharedSizeBytes;
};

char const* cudaGetErrorString(cudaError_t e);
char const* cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();

cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d);
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaDeviceReset();
cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes);

cudaError_t cudaMalloc(void** p, std::size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** p, std::size_t bytes) { return cudaMalloc(reinterpret_cast<void**>(p), bytes); }
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, std::size_t bytes);
template <class T>
cudaError_t cudaMallocHost(T** p, std::size_t bytes) { return cudaMallocHost(reinterpret_cast<void**>(p), bytes); }
cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemcpy(void* dst, void const* src, std::size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, void const* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* p, int value, std::size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t s = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status);

cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t* nodes, std::size_t* count);

cudaError_t cudaFuncSetAttribute(void const* fn, cudaFuncAttribute a, int value);
template <class... P>
cudaError_t cudaFuncSetAttribute(void (*fn)(P...), cudaFuncAttribute a, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<void const*>(fn), a, value);
}
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, void const* fn);
template <class... P>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, void (*fn)(P...)) {
  return cudaFuncGetAttributes(attr, reinterpret_cast<void const*>(fn));
}

namespace emu {

/// One kernel launch: `body(block)` runs one thread (fiber) of block `block` (see launch()).
struct LaunchSpec {
  void const* kernel;             ///< the kernel's address (function attributes, its name)
  dim3 grid, block;
  std::size_t shared_bytes;
  cudaStream_t stream;
};
/// Checks the configuration (a non-sticky error for a bad one, as the real launch reports it) and
/// enqueues the launch. `thread_body` is called on each fiber.
cudaError_t launch_kernel(LaunchSpec const& spec, std::function<void()> thread_body);

/// kernel<<<grid, block, shared, stream>>>(args...) (named so that argument-dependent lookup of the
/// library's own `launch` never finds it): the arguments are copied once at launch (as
/// the real launch copies them into the parameter buffer) and every thread receives its own copy.
template <class... P, class... A>
cudaError_t kernel_launch(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shared, cudaStream_t stream, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "moe-emu: wrong number of kernel arguments");
  auto params = std::make_shared<std::tuple<std::decay_t<P>...>>(static_cast<std::decay_t<P>>(std::forward<A>(args))...);
  // The launch owns the only reference: the worker that runs it releases the arguments.
  return launch_kernel({reinterpret_cast<void const*>(kernel), grid, block, shared, stream},
                       [kernel, params = std::move(params)] {
    std::apply([kernel](auto... copy) { kernel(copy...); }, *params);
  });
}

/// Number of emulated devices (MOE_EMU_DEVICES, default 8).
int device_count();
/// The message of the last kernel error (divergence, trap, contract violation in a shim), or "".
std::string last_kernel_error();
/// Clears every sticky error and its message (the emulator's own tests only).
void reset_errors();
/// Statistics over the whole process (every thread): kernels and blocks run and fiber switches
/// (worker side, for the docs and benchmarks); and the host round trips a program asked for, so that
/// a test can check that a pass adds none:
/// - host_syncs: calls that block the host until device work is done (cudaStreamSynchronize,
///   cudaDeviceSynchronize, cudaEventSynchronize, the synchronous cudaMemcpy);
/// - device_to_host: copies from device memory into host memory (cudaMemcpy and cudaMemcpyAsync;
///   a real asynchronous one into pageable memory also blocks the host).
/// cudaStreamQuery and cudaEventQuery do not block and are not counted.
struct Counters {
  std::uint64_t kernels, blocks, switches;
  std::uint64_t host_syncs, device_to_host;
};
Counters counters();

/// Test hook: the `nth` next call (1: the very next) of `api` fails as if out of memory, so that a
/// test can make a constructor's later creation fail and check what the earlier ones left behind.
/// APIs: "cudaMalloc", "cudaMallocHost", "cudaHostAlloc", "cudaStreamCreateWithFlags" (also
/// cudaStreamCreate), "cudaEventCreateWithFlags" (also cudaEventCreate), "cublasCreate". nth <= 0
/// disarms it.
void fail_nth_call(std::string const& api, int nth);
/// The same, counting only the calls made while `device` is the calling thread's current device:
/// one rank's calls, when each rank of an in-process world has a device of its own (the other
/// ranks' calls neither fail nor count). Armed beside fail_nth_call's; nth <= 0 disarms it.
void fail_nth_call_on_device(std::string const& api, int device, int nth);
/// Whether this call of `api` is the one fail_nth_call() armed (it is then disarmed).
bool injected_failure(char const* api);
/// What the program holds now: streams and events it created and did not destroy, and host
/// (cudaMallocHost) and device (cudaMalloc) allocations not freed. cuBLAS handles: blas::live_handles().
struct Resources {
  long long streams = 0, events = 0, host_allocations = 0, device_allocations = 0;
  bool operator==(Resources const&) const = default;
};
Resources live_resources();

}  // namespace emu
