#pragma once
// Library-wide configuration: host/device annotations, the error type and the input checks.

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define MOE_HOST_DEVICE __host__ __device__
#define MOE_DEVICE __device__
#else
#define MOE_HOST_DEVICE
#define MOE_DEVICE
#endif

// Before a loop of the shared host/device code whose trip count is small and known only at run
// time (an expert's copies, a path's arcs): the device compiler keeps it rolled. Unrolled and
// inlined at every call, such loops made most of the per-batch split kernel's code
// (docs/results/batch-balance.md). The host compilers decide for themselves.
#if defined(__CUDA_ARCH__)
#define MOE_NO_UNROLL _Pragma("unroll 1")
#else
#define MOE_NO_UNROLL
#endif

namespace moe {

/// Every error the library reports on bad input, infeasible plans or failed backends.
/// The message names what is wrong and where (file and line for parsed files).
class Error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Parts>
[[nodiscard]] std::string concat(Parts const&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

/// The outcome of a can_implement() query: ok, or why not.
struct Status {
  bool ok = true;
  std::string message;
  explicit operator bool() const { return ok; }
};

/// Throws moe::Error with the pieces of the message streamed together.
template <class... Parts>
[[noreturn]] void fail(Parts const&... parts) {
  throw Error(detail::concat(parts...));
}

/// Checks a precondition on user input; throws moe::Error with the message when it does not hold.
template <class... Parts>
void check(bool condition, Parts const&... parts) {
  if (!condition) fail(parts...);
}

}  // namespace moe
