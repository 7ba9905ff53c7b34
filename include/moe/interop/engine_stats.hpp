#pragma once
// Routing statistics recorded by serving engines, imported into our profiles (docs/engines.md has
// the command lines that record them):
//
//   SGLang        expert distribution recorder in `stat` mode, dumped by rank 0 with torch.save
//                 (expert_distribution_recorder_<time>.pt): a dict whose "logical_count" is an int
//                 tensor [forward passes, num_hidden_layers, logical experts]. Each pass becomes a
//                 batch of the load profile; hidden layers whose counts are zero in every pass (the
//                 dense layers) are dropped and the kept decoder layer indices are returned.
//   TensorRT-LLM  expert statistic dump (EXPERT_STATISTIC_PATH): meta_info.json (num_experts,
//                 num_experts_per_token) and rank<r>.safetensors for r = 0..ranks-1, each holding
//                 "<iteration>_<decoder layer>" -> int64 bincount over the experts. Counts are summed
//                 over ranks; each iteration becomes a batch.
//   vLLM          routed experts of requests (routed_experts / prompt_routed_experts), JSON arrays
//                 [tokens][moe layers][top_k]: a bare array, an object holding either key, or an
//                 array of such objects (one per request). Tokens become a route profile (token ids
//                 numbered in file order) and each request one batch of a load profile.
//
// Every importer checks shapes, counts (non-negative, sums within int64) and consistency across
// files, and throws moe::Error naming the file and the field.

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/tsv.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/profile/route_profile.hpp"
#include "moe/interop/torch_file.hpp"

