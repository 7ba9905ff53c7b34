#pragma once
// Expert plans in the files serving engines load (docs/engines.md has the command lines):
//
//   SGLang        --init-expert-location FILE.json with --ep-num-redundant-experts R:
//                 {"physical_to_logical_map": [num_hidden_layers][P]}. Exactly that key (SGLang
//                 passes the keys on as constructor arguments); one row per hidden layer, dense
//                 layers included (their row is arange(P) % E, as SGLang's trivial layout).
//   TensorRT-LLM  moe_config.load_balancer: FILE.yaml, a MoeLoadBalancerConfig:
//                 num_slots: P, initial_global_assignments: {decoder layer index: [P]},
//                 layer_updates_per_iter: 0 (static: the engine keeps the plan).
//   vLLM          experimental: the [moe layers][P] JSON array of the open pull request #49572
//                 (initial_expert_map_path); upstream vLLM has no loader yet.
//   vllm-ascend   experimental: expert_map_path JSON {"moe_layer_count", "layer_list": [{"layer_id",
//                 "device_count", "device_list": [{"device_id", "device_expert": [S]}]}]}.
//
// Every file describes a SlotMap (slot_map.hpp): per MoE layer P slots, slot p on EP rank p / S.
// The writers use nlohmann-json and yaml-cpp. The readers apply the checks the engines apply when
// they load a plan (shape, integer entries, P divisible by the EP size, every logical expert in
// every MoE layer, dense rows) and throw moe::Error naming the file and the field.

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "moe/config.hpp"
#include "moe/plan/slot_map.hpp"

