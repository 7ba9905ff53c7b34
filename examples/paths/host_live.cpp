// Re-planning while serving, for a stack of layers: 4 MoE layers, each re-planning from its own
// load window and migrating expert weights between passes (LayerOptions::live, moe/layer/live.hpp),
// with the planning spread over the ranks: layer l is planned on rank l % ranks alone
// (live.plan_rank), which sends its plans to the other ranks. Two deployments of the same layers:
//   sequential     4 in-process ranks (threads), each holding tokens and experts (the host path)
//   disaggregated  2 attention ranks holding the tokens and 4 expert ranks holding the experts
//                  (schedule::FinDep, the host disaggregated path): the plans are over the 4
//                  expert ranks, the attention ranks move no weights
// Every layer of every pass is checked against the single-process reference on the same inputs
// (every token rank's, gathered: in a stack of random layers, routing near-ties of the deeper
// layers would otherwise compound summation-order differences).
// Synthetic, seeded data: OLMoE-1B-7B routing (64 experts, top-8) at hidden 32 / expert width 16,
// fp32, 32 tokens per pass; each pass's tokens lean towards 6 "hot" experts of the first layer's
// router, and the hot set moves every 25 passes, so the routing drifts.
//
//   example_host_live [passes] [disaggregated]   (default 100 passes, sequential)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moe/moe.hpp"

using Model = moe::models::Reduced<moe::models::OLMoE_1B_7B, 32, 16, moe::DType::f32>;
using Router = moe::router::ForModel<Model>;
constexpr int expert_ranks = 4, pass_tokens = 32, layers = 4;

namespace {

constexpr moe::ShapeSpec s = Model::spec;
constexpr auto h = static_cast<std::size_t>(s.hidden);

/// The first plan of every layer: expert e on expert rank e % 4, experts 0-15 also on (e + 1) % 4.
std::vector<std::vector<int>> first_copies() {
  std::vector<std::vector<int>> c(static_cast<std::size_t>(s.experts));
  for (int e = 0; e < s.experts; ++e) {
    c[static_cast<std::size_t>(e)] = {e % expert_ranks};
    if (e < 16) c[static_cast<std::size_t>(e)].push_back((e + 1) % expert_ranks);
  }
  return c;
}

/// Pass p's tokens, all ranks' (seeded): N(0, 1) plus 3 x hidden x the first router's row of one of
/// the pass's hot experts.
std::vector<float> batch(moe::LayerWeights<float> const& first, int p) {
  std::vector<float> x(pass_tokens * h);
  std::mt19937_64 rng(1000 + static_cast<std::uint64_t>(p));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& v : x) v = d(rng);
  for (std::size_t t = 0; t < pass_tokens; ++t) {
    auto hot = static_cast<std::size_t>(((p / 25) * 7 + static_cast<int>(t % 6)) % s.experts);
    for (std::size_t i = 0; i < h; ++i) x[t * h + i] += 3.0f * static_cast<float>(h) * first.router[hot * h + i];
  }
  return x;
}

