#pragma once
// Host executor of a FinDEP / PPPipe schedule for one MoE layer on disaggregated ranks: ranks
// [0, ag) form the attention group (AG: tokens, router, shared experts), ranks [ag, ag + eg) the
// expert group (EG: the routed experts, placed by a placement::Table over the eg EG ranks).
//
//   moe::schedule::FinDepExecutor<Router, float, Comm> ex(comm, shape, ag, eg_placement, weights, max_tokens);
//   moe::schedule::FinDepExecutor<Router, float, Comm> ex2(comm, shape, ag, eg_placement, weights, max_tokens,
//                                                          eg_replicas);  // replicated experts
//   std::vector<std::byte> ws(ex.workspace_size());   // caller-owned scratch (differs AG / EG)
//   ex.run({.tokens = n, .x = x, .y = y}, config, ws); // every rank calls it; EG ranks pass no tokens
//   ex.run({.tokens = n, .x = x, .y = y}, config);     // the same with a workspace the executor keeps
//
// `max_tokens` bounds the tokens of any AG rank in one run() (it sizes the workspace; every rank
// must use the same value, because EG ranks size their receive buffers with it).
//
// Replicated experts: an optional replication::Table over the EG indices (for each expert the EG
// ranks holding a copy, the placement's among them) lets several EG ranks serve one expert, as
// CRAFT or EPLB plan it. Token t of AG rank p goes for an expert whose table entry lists the
// copies c_0..c_{n-1} to c_{(p + t) mod n}: a hot expert's tokens spread evenly over its copies
// without any communication, and each token still goes once to each EG rank that serves one of its
// experts. (The EP layer's replication::Table::choose also prefers a copy on the token's own rank;
// an AG rank holds none.)
// An EG rank needs the weights of every expert it holds a copy of.
//
// An AG rank splits its tokens into r1 micro-batches and each micro-batch into r2 chunks and runs
// three threads, one per resource of the schedule:
//   compute  A(i) = gate + router of micro-batch i, S(i) = its shared experts, in AASS or ASAS order
//   A2E      after A(i) (FinDEP) or S(i) (PPPipe): for each chunk, one message per EG rank with the
//            chunk's tokens that have an expert there (send), in (micro-batch, chunk) order
//   E2A      receives each chunk's partial sums from every EG rank (recv) and adds them
// An EG rank takes the chunks in the same order, runs its experts and sends one weighted partial sum
// per received token back (in fp32). The output is shared + sum over EG ranks of the partials, the
// same function as the sequential layer (moe::reference_forward) up to summation order.
//
// Messages of chunk c = i * r2 + j (micro-batch i, chunk j), with w = c mod tag_window:
//   A2E header  (AG -> EG, tag 3w):     uint64 {record count, r1, r2, c}; the EG rank checks that
//                                       r1, r2 and c are its own, so ranks run with different
//                                       schedules fail with a clear error instead of mixing data
//   A2E records (AG -> EG, tag 3w + 1): [int32 token (index in the AG rank's batch), int32 count,
//                                       int32 expert[k], float weight[k], T hidden[h]] per record
//   E2A partials (EG -> AG, tag 3w + 2): count x hidden floats, records in the order they were sent
//   split counts (AG -> AG, tag 3 * tag_window), only with a per-micro-batch split (below)
// Tags stay at most 3 * tag_window = 12288, inside the 32767 every MPI guarantees (MPI_TAG_UB). A
// tag is reused every tag_window chunks and by the next run(); both backends deliver the messages
// of one (source, destination, tag) in the order they were sent (MPI's non-overtaking rule holds
// because on every rank one thread does all of the sends and the receives of one direction).
//
// Per-micro-batch split (split_each_micro_batch, replication::BatchSplit): instead of the fixed
// rule, each micro-batch's pairs are split over the copies so that the busiest EG rank receives the
// fewest pairs (moe/replication/batch_split.hpp). Before its first chunk, each AG rank counts the
// micro-batch's pairs per expert and exchanges the counts with the other AG ranks (experts x int32
// to each; pair by pair in one global order, the lower rank sending first, so blocking sends cannot
// deadlock). Every AG rank then solves the same split and deals its own pairs in token order. EG
// ranks take no part: they serve whatever records arrive. The split sees the EG ranks and, after
// them, the AG ranks (BatchSplit::with_sources), each AG rank on a server shared with no EG rank (a
// tie-break the split cannot use here: no pair is ever on its own rank).
//
// Threads: on an AG rank the A2E thread is the only one that sends and the E2A thread the only one
// that receives from EG ranks, and they use different tags (3w, 3w + 1 out; 3w + 2 in); the split's
// counts are sent and received by the A2E thread alone. The collective's send
// and recv are therefore called from two threads of a rank at once: InProcess allows it; with
// collective::Mpi the library must grant MPI_THREAD_MULTIPLE (collective::MpiSession asks for it;
// the constructor cannot check it, the MPI test does). An EG rank uses its calling thread only.
// Before any data moves, run() checks its arguments on every rank and the ranks exchange their
// verdicts and schedules (one all-gather of 256 bytes per rank): if any rank rejects its input (an
// AG rank whose tokens r1 does not divide, a short workspace, ...) or the ranks disagree on the
// pipeline, order, r1 or r2, EVERY rank throws moe::Error with the reason, instead of the others
// waiting forever for messages that never come (MPI has no timeout). The EG ranks still check each
// A2E header. A failure after that step (a broken connection) can still stall MPI peers; InProcess
// aborts them.

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/collective/pairwise.hpp"
#include "moe/config.hpp"
#include "moe/core/bf16.hpp"
#include "moe/core/shape.hpp"
#include "moe/core/workspace.hpp"
#include "moe/kernels/host.hpp"
#include "moe/core/weights.hpp"
#include "moe/plan/placement_table.hpp"
#include "moe/plan/replica_table.hpp"
#include "moe/kernels/records.hpp"
#include "moe/replication/batch_split.hpp"
#include "moe/router/router.hpp"
#include "moe/schedule/problem.hpp"

