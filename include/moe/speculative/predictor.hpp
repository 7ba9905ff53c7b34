#pragma once
// s-TS route predictors (Speculative MoE, section 3.3 and Appendix B).
//
//   TokenDeviceTable     token id -> device (expert cluster) + confidence, int16 entries, one per
//                        vocabulary id, for one layer (the paper's token-to-expert-cluster table).
//   DeviceSequenceTable  the devices a token went to at the previous L layers (L = 2 by default)
//                        -> device at this layer + confidence (the expert-cluster-sequence table).
//   Predictor            takes the more confident of the two; tokens the profile never saw go
//                        through a nearest-known-token hook (e.g. embedding cosine), then a default.
//   TokenExpertTable     token id -> its top-k experts (for expert-level precision / recall).
//
// Confidences are stored as Q15 int16: value / 32767 is a probability in [0, 1].
// The "device of an occurrence" at a layer is the device holding most of its top-k experts
// (ties: the lowest device id).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "moe/config.hpp"
#include "moe/speculative/cocluster.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/profile/route_profile.hpp"

namespace moe::speculative {

using Q15 = std::int16_t;
inline constexpr double q15_scale = 32767.0;
[[nodiscard]] inline Q15 to_q15(double p) {
  check(!std::isnan(p), "confidence is NaN (expected a share in [0, 1])");
  p = std::clamp(p, 0.0, 1.0);
  return static_cast<Q15>(std::lround(p * q15_scale));
}
[[nodiscard]] inline double from_q15(Q15 q) { return static_cast<double>(q) / q15_scale; }

/// Device holding most of `experts` under `placement` (ties: lowest device). `devices` bounds ids.
[[nodiscard]] inline int main_device(std::span<std::int16_t const> experts, placement::Table const& placement,
                                     int devices) {
  int counts[256] = {};
  check(devices > 0 && devices <= 256, "main_device: devices must be in [1, 256], got ", devices);
  int best = 0;
  for (auto e : experts) {
    check(e >= 0 && e < placement.experts(), "main_device: expert ", e, " outside the placement [0, ",
          placement.experts(), ")");
    int d = placement.rank_of(e);
    check(d >= 0 && d < devices, "main_device: expert ", e, " is on device ", d, ", outside [0, ", devices, ")");
    ++counts[d];
  }
  for (int d = 1; d < devices; ++d)
    if (counts[d] > counts[best]) best = d;
  return best;
}

struct Lookup {
  int device = -1;  ///< -1: no entry
  Q15 confidence = 0;
};

// -------------------------------------------------------------------------------------------------

/// Token id -> device with confidence for one layer. Ids in [0, vocab); unseen ids have device -1.
class TokenDeviceTable {
public:
  /// Largest vocabulary (4 bytes per id): 2^26 ids, far above real tokenizers (about 10^5), so a
  /// corrupt size in a table file is an error rather than a multi-gigabyte allocation.
  static constexpr int max_vocab = 1 << 26;
  TokenDeviceTable() = default;
  TokenDeviceTable(int vocab, int devices) : devices_(devices) {
    // Checked before the arrays are sized: a negative vocab would otherwise throw std::length_error.
    check(vocab > 0, "token table: vocabulary size must be positive, got ", vocab);
    check(vocab <= max_vocab, "token table: vocabulary size ", vocab, " is above the limit of ", max_vocab);
    check(devices > 0 && devices <= std::numeric_limits<std::int16_t>::max(),
          "token table: devices must be in [1, 32767], got ", devices);
    device_.assign(static_cast<std::size_t>(vocab), -1);
    conf_.assign(static_cast<std::size_t>(vocab), 0);
  }

  /// From a co-clustering: row i's token gets result.token_device[i], confidence = the share of
  /// its profiled activations on that device.
  static TokenDeviceTable from_cocluster(moe::speculative::CoclusterProblem const& p,
                                         moe::speculative::CoclusterResult const& r, int vocab) {
    check(r.token_device.size() == p.rows() && r.token_confidence.size() == p.rows(),
          "token table: co-clustering result has ", r.token_device.size(), " token devices and ",
          r.token_confidence.size(), " confidences, the problem ", p.rows(), " tokens");
    TokenDeviceTable t(vocab, p.devices);
    for (std::size_t i = 0; i < p.rows(); ++i) t.set(p.tokens[i], r.token_device[i], r.token_confidence[i]);
    return t;
  }

