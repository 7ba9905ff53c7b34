#pragma once
// Load profiles: per-batch x layer x expert token counts, the input of the offline planners
// (ILPLoad placement, EPLB and CRAFT replication, the metrics).
//
// File format (TSV, documented in docs/plan-format.md):
//   moe-load-profile <tab> 1 <tab> BATCHES <tab> LAYERS <tab> EXPERTS
//   then BATCHES*LAYERS lines, in order b = 0.., l = 0..:
//   b <tab> l <tab> load_0 <tab> ... <tab> load_{EXPERTS-1}
// Loads are finite, non-negative numbers (token counts; fractional values are allowed).
//
// Sources:
//   - read/write the file above;
//   - marginals_from_olmoe(): per-layer expert counts of the real routing statistics in
//     shared/data/olmoe-routing/MODEL/DOMAIN/expert_counts.tsv (corpus totals, not batches);
//   - zipf_marginals(): seeded Zipf-like marginals (a random expert order per layer, a per-layer
//     exponent drawn from a range) - synthetic, say so where used;
//   - sample_profile(): seeded per-batch loads drawn around given marginals (Dirichlet-perturbed
//     expectation: batch b, layer l gets tokens*top_k * Dirichlet(concentration * p_l)).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/tsv.hpp"

namespace moe::profile {

/// Dense B x L x E array of non-negative loads.
class LoadProfile {
public:
  LoadProfile() = default;
  LoadProfile(int batches, int layers, int experts)
      : batches_(batches), layers_(layers), experts_(experts) {
    check(batches > 0 && layers > 0 && experts > 0, "load profile: batches (", batches, "), layers (",
          layers, ") and experts (", experts, ") must be positive");
    check(static_cast<long long>(batches) * layers * experts <= core::limits::profile_values, "load profile: ",
          batches, " batches x ", layers, " layers x ", experts, " experts is above the limit of ",
          core::limits::profile_values, " loads (1 GiB)");
    data_.assign(static_cast<std::size_t>(batches) * static_cast<std::size_t>(layers) *
                     static_cast<std::size_t>(experts),
                 0.0);
  }

  [[nodiscard]] int batches() const { return batches_; }
  [[nodiscard]] int layers() const { return layers_; }
  [[nodiscard]] int experts() const { return experts_; }

  [[nodiscard]] double& at(int b, int l, int e) { return data_[index(b, l, e)]; }
  [[nodiscard]] double at(int b, int l, int e) const { return data_[index(b, l, e)]; }
  /// Pointer to the E loads of batch b, layer l.
  [[nodiscard]] double const* row(int b, int l) const { return data_.data() + index(b, l, 0); }
  [[nodiscard]] double* row(int b, int l) { return data_.data() + index(b, l, 0); }
  [[nodiscard]] std::vector<double> const& data() const { return data_; }

  /// Sum over batches: an L x E matrix (row-major).
  [[nodiscard]] std::vector<double> totals() const { return totals(0, batches_); }
  /// Sum over batches [first, last).
  [[nodiscard]] std::vector<double> totals(int first, int last) const {
    check(0 <= first && first < last && last <= batches_, "load profile: batch range [", first, ", ",
          last, ") outside [0, ", batches_, ")");
    std::vector<double> t(static_cast<std::size_t>(layers_) * static_cast<std::size_t>(experts_), 0.0);
    for (int b = first; b < last; ++b)
      for (int l = 0; l < layers_; ++l) {
        double const* r = row(b, l);
        double* out = t.data() + static_cast<std::size_t>(l) * static_cast<std::size_t>(experts_);
        for (int e = 0; e < experts_; ++e) out[e] += r[e];
      }
    return t;
  }

  /// Batches [first, last) as a new profile (e.g. a train / test split).
  [[nodiscard]] LoadProfile slice(int first, int last) const {
    check(0 <= first && first < last && last <= batches_, "load profile: batch range [", first, ", ",
          last, ") outside [0, ", batches_, ")");
    LoadProfile p(last - first, layers_, experts_);
    std::copy(data_.begin() + static_cast<long>(index(first, 0, 0)),
              data_.begin() + static_cast<long>(index(last - 1, layers_ - 1, experts_ - 1) + 1),
              p.data_.begin());
    return p;
  }