namespace moe::schedule {

template <router::Policy Router, class T, collective::Collective Comm>
class FinDepExecutor {
  static_assert(Comm::memory == collective::Memory::host, "FinDepExecutor: host collectives only");

public:
  struct Arguments {
    int tokens = 0;        ///< tokens on this AG rank (EG ranks: 0)
    T const* x = nullptr;  ///< tokens x hidden
    T* y = nullptr;        ///< tokens x hidden, written
  };

  /// Chunks between two reuses of a tag (see the header comment).
  static constexpr int tag_window = 4096;

  /// `placement` maps each routed expert to an EG rank index in [0, eg). `max_tokens` (>= 1) is the
  /// most tokens an AG rank passes to one run().
  /// `replicas` (optional; empty: one copy per expert, on the placement's EG rank) lists for each
  /// expert the EG indices holding a copy (see the header comment).
  FinDepExecutor(Comm& comm, ShapeSpec shape, int ag, placement::Table placement, LayerWeights<T> weights,
                 int max_tokens, replication::Table const& replicas = {})
      : comm_(&comm), s_(shape), ag_(ag), eg_(comm.size() - ag), placement_(std::move(placement)), w_(weights),
        max_tokens_(max_tokens), votes_(static_cast<std::size_t>(comm.size())),
        vote_bytes_(static_cast<std::size_t>(comm.size()), sizeof(Vote)) {
    validate(s_);
    check(Router::fits(s_), "FinDepExecutor: router ", Router::name, " does not fit the shape");
    check(ag_ >= 1, "FinDepExecutor: the attention group (AG) is empty; it needs at least one rank, got ag = ", ag_);
    check(eg_ >= 1, "FinDepExecutor: the expert group (EG) is empty: the collective has ", comm.size(),
          " ranks and ", ag_, " of them are AG ranks");
    check(max_tokens_ >= 1, "FinDepExecutor: max_tokens (tokens per AG rank) must be at least 1, got ", max_tokens_);
    placement_.validate(s_.experts, eg_);
    if (!replicas.replicas().empty()) replicas.validate(s_.experts, eg_, placement_.ranks());
    copies_ = replication::copy_lists(placement_.ranks(), replicas);
    check(static_cast<int>(w_.experts.size()) == s_.experts, "FinDepExecutor: weights list ", w_.experts.size(),
          " experts, the shape has ", s_.experts);
    check(static_cast<int>(w_.shared.size()) == s_.shared_experts, "FinDepExecutor: weights list ",
          w_.shared.size(), " shared experts, the shape has ", s_.shared_experts);
    if (is_ag()) {
      check(w_.router != nullptr, "FinDepExecutor: AG rank ", comm.rank(), " has no router weights");
      for (auto const& sw : w_.shared)
        check(sw.present(), "FinDepExecutor: AG rank ", comm.rank(), " misses shared-expert weights");
    } else {
      for (int e = 0; e < s_.experts; ++e)
        check(!serves(e, eg_index()) || w_.experts[static_cast<std::size_t>(e)].present(),
              "FinDepExecutor: EG rank ", comm.rank(), " serves expert ", e, " but its weights are missing");
    }
  }

  /// Whether EG index `g` holds a copy of expert `e`.
  [[nodiscard]] bool serves(int e, int g) const { return copies_.holds(e, g); }

  /// The EG index that serves expert `e` for token `t` (index in this AG rank's batch).
  [[nodiscard]] int destination(int e, int t) const {
    int first = copies_.first[static_cast<std::size_t>(e)];
    return copies_.ranks[static_cast<std::size_t>(first + (comm_->rank() + t) % copies_.copies(e))];
  }

  /// Splits each micro-batch's pairs with `split` instead of the fixed rule (see the header
  /// comment). `split` is over EG indices (its copies, and the servers of the EG ranks); its copies
  /// must be those this executor was built with.
  void split_each_micro_batch(replication::BatchSplit const& split) {
    check_split(split, copies_);
    split_.emplace(split.with_sources(ag_));  // EG indices first, then the AG ranks
    split_counts_.assign(static_cast<std::size_t>(ag_ + eg_) * static_cast<std::size_t>(s_.experts), 0);
  }

  // ---- Switching plans (moe::Layer's re-planning while serving, LayerOptions::live) ----

