#pragma once
// Host executor of a FinDEP / PPPipe schedule for one MoE layer on disaggregated ranks: ranks
// [0, ag) form the attention group (AG: tokens, router, shared experts), ranks [ag, ag + eg) the
// expert group (EG: the routed experts, placed by a placement::Table over the eg EG ranks).
//
//   moe::schedule::FinDepExecutor<Router, float, Comm> ex(comm, shape, ag, eg_placement, weights);
//   ex.run({.tokens = n, .x = x, .y = y}, config);   // every rank calls it; EG ranks pass no tokens
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
// Tags stay below 3 * tag_window = 12288, inside the 32767 every MPI guarantees (MPI_TAG_UB). A
// tag is reused every tag_window chunks and by the next run(); both backends deliver the messages
// of one (source, destination, tag) in the order they were sent (MPI's non-overtaking rule holds
// because on every rank one thread does all of the sends and the receives of one direction).
//
// Threads: on an AG rank the A2E thread is the only one that sends and the E2A thread the only one
// that receives, and they use different tags (3w, 3w + 1 out; 3w + 2 in). The collective's send
// and recv are therefore called from two threads of a rank at once: InProcess allows it; with
// collective::Mpi the library must grant MPI_THREAD_MULTIPLE (collective::MpiSession asks for it;
// the constructor cannot check it, the MPI test does). An EG rank uses its calling thread only.
// All ranks must call run() with the same r1 and r2 (the EG checks this with the A2E header). If
// a rank fails midway (e.g. an AG rank whose tokens r1 does not divide), the others may wait
// forever on MPI; InProcess aborts them.

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"
#include "moe/core/bf16.hpp"
#include "moe/core/shape.hpp"
#include "moe/kernels/host.hpp"
#include "moe/layer/weights.hpp"
#include "moe/placement/table.hpp"
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

  /// `placement` maps each routed expert to an EG rank index in [0, eg).
  FinDepExecutor(Comm& comm, ShapeSpec shape, int ag, placement::Table placement, LayerWeights<T> weights)
      : comm_(&comm), s_(shape), ag_(ag), eg_(comm.size() - ag), placement_(std::move(placement)), w_(weights) {
    validate(s_);
    check(Router::fits(s_), "FinDepExecutor: router ", Router::name, " does not fit the shape");
    check(ag_ >= 1, "FinDepExecutor: the attention group (AG) is empty; it needs at least one rank, got ag = ", ag_);
    check(eg_ >= 1, "FinDepExecutor: the expert group (EG) is empty: the collective has ", comm.size(),
          " ranks and ", ag_, " of them are AG ranks");
    placement_.validate(s_.experts, eg_);
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
        check(placement_.rank_of(e) != eg_index() || w_.experts[static_cast<std::size_t>(e)].present(),
              "FinDepExecutor: EG rank ", comm.rank(), " serves expert ", e, " but its weights are missing");
    }
  }

  [[nodiscard]] bool is_ag() const { return comm_->rank() < ag_; }
  [[nodiscard]] int eg_index() const { return comm_->rank() - ag_; }

  /// Runs the layer under schedule `c` (pipeline, order, r1, r2; m_a is not used: the micro-batch
  /// size is tokens / r1). Every rank must call it with the same r1 and r2.
  void run(Arguments const& a, Config const& c) {
    check(c.r1 >= 1, "FinDepExecutor: r1 (micro-batches) must be at least 1, got ", c.r1);
    check(c.r2 >= 1, "FinDepExecutor: r2 (token chunks) must be at least 1, got ", c.r2);
    check(c.pipeline == Pipeline::findep || c.r2 == 1, "FinDepExecutor: PPPipe has no token chunks; r2 must be 1, got ",
          c.r2);
    if (is_ag())
      run_ag(a, c);
    else
      run_eg(a, c);
  }

private:
public:
  /// Chunks between two reuses of a tag (see the header comment).
  static constexpr int tag_window = 4096;