  /// Throws moe::Error for a negative or non-finite load.
  void validate() const {
    for (int b = 0; b < batches_; ++b)
      for (int l = 0; l < layers_; ++l)
        for (int e = 0; e < experts_; ++e) {
          double v = at(b, l, e);
          check(std::isfinite(v), "load profile: load of batch ", b, ", layer ", l, ", expert ", e,
                " is not finite");
          check(v >= 0, "load profile: load of batch ", b, ", layer ", l, ", expert ", e,
                " is negative (", v, ")");
        }
  }

  friend bool operator==(LoadProfile const&, LoadProfile const&) = default;

private:
  [[nodiscard]] std::size_t index(int b, int l, int e) const {
    return (static_cast<std::size_t>(b) * static_cast<std::size_t>(layers_) + static_cast<std::size_t>(l)) *
               static_cast<std::size_t>(experts_) +
           static_cast<std::size_t>(e);
  }
  int batches_ = 0, layers_ = 0, experts_ = 0;
  std::vector<double> data_;
};

inline constexpr char const* kProfileMagic = "moe-load-profile";

/// Writes the profile in the TSV format above. Numbers are written with enough digits to be read
/// back exactly.
inline void write_profile(std::ostream& os, LoadProfile const& p) {
  os << "# moe load profile: header, then one line per (batch, layer): batch layer loads...\n";
  os << kProfileMagic << '\t' << 1 << '\t' << p.batches() << '\t' << p.layers() << '\t' << p.experts()
     << '\n';
  os.precision(17);
  for (int b = 0; b < p.batches(); ++b)
    for (int l = 0; l < p.layers(); ++l) {
      os << b << '\t' << l;
      double const* r = p.row(b, l);
      for (int e = 0; e < p.experts(); ++e) os << '\t' << r[e];
      os << '\n';
    }
  check(static_cast<bool>(os), "load profile: write failed");
}

inline void write_profile(std::string const& path, LoadProfile const& p) {
  std::ofstream f(path);
  check(f.is_open(), "cannot open '", path, "' for writing");
  write_profile(f, p);
}

/// Reads a profile; throws moe::Error naming file:line for a malformed header, a wrong field
/// count, out-of-order lines, a negative or non-finite load, or a truncated file.
inline LoadProfile read_profile(core::TsvReader& in) {
  check(in.next(), in.name(), ": empty load profile (expected a '", kProfileMagic, "' header)");
  check(in.is_header(kProfileMagic), in.where(), ": expected a '", kProfileMagic,
        "' header line, found '", in.field(0), "'");
  in.expect_fields(5);
  int version = in.get_int<int>(1, "version");
  check(version == 1, in.where(), ": unsupported load profile version ", version);
  int B = in.get_int_in<int>(2, "batches", 1, core::limits::batches);
  int L = in.get_int_in<int>(3, "layers", 1, core::limits::layers);
  int E = in.get_int_in<int>(4, "experts", 1, core::limits::experts);
  // The loads are collected as the lines arrive and the profile is sized only once they are all
  // there: a corrupt or truncated file with huge counts in its header is reported as truncated
  // instead of first allocating B * L * E doubles.
  long long lines = static_cast<long long>(B) * L;
  std::vector<double> loads;
  double values = static_cast<double>(lines) * E;  // may exceed any integer type for a corrupt header
  loads.reserve(values < double(1 << 20) ? static_cast<std::size_t>(values) : std::size_t{1} << 20);
  for (int b = 0; b < B; ++b)
    for (int l = 0; l < L; ++l) {
      check(in.next(), in.name(), ": truncated load profile: expected line for batch ", b, " layer ", l,
            " after line ", in.line_number(), " (", lines, " data lines in all)");
      in.expect_fields(static_cast<std::size_t>(E) + 2);
      int fb = in.get_int<int>(0, "batch"), fl = in.get_int<int>(1, "layer");
      check(fb == b && fl == l, in.where(), ": expected batch ", b, " layer ", l, ", found batch ", fb,
            " layer ", fl);
      for (int e = 0; e < E; ++e) {
        double v = in.get_double(static_cast<std::size_t>(e) + 2, "load");
        check(v >= 0, in.where(), ": load of expert ", e, " is negative (", v, ")");
        loads.push_back(v);
      }
    }
  check(!in.next(), in.where(), ": unexpected extra line after ", lines, " data lines");
  LoadProfile p(B, L, E);
  for (int b = 0; b < B; ++b)
    for (int l = 0; l < L; ++l)
      std::copy_n(loads.begin() + static_cast<long>((static_cast<long long>(b) * L + l) * E), E, p.row(b, l));
  return p;
}

inline LoadProfile read_profile(std::string const& path) {
  core::TsvReader in(path);
  return read_profile(in);
}

/// Per-layer marginals: an L x E row-major matrix of non-negative weights (need not sum to one).
struct Marginals {
  int layers = 0, experts = 0;
  std::vector<double> weight;
  [[nodiscard]] double at(int l, int e) const {
    return weight[static_cast<std::size_t>(l) * static_cast<std::size_t>(experts) + static_cast<std::size_t>(e)];
  }
};

/// Reads the real OLMoE/Mixtral expert counts (`layer expert count`, with a header) of one
/// MODEL/DOMAIN folder. Only the recorded layers appear; they are renumbered 0.. in file order.
inline Marginals marginals_from_olmoe(core::TsvReader& in) {
  std::vector<int> layer_ids;
  std::vector<std::vector<double>> rows;
  while (in.next()) {
    if (in.is_header("layer")) continue;
    in.expect_fields(3);
    // Ids size the matrix: bounded before anything is allocated for them.
    int l = in.get_int_in<int>(0, "layer", 0, core::limits::layers - 1);
    int e = in.get_int_in<int>(1, "expert", 0, core::limits::experts - 1);
    double c = in.get_double(2, "count");
    check(c >= 0, in.where(), ": column 3 (count): negative count (", c, ")");
    auto it = std::find(layer_ids.begin(), layer_ids.end(), l);
    if (it == layer_ids.end()) {
      layer_ids.push_back(l);
      rows.emplace_back();
      it = layer_ids.end() - 1;
    }
    auto& r = rows[static_cast<std::size_t>(it - layer_ids.begin())];
    if (r.size() <= static_cast<std::size_t>(e)) r.resize(static_cast<std::size_t>(e) + 1, 0.0);
    r[static_cast<std::size_t>(e)] += c;
    check(std::isfinite(r[static_cast<std::size_t>(e)]), in.where(), ": column 3 (count): the counts of layer ", l,
          " expert ", e, " sum to infinity");
  }
  check(!rows.empty(), in.name(), ": no expert counts");
  std::size_t E = 0;
  for (auto const& r : rows) E = std::max(E, r.size());
  Marginals m{static_cast<int>(rows.size()), static_cast<int>(E), {}};
  for (auto& r : rows) {
    r.resize(E, 0.0);
    m.weight.insert(m.weight.end(), r.begin(), r.end());
  }
  return m;
}

inline Marginals marginals_from_olmoe(std::string const& expert_counts_tsv) {
  core::TsvReader in(expert_counts_tsv);
  return marginals_from_olmoe(in);
}

/// Small, portable, seeded generator (splitmix64): the same numbers on every platform.
class Rng {
public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in (0, 1).
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  double normal() {
    double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  /// Gamma(shape, 1) by Marsaglia and Tsang (with the u^(1/a) boost for shape < 1).
  double gamma(double shape) {
    if (shape < 1.0) return gamma(shape + 1.0) * std::pow(uniform(), 1.0 / shape);
    double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x = normal(), v = 1.0 + c * x;
      if (v <= 0) continue;
      v = v * v * v;
      double u = uniform();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
    }
  }
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }

private:
  std::uint64_t s_;
};

