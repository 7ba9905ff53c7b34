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

#include "moe/core/cli.hpp"
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

int main(int argc, char** argv) try {
  using namespace moe;
  std::string data = MOE_SHARED_DATA_DIR, train = "arxiv,book", eval = "github", layers_arg = "0,7,15", out;
  int devices = 8, iterations = 30, samples = 16, polish = 2, final_polish = 10;
  double split_fraction = 0, elite = 0.2, smoothing = 0.7, balance_weight = 0, fit_gamma = 1.1, cap = 1.1;
  std::string fallback = "modulo", methods = "contiguous,metis,metis+refine,kmeans,ce-plain,ce";
  unsigned long seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--data") data = v;
    else if (a == "--train") train = v;
    else if (a == "--eval") eval = v;
    else if (a == "--devices") devices = static_cast<int>(moe::core::parse_int(v, a, 1, 32767));
    else if (a == "--layers") layers_arg = v;
    else if (a == "--seed") seed = static_cast<unsigned long>(moe::core::parse_int(v, a, 0, std::numeric_limits<long long>::max()));
    else if (a == "--iterations") iterations = static_cast<int>(moe::core::parse_int(v, a, 1, 1000000));
    else if (a == "--samples") samples = static_cast<int>(moe::core::parse_int(v, a, 1, 1000000));
    else if (a == "--polish") polish = static_cast<int>(moe::core::parse_int(v, a, 0, 1000000));
    else if (a == "--final-polish") final_polish = static_cast<int>(moe::core::parse_int(v, a, 0, 1000000));
    else if (a == "--split") split_fraction = moe::core::parse_double(v, a, 0, 1);
    else if (a == "--out") out = v;
    else if (a == "--elite") elite = moe::core::parse_double(v, a, 0, 1);
    else if (a == "--smoothing") smoothing = moe::core::parse_double(v, a, 0, 1);
    else if (a == "--balance-weight") balance_weight = moe::core::parse_double(v, a, 0);
    else if (a == "--fit-gamma") fit_gamma = moe::core::parse_double(v, a, 0);
    else if (a == "--cap") cap = moe::core::parse_double(v, a, 0);
    else if (a == "--fallback") fallback = v;
    else if (a == "--methods") methods = v;
    else {
      std::cerr << "unknown option " << a << "\n";
      return 2;
    }
  }
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
  if (fallback != "prior" && fallback != "modulo") {
    std::cerr << "--fallback must be prior or modulo\n";
    return 2;
  }
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
    int layer = static_cast<int>(moe::core::parse_int(ls, "--layers", 0, moe::core::limits::layers - 1));
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
        auto [r2, s2] = timed([&] { return moe::speculative::refine(problem, r, final_polish, fit_gamma); });
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
} catch (std::exception const& e) {
  std::cerr << "olmoe_cocluster: " << e.what() << "\n";
  return 1;
}
