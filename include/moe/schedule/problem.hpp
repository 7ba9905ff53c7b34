#pragma once
// The FinDEP scheduling problem: a model shape split over an attention group (AG) of `ag` ranks and
// an expert group (EG) of `eg` ranks, a sequence length, and a memory limit on the AG ranks; and
// one candidate schedule (Config): task order, micro-batches r1 of m_a samples per AG rank, and r2
// token chunks per micro-batch on the way to and from the experts.
//
// Work accounting (one representative AG rank and one EG rank; ranks in a group are symmetric and
// routing is assumed balanced):
//   micro-batch tokens per AG rank   T  = m_a * seq
//   chunk tokens per AG rank         Tc = T / r2                       (r2 must divide T)
//   token copies per EG rank/chunk   Ce = Tc * ag * top_k / eg
//   tokens per expert per chunk      m_e = Tc * ag * top_k / experts
//   attention (per micro-batch)      4 gemm calls of 2*T*hidden^2 flop + attention(4*m_a*seq^2*hidden)
//                                    (MHA-equivalent projections Q, K, V, O as in the paper's Eq. 1)
//   shared experts (per micro-batch) shared(6 * T * hidden * shared_ffn * shared_experts)
//   A2E / E2A (per chunk)            bytes = Tc * top_k * hidden * elem * max(1, ag/eg)
//                                    (the busier end: one AG rank sends, or one EG rank receives)
//   routed experts (per chunk)       experts(6 * Ce * hidden * expert_ffn)

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>

#include "moe/config.hpp"
#include "moe/core/shape.hpp"
#include "moe/schedule/perf_model.hpp"

namespace moe::schedule {

/// Order of the attention (A) and shared-expert (S) segments of one layer on the AG.
enum class Order {
  aass,  ///< all attention segments, then all shared-expert segments (A0 A1 .. S0 S1 ..)
  asas,  ///< alternating (A0 S0 A1 S1 ..)
};
/// Which pipeline a configuration describes.
enum class Pipeline {
  findep,  ///< FinDEP: A2E of a micro-batch may start right after its attention; r2 >= 1 chunks
  pppipe,  ///< MegaScale-Infer ping-pong: micro-batches only (r2 = 1), shared expert before A2E
};

[[nodiscard]] constexpr std::string_view order_name(Order o) { return o == Order::aass ? "AASS" : "ASAS"; }
[[nodiscard]] constexpr std::string_view pipeline_name(Pipeline p) {
  return p == Pipeline::findep ? "FinDEP" : "PPPipe";
}

struct Problem {
  ShapeSpec shape{};
  int ag = 0;                   ///< ranks in the attention group
  int eg = 0;                   ///< ranks in the expert group
  int seq = 0;                  ///< tokens per sample (sequence length)
  double memory_bytes = 0;      ///< memory per AG rank for resident samples (KV cache, activations)
  double bytes_per_token = 0;   ///< footprint of one resident token; 0 = default_bytes_per_token
  int batch = 0;                ///< samples per AG rank; 0 = as many as the memory holds
  int layers = 0;               ///< MoE layers in one forward pass; 0 = shape.moe_layers
  int r2_max = 64;              ///< largest token-chunk degree considered
};

[[nodiscard]] constexpr double element_bytes(ShapeSpec const& s) { return s.dtype == DType::bf16 ? 2.0 : 4.0; }

/// Default footprint of one resident token on an AG rank: an MHA-equivalent K and V cache entry per
/// layer, plus four hidden-sized activation buffers (layer input, attention output, shared-expert
/// output, combined expert output).
[[nodiscard]] constexpr double default_bytes_per_token(ShapeSpec const& s) {
  return element_bytes(s) * s.hidden * (2.0 * s.layers() + 4.0);
}

[[nodiscard]] inline double bytes_per_token(Problem const& p) {
  return p.bytes_per_token > 0 ? p.bytes_per_token : default_bytes_per_token(p.shape);
}
[[nodiscard]] inline int layers_of(Problem const& p) { return p.layers > 0 ? p.layers : p.shape.moe_layers; }

/// Largest number of samples an AG rank can hold (the paper's M: r1 * m_a <= M).
[[nodiscard]] inline long long max_samples(Problem const& p) {
  double per_sample = static_cast<double>(p.seq) * bytes_per_token(p);
  double n = std::floor(p.memory_bytes / per_sample);
  // Saturate instead of converting a NaN or out-of-range double (undefined behaviour).
  if (!(n >= 0)) return 0;
  return n >= 9.0e18 ? std::numeric_limits<long long>::max() : static_cast<long long>(n);
}

/// Throws moe::Error naming the first problem with the input.
inline void validate(Problem const& p) {
  validate(p.shape);
  check(p.ag >= 1, "findep: the attention group (AG) is empty; it needs at least one rank, got ag = ", p.ag);
  check(p.eg >= 1, "findep: the expert group (EG) is empty; it needs at least one rank, got eg = ", p.eg);
  check(p.eg <= p.shape.experts, "findep: expert group of ", p.eg, " ranks is larger than the ",
        p.shape.experts, " routed experts to place on it");
  check(p.seq >= 1, "findep: sequence length must be positive, got ", p.seq);
  check(p.layers >= 0, "findep: layers must not be negative, got ", p.layers);
  check(layers_of(p) >= 1, "findep: the model has no MoE layers to schedule");
  check(p.r2_max >= 1, "findep: r2_max must be at least 1, got ", p.r2_max);
  check(p.bytes_per_token >= 0 && std::isfinite(p.bytes_per_token),
        "findep: bytes per token must be finite and non-negative, got ", p.bytes_per_token);
  check(std::isfinite(p.memory_bytes) && p.memory_bytes > 0,
        "findep: memory limit must be positive, got ", p.memory_bytes, " bytes");
  double one = static_cast<double>(p.seq) * bytes_per_token(p);
  check(max_samples(p) >= 1, "findep: memory limit of ", p.memory_bytes,
        " bytes per AG rank is too small for one micro-batch: one sample of ", p.seq,
        " tokens needs ", one, " bytes");
  check(p.batch >= 0, "findep: batch must not be negative, got ", p.batch);
  check(p.batch <= max_samples(p), "findep: a batch of ", p.batch, " samples per AG rank needs ",
        one * p.batch, " bytes, above the memory limit of ", p.memory_bytes, " bytes (at most ",
        max_samples(p), " samples)");
}

/// One schedule of the layer: pipeline kind, AG order, r1 micro-batches of m_a samples, r2 chunks.
struct Config {
  Pipeline pipeline = Pipeline::findep;
  Order order = Order::asas;
  int r1 = 1;   ///< micro-batches per AG rank
  int m_a = 1;  ///< samples per micro-batch per AG rank
  int r2 = 1;   ///< token chunks per micro-batch (A2E, experts, E2A)

