#pragma once
// Plan files: the expert -> GPU table of every MoE layer, with replicas, as written by the planner
// (tools/planner/moe_plan.cpp) and loaded into the Layer's placement and replica tables.
//
// Format (TSV, documented in docs/plan-format.md):
//   moe-plan <tab> 1 <tab> LAYERS <tab> EXPERTS <tab> GPUS
//   then LAYERS*EXPERTS lines in order l = 0.., e = 0..:
//   l <tab> e <tab> g_0 [<tab> g_1 ...]
// g_0 is the GPU of the expert's primary copy, g_1... the GPUs of its replicas (all distinct).

#include <algorithm>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "moe/config.hpp"
#include "moe/core/tsv.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/plan/replica_table.hpp"

namespace moe::placement {

struct LayerPlan {
  Table placement;
  replication::Table replicas;
};

inline constexpr char const* kPlanMagic = "moe-plan";

/// Writes a plan; every layer must pass validation for `experts` experts and `gpus` GPUs.
inline void write_plan(std::ostream& os, std::vector<LayerPlan> const& plan, int gpus) {
  check(!plan.empty(), "write_plan: no layers");
  int E = plan.front().placement.experts();
  for (auto const& lp : plan) {
    lp.placement.validate(E, gpus);
    lp.replicas.validate(E, gpus, lp.placement.ranks());
  }
  os << "# moe plan: layer expert primary_gpu [replica_gpus...]\n";
  os << kPlanMagic << '\t' << 1 << '\t' << plan.size() << '\t' << E << '\t' << gpus << '\n';
  for (std::size_t l = 0; l < plan.size(); ++l)
    for (int e = 0; e < E; ++e) {
      int primary = plan[l].placement.rank_of(e);
      os << l << '\t' << e << '\t' << primary;
      for (int g : plan[l].replicas.replicas()[static_cast<std::size_t>(e)])
        if (g != primary) os << '\t' << g;
      os << '\n';
    }
  check(static_cast<bool>(os), "write_plan: write failed");
}

inline void write_plan(std::string const& path, std::vector<LayerPlan> const& plan, int gpus) {
  std::ofstream f(path);
  check(f.is_open(), "cannot open '", path, "' for writing");
  write_plan(f, plan, gpus);
}

/// A plan without replicas from per-layer placement tables.
inline std::vector<LayerPlan> plan_without_replicas(std::vector<Table> const& tables) {
  std::vector<LayerPlan> out;
  for (auto const& t : tables) {
    std::vector<std::vector<int>> r;
    for (int g : t.ranks()) r.push_back({g});
    out.push_back({t, replication::Table(std::move(r))});
  }
  return out;
}

struct LoadedPlan {
  int gpus = 0;
  std::vector<LayerPlan> layers;
};

/// Reads a plan; throws moe::Error naming file:line for a malformed header or line, a missing,
/// repeated or out-of-order (layer, expert), a GPU outside [0, GPUS), a GPU listed twice, or a
/// truncated file. Every layer's tables pass Table::validate.
inline LoadedPlan read_plan(core::TsvReader& in) {
  check(in.next(), in.name(), ": empty plan file (expected a '", kPlanMagic, "' header)");
  check(in.is_header(kPlanMagic), in.where(), ": expected a '", kPlanMagic, "' header line, found '", in.field(0), "'");
  in.expect_fields(5);
  int version = in.get_int<int>(1, "version");
  check(version == 1, in.where(), ": unsupported plan version ", version);
  int L = in.get_int_in<int>(2, "layers", 1, core::limits::layers);
  int E = in.get_int_in<int>(3, "experts", 1, core::limits::experts);
  int G = in.get_int_in<int>(4, "gpus", 1, core::limits::gpus);
  LoadedPlan out;
  out.gpus = G;
  for (int l = 0; l < L; ++l) {
    // Grown line by line (not sized from the header), so a corrupt header with a huge expert count
    // is reported as a truncated file rather than allocated.
    std::vector<int> primary;
    std::vector<std::vector<int>> copies;
    for (int e = 0; e < E; ++e) {
      primary.push_back(-1);
      copies.emplace_back();
      check(in.next(), in.name(), ": truncated plan: expected layer ", l, " expert ", e, " after line ", in.line_number());
      check(in.size() >= 3, in.where(), ": expected at least 3 fields (layer expert gpu), found ", in.size());
      int fl = in.get_int<int>(0, "layer"), fe = in.get_int<int>(1, "expert");
      check(fl == l && fe == e, in.where(), ": expected layer ", l, " expert ", e, ", found layer ", fl, " expert ", fe);
      auto& c = copies[static_cast<std::size_t>(e)];
      for (std::size_t i = 2; i < in.size(); ++i) {
        int g = in.get_int<int>(i, "gpu");
        check(g >= 0 && g < G, in.where(), ": GPU ", g, " outside [0, ", G, ")");
        check(std::find(c.begin(), c.end(), g) == c.end(), in.where(), ": GPU ", g, " listed twice");
        c.push_back(g);
      }
      primary[static_cast<std::size_t>(e)] = c.front();
    }
    LayerPlan lp{Table(std::move(primary)), replication::Table(std::move(copies))};
    lp.placement.validate(E, G);
    lp.replicas.validate(E, G, lp.placement.ranks());
    out.layers.push_back(std::move(lp));
  }
  check(!in.next(), in.where(), ": unexpected extra line after ", static_cast<long long>(L) * E, " plan lines");
  return out;
}

inline LoadedPlan read_plan(std::string const& path) {
  core::TsvReader in(path);
  return read_plan(in);
}

}  // namespace moe::placement
