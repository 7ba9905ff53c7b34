#pragma once
// Communication volume of one MoE layer (Speculative MoE, section 3.2), in bytes.
//
// Setting: D devices, attention tensor-parallel over the D devices, experts expert-parallel over the
// same D devices; T tokens in the global batch (B * S), hidden size H, top-k routing, b bytes per
// element. The attention output is a partial sum on every device.
//
//   baseline (DS-MoE):  all-reduce (every device gets all T tokens, then keeps its T/D slice)
//                       -> all-to-all dispatch -> all-to-all combine -> all-gather
//   s-MoE (s-TS):       shuffled reduce-scatter (device d receives, already summed, the tokens
//                       predicted for d) -> all-to-all dispatch -> all-to-all combine
//                       -> shuffled all-gather (restores the original order)
//
// Volumes are totals over all devices (bytes put on the wire by all senders); per device = / D.
// Ring / direct algorithms:
//   all-reduce       2 (D-1) T H b
//   reduce-scatter     (D-1) T H b     (also shuffled and with uneven slices: each device still
//   all-gather         (D-1) T H b      receives every row it owns from the D-1 others)
//   all-to-all       (1 - LAR) K T H b per direction (a token sends one copy per remote expert)
// so the shuffled pipeline saves one all-gather's worth on the reduction side (all-reduce =
// reduce-scatter + all-gather) and 2 K T H b (LAR_s - LAR_0) on the expert side.
// The derivation is ours: the paper's formula symbols did not survive in our copy of the text.
// With de-duplication (one copy per remote device, not per remote expert) the all-to-all carries
// `remote_token_devices` rows instead of (1 - LAR) K T (see metrics.hpp remote_traffic).

#include <cstdint>

#include "moe/config.hpp"

namespace moe::speculative {

struct VolumeModel {
  int devices = 1;
  std::int64_t tokens = 0;  ///< T = batch * sequence, over all devices
  int hidden = 0;
  int top_k = 1;
  double bytes_per_element = 2;  ///< e.g. 2 for bf16
  int all_to_all_passes = 2;     ///< dispatch + combine (1: dispatch only)

  void validate() const {
    check(devices > 0, "volume model: devices must be positive, got ", devices);
    check(tokens >= 0 && hidden > 0 && top_k > 0 && bytes_per_element > 0,
          "volume model: tokens, hidden, top_k and bytes_per_element must be positive");
    check(all_to_all_passes >= 0, "volume model: all_to_all_passes must be >= 0");
  }
  [[nodiscard]] double row_bytes() const { return static_cast<double>(hidden) * bytes_per_element; }
  [[nodiscard]] double batch_bytes() const { return static_cast<double>(tokens) * row_bytes(); }

  [[nodiscard]] double all_reduce() const { return 2.0 * (devices - 1) * batch_bytes(); }
  [[nodiscard]] double reduce_scatter() const { return static_cast<double>(devices - 1) * batch_bytes(); }
  [[nodiscard]] double all_gather() const { return static_cast<double>(devices - 1) * batch_bytes(); }
  /// One all-to-all pass at a local activation rate.
  [[nodiscard]] double all_to_all(double lar) const {
    check(lar >= 0 && lar <= 1, "volume model: local activation rate ", lar, " outside [0, 1]");
    return (1.0 - lar) * top_k * batch_bytes();
  }
  /// One de-duplicated all-to-all pass carrying `rows` token rows.
  [[nodiscard]] double all_to_all_rows(std::int64_t rows) const { return static_cast<double>(rows) * row_bytes(); }
};

struct Volume {
  double reduction = 0;   ///< all-reduce or shuffled reduce-scatter
  double all_to_all = 0;  ///< all passes
  double gather = 0;      ///< all-gather or shuffled all-gather (0 for the baseline's AR-only variant)
  [[nodiscard]] double total() const { return reduction + all_to_all + gather; }
};

/// Baseline: all-reduce + all-to-all (passes) + all-gather at local activation rate `lar`.
[[nodiscard]] inline Volume baseline_volume(VolumeModel const& m, double lar) {
  m.validate();
  return {m.all_reduce(), m.all_to_all_passes * m.all_to_all(lar), m.all_gather()};
}

/// s-TS: shuffled reduce-scatter + all-to-all (passes) + shuffled all-gather at rate `lar`.
[[nodiscard]] inline Volume speculative_volume(VolumeModel const& m, double lar) {
  m.validate();
  return {m.reduce_scatter(), m.all_to_all_passes * m.all_to_all(lar), m.all_gather()};
}

/// Share of the baseline volume saved: 1 - speculative(lar_s) / baseline(lar_0).
[[nodiscard]] inline double volume_saving(VolumeModel const& m, double lar_baseline, double lar_speculative) {
  double b = baseline_volume(m, lar_baseline).total();
  return b > 0 ? 1.0 - speculative_volume(m, lar_speculative).total() / b : 0.0;
}

}  // namespace moe::speculative
