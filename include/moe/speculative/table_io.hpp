#pragma once
// Files of the s-TS predictor tables (TSV, documented in docs/speculative.md), so that a Python
// engine can read what the offline planner computed. The expert -> device grouping of s-EG is a
// placement table: write it with moe/plan/plan_io.hpp.
//
// Token table:
//   moe-token-table <tab> 1 <tab> VOCAB <tab> DEVICES
//   token_id <tab> device <tab> confidence_q15          (known tokens only, ascending token ids)
// Device-sequence table:
//   moe-sequence-table <tab> 1 <tab> DEVICES <tab> LOOKBACK
//   d_1 <tab> ... <tab> d_L <tab> device <tab> confidence_q15   (rows with an entry; d_1 oldest)
// confidence_q15 is an integer in [0, 32767]; probability = value / 32767.

#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/tsv.hpp"
#include "moe/speculative/predictor.hpp"

namespace moe::speculative {

inline constexpr char const* kTokenTableMagic = "moe-token-table";
inline constexpr char const* kSequenceTableMagic = "moe-sequence-table";

inline void write_token_table(std::ostream& os, TokenDeviceTable const& t) {
  os << kTokenTableMagic << "\t1\t" << t.vocab() << '\t' << t.devices() << '\n';
  auto const& dev = t.devices_array();
  auto const& conf = t.confidence_array();
  for (std::size_t i = 0; i < dev.size(); ++i)
    if (dev[i] >= 0) os << i << '\t' << dev[i] << '\t' << conf[i] << '\n';
}

inline void write_token_table(std::string const& path, TokenDeviceTable const& t) {
  std::ofstream os(path);
  check(os.is_open(), "cannot open '", path, "' for writing");
  write_token_table(os, t);
  check(static_cast<bool>(os), "write error on '", path, "'");
}

namespace detail {
inline void expect_magic(core::TsvReader& in, char const* magic, std::size_t fields) {
  if (!in.next()) fail(in.name(), ": empty file, expected a '", magic, "' header");
  if (in.field(0) != magic) fail(in.where(), ": expected the '", magic, "' header, found '", in.field(0), "'");
  in.expect_fields(fields);
  auto version = in.get_int<int>(1, "version");
  if (version != 1) fail(in.where(), ": unsupported version ", version, " (this reader knows 1)");
}
}  // namespace detail

/// Reads a token table. Throws moe::Error (file:line) on a bad header, a malformed line, an id or
/// device out of range, a confidence outside [0, 32767], or a token listed twice.
inline TokenDeviceTable read_token_table(core::TsvReader& in) {
  detail::expect_magic(in, kTokenTableMagic, 4);
  auto vocab = in.get_int<int>(2, "vocab");
  auto devices = in.get_int<int>(3, "devices");
  if (vocab <= 0 || devices <= 0 || devices > 32767)
    fail(in.where(), ": vocab (", vocab, ") and devices (", devices, ") must be positive, devices <= 32767");
  TokenDeviceTable t = [&] {
    try {
      return TokenDeviceTable(vocab, devices);
    } catch (Error const& e) { fail(in.where(), ": ", e.what()); }
  }();
  while (in.next()) {
    in.expect_fields(3);
    auto token = in.get_int<int>(0, "token_id");
    auto device = in.get_int<int>(1, "device");
    auto conf = in.get_int<int>(2, "confidence_q15");
    if (token < 0 || token >= vocab) fail(in.where(), ": token id ", token, " outside [0, ", vocab, ")");
    if (device < 0 || device >= devices) fail(in.where(), ": device ", device, " outside [0, ", devices, ")");
    if (conf < 0 || conf > 32767) fail(in.where(), ": confidence ", conf, " outside [0, 32767]");
    if (t.known(token)) fail(in.where(), ": token ", token, " is listed twice");
    t.set_q15(token, device, static_cast<Q15>(conf));
  }
  return t;
}

inline TokenDeviceTable read_token_table(std::string const& path) {
  core::TsvReader in(path);
  return read_token_table(in);
}

inline void write_sequence_table(std::ostream& os, DeviceSequenceTable const& t) {
  os << kSequenceTableMagic << "\t1\t" << t.devices() << '\t' << t.lookback() << '\n';
  auto D = static_cast<std::size_t>(t.devices());
  auto L = static_cast<std::size_t>(t.lookback());
  std::vector<std::size_t> digits(L);
  for (std::size_t r = 0; r < t.rows(); ++r) {
    Lookup e = t.row_entry(r);
    if (e.device < 0) continue;
    std::size_t x = r;
    for (std::size_t k = L; k-- > 0;) {
      digits[k] = x % D;
      x /= D;
    }
    for (auto d : digits) os << d << '\t';
    os << e.device << '\t' << e.confidence << '\n';
  }
}

inline void write_sequence_table(std::string const& path, DeviceSequenceTable const& t) {
  std::ofstream os(path);
  check(os.is_open(), "cannot open '", path, "' for writing");
  write_sequence_table(os, t);
  check(static_cast<bool>(os), "write error on '", path, "'");
}

/// Reads a device-sequence table; errors as read_token_table.
inline DeviceSequenceTable read_sequence_table(core::TsvReader& in) {
  detail::expect_magic(in, kSequenceTableMagic, 4);
  auto devices = in.get_int<int>(2, "devices");
  auto lookback = in.get_int<int>(3, "lookback");
  if (devices <= 0 || devices > 256 || lookback < 1 || lookback > 4)
    fail(in.where(), ": devices (", devices, ") must be in [1, 256] and lookback (", lookback, ") in [1, 4]");
  DeviceSequenceTable t = [&] {
    try {
      return DeviceSequenceTable(devices, lookback);
    } catch (Error const& e) { fail(in.where(), ": ", e.what()); }
  }();
  auto L = static_cast<std::size_t>(lookback);
  std::vector<int> prev(L);
  std::vector<char> seen(t.rows(), 0);
  while (in.next()) {
    in.expect_fields(L + 2);
    std::size_t r = 0;
    for (std::size_t k = 0; k < L; ++k) {
      prev[k] = in.get_int<int>(k, "previous device");
      if (prev[k] < 0 || prev[k] >= devices)
        fail(in.where(), ": previous device ", prev[k], " outside [0, ", devices, ")");
      r = r * static_cast<std::size_t>(devices) + static_cast<std::size_t>(prev[k]);
    }
    auto device = in.get_int<int>(L, "device");
    auto conf = in.get_int<int>(L + 1, "confidence_q15");
    if (device < 0 || device >= devices) fail(in.where(), ": device ", device, " outside [0, ", devices, ")");
    if (conf < 0 || conf > 32767) fail(in.where(), ": confidence ", conf, " outside [0, 32767]");
    if (seen[r]) fail(in.where(), ": this device sequence is listed twice");
    seen[r] = 1;
    t.set(prev, device, static_cast<Q15>(conf));
  }
  return t;
}

inline DeviceSequenceTable read_sequence_table(std::string const& path) {
  core::TsvReader in(path);
  return read_sequence_table(in);
}

}  // namespace moe::speculative
