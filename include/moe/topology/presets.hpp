#pragma once
// Hardware presets: link parameters and cluster shapes of GPU clusters people deploy MoE models on,
// each number with the public document it comes from.
//
//   auto t = moe::topology::preset_topology("dgx-h100");      // one scalable unit: 32 x 8 GPUs
//   auto t = moe::topology::preset_topology("h800:40");       // NAME:SERVERS, here 40 nodes
//   auto const& p = moe::topology::preset("gb200-nvl72");     // the numbers themselves
//   for (auto n : moe::topology::preset_names()) ...
//
// What a preset describes, in the traffic model's terms (moe/topology/traffic.hpp):
//   - a server is one NVLink domain: a DGX / HGX node of 8 GPUs, or a whole GB200 NVL72 rack of 72;
//     `nvlink` is one GPU's NVLink bandwidth per direction (half the bidirectional figure the
//     datasheets quote);
//   - `nic` is the scale-out bandwidth per GPU: every preset has one 400 Gb/s NIC per GPU
//     (400 Gb/s = 50 GB/s per direction); the model gives a server's uplink nic x GPUs;
//   - the scale-out fabric is rail-optimised (or, for DeepSeek's H800 cluster, multi-plane): NIC i
//     of every server goes to rail (plane) i. The traffic model routes a server's traffic through
//     its NVLink switch to any of its NICs (as NCCL's PXN does) and splits flows evenly over equal
//     paths, so R rails of one NIC each carry exactly what one aggregated link of R NICs carries.
//     A preset therefore draws all rails of a group of servers as one leaf vertex, with one link per
//     server at nic x GPUs. Servers beyond one leaf's reach get more leaves, joined by `spines`
//     spine vertices; each spine vertex stands for a bundle of switches, sized non-blocking (a leaf's
//     uplinks carry what its servers can send: the fat-tree property, derived, not quoted). Only the
//     bundles' total matters to the model (equal split), so `spines` is a modelling choice that
//     sets how many equal paths SimGrid replays, not a switch count.
//   - latencies are the library's order-of-magnitude defaults (LinkParams{}): no cited document
//     gives per-hop latencies for these fabrics; override them where measurements exist.
//
// Sources (cited by short name next to each value below):
//   [V3]      DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437 (2024): section 3.1
//             (2048 H800 GPUs, 8 per node on NVLink + NVSwitch, InfiniBand between nodes), section
//             3.2.2 (all-to-all: "NVLink offers a bandwidth of 160 GB/s, roughly 3.2 times that of
//             IB (50 GB/s)", achieved per-GPU figures), section 3.4.2 (decoding deployment unit: 40
//             nodes, 320 GPUs).
//   [V3-HW]   Zhao et al. (DeepSeek-AI), "Insights into DeepSeek-V3: Scaling Challenges and
//             Reflections on Hardware for AI Architectures", ISCA 2025, arXiv:2505.09343: the H800
//             node (NVLink cut to 400 GB/s from the H100's 900 GB/s; eight 400 Gb/s InfiniBand
//             ConnectX-7 NICs per node) and the multi-plane two-layer fat-tree (one plane per NIC
//             position, 64-port 400 Gb/s InfiniBand switches).
//   [DGX-H100] NVIDIA DGX H100 datasheet and user guide: 8 H100 SXM5 GPUs, 18 NVLink 4 links per
//             GPU, 900 GB/s bidirectional GPU-to-GPU; 4 OSFP ports serving 8 single-port ConnectX-7
//             VPI NICs at up to 400 Gb/s InfiniBand / Ethernet, one per GPU.
//   [DGX-H200] NVIDIA DGX H200 datasheet: 8 H200 SXM GPUs (141 GB), NVLink 900 GB/s bidirectional
//             per GPU, the same 8 single-port ConnectX-7 400 Gb/s NICs. Every value the traffic model
//             uses equals DGX H100's (the difference, HBM size and bandwidth, is not modelled).
//   [SPOD]    NVIDIA DGX SuperPOD reference architecture (DGX H100 / H200): scalable unit (SU) of 32
//             DGX nodes; rail-optimised, non-blocking compute fabric of Quantum-2 QM9700 switches
//             (64 ports of 400 Gb/s NDR), one leaf per rail per SU.
//   [NVL72]   NVIDIA GB200 NVL72 specifications: 72 Blackwell GPUs and 36 Grace CPUs in one NVLink
//             domain, fifth-generation NVLink at 1.8 TB/s bidirectional per GPU (130 TB/s for the
//             rack); NVIDIA DGX GB200 datasheet: 72 single-port ConnectX-7 VPI NICs at 400 Gb/s
//             InfiniBand per rack, one per GPU; DGX SuperPOD with DGX GB200: SU of 8 racks.

