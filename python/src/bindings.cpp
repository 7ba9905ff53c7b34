// moe_compose._core: the nanobind bindings of moe-compose's planners (docs/engines.md, "Python").
//
// Every function takes C-contiguous CPU arrays of one dtype (the Python layer, moe_compose/_arrays.py,
// converts what it is given), copies what it needs with the GIL held, runs the planner with the GIL
// released, and returns NumPy arrays that own their memory. moe::Error becomes moe_compose.MoeError
// (a ValueError) carrying the library's message.
//
// All of the library's includes are here, in one place.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <moe/config.hpp>
#include <moe/interop/engine_plans.hpp>
#include <moe/placement/ilp.hpp>
#include <moe/placement/joint.hpp>
#include <moe/plan/plan_io.hpp>
#include <moe/plan/slot_map.hpp>
#include <moe/interop/engine_stats.hpp>
#include <moe/profile/load_profile.hpp>
#include <moe/replication/batch_split.hpp>
#include <moe/replication/craft.hpp>
#include <moe/replication/engine_slots.hpp>
#include <moe/replication/eplb.hpp>
#include <moe/replication/migration.hpp>
#include <moe/topology/topology.hpp>
#include <moe/topology/traffic.hpp>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using F32_2D = nb::ndarray<float const, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using F64_2D = nb::ndarray<double const, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using F64_3D = nb::ndarray<double const, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using I64_1D = nb::ndarray<int64_t const, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64_2D = nb::ndarray<int64_t const, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// Largest arrays the bindings build: 2^28 entries (1 GiB of int32), so that a mistyped size is a
// clear error, not an allocation the machine cannot back.
constexpr long long kMaxEntries = 1LL << 28;

void check_size(long long rows, long long cols, char const* what) {
  moe::check(rows > 0 && cols > 0, what, " must not be empty, got ", rows, " x ", cols);
  moe::check(rows * cols <= kMaxEntries, what, " has ", rows, " x ", cols, " entries, above the limit of ", kMaxEntries);
}

template <class T>
nb::object to_numpy(std::vector<T>&& v, std::initializer_list<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  std::vector<size_t> s(shape);
  return nb::cast(nb::ndarray<nb::numpy, T>(heap->data(), s.size(), s.data(), owner));
}

template <class T>
std::vector<int64_t> widen(std::vector<T> const& v) {
  return std::vector<int64_t>(v.begin(), v.end());
}

moe::replication::eplb::Matrix<float> matrix_f32(F32_2D const& a, char const* what) {
  long long r = static_cast<long long>(a.shape(0)), c = static_cast<long long>(a.shape(1));
  check_size(r, c, what);
  moe::replication::eplb::Matrix<float> m(static_cast<int>(r), static_cast<int>(c));
  std::memcpy(m.v.data(), a.data(), m.v.size() * sizeof(float));
  return m;
}

moe::replication::eplb::Matrix<int> matrix_i32(I64_2D const& a, char const* what, long long limit, long long lowest = 0) {
  long long r = static_cast<long long>(a.shape(0)), c = static_cast<long long>(a.shape(1));
  check_size(r, c, what);
  moe::replication::eplb::Matrix<int> m(static_cast<int>(r), static_cast<int>(c));
  int64_t const* d = a.data();
  for (std::size_t i = 0; i < m.v.size(); ++i) {
    moe::check(d[i] >= lowest && d[i] < limit, what, ": entry ", d[i], " at row ", static_cast<long long>(i) / c, ", column ",
               static_cast<long long>(i) % c, " is outside [", lowest, ", ", limit, ")",
               lowest < 0 ? " (-1 marks an empty slot)" : "");
    m.v[i] = static_cast<int>(d[i]);
  }
  return m;
}

void check_positive(long long x, char const* what) {
  moe::check(x > 0 && x <= (1LL << 24), what, " must be in [1, 2^24], got ", x);
}

/// (phy2log, log2phy, logcnt) as eplb.py returns them: int64, log2phy padded with -1 to the largest
/// copy count over all layers.
nb::tuple eplb_outputs(moe::replication::eplb::Matrix<int> const& phy2log, moe::replication::eplb::Matrix<int> const& phyrank,
                       moe::replication::eplb::Matrix<int> const& logcnt) {
  int L = phy2log.rows, P = phy2log.cols, E = logcnt.cols;
  int width = 1;
  for (int c : logcnt.v) width = std::max(width, c);
  std::vector<int64_t> l2p(static_cast<std::size_t>(L) * E * width, -1);
  for (int l = 0; l < L; ++l)
    for (int p = 0; p < P; ++p)
      l2p[(static_cast<std::size_t>(l) * E + static_cast<std::size_t>(phy2log(l, p))) * width +
          static_cast<std::size_t>(phyrank(l, p))] = p;
  size_t uL = static_cast<size_t>(L), uP = static_cast<size_t>(P), uE = static_cast<size_t>(E);
  return nb::make_tuple(to_numpy(widen(phy2log.v), {uL, uP}), to_numpy(std::move(l2p), {uL, uE, static_cast<size_t>(width)}),
                        to_numpy(widen(logcnt.v), {uL, uE}));
}

/// The rank of each slot's copy among its expert's slots, in slot order.
moe::replication::eplb::Matrix<int> slot_ranks(moe::replication::eplb::Matrix<int> const& phy2log, int experts) {
  moe::replication::eplb::Matrix<int> rank(phy2log.rows, phy2log.cols);
  std::vector<int> seen(static_cast<std::size_t>(experts));
  for (int l = 0; l < phy2log.rows; ++l) {
    std::fill(seen.begin(), seen.end(), 0);
    for (int p = 0; p < phy2log.cols; ++p) rank(l, p) = seen[static_cast<std::size_t>(phy2log(l, p))]++;
  }
  return rank;
}

