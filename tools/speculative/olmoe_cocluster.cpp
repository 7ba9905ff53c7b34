// The OLMoE s-EG / s-TS experiment: fit predictors and co-clusterings on some domains of the real
// OLMoE-1B-7B routing statistics (shared/data/olmoe-routing), evaluate on a held-out domain.
//
//   olmoe_cocluster [--data DIR] [--train arxiv,book] [--eval github] [--devices 8]
//                   [--layers 0,7,15] [--seed 1] [--iterations 30] [--samples 16]
//                   [--polish 2] [--final-polish 10] [--elite 0.2] [--smoothing 0.7]
//                   [--balance-weight 0] [--fit-gamma 1.1] [--cap 1.1] [--fallback modulo|prior]
//                   [--methods contiguous,metis,metis+refine,kmeans,ce-plain,ce] [--split F] [--out DIR]
//
// --out DIR: write the cross-entropy result of each layer L as DIR/experts-layer<L>.plan.tsv (a
// one-layer plan file, moe/plan/plan_io.hpp) and DIR/token-table-layer<L>.tsv (table_io.hpp).
// --split F: instead of a held-out domain, fit on a seeded share F of the --train domains'
// occurrences and evaluate on the rest (simulated split of the aggregated counts, route_split.hpp).
// --fit-gamma G: the balance cap used while fitting, for every method (CE and k-means cap, METIS
// token tolerance, contiguous s-TS cap). --cap C and --fallback: the enforced held-out balance and
// the rule for unseen / displaced tokens (moe/speculative/capped_eval.hpp), identical for every method.
// --elite, --smoothing, --balance-weight, --iterations, --samples, --polish, --final-polish: the
// cross-entropy method's settings ("ce"); "ce-plain" is the same with no refinement (Algorithm 1).
//
// Prints one markdown table per layer: fitted LAR and imbalance; held-out LAR without shuffling,
// with s-TS uncapped (and its imbalance), and with s-TS at the enforced cap (and its imbalance, and
// the share of occurrences the cap moved); solve time.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "moe_tools/cli.hpp"
#include "moe/core/tsv.hpp"
#include "moe/speculative/cocluster.hpp"
#include "moe/speculative/cocluster_metis.hpp"
#include "moe/plan/plan_io.hpp"
#include "moe/profile/olmoe_tokens.hpp"
#include "moe/profile/route_split.hpp"
#include "moe/speculative/capped_eval.hpp"
#include "moe/speculative/metrics.hpp"
#include "moe/speculative/predictor.hpp"
#include "moe/speculative/table_io.hpp"

#ifndef MOE_SHARED_DATA_DIR
#define MOE_SHARED_DATA_DIR "../shared/data"
#endif

namespace {
std::vector<std::string> split(std::string const& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}
}  // namespace