  /// What a switch of plan replaces: the expert -> EG index table, each expert's copies, and the
  /// per-micro-batch split over them when this executor splits.
  struct Tables {
    placement::Table placement;
    replication::CopyLists copies;
    std::optional<replication::BatchSplit> split;  // with the AG ranks as sources
  };
  /// Another plan's tables, checked as the constructor and split_each_micro_batch check theirs (an
  /// EG rank must have in `experts` the weights of every expert the plan gives it), so that adopt()
  /// cannot fail. `split`: the plan's split over EG indices, given exactly when this executor splits.
  [[nodiscard]] Tables prepare_tables(placement::Table placement, replication::Table const& replicas,
                                      std::span<ExpertWeights<T> const> experts,
                                      replication::BatchSplit const* split = nullptr) const {
    placement.validate(s_.experts, eg_);
    if (!replicas.replicas().empty()) replicas.validate(s_.experts, eg_, placement.ranks());
    Tables t{std::move(placement), {}, {}};
    t.copies = replication::copy_lists(t.placement.ranks(), replicas);
    check(static_cast<int>(experts.size()) == s_.experts, "FinDepExecutor: the next plan's weights list ",
          experts.size(), " experts, the shape has ", s_.experts);
    if (!is_ag())
      for (int e = 0; e < s_.experts; ++e)
        check(!t.copies.holds(e, eg_index()) || experts[static_cast<std::size_t>(e)].present(), "FinDepExecutor: EG rank ",
              comm_->rank(), " would serve expert ", e, " in the next plan but has no weights for it");
    check(split_.has_value() == (split != nullptr), "FinDepExecutor: the next plan ",
          split ? "brings a per-micro-batch split to an executor without one" : "has no split, but this executor splits");
    if (split) {
      check_split(*split, t.copies);
      t.split.emplace(split->with_sources(ag_));
    }
    return t;
  }
  /// Switches to tables made by prepare_tables, reading the experts' weights from `experts` (alive
  /// as long as they are in use). Between passes.
  void adopt(Tables&& t, std::span<ExpertWeights<T> const> experts) noexcept {
    placement_ = std::move(t.placement);
    copies_ = std::move(t.copies);
    if (t.split) split_ = std::move(t.split);
    w_.experts = experts;
  }
  /// The routed experts' weights this executor reads.
  [[nodiscard]] std::span<ExpertWeights<T> const> expert_weights() const { return w_.experts; }
  /// The same experts' weights, somewhere else (the layer's arena). Between passes.
  void set_expert_weights(std::span<ExpertWeights<T> const> experts) {
    check(static_cast<int>(experts.size()) == s_.experts, "FinDepExecutor: weights list ", experts.size(),
          " experts, the shape has ", s_.experts);
    w_.experts = experts;
  }
  /// Each routed expert's EG index in the placement.
  [[nodiscard]] placement::Table const& placement() const { return placement_; }
  /// Bytes of split counts this rank sent in its last run() (in the collective's send counters too).
  [[nodiscard]] std::size_t split_bytes_sent() const { return split_bytes_; }
  /// AG rank, last run() with a per-micro-batch split: the pairs each EG index received, by the
  /// splits (summed over the micro-batches), and the sum over micro-batches of the busiest EG
  /// index's pairs.
  [[nodiscard]] std::vector<long long> const& split_loads() const { return split_load_; }
  [[nodiscard]] long long split_max_sum() const { return split_max_sum_; }
  /// EG rank: the token-expert pairs it received in its last run().
  [[nodiscard]] long long pairs_received() const { return pairs_received_; }
  /// AG rank: the dispatch records (one per token and EG rank serving one of its experts) it sent
  /// in its last run(); EG rank: those it received. 0 on the other kind of rank.
  [[nodiscard]] long long records_sent() const { return records_sent_; }
  [[nodiscard]] long long records_received() const { return records_received_; }
  /// The load window's row of this rank for its last run() of `tokens` tokens with `workspace`
  /// (moe/layer/live.hpp): `row` (experts + ranks of the world) gets, on an AG rank, its pairs per
  /// expert and then the pairs it sent to each rank (EG index g is rank attention_ranks() + g); an
  /// EG rank's row is zero, since every pair is counted once, by the AG rank that routed it.
  void count_loads(std::span<std::byte> workspace, int tokens, std::span<std::int32_t> row) const {
    auto E = static_cast<std::size_t>(s_.experts);
    check(row.size() == E + static_cast<std::size_t>(ag_ + eg_) && tokens >= 0 && tokens <= max_tokens_,
          "FinDepExecutor::count_loads: a row of ", row.size(), " counts or ", tokens, " tokens");
    std::fill(row.begin(), row.end(), 0);
    if (!is_ag()) return;
    core::Carver c(workspace);
    AgBuffers b;
    carve(c, b);
    std::size_t n = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(s_.top_k);
    for (std::size_t i = 0; i < n; ++i) {
      ++row[static_cast<std::size_t>(b.ids[i])];
      ++row[E + static_cast<std::size_t>(ag_ + b.dest[i])];
    }
  }

  [[nodiscard]] bool is_ag() const { return comm_->rank() < ag_; }
  [[nodiscard]] int eg_index() const { return comm_->rank() - ag_; }
  [[nodiscard]] int attention_ranks() const { return ag_; }
  [[nodiscard]] int expert_ranks() const { return eg_; }
  [[nodiscard]] int max_tokens() const { return max_tokens_; }