private:
  static constexpr int tag(int i, int j, int r2, int part) { return 3 * ((i * r2 + j) % tag_window) + part; }

  [[nodiscard]] std::size_t record_bytes() const {
    return 2 * sizeof(std::int32_t) + static_cast<std::size_t>(s_.top_k) * (sizeof(std::int32_t) + sizeof(float)) +
           static_cast<std::size_t>(s_.hidden) * sizeof(T);
  }

  // ---------------------------------------------------------------------------------------------
  // AG rank: compute, A2E and E2A threads.
  // ---------------------------------------------------------------------------------------------
  void run_ag(Arguments const& a, Config const& c) {
    check(a.tokens >= 0, "FinDepExecutor: negative token count ", a.tokens);
    check(a.tokens == 0 || (a.x && a.y), "FinDepExecutor: input or output pointer is null");
    check(a.tokens % c.r1 == 0, "FinDepExecutor: r1 = ", c.r1, " does not divide the ", a.tokens,
          " tokens of AG rank ", comm_->rank());
    int mb = a.tokens / c.r1;
    check(mb % c.r2 == 0, "FinDepExecutor: r2 = ", c.r2, " does not divide the ", mb,
          " tokens of a micro-batch on AG rank ", comm_->rank());
    int chunk = mb / c.r2;
    auto h = static_cast<std::size_t>(s_.hidden), k = static_cast<std::size_t>(s_.top_k);
    auto n = static_cast<std::size_t>(a.tokens);
    std::vector<int> ids(n * k);
    std::vector<float> gate(n * k), shared(n * h, 0.0f), routed(n * h, 0.0f);
    // Per (micro-batch, chunk, EG rank): the tokens sent, in order (written by A2E, read by E2A).
    std::vector<std::vector<int>> sent(static_cast<std::size_t>(c.r1 * c.r2 * eg_));

    std::mutex mu;
    std::condition_variable cv;
    int released = 0;  // micro-batches whose A2E may start
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
      std::vector<float> logits(static_cast<std::size_t>(mb) * static_cast<std::size_t>(s_.experts));
      kernels::host::gate_logits(a.x + first * h, mb, s_.hidden, w_.router, s_.experts, logits.data());
      std::span<float const> bias;
      if (w_.router_bias) bias = {w_.router_bias, static_cast<std::size_t>(s_.experts)};
      router::route_all<Router>(s_, logits, bias, mb, std::span<int>(ids).subspan(first * k),
                                std::span<float>(gate).subspan(first * k));
      if (!pppipe || w_.shared.empty()) bump(released);
    };
    auto shared_expert = [&](int i) {
      std::size_t first = static_cast<std::size_t>(i) * static_cast<std::size_t>(mb);
      std::vector<float> out(static_cast<std::size_t>(mb) * h);
      std::vector<float> scratch(kernels::host::swiglu_scratch(mb, s_.shared_ffn));
      for (auto const& sw : w_.shared) {
        kernels::host::swiglu_expert(a.x + first * h, mb, s_.hidden, s_.shared_ffn, sw, out.data(), scratch);
        for (std::size_t q = 0; q < out.size(); ++q) shared[first * h + q] += out[q];
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

    std::thread a2e([&] {
      try {
        std::size_t rec = record_bytes();
        std::vector<std::byte> buf;
        for (int i = 0; i < c.r1; ++i) {
          if (!wait_for(released, i)) return;
          for (int j = 0; j < c.r2; ++j) {
            for (int g = 0; g < eg_; ++g) {
              auto& list = sent[static_cast<std::size_t>((i * c.r2 + j) * eg_ + g)];
              list.clear();
              int t0 = i * mb + j * chunk;
              for (int t = t0; t < t0 + chunk; ++t)
                for (std::size_t q = 0; q < k; ++q)
                  if (placement_.rank_of(ids[static_cast<std::size_t>(t) * k + q]) == g) {
                    list.push_back(t);
                    break;
                  }
              buf.assign(list.size() * rec, std::byte{0});
              for (std::size_t r = 0; r < list.size(); ++r) pack(buf.data() + r * rec, list[r], a.x, ids, gate, g);
              std::uint64_t header[4] = {list.size(), static_cast<std::uint64_t>(c.r1),
                                         static_cast<std::uint64_t>(c.r2), static_cast<std::uint64_t>(i * c.r2 + j)};
              comm_->send(std::as_bytes(std::span(header)), ag_ + g, tag(i, j, c.r2, 0));
              comm_->send(buf, ag_ + g, tag(i, j, c.r2, 1));
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
        std::vector<float> part;
        for (int i = 0; i < c.r1; ++i)
          for (int j = 0; j < c.r2; ++j) {
            if (!wait_for(dispatched, i * c.r2 + j)) return;
            for (int g = 0; g < eg_; ++g) {
              auto const& list = sent[static_cast<std::size_t>((i * c.r2 + j) * eg_ + g)];
              part.resize(list.size() * h);
              comm_->recv(std::as_writable_bytes(std::span(part)), ag_ + g, tag(i, j, c.r2, 2));
              for (std::size_t r = 0; r < list.size(); ++r) {
                float* dst = routed.data() + static_cast<std::size_t>(list[r]) * h;
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
    for (std::size_t q = 0; q < n * h; ++q) a.y[q] = from_float<T>(routed[q] + shared[q]);
  }

  void pack(std::byte* out, int t, T const* x, std::vector<int> const& ids, std::vector<float> const& gate, int g) const {
    auto k = static_cast<std::size_t>(s_.top_k), h = static_cast<std::size_t>(s_.hidden);
    std::int32_t hdr[2] = {t, 0};
    auto* e = reinterpret_cast<std::int32_t*>(out + sizeof(hdr));
    auto* w = reinterpret_cast<float*>(out + sizeof(hdr) + k * sizeof(std::int32_t));
    for (std::size_t q = 0; q < k; ++q) {
      std::size_t at = static_cast<std::size_t>(t) * k + q;
      if (placement_.rank_of(ids[at]) != g) continue;
      e[hdr[1]] = ids[at];
      w[hdr[1]] = gate[at];
      ++hdr[1];
    }
    std::memcpy(out, hdr, sizeof(hdr));
    std::memcpy(out + sizeof(hdr) + k * (sizeof(std::int32_t) + sizeof(float)), x + static_cast<std::size_t>(t) * h,
                h * sizeof(T));
  }

  // ---------------------------------------------------------------------------------------------
  // EG rank: chunks in (micro-batch, chunk) order; receive from every AG rank, compute, send back.
  // ---------------------------------------------------------------------------------------------
  void run_eg(Arguments const& a, Config const& c) {
    check(a.tokens == 0, "FinDepExecutor: EG rank ", comm_->rank(), " was given ", a.tokens,
          " tokens; tokens live on the AG ranks");
    auto h = static_cast<std::size_t>(s_.hidden), k = static_cast<std::size_t>(s_.top_k);
    std::size_t rec = record_bytes();
    std::size_t meta = 2 * sizeof(std::int32_t) + k * (sizeof(std::int32_t) + sizeof(float));
    int me = eg_index();
    std::vector<std::vector<std::byte>> in(static_cast<std::size_t>(ag_));
    std::vector<float> partial, rows_out, scratch;
    std::vector<T> rows;
    for (int i = 0; i < c.r1; ++i)
      for (int j = 0; j < c.r2; ++j) {
        // Receive this chunk from every AG rank.
        std::size_t total = 0;
        std::vector<std::size_t> first(static_cast<std::size_t>(ag_) + 1, 0);
        for (int p = 0; p < ag_; ++p) {
          std::uint64_t header[4] = {};
          comm_->recv(std::as_writable_bytes(std::span(header)), p, tag(i, j, c.r2, 0));
          check(header[1] == static_cast<std::uint64_t>(c.r1) && header[2] == static_cast<std::uint64_t>(c.r2),
                "FinDepExecutor: EG rank ", comm_->rank(), " runs r1 = ", c.r1, ", r2 = ", c.r2, " but AG rank ", p,
                " sent a chunk of a schedule with r1 = ", header[1], ", r2 = ", header[2],
                " (every rank must call run() with the same configuration)");
          check(header[3] == static_cast<std::uint64_t>(i * c.r2 + j), "FinDepExecutor: EG rank ", comm_->rank(),
                " expected chunk ", i * c.r2 + j, " from AG rank ", p, " but received chunk ", header[3]);
          std::uint64_t count = header[0];
          check(count <= static_cast<std::uint64_t>(INT32_MAX), "FinDepExecutor: corrupt A2E header (", count,
                " records)");
          auto& b = in[static_cast<std::size_t>(p)];
          b.resize(static_cast<std::size_t>(count) * rec);
          comm_->recv(b, p, tag(i, j, c.r2, 1));
          total += static_cast<std::size_t>(count);
          first[static_cast<std::size_t>(p) + 1] = total;
        }
        // Weighted partial sum of this rank's experts for every received record, expert by expert.
        partial.assign(total * h, 0.0f);
        for (int e = 0; e < s_.experts; ++e) {
          if (placement_.rank_of(e) != me) continue;
          std::vector<std::pair<std::size_t, float>> users;  // (record, weight)
          for (int p = 0; p < ag_; ++p) {
            auto const& b = in[static_cast<std::size_t>(p)];
            for (std::size_t r = 0; r < b.size() / rec; ++r) {
              std::byte const* R = b.data() + r * rec;
              std::int32_t hdr[2];
              std::memcpy(hdr, R, sizeof(hdr));
              check(hdr[1] >= 1 && hdr[1] <= s_.top_k, "FinDepExecutor: corrupt record (", hdr[1], " experts)");
              for (int q = 0; q < hdr[1]; ++q) {
                std::int32_t id;
                float wt;
                std::memcpy(&id, R + sizeof(hdr) + static_cast<std::size_t>(q) * sizeof(std::int32_t), sizeof(id));
                std::memcpy(&wt, R + sizeof(hdr) + k * sizeof(std::int32_t) + static_cast<std::size_t>(q) * sizeof(float),
                            sizeof(wt));
                check(id >= 0 && id < s_.experts && placement_.rank_of(id) == me, "FinDepExecutor: EG rank ",
                      comm_->rank(), " received a token for expert ", id, " which it does not serve");
                if (id == e) users.emplace_back(first[static_cast<std::size_t>(p)] + r, wt);
              }
            }
          }
          if (users.empty()) continue;
          int m = static_cast<int>(users.size());
          rows.resize(users.size() * h);
          rows_out.resize(users.size() * h);
          scratch.resize(kernels::host::swiglu_scratch(m, s_.expert_ffn));
          for (std::size_t u = 0; u < users.size(); ++u) {
            std::size_t r = users[u].first;
            auto p = static_cast<std::size_t>(std::upper_bound(first.begin(), first.end(), r) - first.begin() - 1);
            std::byte const* R = in[p].data() + (r - first[p]) * rec;
            std::memcpy(rows.data() + u * h, R + meta, h * sizeof(T));
          }
          kernels::host::swiglu_expert(rows.data(), m, s_.hidden, s_.expert_ffn, w_.experts[static_cast<std::size_t>(e)],
                                       rows_out.data(), scratch);
          for (std::size_t u = 0; u < users.size(); ++u) {
            float* dst = partial.data() + users[u].first * h;
            for (std::size_t q = 0; q < h; ++q) dst[q] += users[u].second * rows_out[u * h + q];
          }
        }
        // One message back to every AG rank: its records' partials, in the order they came.
        for (int p = 0; p < ag_; ++p) {
          auto lo = first[static_cast<std::size_t>(p)], hi = first[static_cast<std::size_t>(p) + 1];
          comm_->send(std::as_bytes(std::span(partial.data() + lo * h, (hi - lo) * h)), p, tag(i, j, c.r2, 2));
        }
      }
  }

  Comm* comm_;
  ShapeSpec s_;
  int ag_, eg_;
  placement::Table placement_;
  LayerWeights<T> w_;
};

}  // namespace moe::schedule
