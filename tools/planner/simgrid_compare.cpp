// simgrid_compare: the plans of joint_compare (joint_scenarios.hpp) judged twice on the same
// held-out batches: by the link-level traffic model (moe/topology/traffic.hpp) and by SimGrid's
// flow-level network model, which shares links among concurrent flows (simgrid_replay.hpp).
//
// Per scenario and plan, one layer's dispatch is replayed (every GPU pair's bytes, as the traffic
// model computes them, split evenly over every shortest path, all flows started together), then its
// combine (the same bytes back); SimGrid's time is from the start of a phase to the end of its
// last flow.
//
//   simgrid_compare                                   every scenario, held-out batches of 1024 tokens
//   simgrid_compare --scenario r1-fattree-256 --test-tokens 4096 --plans eplb,joint
//   simgrid_compare --scenario qwen3-235b-64 --paths first     (one path per pair, no split)
//   simgrid_compare --cfg=network/model:LV08                  (any SimGrid option; see below)
//
// Options: --scenario NAME, --plans LIST (names as printed; default all), --train-batches (20),
// --tokens (per training batch, 4096, as joint_compare), --test-tokens (per replayed batch, 1024),
// --test-batches (1), --replay-layers (1: layer 0 of each held-out batch; N: layers 0 .. N-1),
// --reactive off|greedy (greedy: add joint+reactive, default), --paths all|first, --explain on
// (per phase, on stderr: the link of the bound and when its last flow ended; the phase's last flow
// and the busiest link on its route), --preset NAME[:SERVERS] (the scenario's model on a hardware
// preset's cluster, moe/topology/presets.hpp: simgrid_compare --scenario r1-fattree-256 --preset h800).
// SimGrid options (--cfg=..., --log=...) pass through; unless given, the network model is CM02
// with TCP-gamma 0 and no cross-traffic (simgrid_replay::default_network_config) and SimGrid logs
// only warnings.
//
// Columns: model_us is the traffic model's dispatch + combine time (bottleneck transfer + the
// largest path latency, per phase); transfer_us its transfer part; bound_us a strict lower bound for
// SimGrid (per phase, max over links of bytes / bandwidth plus the smallest route latency among the
// flows on that link); simgrid_us SimGrid's dispatch + combine; ratio simgrid_us / model_us;
// link_diff_B the largest difference, over links and both phases, between the bytes of the
// platform's routes and the model's per-link bytes; extra_us what the model row also charges
// (reactive: the count all-gather, not replayed); flows the sub-flows per phase; wall_s the
// simulation's wall time. Averages over the replayed (batch, layer) pairs.

#include <simgrid/s4u.hpp>
#include <xbt/log.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "moe_tools/joint_scenarios.hpp"
#include "moe_tools/cli.hpp"
#include "moe_tools/simgrid_replay.hpp"

using namespace moe;
namespace sr = moe::simgrid_replay;

