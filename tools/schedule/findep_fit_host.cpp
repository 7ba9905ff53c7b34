// Measures the FinDEP operations on the host CPU with the plain kernels of host_ops.hpp, fits the
// alpha-beta performance models by least squares and writes a model file (docs/findep.md).
//
//   findep_fit_host [--out models.tsv] [--samples samples.tsv] [--reps N]
//
// A2E and E2A are timed as memcpy between two host buffers: a stand-in for a link, not a network.
// The host is shared, so every point is timed with the thread's CPU clock (time spent descheduled
// does not count), the points are run in N interleaved rounds in a shuffled order (default 15), and
// each point keeps its fastest round (the one least disturbed by other processes' cache traffic).
#include <algorithm>
#include <ctime>
#include <memory>
#include <random>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "moe_tools/cli.hpp"
#include "moe_tools/host_ops.hpp"
#include "moe/schedule/perf_model.hpp"

using namespace moe::schedule;

namespace {

int reps = 15;

double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

struct Point {
  Op op;
  double work;
  std::function<void()> run;
  double best_us = 1e300;
};

volatile float sink = 0;

}  // namespace

namespace {
int run(int argc, char** argv) {
  moe::tools::Args const args(argc, argv, {{"out"}, {"samples"}, {"reps"}});
  if (args.help()) {
    std::printf("usage: findep_fit_host [--out models.tsv] [--samples samples.tsv] [--reps N]\n");
    return moe::tools::exit_ok;
  }
  std::string out_path = args.text("out", "findep_host_models.tsv"), samples_path = args.text("samples");
  reps = static_cast<int>(args.integer("reps", reps, 1, 1000000));
  std::vector<Point> points;
  auto add = [&](Op op, double work, std::function<void()> run) { points.push_back({op, work, std::move(run)}); };

  using Buf = std::shared_ptr<std::vector<float>>;
  auto buf = [](std::size_t n, float v) { return std::make_shared<std::vector<float>>(n, v); };
  // GEMM: token rows x hidden x hidden (the attention projections' shape).
  {
    int hidden = 512;
    Buf B = buf(static_cast<std::size_t>(hidden) * hidden, 0.01f);
    for (int m : {16, 32, 64, 96, 128, 192, 256, 320, 384, 448, 512}) {
      Buf A = buf(static_cast<std::size_t>(m) * hidden, 0.5f), C = buf(static_cast<std::size_t>(m) * hidden, 0);
      add(Op::gemm, 2.0 * m * hidden * hidden, [=] {
        findep_host::gemm(A->data(), B->data(), C->data(), m, hidden, hidden);
        sink = (*C)[0];
      });
    }
  }
  // Attention: 4 heads of 64 (hidden 256), 1 or 2 samples.
  {
    int heads = 4, dk = 64, hidden = heads * dk;
    auto scratch = std::make_shared<std::vector<float>>();
    for (int b : {1, 2})
      for (int seq : {64, 128, 192, 256, 320, 384, 448, 512}) {
        std::size_t n = static_cast<std::size_t>(b) * seq * hidden;
        Buf q = buf(n, 0.1f), k = buf(n, 0.2f), v = buf(n, 0.3f), o = buf(n, 0);
        add(Op::attention, 4.0 * b * seq * static_cast<double>(seq) * hidden, [=] {
          findep_host::attention(q->data(), k->data(), v->data(), o->data(), b, seq, heads, dk, *scratch);
          sink = (*o)[0];
        });
      }
  }
  // Shared expert: one SwiGLU expert, hidden 256, ffn 512, on every token of a micro-batch.
  {
    int hidden = 256, ffn = 512;
    auto w = std::make_shared<findep_host::Expert>(hidden, ffn, 0.01f);
    Buf g = buf(0, 0), u = buf(0, 0);
    for (int tokens : {16, 32, 64, 128, 192, 256, 320, 384, 448, 512}) {
      Buf x = buf(static_cast<std::size_t>(tokens) * hidden, 0.5f), y = buf(x->size(), 0);
      add(Op::shared, 6.0 * tokens * hidden * ffn, [=] {
        findep_host::swiglu(*w, x->data(), y->data(), tokens, hidden, ffn, *g, *u);
        sink = (*y)[0];
      });
    }
  }
  // Routed experts of one EG rank: 4 local experts (hidden 256, ffn 256), token copies split evenly.
  {
    int hidden = 256, ffn = 256, local = 4;
    auto experts = std::make_shared<std::vector<findep_host::Expert>>();
    for (int e = 0; e < local; ++e) experts->emplace_back(hidden, ffn, 0.01f * static_cast<float>(e + 1));
    Buf g = buf(0, 0), u = buf(0, 0);
    for (int copies : {64, 128, 256, 384, 512, 640, 768, 896, 1024, 1280}) {
      Buf x = buf(static_cast<std::size_t>(copies) * hidden, 0.5f), y = buf(x->size(), 0);
      int per = copies / local;
      add(Op::experts, 6.0 * copies * hidden * ffn, [=] {
        for (int e = 0; e < local; ++e) {
          std::size_t off = static_cast<std::size_t>(e) * static_cast<std::size_t>(per) * hidden;
          findep_host::swiglu((*experts)[static_cast<std::size_t>(e)], x->data() + off, y->data() + off, per, hidden,
                              ffn, *g, *u);
        }
        sink = (*y)[0];
      });
    }
  }
  // A2E / E2A stand-in: memcpy between host buffers (beyond the last-level cache), one message per
  // destination rank (4 ranks).
  {
    std::size_t max_bytes = std::size_t{512} << 20;
    auto src = std::make_shared<std::vector<char>>(max_bytes, 1), dst = std::make_shared<std::vector<char>>(max_bytes, 0);
    for (Op op : {Op::a2e, Op::e2a})
      for (std::size_t mb : {16, 32, 64, 96, 128, 192, 256, 384, 512}) {
        std::size_t bytes = mb << 20;
        add(op, static_cast<double>(bytes), [=] {
          findep_host::link_copy(src->data(), dst->data(), bytes, bytes / 4);
          sink = (*dst)[bytes - 1];
        });
      }
  }

  // Interleaved rounds in a shuffled order; each point keeps its fastest round.
  std::vector<std::size_t> idx(points.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::mt19937 rng(42);
  for (auto& p : points) p.run();  // warm-up: page in every buffer once
  for (int round = 0; round < reps; ++round) {
    std::shuffle(idx.begin(), idx.end(), rng);
    for (std::size_t i : idx) {
      double t0 = thread_cpu_us();
      points[i].run();
      double t1 = thread_cpu_us();
      points[i].best_us = std::min(points[i].best_us, t1 - t0);
    }
  }
  std::array<std::vector<Sample>, op_count> samples;
  for (auto const& p : points) samples[static_cast<std::size_t>(p.op)].push_back({p.work, p.best_us});

  PerfModels m;
  m.source = "host CPU microbenchmarks (findep_fit_host; memcpy link stand-in)";
  std::printf("%-10s %14s %16s %10s %8s %s\n", "op", "alpha_us", "beta_us_per_unit", "R^2", "samples", "rate");
  for (Op op : all_ops) {
    Fit f = fit_linear(samples[static_cast<std::size_t>(op)], op_name(op));
    m.set(op, f);
    double rate = 1.0 / f.model.beta;  // units per us
    std::printf("%-10s %14.3f %16.6e %10.6f %8zu %.2f %s/s%s\n", std::string(op_name(op)).c_str(), f.model.alpha,
                f.model.beta, f.r2, f.samples, op_unit(op) == "flop" ? rate * 1e-3 : rate * 1e-3,
                op_unit(op) == "flop" ? "GFLOP" : "GB", f.alpha_clamped ? " (alpha clamped to 0)" : "");
  }
  write_models(out_path, m);
  std::printf("wrote %s\n", out_path.c_str());
  if (!samples_path.empty()) {
    std::ofstream s(samples_path);
    s << "op\twork\ttime_us\n";
    for (Op op : all_ops)
      for (auto const& x : samples[static_cast<std::size_t>(op)]) s << op_name(op) << '\t' << x.work << '\t' << x.time_us << '\n';
    std::printf("wrote %s\n", samples_path.c_str());
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  return moe::tools::guarded_main("findep_fit_host", [&] { return run(argc, argv); });
}
