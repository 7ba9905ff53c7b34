#pragma once
// Compile-time MoE layer shapes. A model is a type with a `static constexpr ShapeSpec spec` and a
// `name`; kernels and the Layer are instantiated per model, so every size here is a constant
// expression. Token counts are runtime extents and never part of a shape.

#include <concepts>
#include <string_view>

#include "moe/config.hpp"

namespace moe {

/// How router logits become expert scores.
enum class Scoring {
  softmax,  ///< softmax over all experts (Mixtral, Qwen3, OLMoE, DeepSeek-V2)
  sigmoid,  ///< independent sigmoid per expert plus a selection-only bias (DeepSeek-V3, Kimi-K2)
};

/// How experts are grouped for group-limited routing.
enum class GroupScore {
  none,        ///< no group limit (groups == 1)
  max,         ///< a group scores its best expert (DeepSeek-V2)
  sum_top2,    ///< a group scores the sum of its two best biased experts (DeepSeek-V3)
};

/// Storage type of activations and weights; accumulation is always fp32.
enum class DType { f32, bf16 };

/// Every size that fixes one MoE layer of a model. Structural, so it can be a template argument.
struct ShapeSpec {
  int hidden = 0;            ///< model (residual stream) width
  int expert_ffn = 0;        ///< intermediate width of one routed expert (SwiGLU)
  int experts = 0;           ///< routed experts per MoE layer
  int top_k = 0;             ///< routed experts chosen per token
  int shared_experts = 0;    ///< always-active experts per MoE layer
  int shared_ffn = 0;        ///< intermediate width of one shared expert
  int moe_layers = 0;        ///< layers with an MoE block
  int dense_layers = 0;      ///< layers with a dense FFN instead (the first ones in DeepSeek models)
  int dense_ffn = 0;         ///< intermediate width of those dense FFNs
  int groups = 1;            ///< expert groups for group-limited routing (1 = no limit)
  int groups_per_token = 1;  ///< groups a token may draw its experts from
  Scoring scoring = Scoring::softmax;
  GroupScore group_score = GroupScore::none;
  bool renormalize = false;   ///< rescale the chosen top-k weights to sum to one
  float routed_scale = 1.0f;  ///< routed scaling factor applied to the routed output
  DType dtype = DType::bf16;

  [[nodiscard]] constexpr int experts_per_group() const { return experts / groups; }
  [[nodiscard]] constexpr int layers() const { return moe_layers + dense_layers; }

  /// The same routing structure at other widths (examples and tests that must fit a laptop).
  [[nodiscard]] constexpr ShapeSpec resized(int new_hidden, int new_expert_ffn) const {
    ShapeSpec s = *this;
    s.hidden = new_hidden;
    s.expert_ffn = new_expert_ffn;
    s.shared_ffn = shared_experts > 0 ? new_expert_ffn : 0;
    s.dense_ffn = dense_layers > 0 ? 4 * new_expert_ffn : 0;
    return s;
  }

  /// Bytes of one routed expert's weights (gate, up and down projections).
  [[nodiscard]] constexpr long long expert_bytes() const {
    return 3LL * hidden * expert_ffn * (dtype == DType::bf16 ? 2 : 4);
  }

  friend constexpr bool operator==(ShapeSpec const&, ShapeSpec const&) = default;
};

/// Throws moe::Error naming the first inconsistent field of a shape.
inline void validate(ShapeSpec const& s) {
  check(s.hidden > 0, "shape: hidden size must be positive, got ", s.hidden);
  check(s.expert_ffn > 0, "shape: expert FFN size must be positive, got ", s.expert_ffn);
  check(s.experts > 0, "shape: routed experts must be positive, got ", s.experts);
  check(s.top_k > 0 && s.top_k <= s.experts, "shape: top-k (", s.top_k,
        ") must be between 1 and the number of experts (", s.experts, ")");
  check(s.shared_experts >= 0, "shape: shared experts must not be negative, got ", s.shared_experts);
  check(s.shared_experts == 0 || s.shared_ffn > 0, "shape: shared experts need a positive shared FFN size");
  check(s.groups >= 1 && s.experts % s.groups == 0, "shape: ", s.experts,
        " experts cannot be split into ", s.groups, " equal groups");
  check(s.groups_per_token >= 1 && s.groups_per_token <= s.groups, "shape: groups per token (",
        s.groups_per_token, ") must be between 1 and the number of groups (", s.groups, ")");
  check(s.top_k <= s.groups_per_token * s.experts_per_group(), "shape: top-k (", s.top_k,
        ") exceeds the experts reachable in ", s.groups_per_token, " groups of ", s.experts_per_group());
  check(s.group_score != GroupScore::sum_top2 || s.experts_per_group() >= 2,
        "shape: sum-of-top-2 group scoring needs at least 2 experts per group");
  check(s.routed_scale > 0.0f, "shape: routed scaling factor must be positive");
}

/// A model shape: a type carrying a constant ShapeSpec and a display name.
template <class M>
concept ModelShape = requires {
  { M::spec } -> std::convertible_to<ShapeSpec>;
  { M::name } -> std::convertible_to<std::string_view>;
};

/// Wraps a ShapeSpec value into a model type (for runtime-built tests and reduced models).
template <ShapeSpec S>
struct Shape {
  static constexpr ShapeSpec spec = S;
  static constexpr std::string_view name = "custom";
};

}  // namespace moe
