// The FinDEP checks grid: for DeepSeek-V2 and Qwen3-235B shapes, sequences 1k-8k and several AG/EG
// splits, compares the solver's schedule with
//   - the best configuration of an exhaustive search over the same discrete space, scored by the
//     discrete-event simulator (target: solver within 2%), and
//   - the best PPPipe configuration (exhaustive in the simulator; target: never better than FinDEP).
// Prints one TSV row per grid point (docs/findep.md).
//
//   findep_grid [--models file.tsv] [--link-gbs B] [--memory-gb G] [--layers-deepseek L] [--layers-qwen L]
// Without --models the representative H100-class cluster models are used; --link-gbs replaces the
// A2E / E2A bandwidth (GB/s, the start-up cost is kept).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <limits>
#include <string>

#include "moe_tools/cli.hpp"
#include "moe/core/tsv.hpp"
#include "moe/models/models.hpp"
#include "moe/schedule/findep.hpp"

using namespace moe::schedule;

namespace {
int run(int argc, char** argv) {
  moe::tools::Args const args(argc, argv, {{"models"}, {"memory-gb"}, {"link-gbs"}, {"layers-deepseek"}, {"layers-qwen"}});
  if (args.help()) {
    std::printf("usage: findep_grid [--models file.tsv] [--link-gbs B] [--memory-gb G] [--layers-deepseek L] [--layers-qwen L]\n");
    return moe::tools::exit_ok;
  }
  PerfModels models = args.has("models") ? read_models(args.text("models")) : h100_cluster_reference();
  double memory_gb = args.number("memory-gb", 40, 1e-9, std::numeric_limits<double>::max());
  if (args.has("link-gbs")) {
    double gbs = args.number("link-gbs", 0, 1e-9, std::numeric_limits<double>::max());
    models[Op::a2e].beta = models[Op::e2a].beta = 1.0 / (gbs * 1e3);  // us per byte
    models.source += "; link " + args.text("link-gbs") + " GB/s";
  }
  // The paper's reduced models on testbeds C and D.
  int layers_ds = static_cast<int>(args.integer("layers-deepseek", 16, 1, moe::core::limits::layers));
  int layers_qw = static_cast<int>(args.integer("layers-qwen", 48, 1, moe::core::limits::layers));
  struct Model { char const* name; moe::ShapeSpec spec; int layers; };
  Model list[] = {{"DeepSeek-V2", moe::models::DeepSeekV2::spec, layers_ds},
                  {"Qwen3-235B", moe::models::Qwen3_235B_A22B::spec, layers_qw}};
  struct Split { int ag, eg; };
  std::printf("# models: %s; memory %.1f GB per AG rank; layers DeepSeek %d, Qwen %d\n", models.source.c_str(),
              memory_gb, layers_ds, layers_qw);
  std::printf("model\tseq\tag\teg\tM\tfindep\tfindep_tok_s\tsolver_us\tevals\texhaustive\texh_tok_s\texh_evals"
              "\tsolver_vs_exh\tpppipe\tpppipe_tok_s\tspeedup\n");
  double worst = 1e9, min_speed = 1e9, max_speed = 0;
  int fails = 0;
  for (auto const& mdl : list)
    for (int seq : {1024, 2048, 4096, 8192})
      for (Split s : {Split{4, 4}, Split{6, 2}, Split{2, 6}, Split{16, 16}}) {
        Problem p;
        p.shape = mdl.spec;
        p.ag = s.ag;
        p.eg = s.eg;
        p.seq = seq;
        p.layers = mdl.layers;
        p.memory_bytes = memory_gb * 1e9;
        auto t0 = std::chrono::steady_clock::now();
        Solution f = solve_findep(p, models);
        auto t1 = std::chrono::steady_clock::now();
        Solution ex = search_all(p, models, Pipeline::findep, Scorer::simulator);
        Solution pp = search_all(p, models, Pipeline::pppipe, Scorer::simulator);
        double sim_f = simulate(p, models, f.config).makespan;  // the solver's choice, re-scored
        double thr_f = tokens_of(p, f.config) / (sim_f * 1e-6);
        double ratio = thr_f / ex.throughput, speed = thr_f / pp.throughput;
        worst = std::min(worst, ratio);
        min_speed = std::min(min_speed, speed);
        max_speed = std::max(max_speed, speed);
        if (ratio < 0.98 || speed < 1 - 1e-12) ++fails;
        auto cfg = [](Config const& c) {
          return std::string(c.pipeline == Pipeline::pppipe ? "PP" : order_name(c.order)) + " r1=" +
                 std::to_string(c.r1) + " m_a=" + std::to_string(c.m_a) + " r2=" + std::to_string(c.r2);
        };
        std::printf("%s\t%d\t%d\t%d\t%lld\t%s\t%.1f\t%.1f\t%lld\t%s\t%.1f\t%lld\t%.4f\t%s\t%.1f\t%.3f\n", mdl.name,
                    seq, s.ag, s.eg, max_samples(p), cfg(f.config).c_str(), thr_f,
                    std::chrono::duration<double, std::micro>(t1 - t0).count(), f.evaluations,
                    cfg(ex.config).c_str(), ex.throughput, ex.evaluations, ratio, cfg(pp.config).c_str(),
                    pp.throughput, speed);
        std::fflush(stdout);
      }
  std::printf("# worst solver/exhaustive %.4f; FinDEP/PPPipe speedup %.3f-%.3f; failed checks %d\n", worst,
              min_speed, max_speed, fails);
  return fails == 0 ? moe::tools::exit_ok : moe::tools::exit_check;
}
}  // namespace

int main(int argc, char** argv) {
  return moe::tools::guarded_main("findep_grid", [&] { return run(argc, argv); });
}
