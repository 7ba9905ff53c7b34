#pragma once
// Token-level batches drawn from an aggregated route profile, so that planners and the traffic
// model see the co-activation of real routing (which experts one token chooses together), not only
// per-expert loads.
//
// A route profile (e.g. the real OLMoE token_expert_counts.tsv) records, per layer and token id, how
// often the id chose each expert over its occurrences. TokenSampler draws one token of a batch in
// two steps:
//   1. a token id, with probability proportional to its occurrences (row total / top_k);
//   2. its top_k distinct experts, one after another without replacement, each with probability
//      proportional to the id's count for it among the experts not yet drawn.
// An id that always routes the same way (its counts are top_k experts with equal counts) thus gets
// exactly that set; ids that route several ways mix their sets. The files do not record which experts
// one occurrence chose together, so this is a model of them: co-selections within an id are drawn
// from the id's marginals. Label results "token batches drawn from aggregated counts".
//
// A row with fewer than top_k distinct experts (possible after a thinning split, route_split.hpp)
// fills its token's remaining experts from the layer's expert loads, without replacement.

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "moe/config.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/profile/route_profile.hpp"

namespace moe::profile {

class TokenSampler {
 public:
  /// Samples layer `layer` of `p` (its top_k must be known).
  TokenSampler(RouteProfile const& p, int layer) : counts_(&p.layer(layer)), k_(p.top_k()) {
    check(k_ > 0, "token sampler: the profile's top_k is unknown");
    check(k_ <= counts_->experts, "token sampler: top_k ", k_, " is more than the ", counts_->experts, " experts");
    double sum = 0;
    for (std::size_t r = 0; r < counts_->rows(); ++r) {
      sum += static_cast<double>(counts_->row_total(r));
      row_cum_.push_back(sum);
    }
    check(sum > 0, "token sampler: layer ", layer, " has no activations");
    auto load = counts_->expert_load();
    load_.assign(load.begin(), load.end());
  }

  [[nodiscard]] int top_k() const { return k_; }
  [[nodiscard]] int experts() const { return counts_->experts; }

  /// Appends `tokens` tokens' experts to `out` (tokens x top_k, row-major, distinct per token).
  void sample(int tokens, Rng& rng, std::vector<int>& out) const {
    check(tokens >= 0, "token sampler: negative token count ", tokens);
    std::vector<double> w;
    std::vector<int> e;
    std::vector<double> rest;
    for (int t = 0; t < tokens; ++t) {
      double x = rng.uniform() * row_cum_.back();
      auto r = static_cast<std::size_t>(std::upper_bound(row_cum_.begin(), row_cum_.end(), x) - row_cum_.begin());
      r = std::min(r, row_cum_.size() - 1);
      w.clear(), e.clear();
      for (auto j = counts_->offsets[r]; j < counts_->offsets[r + 1]; ++j) {
        w.push_back(static_cast<double>(counts_->count[static_cast<std::size_t>(j)]));
        e.push_back(counts_->expert[static_cast<std::size_t>(j)]);
      }
      std::size_t first = out.size();
      draw(w, e, std::min<int>(k_, static_cast<int>(e.size())), rng, out);
      if (static_cast<int>(out.size() - first) < k_) {  // a thinned row: fill from the layer's loads
        rest = load_;
        e.resize(rest.size());
        for (std::size_t i = 0; i < rest.size(); ++i) e[i] = static_cast<int>(i);
        for (std::size_t i = first; i < out.size(); ++i) rest[static_cast<std::size_t>(out[i])] = 0;
        draw(rest, e, k_ - static_cast<int>(out.size() - first), rng, out);
      }
    }
  }

 private:
  /// Draws n of the items (weights w, ids e) without replacement; w and e are consumed.
  static void draw(std::vector<double>& w, std::vector<int>& e, int n, Rng& rng, std::vector<int>& out) {
    for (int i = 0; i < n; ++i) {
      double sum = 0;
      for (double v : w) sum += v;
      std::size_t pick = 0;
      if (sum > 0) {
        double x = rng.uniform() * sum;
        while (pick + 1 < w.size() && (x -= w[pick]) >= 0) ++pick;
        while (w[pick] <= 0) --pick;  // rounding ran past the last positive weight
      } else {  // only zero weights left (experts nobody chose): take them in order
        while (e[pick] < 0) ++pick;
      }
      out.push_back(e[pick]);
      w[pick] = 0, e[pick] = -1;
    }
  }

  LayerCounts const* counts_;
  int k_;
  std::vector<double> row_cum_;  ///< cumulative activations per row
  std::vector<double> load_;     ///< activations per expert
};

}  // namespace moe::profile