/// Seeded Zipf-like marginals (synthetic): in layer l, the expert of rank k (a random permutation
/// per layer) has weight 1 / (k + 1)^s_l, with s_l uniform in [s_min, s_max].
inline Marginals zipf_marginals(int layers, int experts, double s_min, double s_max, std::uint64_t seed) {
  check(layers > 0 && experts > 0, "zipf marginals: layers and experts must be positive");
  check(std::isfinite(s_min) && std::isfinite(s_max) && 0 <= s_min && s_min <= s_max,
        "zipf marginals: need 0 <= s_min <= s_max, got ", s_min, ", ", s_max);
  Rng rng(seed);
  Marginals m{layers, experts, std::vector<double>(static_cast<std::size_t>(layers) * static_cast<std::size_t>(experts))};
  std::vector<int> perm(static_cast<std::size_t>(experts));
  for (int l = 0; l < layers; ++l) {
    double s = s_min + (s_max - s_min) * rng.uniform();
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = experts - 1; i > 0; --i) std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(rng.below(i + 1))]);
    for (int k = 0; k < experts; ++k)
      m.weight[static_cast<std::size_t>(l) * static_cast<std::size_t>(experts) + static_cast<std::size_t>(perm[static_cast<std::size_t>(k)])] =
          1.0 / std::pow(static_cast<double>(k + 1), s);
  }
  return m;
}