nb::tuple eplb(F32_2D weight, long long num_replicas, long long num_groups, long long num_nodes, long long num_gpus,
               std::optional<bool> hierarchical, bool pack_sums_double) {
  auto w = matrix_f32(weight, "weight");
  check_positive(num_replicas, "num_replicas");
  check_positive(num_groups, "num_groups");
  check_positive(num_nodes, "num_nodes");
  check_positive(num_gpus, "num_gpus");
  moe::check(num_replicas >= w.cols, "num_replicas (", num_replicas, ") must be at least the number of experts (", w.cols, ")");
  check_size(w.rows, num_replicas, "phy2log");
  moe::replication::eplb::Result r;
  {
    nb::gil_scoped_release nogil;
    for (float x : w.v) moe::check(std::isfinite(x) && x >= 0, "eplb: load ", x, " is negative or not finite");
    bool hier = hierarchical ? *hierarchical : num_groups % num_nodes == 0;
    int groups = hier ? static_cast<int>(num_groups) : 1, nodes = hier ? static_cast<int>(num_nodes) : 1;
    // pack_sums_double: SGLang's deepseek.py, which sums the pack weights in Python floats.
    r = pack_sums_double
            ? moe::replication::eplb::rebalance_experts_hierarchical<double>(w, static_cast<int>(num_replicas), groups, nodes,
                                                                             static_cast<int>(num_gpus))
            : moe::replication::eplb::rebalance_experts_hierarchical(w, static_cast<int>(num_replicas), groups, nodes,
                                                                     static_cast<int>(num_gpus));
  }
  return eplb_outputs(r.phy2log, r.phyrank, r.logcnt);
}

nb::dict rebalance(F32_2D weight, I64_2D old_phy2log, long long num_gpus, double tolerance, long long max_copies_per_layer,
                   long long num_groups, long long num_nodes, long long candidate_gpus, long long hot_experts,
                   long long num_replicas) {
  auto w = matrix_f32(weight, "weight");
  check_positive(num_gpus, "num_gpus");
  check_positive(num_groups, "num_groups");
  check_positive(num_nodes, "num_nodes");
  check_positive(candidate_gpus, "candidate_gpus");
  check_positive(hot_experts, "hot_experts");
  moe::check(old_phy2log.shape(0) == static_cast<size_t>(w.rows), "old placement has ", old_phy2log.shape(0),
             " layers, the weights ", w.rows);
  // -1: an empty slot (vLLM's elastic scale-up pads the old map with it).
  auto old = matrix_i32(old_phy2log, "old placement", w.cols, -1);
  moe::check(num_replicas >= 0 && num_replicas <= (1LL << 24), "num_replicas must be in [0, 2^24], got ", num_replicas);
  if (num_replicas > 0) check_size(w.rows, num_replicas, "phy2log");
  moe::replication::migration::Options o;
  o.num_replicas = static_cast<int>(num_replicas);
  o.tolerance = tolerance;
  o.max_copies_per_layer = max_copies_per_layer;
  o.num_groups = static_cast<int>(num_groups);
  o.num_nodes = static_cast<int>(num_nodes);
  o.candidate_gpus = static_cast<int>(candidate_gpus);
  o.hot_experts = static_cast<int>(hot_experts);
  moe::replication::migration::Result r;
  moe::replication::eplb::Matrix<int> rank;
  {
    nb::gil_scoped_release nogil;
    r = moe::replication::migration::rebalance(w, old, static_cast<int>(num_gpus), o);
    rank = slot_ranks(r.phy2log, w.cols);
  }
  nb::dict d;
  auto t = eplb_outputs(r.phy2log, rank, r.logcnt);
  d["phy2log"] = t[0];
  d["log2phy"] = t[1];
  d["logcnt"] = t[2];
  std::vector<int64_t> tr;
  tr.reserve(r.transfers.size() * 5);
  for (auto const& x : r.transfers) tr.insert(tr.end(), {x.layer, x.slot, x.expert, x.src, x.dst});
  d["transfers"] = to_numpy(std::move(tr), {r.transfers.size(), 5});
  std::vector<int64_t> copies, fallback, steps, scattered;
  std::vector<double> mx, emx, omx, mean;
  for (auto const& s : r.layers) {
    copies.push_back(s.copies);
    scattered.push_back(s.scattered_groups);
    fallback.push_back(s.fallback);
    steps.push_back(s.steps);
    mx.push_back(s.max_load);
    emx.push_back(s.eplb_max_load);
    omx.push_back(s.old_max_load);
    mean.push_back(s.mean_load);
  }
  size_t L = r.layers.size();
  d["copies"] = to_numpy(std::move(copies), {L});
  d["fallback"] = to_numpy(std::move(fallback), {L});
  d["steps"] = to_numpy(std::move(steps), {L});
  d["max_load"] = to_numpy(std::move(mx), {L});
  d["eplb_max_load"] = to_numpy(std::move(emx), {L});
  d["old_max_load"] = to_numpy(std::move(omx), {L});
  d["mean_load"] = to_numpy(std::move(mean), {L});
  d["scattered_groups"] = to_numpy(std::move(scattered), {L});
  d["group_rule"] = r.group_rule;
  d["old_gpus"] = r.old_gpus;
  return d;
}

