// The size sweep of the GPU microbenchmark (tools/include/moe_tools/gpu_sweep.hpp), checked without a GPU:
//   - every point's work equals the formula of docs/findep.md, recomputed here from the shape, and
//     equals what the solver's model (stage_times) asks for at that size;
//   - per shape and operation, the sweep covers the whole range of work the solver's search space
//     asks for on the grid of docs/findep.md (seq 1k-8k, splits 4/4 6/2 2/6 16/16, 20 and 40 GB per
//     AG rank), enumerated here from the Problem and the solver's candidate lists;
//   - sizes respect the kernels' constraints (16-byte rows, grouped GEMM K and N multiples of 8
//     bf16, softmax rows, attention chunks within the score budget), and the buffers fit an 80 GB GPU;
//   - the balanced token -> expert assignment is a balanced partition of the copies.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "moe_tools/gpu_sweep.hpp"
#include "moe/schedule/findep.hpp"

using namespace moe::schedule;
namespace fg = findep_gpu;

namespace {

/// Models where only `op` costs anything: 1 us per unit of work, no fixed cost. stage_times then
/// returns that op's work (times 4 for the projection GEMMs, which it counts four times).
PerfModels unit_model(Op op) {
  PerfModels m;
  for (Op o : all_ops) m[o] = Linear{0.0, 0.0};
  m[op] = Linear{0.0, 1.0};
  return m;
}

/// The work the solver's model asks `op` for under (problem, config).
double solver_work(Op op, Problem const& p, Config const& c) {
  StageTimes t = stage_times(p, unit_model(op), c);
  switch (op) {
    case Op::gemm: return t.attention / 4.0;
    case Op::attention: return t.attention;
    case Op::shared: return t.shared;
    case Op::experts: return t.experts;
    case Op::a2e: return t.a2e;
    case Op::e2a: return t.e2a;
  }
  return -1;
}

Problem problem(moe::ShapeSpec const& s, int ag, int eg, int seq) {
  Problem p;
  p.shape = s;
  p.ag = ag;
  p.eg = eg;
  p.seq = seq;
  p.memory_bytes = 1e18;  // no memory limit: only stage sizes are looked at
  return p;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = 0;
  void add(double w) {
    lo = std::min(lo, w);
    hi = std::max(hi, w);
  }
};

}  // namespace

TEST_CASE("every swept point's work is the documented formula and what the solver's model asks for",
          "[schedule][gpu-sweep]") {
  auto points = fg::sweep();
  std::map<Op, int> count;
  for (fg::Point const& pt : points) {
    CAPTURE(op_name(pt.op), pt.shape, pt.tokens, pt.samples, pt.seq);
    moe::ShapeSpec const& s = fg::shapes[static_cast<std::size_t>(pt.shape)].spec;
    double h = s.hidden, t = static_cast<double>(pt.tokens);
    ++count[pt.op];
    switch (pt.op) {
      case Op::gemm:  // 2 T h^2 (one of the four projections)
        CHECK(pt.work == 2 * t * h * h);
        CHECK(pt.work == solver_work(Op::gemm, problem(s, 1, 1, static_cast<int>(pt.tokens)), Config{}));
        break;
      case Op::attention: {  // 4 m_a seq^2 h
        double seq = pt.seq;
        CHECK(pt.work == 4 * pt.samples * seq * seq * h);
        Config c;
        c.m_a = pt.samples;
        CHECK(pt.work == solver_work(Op::attention, problem(s, 1, 1, pt.seq), c));
        break;
      }
      case Op::shared:  // 6 T h f_s n_s
        REQUIRE(s.shared_experts > 0);
        CHECK(pt.work == 6 * t * h * s.shared_ffn * s.shared_experts);
        CHECK(pt.work == solver_work(Op::shared, problem(s, 1, 1, static_cast<int>(pt.tokens)), Config{}));
        break;
      case Op::experts:  // 6 * copies * h * f; copies = Tc * ag * top_k / eg = rows with ag 1, eg top_k
        CHECK(pt.work == 6 * t * h * s.expert_ffn);
        CHECK(pt.work == solver_work(Op::experts, problem(s, 1, s.top_k, static_cast<int>(pt.tokens)), Config{}));
        break;
      case Op::a2e:
      case Op::e2a:  // Tc * top_k * h * 2 bytes * max(1, ag/eg)
        CHECK(pt.work == t * s.top_k * h * 2);
        CHECK(pt.work == solver_work(pt.op, problem(s, 1, 1, static_cast<int>(pt.tokens)), Config{}));
        // the same message as a chunk of a 3:1 split (ag/eg = 3) of a third of the tokens
        if (pt.tokens % 3 == 0)
          CHECK(pt.work == solver_work(pt.op, problem(s, 3, 1, static_cast<int>(pt.tokens / 3)), Config{}));
        break;
    }
  }
  // enough distinct sizes per operation for a fit (the least-squares fit needs >= 2; aim for ~10+)
  for (Op op : all_ops) CHECK(count[op] >= 10);
}

