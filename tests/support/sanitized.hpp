#pragma once
// Whether this test program runs under a sanitizer (scripts/test.sh --sanitize or --tsan).
//
// An emulated CUDA test runs 5-10 times slower under AddressSanitizer than in the plain build. The
// few longest cases therefore run a smaller sweep there: the same code paths (every kernel, every
// collective, every migration step) on fewer shapes, seeds or passes. The plain build always runs
// the full sweep, so no behaviour is checked only under a sanitizer's reduced sizes.
namespace moe::test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool sanitized = true;
#else
inline constexpr bool sanitized = false;
#endif

#if defined(__SANITIZE_THREAD__)
inline constexpr bool thread_sanitized = true;
#else
inline constexpr bool thread_sanitized = false;
#endif

/// `full` in the plain build, `reduced` under a sanitizer.
template <class T>
constexpr T full_or(T full, T reduced) {
  return sanitized ? reduced : full;
}

}  // namespace moe::test
