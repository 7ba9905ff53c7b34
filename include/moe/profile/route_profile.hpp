#pragma once
// Route profiles: which experts each token chose, per MoE layer.
//
// Two ways in:
//   - RouteRecorder::record(token_id, layer, experts): one call per token occurrence and layer, made
//     by a router during profiling runs. The recorder keeps aggregated token -> expert counts and,
//     optionally, the per-occurrence paths (needed by the device-sequence predictor).
//   - load_token_expert_counts / load_crosslayer_counts: aggregated statistics from TSV files (the
//     format of shared/data/olmoe-routing, documented in docs/speculative.md).
// Either way RouteRecorder::profile() freezes the data into an immutable RouteProfile with one
// compressed (CSR) token -> expert count table per layer.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <ostream>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/tsv.hpp"

namespace moe::profile {

/// Token -> expert activation counts of one layer, rows sorted by token id (CSR).
struct LayerCounts {
  int layer = 0;
  int experts = 0;
  std::vector<std::int32_t> tokens;   ///< distinct token ids, ascending
  std::vector<std::int64_t> offsets;  ///< row i is [offsets[i], offsets[i+1])
  std::vector<std::int32_t> expert;   ///< expert of each entry, ascending within a row
  std::vector<std::int64_t> count;    ///< activations of (token, expert), > 0

  [[nodiscard]] std::size_t rows() const { return tokens.size(); }
  [[nodiscard]] std::size_t nonzeros() const { return expert.size(); }
  [[nodiscard]] bool empty() const { return tokens.empty(); }

  /// Row index of a token id, or -1 when the layer never saw it.
  [[nodiscard]] std::ptrdiff_t find(std::int32_t token) const {
    auto it = std::lower_bound(tokens.begin(), tokens.end(), token);
    if (it == tokens.end() || *it != token) return -1;
    return it - tokens.begin();
  }
  /// Sum of the counts of row i (token activations = occurrences * top_k).
  [[nodiscard]] std::int64_t row_total(std::size_t i) const {
    std::int64_t s = 0;
    for (auto j = offsets[i]; j < offsets[i + 1]; ++j) s += count[static_cast<std::size_t>(j)];
    return s;
  }
  [[nodiscard]] std::int64_t total() const {
    std::int64_t s = 0;
    for (auto c : count) s += c;
    return s;
  }
  /// Activations per expert (the expert load of this layer).
  [[nodiscard]] std::vector<std::int64_t> expert_load() const {
    std::vector<std::int64_t> load(static_cast<std::size_t>(experts), 0);
    for (std::size_t j = 0; j < expert.size(); ++j) load[static_cast<std::size_t>(expert[j])] += count[j];
    return load;
  }
};

/// Per-occurrence routes of one layer, in the order the router produced them.
struct LayerPaths {
  int layer = 0;
  std::vector<std::int32_t> tokens;   ///< token id of occurrence n
  std::vector<std::int16_t> experts;  ///< experts of occurrence n: [n*top_k, (n+1)*top_k)
};

/// An immutable route profile: per layer token -> expert counts, optional cross-layer expert
/// co-selection counts and optional per-occurrence paths.
class RouteProfile {
public:
  RouteProfile() = default;

  [[nodiscard]] int experts() const { return experts_; }
  /// Experts chosen per token (0 when unknown, e.g. a profile loaded from files without top_k).
  [[nodiscard]] int top_k() const { return top_k_; }
  [[nodiscard]] bool empty() const { return layers_.empty(); }
  /// Layer indices present, ascending.
  [[nodiscard]] std::vector<int> layers() const {
    std::vector<int> out;
    for (auto const& l : layers_) out.push_back(l.layer);
    return out;
  }
  [[nodiscard]] bool has_layer(int layer) const { return index_of(layer) >= 0; }

  /// Counts of one layer; throws moe::Error when the profile is empty or lacks the layer.
  [[nodiscard]] LayerCounts const& layer(int layer) const {
    check(!layers_.empty(), "route profile is empty: no token -> expert counts were recorded or loaded");
    auto i = index_of(layer);
    check(i >= 0, "route profile has no layer ", layer, " (it has ", layers_.size(), " layers)");
    return layers_[static_cast<std::size_t>(i)];
  }

