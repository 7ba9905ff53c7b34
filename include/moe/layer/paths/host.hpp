#pragma once
// The host execution path of moe::Layer (moe/layer/layer.hpp): a host-memory collective
// (collective::InProcess, collective::Mpi) and a phased schedule (schedule::Sequential, or any
// schedule::PhasedPolicy: its run(pass) calls the pass's phases). The layer front owns the checks,
// the options and the ranks' agreement; this file is the executor it delegates to.
//
//   using L = moe::Layer<Model, Router, Placement, Replicas, moe::schedule::Sequential, moe::collective::Mpi>;
//   L layer(comm, placement, replicas, weights, {.max_tokens = 512});
//   std::vector<std::byte> ws(layer.workspace_size());          // caller-owned scratch
//   layer.run({.tokens = n, .x = x, .y = y}, ws);                // may be called many times
//
// Each rank passes its own tokens; the layer routes them, sends every token once to each rank that
// serves at least one of its experts (de-duplication) together with its routing metadata in the
// same record (one all-to-all-v), runs the local experts, sends one partial sum per (token, rank)
// back, and adds the partials and the shared experts in the original token order.
//
// A dispatch record is [int32 token, int32 count, int32 expert[k], float weight[k]] padded to 16
// bytes, followed by the token's hidden vector padded to 16 bytes. A combine record is the hidden
// vector of the weighted partial sum, in storage precision, in the order the records came in.
//
// With a batch-aware replica policy (replication::BatchPolicy, e.g. replication::Reactive), route()
// first gathers every rank's per-expert pair counts (one all-gather of ranks x experts int32), the
// policy routes the batch from them, and each rank deals its own pairs in token order.
//
// Any router::Policy and any replication::Policy run here: this path is the reference the other
// paths are checked against.

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"
#include "moe/core/bf16.hpp"
#include "moe/core/shape.hpp"
#include "moe/core/weights.hpp"
#include "moe/core/workspace.hpp"
#include "moe/kernels/host.hpp"
#include "moe/layer/layer.hpp"
#include "moe/kernels/records.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/router/router.hpp"
#include "moe/schedule/sequential.hpp"

namespace moe {

namespace layer {

/// The host path's executor: the pass of moe::Layer on host memory (see the file comment).
template <ModelShape Model, router::Policy Router, placement::Policy Placement, replication::Policy Replicas,
          schedule::Policy Schedule, collective::Communicator Comm>
class HostExecutor : public detail::HostMigration<Comm> {
public:
  static constexpr ShapeSpec shape = Model::spec;
  using T = storage_t<shape>;
  using DeviceOptions = void;
  using Options = LayerOptions<Schedule>;
  static constexpr bool supports_no_dedup = true;
  struct Buffers;

  static_assert(collective::Exchange<Comm>, "moe::Layer (host): the host path needs a collective with "
                                            "all_to_all(_v) and all_gather_v (collective::Exchange)");
  static_assert(schedule::PhasedPolicy<Schedule>,
                "moe::Layer (host): the schedule must be a schedule::PhasedPolicy (a run(pass) that calls the "
                "pass's route, dispatch, compute and combine), e.g. schedule::Sequential");

  struct Arguments {
    int tokens = 0;               ///< tokens on this rank (may be 0)
    T const* x = nullptr;         ///< tokens x hidden
    T* y = nullptr;               ///< tokens x hidden, written
    long long first_token = 0;    ///< global index of this rank's first token (spreads replica choice)
  };

  HostExecutor(Comm& comm, Placement placement, Replicas replicas, LayerWeights<T> weights, Options const& options)
      : detail::HostMigration<Comm>(comm), comm_(&comm), placement_(std::move(placement)),
        replicas_(std::move(replicas)), weights_(weights),
        options_(options) {
    primary_ = detail::check_layer_setup("moe::Layer", shape, comm.size(), comm.rank(), placement_, replicas_, weights_);
    meta_bytes_ = detail::record_meta_bytes(k);
    payload_bytes_ = detail::round16(h * sizeof(T));
  }

