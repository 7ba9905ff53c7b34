#pragma once
// Published shapes of the example models. Values are from each model's released configuration
// (config.json on the model's Hugging Face page). Only the MoE-relevant fields are kept.

#include "moe/core/shape.hpp"

namespace moe::models {

/// Mixtral-8x7B: 32 layers, all MoE, 8 experts, top-2, softmax over the chosen two.
struct Mixtral8x7B {
  static constexpr std::string_view name = "Mixtral-8x7B";
  static constexpr ShapeSpec spec{.hidden = 4096, .expert_ffn = 14336, .experts = 8, .top_k = 2,
                                  .moe_layers = 32, .renormalize = true};
};

/// DeepSeek-MoE-16B: 28 layers (first dense), 64 fine-grained experts top-6 plus 2 shared.
struct DeepSeekMoE16B {
  static constexpr std::string_view name = "DeepSeek-MoE-16B";
  static constexpr ShapeSpec spec{.hidden = 2048, .expert_ffn = 1408, .experts = 64, .top_k = 6,
                                  .shared_experts = 2, .shared_ffn = 1408, .moe_layers = 27,
                                  .dense_layers = 1, .dense_ffn = 10944};
};

/// DeepSeek-V2: 60 layers (first dense), 160 experts top-6 in 8 groups (3 per token), 2 shared,
/// routed scaling 16.
struct DeepSeekV2 {
  static constexpr std::string_view name = "DeepSeek-V2";
  static constexpr ShapeSpec spec{.hidden = 5120, .expert_ffn = 1536, .experts = 160, .top_k = 6,
                                  .shared_experts = 2, .shared_ffn = 1536, .moe_layers = 59,
                                  .dense_layers = 1, .dense_ffn = 12288, .groups = 8,
                                  .groups_per_token = 3, .group_score = GroupScore::max,
                                  .routed_scale = 16.0f};
};

/// DeepSeek-V3 (and R1, same architecture): 61 layers (first 3 dense), 256 experts top-8 in 8
/// groups (4 per token), sigmoid scoring with a correction bias, 1 shared, routed scaling 2.5.
struct DeepSeekV3 {
  static constexpr std::string_view name = "DeepSeek-V3";
  static constexpr ShapeSpec spec{.hidden = 7168, .expert_ffn = 2048, .experts = 256, .top_k = 8,
                                  .shared_experts = 1, .shared_ffn = 2048, .moe_layers = 58,
                                  .dense_layers = 3, .dense_ffn = 18432, .groups = 8,
                                  .groups_per_token = 4, .scoring = Scoring::sigmoid,
                                  .group_score = GroupScore::sum_top2, .renormalize = true,
                                  .routed_scale = 2.5f};
};
/// DeepSeek-R1 shares DeepSeek-V3's architecture.
struct DeepSeekR1 : DeepSeekV3 {
  static constexpr std::string_view name = "DeepSeek-R1";
};

/// Qwen3-30B-A3B: 48 layers, 128 experts top-8, renormalised softmax.
struct Qwen3_30B_A3B {
  static constexpr std::string_view name = "Qwen3-30B-A3B";
  static constexpr ShapeSpec spec{.hidden = 2048, .expert_ffn = 768, .experts = 128, .top_k = 8,
                                  .moe_layers = 48, .renormalize = true};
};

/// Qwen3-235B-A22B: 94 layers, 128 experts top-8, renormalised softmax.
struct Qwen3_235B_A22B {
  static constexpr std::string_view name = "Qwen3-235B-A22B";
  static constexpr ShapeSpec spec{.hidden = 4096, .expert_ffn = 1536, .experts = 128, .top_k = 8,
                                  .moe_layers = 94, .renormalize = true};
};

/// OLMoE-1B-7B: 16 layers, 64 experts top-8, softmax without renormalisation.
struct OLMoE_1B_7B {
  static constexpr std::string_view name = "OLMoE-1B-7B";
  static constexpr ShapeSpec spec{.hidden = 2048, .expert_ffn = 1024, .experts = 64, .top_k = 8,
                                  .moe_layers = 16};
};

/// Kimi-K2: 61 layers (first dense), 384 experts top-8, one group, sigmoid with correction bias,
/// 1 shared, routed scaling 2.827.
struct KimiK2 {
  static constexpr std::string_view name = "Kimi-K2";
  static constexpr ShapeSpec spec{.hidden = 7168, .expert_ffn = 2048, .experts = 384, .top_k = 8,
                                  .shared_experts = 1, .shared_ffn = 2048, .moe_layers = 60,
                                  .dense_layers = 1, .dense_ffn = 18432, .scoring = Scoring::sigmoid,
                                  .renormalize = true, .routed_scale = 2.827f};
};

/// A model's routing structure at reduced widths (and optionally another storage type), for tests
/// and laptop-sized demos.
template <ModelShape M, int Hidden, int ExpertFfn, DType D = M::spec.dtype>
struct Reduced {
  static constexpr std::string_view name = M::name;
  static constexpr ShapeSpec spec = [] {
    ShapeSpec s = M::spec.resized(Hidden, ExpertFfn);
    s.dtype = D;
    return s;
  }();
};

/// A model at full size with another storage type (e.g. fp32 for reference checks).
template <ModelShape M, DType D>
struct WithDType {
  static constexpr std::string_view name = M::name;
  static constexpr ShapeSpec spec = [] {
    ShapeSpec s = M::spec;
    s.dtype = D;
    return s;
  }();
};

}  // namespace moe::models
