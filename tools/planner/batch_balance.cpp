// batch_balance: what the per-batch replica split (replication::BatchSplit) is worth against the
// fixed rule (replication::Table::choose) and replication::Reactive, on plans made from earlier
// batches and batches measured after a drift. Writes one TSV row per (model, plan, drift, tokens
// per rank): max/mean of the pairs the ranks receive (averaged over the measured batches) for the
// fixed rule, the split, the LP optimum and Reactive, and the modelled all-to-all time (dispatch +
// combine, traffic model of moe/topology/traffic.hpp, the split and Reactive charged the all-gather
// of per-expert counts) on the model's hardware preset.
//
// Cases (all seeded; docs/results/batch-balance.md):
//   olmoe    OLMoE-1B-7B layer 7 (64 experts, top-8), 16 ranks on preset h800:2, 80 slots.
//            Earlier batches: tokens drawn from one half of the real arxiv token -> expert counts
//            (profile::TokenSampler; real co-activation). Measured: tokens from the other half
//            (drift none), from github (domain switch), or from the arxiv marginal x U(1 +- d) per
//            expert (+-25 %, +-50 %; independent draws, no co-activation).
//   mixtral  Mixtral-8x7B layer 7 (8 experts, top-2), 8 ranks on preset h800:1, 16 slots; the same.
//   dsv3     DeepSeek-V3 shape (256 experts, top-8), 32 ranks on preset h800:4 (4 servers of 8),
//            288 slots. Synthetic marginal with the skew of the real data: each OLMoE arxiv layer-7
//            expert load stands for 4 experts, each x exp(0.3 N(0,1)) (seed 21). Earlier batches and
//            measured ones are drawn from it (the measured after a drift none, +-25 %, +-50 %).
// Plans: EPLB (replication::eplb, the slots above) and the joint planner (placement::joint with
// the same slots per rank) from the earlier batches' loads.
// LP optimum: the least possible max load with fractional splits, rounded up; BatchSplit reaches
// it exactly (tests/planners/test_batch_split.cpp checks that against GLPK), so it is the split's.
//
//   batch_balance [--batches N] [--sizes 16,64,256,4096] [--models olmoe,mixtral,dsv3]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "moe/placement/joint.hpp"
#include "moe/topology/traffic.hpp"
#include "moe_tools/cli.hpp"
#include "moe_tools/dealt_routes.hpp"
#include "moe/profile/olmoe_tokens.hpp"
#include "moe/profile/route_split.hpp"
#include "moe/profile/token_batches.hpp"
#include "moe/replication/batch_split.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/replication/reactive.hpp"
#include "moe/topology/presets.hpp"
#include "moe_tools/reactive_study.hpp"

using namespace moe;