  /// The host path's own checks of a pass (the front checks tokens, max_tokens and pointers).
  [[nodiscard]] Status check_pass(Arguments const& a) const {
    return detail::check_first_token("moe::Layer", a.first_token, options_.max_tokens, comm_->size());
  }

  /// Every rank's vote, gathered over the collective.
  [[nodiscard]] bool holds_tokens() const { return true; }

  bool gather_votes(Arguments const&, detail::Vote const& mine, std::span<detail::Vote> votes) {
    detail::gather_votes(*comm_, mine, votes);
    return true;
  }

  /// One forward pass of this rank's tokens, checked and agreed by the front.
  void run(Arguments const& a, Buffers const& b, LayerStats& stats) {
    Pass pass(*this, a, b, stats);
    Schedule::run(pass);
  }

  [[nodiscard]] std::vector<int> const& primary_ranks() const { return primary_; }
  /// The replica policy (for a batch-aware one, the state of the last batch's routes).
  [[nodiscard]] Replicas const& replicas() const { return replicas_; }
  [[nodiscard]] LayerWeights<T> const& weights() const { return weights_; }
  [[nodiscard]] std::span<ExpertWeights<T> const> expert_weights() const { return weights_.experts; }

  // ---- What the front's re-planning (moe/layer/live.hpp) asks of a path ----

  /// The tables of a plan to switch to, built and checked (as the constructor checks) before the
  /// switch, so that adopt() cannot fail.
  struct NextPlan {
    Placement placement;
    Replicas replicas;
    std::vector<int> primary;
  };
  NextPlan prepare_plan(Placement placement, Replicas replicas, std::span<ExpertWeights<T> const> experts) const {
    LayerWeights<T> w = weights_;
    w.experts = experts;
    auto primary = detail::check_layer_setup("moe::Layer", shape, comm_->size(), comm_->rank(), placement, replicas, w);
    return {std::move(placement), std::move(replicas), std::move(primary)};
  }
  void adopt(NextPlan&& next, std::span<ExpertWeights<T> const> experts) noexcept {
    placement_ = std::move(next.placement);
    replicas_ = std::move(next.replicas);
    primary_ = std::move(next.primary);
    weights_.experts = experts;
  }
  /// The experts now live in the front's arena.
  void set_expert_weights(std::span<ExpertWeights<T> const> experts) { weights_.experts = experts; }
  /// The window's counts of this pass (load_counts), gathered from every rank: ready now.
  std::span<std::int32_t const> gather_loads(Buffers const& b, std::span<std::int32_t> gathered) {
    return detail::gather_load_rows(*comm_, std::span<std::int32_t const>(b.load_counts), gathered);
  }
  /// Counts gathered on an earlier pass and not read yet: none on the host.
  std::span<std::int32_t const> take_loads() { return {}; }

  static constexpr auto h = static_cast<std::size_t>(shape.hidden);
  static constexpr int k = shape.top_k;
  static constexpr auto E = static_cast<std::size_t>(shape.experts);

  struct Buffers {
    std::span<float> logits;        // max_tokens x E
    std::span<int> ids;             // max_tokens x k
    std::span<float> gate;          // max_tokens x k
    std::span<int> dest;            // max_tokens x k: rank serving each assignment
    std::span<std::byte> send;      // dispatch records, grouped by destination
    std::span<int> send_token;      // token of each dispatch record
    std::span<std::size_t> counts;  // 4 x ranks: send, recv records; send, recv bytes
    std::span<std::uint64_t> count_exchange;  // 2 x ranks
    std::span<std::size_t> cursor;  // ranks: packing cursors
    std::span<std::byte> recv;      // received dispatch records
    std::span<float> partial;       // per received record: weighted sum of its experts (fp32)
    std::span<T> back;              // partial sums in storage precision, sent back
    std::span<T> returned;          // partial sums received back, in dispatch order
    std::span<int> bucket_start;    // E + 1
    std::span<int> bucket_fill;     // E: bucketing cursors
    std::span<int> bucket_record;   // per (received record, slot): record index, grouped by expert
    std::span<float> bucket_weight;
    std::span<T> rows;              // gathered expert input rows
    std::span<float> out;           // expert output rows (fp32)
    std::span<float> scratch;       // SwiGLU intermediate
    std::span<float> y;             // max_tokens x hidden accumulator
    std::span<std::int32_t> pair_counts;  // E: this rank's pairs per expert (batch-aware replicas)
    std::span<std::int32_t> all_counts;   // ranks x E: every rank's, gathered
    std::span<std::int32_t> load_counts;  // E + ranks: this pass's pairs per expert, then per serving rank
                                          // (load window, LayerOptions::live.window > 0)
  };

