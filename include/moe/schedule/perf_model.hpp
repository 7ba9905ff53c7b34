#pragma once
// FinDEP performance models (paper section 4.1): every operation of a disaggregated MoE layer is
// predicted by a linear "alpha-beta" model, time = alpha + beta * work, where alpha is the fixed
// cost of one call (kernel launch, communication start-up) and beta the cost per unit of work.
//
//   op         unit   work of one call
//   gemm       flop   2*m*n*k of one matrix product (attention projections)
//   attention  flop   core attention: 4 * samples * seq^2 * hidden (scores and weighted values)
//   shared     flop   shared-expert SwiGLU: 6 * tokens * hidden * shared_ffn * shared_experts
//   experts    flop   routed-expert SwiGLU on one EG rank: 6 * token_copies * hidden * expert_ffn
//   a2e        byte   bytes one attention->expert transfer moves over the busiest endpoint
//   e2a        byte   the same for expert->attention
//
// Times are in microseconds. Models are fitted by least squares from (work, time) samples
// (fit_linear) and stored in a small TSV file (write_models / read_models, format in docs/findep.md).

#include <array>
#include <cmath>
#include <cstddef>
#include <fstream>
#include <iomanip>
#include <istream>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/tsv.hpp"

namespace moe::schedule {

/// The operations that have a performance model.
enum class Op : int { gemm = 0, attention, shared, experts, a2e, e2a };
inline constexpr int op_count = 6;
inline constexpr std::array<Op, op_count> all_ops{Op::gemm,    Op::attention, Op::shared,
                                                  Op::experts, Op::a2e,       Op::e2a};

[[nodiscard]] constexpr std::string_view op_name(Op op) {
  constexpr std::array<std::string_view, op_count> names{"gemm",    "attention", "shared",
                                                         "experts", "a2e",       "e2a"};
  return names[static_cast<std::size_t>(op)];
}
/// The unit its work is counted in: "flop" for computations, "byte" for transfers.
[[nodiscard]] constexpr std::string_view op_unit(Op op) {
  return (op == Op::a2e || op == Op::e2a) ? "byte" : "flop";
}

/// time_us = alpha + beta * work.
struct Linear {
  double alpha = 0.0;  ///< microseconds per call
  double beta = 0.0;   ///< microseconds per unit of work