/// The stack on `ranks` in-process ranks, `ag` of which hold the tokens and no experts (0: every
/// rank holds both, schedule::Sequential). Returns the exit status.
template <class Schedule, int ranks>
int serve(int passes, Schedule sched, int ag) {
  using Comm = moe::collective::InProcess<ranks>;
  using Layer = moe::Layer<Model, Router, moe::placement::Table, moe::replication::Table, Schedule, Comm>;
  static_assert(Layer::can_replan);
  int const token_ranks = ag > 0 ? ag : ranks, tokens = pass_tokens / token_ranks;
  std::vector<moe::RandomLayerWeights<float>> weights;
  for (int l = 0; l < layers; ++l) weights.emplace_back(s, 1 + static_cast<std::uint64_t>(l));
  auto primary = std::vector<int>(static_cast<std::size_t>(s.experts));
  for (int e = 0; e < s.experts; ++e) primary[static_cast<std::size_t>(e)] = e % expert_ranks;

  std::vector<double> worst(ranks, 0.0);  // per rank: the largest relative error of any layer and pass
  std::vector<std::vector<float>> inputs(layers, std::vector<float>(pass_tokens * h));  // every rank's, per layer
  std::vector<int> adopted(layers), changed(layers);
  std::vector<std::vector<long long>> plan_bytes(layers, std::vector<long long>(ranks, 0)),
      moved(layers, std::vector<long long>(ranks, 0));
  std::vector<std::string> errors(ranks);
  moe::collective::run_in_process<ranks>([&](Comm& comm) {
    int me = comm.rank();
    bool holds = me < token_ranks;
    try {
      std::vector<Layer> stack;
      std::vector<std::vector<float>> arenas(layers);
      stack.reserve(layers);
      for (int l = 0; l < layers; ++l) {
        moe::live::Options live{.window = 20, .replan_every = 20, .spare_slots = 2,
                                .migration_bytes_per_pass = moe::live::slot_bytes<float>(s), .plan_rank = l % ranks};
        // every rank is given every expert's weights; attach_arena keeps those the rank holds
        stack.emplace_back(comm, moe::placement::Table(primary), moe::replication::Table(first_copies()),
                           weights[static_cast<std::size_t>(l)].view(),
                           moe::LayerOptions<Schedule>{.max_tokens = tokens, .schedule = sched, .live = live});
        arenas[static_cast<std::size_t>(l)].resize(stack.back().arena_elements());  // none on an attention rank
        stack.back().attach_arena(arenas[static_cast<std::size_t>(l)]);
      }
      std::vector<std::byte> ws(stack[0].workspace_size());  // the layers have the same shape and options
      for (int p = 0; p < passes; ++p) {
        auto x = batch(weights[0].view(), p);
        std::size_t first = holds ? static_cast<std::size_t>(me * tokens) * h : 0;
        std::size_t n = holds ? static_cast<std::size_t>(tokens) * h : 0;
        std::vector<float> in(x.begin() + static_cast<std::ptrdiff_t>(first),
                              x.begin() + static_cast<std::ptrdiff_t>(first + n)),
            out(in.size()), ref(x.size());
        for (int l = 0; l < layers; ++l) {
          // this rank's inputs of layer l beside the others', then the layer
          auto& all = inputs[static_cast<std::size_t>(l)];
          std::copy(in.begin(), in.end(), all.begin() + static_cast<std::ptrdiff_t>(first));
          comm.barrier();
          auto& layer = stack[static_cast<std::size_t>(l)];
          float const* xi = holds ? in.data() : nullptr;
          float* yo = holds ? out.data() : nullptr;
          if constexpr (moe::schedule::DisaggregatedPolicy<Schedule>)
            layer.run({.tokens = holds ? tokens : 0, .x = xi, .y = yo}, ws);
          else
            layer.run({.tokens = tokens, .x = xi, .y = yo, .first_token = me * tokens}, ws);
          plan_bytes[static_cast<std::size_t>(l)][static_cast<std::size_t>(me)] +=
              static_cast<long long>(layer.stats().plan_bytes);
          moved[static_cast<std::size_t>(l)][static_cast<std::size_t>(me)] +=
              static_cast<long long>(layer.stats().migration_bytes);
          if (holds) {
            moe::reference_forward<Router>(s, weights[static_cast<std::size_t>(l)].view(), pass_tokens, all.data(),
                                           ref.data());
            double diff = 0, scale = 0;
            for (std::size_t i = 0; i < out.size(); ++i) {
              diff = std::max(diff, std::abs(double(out[i]) - ref[first + i]));
              scale = std::max(scale, std::abs(double(ref[first + i])));
            }
            worst[static_cast<std::size_t>(me)] = std::max(worst[static_cast<std::size_t>(me)], diff / scale);
          }
          comm.barrier();  // every rank has read `all` before the next pass writes it
          in.swap(out);
        }
      }
      if (me == 0)
        for (int l = 0; l < layers; ++l) {
          adopted[static_cast<std::size_t>(l)] = stack[static_cast<std::size_t>(l)].stats().plans_adopted;
          changed[static_cast<std::size_t>(l)] = stack[static_cast<std::size_t>(l)].stats().plans_changed;
        }
    } catch (std::exception const& e) {
      errors[static_cast<std::size_t>(me)] = e.what();
    }
  });
  for (int r = 0; r < ranks; ++r)
    if (!errors[static_cast<std::size_t>(r)].empty()) {
      std::printf("rank %d: %s\n", r, errors[static_cast<std::size_t>(r)].c_str());
      return 1;
    }
  if (ag > 0)
    std::printf("host disaggregated path (%d attention + %d expert ranks), live re-planning: %d layers, %d passes of "
                "%d tokens per attention rank\n", ag, ranks - ag, layers, passes, tokens);
  else
    std::printf("host path, live re-planning: %d layers on %d ranks, %d passes of %d tokens per rank\n", layers, ranks,
                passes, tokens);
  bool spread = true, attention_still = true;
  for (int l = 0; l < layers; ++l) {
    std::printf("layer %d: planned on rank %d, %d plans adopted (%d changed the layout); plan bytes sent per rank:", l,
                l % ranks, adopted[static_cast<std::size_t>(l)], changed[static_cast<std::size_t>(l)]);
    for (int r = 0; r < ranks; ++r) {
      long long b = plan_bytes[static_cast<std::size_t>(l)][static_cast<std::size_t>(r)];
      std::printf(" %lld", b);
      spread = spread && (r == l % ranks || b == 0);
      attention_still = attention_still && (r >= ag || moved[static_cast<std::size_t>(l)][static_cast<std::size_t>(r)] == 0);
    }
    std::printf("\n");
  }
  double most = *std::max_element(worst.begin(), worst.end());
  std::printf("max |layer - reference| / max |reference| over every layer, pass and token rank = %.2e\n", most);
  if (ag > 0) std::printf("weights sent by the attention ranks: %s\n", attention_still ? "none" : "some (wrong)");
  return most < 1e-5 && spread && attention_still ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int passes = 100;
  bool disaggregated = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "disaggregated") == 0) {
      disaggregated = true;
      continue;
    }
    passes = std::atoi(argv[i]);
    if (passes < 1 || passes > 100000)
      moe::fail("example_host_live: passes must be 1 to 100000 (or the word disaggregated), got '", argv[i], "'");
  }
  if (disaggregated)
    return serve<moe::schedule::FinDep, 2 + expert_ranks>(
        passes, moe::schedule::FinDep{.ag = 2, .order = moe::schedule::Order::asas, .r1 = 2, .r2 = 2}, 2);
  return serve<moe::schedule::Sequential, expert_ranks>(passes, {}, 0);
}