namespace {

/// One (plan, batch, layer) to replay, with the model's numbers for it.
struct Job {
  std::string scenario, plan;
  int gpus = 0;
  sr::Platform const* platform = nullptr;
  topology::TrafficModel const* model = nullptr;
  topology::Topology const* topo = nullptr;
  std::vector<sr::Demand> dispatch;
  topology::TrafficReport report;  ///< the model on the whole batch
  double extra_us = 0;
};

/// Per phase: max over links of bytes / bandwidth + the smallest route latency of the flows on it.
double strict_bound(sr::Routes const& r, std::vector<sr::SubFlow> const& flows) {
  auto const& model = r.model();
  std::vector<double> bytes(static_cast<std::size_t>(model.links()), 0.0), lat(bytes.size(), 1e300);
  for (auto const& f : flows) {
    r.path_of(f, [&](std::vector<int> const& links) {
      double l = 0;
      for (int li : links) l += model.link(li).latency;
      for (int li : links) {
        bytes[static_cast<std::size_t>(li)] += static_cast<double>(f.bytes);
        lat[static_cast<std::size_t>(li)] = std::min(lat[static_cast<std::size_t>(li)], l);
      }
    });
  }
  double b = 0;
  for (int i = 0; i < model.links(); ++i)
    if (bytes[static_cast<std::size_t>(i)] > 0)
      b = std::max(b, bytes[static_cast<std::size_t>(i)] / model.link(i).bandwidth + lat[static_cast<std::size_t>(i)]);
  return b;
}

/// Why a phase took what it took (--explain, on stderr): the link of the strict bound, when its last
/// flow ended in SimGrid, and the last flow of the phase with the busiest link on its route.
void explain_phase(std::string const& what, topology::Topology const& topo, sr::Routes const& r,
                   std::vector<sr::SubFlow> const& flows, std::vector<double> const& ends) {
  auto const& model = r.model();
  std::size_t L = static_cast<std::size_t>(model.links());
  std::vector<double> bytes(L, 0.0), lat(L, 1e300), last(L, 0.0);
  std::vector<int> count(L, 0);
  for (std::size_t i = 0; i < flows.size(); ++i)
    r.path_of(flows[i], [&](std::vector<int> const& links) {
      double l = 0;
      for (int li : links) l += model.link(li).latency;
      for (int li : links) {
        auto k = static_cast<std::size_t>(li);
        bytes[k] += static_cast<double>(flows[i].bytes);
        lat[k] = std::min(lat[k], l);
        last[k] = std::max(last[k], ends[i]);
        ++count[k];
      }
    });
  auto bound = [&](std::size_t k) { return bytes[k] > 0 ? bytes[k] / model.link(static_cast<int>(k)).bandwidth + lat[k] : 0.0; };
  auto name = [&](std::size_t k) {
    auto const& l = model.link(static_cast<int>(k));
    int V = model.vertices();
    auto node = [&](int n) { return n < V ? topo.vertex_name(n) : "gpu" + std::to_string(n - V); };
    return node(l.from) + "->" + node(l.to) + " (" + topology::level_name(l.level) + ")";
  };
  std::size_t top = 0;
  for (std::size_t k = 0; k < L; ++k)
    if (bound(k) > bound(top)) top = k;
  std::size_t tail = static_cast<std::size_t>(std::max_element(ends.begin(), ends.end()) - ends.begin());
  std::size_t tail_link = 0;
  double tail_lat = 0;
  r.path_of(flows[tail], [&](std::vector<int> const& links) {
    tail_link = static_cast<std::size_t>(links.front());
    for (int li : links) {
      tail_lat += model.link(li).latency;
      if (bound(static_cast<std::size_t>(li)) > bound(tail_link)) tail_link = static_cast<std::size_t>(li);
    }
  });
  std::fprintf(stderr,
               "%s: bound link %s: %d flows, %.0f B, bound %.2f us, its last flow ends %.2f us | last flow gpu%d->gpu%d "
               "(%llu B, route latency %.1f us) ends %.2f us; its route's busiest link %s: %d flows, bound %.2f us, last "
               "end %.2f us\n",
               what.c_str(), name(top).c_str(), count[top], bytes[top], bound(top) * 1e6, last[top] * 1e6, flows[tail].src,
               flows[tail].dst, static_cast<unsigned long long>(flows[tail].bytes), tail_lat * 1e6, ends[tail] * 1e6,
               name(tail_link).c_str(), count[tail_link], bound(tail_link) * 1e6, last[tail_link] * 1e6);
}

double max_diff(std::vector<double> const& a, std::vector<double> const& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}


int run(int argc, char** argv) {
  xbt_log_control_set("root.threshold:warning");
  simgrid::s4u::Engine engine(&argc, argv);  // takes --cfg= and --log= out of argv
  sr::default_network_config();

  tools::Args const args(argc, argv,
                         {{"scenario"}, {"plans"}, {"train-batches"}, {"tokens"}, {"test-tokens"}, {"test-batches"},
                          {"replay-layers"}, {"reactive"}, {"paths"}, {"explain"}, {"preset"}});
  if (args.help()) {
    std::printf("usage: simgrid_compare [--scenario NAME] [--plans LIST] [--preset NAME[:SERVERS]] [--train-batches N]\n"
                "                       [--tokens N] [--test-tokens N] [--test-batches N] [--replay-layers N]\n"
                "                       [--reactive off|greedy] [--paths all|first] [--explain on|off]   (docs/results/simgrid.md)\n");
    return tools::exit_ok;
  }
  auto geti = [&](char const* k, long long d, long long lo, long long hi) { return args.integer(k, d, lo, hi); };
  joint_scenarios::Setup su;
  su.train_batches = static_cast<int>(geti("train-batches", 20, 1, 100000));
  su.test_batches = static_cast<int>(geti("test-batches", 1, 1, 1000));
  su.tokens = static_cast<int>(geti("tokens", 4096, 1, 1 << 20));
  su.test_tokens = static_cast<int>(geti("test-tokens", 1024, 1, 1 << 20));
  int replay_layers = static_cast<int>(geti("replay-layers", 1, 1, core::limits::layers));
  std::string only = args.text("scenario");
  std::set<std::string> plans_wanted;
  if (args.has("plans"))
    for (auto const& p : args.list("plans", "")) plans_wanted.insert(p);
  std::string reactive = args.choice("reactive", "greedy", {"off", "greedy"});
  bool split = args.choice("paths", "all", {"all", "first"}) == "all";
  bool explain = args.on_off("explain", false);
  std::set<std::string> plans_seen;

  // Everything is built before the simulation starts: scenarios, plans, demands, platforms.
  struct Cluster {
    joint_scenarios::Scenario sc;
    std::unique_ptr<topology::TrafficModel> model;
    std::unique_ptr<sr::Routes> routes;
    std::unique_ptr<sr::Platform> platform;
  };
  std::deque<Cluster> clusters;
  std::vector<Job> jobs;
  auto* root = simgrid::s4u::create_full_zone("moe");
  bool any = false;
  for (auto& sc0 : joint_scenarios::all_scenarios()) {
    if (!only.empty() && sc0.name != only) continue;
    any = true;
    auto& c = clusters.emplace_back();
    c.sc = std::move(sc0);
    auto& sc = c.sc;
    if (args.has("preset")) joint_scenarios::use_preset(sc, args.text("preset"));  // the model on a preset cluster
    auto data = joint_scenarios::make_data(sc, su);
    c.model = std::make_unique<topology::TrafficModel>(sc.topo);
    topology::TrafficOptions to;
    to.hidden = sc.hidden;
    auto built = joint_scenarios::make_plans(sc, data, *c.model, to, reactive == "greedy");
    std::set<std::pair<int, int>> pairs;
    std::size_t first_job = jobs.size();
    for (auto const& plan : built.plans) {
      plans_seen.insert(plan.name);
      if (!plans_wanted.empty() && plans_wanted.count(plan.name) == 0) continue;
      for (int b = 0; b < su.test_batches; ++b)
        for (int l = 0; l < std::min(replay_layers, sc.layers); ++l) {
          auto const& batch = data.test[static_cast<std::size_t>(b)][static_cast<std::size_t>(l)];
          auto eval = plan.prepare(l, batch);
          Job j;
          j.scenario = sc.name;
          j.plan = plan.name;
          j.gpus = sc.topo.gpus();
          j.model = c.model.get();
          j.topo = &sc.topo;
          j.report = eval(batch, 0);
          j.dispatch = sr::pair_demand(*c.model, batch, eval);
          j.extra_us = plan.extra_us;
          for (auto const& d : j.dispatch) {
            pairs.insert({d.src, d.dst});
            pairs.insert({d.dst, d.src});
          }
          jobs.push_back(std::move(j));
        }
    }
    auto t0 = std::chrono::steady_clock::now();
    c.routes = std::make_unique<sr::Routes>(*c.model, sc.topo);
    c.platform = std::make_unique<sr::Platform>(root, sc.name, *c.routes,
                                                [&pairs](int a, int b) { return pairs.count({a, b}) > 0; });
    std::fprintf(stderr, "%s: platform with %d GPUs x %d ports, %d links, routes for %zu GPU pairs built in %.2f s\n",
                 sc.name.c_str(), sc.topo.gpus(), c.routes->ports(), c.model->links(), pairs.size(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (std::size_t i = first_job; i < jobs.size(); ++i) jobs[i].platform = c.platform.get();
  }
  check(any, "unknown scenario '", only, "'");
  for (auto const& p : plans_wanted) {
    std::string known;
    for (auto const& q : plans_seen) known += (known.empty() ? "" : ", ") + q;
    check(plans_seen.count(p) != 0, "--plans: no plan '", p, "' (known: ", known, ")");
  }
  check(!jobs.empty(), "no plan matches --plans");
  root->seal();

  std::printf("scenario\tgpus\tplan\tmodel_us\ttransfer_us\tbound_us\tsimgrid_us\tratio\tsimgrid_dispatch_us\tsimgrid_combine_us\tlink_diff_B\textra_us\tflows\twall_s\n");
  std::fflush(stdout);
  simgrid::s4u::Actor::create("replay", clusters.front().platform->host(0, 0), [&] {
    for (std::size_t i = 0; i < jobs.size();) {
      // The replayed (batch, layer) pairs of one plan, averaged into one row.
      std::size_t end = i;
      while (end < jobs.size() && jobs[end].scenario == jobs[i].scenario && jobs[end].plan == jobs[i].plan) ++end;
      double model_us = 0, transfer_us = 0, bound_us = 0, disp_us = 0, comb_us = 0, diff = 0, flows = 0;
      auto w0 = std::chrono::steady_clock::now();
      for (std::size_t k = i; k < end; ++k) {
        auto const& j = jobs[k];
        auto const& p = *j.platform;
        auto const& r = p.routes();
        auto combine = sr::reversed(j.dispatch);
        auto fd = r.sub_flows(j.dispatch, split), fc = r.sub_flows(combine, split);
        diff = std::max({diff, max_diff(r.link_bytes(fd), j.report.dispatch_bytes),
                         max_diff(r.link_bytes(fc), j.report.combine_bytes)});
        model_us += (j.report.dispatch_time + j.report.combine_time) * 1e6;
        transfer_us += (j.report.dispatch_transfer + j.report.combine_transfer) * 1e6;
        bound_us += (strict_bound(r, fd) + strict_bound(r, fc)) * 1e6;
        std::vector<double> ends;
        disp_us += p.replay(fd, explain ? &ends : nullptr) * 1e6;
        if (explain) explain_phase(j.scenario + " " + j.plan + " dispatch", *j.topo, r, fd, ends);
        comb_us += p.replay(fc, explain ? &ends : nullptr) * 1e6;
        if (explain) explain_phase(j.scenario + " " + j.plan + " combine", *j.topo, r, fc, ends);
        flows += static_cast<double>(fd.size());
      }
      double n = static_cast<double>(end - i);
      double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
      double sg = (disp_us + comb_us) / n;
      std::printf("%s\t%d\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.4f\t%.2f\t%.2f\t%.0f\t%.1f\t%.0f\t%.1f\n", jobs[i].scenario.c_str(),
                  jobs[i].gpus, jobs[i].plan.c_str(), model_us / n, transfer_us / n, bound_us / n, sg, sg / (model_us / n),
                  disp_us / n, comb_us / n, diff, jobs[i].extra_us, flows / n, wall);
      std::fflush(stdout);
      i = end;
    }
  });
  engine.run();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return moe::tools::guarded_main("simgrid_compare", [&] { return run(argc, argv); });
}
