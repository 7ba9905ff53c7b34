#pragma once
// Fast makespan of a FinDEP / PPPipe configuration: the same in-order semantics as the simulator
// (simulator.hpp), computed per micro-batch in closed form instead of per task.
//
// Within one micro-batch the r2 chunks are identical and all released together, so the chunk chain
// A2E -> experts -> E2A is a three-stage flow shop of identical jobs. With D0 the start of the first
// A2E chunk, d, e, c the chunk durations and Ep, Cp the times the EG and the E2A link become free:
//   end of expert chunk j   = max(Ep + (j+1) e,  D0 + d + e + j max(d, e))
//   end of E2A chunk j      = max over k <= j of (end of expert chunk k + (j-k+1) c), and Cp + (j+1) c,
// and since the expert ends are the maximum of two arithmetic sequences, the maximum over k is
// reached at k = 0 or k = j. A layer therefore costs O(r1), and the layer-to-layer map is a max-plus
// linear map of the state (resource free times, per-micro-batch release times): once one layer
// shifts the whole state by the same amount, every later layer does too, and the remaining layers
// are added in closed form.

#include <algorithm>
#include <cmath>
#include <vector>

#include "moe/schedule/problem.hpp"

namespace moe::schedule {

/// Makespan (microseconds) of `layers` layers of configuration `c` with stage durations `t`.
/// Thread-compatible; `scratch` may be reused between calls to avoid allocations.
struct FastEvaluator {
  std::vector<double> c_end, s_end, a_end, next_c, next_s;
  int layers_simulated = 0;  ///< layers computed step by step in the last call (the rest extrapolated)

  double operator()(StageTimes const& t, Config const& c, int layers) {
    auto r1 = static_cast<std::size_t>(c.r1);
    c_end.assign(r1, 0.0);
    s_end.assign(r1, 0.0);
    a_end.assign(r1, 0.0);
    next_c.assign(r1, 0.0);
    next_s.assign(r1, 0.0);
    double ag_free = 0, d_free = 0, e_free = 0, x_free = 0;
    double d = t.a2e, e = t.experts, x = t.e2a;
    double m_de = std::max(d, e);
    double k = c.r2;
    bool pppipe = c.pipeline == Pipeline::pppipe;
    bool alternate = c.order == Order::asas || pppipe;
    double prev_span = 0, span = 0;
    // state shift of the previous layer, to detect the periodic regime
    double prev_ag = 0, prev_d = 0, prev_e = 0, prev_x = 0;
    for (int l = 0; l < layers; ++l) {
      // AG tasks in AG order.
      auto attention = [&](std::size_t i) {
        double start = std::max({ag_free, c_end[i], s_end[i]});
        a_end[i] = start + t.attention;
        ag_free = a_end[i];
      };
      auto shared = [&](std::size_t i) {
        // A(i) ran earlier on the same resource, so the AG being free implies A(i) has ended.
        next_s[i] = std::max(ag_free, a_end[i]) + t.shared;
        ag_free = next_s[i];
      };
      if (!t.has_shared) {
        for (std::size_t i = 0; i < r1; ++i) {
          attention(i);
          next_s[i] = a_end[i];
        }
      } else if (alternate) {
        for (std::size_t i = 0; i < r1; ++i) { attention(i); shared(i); }
      } else {
        for (std::size_t i = 0; i < r1; ++i) attention(i);
        for (std::size_t i = 0; i < r1; ++i) shared(i);
      }
      // Chunk chains in micro-batch order.
      for (std::size_t i = 0; i < r1; ++i) {
        double release = (pppipe && t.has_shared) ? next_s[i] : a_end[i];
        double d0 = std::max(release, d_free);
        d_free = d0 + k * d;
        double P = e_free + e;  // expert chunk j ends at max(P + j e, Q + j m_de)
        double Q = d0 + d + e;
        double e_last = std::max(P + (k - 1) * e, Q + (k - 1) * m_de);
        double x_last = std::max({x_free + k * x, P + k * x, P + (k - 1) * e + x, Q + k * x, Q + (k - 1) * m_de + x});
        e_free = e_last;
        x_free = x_last;
        next_c[i] = x_last;
      }
      // Shift of the state over this layer.
      double shift_ag = ag_free - prev_ag, shift_d = d_free - prev_d, shift_e = e_free - prev_e,
             shift_x = x_free - prev_x;
      double lo = std::min({shift_ag, shift_d, shift_e, shift_x}), hi = std::max({shift_ag, shift_d, shift_e, shift_x});
      for (std::size_t i = 0; i < r1; ++i) {
        double sc = next_c[i] - c_end[i], ss = next_s[i] - s_end[i];
        lo = std::min({lo, sc, ss});
        hi = std::max({hi, sc, ss});
        c_end[i] = next_c[i];
        s_end[i] = next_s[i];
      }
      prev_ag = ag_free;
      prev_d = d_free;
      prev_e = e_free;
      prev_x = x_free;
      prev_span = span;
      span = std::max(ag_free, x_free);
      layers_simulated = l + 1;
      // Periodic once a whole layer shifts every state component equally (after the first layer;
      // the initial state is all zeros and the first layer's shift is not a steady one).
      if (l >= 1 && hi - lo <= 1e-12 * std::max(1.0, span) && l + 1 < layers) {
        double period = span - prev_span;
        return span + static_cast<double>(layers - l - 1) * period;
      }
    }
    return span;
  }
};

/// Makespan of configuration `c` of problem `p` (validated) with the given models.
[[nodiscard]] inline double makespan(Problem const& p, PerfModels const& m, Config const& c, int layers = 0) {
  validate(p, c);
  FastEvaluator f;
  return f(stage_times(p, m, c), c, layers > 0 ? layers : layers_of(p));
}

}  // namespace moe::schedule
