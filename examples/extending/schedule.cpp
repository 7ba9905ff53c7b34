// A schedule policy of one's own: Timed runs the four phases of the host path's forward pass in
// the sequential order and times each one, per rank. On the host path moe::Layer::run() checks its
// arguments and workspace, builds the pass, and calls Schedule::run(pass) once; the schedule
// calls the phases: route() (gate GEMM, router, serving rank of each pair), dispatch() (records
// out, one all-to-all-v), compute() (the experts on the received records) and combine() (partial
// sums back, weighted sum). Every rank must call the same collective phases in the same order.
// (A schedule that satisfies schedule::DisaggregatedPolicy selects the disaggregated path instead,
// where the layer itself walks the FinDEP plan.)
//
// Checks: the layer on 4 in-process ranks matches moe::reference_forward, and every rank ran the
// four phases once each, in order.
#include <chrono>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "check.hpp"

struct Timed {
  static constexpr std::string_view name = "timed";

  struct Phase {
    std::string name;
    double microseconds;
  };
  /// What each rank's last pass did (guarded: the ranks are threads here).
  static inline std::mutex mutex;
  static inline std::vector<std::vector<Phase>> log;

  template <class Pass>
  static void run(Pass& pass) {
    std::vector<Phase> phases;
    auto timed = [&](char const* what, auto&& phase) {
      auto t0 = std::chrono::steady_clock::now();
      phase();
      phases.push_back({what, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count()});
    };
    timed("route", [&] { pass.route(); });
    timed("dispatch", [&] { pass.dispatch(); });
    timed("compute", [&] { pass.compute(); });
    timed("combine", [&] { pass.combine(); });
    std::lock_guard lock(mutex);
    log.push_back(std::move(phases));
  }
};
static_assert(moe::schedule::Policy<Timed>);

int main() {
  using namespace extending;
  using Router = moe::router::ForModel<Model>;
  constexpr int ranks = 4, tokens = 16;
  bool ok = true;

  auto run = run_layer<Router, moe::placement::Table, moe::replication::None, Timed, ranks>(
      moe::placement::Table::contiguous(shape.experts, ranks), {}, tokens);
  std::printf("Timed: relative error %.2e\n", run.relative_error());
  ok &= expect(run.relative_error() < 1e-5, "layer with the Timed schedule matches the reference");

  bool order_ok = Timed::log.size() == ranks;
  for (auto const& phases : Timed::log) {
    std::string order;
    for (auto const& p : phases) {
      order += (order.empty() ? "" : " ") + p.name;
      std::printf("%s %.0f us  ", p.name.c_str(), p.microseconds);
    }
    std::printf("\n");
    order_ok = order_ok && order == "route dispatch compute combine";
  }
  ok &= expect(order_ok, "each of the 4 ranks ran route, dispatch, compute, combine once");
  return ok ? 0 : 1;
}