  /// Bytes of caller-owned workspace run() needs on this rank (an AG and an EG rank differ).
  [[nodiscard]] std::size_t workspace_size() const {
    core::Carver c;
    if (is_ag()) {
      AgBuffers b;
      carve(c, b);
    } else {
      EgBuffers b;
      carve(c, b);
    }
    return c.used();
  }

  /// Runs the layer under schedule `c` (pipeline, order, r1, r2; m_a is not used: the micro-batch
  /// size is tokens / r1). Every rank must call it with the same r1 and r2.
  /// `verdict`: the caller's own check of its arguments (e.g. the disaggregated moe::Layer's
  /// can_implement); a rejection there takes part in the ranks' agreement like the executor's own
  /// checks, so every rank stops with its message.
  void run(Arguments const& a, Config const& c, std::span<std::byte> workspace, Status const& verdict = {}) {
    agree(a, c, workspace.size(), verdict);
    run_agreed(a, c, workspace);
  }

  /// The pass without the agreement step, for a caller that has already agreed with every rank on
  /// the arguments and the configuration (moe::Layer's front does, once for every path).
  void run_agreed(Arguments const& a, Config const& c, std::span<std::byte> workspace) {
    core::Carver carver(workspace);
    if (is_ag()) {
      AgBuffers b;
      carve(carver, b);
      run_ag(a, c, b);
    } else {
      EgBuffers b;
      carve(carver, b);
      run_eg(a, c, b);
    }
  }

  /// The same with a workspace the executor allocates once and keeps.
  void run(Arguments const& a, Config const& c) {
    own_.resize(workspace_size());
    run(a, c, own_);
  }

private:
  /// One rank's verdict on a run(), exchanged before any data moves (256 bytes).
  struct Vote {
    std::int32_t ok = 0, r1 = 0, r2 = 0, pipeline = 0, order = 0, pad[3] = {};
    char message[224] = {};
  };
  static_assert(sizeof(Vote) == 256);

  /// Everything a rank can check alone; throws moe::Error naming the problem.
  void check_local(Arguments const& a, Config const& c, std::size_t workspace_bytes) const {
    check(c.r1 >= 1, "FinDepExecutor: r1 (micro-batches) must be at least 1, got ", c.r1);
    check(c.r2 >= 1, "FinDepExecutor: r2 (token chunks) must be at least 1, got ", c.r2);
    check(c.pipeline == Pipeline::findep || c.r2 == 1, "FinDepExecutor: PPPipe has no token chunks; r2 must be 1, got ",
          c.r2);
    check(static_cast<long long>(c.r1) * c.r2 <= max_tokens_, "FinDepExecutor: r1 * r2 = ", c.r1, " * ", c.r2,
          " chunks exceed max_tokens = ", max_tokens_, " (a chunk holds at least one token of a full batch)");
    core::check_workspace("FinDepExecutor", workspace_bytes, workspace_size());
    if (!is_ag()) {
      check(a.tokens == 0, "FinDepExecutor: EG rank ", comm_->rank(), " was given ", a.tokens,
            " tokens; tokens live on the AG ranks");
      return;
    }
    check(a.tokens >= 0, "FinDepExecutor: negative token count ", a.tokens);
    check(a.tokens <= max_tokens_, "FinDepExecutor: AG rank ", comm_->rank(), " passes ", a.tokens,
          " tokens, above the max_tokens of ", max_tokens_, " the executor was built for");
    check(a.tokens == 0 || (a.x && a.y), "FinDepExecutor: input or output pointer is null");
    check(a.tokens % c.r1 == 0, "FinDepExecutor: r1 = ", c.r1, " does not divide the ", a.tokens,
          " tokens of AG rank ", comm_->rank());
    check((a.tokens / c.r1) % c.r2 == 0, "FinDepExecutor: r2 = ", c.r2, " does not divide the ", a.tokens / c.r1,
          " tokens of a micro-batch on AG rank ", comm_->rank());
  }

  /// Every rank checks its own arguments, then all ranks exchange their verdicts and schedules (one
  /// all-gather of 256 bytes per rank) and either all go on or all throw. Without this step a rank
  /// that rejects its input would leave its peers waiting forever for its messages (MPI has no
  /// timeout); now every rank reports the first rejecting rank's reason, or the ranks that disagree
  /// on the schedule.
  void agree(Arguments const& a, Config const& c, std::size_t workspace_bytes, Status const& verdict) {
    Vote mine;
    std::string reason = verdict.message;
    if (verdict.ok) {
      try {
        check_local(a, c, workspace_bytes);
        mine.ok = 1;
      } catch (Error const& e) {
        reason = e.what();
      }
    }
    if (!mine.ok) std::memcpy(mine.message, reason.data(), std::min(reason.size(), sizeof(mine.message) - 1));
    mine.r1 = c.r1;
    mine.r2 = c.r2;
    mine.pipeline = static_cast<std::int32_t>(c.pipeline);
    mine.order = static_cast<std::int32_t>(c.order);
    comm_->all_gather_v(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(votes_)), vote_bytes_);
    if (!mine.ok) throw Error(reason);
    for (std::size_t r = 0; r < votes_.size(); ++r)
      if (!votes_[r].ok)
        fail("FinDepExecutor: rank ", r, " rejected this run(), so every rank stops: ", votes_[r].message);
    auto describe = [](Vote const& v) {
      return moe::detail::concat(pipeline_name(static_cast<Pipeline>(v.pipeline)), " ",
                                 order_name(static_cast<Order>(v.order)), ", r1 = ", v.r1, ", r2 = ", v.r2);
    };
    for (std::size_t r = 1; r < votes_.size(); ++r) {
      Vote const &v0 = votes_[0], &v = votes_[r];
      check(v.r1 == v0.r1 && v.r2 == v0.r2 && v.pipeline == v0.pipeline && v.order == v0.order,
            "FinDepExecutor: every rank must call run() with the same configuration: rank 0 runs ", describe(v0),
            ", rank ", r, " runs ", describe(v));
    }
  }

