// End-to-end demo: one MoE layer of a real model shape, expert-parallel on 4 ranks (threads), with
// seeded random weights and tokens, checked against the single-process reference.
//
//   moe_demo [--model olmoe|deepseek-v3-small] [--tokens N] [--seed S]
//
// olmoe             OLMoE-1B-7B at its published size (hidden 2048, 64 experts of width 1024, top-8)
// deepseek-v3-small DeepSeek-V3's routing (256 experts, 8 groups, top-8, sigmoid, 1 shared expert)
//                   with hidden 256 and expert width 128, so it runs in seconds on a laptop
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "moe_tools/cli.hpp"
#include "moe/moe.hpp"

namespace {

struct Options {
  std::string model = "olmoe";
  int tokens = 96;
  std::uint64_t seed = 2026;
};

template <class T>
std::vector<T> seeded_tokens(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<T> x(n);
  for (auto& v : x) v = moe::from_float<T>(d(rng));
  return x;
}

template <class Model>
int run(Options const& o) {
  using Router = moe::router::ForModel<Model>;
  using Layer = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential,
                           moe::collective::InProcess<4>>;
  using T = typename Layer::element_type;
  constexpr moe::ShapeSpec s = Model::spec;
  auto h = static_cast<std::size_t>(s.hidden);

  // Uneven tokens per rank, as a real batch would be: 40%, 30%, 20%, 10%.
  std::vector<int> counts{o.tokens * 4 / 10, o.tokens * 3 / 10, o.tokens * 2 / 10, 0};
  counts[3] = o.tokens - counts[0] - counts[1] - counts[2];
  std::vector<int> first{0, counts[0], counts[0] + counts[1], counts[0] + counts[1] + counts[2]};

  auto t0 = std::chrono::steady_clock::now();
  moe::RandomLayerWeights<T> weights(s, o.seed);
  auto x = seeded_tokens<T>(static_cast<std::size_t>(o.tokens) * h, o.seed + 1);
  std::vector<T> ref(x.size());
  moe::reference_forward<Router>(s, weights.view(), o.tokens, x.data(), ref.data());
  auto t1 = std::chrono::steady_clock::now();

  auto placement = moe::placement::Table::contiguous(s.experts, 4);
  std::array<moe::LayerStats, 4> dedup{}, plain{};
  std::vector<T> y(x.size()), y_plain(x.size());
  double ep_seconds = 0;
  moe::collective::run_in_process<4>([&](auto& comm) {
    int r = comm.rank();
    auto local = weights.experts_where([&](int e) { return placement.rank_of(e) == r; });
    auto view = weights.view();
    view.experts = local;
    auto offset = static_cast<std::size_t>(first[static_cast<std::size_t>(r)]) * h;
    for (bool dd : {true, false}) {
      Layer layer(comm, placement, {}, view, {.max_tokens = counts[0], .deduplicate = dd});
      std::vector<std::byte> ws(layer.workspace_size());
      auto start = std::chrono::steady_clock::now();
      layer.run({.tokens = counts[static_cast<std::size_t>(r)], .x = x.data() + offset,
                 .y = (dd ? y.data() : y_plain.data()) + offset, .first_token = first[static_cast<std::size_t>(r)]},
                ws);
      if (dd && r == 0) ep_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      (dd ? dedup : plain)[static_cast<std::size_t>(r)] = layer.stats();
    }
  });

  auto err = [&](std::vector<T> const& a) {
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, std::abs(double(moe::to_float(a[i])) - double(moe::to_float(ref[i]))));
      scale = std::max(scale, std::abs(double(moe::to_float(ref[i]))));
    }
    return diff / scale;
  };

  std::printf("moe-compose demo: %s layer (hidden %d, %d experts of width %d, top-%d, %d shared), %s storage\n",
              std::string(Model::name).c_str(), s.hidden, s.experts, s.expert_ffn, s.top_k, s.shared_experts,
              s.dtype == moe::DType::f32 ? "fp32" : "bf16");
  std::printf("expert parallel on 4 in-process ranks, contiguous placement (%d experts per rank), router %s\n",
              s.experts / 4, std::string(Router::name).c_str());
  std::printf("weights + reference: %.2f s, expert-parallel forward: %.2f s\n\n",
              std::chrono::duration<double>(t1 - t0).count(), ep_seconds);
  std::printf("rank  tokens  local-activation  dispatch-bytes  (one copy per expert)  saved  combine-bytes\n");
  long long tokens = 0, local = 0, assignments = 0;
  std::size_t sent = 0, sent_plain = 0;
  for (int r = 0; r < 4; ++r) {
    auto const& d = dedup[static_cast<std::size_t>(r)];
    auto const& p = plain[static_cast<std::size_t>(r)];
    double saved = p.dispatch_bytes ? 1.0 - double(d.dispatch_bytes) / double(p.dispatch_bytes) : 0.0;
    std::printf("%4d  %6lld  %15.1f%%  %14zu  %21zu  %4.0f%%  %13zu\n", r, d.tokens, 100.0 * d.local_activation_rate(),
                d.dispatch_bytes, p.dispatch_bytes, 100.0 * saved, d.combine_bytes);
    tokens += d.tokens;
    local += d.local_assignments;
    assignments += d.assignments;
    sent += d.dispatch_bytes + d.combine_bytes;
    sent_plain += p.dispatch_bytes + p.combine_bytes;
  }
  std::printf("\ntotal %lld tokens, local activation rate %.1f%%, bytes sent %zu (vs %zu without de-duplication, "
              "%.0f%% less)\n",
              tokens, 100.0 * double(local) / double(assignments), sent, sent_plain,
              100.0 * (1.0 - double(sent) / double(sent_plain)));
  double e = err(y), e_plain = err(y_plain);
  std::printf("max relative error vs single-process reference: %.2e (de-duplicated), %.2e (one copy per expert)\n", e,
              e_plain);
  bool ok = e <= 1e-5 && e_plain <= 1e-5;
  std::printf("%s\n", ok ? "OK: expert-parallel output equals the reference" : "FAILED: outputs differ");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "moe_demo: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--model") {
        o.model = value();
      } else if (a == "--tokens") {
        o.tokens = static_cast<int>(moe::tools::parse_int(value(), a, 1, 1 << 20));
      } else if (a == "--seed") {
        o.seed = static_cast<std::uint64_t>(moe::tools::parse_int(value(), a, 0, std::numeric_limits<long long>::max()));
      } else {
        std::fprintf(stderr, "usage: moe_demo [--model olmoe|deepseek-v3-small] [--tokens N] [--seed S]\n");
        return 2;
      }
    } catch (std::exception const& e) {
      std::fprintf(stderr, "moe_demo: %s\n", e.what());
      return 2;
    }
  }
  if (o.tokens < 4) {
    std::fprintf(stderr, "moe_demo: --tokens must be at least 4\n");
    return 2;
  }
  try {
    if (o.model == "olmoe") return run<moe::models::WithDType<moe::models::OLMoE_1B_7B, moe::DType::f32>>(o);
    if (o.model == "deepseek-v3-small")
      return run<moe::models::Reduced<moe::models::DeepSeekV3, 256, 128, moe::DType::f32>>(o);
    std::fprintf(stderr, "moe_demo: unknown model '%s' (olmoe, deepseek-v3-small)\n", o.model.c_str());
    return 2;
  } catch (moe::Error const& e) {
    std::fprintf(stderr, "moe_demo: %s\n", e.what());
    return 1;
  }
}
