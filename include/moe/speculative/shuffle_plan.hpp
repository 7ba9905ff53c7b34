#pragma once
// Host shuffle plan of s-TS (Speculative MoE, Algorithm 2): re-batch tokens to their predicted
// devices (argsort by device, group, align) and restore the original order afterwards.
//
// Given predicted[i] in [0, D) for tokens i = 0..n-1:
//   counts[d]          tokens predicted for device d
//   offsets[d]         start of device d's group in the packed (grouped) order, offsets[D] = n
//   permutation[j]     the token at packed position j (a stable argsort: original order kept inside
//                      each group)
//   inverse[i]         packed position of token i (inverse[permutation[j]] == j)
//   aligned_offsets[d] start of group d when each group is padded to a multiple of `alignment`
//                      rows (aligned_offsets[D] = padded size); alignment 1 = no padding.
// pack_rows / unpack_rows move row-major rows accordingly; unpack(pack(x)) == x exactly.

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "moe/config.hpp"

namespace moe::speculative {

struct ShufflePlan {
  int devices = 0;
  int alignment = 1;
  std::vector<std::int32_t> counts;
  std::vector<std::int32_t> offsets;
  std::vector<std::int32_t> aligned_offsets;
  std::vector<std::int32_t> permutation;
  std::vector<std::int32_t> inverse;

