#pragma once
// The workspace protocol (CUB style): the caller owns all scratch memory. A component describes its
// buffers once, in a `carve(Carver&)` function; calling it with a measuring Carver gives the size
// to allocate, calling it with a Carver over the caller's buffer hands out the pieces. Every piece
// starts on a 256-byte boundary (enough for vector loads on CPUs and GPUs).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "moe/config.hpp"

namespace moe::core {

/// One piece a measuring Carver counted: its offset from the carver's aligned start, and its bytes.
struct CarvePiece {
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

/// For tests: while a CarveLog lives, every take() of a measuring Carver on the same thread appends
/// its piece, so a test can tell each buffer a workspace_size() counted (tests/layer/
/// test_workspace_exact.cpp checks that the worst case writes every one of them whole).
class CarveLog {
public:
  CarveLog() : outer_(current()) { current() = this; }
  ~CarveLog() { current() = outer_; }
  CarveLog(CarveLog const&) = delete;
  CarveLog& operator=(CarveLog const&) = delete;

  std::vector<CarvePiece> pieces;

  /// The innermost live log of this thread, or null.
  static CarveLog*& current() {
    thread_local CarveLog* log = nullptr;
    return log;
  }

private:
  CarveLog* outer_;
};

class Carver {
public:
  static constexpr std::size_t alignment = 256;

  /// A carver that only measures.
  Carver() = default;
  /// A carver over a caller-owned buffer.
  explicit Carver(std::span<std::byte> buffer) : measuring_(false) {
    auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
    std::size_t skip = (alignment - address % alignment) % alignment;
    base_ = buffer.data() + skip;
    capacity_ = buffer.size() >= skip ? buffer.size() - skip : 0;
  }

  /// The next `n` elements of T. When measuring, returns an empty span and only counts the bytes.
  template <class T>
  std::span<T> take(std::size_t n) {
    offset_ = (offset_ + alignment - 1) / alignment * alignment;
    std::size_t start = offset_;
    offset_ += n * sizeof(T);
    if (measuring_) {
      if (CarveLog* log = CarveLog::current()) log->pieces.push_back({start, n * sizeof(T)});
      return {};
    }
    check(offset_ <= capacity_, "workspace too small: ", capacity_, " usable bytes, needs at least ", offset_);
    return {reinterpret_cast<T*>(base_ + start), n};
  }

  /// Bytes to allocate: what was taken plus slack for a buffer that is not 256-byte aligned.
  [[nodiscard]] std::size_t used() const { return offset_ + alignment; }
  [[nodiscard]] bool measuring() const { return measuring_; }

private:
  std::byte* base_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t offset_ = 0;
  bool measuring_ = true;
};

/// The run() check of every component: a caller's workspace of `have` bytes holds the `need` bytes
/// its workspace_size() asked for (`who` names the component in the error).
inline void check_workspace(char const* who, std::size_t have, std::size_t need) {
  check(have >= need, who, ": workspace holds ", have, " bytes, run() needs ", need, " (call workspace_size())");
}

}  // namespace moe::core
