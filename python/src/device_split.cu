// The device split over an engine's slots (kernels::cuda::DeviceSlotSplit) behind a C interface,
// for moe_compose.device (ctypes): a shared library with no Python or torch in it, so that one build
// serves any framework that hands out device pointers and streams (torch, CuPy, a C++ engine).
//
// Built by nvcc as libmoe_compose_cuda.so (python/CMakeLists.txt with MOE_COMPOSE_CUDA=ON, or the
// main build's moe_compose_cuda target), and for the tests against the CPU emulator of tests/emu as
// libmoe_compose_cuda_emu.so, which also exports the moe_compose_test_* calls (device memory for the
// Python tests; MOE_COMPOSE_TEST_MEMORY).
//
// Every call returns 0, or 1 with a message in err (err_len bytes, NUL-terminated); no exception
// leaves this file.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <new>
#include <span>

#include "moe/kernels/slot_split.cuh"
#include "moe/replication/engine_slots.hpp"

namespace {

using moe::kernels::cuda::DeviceSlotSplit;

int fail(char* err, std::size_t err_len, char const* what) {
  if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", what);
  return 1;
}

template <class F>
int guarded(char* err, std::size_t err_len, F&& body) {
  try {
    body();
    return 0;
  } catch (std::bad_alloc const&) {
    return fail(err, err_len, "out of host memory");
  } catch (std::exception const& e) {
    return fail(err, err_len, e.what());
  } catch (...) {
    return fail(err, err_len, "unknown error");
  }
}

DeviceSlotSplit* as_split(void* handle) {
  moe::check(handle != nullptr, "device split: a null handle");
  return static_cast<DeviceSlotSplit*>(handle);
}

/// Calls f with the id pointer typed by its width (4: int32, 8: int64).
template <class F>
void with_ids(int bytes, void const* p, char const* what, F&& f) {
  moe::check(bytes == 4 || bytes == 8, "device split: ", what, " must be int32 or int64, got ", bytes, "-byte items");
  if (bytes == 4)
    f(static_cast<std::int32_t const*>(p));
  else
    f(static_cast<std::int64_t const*>(p));
}

}  // namespace

extern "C" {

/// A split over `phy2log` (slots entries, int64, host memory; the layout of
/// replication::EngineSlots) for dispatches of at most max_pairs pairs. *out: the handle.
int moe_compose_split_create(std::int64_t const* phy2log, std::int64_t slots, std::int64_t gpus,
                             std::int64_t gpus_per_server, std::int64_t max_pairs, std::int64_t slack_permille,
                             void** out, char* err, std::size_t err_len) {
  return guarded(err, err_len, [&] {
    moe::check(out != nullptr, "device split: nowhere to put the handle");
    *out = nullptr;
    moe::check(phy2log != nullptr && slots >= 1, "device split: phy2log must have at least one slot");
    moe::replication::EngineSlots layout(std::span<std::int64_t const>(phy2log, static_cast<std::size_t>(slots)), gpus,
                                         gpus_per_server);
    *out = new DeviceSlotSplit(layout, max_pairs, slack_permille);
  });
}

void moe_compose_split_destroy(void* handle) { delete static_cast<DeviceSlotSplit*>(handle); }

/// gpus, experts and max_pairs of the split (any pointer may be null).
int moe_compose_split_shape(void* handle, std::int64_t* gpus, std::int64_t* experts, std::int64_t* max_pairs,
                            char* err, std::size_t err_len) {
  return guarded(err, err_len, [&] {
    auto* s = as_split(handle);
    if (gpus != nullptr) *gpus = s->gpus();
    if (experts != nullptr) *experts = s->experts();
    if (max_pairs != nullptr) *max_pairs = s->max_pairs();
  });
}

/// DeviceSlotSplit::count: n ids (id_bytes 4 or 8, device) -> row (experts int32, device).
int moe_compose_split_count(void* handle, int id_bytes, void const* ids, std::int64_t n, std::int32_t* row,
                            void* stream, char* err, std::size_t err_len) {
  return guarded(err, err_len, [&] {
    auto* s = as_split(handle);
    with_ids(id_bytes, ids, "topk_ids", [&](auto const* p) { s->count(p, n, row, static_cast<cudaStream_t>(stream)); });
  });
}

/// DeviceSlotSplit::plan: counts (gpus x experts int32, device). load (gpus int64) and outcome
/// (max_load, local, same_server, bad as four int64), device, may be null: copied from the split's
/// own on the stream.
int moe_compose_split_plan(void* handle, std::int32_t const* counts, std::int64_t* load, std::int64_t* outcome,
                           void* stream, char* err, std::size_t err_len) {
  return guarded(err, err_len, [&] {
    auto* s = as_split(handle);
    auto st = static_cast<cudaStream_t>(stream);
    s->plan(counts, st);
    static_assert(sizeof(long long) == sizeof(std::int64_t));
    if (load != nullptr)
      moe::kernels::cuda::check_cuda(cudaMemcpyAsync(load, s->load(), static_cast<std::size_t>(s->gpus()) * sizeof(std::int64_t),
                                                     cudaMemcpyDeviceToDevice, st),
                                     "cudaMemcpyAsync (split loads)");
    if (outcome != nullptr) s->outcome_words(outcome, st);
  });
}

/// DeviceSlotSplit::dispatch: n ids (id_bytes 4 or 8, device) of `rank` -> physical slot ids
/// (out_bytes 4 or 8, device).
int moe_compose_split_dispatch(void* handle, int rank, int id_bytes, void const* ids, std::int64_t n, int out_bytes,
                               void* physical, void* stream, char* err, std::size_t err_len) {
  return guarded(err, err_len, [&] {
    auto* s = as_split(handle);
    moe::check(out_bytes == 4 || out_bytes == 8, "device split: the output must be int32 or int64, got ", out_bytes,
               "-byte items");
    auto st = static_cast<cudaStream_t>(stream);
    with_ids(id_bytes, ids, "topk_ids", [&](auto const* p) {
      if (out_bytes == 4)
        s->dispatch(rank, p, n, static_cast<std::int32_t*>(physical), st);
      else
        s->dispatch(rank, p, n, static_cast<std::int64_t*>(physical), st);
    });
  });
}

#if defined(MOE_COMPOSE_TEST_MEMORY)
// Device memory for the Python tests of the emulated build (they have no torch on a device).
int moe_compose_test_malloc(std::int64_t bytes, void** out) { return cudaMalloc(out, static_cast<std::size_t>(bytes)) != cudaSuccess; }
int moe_compose_test_free(void* p) { return cudaFree(p) != cudaSuccess; }
int moe_compose_test_upload(void* dst, void const* src, std::int64_t bytes) {
  return cudaMemcpy(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice) != cudaSuccess;
}
int moe_compose_test_download(void* dst, void const* src, std::int64_t bytes) {
  return cudaMemcpy(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToHost) != cudaSuccess;
}
int moe_compose_test_synchronize() { return cudaDeviceSynchronize() != cudaSuccess; }
#endif

}  // extern "C"
