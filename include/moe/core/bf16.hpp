#pragma once
// bfloat16 storage type for host code: the upper 16 bits of an IEEE float, bit-compatible with
// CUDA's __nv_bfloat16. Conversion from float rounds to nearest, ties to even; NaN stays NaN.
// Arithmetic is done in float (convert, compute, convert back), as on the GPU.

#include <bit>
#include <cstdint>
#include <type_traits>

namespace moe {

struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  explicit bf16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

  static std::uint16_t from_float(float f) {
    auto u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
      return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>(u >> 16);
  }

  friend bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};

static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);

/// Storage <-> float conversion used by the host kernels for float and bf16 alike.
inline float to_float(float x) { return x; }
inline float to_float(bf16 x) { return static_cast<float>(x); }
template <class T>
inline T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return T(x);
  }
}

/// The storage type a shape asks for.
template <class T>
inline constexpr bool is_storage_type_v = std::is_same_v<T, float> || std::is_same_v<T, bf16>;

}  // namespace moe