struct SampleOptions {
  int batches = 100;
  double tokens_per_batch = 4096;  ///< tokens in one batch; a batch routes tokens * top_k assignments
  int top_k = 8;
  double concentration = 2000;  ///< Dirichlet concentration: larger = batches closer to the marginal
  bool round = true;            ///< round loads to whole tokens
  std::uint64_t seed = 1;
};

/// Seeded per-batch loads around the marginals (synthetic batches; label them so): layer l of
/// batch b gets tokens*top_k * Dirichlet(concentration * p_l), p_l the normalised marginal row.
inline LoadProfile sample_profile(Marginals const& m, SampleOptions const& o) {
  check(m.layers > 0 && m.experts > 0 &&
            m.weight.size() == static_cast<std::size_t>(m.layers) * static_cast<std::size_t>(m.experts),
        "sample_profile: marginals have the wrong size");
  check(o.batches > 0 && o.top_k > 0 && o.tokens_per_batch > 0 && o.concentration > 0,
        "sample_profile: batches, top_k, tokens_per_batch and concentration must be positive");
  // An infinite concentration makes the gamma sampler loop forever (NaN acceptance test), and
  // infinite tokens give infinite loads.
  check(std::isfinite(o.tokens_per_batch * o.top_k) && std::isfinite(o.concentration),
        "sample_profile: tokens_per_batch (", o.tokens_per_batch, ") and concentration (", o.concentration,
        ") must be finite");
  for (double w : m.weight) check(std::isfinite(w) && w >= 0, "sample_profile: marginal weight ", w, " is negative or not finite");
  Rng rng(o.seed);
  LoadProfile p(o.batches, m.layers, m.experts);
  std::vector<double> prob(static_cast<std::size_t>(m.experts)), g(static_cast<std::size_t>(m.experts));
  double assignments = o.tokens_per_batch * o.top_k;
  for (int b = 0; b < o.batches; ++b)
    for (int l = 0; l < m.layers; ++l) {
      double sum = 0;
      for (int e = 0; e < m.experts; ++e) sum += m.at(l, e);
      check(sum > 0, "sample_profile: layer ", l, " has zero total marginal weight");
      double gs = 0;
      for (int e = 0; e < m.experts; ++e) {
        double a = o.concentration * m.at(l, e) / sum;
        g[static_cast<std::size_t>(e)] = a > 0 ? rng.gamma(a) : 0.0;
        gs += g[static_cast<std::size_t>(e)];
      }
      double* r = p.row(b, l);
      for (int e = 0; e < m.experts; ++e) {
        double v = gs > 0 ? assignments * g[static_cast<std::size_t>(e)] / gs : 0.0;
        r[e] = o.round ? std::round(v) : v;
      }
    }
  return p;
}

/// A profile with one batch per recorded corpus (e.g. the OLMoE domains): batch b = marginals[b].
inline LoadProfile profile_from_marginals(std::vector<Marginals> const& per_batch) {
  check(!per_batch.empty(), "profile_from_marginals: no marginals");
  int L = per_batch[0].layers, E = per_batch[0].experts;
  LoadProfile p(static_cast<int>(per_batch.size()), L, E);
  for (std::size_t b = 0; b < per_batch.size(); ++b) {
    check(per_batch[b].layers == L && per_batch[b].experts == E, "profile_from_marginals: batch ", b,
          " has shape ", per_batch[b].layers, "x", per_batch[b].experts, ", expected ", L, "x", E);
    for (int l = 0; l < L; ++l)
      for (int e = 0; e < E; ++e) p.at(static_cast<int>(b), l, e) = per_batch[b].at(l, e);
  }
  p.validate();
  return p;
}

}  // namespace moe::profile
