#pragma once
// s-TS on the GPU (nvcc only): the token-table predictor lookup, the shuffle plan (the same stable
// counting sort as speculative::make_shuffle_plan) and the row moves that regroup tokens by their
// predicted device and restore the original order afterwards.
//
//   DeviceTokenTable   a speculative::TokenDeviceTable uploaded once: one 4-byte entry per vocabulary
//                      id, {int16 device, int16 Q15 confidence}, device -1 = never seen
//   predict_devices    one thread per token, the host Predictor's rules for a token table alone:
//                        known id      -> (table device, table confidence)
//                        unseen id     -> (token id mod D, 0)
//                        id outside [0, vocab) -> (0, 0) and error_bad_token in the error word
//                      (the host Predictor throws on such ids; a kernel cannot, so it raises the
//                      bit, keeps every output in range and lets the caller decide)
//   shuffle_plan       from predicted devices: counts[D], offsets[D + 1], permutation[n] (packed
//                      row -> token), inverse[n] (token -> packed row), aligned_offsets[D + 1] (each
//                      group padded to a multiple of `alignment`), and group[n] (device of each
//                      packed row). Built with a CUB radix sort of (device, token) pairs over the
//                      bits of D - 1 (stable, so tokens keep their order inside a group), then one
//                      small kernel: block 0 finds the group bounds by binary search in the sorted
//                      devices and scans the padded counts; every block writes the inverse.
//                      A prediction outside [0, D) raises error_bad_device and is planned as device 0.
//   predict_and_plan   both, fused: the lookup kernel writes the sort's inputs directly
//   pack_rows          packed[j] = rows[permutation[j]]   (gather)
//   unpack_rows        rows[i]   = packed[inverse[i]]     (the scatter rows[permutation[j]] = packed[j]
//                      written as a gather, so that every write is contiguous)
//                      Rows are moved as raw bits in the widest of 16 / 8 / 4 / 2-byte units that
//                      the row size and both pointers allow (16-byte vectors for the model widths),
//                      so unpack(pack(x)) == x bit for bit, NaN payloads included.
//
// Memory: the caller owns it (CUB style). shuffle_plan_workspace_bytes(max_tokens, devices) sizes
// one buffer; make_device_shuffle_plan(buffer, max_tokens, devices) carves it (core::Carver).
// The size queries call CUB, so they need a CUDA device; the launchers only enqueue: no
// allocation, no host synchronisation, so everything can be captured in a CUDA graph.
//
// Error word: the bits below are disjoint from DeviceError (dispatch.cuh), so one word can serve
// a whole layer. The launchers never reset it.

#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/workspace.hpp"
#include "moe/kernels/cuda_common.cuh"
#include "moe/speculative/predictor.hpp"