  /// Number of occurrences of row i of a layer: row total / top_k (top_k must be known).
  [[nodiscard]] double occurrences(LayerCounts const& l, std::size_t row) const {
    check(top_k_ > 0, "route profile: top_k is unknown, cannot turn activation counts into occurrences");
    return static_cast<double>(l.row_total(row)) / top_k_;
  }

  /// Expert co-selection counts between layer a and layer b, experts x experts row-major
  /// (row = expert at layer a). Throws when the pair was not recorded or loaded.
  [[nodiscard]] std::vector<std::int64_t> const& crosslayer(int layer_a, int layer_b) const {
    auto it = cross_.find({layer_a, layer_b});
    check(it != cross_.end(), "route profile has no cross-layer counts for layers ", layer_a, " -> ",
          layer_b);
    return it->second;
  }
  [[nodiscard]] bool has_crosslayer(int layer_a, int layer_b) const {
    return cross_.count({layer_a, layer_b}) > 0;
  }

  /// Per-occurrence paths of one layer (only for profiles recorded with paths kept).
  [[nodiscard]] LayerPaths const& paths(int layer) const {
    for (auto const& p : paths_)
      if (p.layer == layer) return p;
    fail("route profile has no per-occurrence paths for layer ", layer,
         " (record with keep_paths = true; files hold aggregated counts only)");
  }
  [[nodiscard]] bool has_paths() const { return !paths_.empty(); }

private:
  friend class RouteRecorder;
  [[nodiscard]] std::ptrdiff_t index_of(int layer) const {
    for (std::size_t i = 0; i < layers_.size(); ++i)
      if (layers_[i].layer == layer) return static_cast<std::ptrdiff_t>(i);
    return -1;
  }
  int experts_ = 0;
  int top_k_ = 0;
  std::vector<LayerCounts> layers_;
  std::map<std::pair<int, int>, std::vector<std::int64_t>> cross_;
  std::vector<LayerPaths> paths_;
};

/// Collects routes (from routers or files) and freezes them into a RouteProfile.
class RouteRecorder {
public:
  /// `experts`: experts per layer; `top_k`: experts per token (0 = unknown, allowed for files only);
  /// `keep_paths`: also keep every occurrence's route (memory: top_k * 2 + 4 bytes per record).
  RouteRecorder(int experts, int top_k, bool keep_paths = false)
      : experts_(experts), top_k_(top_k), keep_paths_(keep_paths) {
    check(experts > 0 && experts <= 32767, "route recorder: experts must be in [1, 32767], got ", experts);
    check(top_k >= 0 && top_k <= experts, "route recorder: top_k must be in [0, experts = ", experts,
          "], got ", top_k);
  }

  [[nodiscard]] int experts() const { return experts_; }
  [[nodiscard]] int top_k() const { return top_k_; }

  /// One token occurrence routed at one layer to `experts` (exactly top_k distinct experts).
  /// Calls for the same layer must come in the same token order for every layer when paths are
  /// kept: the n-th record of each layer is the same occurrence.
  void record(int token_id, int layer, std::span<int const> experts) {
    check(top_k_ > 0, "route recorder: record() needs top_k > 0");
    check(token_id >= 0, "route recorder: token id ", token_id, " is negative");
    check(layer >= 0, "route recorder: layer ", layer, " is negative");
    check(static_cast<int>(experts.size()) == top_k_, "route recorder: token ", token_id, " at layer ",
          layer, " has ", experts.size(), " experts, expected top_k = ", top_k_);
    for (std::size_t i = 0; i < experts.size(); ++i) {
      int e = experts[i];
      check(e >= 0 && e < experts_, "route recorder: token ", token_id, " at layer ", layer,
            " chose expert ", e, ", outside [0, ", experts_, ")");
      for (std::size_t j = 0; j < i; ++j)
        check(experts[j] != e, "route recorder: token ", token_id, " at layer ", layer,
              " chose expert ", e, " twice");
      pending_.push_back({static_cast<std::int32_t>(token_id), static_cast<std::int32_t>(layer),
                          static_cast<std::int32_t>(e), 1});
    }
    if (keep_paths_) {
      LayerPaths& p = paths_for(layer);
      p.tokens.push_back(static_cast<std::int32_t>(token_id));
      for (int e : experts) p.experts.push_back(static_cast<std::int16_t>(e));
    }
    maybe_compact();
  }

