#pragma once
// collective::InProcess<N>: N ranks as threads of one process, for unit tests and laptop demos.
//
//   moe::collective::run_in_process<4>([&](moe::collective::InProcess<4>& comm) { ... });
//
// Each collective is a rendezvous: every rank publishes its buffer, waits at a barrier, reads what
// it needs from the others, and waits again so no buffer is released early. Reductions add the
// ranks' contributions in rank order, so every rank gets bitwise the same result. When one rank
// throws, the world is aborted: ranks blocked in a collective throw too, and run_in_process
// rethrows the first rank's error instead of hanging.

#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"

namespace moe::collective {

namespace detail {

/// Shared state of one in-process world.
class InProcessWorld {
public:
  explicit InProcessWorld(int size) : size_(size), slots_(static_cast<std::size_t>(size)) {
    check(size > 0, "in-process world: size must be positive, got ", size);
  }

  [[nodiscard]] int size() const { return size_; }

  void barrier() {
    std::unique_lock lock(mutex_);
    throw_if_aborted();
    std::size_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
    if (generation_ == generation) throw_if_aborted();
  }

  void abort() {
    std::lock_guard lock(mutex_);
    aborted_ = true;
    cv_.notify_all();
  }

  /// What a rank publishes for the others to read during one collective.
  struct Slot {
    void const* data = nullptr;
    std::size_t const* counts = nullptr;
    std::size_t count = 0;
  };
  Slot& slot(int rank) { return slots_[static_cast<std::size_t>(rank)]; }

  void post(int from, int to, int tag, std::vector<std::byte> message) {
    std::lock_guard lock(mutex_);
    mailboxes_[{from, to, tag}].push_back(std::move(message));
    cv_.notify_all();
  }

  std::vector<std::byte> take(int from, int to, int tag) {
    std::unique_lock lock(mutex_);
    auto key = std::make_tuple(from, to, tag);
    cv_.wait(lock, [&] {
      auto it = mailboxes_.find(key);
      return aborted_ || (it != mailboxes_.end() && !it->second.empty());
    });
    auto it = mailboxes_.find(key);
    if (it == mailboxes_.end() || it->second.empty()) throw_if_aborted();
    std::vector<std::byte> message = std::move(it->second.front());
    it->second.erase(it->second.begin());
    return message;
  }

private:
  void throw_if_aborted() const {
    if (aborted_) fail("in-process collective aborted because another rank failed");
  }

  int size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::size_t generation_ = 0;
  bool aborted_ = false;
  std::vector<Slot> slots_;
  std::map<std::tuple<int, int, int>, std::vector<std::vector<std::byte>>> mailboxes_;
};

}  // namespace detail

/// One rank's handle on an in-process world of N ranks.
template <int N>
class InProcess {
  static_assert(N > 0, "InProcess<N>: N must be positive");

public:
  static constexpr Memory memory = Memory::host;

  InProcess(detail::InProcessWorld& world, int rank) : world_(&world), rank_(rank), ledger_(rank, N) {
    check(world.size() == N, "InProcess<", N, "> attached to a world of ", world.size(), " ranks");
    check(rank >= 0 && rank < N, "InProcess<", N, ">: rank ", rank, " out of range");
  }

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return N; }
  /// The modelled volume: what each operation would put on the wire (the textbook formulas of the
  /// Ledger, the same for every backend).
  [[nodiscard]] Counters const& counters() const { return ledger_.counters(); }
  /// What this backend actually moved into this rank: bytes copied (or summed) out of other ranks'
  /// buffers and messages since the last reset. A separate figure from counters(): e.g. an
  /// all-reduce here reads (N - 1) x size from the peers, where the ring model counts 2 (N - 1) / N x size.
  [[nodiscard]] std::size_t bytes_copied_from_peers() const { return copied_; }
  void reset_counters() {
    ledger_.reset();
    copied_ = 0;
  }

  void barrier() { world_->barrier(); }

  void all_to_all(std::span<std::byte const> in, std::span<std::byte> out, std::size_t block) {
    std::vector<std::size_t> counts(N, block);
    exchange(in, counts, out, counts, Op::all_to_all);
  }

