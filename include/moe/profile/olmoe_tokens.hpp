#pragma once
// Loading the real OLMoE-1B-7B routing statistics of shared/data/olmoe-routing into route profiles.
//
// Layout: <data_dir>/olmoe-routing/olmoe-1b-7b/<domain>/{token_expert_counts,crosslayer_counts}.tsv,
// domains arxiv, book, c4, github (c4 has no token file upstream). Counts of several domains are
// summed into one profile.

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "moe/config.hpp"
#include "moe/profile/route_profile.hpp"

namespace moe::profile::olmoe {

inline constexpr int experts = 64;
inline constexpr int top_k = 8;
/// Size of the OLMoE tokenizer's embedding table (token ids are below it).
inline constexpr int vocab = 50304;
/// Layers recorded in the data set (of 16).
inline constexpr int recorded_layers[] = {0, 7, 15};

/// Folder of one domain, e.g. domain_dir("tests/data", "arxiv").
inline std::string domain_dir(std::string_view data_dir, std::string_view domain) {
  return std::string(data_dir) + "/olmoe-routing/olmoe-1b-7b/" + std::string(domain);
}

struct LoadOptions {
  bool token_counts = true;  ///< read token_expert_counts.tsv
  bool crosslayer = false;   ///< read crosslayer_counts.tsv
  int only_layer = -1;       ///< keep one layer of the token counts (-1: all)
};

/// Sums the statistics of `domains` into one profile (64 experts, top-8).
/// Throws moe::Error when a file is missing or malformed, or when no domain is given.
inline RouteProfile load(std::string_view data_dir, std::vector<std::string> const& domains,
                         LoadOptions opt = {}) {
  check(!domains.empty(), "olmoe: no domain given");
  RouteRecorder rec(experts, top_k);
  for (auto const& d : domains) {
    std::string dir = domain_dir(data_dir, d);
    if (opt.token_counts) {
      core::TsvReader in(dir + "/token_expert_counts.tsv");
      int only = opt.only_layer;
      load_token_expert_counts(in, rec, [only](int l) { return only < 0 || l == only; });
    }
    if (opt.crosslayer) load_crosslayer_counts(dir + "/crosslayer_counts.tsv", rec);
  }
  return rec.profile();
}

}  // namespace moe::profile::olmoe
