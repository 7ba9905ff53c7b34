#pragma once
// moe-emu device built-ins: thread indices, barriers, warp shuffles and votes, atomics, bit and
// float reinterpretation helpers, vector types. Semantics follow the CUDA C++ Programming Guide;
// where the guide says "undefined", the emulator reports an error instead of guessing.

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "emu/core.hpp"

namespace emu::detail {
/// The running fiber's indices (set by the scheduler at every switch; null outside kernels).
inline thread_local ThreadInfo const* current = nullptr;
inline ThreadInfo const& here() {
  if (!current) kernel_fail("a device built-in was used outside a kernel");
  return *current;
}

/// Warp shuffle: every lane in `mask` deposits `value` and the lane it reads; returns the value of
/// that lane. `kind` names the intrinsic. Reading a lane outside `mask` is an error.
std::uint64_t shuffle(unsigned mask, char const* kind, std::uint64_t value, int src_lane, ::emu::Where where);
/// Warp votes (__all_sync, __any_sync, __ballot_sync) and __syncwarp.
unsigned vote(unsigned mask, char const* kind, bool pred, ::emu::Where where);
/// Warp reductions (__reduce_*_sync, sm_80 and later): every lane in `mask` gets `op` over the
/// lanes' values. `is_signed`: compare min and max as int, else as unsigned.
enum class ReduceOp { add, min, max, and_, or_, xor_ };
std::uint32_t reduce(unsigned mask, char const* kind, ReduceOp op, bool is_signed, std::uint32_t value,
                     ::emu::Where where);

template <class T>
std::uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "moe-emu: shuffled values are at most 8 bytes");
  std::uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
T from_bits(std::uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}
}  // namespace emu::detail

#define threadIdx (::emu::detail::here().thread)
#define blockIdx (::emu::detail::here().block)
#define blockDim (::emu::detail::here().block_dim)
#define gridDim (::emu::detail::here().grid_dim)
inline constexpr int warpSize = 32;