  [[nodiscard]] constexpr double operator()(double work) const { return alpha + beta * work; }
  friend constexpr bool operator==(Linear const&, Linear const&) = default;
};

/// One measurement: the work of a call and the time it took.
struct Sample {
  double work = 0.0;
  double time_us = 0.0;
};

/// A fitted model and how well it explains its samples.
struct Fit {
  Linear model;
  double r2 = 0.0;          ///< coefficient of determination on the samples
  std::size_t samples = 0;  ///< number of samples used
  bool alpha_clamped = false;  ///< the free fit gave alpha < 0; refitted through the origin
};

/// Coefficient of determination of `model` on `samples`: 1 - SS_res / SS_tot.
[[nodiscard]] inline double r_squared(Linear const& model, std::vector<Sample> const& samples) {
  check(!samples.empty(), "perf model: no samples to compute R^2 on");
  double mean = 0;
  for (auto const& s : samples) mean += s.time_us;
  mean /= static_cast<double>(samples.size());
  double ss_res = 0, ss_tot = 0;
  for (auto const& s : samples) {
    double r = s.time_us - model(s.work);
    double d = s.time_us - mean;
    ss_res += r * r;
    ss_tot += d * d;
  }
  if (ss_tot == 0.0) return ss_res == 0.0 ? 1.0 : 0.0;
  return 1.0 - ss_res / ss_tot;
}

/// Least-squares fit of time = alpha + beta * work. Needs at least two distinct work values.
/// Alpha and beta are physical costs and may not be negative: when the free fit gives alpha < 0
/// (noise on tiny calls) the model is refitted through the origin (alpha = 0), which is the
/// least-squares solution under the constraint alpha >= 0. A negative slope is an error.
[[nodiscard]] inline Fit fit_linear(std::vector<Sample> const& samples, std::string_view what = "op") {
  check(samples.size() >= 2, "perf model '", what, "': need at least 2 samples to fit, got ",
        samples.size());
  double n = static_cast<double>(samples.size());
  double sx = 0, sy = 0;
  for (auto const& s : samples) {
    check(std::isfinite(s.work) && std::isfinite(s.time_us) && s.work >= 0 && s.time_us >= 0,
          "perf model '", what, "': sample (work ", s.work, ", time ", s.time_us,
          ") must be finite and non-negative");
    sx += s.work;
    sy += s.time_us;
  }
  double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0;
  for (auto const& s : samples) {
    sxx += (s.work - mx) * (s.work - mx);
    sxy += (s.work - mx) * (s.time_us - my);
  }
  check(sxx > 0, "perf model '", what, "': all samples have the same work (", mx,
        "), the slope cannot be fitted");
  Fit f;
  f.samples = samples.size();
  f.model.beta = sxy / sxx;
  f.model.alpha = my - f.model.beta * mx;
  if (f.model.alpha < 0) {
    double x2 = 0, xy = 0;
    for (auto const& s : samples) {
      x2 += s.work * s.work;
      xy += s.work * s.time_us;
    }
    f.model = Linear{0.0, xy / x2};
    f.alpha_clamped = true;
  }
  check(f.model.beta > 0, "perf model '", what, "': fitted slope ", f.model.beta,
        " is not positive; time does not grow with work in these samples");
  f.r2 = r_squared(f.model, samples);
  return f;
}

/// The six models of one machine (AG and EG GPUs of one kind, one interconnect).
struct PerfModels {
  std::array<Linear, op_count> ops{};
  /// R^2 of each model on its fit samples; NaN when unknown (models given by hand).
  std::array<double, op_count> r2{nan(), nan(), nan(), nan(), nan(), nan()};
  std::array<std::size_t, op_count> samples{};
  std::string source;  ///< free text: where the numbers come from (one line, no tabs)

  [[nodiscard]] Linear const& operator[](Op op) const { return ops[static_cast<std::size_t>(op)]; }
  [[nodiscard]] Linear& operator[](Op op) { return ops[static_cast<std::size_t>(op)]; }
  [[nodiscard]] double time(Op op, double work) const { return (*this)[op](work); }

  void set(Op op, Fit const& f) {
    auto i = static_cast<std::size_t>(op);
    ops[i] = f.model;
    r2[i] = f.r2;
    samples[i] = f.samples;
  }

  /// Throws moe::Error naming the first model with a negative or non-finite coefficient or a
  /// non-positive slope.
  void validate() const {
    for (Op op : all_ops) {
      Linear const& m = (*this)[op];
      check(std::isfinite(m.alpha) && m.alpha >= 0, "perf model '", op_name(op), "': alpha ", m.alpha,
            " us must be finite and non-negative");
      check(std::isfinite(m.beta) && m.beta > 0, "perf model '", op_name(op), "': beta ", m.beta,
            " us/", op_unit(op), " must be finite and positive");
    }
  }