namespace moe::kernels::cuda {

/// Error bits raised by the s-TS kernels (disjoint from DeviceError).
enum ShuffleError : unsigned {
  error_bad_token = 4u,   ///< predict: a token id outside [0, vocab) (predicted as device 0, confidence 0)
  error_bad_device = 8u,  ///< shuffle_plan: a prediction outside [0, devices) (planned as device 0)
  error_bad_index = 16u,  ///< pack/unpack: a permutation or inverse entry outside [0, n) (row left unwritten)
};

/// One token-table entry on the device: loaded as one 4-byte word.
struct alignas(4) TokenEntry {
  std::int16_t device;      ///< -1: the profile never saw this id
  std::int16_t confidence;  ///< Q15 (value / 32767)
};
static_assert(sizeof(TokenEntry) == 4 && std::is_trivially_copyable_v<TokenEntry>);

/// What the kernels read: entries[vocab], predictions in [0, devices).
struct TokenTableView {
  TokenEntry const* entries = nullptr;
  int vocab = 0;
  int devices = 0;
};

/// A token table uploaded to the device (construction time only: synchronous copy).
class DeviceTokenTable {
public:
  DeviceTokenTable() = default;
  explicit DeviceTokenTable(speculative::TokenDeviceTable const& t)
      : entries_(static_cast<std::size_t>(t.vocab() > 0 ? t.vocab() : 0)), vocab_(t.vocab()), devices_(t.devices()) {
    check(vocab_ > 0 && devices_ > 0, "device token table: the token table is empty (vocab ", vocab_, ", devices ",
          devices_, ")");
    auto const& dev = t.devices_array();
    auto const& conf = t.confidence_array();
    std::vector<TokenEntry> host(static_cast<std::size_t>(vocab_));
    for (std::size_t i = 0; i < host.size(); ++i) {
      check(dev[i] >= -1 && dev[i] < devices_, "device token table: token ", i, " has device ", dev[i],
            ", outside [-1, ", devices_, ")");
      check(conf[i] >= 0, "device token table: token ", i, " has a negative confidence ", conf[i]);
      host[i] = {dev[i], dev[i] >= 0 ? conf[i] : std::int16_t{0}};
    }
    entries_.upload(host.data(), host.size());
  }
  [[nodiscard]] TokenTableView view() const { return {entries_.get(), vocab_, devices_}; }
  [[nodiscard]] int vocab() const { return vocab_; }
  [[nodiscard]] int devices() const { return devices_; }
  [[nodiscard]] std::size_t bytes() const { return entries_.size() * sizeof(TokenEntry); }

private:
  DeviceArray<TokenEntry> entries_;
  int vocab_ = 0;
  int devices_ = 0;
};

/// The plan's buffers, carved from the caller's workspace. Outputs: counts, offsets,
/// aligned_offsets, permutation, inverse, group; keys and iota are scratch.
struct DeviceShufflePlan {
  int max_tokens = 0;
  int devices = 0;
  int* counts = nullptr;           ///< [devices] tokens predicted for each device
  int* offsets = nullptr;          ///< [devices + 1] group starts in the packed order; offsets[D] = n
  int* aligned_offsets = nullptr;  ///< [devices + 1] group starts with groups padded to `alignment`
  int* permutation = nullptr;      ///< [max_tokens] packed row j holds token permutation[j]
  int* inverse = nullptr;          ///< [max_tokens] token i sits at packed row inverse[i]
  int* group = nullptr;            ///< [max_tokens] device of packed row j (the sorted keys)
  int* keys = nullptr;             ///< [max_tokens] scratch: validated predictions
  int* iota = nullptr;             ///< [max_tokens] scratch: 0, 1, ..., n - 1
  void* temp = nullptr;            ///< CUB radix-sort scratch
  std::size_t temp_bytes = 0;
};

/// Key bits for devices 0 .. devices - 1 (at least 1).
constexpr int device_key_bits(int devices) {
  int b = 1;
  while (b < 31 && (1 << b) < devices) ++b;
  return b;
}

/// Bytes of CUB scratch for planning up to max_tokens tokens over `devices` devices (needs a GPU).
inline std::size_t shuffle_sort_bytes(int max_tokens, int devices) {
  check(max_tokens >= 0, "shuffle plan: max_tokens must be >= 0, got ", max_tokens);
  check(devices > 0, "shuffle plan: devices must be positive, got ", devices);
  std::size_t bytes = 0;
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<int const*>(nullptr), static_cast<int*>(nullptr),
                                             static_cast<int const*>(nullptr), static_cast<int*>(nullptr),
                                             max_tokens > 0 ? max_tokens : 1, 0, device_key_bits(devices)),
             "cub::DeviceRadixSort::SortPairs (size query)");
  return bytes;
}

/// Takes the plan's buffers from a carver (measuring or real). sort_bytes: shuffle_sort_bytes(...).
inline DeviceShufflePlan carve_shuffle_plan(core::Carver& c, int max_tokens, int devices, std::size_t sort_bytes) {
  check(max_tokens >= 0, "shuffle plan: max_tokens must be >= 0, got ", max_tokens);
  check(devices > 0, "shuffle plan: devices must be positive, got ", devices);
  auto n = static_cast<std::size_t>(max_tokens);
  auto D = static_cast<std::size_t>(devices);
  DeviceShufflePlan p;
  p.max_tokens = max_tokens;
  p.devices = devices;
  p.counts = c.take<int>(D).data();
  p.offsets = c.take<int>(D + 1).data();
  p.aligned_offsets = c.take<int>(D + 1).data();
  p.permutation = c.take<int>(n).data();
  p.inverse = c.take<int>(n).data();
  p.group = c.take<int>(n).data();
  p.keys = c.take<int>(n).data();
  p.iota = c.take<int>(n).data();
  p.temp = c.take<std::byte>(sort_bytes).data();
  p.temp_bytes = sort_bytes;
  return p;
}