  [[nodiscard]] std::size_t slots_per_token() const {
    return options_.deduplicate ? static_cast<std::size_t>(std::min(k, comm_->size())) : static_cast<std::size_t>(k);
  }
  [[nodiscard]] std::size_t max_send_records() const {
    return static_cast<std::size_t>(options_.max_tokens) * slots_per_token();
  }
  [[nodiscard]] std::size_t max_recv_records() const {
    std::size_t per_peer = static_cast<std::size_t>(options_.max_tokens) * (options_.deduplicate ? 1 : static_cast<std::size_t>(k));
    return per_peer * static_cast<std::size_t>(comm_->size());
  }
  /// Token-expert assignments a rank can receive: k per token of every rank, whether a record
  /// carries one of them or several.
  [[nodiscard]] std::size_t max_recv_assignments() const {
    return static_cast<std::size_t>(options_.max_tokens) * static_cast<std::size_t>(comm_->size()) * k;
  }
  /// Rows one local expert can get: a token picks an expert at most once, so one per token of every rank.
  [[nodiscard]] std::size_t max_expert_rows() const {
    return static_cast<std::size_t>(options_.max_tokens) * static_cast<std::size_t>(comm_->size());
  }

  void carve(core::Carver& c, Buffers& b) const {
    auto m = static_cast<std::size_t>(options_.max_tokens);
    auto ranks = static_cast<std::size_t>(comm_->size());
    std::size_t rec = meta_bytes_ + payload_bytes_;
    std::size_t rows = max_expert_rows();  // >= m, the rows of the shared experts
    // The routed experts run on at most `rows` rows, the shared ones on at most m.
    std::size_t scratch = kernels::host::swiglu_scratch(static_cast<int>(rows), shape.expert_ffn);
    if (shape.shared_experts > 0)
      scratch = std::max(scratch, kernels::host::swiglu_scratch(static_cast<int>(m), shape.shared_ffn));
    b.logits = c.take<float>(m * E);
    b.ids = c.take<int>(m * k);
    b.gate = c.take<float>(m * k);
    b.dest = c.take<int>(m * k);
    b.send = c.take<std::byte>(max_send_records() * rec);
    b.send_token = c.take<int>(max_send_records());
    b.counts = c.take<std::size_t>(4 * ranks);
    b.count_exchange = c.take<std::uint64_t>(2 * ranks);
    b.cursor = c.take<std::size_t>(ranks);
    b.recv = c.take<std::byte>(max_recv_records() * rec);
    b.partial = c.take<float>(max_recv_records() * h);
    b.back = c.take<T>(max_recv_records() * h);
    b.returned = c.take<T>(max_send_records() * h);
    b.bucket_start = c.take<int>(E + 1);
    b.bucket_fill = c.take<int>(E);
    b.bucket_record = c.take<int>(max_recv_assignments());
    b.bucket_weight = c.take<float>(max_recv_assignments());
    b.rows = c.take<T>(rows * h);
    b.out = c.take<float>(rows * h);
    b.scratch = c.take<float>(scratch);
    b.y = c.take<float>(m * h);
    if constexpr (replication::BatchPolicy<Replicas>) {
      b.pair_counts = c.take<std::int32_t>(E);
      b.all_counts = c.take<std::int32_t>(ranks * E);
    }
    if (options_.live.window > 0) b.load_counts = c.take<std::int32_t>(E + ranks);
  }