nb::dict transfer_time(moe::topology::Topology const& topo, I64_2D transfers, long long layers, double expert_bytes) {
  moe::check(transfers.shape(1) == 5, "transfers must be N x 5 (layer, slot, expert, src, dst), got N x ", transfers.shape(1));
  check_positive(layers, "layers");
  std::vector<moe::replication::migration::Transfer> tr(transfers.shape(0));
  int64_t const* d = transfers.data();
  for (std::size_t i = 0; i < tr.size(); ++i) {
    for (int k = 0; k < 5; ++k)
      moe::check(d[i * 5 + k] >= 0 && d[i * 5 + k] <= (1LL << 30), "transfers: row ", i, " column ", k, " holds ", d[i * 5 + k]);
    tr[i] = {static_cast<int>(d[i * 5]), static_cast<int>(d[i * 5 + 1]), static_cast<int>(d[i * 5 + 2]),
             static_cast<int>(d[i * 5 + 3]), static_cast<int>(d[i * 5 + 4])};
  }
  moe::replication::migration::TransferTime t;
  {
    nb::gil_scoped_release nogil;
    moe::topology::TrafficModel model(topo);
    t = moe::replication::migration::transfer_time(model, tr, static_cast<int>(layers), expert_bytes);
  }
  nb::dict out;
  out["seconds"] = t.seconds;
  out["bytes"] = t.bytes;
  out["inter_node_bytes"] = t.inter_node_bytes;
  size_t L = t.layer_seconds.size();
  out["layer_seconds"] = to_numpy(std::move(t.layer_seconds), {L});
  return out;
}

/// Copies of every expert of one layer of a slot map, with shares proportional to slots.
moe::topology::LayerCopies layer_copies(moe::replication::eplb::Matrix<int> const& m, int l, int experts, int gpus) {
  int P = m.cols, S = P / gpus;
  std::vector<std::vector<std::pair<int, int>>> per(static_cast<std::size_t>(experts));  // (gpu, slots)
  for (int p = 0; p < P; ++p) {
    auto& v = per[static_cast<std::size_t>(m(l, p))];
    int g = p / S;
    if (!v.empty() && v.back().first == g) ++v.back().second;
    else {
      auto it = std::find_if(v.begin(), v.end(), [&](auto const& x) { return x.first == g; });
      if (it != v.end()) ++it->second;
      else v.push_back({g, 1});
    }
  }
  moe::topology::LayerCopies c;
  for (int e = 0; e < experts; ++e) {
    auto const& v = per[static_cast<std::size_t>(e)];
    moe::check(!v.empty(), "plan: layer ", l, " has no slot for expert ", e);
    int total = 0;
    for (auto const& x : v) total += x.second;
    for (auto const& x : v) {
      c.copies.ranks.push_back(x.first);
      c.share.push_back(static_cast<double>(x.second) / total);
    }
    c.copies.first.push_back(static_cast<int>(c.copies.ranks.size()));
  }
  return c;
}

nb::dict evaluate_plan(moe::topology::Topology const& topo, I64_2D phy2log, F64_2D loads, long long hidden,
                       double bytes_per_element) {
  long long L = static_cast<long long>(loads.shape(0)), E = static_cast<long long>(loads.shape(1));
  check_size(L, E, "loads");
  moe::check(static_cast<long long>(phy2log.shape(0)) == L, "the plan has ", phy2log.shape(0), " layers, the loads ", L);
  auto m = matrix_i32(phy2log, "phy2log", E);
  int G = topo.gpus();
  moe::check(m.cols % G == 0, "the plan's ", m.cols, " slots do not split over the topology's ", G, " GPUs");
  check_positive(hidden, "hidden");
  std::vector<double> ld(loads.data(), loads.data() + L * E);
  std::vector<double> dt(static_cast<std::size_t>(L)), ct(static_cast<std::size_t>(L)), hb(static_cast<std::size_t>(L)),
      mx(static_cast<std::size_t>(L)), mean(static_cast<std::size_t>(L));
  {
    nb::gil_scoped_release nogil;
    moe::topology::TrafficModel model(topo);
    moe::topology::TrafficOptions opt;
    opt.hidden = static_cast<int>(hidden);
    opt.bytes_per_element = bytes_per_element;
    std::vector<int> att(static_cast<std::size_t>(G));
    for (int g = 0; g < G; ++g) att[static_cast<std::size_t>(g)] = g;
    for (int l = 0; l < L; ++l) {
      auto c = layer_copies(m, l, static_cast<int>(E), G);
      auto r = model.evaluate_expected(c, std::span<double const>(ld.data() + l * E, static_cast<std::size_t>(E)), att, opt);
      dt[static_cast<std::size_t>(l)] = r.dispatch_time;
      ct[static_cast<std::size_t>(l)] = r.combine_time;
      hb[static_cast<std::size_t>(l)] = r.hop_bytes;
      double s = 0, x = 0;
      for (double g : r.gpu_load) s += g, x = std::max(x, g);
      mx[static_cast<std::size_t>(l)] = x;
      mean[static_cast<std::size_t>(l)] = s / G;
    }
  }
  size_t uL = static_cast<size_t>(L);
  nb::dict d;
  d["dispatch_time"] = to_numpy(std::move(dt), {uL});
  d["combine_time"] = to_numpy(std::move(ct), {uL});
  d["hop_bytes"] = to_numpy(std::move(hb), {uL});
  d["max_gpu_load"] = to_numpy(std::move(mx), {uL});
  d["mean_gpu_load"] = to_numpy(std::move(mean), {uL});
  return d;
}