/// Bytes of one workspace holding every buffer of the plan (needs a GPU: asks CUB).
inline std::size_t shuffle_plan_workspace_bytes(int max_tokens, int devices) {
  core::Carver c;
  (void)carve_shuffle_plan(c, max_tokens, devices, shuffle_sort_bytes(max_tokens, devices));
  return c.used();
}

/// The plan's buffers inside `workspace` (at least shuffle_plan_workspace_bytes(max_tokens, devices)).
inline DeviceShufflePlan make_device_shuffle_plan(std::span<std::byte> workspace, int max_tokens, int devices) {
  core::Carver c(workspace);
  return carve_shuffle_plan(c, max_tokens, devices, shuffle_sort_bytes(max_tokens, devices));
}

namespace detail {

inline constexpr int shuffle_threads = 256;

/// One thread per token. `iota`, when given, receives i (the sort's values for predict_and_plan).
__global__ void __launch_bounds__(shuffle_threads)
    predict_devices_kernel(TokenTableView table, int const* __restrict__ tokens, int n, int* __restrict__ device,
                           std::int16_t* __restrict__ confidence, int* __restrict__ iota, unsigned* __restrict__ errors) {
  int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  int t = tokens[i];
  int d = 0;
  std::int16_t c = 0;
  if (t >= 0 && t < table.vocab) {
    TokenEntry e = table.entries[t];
    if (e.device >= 0) {
      d = e.device;
      c = e.confidence;
    } else {
      d = t % table.devices;  // t >= 0 here, so the remainder is in [0, devices)
    }
  } else {
    atomicOr(errors, static_cast<unsigned>(error_bad_token));
  }
  device[i] = d;
  if (confidence) confidence[i] = c;
  if (iota) iota[i] = i;
}

/// Validated sort keys (out-of-range predictions become device 0) and the sort's values 0..n-1.
__global__ void __launch_bounds__(shuffle_threads)
    plan_keys_kernel(int const* __restrict__ predicted, int n, int devices, int* __restrict__ keys,
                     int* __restrict__ iota, unsigned* __restrict__ errors) {
  int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  int d = predicted[i];
  if (d < 0 || d >= devices) {
    atomicOr(errors, static_cast<unsigned>(error_bad_device));
    d = 0;
  }
  keys[i] = d;
  iota[i] = i;
}

/// First index in sorted[0, n) whose value is >= key.
__device__ __forceinline__ int first_at_least(int const* sorted, int n, int key) {
  int lo = 0, hi = n;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (sorted[mid] < key) lo = mid + 1; else hi = mid;
  }
  return lo;
}

/// Block 0: counts, offsets and aligned offsets from the sorted devices (`group`), devices in
/// chunks of shuffle_threads with a carried scan. Every block: inverse[permutation[j]] = j.
__global__ void __launch_bounds__(shuffle_threads)
    plan_finish_kernel(int const* __restrict__ group, int const* __restrict__ permutation, int n, int devices,
                       int alignment, int* __restrict__ counts, int* __restrict__ offsets,
                       int* __restrict__ aligned_offsets, int* __restrict__ inverse) {
  using Scan = cub::BlockScan<int, shuffle_threads>;
  __shared__ typename Scan::TempStorage scratch;
  __shared__ int carry;
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (int base = 0; base < devices; base += shuffle_threads) {
      int d = base + static_cast<int>(threadIdx.x);
      int padded = 0;
      if (d < devices) {
        int lo = first_at_least(group, n, d);
        int hi = first_at_least(group, n, d + 1);
        offsets[d] = lo;
        counts[d] = hi - lo;
        padded = (hi - lo + alignment - 1) / alignment * alignment;
      }
      int before = 0, chunk = 0;
      Scan(scratch).ExclusiveSum(padded, before, chunk);
      if (d < devices) aligned_offsets[d] = carry + before;
      __syncthreads();  // every thread has read `carry`; `scratch` may be reused
      if (threadIdx.x == 0) carry += chunk;
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      offsets[devices] = n;
      aligned_offsets[devices] = carry;
    }
  }
  for (long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += static_cast<long long>(gridDim.x) * blockDim.x)
    inverse[permutation[j]] = static_cast<int>(j);
}