  /// From profiled counts and a fixed expert placement: each token goes to the device holding most
  /// of its activations (s-TS without s-EG); confidence = that share.
  static TokenDeviceTable from_counts(profile::LayerCounts const& lc, placement::Table const& placement,
                                      int devices, int vocab) {
    placement.validate(lc.experts, devices);
    TokenDeviceTable t(vocab, devices);
    std::vector<double> mass(static_cast<std::size_t>(devices));
    for (std::size_t i = 0; i < lc.rows(); ++i) {
      std::fill(mass.begin(), mass.end(), 0.0);
      double total = 0;
      for (auto j = lc.offsets[i]; j < lc.offsets[i + 1]; ++j) {
        auto ju = static_cast<std::size_t>(j);
        mass[static_cast<std::size_t>(placement.rank_of(lc.expert[ju]))] += static_cast<double>(lc.count[ju]);
        total += static_cast<double>(lc.count[ju]);
      }
      auto best = static_cast<int>(std::max_element(mass.begin(), mass.end()) - mass.begin());
      t.set(lc.tokens[i], best, total > 0 ? mass[static_cast<std::size_t>(best)] / total : 0.0);
    }
    return t;
  }

  void set(int token, int device, double confidence) { set_q15(token, device, to_q15(confidence)); }
  /// Same with the stored Q15 confidence.
  void set_q15(int token, int device, Q15 confidence) {
    check_token(token);
    check(confidence >= 0, "token table: negative confidence ", confidence);
    check(device >= 0 && device < devices_, "token table: device ", device, " outside [0, ", devices_, ")");
    device_[static_cast<std::size_t>(token)] = static_cast<std::int16_t>(device);
    conf_[static_cast<std::size_t>(token)] = confidence;
  }

  /// Entry of a token id; device -1 when the profile never saw it. Throws on ids outside [0, vocab).
  [[nodiscard]] Lookup lookup(int token) const {
    check_token(token);
    auto u = static_cast<std::size_t>(token);
    return {device_[u], conf_[u]};
  }
  [[nodiscard]] bool known(int token) const { return lookup(token).device >= 0; }
  [[nodiscard]] int vocab() const { return static_cast<int>(device_.size()); }
  [[nodiscard]] int devices() const { return devices_; }
  [[nodiscard]] std::size_t known_count() const {
    return static_cast<std::size_t>(std::count_if(device_.begin(), device_.end(), [](auto d) { return d >= 0; }));
  }
  /// Raw arrays (for copying to a device or serialising).
  [[nodiscard]] std::vector<std::int16_t> const& devices_array() const { return device_; }
  [[nodiscard]] std::vector<Q15> const& confidence_array() const { return conf_; }

private:
  void check_token(int token) const {
    check(token >= 0 && token < vocab(), "token table: token id ", token, " outside the vocabulary [0, ",
          vocab(), ")");
  }
  int devices_ = 0;
  std::vector<std::int16_t> device_;
  std::vector<Q15> conf_;
};

// -------------------------------------------------------------------------------------------------

/// (device at layer l-L, ..., device at layer l-1) -> device at layer l, with confidence.
class DeviceSequenceTable {
public:
  /// Largest table (devices^(lookback + 1) counts of 8 bytes): 2^27 cells = 1 GiB.
  static constexpr std::size_t max_cells = std::size_t{1} << 27;
  DeviceSequenceTable() = default;
  DeviceSequenceTable(int devices, int lookback) : devices_(devices), lookback_(lookback) {
    check(devices > 0 && devices <= 256, "device-sequence table: devices must be in [1, 256], got ", devices);
    check(lookback >= 1 && lookback <= 4, "device-sequence table: lookback must be in [1, 4], got ", lookback);
    std::size_t rows = 1;
    for (int i = 0; i < lookback; ++i) rows *= static_cast<std::size_t>(devices);
    // devices^(lookback + 1) count cells: 64 devices with lookback 4 would be 8.6 GB.
    check(rows * static_cast<std::size_t>(devices) <= max_cells, "device-sequence table: ", devices,
          " devices with lookback ", lookback, " need ", rows * static_cast<std::size_t>(devices),
          " cells, above the limit of ", max_cells, "; use a shorter lookback");
    counts_.assign(rows * static_cast<std::size_t>(devices), 0.0);
    device_.assign(rows, -1);
    conf_.assign(rows, 0);
  }