  /// The state of one forward pass; the Schedule calls its phases.
  class Pass {
  public:
    Pass(HostExecutor& layer, Arguments const& a, Buffers const& b, LayerStats& stats)
        : L(layer), a_(a), b_(b), stats_(stats) {
      ranks_ = L.comm_->size();
      rank_ = L.comm_->rank();
      rec_ = L.meta_bytes_ + L.payload_bytes_;
      stats_.tokens = a.tokens;
      stats_.record_bytes = rec_;
      stats_.meta_bytes = L.meta_bytes_;
    }

    /// Gate GEMM, router, and the rank that serves each assignment.
    void route() {
      auto t = static_cast<std::size_t>(a_.tokens);
      kernels::host::gate_logits(a_.x, a_.tokens, shape.hidden, L.weights_.router, shape.experts, b_.logits.data());
      std::span<float const> bias;
      if (L.weights_.router_bias) bias = {L.weights_.router_bias, E};
      router::route_all<Router>(shape, b_.logits, bias, a_.tokens, b_.ids, b_.gate);
      if constexpr (replication::BatchPolicy<Replicas>) {
        plan_batch();
      } else {
        for (std::size_t i = 0; i < t * k; ++i) {
          int e = b_.ids[i];
          int d = L.replicas_.choose(e, L.primary_[static_cast<std::size_t>(e)], rank_,
                                     a_.first_token + static_cast<long long>(i / k));
          b_.dest[i] = d;
          stats_.local_assignments += d == rank_;
        }
        stats_.assignments = static_cast<long long>(t * k);
      }
      count_loads();
    }

    /// The load window's counts of this pass: pairs per expert, then pairs per serving rank.
    void count_loads() {
      if (b_.load_counts.empty()) return;
      std::fill(b_.load_counts.begin(), b_.load_counts.end(), 0);
      auto t = static_cast<std::size_t>(a_.tokens);
      for (std::size_t i = 0; i < t * k; ++i) {
        ++b_.load_counts[static_cast<std::size_t>(b_.ids[i])];
        ++b_.load_counts[E + static_cast<std::size_t>(b_.dest[i])];
      }
    }

    /// Batch-aware replicas: every rank's pairs per expert, gathered; the policy routes the batch
    /// from them, and this rank's pairs of each expert are dealt in token order.
    void plan_batch()
      requires replication::BatchPolicy<Replicas>
    {
      auto t = static_cast<std::size_t>(a_.tokens);
      auto mine = b_.pair_counts;
      std::fill(mine.begin(), mine.end(), 0);
      for (std::size_t i = 0; i < t * k; ++i) ++mine[static_cast<std::size_t>(b_.ids[i])];
      auto ranks = static_cast<std::size_t>(ranks_);
      auto block = b_.counts.first(ranks);
      std::fill(block.begin(), block.end(), E * sizeof(std::int32_t));
      auto before = L.comm_->counters();
      L.comm_->all_gather_v(std::as_bytes(mine), std::as_writable_bytes(b_.all_counts), block);
      stats_.control_bytes += L.comm_->counters().bytes_sent() - before.bytes_sent();
      // A rank that agrees on the options routes at most max_tokens x k pairs; the rule's work
      // grows with the pairs, so more is refused rather than computed.
      auto most = static_cast<long long>(L.options_.max_tokens) * k;
      for (std::size_t p = 0; p < ranks; ++p) {
        long long sum = 0;
        for (std::size_t e = 0; e < E; ++e) {
          std::int32_t c = b_.all_counts[p * E + e];
          check(c >= 0, "moe::Layer: rank ", p, " reported ", c, " pairs of expert ", e);
          sum += c;
        }
        check(sum <= most, "moe::Layer: rank ", p, " reported ", sum, " token-expert pairs, more than the ", most,
              " of max_tokens x top_k on rank ", rank_, " (do all ranks use the same LayerOptions::max_tokens?)");
      }
      L.replicas_.plan_batch(b_.all_counts);
      std::fill(mine.begin(), mine.end(), 0);  // now: this rank's pairs of each expert dealt so far
      for (std::size_t i = 0; i < t * k; ++i) {
        auto e = static_cast<std::size_t>(b_.ids[i]);
        int d = L.replicas_.dealt(static_cast<int>(e), rank_, mine[e]++);
        b_.dest[i] = d;
        stats_.local_assignments += d == rank_;
      }
      stats_.assignments = static_cast<long long>(t * k);
    }