namespace {

constexpr int kLayer = 7;

struct Model {
  std::string name, preset;
  int experts = 0, top_k = 0, slots = 0, hidden = 0;
  bool real = false;                   ///< tokens from the real data (olmoe, mixtral)
  std::string data;                    ///< folder under olmoe-routing/
  std::vector<double> marginal;        ///< the earlier batches' marginal (synthetic models and drifts)
  profile::RouteProfile fit, held, other;  ///< real data: arxiv halves, github
};

profile::RouteProfile read_domain(std::string const& model_dir, std::string const& domain, int experts, int k) {
  profile::RouteRecorder rec(experts, k);
  core::TsvReader in(std::string(MOE_DATA_DIR) + "/olmoe-routing/" + model_dir + "/" + domain +
                     "/token_expert_counts.tsv");
  profile::load_token_expert_counts(in, rec, [](int l) { return l == kLayer; });
  return rec.profile();
}

std::vector<double> loads_of(profile::RouteProfile const& p) {
  auto v = p.layer(kLayer).expert_load();
  return {v.begin(), v.end()};
}

Model make_model(std::string const& name) {
  Model m;
  m.name = name;
  if (name == "olmoe" || name == "mixtral") {
    bool o = name == "olmoe";
    m.preset = o ? "h800:2" : "h800:1";
    m.experts = o ? 64 : 8, m.top_k = o ? 8 : 2, m.slots = o ? 80 : 16, m.hidden = o ? 2048 : 4096;
    m.real = true;
    m.data = o ? "olmoe-1b-7b" : "mixtral-8x7b";
    auto arxiv = read_domain(m.data, "arxiv", m.experts, m.top_k);
    auto [fit, held] = profile::split_profile(arxiv, 0.5, 5);
    m.fit = std::move(fit), m.held = std::move(held);
    m.other = read_domain(m.data, "github", m.experts, m.top_k);
    m.marginal = loads_of(m.fit);
  } else if (name == "dsv3") {
    m.preset = "h800:4";
    m.experts = 256, m.top_k = 8, m.slots = 288, m.hidden = 7168;
    auto base = loads_of(read_domain("olmoe-1b-7b", "arxiv", 64, 8));
    profile::Rng rng(21);
    for (int e = 0; e < 256; ++e) m.marginal.push_back(base[static_cast<std::size_t>(e / 4)] * std::exp(0.3 * rng.normal()));
  } else {
    fail("unknown model '", name, "' (olmoe, mixtral, dsv3)");
  }
  return m;
}

/// `tokens` tokens, top-k distinct experts each, drawn in proportion to `w`.
void draw(std::vector<double> const& w, int k, int tokens, std::mt19937_64& rng, std::vector<int>& out) {
  std::discrete_distribution<int> pick(w.begin(), w.end());
  for (int t = 0; t < tokens; ++t) {
    int row[16];
    for (int j = 0; j < k;) {
      int e = pick(rng);
      bool dup = false;
      for (int q = 0; q < j; ++q) dup |= row[q] == e;
      if (dup) continue;
      row[j++] = e;
      out.push_back(e);
    }
  }
}

/// One measured batch: per rank, its tokens' experts (token order).
std::vector<std::vector<int>> measured(Model const& m, std::string const& drift, int G, int tokens, std::uint64_t seed) {
  std::vector<std::vector<int>> ids(static_cast<std::size_t>(G));
  if (m.real && (drift == "none" || drift == "domain")) {
    profile::TokenSampler s(drift == "none" ? m.held : m.other, kLayer);
    profile::Rng rng(seed);
    for (auto& v : ids) s.sample(tokens, rng, v);
    return ids;
  }
  double d = drift == "25" ? 0.25 : drift == "50" ? 0.5 : 0.0;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(1 - d, 1 + d);
  auto w = m.marginal;
  for (auto& x : w) x *= u(rng);
  for (auto& v : ids) draw(w, m.top_k, tokens, rng, v);
  return ids;
}

struct Plan {
  std::string name;
  std::vector<std::vector<int>> copies;
  std::vector<int> primary;
};

std::vector<Plan> make_plans(Model const& m, topology::Topology const& topo) {
  int G = topo.gpus(), E = m.experts;
  // the earlier batches: 8 batches of G x 1024 tokens (real: from the fit half; else the marginal)
  std::vector<double> loads(static_cast<std::size_t>(E), 0.0);
  std::vector<int> ids;
  if (m.real) {
    profile::TokenSampler s(m.fit, kLayer);
    profile::Rng rng(7);
    s.sample(8 * G * 1024, rng, ids);
  } else {
    std::mt19937_64 rng(7);
    draw(m.marginal, m.top_k, 8 * G * 1024, rng, ids);
  }
  for (int e : ids) loads[static_cast<std::size_t>(e)] += 1;
  std::vector<Plan> out;
  auto er = replication::eplb::rebalance_experts(loads, 1, E, m.slots, 1, topo.servers(), G);
  auto lt = replication::eplb::layer_tables(er, 0);
  out.push_back({"eplb", lt.replicas.replicas(), lt.placement.ranks()});
  placement::joint::Options jo;
  jo.slots_per_gpu = m.slots / G;
  auto jr = placement::joint::plan(topo, loads, 1, E, jo);
  out.push_back({"joint", jr.plan[0].replicas.replicas(), jr.plan[0].placement.ranks()});
  return out;
}

double max_over_mean(std::vector<double> const& load) {
  double mx = 0, sum = 0;
  for (double x : load) mx = std::max(mx, x), sum += x;
  return sum > 0 ? mx / (sum / static_cast<double>(load.size())) : 1.0;
}

std::vector<std::string> split_list(std::string const& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');) out.push_back(x);
  return out;
}

int run(int argc, char** argv) {
  int batches = 3;
  std::vector<std::string> models{"olmoe", "mixtral", "dsv3"};
  std::vector<int> sizes{16, 64, 256, 4096};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    check(i + 1 < argc, a, " needs a value");
    std::string v = argv[++i];
    if (a == "--batches") {
      batches = static_cast<int>(tools::parse_int(v, "--batches", 1, 1000));
    } else if (a == "--models") {
      models = split_list(v);
    } else if (a == "--sizes") {
      sizes.clear();
      for (auto const& x : split_list(v)) sizes.push_back(static_cast<int>(tools::parse_int(x, "--sizes", 1, 1 << 16)));
    } else {
      fail("unknown option ", a, " (--batches N, --models a,b, --sizes n,m)");
    }
  }
  std::printf("model\tplan\tdrift\ttokens_per_rank\tfixed\tsplit\tlp\treactive\tfixed_us\tsplit_us\treactive_us\tallgather_us\n");
  for (auto const& name : models) {
    auto m = make_model(name);
    auto topo = topology::preset_topology(m.preset);
    int G = topo.gpus(), E = m.experts;
    topology::TrafficModel model(topo);
    topology::TrafficOptions to;
    to.hidden = m.hidden;
    double gather_us = study::count_allgather_us(model, E);
    std::vector<std::string> drifts{"none", "25", "50"};
    if (m.real) drifts.push_back("domain");
    for (auto const& plan : make_plans(m, topo)) {
      replication::Table table(plan.copies);
      replication::BatchSplit split(plan.copies, topo);
      replication::Reactive reactive(plan.copies, topo);
      for (auto const& drift : drifts)
        for (int tokens : sizes) {
          double fx = 0, sp = 0, lp = 0, re = 0, fus = 0, sus = 0, rus = 0;
          for (int b = 0; b < batches; ++b) {
            std::uint64_t seed = 1000003ULL * static_cast<std::uint64_t>(b + 1) + static_cast<std::uint64_t>(tokens);
            auto ids = measured(m, drift, G, tokens, seed);
            topology::Batch batch;
            batch.top_k = m.top_k;
            for (int r = 0; r < G; ++r) {
              batch.experts.insert(batch.experts.end(), ids[static_cast<std::size_t>(r)].begin(),
                                   ids[static_cast<std::size_t>(r)].end());
              batch.source.insert(batch.source.end(), static_cast<std::size_t>(tokens), r);
            }
            auto counts = replication::reactive::pair_counts(batch, G, E);
            // the fixed rule, with the layer's token index (a rank's tokens are a contiguous block)
            auto f = model.evaluate_policy(table, plan.primary, batch, to);
            auto out = split.plan_batch(counts);
            replication::reactive::PairRoutes sr{m.top_k, &batch.experts, tools::dealt_routes(split, batch, G, E)};
            auto s = model.evaluate_policy(sr, plan.primary, batch, to);
            reactive.plan_batch(counts);
            auto rr = reactive.deal(batch);
            auto r = model.evaluate_policy(rr, plan.primary, batch, to);
            double mean = static_cast<double>(tokens) * m.top_k;
            fx += max_over_mean(f.gpu_load), sp += max_over_mean(s.gpu_load), re += max_over_mean(r.gpu_load);
            lp += static_cast<double>(out.max_load) / mean;
            fus += f.time() * 1e6, sus += s.time() * 1e6 + gather_us, rus += r.time() * 1e6 + gather_us;
          }
          double n = batches;
          std::printf("%s\t%s\t%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.1f\t%.1f\t%.1f\t%.1f\n", name.c_str(), plan.name.c_str(),
                      drift.c_str(), tokens, fx / n, sp / n, lp / n, re / n, fus / n, sus / n, rus / n, gather_us);
          std::fflush(stdout);
        }
    }
  }
  return tools::exit_ok;
}

}  // namespace

// The exit statuses of every tool (tools/include/moe_tools/cli.hpp, docs/planners.md): 2 for a bad
// command line, 3 for anything else.
int main(int argc, char** argv) {
  return tools::guarded_main("batch_balance", [&] { return run(argc, argv); });
}