moe::profile::LoadProfile profile_from(F64_3D const& a) {
  long long B = static_cast<long long>(a.shape(0)), L = static_cast<long long>(a.shape(1)), E = static_cast<long long>(a.shape(2));
  moe::check(B > 0 && L > 0 && E > 0 && B * L * E <= kMaxEntries, "loads must be a non-empty batches x layers x experts array, got ",
             B, " x ", L, " x ", E);
  moe::profile::LoadProfile p(static_cast<int>(B), static_cast<int>(L), static_cast<int>(E));
  double const* d = a.data();
  for (long long i = 0; i < B * L * E; ++i)
    moe::check(std::isfinite(d[i]) && d[i] >= 0, "loads: entry ", i, " is ", d[i], "; loads must be finite and >= 0");
  for (int b = 0; b < B; ++b)
    for (int l = 0; l < L; ++l) std::copy(d + (b * L + l) * E, d + (b * L + l + 1) * E, p.row(b, l));
  return p;
}

nb::object profile_to_numpy(moe::profile::LoadProfile const& p) {
  std::vector<double> v = p.data();
  return to_numpy(std::move(v), {static_cast<size_t>(p.batches()), static_cast<size_t>(p.layers()), static_cast<size_t>(p.experts())});
}

/// Per layer, per expert, the GPUs holding a copy (Python lists) and the primary GPU ([L, E]).
nb::dict plan_out(std::vector<moe::placement::Table> const& prim, std::vector<moe::replication::Table> const& tabs, int E) {
  std::vector<int64_t> primary;
  nb::list copies;
  for (std::size_t l = 0; l < prim.size(); ++l) {
    nb::list layer;
    for (int e = 0; e < E; ++e) {
      primary.push_back(prim[l].rank_of(e));
      layer.append(nb::cast(tabs[l].replicas()[static_cast<std::size_t>(e)]));
    }
    copies.append(layer);
  }
  nb::dict d;
  d["primary"] = to_numpy(std::move(primary), {prim.size(), static_cast<size_t>(E)});
  d["copies"] = copies;
  return d;
}

nb::dict craft(F64_3D loads, long long gpus, long long replication_factor, long long threads) {
  auto prof = profile_from(loads);
  check_positive(gpus, "gpus");
  moe::check(replication_factor >= 0 && replication_factor <= (1 << 20), "replication_factor must be >= 0, got ", replication_factor);
  moe::check(threads >= 0 && threads <= 256, "threads must be in [0, 256], got ", threads);
  moe::replication::craft::Options o;
  o.replication_factor = static_cast<int>(replication_factor);
  o.threads = static_cast<int>(threads);
  moe::replication::craft::Plan p;
  {
    nb::gil_scoped_release nogil;
    p = moe::replication::craft::plan(prof, static_cast<int>(gpus), o);
  }
  auto d = plan_out(p.placement, p.tables, prof.experts());
  d["replication_factor"] = p.replication_factor;
  d["replicas"] = to_numpy(widen(p.replicas), {p.replicas.size()});
  return d;
}

nb::dict ilp_load(moe::topology::Topology const& topo, F64_2D loads, long long c_layer, long long c_exp) {
  long long L = static_cast<long long>(loads.shape(0)), E = static_cast<long long>(loads.shape(1));
  check_size(L, E, "loads");
  std::vector<double> w(loads.data(), loads.data() + L * E);
  for (double x : w) moe::check(std::isfinite(x) && x >= 0, "ilp_load: load ", x, " is negative or not finite");
  long long G = topo.gpus();
  if (c_layer <= 0) c_layer = std::max<long long>(1, (E + G - 1) / G);
  if (c_exp <= 0) c_exp = std::max((L * E + G - 1) / G + 6, L * c_layer);
  moe::check(c_layer <= (1LL << 24) && c_exp <= (1LL << 30), "ilp_load: capacities too large");
  moe::placement::ExactResult r;
  {
    nb::gil_scoped_release nogil;
    auto prob = moe::placement::make_problem(topo, static_cast<int>(L), static_cast<int>(E), static_cast<int>(c_layer),
                                             static_cast<int>(c_exp));
    r = moe::placement::ilp_load(prob, w);
  }
  nb::dict d;
  d["assignment"] = to_numpy(widen(r.assignment.gpu), {static_cast<size_t>(L), static_cast<size_t>(E)});
  d["objective"] = r.objective;
  d["c_layer"] = c_layer;
  d["c_exp"] = c_exp;
  return d;
}