    /// Packs records grouped by destination and exchanges them in one all-to-all-v.
    void dispatch() {
      auto ranks = static_cast<std::size_t>(ranks_);
      auto send_records = b_.counts.subspan(0, ranks);
      auto recv_records = b_.counts.subspan(ranks, ranks);
      std::fill(send_records.begin(), send_records.end(), 0);
      for_each_record([&](int, int d, std::span<int const>) { ++send_records[static_cast<std::size_t>(d)]; });
      auto cursor = b_.cursor;
      cursor[0] = 0;
      for (std::size_t d = 1; d < ranks; ++d) cursor[d] = cursor[d - 1] + send_records[d - 1];
      for_each_record([&](int t, int d, std::span<int const> slots) {
        std::size_t r = cursor[static_cast<std::size_t>(d)]++;
        b_.send_token[r] = t;
        write_record(b_.send.data() + r * rec_, t, slots);
      });
      for (std::size_t d = 0; d < ranks; ++d) {
        (d == static_cast<std::size_t>(rank_) ? stats_.records_local : stats_.records_remote) +=
            static_cast<long long>(send_records[d]);
      }

      // Record counts first (a fixed-size exchange), then the records themselves.
      for (std::size_t d = 0; d < ranks; ++d) b_.count_exchange[d] = send_records[d];
      auto before = L.comm_->counters();
      L.comm_->all_to_all(std::as_bytes(b_.count_exchange.first(ranks)),
                          std::as_writable_bytes(b_.count_exchange.subspan(ranks, ranks)), sizeof(std::uint64_t));
      std::size_t total = 0;
      for (std::size_t p = 0; p < ranks; ++p) {
        recv_records[p] = static_cast<std::size_t>(b_.count_exchange[ranks + p]);
        total += recv_records[p];
      }
      check(total <= L.max_recv_records(), "moe::Layer: rank ", rank_, " would receive ", total,
            " records but its workspace holds ", L.max_recv_records(),
            " (do all ranks use the same LayerOptions::max_tokens?)");
      received_ = total;
      stats_.records_received = static_cast<long long>(total);
      auto send_bytes = b_.counts.subspan(2 * ranks, ranks);
      auto recv_bytes = b_.counts.subspan(3 * ranks, ranks);
      for (std::size_t p = 0; p < ranks; ++p) {
        send_bytes[p] = send_records[p] * rec_;
        recv_bytes[p] = recv_records[p] * rec_;
      }
      auto middle = L.comm_->counters();
      L.comm_->all_to_all_v(b_.send, send_bytes, b_.recv, recv_bytes);
      auto after = L.comm_->counters();
      stats_.control_bytes += middle.bytes_sent() - before.bytes_sent();
      stats_.dispatch_bytes = after.bytes_sent() - middle.bytes_sent();
    }