/// dst row j = src row index[j], `units` units of U per row; one block per destination row.
template <class U>
__global__ void __launch_bounds__(shuffle_threads)
    gather_rows_kernel(U const* __restrict__ src, U* __restrict__ dst, int n, long long units,
                       int const* __restrict__ index, unsigned* __restrict__ errors) {
  int j = static_cast<int>(blockIdx.x);
  int r = index[j];
  if (r < 0 || r >= n) {
    if (threadIdx.x == 0) atomicOr(errors, static_cast<unsigned>(error_bad_index));
    return;
  }
  U const* from = src + static_cast<std::size_t>(r) * static_cast<std::size_t>(units);
  U* to = dst + static_cast<std::size_t>(j) * static_cast<std::size_t>(units);
  for (long long u = threadIdx.x; u < units; u += blockDim.x) to[u] = from[u];
}

inline void check_plan_args(char const* who, int n, int alignment, DeviceShufflePlan const& p, unsigned const* errors) {
  check(n >= 0, who, ": token count must be >= 0, got ", n);
  check(n <= p.max_tokens, who, ": ", n, " tokens, the plan's buffers hold ", p.max_tokens);
  check(p.devices > 0, who, ": the plan has no devices (not carved?)");
  check(alignment > 0, who, ": alignment must be positive, got ", alignment);
  check(static_cast<long long>(n) + static_cast<long long>(p.devices) * (alignment - 1) <= INT_MAX, who,
        ": ", n, " tokens padded to multiples of ", alignment, " over ", p.devices, " devices overflow int32");
  check(p.counts && p.offsets && p.aligned_offsets && (p.max_tokens == 0 || (p.permutation && p.inverse && p.group &&
                                                                             p.keys && p.iota && p.temp)),
        who, ": the plan's buffers are not set (carve them from a workspace first)");
  check(errors != nullptr, who, ": the error word is null");
}

inline void sort_and_finish(cudaStream_t s, int const* keys, int n, int alignment, DeviceShufflePlan const& p) {
  if (n > 0) {
    std::size_t bytes = p.temp_bytes;
    check_cuda(cub::DeviceRadixSort::SortPairs(p.temp, bytes, keys, p.group, p.iota, p.permutation, n, 0,
                                               device_key_bits(p.devices), s),
               "cub::DeviceRadixSort::SortPairs (shuffle plan)");
  }
  auto blocks = static_cast<unsigned>(n > 0 ? blocks_for(n, shuffle_threads) : 1);
  launch(plan_finish_kernel, blocks, shuffle_threads, 0, s, p.group, p.permutation, n, p.devices, alignment, p.counts,
         p.offsets, p.aligned_offsets, p.inverse);
  check_launch("plan_finish_kernel");
}

template <class U, class T>
void gather_rows_as(cudaStream_t s, T const* src, T* dst, int n, int width, int const* index, unsigned* errors) {
  long long units = static_cast<long long>(width) * static_cast<long long>(sizeof(T)) / static_cast<long long>(sizeof(U));
  launch(gather_rows_kernel<U>, static_cast<unsigned>(n), shuffle_threads, 0, s, reinterpret_cast<U const*>(src),
         reinterpret_cast<U*>(dst), n, units, index, errors);
  check_launch("gather_rows_kernel");
}

/// dst row j = src row index[j] for j < n, rows of `width` elements of T, as raw bits.
template <class T>
void gather_rows(char const* who, cudaStream_t s, T const* src, T* dst, int n, int width, int const* index,
                 unsigned* errors) {
  static_assert(std::is_trivially_copyable_v<T> && (sizeof(T) == 2 || sizeof(T) == 4),
                "pack_rows / unpack_rows move 2- or 4-byte elements (moe::bf16, float)");
  check(n >= 0, who, ": row count must be >= 0, got ", n);
  check(width > 0, who, ": row width must be positive, got ", width);
  check(errors != nullptr, who, ": the error word is null");
  if (n == 0) return;
  check(src && dst && index, who, ": null buffer");
  check(src != dst, who, ": source and destination are the same buffer (the move is not in place)");
  auto row_bytes = static_cast<std::size_t>(width) * sizeof(T);
  auto fits = [&](std::size_t unit) {
    return row_bytes % unit == 0 && reinterpret_cast<std::uintptr_t>(src) % unit == 0 &&
           reinterpret_cast<std::uintptr_t>(dst) % unit == 0;
  };
  if (fits(16)) {
    gather_rows_as<uint4>(s, src, dst, n, width, index, errors);
  } else if (fits(8)) {
    gather_rows_as<uint2>(s, src, dst, n, width, index, errors);
  } else if (fits(4)) {
    gather_rows_as<unsigned>(s, src, dst, n, width, index, errors);
  } else {
    gather_rows_as<unsigned short>(s, src, dst, n, width, index, errors);
  }
}

}  // namespace detail