  static constexpr int tag(int i, int j, int r2, int part) { return 3 * ((i * r2 + j) % tag_window) + part; }
  static constexpr int split_tag = 3 * tag_window;


  /// The dispatch record of moe/kernels/records.hpp, its metadata unpadded.
  [[nodiscard]] std::size_t meta_bytes() const { return moe::detail::record_meta_bytes_unpadded(s_.top_k); }
  [[nodiscard]] std::size_t record_bytes() const { return meta_bytes() + static_cast<std::size_t>(s_.hidden) * sizeof(T); }

  struct AgBuffers {
    std::span<int> ids;              // max_tokens x k
    std::span<float> gate;           // max_tokens x k
    std::span<int> dest;             // max_tokens x k: the EG index serving each (token, expert)
    std::span<float> shared;         // max_tokens x h: shared-expert sum
    std::span<float> routed;         // max_tokens x h: sum of the EG partials
    std::span<int> sent;             // tokens sent, list after list in (chunk, EG rank) order
    std::span<std::size_t> sent_at;  // start of each (chunk, EG rank) list in `sent`, + 1 end
    std::span<float> logits;         // compute thread: one micro-batch's gate logits
    std::span<float> shared_out;     // compute thread: one shared expert on one micro-batch
    std::span<float> shared_scratch;
    std::span<std::byte> packed;     // A2E thread: one chunk's records for one EG rank
    std::span<float> part;           // E2A thread: one chunk's partials from one EG rank
  };
  struct EgBuffers {
    std::span<std::byte> in;         // one chunk's records from every AG rank, back to back
    std::span<std::size_t> first;    // ag + 1: first record of each AG rank
    std::span<float> partial;        // per record: weighted sum of this rank's experts (fp32)
    std::span<int> user;             // records that chose the expert at hand
    std::span<float> user_weight;
    std::span<T> rows;               // their hidden vectors
    std::span<float> rows_out;       // the expert's output rows
    std::span<float> scratch;
  };

  /// The per-micro-batch split of micro-batch i (`mb` tokens; see the header comment): fills its
  /// entries of b.dest with EG indices. Runs on the A2E thread.
  void split_micro_batch(int i, int mb, AgBuffers const& b) {
    auto E = static_cast<std::size_t>(s_.experts), k = static_cast<std::size_t>(s_.top_k);
    std::size_t first = static_cast<std::size_t>(i) * static_cast<std::size_t>(mb) * k;
    std::size_t n = static_cast<std::size_t>(mb) * k;
    int me = comm_->rank();
    std::fill(split_counts_.begin(), split_counts_.end(), 0);  // EG ranks' rows stay zero
    // AG rank p's row is eg + p (BatchSplit::with_sources)
    auto row = [&](int p) { return std::span(split_counts_).subspan(static_cast<std::size_t>(eg_ + p) * E, E); };
    for (std::size_t q = first; q < first + n; ++q) ++row(me)[static_cast<std::size_t>(b.ids[q])];
    collective::swap_rows_pairwise(*comm_, me, ag_, row, split_tag);
    split_bytes_ += static_cast<std::size_t>(ag_ - 1) * E * sizeof(std::int32_t);
    split_max_sum_ += split_->plan_batch(split_counts_).max_load;
    for (int g = 0; g < eg_; ++g) split_load_[static_cast<std::size_t>(g)] += split_->load()[static_cast<std::size_t>(g)];
    split_->deal(eg_ + me, std::span<int const>(b.ids).subspan(first, n), b.dest.subspan(first, n));
  }

  void carve(core::Carver& c, AgBuffers& b) const {
    auto m = static_cast<std::size_t>(max_tokens_), h = static_cast<std::size_t>(s_.hidden);
    auto k = static_cast<std::size_t>(s_.top_k), eg = static_cast<std::size_t>(eg_);
    b.ids = c.take<int>(m * k);
    b.gate = c.take<float>(m * k);
    b.dest = c.take<int>(m * k);
    b.shared = c.take<float>(m * h);
    b.routed = c.take<float>(m * h);
    b.sent = c.take<int>(m * std::min(k, eg));  // a token goes to at most min(k, eg) EG ranks
    b.sent_at = c.take<std::size_t>(m * eg + 1);  // r1 * r2 <= tokens chunks
    b.logits = c.take<float>(m * static_cast<std::size_t>(s_.experts));
    b.shared_out = c.take<float>(s_.shared_experts > 0 ? m * h : 0);
    b.shared_scratch = c.take<float>(s_.shared_experts > 0 ? kernels::host::swiglu_scratch(max_tokens_, s_.shared_ffn) : 0);
    b.packed = c.take<std::byte>(m * record_bytes());
    b.part = c.take<float>(m * h);
  }