  [[nodiscard]] std::size_t tokens() const { return permutation.size(); }
  [[nodiscard]] std::size_t padded_tokens() const { return static_cast<std::size_t>(aligned_offsets.back()); }
  /// Row of token i in the padded layout.
  [[nodiscard]] std::size_t padded_slot(std::size_t i) const {
    auto j = static_cast<std::size_t>(inverse[i]);
    auto d = static_cast<std::size_t>(std::upper_bound(offsets.begin(), offsets.end(), static_cast<std::int32_t>(j)) -
                                      offsets.begin() - 1);
    // The last group starting at or before j (empty groups share their start with the next one).
    return static_cast<std::size_t>(aligned_offsets[d]) + (j - static_cast<std::size_t>(offsets[d]));
  }
};

/// Builds the plan in O(n + D) (counting sort). Throws when a prediction is outside [0, devices).
[[nodiscard]] inline ShufflePlan make_shuffle_plan(std::span<int const> predicted, int devices, int alignment = 1) {
  check(devices > 0, "shuffle plan: devices must be positive, got ", devices);
  check(alignment > 0, "shuffle plan: alignment must be positive, got ", alignment);
  check(predicted.size() < static_cast<std::size_t>(INT32_MAX), "shuffle plan: too many tokens");
  ShufflePlan p;
  p.devices = devices;
  p.alignment = alignment;
  auto D = static_cast<std::size_t>(devices);
  p.counts.assign(D, 0);
  for (std::size_t i = 0; i < predicted.size(); ++i) {
    int d = predicted[i];
    check(d >= 0 && d < devices, "shuffle plan: token ", i, " is predicted for device ", d, ", outside [0, ",
          devices, ")");
    ++p.counts[static_cast<std::size_t>(d)];
  }
  p.offsets.assign(D + 1, 0);
  p.aligned_offsets.assign(D + 1, 0);
  for (std::size_t d = 0; d < D; ++d) {
    p.offsets[d + 1] = p.offsets[d] + p.counts[d];
    std::int32_t padded = (p.counts[d] + alignment - 1) / alignment * alignment;
    p.aligned_offsets[d + 1] = p.aligned_offsets[d] + padded;
  }
  p.permutation.resize(predicted.size());
  p.inverse.resize(predicted.size());
  std::vector<std::int32_t> next(p.offsets.begin(), p.offsets.end() - 1);
  for (std::size_t i = 0; i < predicted.size(); ++i) {
    std::int32_t j = next[static_cast<std::size_t>(predicted[i])]++;
    p.permutation[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(i);
    p.inverse[i] = j;
  }
  return p;
}

/// Bounds the tokens per device (e.g. the receive buffer of the shuffled reduce-scatter): on every
/// device predicted for more than `capacity` tokens, the least confident ones (ties: the later
/// token) move to the device with the most room left (ties: the lowest id). Other predictions are
/// kept. `confidence` is one Q15 value per token, or empty (then later tokens move first). Any device
/// choice keeps s-TS lossless; this only trades local activations for bounded buffers and balance.
/// Returns the number of tokens moved; throws when devices * capacity < tokens.
inline std::size_t cap_predictions(std::span<int> predicted, std::span<std::int16_t const> confidence, int devices,
                                   std::int32_t capacity) {
  check(devices > 0, "cap_predictions: devices must be positive, got ", devices);
  check(capacity >= 0, "cap_predictions: capacity must be >= 0, got ", capacity);
  check(confidence.empty() || confidence.size() == predicted.size(), "cap_predictions: ", confidence.size(),
        " confidences for ", predicted.size(), " tokens");
  check(static_cast<std::size_t>(devices) * static_cast<std::size_t>(capacity) >= predicted.size(),
        "cap_predictions: ", predicted.size(), " tokens do not fit in ", devices, " devices x ", capacity);
  auto D = static_cast<std::size_t>(devices);
  std::vector<std::vector<std::int32_t>> members(D);
  for (std::size_t i = 0; i < predicted.size(); ++i) {
    int d = predicted[i];
    check(d >= 0 && d < devices, "cap_predictions: token ", i, " is predicted for device ", d, ", outside [0, ",
          devices, ")");
    members[static_cast<std::size_t>(d)].push_back(static_cast<std::int32_t>(i));
  }
  std::vector<std::int64_t> room(D);
  for (std::size_t d = 0; d < D; ++d) room[d] = capacity - static_cast<std::int64_t>(members[d].size());
  std::size_t moved = 0;
  for (std::size_t d = 0; d < D; ++d) {
    if (room[d] >= 0) continue;
    auto& m = members[d];
    // Most confident first (ties: earlier token first); the tail beyond `capacity` moves.
    std::stable_sort(m.begin(), m.end(), [&](std::int32_t a, std::int32_t b) {
      auto ca = confidence.empty() ? 0 : confidence[static_cast<std::size_t>(a)];
      auto cb = confidence.empty() ? 0 : confidence[static_cast<std::size_t>(b)];
      return ca > cb;
    });
    for (auto k = static_cast<std::size_t>(capacity); k < m.size(); ++k) {
      auto to = static_cast<std::size_t>(std::max_element(room.begin(), room.end()) - room.begin());
      predicted[static_cast<std::size_t>(m[k])] = static_cast<int>(to);
      --room[to];
      ++moved;
    }
    room[d] = 0;
  }
  return moved;
}

/// packed[j] = rows[permutation[j]] (rows are `width` elements). packed has tokens() rows.
template <class T>
void pack_rows(ShufflePlan const& p, std::span<T const> rows, std::span<T> packed, std::size_t width) {
  check(rows.size() == p.tokens() * width && packed.size() == p.tokens() * width, "shuffle plan: pack_rows needs ",
        p.tokens(), " rows of ", width, " elements on both sides");
  for (std::size_t j = 0; j < p.tokens(); ++j)
    std::copy_n(rows.data() + static_cast<std::size_t>(p.permutation[j]) * width, width, packed.data() + j * width);
}

/// rows[permutation[j]] = packed[j]: restores the original order.
template <class T>
void unpack_rows(ShufflePlan const& p, std::span<T const> packed, std::span<T> rows, std::size_t width) {
  check(rows.size() == p.tokens() * width && packed.size() == p.tokens() * width, "shuffle plan: unpack_rows needs ",
        p.tokens(), " rows of ", width, " elements on both sides");
  for (std::size_t j = 0; j < p.tokens(); ++j)
    std::copy_n(packed.data() + j * width, width, rows.data() + static_cast<std::size_t>(p.permutation[j]) * width);
}

}  // namespace moe::speculative