    /// Runs every local expert on the rows that chose it and forms one weighted partial per record.
    void compute() {
      auto starts = b_.bucket_start;
      std::fill(starts.begin(), starts.end(), 0);
      for (std::size_t r = 0; r < received_; ++r) {
        int const count = record(r).header().count;
        check(count >= 1 && count <= k, "moe::Layer: corrupt record (", count, " experts)");
        for (int j = 0; j < count; ++j) {
          int e = experts_of(r)[j];
          check(e >= 0 && e < shape.experts && L.replicas_.holds(e, L.primary_[static_cast<std::size_t>(e)], rank_),
                "moe::Layer: rank ", rank_, " received a token for expert ", e,
                " which it does not serve (do all ranks use the same placement and replica tables?)");
          ++starts[static_cast<std::size_t>(e) + 1];
        }
      }
      std::partial_sum(starts.begin(), starts.end(), starts.begin());
      // Ranks that agree on the options send at most k assignments per token, each expert at most
      // once per token; the workspace holds no more (max_recv_assignments, max_expert_rows).
      check(static_cast<std::size_t>(starts[E]) <= L.max_recv_assignments(), "moe::Layer: rank ", rank_,
            " received ", starts[E], " token-expert assignments but its workspace holds ", L.max_recv_assignments(),
            " (do all ranks use the same LayerOptions?)");
      for (std::size_t e = 0; e < E; ++e)
        check(static_cast<std::size_t>(starts[e + 1] - starts[e]) <= L.max_expert_rows(), "moe::Layer: rank ", rank_,
              " received ", starts[e + 1] - starts[e], " rows for expert ", e, " but its workspace holds ",
              L.max_expert_rows(), " (do all ranks use the same LayerOptions?)");
      auto fill = b_.bucket_fill;
      std::copy(starts.begin(), starts.end() - 1, fill.begin());
      for (std::size_t r = 0; r < received_; ++r) {
        for (int j = 0, count = record(r).header().count; j < count; ++j) {
          int e = experts_of(r)[j];
          int at = fill[static_cast<std::size_t>(e)]++;
          b_.bucket_record[static_cast<std::size_t>(at)] = static_cast<int>(r);
          b_.bucket_weight[static_cast<std::size_t>(at)] = weights_of(r)[j];
        }
      }
      std::fill(b_.partial.begin(), b_.partial.begin() + static_cast<std::ptrdiff_t>(received_ * h), 0.0f);
      for (std::size_t e = 0; e < E; ++e) {
        int first = starts[e], n = starts[e + 1] - first;
        if (n == 0) continue;
        for (int i = 0; i < n; ++i) {
          std::size_t r = static_cast<std::size_t>(b_.bucket_record[static_cast<std::size_t>(first + i)]);
          std::memcpy(b_.rows.data() + static_cast<std::size_t>(i) * h, payload(r), h * sizeof(T));
        }
        kernels::host::swiglu_expert(b_.rows.data(), n, shape.hidden, shape.expert_ffn, L.weights_.experts[e],
                                     b_.out.data(), b_.scratch);
        for (int i = 0; i < n; ++i) {
          auto at = static_cast<std::size_t>(first + i);
          float w = b_.bucket_weight[at];
          float* dst = b_.partial.data() + static_cast<std::size_t>(b_.bucket_record[at]) * h;
          float const* src = b_.out.data() + static_cast<std::size_t>(i) * h;
          for (std::size_t q = 0; q < h; ++q) dst[q] += w * src[q];
        }
      }
      for (std::size_t i = 0; i < received_ * h; ++i) b_.back[i] = from_float<T>(b_.partial[i]);
    }