nb::dict joint(moe::topology::Topology const& topo, F64_2D loads, long long slots_per_gpu, double eps) {
  long long L = static_cast<long long>(loads.shape(0)), E = static_cast<long long>(loads.shape(1));
  check_size(L, E, "loads");
  std::vector<double> w(loads.data(), loads.data() + L * E);
  for (double x : w) moe::check(std::isfinite(x) && x >= 0, "joint: load ", x, " is negative or not finite");
  moe::check(slots_per_gpu >= 0 && slots_per_gpu <= (1 << 20), "slots_per_gpu must be >= 0, got ", slots_per_gpu);
  moe::check(std::isfinite(eps) && eps >= 0, "eps must be >= 0, got ", eps);
  moe::placement::joint::Options o;
  o.slots_per_gpu = static_cast<int>(slots_per_gpu);
  o.eps = eps;
  moe::placement::joint::Result r;
  {
    nb::gil_scoped_release nogil;
    r = moe::placement::joint::plan(topo, w, static_cast<int>(L), static_cast<int>(E), o);
  }
  std::vector<moe::placement::Table> prim;
  std::vector<moe::replication::Table> tabs;
  std::vector<double> hops, ratio;
  for (std::size_t l = 0; l < r.plan.size(); ++l) {
    prim.push_back(r.plan[l].placement);
    tabs.push_back(r.plan[l].replicas);
    hops.push_back(r.stats[l].mean_hops);
    ratio.push_back(r.stats[l].max_load_ratio);
  }
  auto d = plan_out(prim, tabs, static_cast<int>(E));
  d["slots_per_gpu"] = r.slots_per_gpu;
  d["mean_hops"] = to_numpy(std::move(hops), {static_cast<size_t>(L)});
  d["max_load_ratio"] = to_numpy(std::move(ratio), {static_cast<size_t>(L)});
  return d;
}

/// A slot map (phy2log) from per-layer copy lists, as moe_plan writes engine files.
nb::object slot_map(std::vector<std::vector<std::vector<int>>> const& copies, long long gpus, long long slots_per_gpu,
                    F64_2D loads) {
  long long L = static_cast<long long>(copies.size());
  moe::check(L > 0, "slot_map: no layers");
  long long E = static_cast<long long>(copies.front().size());
  moe::check(static_cast<long long>(loads.shape(0)) == L && static_cast<long long>(loads.shape(1)) == E, "slot_map: loads are ",
             loads.shape(0), " x ", loads.shape(1), ", expected ", L, " x ", E);
  check_positive(gpus, "gpus");
  moe::check(slots_per_gpu >= 0 && slots_per_gpu <= (1 << 20), "slots_per_gpu must be >= 0, got ", slots_per_gpu);
  std::vector<moe::placement::LayerPlan> plan;
  for (long long l = 0; l < L; ++l) {
    auto const& layer = copies[static_cast<std::size_t>(l)];
    moe::check(static_cast<long long>(layer.size()) == E, "slot_map: layer ", l, " lists ", layer.size(), " experts, layer 0 ", E);
    std::vector<int> prim;
    for (long long e = 0; e < E; ++e) {
      auto const& c = layer[static_cast<std::size_t>(e)];
      moe::check(!c.empty(), "slot_map: layer ", l, " expert ", e, " has no copy");
      for (int g : c) moe::check(g >= 0 && g < gpus, "slot_map: layer ", l, " expert ", e, " on GPU ", g, ", outside [0, ", gpus, ")");
      prim.push_back(c.front());
    }
    plan.push_back({moe::placement::Table(std::move(prim)), moe::replication::Table(layer)});
  }
  std::vector<double> totals(loads.data(), loads.data() + L * E);
  moe::placement::SlotMap m;
  {
    nb::gil_scoped_release nogil;
    int S = slots_per_gpu > 0 ? static_cast<int>(slots_per_gpu) : moe::placement::min_slots_per_gpu(plan, static_cast<int>(gpus));
    m = moe::placement::slot_map_from_plan(plan, static_cast<int>(gpus), S, totals);
  }
  std::vector<int64_t> out;
  for (int l = 0; l < m.layers(); ++l)
    for (int e : m.physical_to_logical(l)) out.push_back(e);
  return to_numpy(std::move(out), {static_cast<size_t>(m.layers()), static_cast<size_t>(m.physical())});
}

nb::dict imported(moe::profile::engine::Imported const& imp) {
  nb::dict d;
  d["loads"] = profile_to_numpy(imp.loads);
  d["decoder_layers"] = to_numpy(widen(imp.decoder_layers), {imp.decoder_layers.size()});
  d["top_k"] = imp.top_k;
  return d;
}

moe::placement::SlotMap slot_map_of(I64_2D phy2log, long long gpus, long long experts) {
  check_positive(gpus, "num_gpus");
  check_positive(experts, "experts");
  auto m = matrix_i32(phy2log, "phy2log", experts);
  moe::check(m.cols % gpus == 0, "phy2log's ", m.cols, " slots do not split over ", gpus, " GPUs");
  moe::placement::SlotMap s(m.rows, static_cast<int>(gpus), static_cast<int>(m.cols / gpus), static_cast<int>(experts));
  for (int l = 0; l < m.rows; ++l)
    for (int p = 0; p < m.cols; ++p) s.at(l, p) = m(l, p);
  s.validate();
  return s;
}

/// The per-batch split of one layer (moe/replication/batch_split.hpp) over an engine's slots:
/// phy2log [P] names the expert of each slot, slots p*S .. p*S + S-1 on GPU p (S = P / num_gpus).
/// plan(counts) splits a batch; dispatch(rank, topk_ids) then gives each of that rank's pairs the
/// slot that serves it, in token order. Two slots of one expert on one GPU serve as one copy (the
/// first of them receives its pairs).
class SlotSplit {
public:
  SlotSplit(I64_1D phy2log, long long gpus, long long gpus_per_server, long long slack_permille) {
    slots_ = moe::replication::EngineSlots(std::span<int64_t const>(phy2log.data(), phy2log.shape(0)), gpus,
                                           gpus_per_server);
    G_ = slots_.gpus();
    E_ = slots_.experts();
    split_ = slots_.split(slack_permille);
  }

  [[nodiscard]] int gpus() const { return G_; }
  [[nodiscard]] int experts() const { return E_; }