  static constexpr double nan() { return std::numeric_limits<double>::quiet_NaN(); }
};

/// Representative parameters of an H100-class cluster (not measured here; see docs/findep.md for
/// the reasoning). Dense bf16 GEMM at ~650 TFLOP/s achieved (989 peak), core attention at
/// ~450 TFLOP/s (FlashAttention-3 class), routed grouped GEMM at ~450 TFLOP/s with a larger
/// per-call cost (permute, several kernels), and AG<->EG transfers across nodes over one
/// 400 Gb/s NIC per GPU at ~40 GB/s achieved with ~25 us start-up.
[[nodiscard]] inline PerfModels h100_cluster_reference() {
  PerfModels m;
  m[Op::gemm] = Linear{8.0, 1.0 / 650e6};       // us per flop = 1 / (flop/us); 650 TFLOP/s
  m[Op::attention] = Linear{12.0, 1.0 / 450e6};
  m[Op::shared] = Linear{20.0, 1.0 / 600e6};
  m[Op::experts] = Linear{35.0, 1.0 / 450e6};
  m[Op::a2e] = Linear{25.0, 1.0 / 40e3};        // us per byte; 40 GB/s = 40e3 bytes/us
  m[Op::e2a] = Linear{25.0, 1.0 / 40e3};
  m.source = "representative H100-class cluster (stated, not measured)";
  return m;
}

// ------------------------------------------------------------------------------------------------
// Model file (TSV). Header "op alpha_us beta_us_per_unit unit r2 samples", then one line per op,
// each op exactly once. r2 may be "nan" (models given by hand). "# source: ..." names the origin.
// ------------------------------------------------------------------------------------------------

inline void write_models(std::ostream& out, PerfModels const& m) {
  out << "# moe-compose FinDEP performance models: time_us = alpha_us + beta_us_per_unit * work\n";
  if (!m.source.empty()) out << "# source: " << m.source << "\n";
  out << "op\talpha_us\tbeta_us_per_unit\tunit\tr2\tsamples\n";
  for (Op op : all_ops) {
    auto i = static_cast<std::size_t>(op);
    out << op_name(op) << '\t' << std::setprecision(17) << m.ops[i].alpha << '\t' << m.ops[i].beta
        << '\t' << op_unit(op) << '\t';
    if (std::isnan(m.r2[i]))
      out << "nan";
    else
      out << std::setprecision(6) << m.r2[i];
    out << '\t' << m.samples[i] << '\n';
  }
}

[[nodiscard]] inline PerfModels read_models(std::istream& in, std::string name) {
  core::TsvReader tsv(in, std::move(name));
  PerfModels m;
  std::array<bool, op_count> seen{};
  bool header = false;
  // Comment lines (including "# source: ...") are skipped by the reader; a read file's source
  // is its name.
  m.source = tsv.name();
  while (tsv.next()) {
    if (!header) {
      check(tsv.is_header("op"), tsv.where(),
            ": expected the header 'op alpha_us beta_us_per_unit unit r2 samples'");
      tsv.expect_fields(6);
      header = true;
      continue;
    }
    tsv.expect_fields(6);
    std::string_view name_field = tsv.field(0);
    int found = -1;
    for (Op op : all_ops)
      if (op_name(op) == name_field) found = static_cast<int>(op);
    check(found >= 0, tsv.where(), ": unknown operation '", name_field,
          "' (expected gemm, attention, shared, experts, a2e or e2a)");
    auto i = static_cast<std::size_t>(found);
    Op op = static_cast<Op>(found);
    check(!seen[i], tsv.where(), ": operation '", name_field, "' appears twice");
    seen[i] = true;
    double alpha = tsv.get_double(1, "alpha_us");
    double beta = tsv.get_double(2, "beta_us_per_unit");
    check(alpha >= 0, tsv.where(), ": alpha_us of '", name_field, "' is negative (", alpha, ")");
    check(beta > 0, tsv.where(), ": beta_us_per_unit of '", name_field, "' must be positive, got ",
          beta);
    check(tsv.field(3) == op_unit(op), tsv.where(), ": unit of '", name_field, "' must be '",
          op_unit(op), "', got '", tsv.field(3), "'");
    double r2 = PerfModels::nan();
    if (tsv.field(4) != "nan") {
      r2 = tsv.get_double(4, "r2");
      check(r2 <= 1.0, tsv.where(), ": r2 of '", name_field, "' is above 1 (", r2, ")");
    }
    m.ops[i] = Linear{alpha, beta};
    m.r2[i] = r2;
    m.samples[i] = tsv.get_int<std::size_t>(5, "samples");
  }
  check(header, tsv.name(), ": empty model file (no header line)");
  for (Op op : all_ops)
    check(seen[static_cast<std::size_t>(op)], tsv.name(), ": model of operation '", op_name(op),
          "' is missing");
  return m;
}

[[nodiscard]] inline PerfModels read_models(std::string const& path) {
  std::ifstream in(path);
  check(in.is_open(), "cannot open performance model file '", path, "'");
  return read_models(in, path);
}

inline void write_models(std::string const& path, PerfModels const& m) {
  std::ofstream out(path);
  check(out.is_open(), "cannot open '", path, "' for writing");
  write_models(out, m);
  check(static_cast<bool>(out), "error writing performance models to '", path, "'");
}

}  // namespace moe::schedule