  /// A batch at one layer: token_ids[n] chose experts[n*top_k .. (n+1)*top_k).
  void record_batch(int layer, std::span<int const> token_ids, std::span<int const> experts) {
    check(top_k_ > 0, "route recorder: record_batch() needs top_k > 0");
    check(experts.size() == token_ids.size() * static_cast<std::size_t>(top_k_),
          "route recorder: batch of ", token_ids.size(), " tokens needs ", token_ids.size() * top_k_,
          " expert ids, got ", experts.size());
    for (std::size_t n = 0; n < token_ids.size(); ++n)
      record(token_ids[n], layer, experts.subspan(n * static_cast<std::size_t>(top_k_),
                                                  static_cast<std::size_t>(top_k_)));
  }

  /// Aggregated activations: `token_id` chose `expert` at `layer` `count` times.
  void add(int layer, int token_id, int expert, std::int64_t count) {
    check(layer >= 0, "route recorder: layer ", layer, " is negative");
    check(token_id >= 0, "route recorder: token id ", token_id, " is negative");
    check(expert >= 0 && expert < experts_, "route recorder: expert ", expert, " outside [0, ",
          experts_, ")");
    check(count >= 0, "route recorder: negative count ", count);
    if (count == 0) return;
    // Every sum the profile forms later (merged counts, row totals, expert loads, total()) is a
    // partial sum of these counts, so one checked running total keeps them all inside int64.
    total_ = core::checked_add(total_, count, "route recorder", "total activation count");
    pending_.push_back({token_id, layer, expert, count});
    maybe_compact();
  }

  /// Aggregated cross-layer co-selection counts.
  void add_crosslayer(int layer_a, int layer_b, int expert_a, int expert_b, std::int64_t count) {
    check(layer_a >= 0 && layer_b >= 0, "route recorder: negative layer in cross-layer counts");
    check(expert_a >= 0 && expert_a < experts_ && expert_b >= 0 && expert_b < experts_,
          "route recorder: cross-layer expert pair (", expert_a, ", ", expert_b, ") outside [0, ",
          experts_, ")");
    check(count >= 0, "route recorder: negative cross-layer count ", count);
    cross_total_ = core::checked_add(cross_total_, count, "route recorder", "total cross-layer count");
    auto key = std::pair{layer_a, layer_b};
    if (cross_.find(key) == cross_.end())
      check(static_cast<long long>(cross_.size() + 1) * experts_ * experts_ <= kMaxCrossEntries,
            "route recorder: cross-layer pair (", layer_a, ", ", layer_b, ") would exceed ", kMaxCrossEntries,
            " cross-layer counts in all (", cross_.size(), " layer pairs of ", experts_, " x ", experts_, ")");
    auto& m = cross_[key];
    if (m.empty()) m.assign(static_cast<std::size_t>(experts_) * static_cast<std::size_t>(experts_), 0);
    m[static_cast<std::size_t>(expert_a) * static_cast<std::size_t>(experts_) +
      static_cast<std::size_t>(expert_b)] += count;
  }