  nb::dict plan(I64_2D counts) {
    moe::check(static_cast<long long>(counts.shape(0)) == G_ && static_cast<long long>(counts.shape(1)) == E_,
               "counts must be num_gpus x experts = ", G_, " x ", E_, ", got ", counts.shape(0), " x ", counts.shape(1));
    // Refused counts leave the last plan in force (dispatch still deals it); a split that fails
    // leaves none.
    int64_t const* d = counts.data();
    std::vector<std::int32_t> next(static_cast<std::size_t>(G_) * static_cast<std::size_t>(E_));
    for (std::size_t i = 0; i < next.size(); ++i) {
      moe::check(d[i] >= 0 && d[i] <= std::numeric_limits<std::int32_t>::max(), "counts[", i / static_cast<std::size_t>(E_),
                 "][", i % static_cast<std::size_t>(E_), "] = ", d[i], " is negative or above 2^31 - 1");
      next[i] = static_cast<std::int32_t>(d[i]);
    }
    // The GIL stays held: a split takes microseconds, and the object is not for concurrent calls.
    planned_ = false;
    auto out = split_.plan_batch(next);
    counts_.swap(next);
    planned_ = true;
    std::vector<int64_t> load(split_.load().begin(), split_.load().end());
    nb::dict r;
    r["max_load"] = out.max_load;
    r["local"] = out.local;
    r["same_server"] = out.same_server;
    r["load"] = to_numpy(std::move(load), {static_cast<size_t>(G_)});
    return r;
  }

  nb::object dispatch(long long rank, I64_2D topk_ids) {
    moe::check(planned_, "dispatch before plan: call plan(counts) with this batch's counts first");
    moe::check(rank >= 0 && rank < G_, "rank ", rank, " is outside [0, ", G_, ")");
    long long T = static_cast<long long>(topk_ids.shape(0)), K = static_cast<long long>(topk_ids.shape(1));
    moe::check(T * K <= kMaxEntries, "topk_ids has ", T, " x ", K, " entries, above the limit of ", kMaxEntries);
    int64_t const* d = topk_ids.data();
    auto n = static_cast<std::size_t>(T * K);
    std::vector<int> pairs;
    pairs.reserve(n);
    std::vector<long long> seen(static_cast<std::size_t>(E_), 0);
    for (std::size_t i = 0; i < n; ++i) {
      moe::check(d[i] >= -1 && d[i] < E_, "topk_ids[", i / static_cast<std::size_t>(K), "][", i % static_cast<std::size_t>(K),
                 "] = ", d[i], " is outside [0, ", E_, ") (-1 marks no expert)");
      if (d[i] < 0) continue;
      pairs.push_back(static_cast<int>(d[i]));
      ++seen[static_cast<std::size_t>(d[i])];
    }
    auto const* row = counts_.data() + static_cast<std::size_t>(rank) * static_cast<std::size_t>(E_);
    for (int e = 0; e < E_; ++e)
      moe::check(seen[static_cast<std::size_t>(e)] == row[e], "rank ", rank, "'s topk_ids hold ", seen[static_cast<std::size_t>(e)],
                 " pairs of expert ", e, ", the counts given to plan() ", row[e]);
    std::vector<int> serving(pairs.size());
    split_.deal(static_cast<int>(rank), pairs, serving);
    std::vector<int64_t> out(n);
    std::size_t j = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (d[i] < 0) {
        out[i] = -1;
        continue;
      }
      out[i] = slots_.slot_of(static_cast<int>(d[i]), serving[j++]);
    }
    return to_numpy(std::move(out), {static_cast<size_t>(T), static_cast<size_t>(K)});
  }

