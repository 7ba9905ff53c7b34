#pragma once
// A small, strict reader and writer for the tab-separated files the planners exchange
// (profiles, topologies, plans). Errors name the file, the line and the column. Messages are built
// only when a check fails, so parsing large files costs no string formatting.
//
// Format rules shared by every moe TSV file:
//   - fields are separated by one tab (a run of spaces is also accepted when reading);
//   - lines starting with '#' are comments, blank lines are skipped;
//   - an optional header line is recognised by the caller (TsvReader::is_header).

#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <istream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moe/config.hpp"

namespace moe::core {

/// Sizes a file may ask for. Each reader checks the numbers it reads against these before it
/// allocates anything they size, so a corrupt or hostile file costs at most a bounded amount of
/// memory (docs/plan-format.md lists them). They are far above every published model and cluster.
namespace limits {
inline constexpr int experts = 1 << 16;     ///< experts per layer (largest published: 384)
inline constexpr int layers = 1 << 12;      ///< MoE layers (largest published: 61)
inline constexpr int gpus = 1 << 12;        ///< GPUs (ranks) of a cluster or plan: hop matrix <= 64 MiB
inline constexpr int vertices = 1 << 14;    ///< servers + switches of a topology file
inline constexpr int links = 1 << 16;       ///< links of a topology file
inline constexpr int batches = 1 << 20;     ///< batches of a load profile
inline constexpr long long profile_values = 1LL << 27;  ///< batches x layers x experts of a load profile (1 GiB)
}  // namespace limits

/// a + b for non-negative counts read from a file; throws moe::Error naming `where` and `what`
/// when the sum leaves int64 (every later sum of those counts then fits too).
inline std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view where, std::string_view what) {
  std::int64_t s = 0;
  if (__builtin_add_overflow(a, b, &s)) fail(where, ": ", what, ": sum ", a, " + ", b, " overflows int64");
  return s;
}

class TsvReader {
public:
  /// Reads from a file; throws moe::Error when it cannot be opened.
  explicit TsvReader(std::string path) : name_(std::move(path)) {
    auto file = std::make_unique<std::ifstream>(name_);
    check(file->is_open(), "cannot open '", name_, "' for reading");
    owned_ = std::move(file);
    in_ = owned_.get();
  }
  /// Reads from a stream; `name` is used in error messages.
  TsvReader(std::istream& in, std::string name) : name_(std::move(name)), in_(&in) {}

  /// Advances to the next data line. Returns false at the end of the input.
  bool next() {
    while (std::getline(*in_, line_)) {
      ++line_no_;
      if (!line_.empty() && line_.back() == '\r') line_.pop_back();
      std::size_t first = line_.find_first_not_of(" \t");
      if (first == std::string::npos || line_[first] == '#') continue;
      split();
      return true;
    }
    if (in_->bad()) fail(name_, ": read error after line ", line_no_);
    return false;
  }

  /// Whether the current line is a header, recognised by its first field.
  bool is_header(std::string_view first_field) const {
    return !fields_.empty() && fields_.front() == first_field;
  }

  [[nodiscard]] std::size_t size() const { return fields_.size(); }
  [[nodiscard]] std::string_view field(std::size_t i) const {
    if (i >= fields_.size()) fail(where(), ": expected at least ", i + 1, " fields, found ", fields_.size());
    return fields_[i];
  }
  /// Requires exactly `n` fields on the current line.
  void expect_fields(std::size_t n) const {
    if (fields_.size() != n) fail(where(), ": expected ", n, " fields, found ", fields_.size(), " in '", line_, "'");
  }

  template <class Int>
  [[nodiscard]] Int get_int(std::size_t i, std::string_view what) const {
    std::string_view s = field(i);
    Int value{};
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || ptr != s.data() + s.size())
      fail(where(), ": column ", i + 1, " (", what, "): '", s, "' is not an integer in range");
    return value;
  }

  /// An integer in [lo, hi]; throws moe::Error naming file:line, the column and `what` otherwise.
  /// Readers use it for every number that sizes memory, so the bound is checked before allocating.
  template <class Int>
  [[nodiscard]] Int get_int_in(std::size_t i, std::string_view what, Int lo, Int hi) const {
    Int value = get_int<Int>(i, what);
    if (value < lo || value > hi)
      fail(where(), ": column ", i + 1, " (", what, "): ", value, " outside [", lo, ", ", hi, "]");
    return value;
  }

  [[nodiscard]] double get_double(std::size_t i, std::string_view what) const {
    std::string_view s = field(i);
    double value = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || ptr != s.data() + s.size())
      fail(where(), ": column ", i + 1, " (", what, "): '", s, "' is not a number");
    if (!std::isfinite(value)) fail(where(), ": column ", i + 1, " (", what, "): '", s, "' is not finite");
    return value;
  }

  [[nodiscard]] std::string where() const { return detail::concat(name_, ":", line_no_); }
  [[nodiscard]] std::size_t line_number() const { return line_no_; }
  [[nodiscard]] std::string const& name() const { return name_; }

private:
  void split() {
    fields_.clear();
    std::string_view rest(line_);
    while (!rest.empty()) {
      std::size_t start = rest.find_first_not_of(" \t");
      if (start == std::string_view::npos) break;
      rest.remove_prefix(start);
      std::size_t end = rest.find_first_of(" \t");
      fields_.push_back(rest.substr(0, end));
      if (end == std::string_view::npos) break;
      rest.remove_prefix(end);
    }
  }

  std::string name_;
  std::unique_ptr<std::istream> owned_;
  std::istream* in_ = nullptr;
  std::string line_;
  std::vector<std::string_view> fields_;
  std::size_t line_no_ = 0;
};

}  // namespace moe::core