#include <algorithm>
#include <charconv>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "moe/config.hpp"
#include "moe/topology/topology.hpp"

namespace moe::topology {

/// One hardware preset: the NVLink domain, the NIC per GPU, and how many servers one leaf (all
/// rails together) serves. See the header comment for what the fields mean in the traffic model.
struct Preset {
  std::string name;
  std::string summary;      ///< one line, for --help and reports
  int gpus_per_server = 0;  ///< GPUs of one NVLink domain
  int servers_per_leaf = 0;  ///< servers one (rail-aggregated) leaf serves
  int default_servers = 0;  ///< the size preset_topology(name) builds
  int spines = 0;           ///< spine vertices (bundles) joining the leaves, when there are several
  LinkParams links;         ///< nvlink, nic: per GPU; fabric: per leaf-spine bundle (non-blocking)

  /// The cluster of `servers` servers (0: default_servers): leaves filled in order, the last one
  /// possibly partly; spines only when there is more than one leaf. Throws moe::Error for a server
  /// count below 1 or one whose GPUs pass Topology::max_gpus.
  [[nodiscard]] Topology topology(int servers = 0) const {
    if (servers == 0) servers = default_servers;
    long long limit = Topology::max_gpus / gpus_per_server;
    check(servers >= 1 && servers <= limit, "hardware preset '", name, "': the server count must be in [1, ", limit,
          "] (", gpus_per_server, " GPUs each, at most ", Topology::max_gpus, " GPUs), got ", servers);
    int leaves = (servers + servers_per_leaf - 1) / servers_per_leaf;
    Topology t;
    std::vector<int> leaf;
    for (int l = 0; l < leaves; ++l) {
      leaf.push_back(t.add_switch("leaf" + std::to_string(l)));
      for (int s = l * servers_per_leaf; s < std::min(servers, (l + 1) * servers_per_leaf); ++s)
        t.add_link(t.add_server("server" + std::to_string(s), gpus_per_server), leaf.back());
    }
    if (leaves > 1)
      for (int k = 0; k < spines; ++k) {
        int sp = t.add_switch("spine" + std::to_string(k));
        for (int l : leaf) t.add_link(l, sp);
      }
    t.set_link_params(links);
    t.finalize();
    return t;
  }
};

namespace detail {
constexpr double kGbit = 1e9 / 8;  ///< bytes per second in one Gb/s
constexpr double kGB = 1e9;        ///< bytes per second in one GB/s

/// A preset whose leaf-spine bundles carry what the leaf's servers can send (non-blocking), split
/// over `spines` bundles; latencies: the library's defaults.
inline Preset make_preset(std::string name, std::string summary, int gpus, int per_leaf, int servers, int spines,
                          double nvlink_per_direction, double nic_per_gpu) {
  Preset p{std::move(name), std::move(summary), gpus, per_leaf, servers, spines, LinkParams{}};
  p.links.nvlink.bandwidth = nvlink_per_direction;
  p.links.nic.bandwidth = nic_per_gpu;
  p.links.fabric.bandwidth = nic_per_gpu * gpus * per_leaf / spines;
  return p;
}

inline std::vector<Preset> const& all_presets() {
  static std::vector<Preset> const presets = [] {
    std::vector<Preset> v;
    // DeepSeek's H800 cluster.
    //   8 GPUs per node: [V3] 3.1.
    //   NVLink 400 GB/s bidirectional -> 200 GB/s per direction: [V3-HW] (the H800's NVLink; [V3]
    //     3.2.2 reports 160 GB/s achieved in its all-to-all).
    //   NIC 400 Gb/s per GPU = 50 GB/s: [V3-HW] (eight 400 Gb/s ConnectX-7 per node); [V3] 3.2.2
    //     (IB 50 GB/s).
    //   32 nodes per leaf: a leaf of a two-layer fat-tree of 64-port switches gives half its ports
    //     to nodes ([V3-HW]: one plane per NIC position, so each node has one port per plane leaf).
    //   40 nodes by default: [V3] 3.4.2, the decoding deployment unit (320 GPUs).
    v.push_back(make_preset("h800", "DeepSeek's H800 cluster: 8 GPUs per node, NVLink 400 GB/s, 8 x 400 Gb/s IB per node, "
                            "multi-plane fat-tree; 40 nodes (the DeepSeek-V3 decoding unit)",
                            8, 32, 40, 2, 400 * kGB / 2, 400 * kGbit));
    // DGX H100.
    //   8 GPUs per node, NVLink 4 at 900 GB/s bidirectional -> 450 GB/s per direction: [DGX-H100].
    //   One ConnectX-7 at 400 Gb/s per GPU = 50 GB/s: [DGX-H100].
    //   32 nodes per SU, one leaf per rail per SU: [SPOD]. Default: one SU (256 GPUs).
    v.push_back(make_preset("dgx-h100", "NVIDIA DGX H100: 8 GPUs per node, NVLink 4 900 GB/s, 8 x 400 Gb/s ConnectX-7, "
                            "rail-optimised SuperPOD fabric; 32 nodes (one scalable unit)",
                            8, 32, 32, 2, 900 * kGB / 2, 400 * kGbit));
    // DGX H200: the same numbers from its own datasheet, [DGX-H200]; SU as [SPOD].
    v.push_back(make_preset("dgx-h200", "NVIDIA DGX H200: 8 GPUs per node, NVLink 4 900 GB/s, 8 x 400 Gb/s ConnectX-7, "
                            "rail-optimised SuperPOD fabric; 32 nodes (one scalable unit)",
                            8, 32, 32, 2, 900 * kGB / 2, 400 * kGbit));
    // GB200 NVL72.
    //   72 GPUs in one NVLink domain, NVLink 5 at 1.8 TB/s bidirectional -> 900 GB/s per
    //     direction: [NVL72] (72 x 1.8 TB/s = the rack's quoted 130 TB/s, rounded).
    //   One ConnectX-7 at 400 Gb/s per GPU = 50 GB/s: [NVL72] (DGX GB200).
    //   8 racks per SU: [NVL72] (SuperPOD with DGX GB200). Default: one SU (576 GPUs).
    v.push_back(make_preset("gb200-nvl72", "NVIDIA GB200 NVL72: 72 GPUs per rack in one NVLink 5 domain (1.8 TB/s per GPU), "
                            "72 x 400 Gb/s ConnectX-7 per rack, rail-optimised fabric; 8 racks (one scalable unit)",
                            72, 8, 8, 2, 1800 * kGB / 2, 400 * kGbit));
    return v;
  }();
  return presets;
}
}  // namespace detail

/// The names of every preset, in a fixed order.
inline std::vector<std::string_view> preset_names() {
  std::vector<std::string_view> out;
  for (auto const& p : detail::all_presets()) out.emplace_back(p.name);
  return out;
}

/// The preset called `name`; throws moe::Error naming it and every valid name when there is none.
inline Preset const& preset(std::string_view name) {
  for (auto const& p : detail::all_presets())
    if (p.name == name) return p;
  std::string known;
  for (auto n : preset_names()) known += (known.empty() ? "" : ", ") + std::string(n);
  fail("unknown hardware preset '", name, "' (known: ", known, ")");
}

/// A preset and a server count from "NAME" (the preset's default size) or "NAME:SERVERS".
struct PresetSpec {
  Preset const* preset = nullptr;
  int servers = 0;
};

/// Parses "NAME" or "NAME:SERVERS"; throws moe::Error for an unknown name or a bad count.
inline PresetSpec parse_preset(std::string_view spec) {
  auto colon = spec.find(':');
  PresetSpec out;
  out.preset = &preset(spec.substr(0, colon));
  out.servers = out.preset->default_servers;
  if (colon != std::string_view::npos) {
    long long limit = Topology::max_gpus / out.preset->gpus_per_server;
    std::string_view count = spec.substr(colon + 1);
    long long v = 0;
    auto [ptr, ec] = std::from_chars(count.data(), count.data() + count.size(), v);
    check(!count.empty() && ec != std::errc::invalid_argument && ptr == count.data() + count.size(), "hardware preset '",
          spec, "': server count: '", count, "' is not an integer");
    check(ec != std::errc::result_out_of_range && v >= 1 && v <= limit, "hardware preset '", spec, "': server count: ",
          count, " is outside [1, ", limit, "]");
    out.servers = static_cast<int>(v);
  }
  return out;
}

/// The cluster of a preset spec, "NAME" or "NAME:SERVERS", with its link parameters set.
inline Topology preset_topology(std::string_view spec) {
  auto s = parse_preset(spec);
  return s.preset->topology(s.servers);
}

}  // namespace moe::topology