  void carve(core::Carver& c, EgBuffers& b) const {
    auto n = static_cast<std::size_t>(max_tokens_) * static_cast<std::size_t>(ag_);  // records of one chunk
    auto h = static_cast<std::size_t>(s_.hidden);
    b.in = c.take<std::byte>(n * record_bytes());
    b.first = c.take<std::size_t>(static_cast<std::size_t>(ag_) + 1);
    b.partial = c.take<float>(n * h);
    b.user = c.take<int>(n);
    b.user_weight = c.take<float>(n);
    b.rows = c.take<T>(n * h);
    b.rows_out = c.take<float>(n * h);
    b.scratch = c.take<float>(kernels::host::swiglu_scratch(static_cast<int>(n), s_.expert_ffn));
  }

  // ---------------------------------------------------------------------------------------------
  // AG rank: compute, A2E and E2A threads.
  // ---------------------------------------------------------------------------------------------
  void run_ag(Arguments const& a, Config const& c, AgBuffers const& b) {
    int mb = a.tokens / c.r1;  // check_local: r1 divides the tokens, r2 the micro-batch
    int chunk = mb / c.r2;
    auto h = static_cast<std::size_t>(s_.hidden), k = static_cast<std::size_t>(s_.top_k);
    auto n = static_cast<std::size_t>(a.tokens);
    std::fill_n(b.shared.data(), n * h, 0.0f);
    std::fill_n(b.routed.data(), n * h, 0.0f);
    b.sent_at[0] = 0;
    records_sent_ = 0;
    split_bytes_ = 0;
    split_max_sum_ = 0;
    split_load_.assign(split_ ? static_cast<std::size_t>(eg_) : 0, 0);

    std::mutex mu;
    std::condition_variable cv;
    int released = 0;    // micro-batches whose A2E may start
    int dispatched = 0;  // chunks sent, in (micro-batch, chunk) order
    bool aborted = false;
    std::exception_ptr error;
    auto fail_all = [&](std::exception_ptr e) {
      std::lock_guard lock(mu);
      if (!error) error = e;
      aborted = true;
      cv.notify_all();
    };
    auto wait_for = [&](int const& counter, int value) {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return counter > value || aborted; });
      return !aborted;
    };
    auto bump = [&](int& counter) {
      std::lock_guard lock(mu);
      ++counter;
      cv.notify_all();
    };

    bool pppipe = c.pipeline == Pipeline::pppipe;
    auto attention = [&](int i) {  // the router step of micro-batch i
      std::size_t first = static_cast<std::size_t>(i) * static_cast<std::size_t>(mb);
      auto logits = b.logits.first(static_cast<std::size_t>(mb) * static_cast<std::size_t>(s_.experts));
      kernels::host::gate_logits(a.x + first * h, mb, s_.hidden, w_.router, s_.experts, logits.data());
      std::span<float const> bias;
      if (w_.router_bias) bias = {w_.router_bias, static_cast<std::size_t>(s_.experts)};
      router::route_all<Router>(s_, logits, bias, mb, b.ids.subspan(first * k, static_cast<std::size_t>(mb) * k),
                                b.gate.subspan(first * k, static_cast<std::size_t>(mb) * k));
      if (!pppipe || w_.shared.empty()) bump(released);
    };
    auto shared_expert = [&](int i) {
      std::size_t first = static_cast<std::size_t>(i) * static_cast<std::size_t>(mb);
      float* out = b.shared_out.data();
      for (auto const& sw : w_.shared) {
        kernels::host::swiglu_expert(a.x + first * h, mb, s_.hidden, s_.shared_ffn, sw, out, b.shared_scratch);
        for (std::size_t q = 0; q < static_cast<std::size_t>(mb) * h; ++q) b.shared[first * h + q] += out[q];
      }
      if (pppipe && !w_.shared.empty()) bump(released);
    };

    std::thread compute([&] {
      try {
        bool alternate = c.order == Order::asas || pppipe;
        if (w_.shared.empty()) {
          for (int i = 0; i < c.r1; ++i) attention(i);
        } else if (alternate) {
          for (int i = 0; i < c.r1; ++i) {
            attention(i);
            shared_expert(i);
          }
        } else {
          for (int i = 0; i < c.r1; ++i) attention(i);
          for (int i = 0; i < c.r1; ++i) shared_expert(i);
        }
      } catch (...) {
        fail_all(std::current_exception());
      }
    });

    // Written by the A2E thread, read by the E2A thread after `dispatched` says the chunk was sent
    // (the mutex orders the two).
    std::thread a2e([&] {
      try {
        std::size_t rec = record_bytes();
        for (int i = 0; i < c.r1; ++i) {
          if (!wait_for(released, i)) return;
          if (split_) split_micro_batch(i, mb, b);
          for (int j = 0; j < c.r2; ++j) {
            int t0 = i * mb + j * chunk;
            if (!split_)
              for (int t = t0; t < t0 + chunk; ++t)
                for (std::size_t q = 0; q < k; ++q) {
                  std::size_t at = static_cast<std::size_t>(t) * k + q;
                  b.dest[at] = destination(b.ids[at], t);
                }
            for (int g = 0; g < eg_; ++g) {
              auto list = static_cast<std::size_t>((i * c.r2 + j) * eg_ + g);
              std::size_t at = b.sent_at[list];
              for (int t = t0; t < t0 + chunk; ++t)
                for (std::size_t q = 0; q < k; ++q)
                  if (b.dest[static_cast<std::size_t>(t) * k + q] == g) {
                    b.sent[at++] = t;
                    break;
                  }
              b.sent_at[list + 1] = at;
              std::size_t count = at - b.sent_at[list];
              records_sent_ += static_cast<long long>(count);  // read by run_ag after this thread ends
              for (std::size_t r = 0; r < count; ++r)
                pack(b.packed.data() + r * rec, b.sent[b.sent_at[list] + r], a.x, b, g);
              std::uint64_t header[4] = {count, static_cast<std::uint64_t>(c.r1), static_cast<std::uint64_t>(c.r2),
                                         static_cast<std::uint64_t>(i * c.r2 + j)};
              comm_->send(std::as_bytes(std::span(header)), ag_ + g, tag(i, j, c.r2, 0));
              comm_->send(b.packed.first(count * rec), ag_ + g, tag(i, j, c.r2, 1));
            }
            bump(dispatched);
          }
        }
      } catch (...) {
        fail_all(std::current_exception());
      }
    });

    std::thread e2a([&] {
      try {
        for (int i = 0; i < c.r1; ++i)
          for (int j = 0; j < c.r2; ++j) {
            if (!wait_for(dispatched, i * c.r2 + j)) return;
            for (int g = 0; g < eg_; ++g) {
              auto list = static_cast<std::size_t>((i * c.r2 + j) * eg_ + g);
              std::size_t lo = b.sent_at[list], count = b.sent_at[list + 1] - lo;
              auto part = b.part.first(count * h);
              comm_->recv(std::as_writable_bytes(part), ag_ + g, tag(i, j, c.r2, 2));
              for (std::size_t r = 0; r < count; ++r) {
                float* dst = b.routed.data() + static_cast<std::size_t>(b.sent[lo + r]) * h;
                for (std::size_t q = 0; q < h; ++q) dst[q] += part[r * h + q];
              }
            }
          }
      } catch (...) {
        fail_all(std::current_exception());
      }
    });
    compute.join();
    a2e.join();
    e2a.join();
    if (error) std::rethrow_exception(error);
    for (std::size_t q = 0; q < n * h; ++q) a.y[q] = from_float<T>(b.routed[q] + b.shared[q]);
  }

  void pack(std::byte* out, int t, T const* x, AgBuffers const& b, int g) const {
    auto k = static_cast<std::size_t>(s_.top_k), h = static_cast<std::size_t>(s_.hidden);
    std::memset(out, 0, meta_bytes());
    std::int32_t* ids = moe::detail::record_experts(out);
    float* w = moe::detail::record_weights(out, s_.top_k);
    int n = 0;
    for (std::size_t q = 0; q < k; ++q) {
      std::size_t at = static_cast<std::size_t>(t) * k + q;
      if (b.dest[at] != g) continue;
      ids[n] = b.ids[at];
      w[n++] = b.gate[at];
    }
    moe::detail::write_record_header(out, t, n);
    std::memcpy(out + meta_bytes(), x + static_cast<std::size_t>(t) * h, h * sizeof(T));
  }

  // ---------------------------------------------------------------------------------------------
  // EG rank: chunks in (micro-batch, chunk) order; receive from every AG rank, compute, send back.
  // ---------------------------------------------------------------------------------------------
  void run_eg(Arguments const& a, Config const& c, EgBuffers const& b) {
    (void)a;  // check_local: EG ranks hold no tokens
    auto h = static_cast<std::size_t>(s_.hidden), k = static_cast<std::size_t>(s_.top_k);
    std::size_t rec = record_bytes(), meta = meta_bytes();
    int me = eg_index();
    auto record = [&](std::size_t r) { return b.in.data() + r * rec; };
    pairs_received_ = 0;
    records_received_ = 0;
    for (int i = 0; i < c.r1; ++i)
      for (int j = 0; j < c.r2; ++j) {
        // Receive this chunk from every AG rank, records back to back.
        b.first[0] = 0;
        for (int p = 0; p < ag_; ++p) {
          std::uint64_t header[4] = {};
          comm_->recv(std::as_writable_bytes(std::span(header)), p, tag(i, j, c.r2, 0));
          check(header[1] == static_cast<std::uint64_t>(c.r1) && header[2] == static_cast<std::uint64_t>(c.r2),
                "FinDepExecutor: EG rank ", comm_->rank(), " runs r1 = ", c.r1, ", r2 = ", c.r2, " but AG rank ", p,
                " sent a chunk of a schedule with r1 = ", header[1], ", r2 = ", header[2],
                " (every rank must call run() with the same configuration)");
          check(header[3] == static_cast<std::uint64_t>(i * c.r2 + j), "FinDepExecutor: EG rank ", comm_->rank(),
                " expected chunk ", i * c.r2 + j, " from AG rank ", p, " but received chunk ", header[3]);
          check(header[0] <= static_cast<std::uint64_t>(max_tokens_), "FinDepExecutor: AG rank ", p, " sent ",
                header[0], " records in one chunk, above max_tokens = ", max_tokens_,
                " (every rank must build the executor with the same max_tokens)");
          auto count = static_cast<std::size_t>(header[0]);
          auto at = b.first[static_cast<std::size_t>(p)];
          comm_->recv(b.in.subspan(at * rec, count * rec), p, tag(i, j, c.r2, 1));
          b.first[static_cast<std::size_t>(p) + 1] = at + count;
        }
        std::size_t total = b.first[static_cast<std::size_t>(ag_)];
        records_received_ += static_cast<long long>(total);
        for (std::size_t r = 0; r < total; ++r) {
          std::int32_t hdr[2];
          std::memcpy(hdr, record(r), sizeof(hdr));
          check(hdr[1] >= 1 && hdr[1] <= s_.top_k, "FinDepExecutor: corrupt record (", hdr[1], " experts)");
          pairs_received_ += hdr[1];
          for (int q = 0; q < hdr[1]; ++q) {
            std::int32_t id;
            std::memcpy(&id, record(r) + sizeof(hdr) + static_cast<std::size_t>(q) * sizeof(std::int32_t), sizeof(id));
            check(id >= 0 && id < s_.experts && serves(id, me), "FinDepExecutor: EG rank ",
                  comm_->rank(), " received a token for expert ", id, " which it does not serve");
          }
        }
        // Weighted partial sum of this rank's experts for every received record, expert by expert.
        std::fill_n(b.partial.data(), total * h, 0.0f);
        for (int e = 0; e < s_.experts; ++e) {
          if (!serves(e, me)) continue;
          std::size_t m = 0;
          for (std::size_t r = 0; r < total; ++r) {
            std::int32_t hdr[2];
            std::memcpy(hdr, record(r), sizeof(hdr));
            for (int q = 0; q < hdr[1]; ++q) {
              std::int32_t id;
              std::memcpy(&id, record(r) + sizeof(hdr) + static_cast<std::size_t>(q) * sizeof(std::int32_t), sizeof(id));
              if (id != e) continue;
              float wt;
              std::memcpy(&wt, record(r) + sizeof(hdr) + k * sizeof(std::int32_t) + static_cast<std::size_t>(q) * sizeof(float),
                          sizeof(wt));
              b.user[m] = static_cast<int>(r);
              b.user_weight[m] = wt;
              std::memcpy(b.rows.data() + m * h, record(r) + meta, h * sizeof(T));
              ++m;
            }
          }
          if (m == 0) continue;
          kernels::host::swiglu_expert(b.rows.data(), static_cast<int>(m), s_.hidden, s_.expert_ffn,
                                       w_.experts[static_cast<std::size_t>(e)], b.rows_out.data(), b.scratch);
          for (std::size_t u = 0; u < m; ++u) {
            float* dst = b.partial.data() + static_cast<std::size_t>(b.user[u]) * h;
            for (std::size_t q = 0; q < h; ++q) dst[q] += b.user_weight[u] * b.rows_out[u * h + q];
          }
        }
        // One message back to every AG rank: its records' partials, in the order they came.
        for (int p = 0; p < ag_; ++p) {
          auto lo = b.first[static_cast<std::size_t>(p)], hi = b.first[static_cast<std::size_t>(p) + 1];
          comm_->send(std::as_bytes(b.partial.subspan(lo * h, (hi - lo) * h)), p, tag(i, j, c.r2, 2));
        }
      }
  }

  /// `split`'s copies are those of `copies` (EG indices), and it splits over the expert group.
  void check_split(replication::BatchSplit const& split, replication::CopyLists const& copies) const {
    auto const& eg_copies = split.table().replicas();
    check(split.layout().ranks == eg_, "FinDepExecutor: the batch split is built for ", split.layout().ranks,
          " ranks, the expert group has ", eg_);
    check(static_cast<int>(eg_copies.size()) == s_.experts, "FinDepExecutor: the batch split lists ",
          eg_copies.size(), " experts, the shape has ", s_.experts);
    for (std::size_t e = 0; e < eg_copies.size(); ++e) {
      check(static_cast<int>(eg_copies[e].size()) == copies.copies(static_cast<int>(e)),
            "FinDepExecutor: the batch split's copies of expert ", e, " are not the executor's");
      for (int g : eg_copies[e])
        check(copies.holds(static_cast<int>(e), g), "FinDepExecutor: the batch split puts expert ", e, " on EG index ",
              g, ", which does not hold it");
    }
  }

  Comm* comm_;
  ShapeSpec s_;
  int ag_, eg_;
  placement::Table placement_;
  replication::CopyLists copies_;  // each expert's EG indices: the replica table's, or the placement's
  LayerWeights<T> w_;
  int max_tokens_;
  std::vector<std::byte> own_;
  std::vector<Vote> votes_;
  std::vector<std::size_t> vote_bytes_;
  std::optional<replication::BatchSplit> split_;  // EG indices, then AG ranks; see split_each_micro_batch
  std::vector<std::int32_t> split_counts_;        // ranks x experts: one micro-batch's pairs
  std::size_t split_bytes_ = 0;
  std::vector<long long> split_load_;  // see split_loads()
  long long split_max_sum_ = 0, pairs_received_ = 0, records_sent_ = 0, records_received_ = 0;
};

}  // namespace moe::schedule
