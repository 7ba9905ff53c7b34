// moe::Layer<..., collective::Mpi> under SimGrid's SMPI: the same expert-parallel layer the MPI
// tests run on 4 OpenMPI processes, here on N simulated ranks (threads of one process, each MPI call
// timed by SimGrid's network model), checked on every rank against the single-process reference.
// MPI_Wtime is the simulated clock; computation is not simulated (run with
// --cfg=smpi/simulate-computation:no), so the times are the layer's communication on the platform.
//
//   scripts/smpi_layer.sh [RANKS] [TOKENS_PER_RANK]      builds with smpicxx and runs with smpirun
//
// The layer: DeepSeek-V3's routing (256 experts, 8 groups, top-8, sigmoid + bias, 1 shared expert)
// at hidden 64 and expert width 32, fp32, contiguous placement (256 / RANKS experts per rank).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "moe/collective/mpi.hpp"
#include "moe_tools/cli.hpp"
#include "moe/moe.hpp"

namespace {

using Model = moe::models::Reduced<moe::models::DeepSeekV3, 64, 32, moe::DType::f32>;
using Router = moe::router::ForModel<Model>;
using Layer = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential,
                         moe::collective::Mpi>;

int run(moe::collective::Mpi& comm, int tokens) {
  int R = comm.size(), r = comm.rank();
  constexpr moe::ShapeSpec s = Model::spec;
  moe::check(s.experts % R == 0, s.experts, " experts do not split over ", R,
             " ranks (use a power of two up to 256)");
  auto h = static_cast<std::size_t>(s.hidden);
  moe::RandomLayerWeights<float> weights(s, 7);
  std::mt19937_64 rng(1000 + static_cast<unsigned>(r));
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(tokens) * h), y(x.size()), ref(x.size());
  for (auto& v : x) v = d(rng);
  // The reference is per token, so each rank checks its own tokens.
  moe::reference_forward<Router>(s, weights.view(), tokens, x.data(), ref.data());

  auto placement = moe::placement::Table::contiguous(s.experts, R);
  auto local = weights.experts_where([&](int e) { return placement.rank_of(e) == r; });  // view.experts spans it
  auto view = weights.view();
  view.experts = local;
  Layer layer(comm, placement, {}, view, {.max_tokens = tokens});
  std::vector<std::byte> ws(layer.workspace_size());
  comm.barrier();
  double t0 = MPI_Wtime();
  layer.run({.tokens = tokens, .x = x.data(), .y = y.data(), .first_token = static_cast<long long>(r) * tokens}, ws);
  double own = MPI_Wtime() - t0;
  comm.barrier();
  double all = MPI_Wtime() - t0;

  double err = 0, scale = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    err = std::max(err, static_cast<double>(std::abs(y[i] - ref[i])));
    scale = std::max(scale, static_cast<double>(std::abs(ref[i])));
  }
  double rel = scale > 0 ? err / scale : err, worst = 0, slowest = 0;
  MPI_Reduce(&rel, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, comm.comm());
  MPI_Reduce(&own, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, comm.comm());
  auto st = layer.stats();
  unsigned long long sent = st.dispatch_bytes + st.combine_bytes, total = 0;
  MPI_Reduce(&sent, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, comm.comm());
  int ok = worst <= 1e-5;
  MPI_Bcast(&ok, 1, MPI_INT, 0, comm.comm());
  if (r == 0)
    std::printf("smpi_layer: %d ranks x %d tokens, hidden %d, %d experts (%d per rank), top-%d\n"
                "simulated time of one forward pass: slowest rank %.2f us, all ranks done %.2f us; "
                "dispatch + combine bytes %llu\n"
                "max relative error vs the single-process reference: %.2e (%s)\n",
                R, tokens, s.hidden, s.experts, s.experts / R, s.top_k, slowest * 1e6, all * 1e6, total, worst,
                ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  moe::collective::MpiSession session(&argc, &argv, MPI_THREAD_SINGLE);
  moe::collective::Mpi comm;
  // Every rank parses the same words; rank 0 alone prints the message.
  return moe::tools::guarded_main(comm.rank() == 0 ? "smpi_layer" : nullptr, [&] {
    moe::tools::Args const args(argc, argv, {}, /*positionals=*/true);
    moe::check(args.positionals().size() <= 1, "usage: smpi_layer [TOKENS_PER_RANK]");
    int tokens = args.positionals().empty()
                     ? 16
                     : static_cast<int>(moe::tools::parse_int(args.positionals()[0], "tokens per rank", 1, 1 << 16));
    return run(comm, tokens);
  });
}