TEST_CASE("the sweep covers the solver's work range for DeepSeek-V2 and Qwen3-235B at seq 1k-8k",
          "[schedule][gpu-sweep]") {
  auto points = fg::sweep();
  for (int si = 0; si < fg::shape_count; ++si) {
    moe::ShapeSpec const& s = fg::shapes[static_cast<std::size_t>(si)].spec;
    CAPTURE(fg::shapes[static_cast<std::size_t>(si)].name);
    // The solver's space: every m_a <= M (any r1 >= 1), every admissible r2 (divisors of the
    // micro-batch's tokens up to r2_max), for each grid problem.
    std::map<Op, Range> need;
    long long max_m = 0;
    for (int seq : {1024, 2048, 4096, 8192})
      for (auto [ag, eg] : {std::pair{4, 4}, std::pair{6, 2}, std::pair{2, 6}, std::pair{16, 16}})
        for (double gb : {20.0, 40.0}) {
          Problem p = problem(s, ag, eg, seq);
          p.memory_bytes = gb * 1e9;
          validate(p);
          long long M = max_samples(p);
          REQUIRE(M >= 1);
          max_m = std::max(max_m, M * seq);
          for (int m_a = 1; m_a <= M; ++m_a)
            for (int r2 : r2_candidates(p, m_a)) {
              Config c{Pipeline::findep, Order::asas, 1, m_a, r2};
              for (Op op : all_ops)
                if (op != Op::shared || s.shared_experts > 0) need[op].add(solver_work(op, p, c));
            }
        }
    // independent sanity of the enumeration: the largest micro-batch is what 40 GB holds
    double bpt = 2.0 * s.hidden * (2.0 * s.layers() + 4.0);
    CHECK(max_m <= static_cast<long long>(40e9 / bpt));
    CHECK(max_m <= fg::max_tokens);

    std::map<Op, Range> have;
    for (fg::Point const& pt : points)
      if (pt.shape == si) have[pt.op].add(pt.work);
    for (auto const& [op, r] : need) {
      CAPTURE(op_name(op), r.lo, r.hi, have[op].lo, have[op].hi);
      CHECK(have[op].lo <= r.lo);
      CHECK(have[op].hi >= r.hi);
      // and not absurdly beyond it (the sweep stays within a factor 4 of the solver's range)
      CHECK(have[op].lo * 4 >= r.lo);
      CHECK(have[op].hi <= 4 * r.hi);
    }
    if (s.shared_experts == 0) CHECK(have.count(Op::shared) == 0);
  }
}

TEST_CASE("swept sizes respect the kernels' alignment and size constraints", "[schedule][gpu-sweep]") {
  auto points = fg::sweep();
  for (auto const& sh : fg::shapes) {
    CAPTURE(sh.name);
    moe::ShapeSpec const& s = sh.spec;
    // grouped_gemm: K and N multiples of 16 bytes of bf16 (8 elements); rows 16-byte aligned
    CHECK(s.hidden % 8 == 0);
    CHECK(s.expert_ffn % 8 == 0);
    if (s.shared_experts > 0) CHECK(s.shared_ffn % 8 == 0);
    // attention: heads of head_dim cover the hidden width exactly
    CHECK(sh.heads() * fg::head_dim == s.hidden);
    CHECK(sh.local_experts() * sh.eg_ranks == s.experts);
    CHECK(sh.local_experts() >= s.top_k);  // a token's copies go to distinct experts
  }
  for (fg::Point const& pt : points) {
    CAPTURE(op_name(pt.op), pt.shape, pt.tokens, pt.samples, pt.seq);
    fg::SweepShape const& sh = fg::shapes[static_cast<std::size_t>(pt.shape)];
    switch (pt.op) {
      case Op::gemm:
      case Op::shared:
        CHECK(pt.tokens % 64 == 0);  // whole tensor-core tiles, rows of hidden * 2 bytes
        break;
      case Op::attention: {
        CHECK(pt.seq <= fg::max_softmax_row);
        CHECK(pt.seq % 64 == 0);
        // per (sample, head) matrices start 16-byte aligned (strided batches)
        CHECK((static_cast<long long>(pt.seq) * fg::head_dim * fg::elem_bytes) % 16 == 0);
        CHECK((static_cast<long long>(pt.seq) * pt.seq * fg::elem_bytes) % 16 == 0);
        long long chunk = fg::attention_chunk(sh, pt.samples, pt.seq);
        CHECK(chunk >= 1);
        CHECK(chunk <= static_cast<long long>(pt.samples) * sh.heads());
        CHECK(static_cast<std::size_t>(chunk) * pt.seq * pt.seq * fg::elem_bytes <= fg::score_budget_bytes);
        break;
      }
      case Op::experts:
        CHECK(pt.tokens >= 1);
        CHECK(pt.tokens < (1LL << 31));
        break;
      case Op::a2e:
      case Op::e2a:
        CHECK(static_cast<long long>(pt.work) % 16 == 0);
        break;
    }
  }
  // every buffer covers its largest point, and the whole sweep fits an 80 GB GPU with room to spare
  fg::BufferSizes b = fg::buffer_sizes(points);
  for (fg::Point const& pt : points) {
    moe::ShapeSpec const& s = fg::shapes[static_cast<std::size_t>(pt.shape)].spec;
    auto h = static_cast<std::size_t>(s.hidden);
    auto t = static_cast<std::size_t>(pt.tokens);
    if (pt.op == Op::gemm) CHECK(b.gemm_act >= t * h);
    if (pt.op == Op::shared) CHECK(b.shared_acc >= t * h);
    if (pt.op == Op::experts) CHECK(b.expert_out >= t * h);
    if (pt.op == Op::attention) CHECK(b.attn_act >= static_cast<std::size_t>(pt.samples) * pt.seq * h);
    if (pt.op == Op::a2e || pt.op == Op::e2a) CHECK(b.link_bytes >= static_cast<std::size_t>(pt.work));
  }
  CHECK(b.attn_scores * fg::elem_bytes <= fg::score_budget_bytes);
  CHECK(b.total_bytes() < std::size_t{60} << 30);
  CHECK(b.total_bytes() > std::size_t{1} << 30);
}