  friend constexpr bool operator==(Config const&, Config const&) = default;
};

/// Throws moe::Error when the configuration does not fit the problem.
inline void validate(Problem const& p, Config const& c) {
  check(c.r1 >= 1, "findep: r1 (micro-batches) must be at least 1, got ", c.r1);
  check(c.m_a >= 1, "findep: micro-batch size m_a must be at least 1 sample, got ", c.m_a);
  check(c.r2 >= 1, "findep: r2 (token chunks) must be at least 1, got ", c.r2);
  long long resident = static_cast<long long>(c.r1) * c.m_a;
  check(resident <= max_samples(p), "findep: r1 * m_a = ", c.r1, " * ", c.m_a, " = ", resident,
        " samples per AG rank exceed the memory limit of ", max_samples(p), " samples");
  check(p.batch == 0 || resident == p.batch, "findep: r1 * m_a = ", resident,
        " samples does not match the batch of ", p.batch, " samples per AG rank");
  long long tokens = static_cast<long long>(c.m_a) * p.seq;
  check(tokens % c.r2 == 0, "findep: r2 = ", c.r2, " does not divide the ", tokens,
        " tokens of a micro-batch (m_a = ", c.m_a, " samples of ", p.seq, " tokens)");
  check(c.pipeline == Pipeline::findep || c.r2 == 1, "findep: PPPipe has no token chunks; r2 must be 1, got ",
        c.r2);
}

/// A configuration that splits a batch of `batch` samples per AG rank into r1 equal micro-batches.
[[nodiscard]] inline Config split_batch(Problem const& p, int batch, int r1, int r2, Order order,
                                        Pipeline pipeline = Pipeline::findep) {
  check(batch >= 1, "findep: batch must be at least 1 sample, got ", batch);
  check(r1 >= 1, "findep: r1 (micro-batches) must be at least 1, got ", r1);
  check(batch % r1 == 0, "findep: r1 = ", r1, " does not divide the batch of ", batch,
        " samples per AG rank");
  Config c{pipeline, order, r1, batch / r1, r2};
  validate(p, c);
  return c;
}

/// Durations (microseconds) of the tasks of one layer under a configuration.
struct StageTimes {
  double attention = 0;  ///< one micro-batch's attention on an AG rank
  double shared = 0;     ///< one micro-batch's shared experts on an AG rank (0 without shared experts)
  double a2e = 0;        ///< one chunk's attention->expert transfer
  double experts = 0;    ///< one chunk's routed experts on an EG rank
  double e2a = 0;        ///< one chunk's expert->attention transfer
  bool has_shared = false;
  double tokens_per_expert = 0;  ///< m_e: tokens one expert processes per chunk
};

[[nodiscard]] inline StageTimes stage_times(Problem const& p, PerfModels const& m, Config const& c) {
  ShapeSpec const& s = p.shape;
  double h = s.hidden;
  double T = static_cast<double>(c.m_a) * p.seq;
  double Tc = T / c.r2;
  StageTimes t;
  t.attention = 4.0 * m.time(Op::gemm, 2.0 * T * h * h) +
                m.time(Op::attention, 4.0 * c.m_a * static_cast<double>(p.seq) * p.seq * h);
  t.has_shared = s.shared_experts > 0;
  if (t.has_shared) t.shared = m.time(Op::shared, 6.0 * T * h * s.shared_ffn * s.shared_experts);
  double ratio = std::max(1.0, static_cast<double>(p.ag) / p.eg);
  double bytes = Tc * s.top_k * h * element_bytes(s) * ratio;
  t.a2e = m.time(Op::a2e, bytes);
  t.e2a = m.time(Op::e2a, bytes);
  double copies = Tc * p.ag * s.top_k / p.eg;
  t.experts = m.time(Op::experts, 6.0 * copies * h * s.expert_ffn);
  t.tokens_per_expert = Tc * p.ag * s.top_k / s.experts;
  return t;
}

/// Tokens processed by one forward pass over all AG ranks under a configuration.
[[nodiscard]] inline double tokens_of(Problem const& p, Config const& c) {
  return static_cast<double>(c.r1) * c.m_a * p.seq * p.ag;
}

}  // namespace moe::schedule
