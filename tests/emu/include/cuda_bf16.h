#pragma once
// moe-emu: bf16 storage types and conversions (tests only). Conversions round to nearest, ties to
// even, as __float2bfloat16_rn does; NaN stays NaN.
#include <bit>
#include <cstdint>

#include "emu/runtime.hpp"

struct __nv_bfloat16 {
  unsigned short __x;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

inline __nv_bfloat16 __float2bfloat16_rn(float v) {
  unsigned u = std::bit_cast<unsigned>(v);
  __nv_bfloat16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.__x = static_cast<unsigned short>((u >> 16) | 0x40u);  // quiet NaN
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    r.__x = static_cast<unsigned short>(u >> 16);
  }
  return r;
}
inline __nv_bfloat16 __float2bfloat16(float v) { return __float2bfloat16_rn(v); }
inline float __bfloat162float(__nv_bfloat16 v) { return std::bit_cast<float>(static_cast<unsigned>(v.__x) << 16); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 v) { return v.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short v) { return __nv_bfloat16{v}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return __floats2bfloat162_rn(v.x, v.y); }
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {__bfloat162float(v.x), __bfloat162float(v.y)}; }