  /// From per-occurrence paths: `paths` are the layers l-L, ..., l-1, l in that order (L + 1
  /// entries, same occurrences), `placements` their expert placements.
  static DeviceSequenceTable from_paths(std::span<profile::LayerPaths const* const> paths,
                                        std::span<placement::Table const* const> placements, int devices,
                                        int top_k) {
    check(paths.size() >= 2 && paths.size() == placements.size(),
          "device-sequence table: need lookback + 1 layers of paths and one placement per layer");
    check(top_k > 0, "device-sequence table: top_k must be positive");
    DeviceSequenceTable t(devices, static_cast<int>(paths.size()) - 1);
    std::size_t n = paths[0]->tokens.size();
    check(n > 0, "device-sequence table: no recorded occurrences (empty profile)");
    for (auto const* p : paths)
      check(p->tokens.size() == n && p->experts.size() == n * static_cast<std::size_t>(top_k),
            "device-sequence table: layer ", p->layer, " has a different number of occurrences");
    std::vector<int> seq(paths.size());
    for (std::size_t o = 0; o < n; ++o) {
      for (std::size_t l = 0; l < paths.size(); ++l)
        seq[l] = main_device(std::span<std::int16_t const>(paths[l]->experts).subspan(o * static_cast<std::size_t>(top_k),
                                                                                      static_cast<std::size_t>(top_k)),
                             *placements[l], devices);
      t.add(std::span<int const>(seq).first(seq.size() - 1), seq.back(), 1.0);
    }
    t.finalize();
    return t;
  }

  /// Lookback 1 from cross-layer expert co-selection counts (experts x experts, row = layer a):
  /// weight of (d_a -> d_b) = sum of counts of expert pairs on those devices.
  static DeviceSequenceTable from_crosslayer(std::span<std::int64_t const> counts, placement::Table const& a,
                                             placement::Table const& b, int devices) {
    auto E = static_cast<std::size_t>(a.experts());
    check(E > 0 && static_cast<std::size_t>(b.experts()) == E && counts.size() == E * E,
          "device-sequence table: cross-layer matrix is ", counts.size(), " entries, expected ", E, " x ", E);
    DeviceSequenceTable t(devices, 1);
    for (std::size_t i = 0; i < E; ++i)
      for (std::size_t j = 0; j < E; ++j) {
        int da = a.rank_of(static_cast<int>(i));
        t.add(std::span<int const>(&da, 1), b.rank_of(static_cast<int>(j)), static_cast<double>(counts[i * E + j]));
      }
    t.finalize();
    return t;
  }

  /// Adds weight to (previous devices -> device).
  void add(std::span<int const> previous, int device, double weight) {
    check(device >= 0 && device < devices_, "device-sequence table: device ", device, " outside [0, ", devices_, ")");
    counts_[row(previous) * static_cast<std::size_t>(devices_) + static_cast<std::size_t>(device)] += weight;
  }

  /// Sets one row's prediction directly (e.g. when reading a table file). finalize() would replace
  /// it by the argmax of the accumulated counts.
  void set(std::span<int const> previous, int device, Q15 confidence) {
    check(device >= -1 && device < devices_, "device-sequence table: device ", device, " outside [-1, ", devices_, ")");
    check(confidence >= 0, "device-sequence table: negative confidence ", confidence);
    auto r = row(previous);
    device_[r] = static_cast<std::int16_t>(device);
    conf_[r] = device >= 0 ? confidence : Q15{0};
  }

  /// Number of rows (devices ^ lookback); row r lists the previous devices as base-D digits,
  /// oldest first.
  [[nodiscard]] std::size_t rows() const { return device_.size(); }
  /// Entry of row r (see rows()).
  [[nodiscard]] Lookup row_entry(std::size_t r) const {
    check(r < device_.size(), "device-sequence table: row ", r, " outside [0, ", device_.size(), ")");
    return {device_[r], conf_[r]};
  }

  /// Recomputes the argmax device and its confidence (share of the row) of every row.
  void finalize() {
    auto D = static_cast<std::size_t>(devices_);
    for (std::size_t r = 0; r < device_.size(); ++r) {
      double sum = 0, best = 0;
      int arg = -1;
      for (std::size_t d = 0; d < D; ++d) {
        double c = counts_[r * D + d];
        sum += c;
        if (c > best) {
          best = c;
          arg = static_cast<int>(d);
        }
      }
      device_[r] = static_cast<std::int16_t>(arg);
      conf_[r] = arg >= 0 ? to_q15(best / sum) : Q15{0};
    }
  }

