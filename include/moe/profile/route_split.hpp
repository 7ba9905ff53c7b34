#pragma once
// Seeded held-out split of an aggregated route profile (e.g. the paper's 20 % fit / 80 % test
// within one data set, when only aggregated token -> expert counts are available).
//
// For every (layer, token) row with n occurrences (activations / top_k): n_fit ~ Binomial(n, fraction)
// occurrences go to the fit part, and n_fit * top_k of the row's activations are drawn without
// replacement (selection sampling) into it; the rest form the held-out part. This thins the
// aggregated counts; it cannot keep each occurrence's top_k experts together (the files do not
// record them), so label results "simulated split of aggregated counts".

#include <cstdint>
#include <utility>

#include "moe/config.hpp"
#include "moe/core/rng.hpp"
#include "moe/profile/route_profile.hpp"

namespace moe::profile {

/// Returns {fit, held_out}. Cross-layer counts and paths are not split (left out of both).
inline std::pair<RouteProfile, RouteProfile> split_profile(RouteProfile const& p, double fraction,
                                                           std::uint64_t seed) {
  check(!p.empty(), "split: the route profile is empty");
  check(p.top_k() > 0, "split: the profile's top_k is unknown");
  check(fraction > 0 && fraction < 1, "split: fraction must be in (0, 1), got ", fraction);
  moe::core::Rng rng(seed);
  RouteRecorder fit(p.experts(), p.top_k()), held(p.experts(), p.top_k());
  auto k = static_cast<std::int64_t>(p.top_k());
  for (int l : p.layers()) {
    LayerCounts const& lc = p.layer(l);
    for (std::size_t r = 0; r < lc.rows(); ++r) {
      std::int64_t total = lc.row_total(r), n = total / k, n_fit = 0;
      for (std::int64_t o = 0; o < n; ++o) n_fit += rng.uniform() < fraction;
      std::int64_t need = n_fit * k, left = total;
      for (auto j = lc.offsets[r]; j < lc.offsets[r + 1]; ++j) {
        auto ju = static_cast<std::size_t>(j);
        std::int64_t take = 0;
        for (std::int64_t u = 0; u < lc.count[ju]; ++u, --left)
          if (static_cast<double>(left) * rng.uniform() < static_cast<double>(need)) {
            ++take;
            --need;
          }
        fit.add(l, lc.tokens[r], lc.expert[ju], take);
        held.add(l, lc.tokens[r], lc.expert[ju], lc.count[ju] - take);
      }
    }
  }
  return {fit.profile(), held.profile()};
}

}  // namespace moe::profile
