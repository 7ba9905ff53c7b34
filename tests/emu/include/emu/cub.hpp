#pragma once
// moe-emu CUB shim: BlockScan (block-wide collective on the emulator's barrier),
// DeviceScan::ExclusiveSum and DeviceRadixSort::SortPairs (stream-ordered, the two-phase
// temporary-storage protocol, the bit range, stable order of equal keys). Contracts follow the CUB
// documentation; a violation is an error (cudaErrorInvalidValue with a message, or a kernel error
// inside a kernel) instead of undefined behaviour.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "emu/runtime.hpp"

namespace cub {

/// Block-wide prefix scan of BLOCK_THREADS threads (1-D block of exactly that size). Every thread
/// of the block must call the same scan; TempStorage may be reused only after a __syncthreads, as
/// in CUB (a reuse without it reads values of the next scan: a wrong result, and a race for TSan).
template <class T, int BLOCK_THREADS>
class BlockScan {
public:
  struct TempStorage {
    T values[BLOCK_THREADS];
  };
  explicit BlockScan(TempStorage& s) : s_(s) {
    auto const& me = ::emu::self();
    if (me.block_threads != BLOCK_THREADS)
      ::emu::kernel_fail("cub::BlockScan<" + std::to_string(BLOCK_THREADS) + "> used by a block of " +
                         std::to_string(me.block_threads) + " threads");
  }
  void ExclusiveSum(T input, T& output) {
    T total;
    ExclusiveSum(input, output, total);
  }
  void ExclusiveSum(T input, T& output, T& block_aggregate) {
    int const t = ::emu::self().linear;
    s_.values[t] = input;
    ::emu::block_barrier(::emu::Where::current());
    T acc{};
    for (int i = 0; i < t; ++i) acc = acc + s_.values[i];
    output = acc;
    T total = acc;
    for (int i = t; i < BLOCK_THREADS; ++i) total = total + s_.values[i];
    block_aggregate = total;
  }
  void InclusiveSum(T input, T& output) {
    T total;
    InclusiveSum(input, output, total);
  }
  void InclusiveSum(T input, T& output, T& block_aggregate) {
    ExclusiveSum(input, output, block_aggregate);
    output = output + input;
  }

private:
  TempStorage& s_;
};

namespace emu_detail {

inline cudaError_t temp_protocol(char const* api, void* d_temp, std::size_t& bytes, std::size_t required) {
  if (!d_temp) {
    bytes = required;
    return cudaSuccess;
  }
  if (bytes < required) {
    ::emu::diagnose(std::string(api) + ": temp_storage_bytes = " + std::to_string(bytes) + " but this call needs " +
                    std::to_string(required) + " (query the size with d_temp_storage = nullptr first)");
    return cudaErrorInvalidValue;
  }
  if (!::emu::is_device_range(d_temp, required)) {
    ::emu::diagnose(std::string(api) + ": d_temp_storage is not " + std::to_string(required) + " bytes of device memory");
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

template <class P>
bool device_array(char const* api, char const* name, P p, long long n) {
  using E = std::remove_cv_t<std::remove_pointer_t<P>>;
  if (n == 0) return true;
  if (!::emu::is_device_range(p, static_cast<std::size_t>(n) * sizeof(E))) {
    ::emu::diagnose(std::string(api) + ": " + name + " is not " + std::to_string(n) + " items of device memory");
    return false;
  }
  return true;
}

template <class P, class Q>
bool overlap(P a, Q b, long long n) {
  auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  auto bytes = static_cast<std::uintptr_t>(n) * sizeof(std::remove_pointer_t<P>);
  return n > 0 && x < y + bytes && y < x + bytes;
}

/// The temporary storage belongs to the algorithm: it may not share bytes with an operand.
template <class P>
bool temp_apart(char const* api, void const* temp, std::size_t temp_bytes, char const* name, P p, long long n) {
  auto t = reinterpret_cast<std::uintptr_t>(temp), x = reinterpret_cast<std::uintptr_t>(p);
  auto bytes = static_cast<std::uintptr_t>(n) * sizeof(std::remove_pointer_t<P>);
  if (n > 0 && t < x + bytes && x < t + temp_bytes) {
    ::emu::diagnose(std::string(api) + ": d_temp_storage overlaps " + name);
    return false;
  }
  return true;
}

/// The unsigned image CUB's radix sort orders: signed integers with the sign bit flipped.
template <class K>
std::uint64_t twiddle(K k) {
  static_assert(std::is_integral_v<K>, "moe-emu: SortPairs models integer keys");
  using U = std::make_unsigned_t<K>;
  auto u = static_cast<U>(k);
  if constexpr (std::is_signed_v<K>) u ^= static_cast<U>(U{1} << (sizeof(K) * 8 - 1));
  return static_cast<std::uint64_t>(u);
}

}  // namespace emu_detail

struct DeviceScan {
  /// out[i] = in[0] + ... + in[i - 1], out[0] = 0.
  template <class In, class Out>
  static cudaError_t ExclusiveSum(void* d_temp, std::size_t& temp_bytes, In in, Out out, int num_items,
                                  cudaStream_t stream = nullptr) {
    char const* api = "cub::DeviceScan::ExclusiveSum";
    if (num_items < 0) {
      ::emu::diagnose(std::string(api) + ": num_items < 0");
      return cudaErrorInvalidValue;
    }
    // A few tile descriptors per 2048 items, as CUB's decoupled look-back keeps.
    std::size_t const required = 256 + 64 * (static_cast<std::size_t>(num_items) / 2048 + 1);
    if (cudaError_t e = emu_detail::temp_protocol(api, d_temp, temp_bytes, required); e != cudaSuccess || !d_temp) return e;
    if (!emu_detail::device_array(api, "d_in", in, num_items) || !emu_detail::device_array(api, "d_out", out, num_items))
      return cudaErrorInvalidValue;
    if (static_cast<void const*>(in) != static_cast<void const*>(out) && emu_detail::overlap(in, out, num_items)) {
      ::emu::diagnose(std::string(api) + ": d_in and d_out overlap without being equal (only an exact in-place scan is allowed)");
      return cudaErrorInvalidValue;
    }
    if (!emu_detail::temp_apart(api, d_temp, required, "d_in", in, num_items) ||
        !emu_detail::temp_apart(api, d_temp, required, "d_out", out, num_items))
      return cudaErrorInvalidValue;
    using T = std::remove_cv_t<std::remove_pointer_t<In>>;
    return static_cast<cudaError_t>(::emu::enqueue(stream, api, [d_temp, required, in, out, num_items] {
      std::memset(d_temp, 0xa5, required);  // the algorithm owns its temporary storage
      T acc{};
      for (int i = 0; i < num_items; ++i) {
        T v = in[i];
        out[i] = acc;
        acc = acc + v;
      }
    }));
  }
};

struct DeviceRadixSort {
  /// Stable sort of (key, value) pairs by bits [begin_bit, end_bit) of the keys.
  template <class K, class V>
  static cudaError_t SortPairs(void* d_temp, std::size_t& temp_bytes, K const* keys_in, K* keys_out, V const* values_in,
                               V* values_out, int num_items, int begin_bit = 0, int end_bit = sizeof(K) * 8,
                               cudaStream_t stream = nullptr) {
    char const* api = "cub::DeviceRadixSort::SortPairs";
    if (num_items < 0 || begin_bit < 0 || end_bit > static_cast<int>(sizeof(K) * 8) || begin_bit > end_bit) {
      ::emu::diagnose(std::string(api) + ": bad arguments (num_items " + std::to_string(num_items) + ", bits [" +
                      std::to_string(begin_bit) + ", " + std::to_string(end_bit) + ") of a " +
                      std::to_string(sizeof(K) * 8) + "-bit key)");
      return cudaErrorInvalidValue;
    }
    // CUB keeps alternate key and value buffers plus per-digit counters in the temporary storage.
    std::size_t const required = 512 + static_cast<std::size_t>(num_items) * (sizeof(K) + sizeof(V));
    if (cudaError_t e = emu_detail::temp_protocol(api, d_temp, temp_bytes, required); e != cudaSuccess || !d_temp) return e;
    if (!emu_detail::device_array(api, "d_keys_in", keys_in, num_items) ||
        !emu_detail::device_array(api, "d_keys_out", keys_out, num_items) ||
        !emu_detail::device_array(api, "d_values_in", values_in, num_items) ||
        !emu_detail::device_array(api, "d_values_out", values_out, num_items))
      return cudaErrorInvalidValue;
    if (emu_detail::overlap(keys_in, keys_out, num_items) || emu_detail::overlap(values_in, values_out, num_items)) {
      ::emu::diagnose(std::string(api) + ": input and output buffers overlap (use a DoubleBuffer for in-place sorting)");
      return cudaErrorInvalidValue;
    }
    if (!emu_detail::temp_apart(api, d_temp, required, "d_keys_in", keys_in, num_items) ||
        !emu_detail::temp_apart(api, d_temp, required, "d_keys_out", keys_out, num_items) ||
        !emu_detail::temp_apart(api, d_temp, required, "d_values_in", values_in, num_items) ||
        !emu_detail::temp_apart(api, d_temp, required, "d_values_out", values_out, num_items))
      return cudaErrorInvalidValue;
    return static_cast<cudaError_t>(::emu::enqueue(stream, api, [=] {
      std::memset(d_temp, 0xa5, required);
      std::uint64_t const mask = end_bit - begin_bit >= 64 ? ~std::uint64_t{0}
                                                           : ((std::uint64_t{1} << (end_bit - begin_bit)) - 1);
      std::vector<int> order(static_cast<std::size_t>(num_items));
      std::iota(order.begin(), order.end(), 0);
      auto digit = [&](int i) { return (emu_detail::twiddle(keys_in[i]) >> begin_bit) & mask; };
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return digit(a) < digit(b); });
      for (int i = 0; i < num_items; ++i) {
        keys_out[i] = keys_in[order[static_cast<std::size_t>(i)]];
        values_out[i] = values_in[order[static_cast<std::size_t>(i)]];
      }
    }));
  }
};

}  // namespace cub