private:
  int G_ = 0, E_ = 0;
  moe::replication::EngineSlots slots_;
  std::vector<std::int32_t> counts_;
  bool planned_ = false;
  moe::replication::BatchSplit split_;
};
}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "moe-compose planners (C++ headers under include/moe), bound with nanobind";
  nb::exception<moe::Error>(m, "MoeError", PyExc_ValueError);

  m.def("eplb", &eplb, "weight"_a, "num_replicas"_a, "num_groups"_a, "num_nodes"_a, "num_gpus"_a,
        "hierarchical"_a = nb::none(), "pack_sums_double"_a = false,
        "EPLB (eplb.py's rebalance_experts): float32 [layers, experts] loads -> (phy2log, log2phy, logcnt), int64. "
        "hierarchical=None picks as eplb.py does (groups % nodes == 0). pack_sums_double: sum the pack weights in "
        "double, as SGLang's copy of eplb.py (deepseek.py) does, instead of float32 as eplb.py.");
  m.def("rebalance", &rebalance, "weight"_a, "old_phy2log"_a, "num_gpus"_a, "tolerance"_a = 0.01,
        "max_copies_per_layer"_a = -1, "num_groups"_a = 1, "num_nodes"_a = 1, "candidate_gpus"_a = 3, "hot_experts"_a = 2,
        "num_replicas"_a = 0,
        "Minimal-move rebalance (moe/replication/migration.hpp): new loads and the old slot layout -> dict with "
        "phy2log, log2phy, logcnt, transfers [N, 5] (layer, slot, expert, src, dst) and per-layer statistics.");
  m.def("transfer_time", &transfer_time, "topology"_a, "transfers"_a, "layers"_a, "expert_bytes"_a,
        "Modelled time of a transfer list on a topology (link-level traffic model): dict with seconds, layer_seconds, "
        "bytes, inter_node_bytes.");
  m.def("evaluate_plan", &evaluate_plan, "topology"_a, "phy2log"_a, "loads"_a, "hidden"_a = 7168, "bytes_per_element"_a = 2.0,
        "The traffic model's aggregate evaluation of a slot map per layer (tokens from every GPU, copies serving "
        "in proportion to their slots): dispatch and combine times, hop bytes, GPU loads.");
  m.def("craft", &craft, "loads"_a, "gpus"_a, "replication_factor"_a = 0, "threads"_a = 1,
        "CRAFT replication on a [batches, layers, experts] load profile.");
  m.def("ilp_load", &ilp_load, "topology"_a, "loads"_a, "c_layer"_a = 0, "c_exp"_a = 0,
        "ILPLoad placement (exact, min-cost flow) of [layers, experts] loads; capacities 0 = moe_plan's defaults.");
  m.def("joint", &joint, "topology"_a, "loads"_a, "slots_per_gpu"_a = 0, "eps"_a = 0.05,
        "The joint planner (replicas, placement and routing) on [layers, experts] loads.");
  m.def("slot_map", &slot_map, "copies"_a, "gpus"_a, "slots_per_gpu"_a, "loads"_a,
        "Engine slots (phy2log) from per-layer, per-expert GPU lists, as moe_plan writes them (0 = fewest slots).");

  m.def(
      "import_sglang_stat",
      [](std::string const& path, long long experts) {
        moe::profile::engine::Imported r;
        {
          nb::gil_scoped_release nogil;
          r = moe::profile::engine::import_sglang_stat(path, static_cast<int>(experts));
        }
        return imported(r);
      },
      "path"_a, "experts"_a = 0, "SGLang's expert distribution recorder dump (.pt, stat mode) -> dict(loads [passes, moe layers, E], decoder_layers).");
  m.def(
      "import_trtllm_stat",
      [](std::string const& dir, long long experts) {
        moe::profile::engine::Imported r;
        {
          nb::gil_scoped_release nogil;
          r = moe::profile::engine::import_trtllm_stat(dir, static_cast<int>(experts));
        }
        return imported(r);
      },
      "dir"_a, "experts"_a = 0, "TensorRT-LLM's expert statistic dump -> dict(loads [iterations, layers, E], decoder_layers, top_k).");
  m.def(
      "import_vllm_routed_experts",
      [](std::string const& path, long long experts) {
        moe::profile::engine::ImportedRoutes r;
        {
          nb::gil_scoped_release nogil;
          r = moe::profile::engine::import_vllm_routed_experts(path, static_cast<int>(experts));
        }
        nb::dict d;
        d["loads"] = profile_to_numpy(r.loads);
        d["tokens"] = r.tokens;
        return d;
      },
      "path"_a, "experts"_a, "vLLM routed experts (JSON) -> dict(loads [requests, layers, E], tokens).");
  m.def(
      "write_engine_plan",
      [](std::string const& format, std::string const& path, I64_2D phy2log, long long num_gpus, long long experts,
         long long hidden_layers, long long first_moe) {
        auto f = moe::placement::engine::parse_format(format);
        auto s = slot_map_of(phy2log, num_gpus, experts);
        if (hidden_layers <= 0) hidden_layers = first_moe + s.layers();
        moe::check(first_moe >= 0 && hidden_layers <= (1 << 20), "first_moe must be >= 0 and hidden_layers sane");
        moe::placement::engine::LayerLayout ly{static_cast<int>(hidden_layers), static_cast<int>(first_moe)};
        nb::gil_scoped_release nogil;
        moe::placement::engine::write(f, path, s, ly);
      },
      "format"_a, "path"_a, "phy2log"_a, "num_gpus"_a, "experts"_a, "hidden_layers"_a = 0, "first_moe"_a = 0,
      "Writes a slot map in an engine's plan format: sglang, trtllm, vllm or vllm-ascend (docs/engines.md).");
  m.def(
      "read_engine_plan",
      [](std::string const& format, std::string const& path, long long num_gpus, long long experts, long long hidden_layers,
         long long first_moe) {
        auto f = moe::placement::engine::parse_format(format);
        check_positive(num_gpus, "num_gpus");
        check_positive(experts, "experts");
        check_positive(hidden_layers, "hidden_layers");
        moe::check(first_moe >= 0 && first_moe < hidden_layers, "first_moe must be in [0, hidden_layers)");
        moe::placement::engine::LayerLayout ly{static_cast<int>(hidden_layers), static_cast<int>(first_moe)};
        moe::placement::SlotMap s;
        {
          nb::gil_scoped_release nogil;
          s = moe::placement::engine::read(f, path, ly, static_cast<int>(num_gpus), static_cast<int>(experts));
        }
        std::vector<int64_t> out;
        for (int l = 0; l < s.layers(); ++l)
          for (int e : s.physical_to_logical(l)) out.push_back(e);
        return to_numpy(std::move(out), {static_cast<size_t>(s.layers()), static_cast<size_t>(s.physical())});
      },
      "format"_a, "path"_a, "num_gpus"_a, "experts"_a, "hidden_layers"_a, "first_moe"_a = 0,
      "Reads an engine's plan file back into phy2log [moe layers, P], with the engine's load-time checks.");

  nb::class_<SlotSplit>(m, "SlotSplit", "The per-batch replica split of one layer over an engine's slots.")
      .def(nb::init<I64_1D, long long, long long, long long>(), "phy2log"_a, "num_gpus"_a, "gpus_per_server"_a,
           "slack_permille"_a = 0)
      .def_prop_ro("num_gpus", &SlotSplit::gpus)
      .def_prop_ro("experts", &SlotSplit::experts)
      .def("plan", &SlotSplit::plan, "counts"_a)
      .def("dispatch", &SlotSplit::dispatch, "rank"_a, "topk_ids"_a);

  nb::class_<moe::topology::Topology>(m, "Topology", "A cluster graph of servers and switches (moe/topology/topology.hpp).")
      .def_prop_ro("gpus", &moe::topology::Topology::gpus)
      .def_prop_ro("servers", &moe::topology::Topology::servers)
      .def(
          "server_of",
          [](moe::topology::Topology const& t, long long g) {
            moe::check(g >= 0 && g < t.gpus(), "GPU ", g, " outside [0, ", t.gpus(), ")");
            return t.server_of(static_cast<int>(g));
          },
          "gpu"_a)
      .def(
          "hops",
          [](moe::topology::Topology const& t, long long a, long long b) {
            moe::check(a >= 0 && a < t.gpus() && b >= 0 && b < t.gpus(), "GPUs ", a, " and ", b, " must be in [0, ", t.gpus(), ")");
            return t.hops(static_cast<int>(a), static_cast<int>(b));
          },
          "gpu_a"_a, "gpu_b"_a)
      .def("gpu_hops",
           [](moe::topology::Topology const& t) {
             auto G = static_cast<size_t>(t.gpus());
             return to_numpy(widen(t.gpu_hops()), {G, G});
           })
      .def("link_params",
           [](moe::topology::Topology const& t) {
             auto const& p = t.link_params();
             nb::dict d;
             d["nvlink"] = nb::make_tuple(p.nvlink.bandwidth, p.nvlink.latency);
             d["nic"] = nb::make_tuple(p.nic.bandwidth, p.nic.latency);
             d["fabric"] = nb::make_tuple(p.fabric.bandwidth, p.fabric.latency);
             return d;
           })
      .def(
          "set_link_params",
          [](moe::topology::Topology& t, std::pair<double, double> nvlink, std::pair<double, double> nic,
             std::pair<double, double> fabric) {
            t.set_link_params({{nvlink.first, nvlink.second}, {nic.first, nic.second}, {fabric.first, fabric.second}});
          },
          "nvlink"_a, "nic"_a, "fabric"_a, "(bandwidth bytes/s, latency s) per level")
      .def("write",
           [](moe::topology::Topology const& t) {
             std::ostringstream os;
             t.write(os);
             return os.str();
           })
      .def("__repr__", [](moe::topology::Topology const& t) {
        return "<moe_compose.Topology: " + std::to_string(t.gpus()) + " GPUs in " + std::to_string(t.servers()) + " servers>";
      });
  auto small = [](long long x, char const* what) {
    moe::check(x > 0 && x <= (1 << 16), what, " must be in [1, 65536], got ", x);
    return static_cast<int>(x);
  };
  m.def(
      "fat_tree",
      [small](long long leaves, long long spl, long long gps, long long spines) {
        return moe::topology::fat_tree(small(leaves, "leaves"), small(spl, "servers_per_leaf"), small(gps, "gpus_per_server"),
                                       small(spines, "spines"));
      },
      "leaves"_a, "servers_per_leaf"_a, "gpus_per_server"_a, "spines"_a = 4);
  m.def(
      "fat_tree_sparse",
      [small](long long leaves, long long spl, long long gps, long long pod) {
        return moe::topology::fat_tree_sparse(small(leaves, "leaves"), small(spl, "servers_per_leaf"),
                                              small(gps, "gpus_per_server"), small(pod, "pod_leaves"));
      },
      "leaves"_a, "servers_per_leaf"_a, "gpus_per_server"_a, "pod_leaves"_a = 4);
  m.def(
      "dragonfly",
      [small](long long leaves, long long spl, long long gps, long long groups) {
        return moe::topology::dragonfly(small(leaves, "leaves"), small(spl, "servers_per_leaf"), small(gps, "gpus_per_server"),
                                        small(groups, "groups"));
      },
      "leaves"_a, "servers_per_leaf"_a, "gpus_per_server"_a, "groups"_a = 4);
  m.def(
      "dragonfly_sparse",
      [small](long long leaves, long long spl, long long gps, long long groups) {
        return moe::topology::dragonfly_sparse(small(leaves, "leaves"), small(spl, "servers_per_leaf"),
                                               small(gps, "gpus_per_server"), small(groups, "groups"));
      },
      "leaves"_a, "servers_per_leaf"_a, "gpus_per_server"_a, "groups"_a = 4);
  m.def(
      "read_topology",
      [](std::string const& path) {
        nb::gil_scoped_release nogil;
        return moe::topology::read_topology(path);
      },
      "path"_a, "A topology file (docs/plan-format.md).");
  m.def(
      "paper_cluster",
      [](std::string const& kind) {
        using K = moe::topology::Kind;
        K k = kind == "fattree"            ? K::fat_tree
              : kind == "dragonfly"        ? K::dragonfly
              : kind == "fattree-sparse"   ? K::fat_tree_sparse
              : kind == "dragonfly-sparse" ? K::dragonfly_sparse
                                           : (moe::fail("unknown topology kind '", kind,
                                                        "' (fattree, dragonfly, fattree-sparse, dragonfly-sparse)"),
                                              K::fat_tree);
        return moe::topology::paper_cluster(k);
      },
      "kind"_a = "fattree", "The ILP paper's 256-GPU cluster.");
}