  /// Freezes what was collected. Throws when nothing was recorded, when paths of different layers
  /// disagree on the token sequence, or when a row total is not a multiple of top_k.
  [[nodiscard]] RouteProfile profile() {
    compact();
    check(!merged_.empty(), "route profile is empty: nothing was recorded or loaded");
    RouteProfile p;
    p.experts_ = experts_;
    p.top_k_ = top_k_;
    for (std::size_t i = 0; i < merged_.size();) {
      LayerCounts lc;
      lc.layer = merged_[i].layer;
      lc.experts = experts_;
      lc.offsets.push_back(0);
      std::size_t j = i;
      for (; j < merged_.size() && merged_[j].layer == lc.layer; ++j) {
        Entry const& en = merged_[j];
        if (lc.tokens.empty() || lc.tokens.back() != en.token) {
          if (!lc.tokens.empty()) lc.offsets.push_back(static_cast<std::int64_t>(lc.expert.size()));
          lc.tokens.push_back(en.token);
        }
        lc.expert.push_back(en.expert);
        lc.count.push_back(en.count);
      }
      lc.offsets.push_back(static_cast<std::int64_t>(lc.expert.size()));
      if (top_k_ > 0) {
        for (std::size_t r = 0; r < lc.rows(); ++r) {
          auto t = lc.row_total(r);
          check(t % top_k_ == 0, "route profile: token ", lc.tokens[r], " at layer ", lc.layer,
                " has ", t, " activations, not a multiple of top_k = ", top_k_);
        }
      }
      p.layers_.push_back(std::move(lc));
      i = j;
    }
    p.cross_ = cross_;
    if (keep_paths_) {
      std::vector<LayerPaths> paths = paths_;
      std::sort(paths.begin(), paths.end(), [](auto const& a, auto const& b) { return a.layer < b.layer; });
      for (std::size_t i = 1; i < paths.size(); ++i)
        check(paths[i].tokens == paths[0].tokens, "route recorder: layer ", paths[i].layer, " recorded ",
              paths[i].tokens.size(), " occurrences whose token ids differ from layer ", paths[0].layer,
              " (", paths[0].tokens.size(), "): record every layer in the same token order");
      p.paths_ = std::move(paths);
    }
    return p;
  }

private:
  struct Entry {
    std::int32_t token;
    std::int32_t layer;
    std::int32_t expert;
    std::int64_t count;
  };

  LayerPaths& paths_for(int layer) {
    for (auto& p : paths_)
      if (p.layer == layer) return p;
    paths_.push_back(LayerPaths{layer, {}, {}});
    return paths_.back();
  }

  void maybe_compact() {
    if (pending_.size() >= (std::size_t{1} << 22)) compact();
  }

  // Sorts the pending entries and merges them (and the already merged ones) by (layer, token, expert).
  void compact() {
    if (pending_.empty()) return;
    auto less = [](Entry const& a, Entry const& b) {
      if (a.layer != b.layer) return a.layer < b.layer;
      if (a.token != b.token) return a.token < b.token;
      return a.expert < b.expert;
    };
    std::sort(pending_.begin(), pending_.end(), less);
    std::vector<Entry> out;
    out.reserve(merged_.size() + pending_.size());
    std::merge(merged_.begin(), merged_.end(), pending_.begin(), pending_.end(), std::back_inserter(out), less);
    merged_.clear();
    for (Entry const& e : out) {
      if (!merged_.empty() && !less(merged_.back(), e)) merged_.back().count += e.count;
      else merged_.push_back(e);
    }
    pending_.clear();
  }

  /// Most cross-layer counts held (dense E x E per layer pair): 128 MiB.
  static constexpr long long kMaxCrossEntries = 1LL << 24;