namespace moe::profile::engine {

/// Imported loads: batches x MoE layers x experts, and the decoder layer index of each MoE layer.
struct Imported {
  LoadProfile loads;
  std::vector<int> decoder_layers;
  int top_k = 0;  ///< experts per token, when the file says
};

// ---------------------------------------------------------------------------------------------
// SGLang
// ---------------------------------------------------------------------------------------------

/// Reads an SGLang `stat` dump. `experts` (0 = take it from the file) is checked against the file.
inline Imported import_sglang_stat(std::string const& path, int experts = 0) {
  auto tensors = torch_file::read_torch_save(path);
  auto it = tensors.find("logical_count");
  check(it != tensors.end(), path,
        ": no \"logical_count\" tensor (record with --expert-distribution-recorder-mode stat)");
  auto& t = it->second;
  if (t.shape.size() == 2) t.shape.insert(t.shape.begin(), 1);  // one pass, as SGLang accepts
  check(t.shape.size() == 3, path, ": logical_count has ", t.shape.size(),
        " dimensions, expected [passes, hidden layers, experts]");
  auto P = t.shape[0], H = t.shape[1], E = t.shape[2];
  check(P >= 1 && P <= core::limits::batches, path, ": logical_count has ", P, " passes, outside [1, ",
        core::limits::batches, "]");
  check(H >= 1 && H <= core::limits::layers, path, ": logical_count has ", H, " layers, outside [1, ",
        core::limits::layers, "]");
  check(E >= 1 && E <= core::limits::experts, path, ": logical_count has ", E, " experts, outside [1, ",
        core::limits::experts, "]");
  check(experts == 0 || E == experts, path, ": logical_count has ", E, " experts, the model has ", experts);
  auto at = [&](std::int64_t p, std::int64_t h, std::int64_t e) {
    return t.values[static_cast<std::size_t>((p * H + h) * E + e)];
  };
  Imported out;
  for (std::int64_t h = 0; h < H; ++h) {
    bool any = false;
    for (std::int64_t p = 0; p < P; ++p)
      for (std::int64_t e = 0; e < E; ++e) {
        auto v = at(p, h, e);
        check(v >= 0, path, ": logical_count[", p, "][", h, "][", e, "] = ", v, " is negative");
        any = any || v > 0;
      }
    if (any) out.decoder_layers.push_back(static_cast<int>(h));
  }
  check(!out.decoder_layers.empty(), path, ": logical_count is zero everywhere (nothing was recorded)");
  out.loads = LoadProfile(static_cast<int>(P), static_cast<int>(out.decoder_layers.size()), static_cast<int>(E));
  for (std::int64_t p = 0; p < P; ++p)
    for (std::size_t l = 0; l < out.decoder_layers.size(); ++l)
      for (std::int64_t e = 0; e < E; ++e)
        out.loads.at(static_cast<int>(p), static_cast<int>(l), static_cast<int>(e)) =
            static_cast<double>(at(p, out.decoder_layers[l], e));
  return out;
}

// ---------------------------------------------------------------------------------------------
// TensorRT-LLM
// ---------------------------------------------------------------------------------------------

namespace detail {

inline long long json_int(nlohmann::json const& j, char const* key, std::string const& where) {
  check(j.contains(key) && j[key].is_number_integer(), where, ": \"", key, "\" missing or not an integer");
  return j[key].get<long long>();
}

/// "<iteration>_<layer>" -> (iteration, layer).
inline std::pair<int, int> iter_layer(std::string const& key, std::string const& where) {
  auto us = key.find('_');
  int it = -1, ly = -1;
  bool ok = us != std::string::npos && us > 0 && us + 1 < key.size();
  if (ok) {
    auto a = std::from_chars(key.data(), key.data() + us, it);
    auto b = std::from_chars(key.data() + us + 1, key.data() + key.size(), ly);
    ok = a.ec == std::errc{} && a.ptr == key.data() + us && b.ec == std::errc{} && b.ptr == key.data() + key.size();
  }
  check(ok && it >= 0 && ly >= 0, where, ": tensor name '", key, "' is not \"<iteration>_<layer>\"");
  return {it, ly};
}

}  // namespace detail

/// Reads a TensorRT-LLM expert statistic directory. `experts` (0 = from meta_info.json) is checked.
inline Imported import_trtllm_stat(std::string const& dir, int experts = 0) {
  namespace fs = std::filesystem;
  check(fs::is_directory(dir), "'", dir, "' is not a directory (expected meta_info.json and rank<r>.safetensors)");
  std::string meta_path = (fs::path(dir) / "meta_info.json").string();
  std::ifstream mf(meta_path);
  check(mf.is_open(), "cannot open '", meta_path, "'");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(mf);
  } catch (nlohmann::json::exception const& e) {
    fail(meta_path, ": not valid JSON: ", e.what());
  }
  check(meta.is_object(), meta_path, ": expected a JSON object");
  long long E = detail::json_int(meta, "num_experts", meta_path);
  long long K = detail::json_int(meta, "num_experts_per_token", meta_path);
  check(E >= 1 && E <= core::limits::experts, meta_path, ": num_experts = ", E, " outside [1, ", core::limits::experts,
        "]");
  check(K >= 1 && K <= E, meta_path, ": num_experts_per_token = ", K, " outside [1, num_experts]");
  check(experts == 0 || E == experts, meta_path, ": num_experts = ", E, ", the model has ", experts);

  // Rank files: rank0 .. rank<n-1>, none missing.
  std::set<int> ranks;
  for (auto const& entry : fs::directory_iterator(dir)) {
    auto name = entry.path().filename().string();
    if (name.rfind("rank", 0) != 0 || entry.path().extension() != ".safetensors") continue;
    std::string num = name.substr(4, name.size() - 4 - 12);
    int r = -1;
    auto res = std::from_chars(num.data(), num.data() + num.size(), r);
    check(res.ec == std::errc{} && res.ptr == num.data() + num.size() && r >= 0 && r < core::limits::gpus, dir,
          ": file '", name, "' is not rank<r>.safetensors");
    ranks.insert(r);
  }
  check(!ranks.empty(), dir, ": no rank<r>.safetensors file");
  for (int r = 0; r <= *ranks.rbegin(); ++r)
    check(ranks.count(r), dir, ": rank", r, ".safetensors is missing (ranks up to ", *ranks.rbegin(), " are present)");

