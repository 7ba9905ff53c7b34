#pragma once
// moe-emu: emu::Where, the place in the source a device call was made (the emulator's reports name
// it). Apart from core.hpp, whose CUDA keyword macros must not reach the standard headers of a file
// that includes this one first.

namespace emu {

/// Where in the source a device call was made: the file and line the emulator's reports name. A
/// default argument `Where where = Where::current()` holds the caller's place, as
/// std::source_location::current() would; built on __builtin_FILE and __builtin_LINE, which g++ and
/// clang both have (libstdc++'s std::source_location needs a builtin clang has only from 15 on).
class Where {
 public:
  constexpr Where() = default;
  static constexpr Where current(char const* file = __builtin_FILE(), unsigned line = __builtin_LINE()) noexcept {
    Where w;
    w.file_ = file;
    w.line_ = line;
    return w;
  }
  [[nodiscard]] constexpr char const* file_name() const noexcept { return file_; }
  [[nodiscard]] constexpr unsigned line() const noexcept { return line_; }

 private:
  char const* file_ = "";
  unsigned line_ = 0;
};

}  // namespace emu