    /// Sends the partials back, adds them and the shared experts in the original token order.
    void combine() {
      auto ranks = static_cast<std::size_t>(ranks_);
      auto send_records = b_.counts.subspan(0, ranks);
      auto recv_records = b_.counts.subspan(ranks, ranks);
      auto back_bytes = b_.counts.subspan(2 * ranks, ranks);
      auto ret_bytes = b_.counts.subspan(3 * ranks, ranks);
      std::size_t sent = 0;
      for (std::size_t p = 0; p < ranks; ++p) {
        back_bytes[p] = recv_records[p] * h * sizeof(T);
        ret_bytes[p] = send_records[p] * h * sizeof(T);
        sent += send_records[p];
      }
      auto before = L.comm_->counters();
      L.comm_->all_to_all_v(std::as_bytes(b_.back), back_bytes, std::as_writable_bytes(b_.returned), ret_bytes);
      stats_.combine_bytes = L.comm_->counters().bytes_sent() - before.bytes_sent();

      auto t = static_cast<std::size_t>(a_.tokens);
      std::fill(b_.y.begin(), b_.y.begin() + static_cast<std::ptrdiff_t>(t * h), 0.0f);
      for (auto const& sw : L.weights_.shared) {
        if (t == 0) break;
        kernels::host::swiglu_expert(a_.x, a_.tokens, shape.hidden, shape.shared_ffn, sw, b_.out.data(), b_.scratch);
        for (std::size_t i = 0; i < t * h; ++i) b_.y[i] += b_.out[i];
      }
      for (std::size_t r = 0; r < sent; ++r) {
        float* dst = b_.y.data() + static_cast<std::size_t>(b_.send_token[r]) * h;
        T const* src = b_.returned.data() + r * h;
        for (std::size_t q = 0; q < h; ++q) dst[q] += to_float(src[q]);
      }
      for (std::size_t i = 0; i < t * h; ++i) a_.y[i] = from_float<T>(b_.y[i]);
    }

  private:
    /// Calls f(token, destination, slots) once per record this rank sends, destinations ascending
    /// within a token. With de-duplication `slots` are all of the token's assignments served by that
    /// destination; without, one assignment.
    template <class F>
    void for_each_record(F&& f) const {
      int slots[k];
      for (int t = 0; t < a_.tokens; ++t) {
        int const* dest = b_.dest.data() + static_cast<std::size_t>(t) * k;
        if (!L.options_.deduplicate) {
          for (int j = 0; j < k; ++j) {
            slots[0] = j;
            f(t, dest[j], std::span<int const>(slots, 1));
          }
          continue;
        }
        for (int j = 0; j < k; ++j) {
          bool seen = false;
          for (int q = 0; q < j; ++q) seen |= dest[q] == dest[j];
          if (seen) continue;
          int n = 0;
          for (int q = j; q < k; ++q)
            if (dest[q] == dest[j]) slots[n++] = q;
          f(t, dest[j], std::span<int const>(slots, static_cast<std::size_t>(n)));
        }
      }
    }

    void write_record(std::byte* out, int t, std::span<int const> slots) const {
      std::int32_t ids[k];
      float w[k];
      for (std::size_t i = 0; i < slots.size(); ++i) {
        std::size_t at = static_cast<std::size_t>(t) * k + static_cast<std::size_t>(slots[i]);
        ids[i] = b_.ids[at];
        w[i] = b_.gate[at];
      }
      detail::write_record_meta(out, L.meta_bytes_, k, t, std::span(ids, slots.size()), std::span(w, slots.size()));
      std::memcpy(out + L.meta_bytes_, a_.x + static_cast<std::size_t>(t) * h, h * sizeof(T));
    }

    [[nodiscard]] detail::RecordView record(std::size_t r) const { return {b_.recv.data() + r * rec_, k}; }
    [[nodiscard]] std::int32_t const* experts_of(std::size_t r) const { return record(r).experts(); }
    [[nodiscard]] float const* weights_of(std::size_t r) const { return record(r).weights(); }
    [[nodiscard]] std::byte const* payload(std::size_t r) const { return b_.recv.data() + r * rec_ + L.meta_bytes_; }

    HostExecutor& L;
    Arguments const& a_;
    Buffers b_;
    LayerStats& stats_;
    int ranks_ = 0;
    int rank_ = 0;
    std::size_t rec_ = 0;
    std::size_t received_ = 0;
  };

  Comm* comm_;
  Placement placement_;
  Replicas replicas_;
  LayerWeights<T> weights_;
  Options options_;
  std::vector<int> primary_;
  std::size_t meta_bytes_ = 0;
  std::size_t payload_bytes_ = 0;
};

}  // namespace layer

template <>
struct detail::path_executor<ExecutionPath::host> {
  template <class... Policies>
  using type = layer::HostExecutor<Policies...>;
};

}  // namespace moe