  std::map<std::pair<int, int>, std::vector<std::int64_t>> sum;  // (iteration, layer) -> counts
  std::set<std::pair<int, int>> first_keys;
  for (int r : ranks) {
    std::string path = (fs::path(dir) / ("rank" + std::to_string(r) + ".safetensors")).string();
    auto tensors = torch_file::read_safetensors(path);
    std::set<std::pair<int, int>> keys;
    for (auto const& [name, t] : tensors) {
      auto k = detail::iter_layer(name, path);
      std::string what = path + ": tensor '" + name + "'";
      check(t.shape.size() == 1 && t.shape[0] == E, what, ": shape must be [", E, "] (num_experts)");
      auto& s = sum[k];
      s.resize(static_cast<std::size_t>(E), 0);
      for (long long e = 0; e < E; ++e) {
        auto v = t.values[static_cast<std::size_t>(e)];
        check(v >= 0, what, ": count of expert ", e, " is negative (", v, ")");
        s[static_cast<std::size_t>(e)] = core::checked_add(s[static_cast<std::size_t>(e)], v, what, "count");
      }
      keys.insert(k);
    }
    if (r == 0) {
      first_keys = keys;
    } else {
      for (auto const& k : first_keys)
        check(keys.count(k), path, ": has no tensor '", k.first, "_", k.second, "' that rank 0 has");
      for (auto const& k : keys)
        check(first_keys.count(k), path, ": tensor '", k.first, "_", k.second, "' is not in rank 0's file");
    }
  }
  check(!sum.empty(), dir, ": the rank files hold no statistics");
  std::set<int> iters, layers;
  for (auto const& [k, v] : sum) {
    iters.insert(k.first);
    layers.insert(k.second);
  }
  for (int i : iters)
    for (int l : layers) check(sum.count({i, l}), dir, ": iteration ", i, " has no counts for decoder layer ", l);
  check(iters.size() <= static_cast<std::size_t>(core::limits::batches) &&
            layers.size() <= static_cast<std::size_t>(core::limits::layers),
        dir, ": too many iterations or layers");
  Imported out;
  out.top_k = static_cast<int>(K);
  out.decoder_layers.assign(layers.begin(), layers.end());
  out.loads = LoadProfile(static_cast<int>(iters.size()), static_cast<int>(layers.size()), static_cast<int>(E));
  int b = 0;
  for (int i : iters) {
    int l = 0;
    for (int ly : layers) {
      auto const& s = sum[{i, ly}];
      for (long long e = 0; e < E; ++e)
        out.loads.at(b, l, static_cast<int>(e)) = static_cast<double>(s[static_cast<std::size_t>(e)]);
      ++l;
    }
    ++b;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// vLLM
// ---------------------------------------------------------------------------------------------

/// A route profile and per-request loads from vLLM routed experts.
struct ImportedRoutes {
  RouteProfile routes;
  LoadProfile loads;  ///< one batch per request
  long long tokens = 0;
  /// Per request, one past its last token: the route profile's token ids of request r are
  /// [request_end[r - 1], request_end[r]) (each token occurrence has its own id).
  std::vector<long long> request_end;
};

/// Reads vLLM routed experts (formats in the file comment) for a model with `experts` experts.
inline ImportedRoutes import_vllm_routed_experts(std::string const& path, int experts) {
  std::ifstream f(path);
  check(f.is_open(), "cannot open '", path, "' for reading");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (nlohmann::json::exception const& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
  // Requests: each a list of [tokens][layers][top_k] arrays (prompt first, then generated).
  std::vector<std::vector<nlohmann::json const*>> requests;
  auto add_request = [&](nlohmann::json const& r, std::string const& where) {
    std::vector<nlohmann::json const*> parts;
    if (r.is_array()) {
      parts.push_back(&r);
    } else {
      check(r.is_object(), where, ": expected an array or an object with routed_experts");
      for (char const* key : {"prompt_routed_experts", "routed_experts"})
        if (r.contains(key) && !r[key].is_null()) parts.push_back(&r[key]);
      check(!parts.empty(), where, ": has neither \"routed_experts\" nor \"prompt_routed_experts\"");
    }
    requests.push_back(std::move(parts));
  };
  if (j.is_array() && !j.empty() && j[0].is_object()) {
    for (std::size_t i = 0; i < j.size(); ++i) add_request(j[i], path + ": [" + std::to_string(i) + "]");
  } else {
    add_request(j, path);
  }
  int layers = -1, top_k = -1;
  long long token = 0;
  std::unique_ptr<RouteRecorder> rec;
  std::vector<std::vector<double>> per_request;  // layers x experts, flattened, per request
  std::vector<long long> ends;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    std::vector<double> load;
    for (auto const* part : requests[r]) {
      std::string where = path + ": request " + std::to_string(r);
      check(part->is_array(), where, ": routed experts must be a [tokens][layers][top_k] array");
      for (std::size_t t = 0; t < part->size(); ++t) {
        auto const& tok = (*part)[t];
        std::string tw = where + ", token " + std::to_string(t);
        check(tok.is_array() && !tok.empty() && tok.size() <= static_cast<std::size_t>(core::limits::layers), tw,
              ": expected [layers][top_k]");
        if (layers < 0) {
          layers = static_cast<int>(tok.size());
          check(tok[0].is_array() && !tok[0].empty() && tok[0].size() <= static_cast<std::size_t>(experts), tw,
                ": expected 1..", experts, " experts per token");
          top_k = static_cast<int>(tok[0].size());
          rec = std::make_unique<RouteRecorder>(experts, top_k);
        }
        check(static_cast<int>(tok.size()) == layers, tw, ": ", tok.size(), " layers, the first token has ", layers);
        if (load.empty()) load.assign(static_cast<std::size_t>(layers) * static_cast<std::size_t>(experts), 0.0);
        check(token < std::numeric_limits<int>::max(), path, ": too many tokens");
        for (int l = 0; l < layers; ++l) {
          auto const& ex = tok[static_cast<std::size_t>(l)];
          std::string lw = tw + ", layer " + std::to_string(l);
          check(ex.is_array() && static_cast<int>(ex.size()) == top_k, lw, ": expected ", top_k, " expert ids");
          std::vector<int> ids;
          for (auto const& e : ex) {
            check(e.is_number_integer(), lw, ": expert id ", e.dump(), " is not an integer");
            auto v = e.get<long long>();
            check(v >= 0 && v < experts, lw, ": expert id ", v, " outside [0, ", experts, ")");
            ids.push_back(static_cast<int>(v));
            load[static_cast<std::size_t>(l) * static_cast<std::size_t>(experts) + static_cast<std::size_t>(v)] += 1;
          }
          try {
            rec->record(static_cast<int>(token), l, ids);
          } catch (Error const& e) {
            fail(lw, ": ", e.what());
          }
        }
        ++token;
      }
    }
    check(!load.empty(), path, ": request ", r, " has no tokens");
    check(static_cast<long long>(per_request.size() + 1) * layers * experts <= core::limits::profile_values, path, ": ",
          per_request.size() + 1, " requests x ", layers, " layers x ", experts,
          " experts is above the load profile limit");
    per_request.push_back(std::move(load));
    ends.push_back(token);
  }
  check(token > 0, path, ": no tokens");
  ImportedRoutes out;
  out.request_end = std::move(ends);
  out.tokens = token;
  out.routes = rec->profile();
  out.loads = LoadProfile(static_cast<int>(per_request.size()), layers, experts);
  for (std::size_t b = 0; b < per_request.size(); ++b)
    std::copy(per_request[b].begin(), per_request[b].end(), out.loads.row(static_cast<int>(b), 0));
  return out;
}

}  // namespace moe::profile::engine