  /// Prediction from the devices of the previous `lookback` layers (oldest first).
  [[nodiscard]] Lookup lookup(std::span<int const> previous) const {
    auto r = row(previous);
    return {device_[r], conf_[r]};
  }
  [[nodiscard]] int lookback() const { return lookback_; }
  [[nodiscard]] int devices() const { return devices_; }

private:
  [[nodiscard]] std::size_t row(std::span<int const> previous) const {
    check(static_cast<int>(previous.size()) == lookback_, "device-sequence table: expected ", lookback_,
          " previous devices, got ", previous.size());
    std::size_t r = 0;
    for (int d : previous) {
      check(d >= 0 && d < devices_, "device-sequence table: previous device ", d, " outside [0, ", devices_, ")");
      r = r * static_cast<std::size_t>(devices_) + static_cast<std::size_t>(d);
    }
    return r;
  }
  int devices_ = 0;
  int lookback_ = 0;
  std::vector<double> counts_;
  std::vector<std::int16_t> device_;
  std::vector<Q15> conf_;
};

// -------------------------------------------------------------------------------------------------

/// Maps a token id the profile never saw to a known token id (or -1 when it has none).
using NearestToken = std::function<int(int token)>;

/// Embedding-cosine nearest known token (brute force over the known tokens; O(known * hidden) per
/// query). `embeddings` is vocab x hidden row-major.
inline NearestToken cosine_nearest(std::vector<float> embeddings, int hidden, TokenDeviceTable const& table) {
  check(hidden > 0, "cosine_nearest: hidden must be positive");
  check(embeddings.size() == static_cast<std::size_t>(table.vocab()) * static_cast<std::size_t>(hidden),
        "cosine_nearest: embeddings hold ", embeddings.size(), " values, expected vocab x hidden = ",
        static_cast<std::size_t>(table.vocab()) * static_cast<std::size_t>(hidden));
  std::vector<int> known;
  std::vector<double> norm(static_cast<std::size_t>(table.vocab()), 0.0);
  auto H = static_cast<std::size_t>(hidden);
  for (int t = 0; t < table.vocab(); ++t) {
    double s = 0;
    for (std::size_t k = 0; k < H; ++k) {
      double v = embeddings[static_cast<std::size_t>(t) * H + k];
      s += v * v;
    }
    norm[static_cast<std::size_t>(t)] = std::sqrt(s);
    if (table.known(t) && s > 0) known.push_back(t);
  }
  return [emb = std::move(embeddings), norm = std::move(norm), known = std::move(known), H](int token) -> int {
    auto u = static_cast<std::size_t>(token);
    if (token < 0 || u >= norm.size() || norm[u] == 0) return -1;
    int best = -1;
    double best_cos = -2;
    for (int k : known) {
      auto ku = static_cast<std::size_t>(k);
      double dot = 0;
      for (std::size_t h = 0; h < H; ++h) dot += static_cast<double>(emb[u * H + h]) * emb[ku * H + h];
      double c = dot / (norm[u] * norm[ku]);
      if (c > best_cos) {
        best_cos = c;
        best = k;
      }
    }
    return best;
  };
}

struct Prediction {
  enum class Source { token_table, sequence_table, nearest_token, fallback };
  int device = 0;
  Q15 confidence = 0;
  Source source = Source::fallback;
};

/// The s-TS predictor of one layer.
///
/// predict(token, previous):
///   1. token table entry; for an unseen id, the entry of nearest(token) when a hook is set;
///   2. device-sequence table entry for the previous devices (when a table and history are given);
///   3. the more confident of 1 and 2 (ties: the token table);
///   4. when neither has an entry: the default, device = token id mod devices (confidence 0), which
///      spreads unseen tokens evenly and deterministically over the devices.
/// Token ids outside [0, vocab) throw moe::Error.
class Predictor {
public:
  explicit Predictor(TokenDeviceTable tokens, std::optional<DeviceSequenceTable> sequence = std::nullopt,
                     NearestToken nearest = {})
      : tokens_(std::move(tokens)), sequence_(std::move(sequence)), nearest_(std::move(nearest)) {
    check(tokens_.vocab() > 0, "predictor: empty token table");
    if (sequence_)
      check(sequence_->devices() == tokens_.devices(), "predictor: token table has ", tokens_.devices(),
            " devices, sequence table ", sequence_->devices());
  }

