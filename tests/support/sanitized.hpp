#pragma once
// Whether this test program runs under a sanitizer (scripts/test.sh --sanitize or --tsan).
//
// An emulated CUDA test runs 5-10 times slower under AddressSanitizer than in the plain build. The
// few longest cases therefore run a smaller sweep there: the same code paths (every kernel, every
// collective, every migration step) on fewer shapes, seeds or passes. The plain build always runs
// the full sweep, so no behaviour is checked only under a sanitizer's reduced sizes.

// g++ names the sanitizer in __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__, clang 14 only through
// __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define MOE_TEST_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define MOE_TEST_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOE_TEST_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define MOE_TEST_TSAN 1
#endif
#endif

namespace moe::test {

#if defined(MOE_TEST_ASAN) || defined(MOE_TEST_TSAN)
inline constexpr bool sanitized = true;
#else
inline constexpr bool sanitized = false;
#endif

#if defined(MOE_TEST_TSAN)
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