// ---------------------------------------------------------------------------------------------
// Synchronisation.
// ---------------------------------------------------------------------------------------------
inline void __syncthreads(::emu::Where where = ::emu::Where::current()) {
  ::emu::block_barrier(where);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, ::emu::Where where = ::emu::Where::current()) {
  (void)::emu::detail::vote(mask, "__syncwarp", true, where);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
[[noreturn]] inline void __trap() { ::emu::kernel_fail("__trap() executed"); }
/// The SM's cycle counter: here the host's steady clock in nanoseconds (monotonic per thread, as
/// on the GPU; only differences mean anything, and on the emulator they are not GPU cycles).
inline long long clock64() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32, ::emu::Where where = ::emu::Where::current()) {
  int lane = ::emu::detail::here().lane;
  int base = lane & ~(width - 1);
  int from = base + (src & (width - 1));
  return ::emu::detail::from_bits<T>(::emu::detail::shuffle(mask, "__shfl_sync", ::emu::detail::to_bits(v), from, where));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32,
                  ::emu::Where where = ::emu::Where::current()) {
  int lane = ::emu::detail::here().lane;
  int from = lane ^ lane_mask;
  if ((from & ~(width - 1)) != (lane & ~(width - 1))) from = lane;  // outside the segment: own value
  return ::emu::detail::from_bits<T>(::emu::detail::shuffle(mask, "__shfl_xor_sync", ::emu::detail::to_bits(v), from, where));
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32,
                   ::emu::Where where = ::emu::Where::current()) {
  int lane = ::emu::detail::here().lane;
  int from = lane + static_cast<int>(delta);
  if ((from & ~(width - 1)) != (lane & ~(width - 1))) from = lane;
  return ::emu::detail::from_bits<T>(::emu::detail::shuffle(mask, "__shfl_down_sync", ::emu::detail::to_bits(v), from, where));
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32,
                 ::emu::Where where = ::emu::Where::current()) {
  int lane = ::emu::detail::here().lane;
  int from = lane - static_cast<int>(delta);
  if (from < (lane & ~(width - 1))) from = lane;
  return ::emu::detail::from_bits<T>(::emu::detail::shuffle(mask, "__shfl_up_sync", ::emu::detail::to_bits(v), from, where));
}
inline unsigned __ballot_sync(unsigned mask, int pred, ::emu::Where where = ::emu::Where::current()) {
  return ::emu::detail::vote(mask, "__ballot_sync", pred != 0, where);
}
inline int __all_sync(unsigned mask, int pred, ::emu::Where where = ::emu::Where::current()) {
  return (::emu::detail::vote(mask, "__all_sync", pred != 0, where) & mask) == mask;
}
inline int __any_sync(unsigned mask, int pred, ::emu::Where where = ::emu::Where::current()) {
  return (::emu::detail::vote(mask, "__any_sync", pred != 0, where) & mask) != 0;
}
inline unsigned __activemask() { return 0xffffffffu; }
// The warp reductions of sm_80 and later (one REDUX instruction on the GPU), for int and unsigned as
// CUDA declares them.
#define MOE_EMU_REDUCE(name, op)                                                                                \
  inline unsigned name(unsigned mask, unsigned v, ::emu::Where where = ::emu::Where::current()) {              \
    return ::emu::detail::reduce(mask, #name, ::emu::detail::ReduceOp::op, false, v, where);                   \
  }                                                                                                             \
  inline int name(unsigned mask, int v, ::emu::Where where = ::emu::Where::current()) {                        \
    return static_cast<int>(                                                                                    \
        ::emu::detail::reduce(mask, #name, ::emu::detail::ReduceOp::op, true, static_cast<std::uint32_t>(v), where)); \
  }
MOE_EMU_REDUCE(__reduce_add_sync, add)
MOE_EMU_REDUCE(__reduce_min_sync, min)
MOE_EMU_REDUCE(__reduce_max_sync, max)
#undef MOE_EMU_REDUCE
inline unsigned __reduce_and_sync(unsigned mask, unsigned v, ::emu::Where where = ::emu::Where::current()) {
  return ::emu::detail::reduce(mask, "__reduce_and_sync", ::emu::detail::ReduceOp::and_, false, v, where);
}
inline unsigned __reduce_or_sync(unsigned mask, unsigned v, ::emu::Where where = ::emu::Where::current()) {
  return ::emu::detail::reduce(mask, "__reduce_or_sync", ::emu::detail::ReduceOp::or_, false, v, where);
}
inline unsigned __reduce_xor_sync(unsigned mask, unsigned v, ::emu::Where where = ::emu::Where::current()) {
  return ::emu::detail::reduce(mask, "__reduce_xor_sync", ::emu::detail::ReduceOp::xor_, false, v, where);
}

// ---------------------------------------------------------------------------------------------
// Atomics (device-wide: blocks of different streams run on different OS threads).
// ---------------------------------------------------------------------------------------------
// Overloads for the types CUDA provides (not templates: as in CUDA, an enum or a narrower integer
// converts to the parameter type).
namespace emu::detail {
template <class T>
T atomic_max(T* p, T v) {
  std::atomic_ref<T> r(*p);
  T old = r.load();
  while (old < v && !r.compare_exchange_weak(old, v)) {
  }
  return old;
}
template <class T>
T atomic_min(T* p, T v) {
  std::atomic_ref<T> r(*p);
  T old = r.load();
  while (v < old && !r.compare_exchange_weak(old, v)) {
  }
  return old;
}
template <class T>
T atomic_fadd(T* p, T v) {
  std::atomic_ref<T> r(*p);
  T old = r.load();
  while (!r.compare_exchange_weak(old, old + v)) {
  }
  return old;
}
}  // namespace emu::detail

#define MOE_EMU_INT_ATOMICS(T)                                                                      \
  inline T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }                    \
  inline T atomicSub(T* p, T v) { return std::atomic_ref<T>(*p).fetch_sub(v); }                    \
  inline T atomicOr(T* p, T v) { return std::atomic_ref<T>(*p).fetch_or(v); }                      \
  inline T atomicAnd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_and(v); }                    \
  inline T atomicXor(T* p, T v) { return std::atomic_ref<T>(*p).fetch_xor(v); }                    \
  inline T atomicExch(T* p, T v) { return std::atomic_ref<T>(*p).exchange(v); }                    \
  inline T atomicMax(T* p, T v) { return ::emu::detail::atomic_max(p, v); }                        \
  inline T atomicMin(T* p, T v) { return ::emu::detail::atomic_min(p, v); }                        \
  inline T atomicCAS(T* p, T expected, T desired) {                                                 \
    std::atomic_ref<T>(*p).compare_exchange_strong(expected, desired);                              \
    return expected;                                                                                \
  }
MOE_EMU_INT_ATOMICS(int)
MOE_EMU_INT_ATOMICS(unsigned)
MOE_EMU_INT_ATOMICS(unsigned long long)
MOE_EMU_INT_ATOMICS(long long)
#undef MOE_EMU_INT_ATOMICS
inline float atomicAdd(float* p, float v) { return ::emu::detail::atomic_fadd(p, v); }
inline double atomicAdd(double* p, double v) { return ::emu::detail::atomic_fadd(p, v); }
inline float atomicExch(float* p, float v) { return std::atomic_ref<float>(*p).exchange(v); }

// ---------------------------------------------------------------------------------------------
// Reinterpretation, integer and float intrinsics.
// ---------------------------------------------------------------------------------------------
inline float __uint_as_float(unsigned v) { return std::bit_cast<float>(v); }
inline unsigned __float_as_uint(float v) { return std::bit_cast<unsigned>(v); }
inline float __int_as_float(int v) { return std::bit_cast<float>(v); }
inline int __float_as_int(float v) { return std::bit_cast<int>(v); }
inline int __popc(unsigned v) { return std::popcount(v); }
inline int __popcll(unsigned long long v) { return std::popcount(v); }
inline int __clz(unsigned v) { return std::countl_zero(v); }
inline int __ffs(unsigned v) { return v ? std::countr_zero(v) + 1 : 0; }
inline unsigned __brev(unsigned v) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((v >> i) & 1u) << (31 - i);
  return r;
}
inline float __expf(float v) { return std::exp(v); }
inline float __logf(float v) { return std::log(v); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }
template <class T>
T __ldg(T const* p) { return *p; }

inline std::uint32_t __cvta_generic_to_shared(void const* p) { return ::emu::shared_address(p); }

// ---------------------------------------------------------------------------------------------
// Vector types.
// ---------------------------------------------------------------------------------------------
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(8) int2 { int x, y; };
struct alignas(8) float2 { float x, y; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline dim3 make_dim3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