TEST_CASE("the balanced token -> expert assignment partitions the copies evenly", "[schedule][gpu-sweep]") {
  for (auto [rows, experts, top_k] : {std::tuple{32LL, 40, 6}, std::tuple{1000LL, 32, 8}, std::tuple{655LL, 40, 6},
                                      std::tuple{0LL, 4, 2}, std::tuple{5LL, 8, 2}}) {
    CAPTURE(rows, experts);
    fg::ExpertGrouping g = fg::balanced_grouping(rows, experts);
    REQUIRE(g.offsets.size() == static_cast<std::size_t>(experts) + 1);
    REQUIRE(g.index.size() == static_cast<std::size_t>(rows));
    CHECK(g.offsets.front() == 0);
    CHECK(g.offsets.back() == rows);
    std::set<int> seen(g.index.begin(), g.index.end());
    CHECK(seen.size() == static_cast<std::size_t>(rows));  // a permutation of 0 .. rows-1
    if (rows > 0) CHECK(*seen.rbegin() == rows - 1);
    long long lo = rows, hi = 0, tiles = 0;
    for (int e = 0; e < experts; ++e) {
      long long n = g.offsets[static_cast<std::size_t>(e) + 1] - g.offsets[static_cast<std::size_t>(e)];
      lo = std::min(lo, n);
      hi = std::max(hi, n);
      tiles += (n + fg::tile_m - 1) / fg::tile_m;
      CHECK(g.tile_starts[static_cast<std::size_t>(e) + 1] == tiles);
      for (int r = g.offsets[static_cast<std::size_t>(e)]; r < g.offsets[static_cast<std::size_t>(e) + 1]; ++r)
        CHECK(g.index[static_cast<std::size_t>(r)] % experts == e);  // copy c belongs to expert c % experts
    }
    CHECK(hi - lo <= 1);
    // the grouped GEMM's grid bound: ceil(rows / tile_m) + groups row tiles
    CHECK(tiles <= (rows + fg::tile_m - 1) / fg::tile_m + experts);
    // a token's top_k copies land on distinct experts (read back from the grouping)
    std::vector<int> expert_of(static_cast<std::size_t>(rows), -1);
    for (int e = 0; e < experts; ++e)
      for (int r = g.offsets[static_cast<std::size_t>(e)]; r < g.offsets[static_cast<std::size_t>(e) + 1]; ++r)
        expert_of[static_cast<std::size_t>(g.index[static_cast<std::size_t>(r)])] = e;
    if (top_k <= experts)
      for (long long t = 0; (t + 1) * top_k <= rows; ++t) {
        std::set<int> ex;
        for (int j = 0; j < top_k; ++j) ex.insert(expert_of[static_cast<std::size_t>(t * top_k + j)]);
        CHECK(ex.size() == static_cast<std::size_t>(top_k));
        CHECK(ex.count(-1) == 0);
      }
  }
  CHECK_THROWS_WITH(fg::balanced_grouping(-1, 4), Catch::Contains("expert rows"));
  CHECK_THROWS_WITH(fg::balanced_grouping(10, 0), Catch::Contains("local expert"));
}
