#pragma once
// What the eight tools share on their command line (moe_plan, joint_compare, simgrid_compare,
// findep_fit_host, findep_fit_gpu, findep_grid, olmoe_cocluster, smpi_layer):
//
//  - parse_int / parse_double: the whole text must be one number inside the stated range, else a
//    moe::Error names the option, the text and the range (std::stoi took "12abc" and cut values
//    past INT_MAX silently).
//  - parse_list: a comma list with no empty item ("--format ," is an error, not "no formats").
//  - Args: `--name value` pairs and `--flag` words checked against the names the tool declares; an
//    unknown name, a missing value or an empty value is an error naming the option. Every typed
//    getter parses with the functions above.
//  - guarded_main: the one `main` guard. It maps the outcome to the exit statuses of
//    docs/planners.md ("Exit statuses") and prefixes every message with the program's name.
//
// These are tool headers, not part of the installed library (target moe_tool_headers).

#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <limits>
#include <map>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "moe/config.hpp"

namespace moe::tools {

/// The exit statuses every tool uses (docs/planners.md, "Exit statuses").
enum Exit : int {
  exit_ok = 0,        ///< the run did everything asked
  exit_check = 1,     ///< the run finished, but a check it performs failed (the output says which)
  exit_usage = 2,     ///< the command line or an input file is wrong: the message names the option or file
  exit_internal = 3,  ///< anything else failed (out of memory, a file system error): the message says what
};

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

/// The items of a comma list for option `option`; an empty list or an empty item is an error
/// (a request for nothing is a mistake, not a no-op).
inline std::vector<std::string> parse_list(std::string_view text, std::string_view option) {
  std::vector<std::string> out;
  check(!text.empty(), option, ": empty list");
  std::size_t at = 0;
  while (true) {
    std::size_t comma = text.find(',', at);
    std::string_view item = text.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
    check(!item.empty(), option, ": empty item in '", text, "'");
    out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  return out;
}

/// One option a tool reads: `--name VALUE`, or `--name` alone when `flag`.
struct Option {
  std::string_view name;  ///< without the leading "--"
  bool flag = false;
};

/// A tool's command line: `--name value` pairs (a later one replaces an earlier one) and flags,
/// checked against the declared options. --help / -h before any bad word sets help().
class Args {
public:
  Args(std::span<std::string const> words, std::initializer_list<Option> options, bool positionals = false)
      : options_(options) {
    for (std::size_t i = 0; i < words.size(); ++i) {
      std::string const& a = words[i];
      if (a == "--help" || a == "-h") {
        help_ = true;
        return;
      }
      if (a.rfind("--", 0) != 0) {
        check(positionals, "unexpected argument '", a, "' (see --help)");
        positional_.push_back(a);
        continue;
      }
      std::string name = a.substr(2);
      Option const* o = find(name);
      check(o != nullptr, "unknown option '", a, "' (see --help)");
      if (o->flag) {
        values_[name] = "";
        continue;
      }
      check(i + 1 < words.size(), a, ": missing value (see --help)");
      std::string const& v = words[++i];
      check(!v.empty(), a, ": empty value");
      values_[name] = v;
    }
  }
  Args(int argc, char** argv, std::initializer_list<Option> options, bool positionals = false)
      : Args(std::vector<std::string>(argv + (argc > 0 ? 1 : 0), argv + argc), options, positionals) {}

  [[nodiscard]] bool help() const { return help_; }
  [[nodiscard]] bool has(std::string_view name) const { return values_.count(std::string(name)) != 0; }
  [[nodiscard]] std::vector<std::string> const& positionals() const { return positional_; }

  [[nodiscard]] std::string text(std::string_view name, std::string fallback = {}) const {
    auto it = values_.find(std::string(name));
    return it == values_.end() ? std::move(fallback) : it->second;
  }
  [[nodiscard]] long long integer(std::string_view name, long long fallback, long long lo, long long hi) const {
    return has(name) ? parse_int(text(name), flag_name(name), lo, hi) : fallback;
  }
  [[nodiscard]] double number(std::string_view name, double fallback, double lo, double hi) const {
    return has(name) ? parse_double(text(name), flag_name(name), lo, hi) : fallback;
  }
  /// A comma list; `fallback` when the option is absent.
  [[nodiscard]] std::vector<std::string> list(std::string_view name, std::string_view fallback) const {
    return has(name) ? parse_list(text(name), flag_name(name)) : parse_list(fallback, flag_name(name));
  }
  /// One of `choices`; `fallback` when the option is absent.
  [[nodiscard]] std::string choice(std::string_view name, std::string fallback,
                                   std::initializer_list<std::string_view> choices) const {
    std::string v = text(name, std::move(fallback));
    std::string known;
    for (auto c : choices) {
      if (v == c) return v;
      known += (known.empty() ? "" : ", ") + std::string(c);
    }
    fail(flag_name(name), ": expected one of ", known, ", got '", v, "'");
  }
  /// on|off.
  [[nodiscard]] bool on_off(std::string_view name, bool fallback) const {
    if (!has(name)) return fallback;
    return choice(name, "", {"on", "off"}) == "on";
  }

  static std::string flag_name(std::string_view name) { return "--" + std::string(name); }

private:
  Option const* find(std::string_view name) const {
    for (auto const& o : options_)
      if (o.name == name) return &o;
    return nullptr;
  }
  std::vector<Option> options_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

/// The one `main` guard: runs `body` (which returns an Exit) and turns an escaping exception into
/// a message "<program>: <what>" on stderr and the exit status of its kind. A null `program` keeps
/// quiet (the ranks of a multi-process tool other than the first).
template <class Body>
int guarded_main(char const* program, Body&& body) noexcept {
  auto say = [program](char const* what) {
    if (program != nullptr) std::fprintf(stderr, "%s: %s\n", program, what);
  };
  try {
    return body();
  } catch (Error const& e) {
    say(e.what());
    return exit_usage;
  } catch (std::bad_alloc const&) {
    say("out of memory");
    return exit_internal;
  } catch (std::exception const& e) {
    say(e.what());
    return exit_internal;
  } catch (...) {
    say("unknown failure");
    return exit_internal;
  }
}

/// A named warning on stderr: "<program>: warning: <what>".
template <class... Parts>
void warn(char const* program, Parts const&... parts) {
  std::fprintf(stderr, "%s: warning: %s\n", program, detail::concat(parts...).c_str());
}

}  // namespace moe::tools
