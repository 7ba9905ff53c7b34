#pragma once
// Checked parsing of command-line numbers for the example programs: the whole text must be one
// number inside the stated range, otherwise moe::Error names the option, the text and the range.
// (std::stoi accepted "12abc", and a value past INT_MAX was silently truncated by a cast.)

#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>
#include <system_error>

#include "moe/config.hpp"

namespace moe::core {

/// An integer in [lo, hi] from `text` (decimal, optional leading '-'), for option `option`.
inline long long parse_int(std::string_view text, std::string_view option,
                           long long lo = std::numeric_limits<int>::min(),
                           long long hi = std::numeric_limits<int>::max()) {
  long long v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != text.data() + text.size())
    fail(option, ": '", text, "' is not an integer");
  if (ec == std::errc::result_out_of_range || v < lo || v > hi)
    fail(option, ": ", text, " is outside [", lo, ", ", hi, "]");
  return v;
}

/// A finite number in [lo, hi] from `text`, for option `option`.
inline double parse_double(std::string_view text, std::string_view option,
                           double lo = -std::numeric_limits<double>::max(),
                           double hi = std::numeric_limits<double>::max()) {
  double v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != text.data() + text.size())
    fail(option, ": '", text, "' is not a number");
  if (ec == std::errc::result_out_of_range || !std::isfinite(v) || v < lo || v > hi)
    fail(option, ": ", text, " is outside [", lo, ", ", hi, "]");
  return v;
}

}  // namespace moe::core