  [[nodiscard]] Prediction predict(int token, std::span<int const> previous = {}) const {
    Lookup t = tokens_.lookup(token);
    Prediction out;
    if (t.device >= 0) {
      out = {t.device, t.confidence, Prediction::Source::token_table};
    } else if (nearest_) {
      int n = nearest_(token);
      if (n >= 0 && n < tokens_.vocab()) {
        Lookup nt = tokens_.lookup(n);
        if (nt.device >= 0) out = {nt.device, nt.confidence, Prediction::Source::nearest_token};
      }
    }
    bool have_token = out.source != Prediction::Source::fallback;
    if (sequence_ && !previous.empty()) {
      Lookup s = sequence_->lookup(previous);
      if (s.device >= 0 && (!have_token || s.confidence > out.confidence))
        return {s.device, s.confidence, Prediction::Source::sequence_table};
    }
    if (!have_token) out = {token % tokens_.devices(), 0, Prediction::Source::fallback};
    return out;
  }

  /// Devices of a batch without history (token table, nearest hook, default).
  void predict_devices(std::span<int const> tokens, std::span<int> devices) const {
    check(devices.size() == tokens.size(), "predictor: output has ", devices.size(), " slots for ",
          tokens.size(), " tokens");
    for (std::size_t i = 0; i < tokens.size(); ++i) devices[i] = predict(tokens[i]).device;
  }

  /// Devices of a batch with history: previous[i*L .. (i+1)*L) are token i's devices at the L
  /// previous layers (oldest first).
  void predict_devices(std::span<int const> tokens, std::span<int const> previous, std::span<int> devices) const {
    check(sequence_.has_value(), "predictor: history given but no device-sequence table");
    auto L = static_cast<std::size_t>(sequence_->lookback());
    check(previous.size() == tokens.size() * L && devices.size() == tokens.size(),
          "predictor: batch of ", tokens.size(), " tokens needs ", tokens.size() * L, " history entries and ",
          tokens.size(), " outputs");
    for (std::size_t i = 0; i < tokens.size(); ++i) devices[i] = predict(tokens[i], previous.subspan(i * L, L)).device;
  }

  [[nodiscard]] TokenDeviceTable const& token_table() const { return tokens_; }
  [[nodiscard]] DeviceSequenceTable const* sequence_table() const { return sequence_ ? &*sequence_ : nullptr; }

private:
  TokenDeviceTable tokens_;
  std::optional<DeviceSequenceTable> sequence_;
  NearestToken nearest_;
};

// -------------------------------------------------------------------------------------------------

/// Token id -> its k most frequent experts at one layer (int16, -1 padded; ties: lower expert).
class TokenExpertTable {
public:
  TokenExpertTable(profile::LayerCounts const& lc, int k, int vocab)
      : k_(k), experts_(static_cast<std::size_t>(vocab) * static_cast<std::size_t>(k), -1) {
    check(k > 0 && k <= lc.experts, "token-expert table: k must be in [1, experts], got ", k);
    check(vocab > 0, "token-expert table: vocabulary size must be positive");
    std::vector<std::pair<std::int64_t, int>> row;
    for (std::size_t i = 0; i < lc.rows(); ++i) {
      check(lc.tokens[i] < vocab, "token-expert table: profiled token ", lc.tokens[i], " outside [0, ", vocab, ")");
      row.clear();
      for (auto j = lc.offsets[i]; j < lc.offsets[i + 1]; ++j)
        row.push_back({-lc.count[static_cast<std::size_t>(j)], lc.expert[static_cast<std::size_t>(j)]});
      std::sort(row.begin(), row.end());
      for (std::size_t r = 0; r < row.size() && r < static_cast<std::size_t>(k); ++r)
        experts_[static_cast<std::size_t>(lc.tokens[i]) * static_cast<std::size_t>(k) + r] =
            static_cast<std::int16_t>(row[r].second);
    }
  }
  /// The predicted experts of a token (empty when unseen). Throws on ids outside [0, vocab).
  [[nodiscard]] std::span<std::int16_t const> experts(int token) const {
    check(token >= 0 && token < vocab(), "token-expert table: token id ", token, " outside the vocabulary [0, ",
          vocab(), ")");
    auto row = std::span<std::int16_t const>(experts_).subspan(static_cast<std::size_t>(token) * static_cast<std::size_t>(k_),
                                                               static_cast<std::size_t>(k_));
    std::size_t n = 0;
    while (n < row.size() && row[n] >= 0) ++n;
    return row.first(n);
  }
  [[nodiscard]] int k() const { return k_; }
  [[nodiscard]] int vocab() const { return static_cast<int>(experts_.size() / static_cast<std::size_t>(k_)); }

private:
  int k_;
  std::vector<std::int16_t> experts_;
};

}  // namespace moe::speculative