  int experts_;
  int top_k_;
  bool keep_paths_;
  std::int64_t total_ = 0, cross_total_ = 0;
  std::vector<Entry> pending_;
  std::vector<Entry> merged_;
  std::map<std::pair<int, int>, std::vector<std::int64_t>> cross_;
  std::vector<LayerPaths> paths_;
};

// ------------------------------------------------------------------------------------------------
// TSV files (format in docs/speculative.md; the same as shared/data/olmoe-routing).
// ------------------------------------------------------------------------------------------------

/// Reads `layer token_id expert count` lines (optional header starting with "layer") into `rec`.
/// `keep_layer(layer)` filters layers (all when null). Returns the number of data lines read.
/// Throws moe::Error (file:line) on a malformed line, an expert outside [0, experts), a negative
/// id or count, or a file with no data lines.
template <class KeepLayer = std::nullptr_t>
std::size_t load_token_expert_counts(core::TsvReader& in, RouteRecorder& rec, KeepLayer keep_layer = nullptr) {
  std::size_t lines = 0;
  bool first = true;
  while (in.next()) {
    if (first && in.is_header("layer")) {
      first = false;
      continue;
    }
    first = false;
    in.expect_fields(4);
    auto layer = in.get_int_in<int>(0, "layer", 0, core::limits::layers - 1);
    auto token = in.get_int<int>(1, "token_id");
    auto expert = in.get_int<int>(2, "expert");
    auto count = in.get_int<std::int64_t>(3, "count");
    if (!(layer >= 0)) fail(in.where(), ": layer ", layer, " is negative");
    if (!(token >= 0)) fail(in.where(), ": token id ", token, " is negative");
    if (!(expert >= 0 && expert < rec.experts())) fail(in.where(), ": expert ", expert, " outside [0, ",
          rec.experts(), ")");
    if (!(count >= 0)) fail(in.where(), ": count ", count, " is negative");
    ++lines;
    if constexpr (!std::is_same_v<KeepLayer, std::nullptr_t>) {
      if (!keep_layer(layer)) continue;
    }
    try {
      rec.add(layer, token, expert, count);
    } catch (Error const& e) { fail(in.where(), ": column 4 (count): ", e.what()); }
  }
  check(lines > 0, in.name(), ": no token -> expert counts (empty file)");
  return lines;
}

inline std::size_t load_token_expert_counts(std::string const& path, RouteRecorder& rec) {
  core::TsvReader in(path);
  return load_token_expert_counts(in, rec);
}

/// Reads `layer_a layer_b expert_a expert_b count` lines (optional header "layer_a ...").
inline std::size_t load_crosslayer_counts(core::TsvReader& in, RouteRecorder& rec) {
  std::size_t lines = 0;
  bool first = true;
  while (in.next()) {
    if (first && in.is_header("layer_a")) {
      first = false;
      continue;
    }
    first = false;
    in.expect_fields(5);
    auto la = in.get_int_in<int>(0, "layer_a", 0, core::limits::layers - 1);
    auto lb = in.get_int_in<int>(1, "layer_b", 0, core::limits::layers - 1);
    auto ea = in.get_int<int>(2, "expert_a");
    auto eb = in.get_int<int>(3, "expert_b");
    auto count = in.get_int<std::int64_t>(4, "count");
    if (!(la >= 0 && lb >= 0)) fail(in.where(), ": negative layer");
    if (!(ea >= 0 && ea < rec.experts() && eb >= 0 && eb < rec.experts())) fail(in.where(), ": expert pair (",
          ea, ", ", eb, ") outside [0, ", rec.experts(), ")");
    if (!(count >= 0)) fail(in.where(), ": count ", count, " is negative");
    try {
      rec.add_crosslayer(la, lb, ea, eb, count);
    } catch (Error const& e) { fail(in.where(), ": column 5 (count): ", e.what()); }
    ++lines;
  }
  check(lines > 0, in.name(), ": no cross-layer counts (empty file)");
  return lines;
}

inline std::size_t load_crosslayer_counts(std::string const& path, RouteRecorder& rec) {
  core::TsvReader in(path);
  return load_crosslayer_counts(in, rec);
}

/// Writes the token -> expert counts of every layer in the load_token_expert_counts format.
inline void write_token_expert_counts(RouteProfile const& p, std::ostream& out) {
  out << "layer\ttoken_id\texpert\tcount\n";
  for (int l : p.layers()) {
    LayerCounts const& lc = p.layer(l);
    for (std::size_t r = 0; r < lc.rows(); ++r)
      for (auto j = lc.offsets[r]; j < lc.offsets[r + 1]; ++j)
        out << l << '\t' << lc.tokens[r] << '\t' << lc.expert[static_cast<std::size_t>(j)] << '\t'
            << lc.count[static_cast<std::size_t>(j)] << '\n';
  }
}

}  // namespace moe::profile