namespace moe::placement::engine {

/// Where the MoE layers sit among the model's decoder layers: hidden layers [0, first_moe) are dense,
/// [first_moe, first_moe + moe layers) are MoE (every model this library knows is laid out so).
struct LayerLayout {
  int hidden_layers = 0;
  int first_moe = 0;
};

enum class Format { sglang, trtllm, vllm, vllm_ascend };

inline Format parse_format(std::string const& s) {
  if (s == "sglang") return Format::sglang;
  if (s == "trtllm" || s == "tensorrt-llm") return Format::trtllm;
  if (s == "vllm") return Format::vllm;
  if (s == "vllm-ascend") return Format::vllm_ascend;
  fail("unknown engine format '", s, "' (sglang, trtllm, vllm, vllm-ascend)");
}

/// The file name suffix moe_plan uses for a format.
inline char const* file_suffix(Format f) {
  switch (f) {
    case Format::sglang:
      return ".sglang.json";
    case Format::trtllm:
      return ".trtllm.yaml";
    case Format::vllm:
      return ".vllm.json";
    case Format::vllm_ascend:
      return ".vllm-ascend.json";
  }
  return "";
}

namespace detail {

inline void check_layout(SlotMap const& m, LayerLayout const& ly) {
  check(ly.first_moe >= 0 && ly.first_moe + m.layers() == ly.hidden_layers, "engine plan: ", m.layers(),
        " MoE layers starting at decoder layer ", ly.first_moe, " do not fit ", ly.hidden_layers, " hidden layers");
}

inline std::vector<int> row_of(SlotMap const& m, int l) {
  auto r = m.physical_to_logical(l);
  return {r.begin(), r.end()};
}

/// One plan row read from a file: P integers in [0, E); `what` names the field for messages.
inline std::vector<int> read_row(nlohmann::json const& j, int P, int E, std::string const& what) {
  check(j.is_array(), what, ": expected an array of ", P, " expert ids, found ", j.type_name());
  check(static_cast<long long>(j.size()) == P, what, ": has ", j.size(), " entries, expected ", P);
  std::vector<int> row;
  row.reserve(static_cast<std::size_t>(P));
  for (std::size_t p = 0; p < j.size(); ++p) {
    auto const& v = j[p];
    check(v.is_number_integer(), what, "[", p, "]: expected an integer expert id, found ", v.type_name(), " ",
          v.dump());
    auto e = v.get<long long>();
    check(e >= 0 && e < E, what, "[", p, "]: expert id ", e, " outside [0, ", E, ")");
    row.push_back(static_cast<int>(e));
  }
  return row;
}

/// A slot map from MoE rows, with the engine's load-time checks.
inline SlotMap from_rows(std::vector<std::vector<int>> const& rows, int ranks, int experts, std::string const& where) {
  check(!rows.empty(), where, ": no MoE layer");
  int P = static_cast<int>(rows.front().size());
  check(ranks > 0 && P % ranks == 0, where, ": ", P, " physical slots do not split over ", ranks, " EP ranks");
  check(P >= experts, where, ": ", P, " physical slots cannot hold ", experts, " logical experts");
  SlotMap m(static_cast<int>(rows.size()), ranks, P / ranks, experts);
  for (int l = 0; l < m.layers(); ++l) {
    check(static_cast<int>(rows[static_cast<std::size_t>(l)].size()) == P, where, ": MoE layer ", l, " has ",
          rows[static_cast<std::size_t>(l)].size(), " slots, the first has ", P);
    std::vector<char> seen(static_cast<std::size_t>(experts), 0);
    for (int p = 0; p < P; ++p) {
      int e = rows[static_cast<std::size_t>(l)][static_cast<std::size_t>(p)];
      m.at(l, p) = e;
      seen[static_cast<std::size_t>(e)] = 1;
    }
    for (int e = 0; e < experts; ++e)
      check(seen[static_cast<std::size_t>(e)], where, ": MoE layer ", l, " has no slot for logical expert ", e);
  }
  return m;
}

inline nlohmann::json parse_json(std::istream& in, std::string const& name) {
  try {
    return nlohmann::json::parse(in);
  } catch (nlohmann::json::exception const& e) {
    fail(name, ": not valid JSON: ", e.what());
  }
}

inline void write_text(std::string const& path, std::string const& text) {
  std::ofstream f(path);
  check(f.is_open(), "cannot open '", path, "' for writing");
  f << text;
  check(static_cast<bool>(f), "write to '", path, "' failed");
}

inline std::string read_text(std::string const& path) {
  std::ifstream f(path);
  check(f.is_open(), "cannot open '", path, "' for reading");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// SGLang
// ---------------------------------------------------------------------------------------------

inline nlohmann::json sglang_json(SlotMap const& m, LayerLayout const& ly) {
  detail::check_layout(m, ly);
  nlohmann::json rows = nlohmann::json::array();
  for (int h = 0; h < ly.hidden_layers; ++h) {
    int l = h - ly.first_moe;
    if (l >= 0 && l < m.layers()) {
      rows.push_back(detail::row_of(m, l));
    } else {
      std::vector<int> trivial(static_cast<std::size_t>(m.physical()));
      for (int p = 0; p < m.physical(); ++p) trivial[static_cast<std::size_t>(p)] = p % m.experts();
      rows.push_back(std::move(trivial));
    }
  }
  return nlohmann::json{{"physical_to_logical_map", std::move(rows)}};
}

inline void write_sglang(std::ostream& os, SlotMap const& m, LayerLayout const& ly) {
  os << sglang_json(m, ly).dump() << '\n';
  check(static_cast<bool>(os), "write_sglang: write failed");
}

/// Reads an SGLang --init-expert-location JSON for `ep_size` ranks and `experts` logical experts;
/// returns the MoE layers' rows [ly.first_moe, ly.hidden_layers). Dense rows must be valid rows too.
inline SlotMap read_sglang(std::istream& in, std::string const& name, LayerLayout const& ly, int ep_size, int experts) {
  auto j = detail::parse_json(in, name);
  check(j.is_object(), name, ": expected a JSON object with the key \"physical_to_logical_map\"");
  for (auto it = j.begin(); it != j.end(); ++it)
    check(it.key() == "physical_to_logical_map", name, ": unexpected key \"", it.key(),
          "\" (SGLang takes only \"physical_to_logical_map\" here)");
  check(j.contains("physical_to_logical_map"), name, ": missing \"physical_to_logical_map\"");
  auto const& map = j["physical_to_logical_map"];
  check(map.is_array() && !map.empty(), name, ": physical_to_logical_map must be a non-empty array of rows");
  check(static_cast<int>(map.size()) == ly.hidden_layers, name, ": physical_to_logical_map has ", map.size(),
        " rows, the model has ", ly.hidden_layers, " hidden layers");
  check(map[0].is_array(), name, ": physical_to_logical_map[0] is not an array");
  check(map[0].size() <= static_cast<std::size_t>(experts) * core::limits::gpus, name,
        ": physical_to_logical_map[0] has ", map[0].size(), " slots, above the limit");
  int P = static_cast<int>(map[0].size());
  std::vector<std::vector<int>> rows;
  for (int h = 0; h < ly.hidden_layers; ++h) {
    auto row = detail::read_row(map[static_cast<std::size_t>(h)], P, experts,
                                name + ": physical_to_logical_map[" + std::to_string(h) + "]");
    if (h >= ly.first_moe) rows.push_back(std::move(row));
  }
  return detail::from_rows(rows, ep_size, experts, name);
}

// ---------------------------------------------------------------------------------------------
// TensorRT-LLM
// ---------------------------------------------------------------------------------------------

inline void write_trtllm(std::ostream& os, SlotMap const& m, LayerLayout const& ly) {
  detail::check_layout(m, ly);
  YAML::Emitter y;
  y << YAML::BeginMap;
  y << YAML::Key << "num_slots" << YAML::Value << m.physical();
  y << YAML::Key << "initial_global_assignments" << YAML::Value << YAML::BeginMap;
  for (int l = 0; l < m.layers(); ++l)
    y << YAML::Key << ly.first_moe + l << YAML::Value << YAML::Flow << detail::row_of(m, l);
  y << YAML::EndMap;
  y << YAML::Key << "layer_updates_per_iter" << YAML::Value << 0;
  y << YAML::EndMap;
  check(y.good(), "write_trtllm: ", y.GetLastError());
  os << y.c_str() << '\n';
  check(static_cast<bool>(os), "write_trtllm: write failed");
}

/// Reads a TensorRT-LLM MoeLoadBalancerConfig YAML; MoE layers are the keys of
/// initial_global_assignments, which must be exactly [ly.first_moe, ly.hidden_layers).
inline SlotMap read_trtllm(std::istream& in, std::string const& name, LayerLayout const& ly, int ep_size, int experts) {
  YAML::Node y;
  try {
    y = YAML::Load(in);
  } catch (YAML::Exception const& e) {
    fail(name, ": not valid YAML: ", e.what());
  }
  check(y.IsMap(), name, ": expected a mapping with num_slots, initial_global_assignments, layer_updates_per_iter");
  auto as_int = [&](YAML::Node const& n, std::string const& what) {
    check(n && n.IsScalar(), name, ": ", what, " must be an integer");
    long long v = 0;
    std::string s = n.Scalar();
    try {
      std::size_t used = 0;
      v = std::stoll(s, &used);
      check(used == s.size(), name, ": ", what, " = '", s, "' is not an integer");
    } catch (std::logic_error const&) {
      fail(name, ": ", what, " = '", s, "' is not an integer");
    }
    return v;
  };
  long long P = as_int(y["num_slots"], "num_slots");
  check(P >= experts && P <= static_cast<long long>(experts) * core::limits::gpus, name, ": num_slots = ", P,
        " cannot hold ", experts, " experts or is above the limit");
  check(y["layer_updates_per_iter"].IsDefined(), name, ": missing layer_updates_per_iter (0 keeps the plan static)");
  long long updates = as_int(y["layer_updates_per_iter"], "layer_updates_per_iter");
  check(updates >= 0, name, ": layer_updates_per_iter = ", updates, " is negative");
  auto ga = y["initial_global_assignments"];
  check(ga && ga.IsMap(), name, ": initial_global_assignments must be a mapping from decoder layer to slots");
  std::map<long long, std::vector<int>> by_layer;
  for (auto it = ga.begin(); it != ga.end(); ++it) {
    long long layer = as_int(it->first, "a key of initial_global_assignments");
    std::string what = name + ": initial_global_assignments[" + std::to_string(layer) + "]";
    check(layer >= ly.first_moe && layer < ly.hidden_layers, what, ": decoder layer ", layer, " is not a MoE layer [",
          ly.first_moe, ", ", ly.hidden_layers, ")");
    check(!by_layer.count(layer), what, ": listed twice");
    check(it->second.IsSequence(), what, ": expected a list of ", P, " expert ids");
    check(static_cast<long long>(it->second.size()) == P, what, ": has ", it->second.size(), " slots, num_slots is ",
          P);
    std::vector<int> row;
    for (std::size_t p = 0; p < it->second.size(); ++p) {
      long long e = as_int(it->second[p], what.substr(name.size() + 2) + "[" + std::to_string(p) + "]");
      check(e >= 0 && e < experts, what, "[", p, "]: expert id ", e, " outside [0, ", experts, ")");
      row.push_back(static_cast<int>(e));
    }
    by_layer[layer] = std::move(row);
  }
  std::vector<std::vector<int>> rows;
  for (int h = ly.first_moe; h < ly.hidden_layers; ++h) {
    check(by_layer.count(h), name, ": initial_global_assignments has no entry for MoE decoder layer ", h);
    rows.push_back(std::move(by_layer[h]));
  }
  return detail::from_rows(rows, ep_size, experts, name);
}

// ---------------------------------------------------------------------------------------------
// vLLM (experimental) and vllm-ascend (experimental)
// ---------------------------------------------------------------------------------------------

inline void write_vllm(std::ostream& os, SlotMap const& m) {
  nlohmann::json rows = nlohmann::json::array();
  for (int l = 0; l < m.layers(); ++l) rows.push_back(detail::row_of(m, l));
  os << rows.dump() << '\n';
  check(static_cast<bool>(os), "write_vllm: write failed");
}

inline SlotMap read_vllm(std::istream& in, std::string const& name, int moe_layers, int ep_size, int experts) {
  auto j = detail::parse_json(in, name);
  check(j.is_array(), name, ": expected a [moe layers][physical slots] array");
  check(static_cast<int>(j.size()) == moe_layers, name, ": has ", j.size(), " layers, the model has ", moe_layers,
        " MoE layers");
  check(j[0].is_array(), name, ": [0] is not an array");
  check(j[0].size() <= static_cast<std::size_t>(experts) * core::limits::gpus, name, ": [0] has too many slots");
  int P = static_cast<int>(j[0].size());
  std::vector<std::vector<int>> rows;
  for (int l = 0; l < moe_layers; ++l)
    rows.push_back(
        detail::read_row(j[static_cast<std::size_t>(l)], P, experts, name + ": [" + std::to_string(l) + "]"));
  return detail::from_rows(rows, ep_size, experts, name);
}

inline void write_vllm_ascend(std::ostream& os, SlotMap const& m) {
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (int l = 0; l < m.layers(); ++l) {
    nlohmann::ordered_json devices = nlohmann::ordered_json::array();
    for (int g = 0; g < m.ranks(); ++g) {
      std::vector<int> slots;
      for (int s = 0; s < m.slots_per_rank(); ++s) slots.push_back(m.at(l, g, s));
      devices.push_back({{"device_id", g}, {"device_expert", std::move(slots)}});
    }
    layers.push_back({{"layer_id", l}, {"device_count", m.ranks()}, {"device_list", std::move(devices)}});
  }
  nlohmann::ordered_json j{{"moe_layer_count", m.layers()}, {"layer_list", std::move(layers)}};
  os << j.dump() << '\n';
  check(static_cast<bool>(os), "write_vllm_ascend: write failed");
}

inline SlotMap read_vllm_ascend(std::istream& in, std::string const& name, int moe_layers, int experts) {
  auto j = detail::parse_json(in, name);
  check(j.is_object() && j.contains("moe_layer_count") && j.contains("layer_list"), name,
        ": expected an object with \"moe_layer_count\" and \"layer_list\"");
  check(j["moe_layer_count"].is_number_integer() && j["moe_layer_count"].get<long long>() == moe_layers, name,
        ": moe_layer_count is ", j["moe_layer_count"].dump(), ", the model has ", moe_layers, " MoE layers");
  auto const& ll = j["layer_list"];
  check(ll.is_array() && static_cast<int>(ll.size()) == moe_layers, name, ": layer_list must hold ", moe_layers,
        " layers");
  int ranks = -1, S = -1;
  std::vector<std::vector<int>> rows;
  for (int l = 0; l < moe_layers; ++l) {
    std::string what = name + ": layer_list[" + std::to_string(l) + "]";
    auto const& layer = ll[static_cast<std::size_t>(l)];
    check(layer.is_object() && layer.contains("device_list") && layer["device_list"].is_array(), what,
          ": expected an object with a \"device_list\" array");
    auto const& dl = layer["device_list"];
    check(!dl.empty() && dl.size() <= static_cast<std::size_t>(core::limits::gpus), what, ": device_list has ",
          dl.size(), " devices");
    if (layer.contains("device_count"))
      check(layer["device_count"].is_number_integer() &&
                layer["device_count"].get<long long>() == static_cast<long long>(dl.size()),
            what, ": device_count ", layer["device_count"].dump(), " but device_list has ", dl.size(), " devices");
    if (ranks < 0) ranks = static_cast<int>(dl.size());
    check(static_cast<int>(dl.size()) == ranks, what, ": ", dl.size(), " devices, layer 0 has ", ranks);
    std::vector<int> row;
    for (int g = 0; g < ranks; ++g) {
      std::string dw = what + ".device_list[" + std::to_string(g) + "]";
      auto const& d = dl[static_cast<std::size_t>(g)];
      check(d.is_object() && d.contains("device_expert"), dw, ": missing \"device_expert\"");
      if (d.contains("device_id"))
        check(d["device_id"].is_number_integer() && d["device_id"].get<long long>() == g, dw, ": device_id ",
              d["device_id"].dump(), " out of order (expected ", g, ")");
      if (S < 0) {
        // A device may hold more slots than there are experts (two copies of one expert on it, as
        // EPLB places them); 4 x experts is SlotMap's bound.
        check(d["device_expert"].is_array() && !d["device_expert"].empty() &&
                  d["device_expert"].size() <= 4 * static_cast<std::size_t>(experts),
              dw, ".device_expert: expected 1..", 4LL * experts, " expert ids");
        S = static_cast<int>(d["device_expert"].size());
      }
      auto slots = detail::read_row(d["device_expert"], S, experts, dw + ".device_expert");
      row.insert(row.end(), slots.begin(), slots.end());
    }
    rows.push_back(std::move(row));
  }
  return detail::from_rows(rows, ranks, experts, name);
}

// ---------------------------------------------------------------------------------------------
// By format, to and from files
// ---------------------------------------------------------------------------------------------

inline void write(Format f, std::ostream& os, SlotMap const& m, LayerLayout const& ly) {
  switch (f) {
    case Format::sglang:
      write_sglang(os, m, ly);
      return;
    case Format::trtllm:
      write_trtllm(os, m, ly);
      return;
    case Format::vllm:
      write_vllm(os, m);
      return;
    case Format::vllm_ascend:
      write_vllm_ascend(os, m);
      return;
  }
}

inline void write(Format f, std::string const& path, SlotMap const& m, LayerLayout const& ly) {
  std::ostringstream os;
  write(f, os, m, ly);
  detail::write_text(path, os.str());
}

/// Reads a plan file of format `f` as the engine would for `ep_size` ranks and `experts` experts.
inline SlotMap read(Format f, std::istream& in, std::string const& name, LayerLayout const& ly, int ep_size,
                    int experts) {
  int moe_layers = ly.hidden_layers - ly.first_moe;
  check(moe_layers > 0 && ly.first_moe >= 0, name, ": no MoE layer in ", ly.hidden_layers, " hidden layers");
  switch (f) {
    case Format::sglang:
      return read_sglang(in, name, ly, ep_size, experts);
    case Format::trtllm:
      return read_trtllm(in, name, ly, ep_size, experts);
    case Format::vllm:
      return read_vllm(in, name, moe_layers, ep_size, experts);
    case Format::vllm_ascend: {
      auto m = read_vllm_ascend(in, name, moe_layers, experts);
      check(m.ranks() == ep_size, name, ": ", m.ranks(), " devices, expected ", ep_size);
      return m;
    }
  }
  fail("unreachable");
}

inline SlotMap read(Format f, std::string const& path, LayerLayout const& ly, int ep_size, int experts) {
  std::ifstream in(path);
  check(in.is_open(), "cannot open '", path, "' for reading");
  return read(f, in, path, ly, ep_size, experts);
}

}  // namespace moe::placement::engine