namespace {
int run(int argc, char** argv) {
  using namespace moe;
  using tools::parse_int;
  tools::Args const args(argc, argv,
                         {{"data"}, {"train"}, {"eval"}, {"devices"}, {"layers"}, {"seed"}, {"iterations"},
                          {"samples"}, {"polish"}, {"final-polish"}, {"split"}, {"out"}, {"elite"}, {"smoothing"},
                          {"balance-weight"}, {"fit-gamma"}, {"cap"}, {"fallback"}, {"methods"}});
  if (args.help()) {
    std::printf("usage: olmoe_cocluster [--data DIR] [--train LIST] [--eval LIST] [--devices N] [--layers LIST]\n"
                "  [--seed S] [--iterations N] [--samples N] [--polish N] [--final-polish N] [--split F] [--out DIR]\n"
                "  [--elite F] [--smoothing F] [--balance-weight W] [--fit-gamma G] [--cap C] [--fallback prior|modulo]\n"
                "  [--methods LIST]   (docs/speculative.md)\n");
    return tools::exit_ok;
  }
  constexpr double kMax = std::numeric_limits<double>::max();
  std::string data = args.text("data", MOE_SHARED_DATA_DIR), train = args.text("train", "arxiv,book"),
              eval = args.text("eval", "github"), layers_arg = args.text("layers", "0,7,15"), out = args.text("out");
  int devices = static_cast<int>(args.integer("devices", 8, 1, 32767));
  int iterations = static_cast<int>(args.integer("iterations", 30, 1, 1000000));
  int samples = static_cast<int>(args.integer("samples", 16, 1, 1000000));
  int polish = static_cast<int>(args.integer("polish", 2, 0, 1000000));
  int final_polish = static_cast<int>(args.integer("final-polish", 10, 0, 1000000));
  double split_fraction = args.number("split", 0, 0, 1), elite = args.number("elite", 0.2, 0, 1),
         smoothing = args.number("smoothing", 0.7, 0, 1), balance_weight = args.number("balance-weight", 0, 0, kMax),
         fit_gamma = args.number("fit-gamma", 1.1, 0, kMax), cap = args.number("cap", 1.1, 0, kMax);
  std::string fallback = args.choice("fallback", "modulo", {"prior", "modulo"});
  std::string methods = args.text("methods", "contiguous,metis,metis+refine,kmeans,ce-plain,ce");
  for (auto const& m : tools::parse_list(methods, "--methods"))
    check(m == "contiguous" || m == "metis" || m == "metis+refine" || m == "kmeans" || m == "ce-plain" || m == "ce",
          "--methods: unknown method '", m, "' (known: contiguous, metis, metis+refine, kmeans, ce-plain, ce)");
#if !(MOE_HAS_METIS && defined(MOE_WITH_METIS))
  // The default list skips METIS quietly where it is not built; a list the user gave does not.
  for (auto const& m : tools::parse_list(methods, "--methods"))
    check(!args.has("methods") || (m != "metis" && m != "metis+refine"), "--methods ", m,
          ": this olmoe_cocluster was built without METIS (Debian libmetis-dev)");
#endif
  (void)tools::parse_list(layers_arg, "--layers");
  (void)tools::parse_list(train, "--train");
  (void)tools::parse_list(eval, "--eval");
  unsigned long seed =
      static_cast<unsigned long>(args.integer("seed", 1, 0, std::numeric_limits<long long>::max()));
  namespace ol = profile::olmoe;
  auto t0 = std::chrono::steady_clock::now();
  profile::RouteProfile fit, held;
  if (split_fraction > 0) {
    auto parts = profile::split_profile(ol::load(data, split(train)), split_fraction, seed);
    fit = std::move(parts.first);
    held = std::move(parts.second);
    eval = "the remaining " + std::to_string(100 - static_cast<int>(100 * split_fraction)) + "% of " + train +
           " (simulated split of aggregated counts)";
    train = std::to_string(static_cast<int>(100 * split_fraction)) + "% of " + train;
  } else {
    fit = ol::load(data, split(train));
    held = ol::load(data, split(eval));
  }
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto wanted = split(methods);
  auto want = [&](char const* m) { return std::find(wanted.begin(), wanted.end(), m) != wanted.end(); };
  speculative::CappedEvalOptions copt;
  copt.capacity_factor = cap;
  copt.fallback = fallback == "prior" ? speculative::Fallback::prior : speculative::Fallback::modulo;
  std::printf("OLMoE-1B-7B, %d devices, fit on %s, evaluated on %s (data loaded in %.2f s)\n", devices,
              train.c_str(), eval.c_str(), load_s);
  std::printf("fit gamma %.3g; held-out cap %.3g x mean, fallback %s; CE: %d rounds x %d samples, elite %.3g, "
              "smoothing %.3g, balance weight %.3g, polish %d / %d, seed %lu\n\n",
              fit_gamma, cap, fallback.c_str(), iterations, samples, elite, smoothing, balance_weight, polish,
              final_polish, seed);
  std::vector<double> shares(static_cast<std::size_t>(devices), 1.0 / devices);
  for (auto const& ls : split(layers_arg)) {
    int layer = static_cast<int>(parse_int(ls, "--layers", 0, moe::core::limits::layers - 1));
    auto const& tr = fit.layer(layer);
    auto const& ev = held.layer(layer);
    auto problem = moe::speculative::CoclusterProblem::from_counts(tr, ol::top_k, devices);
    speculative::TokenExpertTable topk(tr, ol::top_k, ol::vocab);
    auto pr = speculative::expert_precision_recall(ev, ol::top_k, topk);
    std::printf("### layer %d: %zu fitted tokens, %zu held-out tokens; expert top-8 table on held-out: "
                "precision %.3f, recall %.3f; known tokens cover %.1f%% of held-out occurrences\n\n",
                layer, tr.rows(), ev.rows(), pr.precision, pr.recall, 100 * pr.coverage);
    std::printf("| layer | method | solve s | LAR fit | imb fit | LAR held, no shuffle | LAR held s-TS uncapped | "
                "imb uncapped | LAR held s-TS capped | imb capped | moved |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    auto report = [&](char const* name, moe::speculative::CoclusterResult const& r, double secs) {
      auto table = speculative::TokenDeviceTable::from_cocluster(problem, r, ol::vocab);
      speculative::Predictor pred(table);
      auto prior = speculative::device_prior(tr, r.experts, devices);
      double lar0 = speculative::local_activation_rate_unshuffled(ev, r.experts, shares);
      auto ce = speculative::capped_evaluation(ev, r.experts, ol::top_k, devices,
                                               [&](int t) { return pred.predict(t); }, prior, copt);
      std::printf("| %d | %s | %.2f | %.4f | %.3f | %.4f | %.4f | %.3f | %.4f | %.3f | %.3f |\n", layer, name, secs,
                  r.local_rate, r.imbalance, lar0, ce.lar_uncapped, ce.imbalance_uncapped, ce.lar, ce.imbalance,
                  ce.moved_share);
      std::fflush(stdout);
    };
    auto timed = [](auto&& f) {
      auto s = std::chrono::steady_clock::now();
      auto r = f();
      return std::pair{r, std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count()};
    };
    if (want("contiguous")) {
      auto [r, s] = timed([&] {
        return moe::speculative::assign_tokens_to(problem, placement::Table::contiguous(ol::experts, devices), fit_gamma);
      });
      report("contiguous (s-TS only)", r, s);
    }
#if MOE_HAS_METIS && defined(MOE_WITH_METIS)
    if (want("metis") || want("metis+refine")) {
      moe::speculative::MetisOptions mo;
      mo.seed = static_cast<int>(seed);
      mo.token_tolerance = fit_gamma;
      auto [r, s] = timed([&] { return moe::speculative::solve_metis(problem, mo); });
      if (want("metis")) report("METIS", r, s);
      if (want("metis+refine")) {
        auto [r2, s2] =
            timed([&, &metis = r] { return moe::speculative::refine(problem, metis, final_polish, fit_gamma); });
        report("METIS + our refinement", r2, s + s2);
      }
    }
#endif
    if (want("kmeans")) {
      moe::speculative::KMeansOptions ko;
      ko.seed = seed;
      ko.balance_factor = fit_gamma;
      auto [r, s] = timed([&] { return moe::speculative::balanced_kmeans(problem, ko); });
      report("balanced k-means (2-stage)", r, s);
    }
    moe::speculative::CrossEntropyOptions co;
    co.seed = seed;
    co.iterations = iterations;
    co.samples = samples;
    co.elite_fraction = elite;
    co.smoothing = smoothing;
    co.balance_weight = balance_weight;
    co.balance_factor = fit_gamma;
    if (want("ce-plain")) {
      auto plain = co;
      plain.polish_rounds = 0;
      plain.final_polish_rounds = 0;
      auto [r, s] = timed([&] { return moe::speculative::solve_cross_entropy(problem, plain); });
      report("cross-entropy, plain Algorithm 1", r, s);
    }
    if (want("ce")) {
      co.polish_rounds = polish;
      co.final_polish_rounds = final_polish;
      auto [r2, s2] = timed([&] { return moe::speculative::solve_cross_entropy(problem, co); });
      report("cross-entropy + refinement", r2, s2);
      if (!out.empty()) {
        placement::write_plan(out + "/experts-layer" + std::to_string(layer) + ".plan.tsv",
                              placement::plan_without_replicas({r2.experts}), devices);
        speculative::write_token_table(out + "/token-table-layer" + std::to_string(layer) + ".tsv",
                                       speculative::TokenDeviceTable::from_cocluster(problem, r2, ol::vocab));
      }
    }
    std::printf("\n");
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  return moe::tools::guarded_main("olmoe_cocluster", [&] { return run(argc, argv); });
}