  void all_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts,
                    std::span<std::byte> out, std::span<std::size_t const> recv_counts) {
    exchange(in, send_counts, out, recv_counts, Op::all_to_all_v);
  }

  void reduce_scatter_v(std::span<float const> in, std::span<float> out, std::span<std::size_t const> counts) {
    auto slice = ledger_.reduce_scatter(in.size(), out.size(), counts, sizeof(float));
    world_->slot(rank_) = {in.data(), nullptr, in.size()};
    world_->barrier();
    for (std::size_t i = 0; i < slice.count; ++i) out[i] = 0.0f;
    std::string mismatch;
    for (int p = 0; p < N; ++p) {
      auto const& s = world_->slot(p);
      if (s.count < slice.offset + slice.count) {
        mismatch = moe::detail::concat("reduce_scatter_v: rank ", p, " contributes ", s.count, " elements, rank ", rank_,
                                  " reads up to ", slice.offset + slice.count, " (the ranks' counts differ)");
        break;
      }
      auto const* src = static_cast<float const*>(s.data) + slice.offset;
      for (std::size_t i = 0; i < slice.count; ++i) out[i] += src[i];
      if (p != rank_) copied_ += slice.count * sizeof(float);
    }
    finish_reading(mismatch);
  }

  void all_gather_v(std::span<std::byte const> in, std::span<std::byte> out, std::span<std::size_t const> counts) {
    ledger_.all_gather(in.size(), out.size(), counts);
    world_->slot(rank_) = {in.data(), nullptr, in.size()};
    world_->barrier();
    std::size_t offset = 0;
    std::string mismatch;
    for (int p = 0; p < N; ++p) {
      auto const& s = world_->slot(p);
      if (s.count != counts[static_cast<std::size_t>(p)]) {
        mismatch = moe::detail::concat("all_gather_v: rank ", p, " contributes ", s.count, " bytes but rank ", rank_,
                                  " expects ", counts[static_cast<std::size_t>(p)]);
        break;
      }
      if (s.count) std::memcpy(out.data() + offset, s.data, s.count);
      if (p != rank_) copied_ += s.count;
      offset += s.count;
    }
    finish_reading(mismatch);
  }

  void all_reduce(std::span<float> data) {
    world_->slot(rank_) = {data.data(), nullptr, data.size()};
    world_->barrier();
    std::vector<float> total(data.size(), 0.0f);
    std::string mismatch;
    for (int p = 0; p < N; ++p) {
      auto const& s = world_->slot(p);
      if (s.count != data.size()) {
        mismatch = moe::detail::concat("all_reduce: rank ", p, " has ", s.count, " elements, rank ", rank_, " has ",
                                  data.size());
        break;
      }
      auto const* src = static_cast<float const*>(s.data);
      for (std::size_t i = 0; i < data.size(); ++i) total[i] += src[i];
      if (p != rank_) copied_ += data.size_bytes();
    }
    finish_reading(mismatch);
    std::copy(total.begin(), total.end(), data.begin());
    ledger_.all_reduce(data.size_bytes());
  }

  void send(std::span<std::byte const> in, int peer, int tag) {
    ledger_.send(peer, in.size());
    world_->post(rank_, peer, tag, std::vector<std::byte>(in.begin(), in.end()));
  }

  void recv(std::span<std::byte> out, int peer, int tag) {
    ledger_.check_peer(peer, "recv");
    std::vector<std::byte> message = world_->take(peer, rank_, tag);
    check(message.size() == out.size(), "recv: rank ", rank_, " expected ", out.size(), " bytes from rank ",
          peer, " (tag ", tag, ") but the message has ", message.size());
    if (!message.empty()) std::memcpy(out.data(), message.data(), message.size());
    copied_ += message.size();
  }

private:
  void exchange(std::span<std::byte const> in, std::span<std::size_t const> send_counts, std::span<std::byte> out,
                std::span<std::size_t const> recv_counts, Op op) {
    ledger_.exchange(op, in.size(), send_counts, out.size(), recv_counts);
    world_->slot(rank_) = {in.data(), send_counts.data(), in.size()};
    world_->barrier();
    std::size_t out_offset = 0;
    std::string mismatch;
    for (int p = 0; p < N && mismatch.empty(); ++p) {
      auto const& s = world_->slot(p);
      std::size_t in_offset = 0;
      for (int q = 0; q < rank_; ++q) in_offset += s.counts[q];
      std::size_t n = s.counts[rank_];
      if (n != recv_counts[static_cast<std::size_t>(p)]) {
        mismatch = moe::detail::concat("all_to_all: rank ", p, " sends ", n, " bytes to rank ", rank_, " which expects ",
                                  recv_counts[static_cast<std::size_t>(p)]);
        break;
      }
      if (n) std::memcpy(out.data() + out_offset, static_cast<std::byte const*>(s.data) + in_offset, n);
      if (p != rank_) copied_ += n;
      out_offset += n;
    }
    finish_reading(mismatch);
  }

  /// Ends the phase in which the ranks read each other's published buffers: nobody may leave (and
  /// free its buffers) before every rank has finished reading, so an error found while reading is
  /// raised only after the closing barrier.
  void finish_reading(std::string const& error) {
    world_->barrier();
    if (!error.empty()) fail(error);
  }

  detail::InProcessWorld* world_;
  int rank_;
  detail::Ledger ledger_;
  std::size_t copied_ = 0;
};

/// Runs `body(InProcess<N>&)` on N threads, one per rank, and waits for all of them. The first
/// exception thrown by a rank is rethrown here after every thread has stopped.
template <int N, class Body>
void run_in_process(Body&& body) {
  detail::InProcessWorld world(N);
  std::vector<std::exception_ptr> errors(N);
  std::mutex first_mutex;
  int first = -1;
  std::vector<std::thread> threads;
  threads.reserve(N);
  for (int r = 0; r < N; ++r) {
    threads.emplace_back([&, r] {
      try {
        InProcess<N> comm(world, r);
        body(comm);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        {
          std::lock_guard lock(first_mutex);
          if (first < 0) first = r;
        }
        world.abort();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first >= 0) std::rethrow_exception(errors[static_cast<std::size_t>(first)]);
}

static_assert(Collective<InProcess<2>>);

}  // namespace moe::collective