// -------------------------------------------------------------------------------------------------
// Host launchers: each only enqueues on `s`.
// -------------------------------------------------------------------------------------------------

/// device[i], confidence[i] (Q15; may be null) for tokens[0, n) (see the file comment).
inline void predict_devices(cudaStream_t s, TokenTableView table, int const* tokens, int n, int* device,
                            std::int16_t* confidence, unsigned* errors) {
  check(n >= 0, "predict_devices: token count must be >= 0, got ", n);
  check(table.vocab > 0 && table.devices > 0 && table.entries, "predict_devices: the token table is empty");
  check(errors != nullptr, "predict_devices: the error word is null");
  if (n == 0) return;
  check(tokens && device, "predict_devices: null token or device buffer");
  launch(detail::predict_devices_kernel, static_cast<unsigned>(blocks_for(n, detail::shuffle_threads)),
         detail::shuffle_threads, 0, s, table, tokens, n, device, confidence, nullptr, errors);
  check_launch("predict_devices_kernel");
}

/// The plan of predicted[0, n) over p.devices devices, groups padded to `alignment` rows.
inline void shuffle_plan(cudaStream_t s, int const* predicted, int n, int alignment, DeviceShufflePlan const& p,
                         unsigned* errors) {
  detail::check_plan_args("shuffle_plan", n, alignment, p, errors);
  if (n > 0) {
    check(predicted != nullptr, "shuffle_plan: null prediction buffer");
    launch(detail::plan_keys_kernel, static_cast<unsigned>(blocks_for(n, detail::shuffle_threads)),
           detail::shuffle_threads, 0, s, predicted, n, p.devices, p.keys, p.iota, errors);
    check_launch("plan_keys_kernel");
  }
  detail::sort_and_finish(s, p.keys, n, alignment, p);
}

/// predict_devices + shuffle_plan in one lookup kernel, a sort and a finishing kernel. `device`
/// (the predictions in token order) and `confidence` may be null; p.group holds the devices in
/// packed order either way.
inline void predict_and_plan(cudaStream_t s, TokenTableView table, int const* tokens, int n, int alignment,
                             DeviceShufflePlan const& p, int* device, std::int16_t* confidence, unsigned* errors) {
  detail::check_plan_args("predict_and_plan", n, alignment, p, errors);
  check(table.vocab > 0 && table.devices > 0 && table.entries, "predict_and_plan: the token table is empty");
  check(table.devices == p.devices, "predict_and_plan: the token table has ", table.devices,
        " devices, the plan ", p.devices);
  int* keys = device ? device : p.keys;
  if (n > 0) {
    check(tokens != nullptr, "predict_and_plan: null token buffer");
    launch(detail::predict_devices_kernel, static_cast<unsigned>(blocks_for(n, detail::shuffle_threads)),
           detail::shuffle_threads, 0, s, table, tokens, n, keys, confidence, p.iota, errors);
    check_launch("predict_devices_kernel");
  }
  detail::sort_and_finish(s, keys, n, alignment, p);
}

/// packed[j] = rows[permutation[j]] for j < n; rows of `width` elements.
template <class T>
void pack_rows(cudaStream_t s, T const* rows, int n, int width, int const* permutation, T* packed, unsigned* errors) {
  detail::gather_rows("pack_rows", s, rows, packed, n, width, permutation, errors);
}

/// rows[i] = packed[inverse[i]] for i < n: the original order back (unpack(pack(x)) == x).
template <class T>
void unpack_rows(cudaStream_t s, T const* packed, int n, int width, int const* inverse, T* rows, unsigned* errors) {
  detail::gather_rows("unpack_rows", s, packed, rows, n, width, inverse, errors);
}

}  // namespace moe::kernels::cuda
