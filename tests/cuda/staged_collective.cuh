#pragma once
// A device-memory communicator for tests with several ranks on one GPU: every exchange is staged
// through host memory and collective::InProcess<N> (one thread per rank). It lets the multi-rank
// logic of the device moe::Layer (all_to_all, all_to_all_v), of the point-to-point FinDepCudaExecutor (send, recv) and of the
// device disaggregated Layer (duplicate) run without several GPUs.
//
// Every operation first waits for the stream given by set_stream (so the data holds what that
// stream's earlier work wrote), copies on that stream, and returns after its copies completed.
//
// The caller's device buffers are checked as collective::Nccl checks them (the same
// collective::detail::Ledger checks and messages), so a too-small buffer throws moe::Error here as
// it does on NCCL, although the host copies handed to InProcess are sized from the counts.

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/collective/in_process.hpp"
#include "moe/config.hpp"
#include "moe/kernels/cuda_common.cuh"

namespace moe::test {

template <int N>
class StagedDevice {
public:
  static constexpr moe::collective::Memory memory = moe::collective::Memory::device;
  explicit StagedDevice(moe::collective::InProcess<N>& host) : host_(&host) {}
  [[nodiscard]] int rank() const { return host_->rank(); }
  [[nodiscard]] int size() const { return host_->size(); }
  void set_stream(cudaStream_t s) { stream_ = s; }
  /// Another communicator over the same ranks (as collective::Nccl::duplicate). Messages of the two
  /// meet in the same in-process mailboxes, told apart by their tags.
  [[nodiscard]] StagedDevice duplicate() const {
    StagedDevice d(*host_);
    d.stream_ = stream_;
    return d;
  }
  [[nodiscard]] moe::collective::Counters const& counters() const { return host_->counters(); }
  void reset_counters() { host_->reset_counters(); }
  void barrier() { host_->barrier(); }

  void all_to_all(std::span<std::byte const> in, std::span<std::byte> out, std::size_t block) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(N), block);
    auto t = check_sizes(moe::collective::Op::all_to_all, in, counts, out, counts);
    auto h_in = to_host(in.first(t.send));
    std::vector<std::byte> h_out(t.recv);
    host_->all_to_all(h_in, h_out, block);
    to_device(h_out, out);
  }
  void all_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts, std::span<std::byte> out,
                    std::span<std::size_t const> recv_counts) {
    auto t = check_sizes(moe::collective::Op::all_to_all_v, in, send_counts, out, recv_counts);
    auto h_in = to_host(in.first(t.send));
    std::vector<std::byte> h_out(t.recv);
    host_->all_to_all_v(h_in, send_counts, h_out, recv_counts);
    to_device(h_out, out);
  }
  void send(std::span<std::byte const> in, int peer, int tag) { host_->send(to_host(in), peer, tag); }
  /// InProcess::recv rejects a message whose size differs from out.size() (h has that size).
  void recv(std::span<std::byte> out, int peer, int tag) {
    std::vector<std::byte> h(out.size());
    host_->recv(h, peer, tag);
    to_device(h, out);
  }
  /// The layer's agreement on a pass gathers every rank's vote.
  void all_gather_v(std::span<std::byte const> in, std::span<std::byte> out, std::span<std::size_t const> counts) {
    auto h_in = to_host(in);
    std::vector<std::byte> h_out(out.size());
    host_->all_gather_v(h_in, h_out, counts);
    to_device(h_out, out);
  }
  // Not used by the device paths under test; present so the type models collective::Collective.
  void reduce_scatter_v(std::span<float const>, std::span<float>, std::span<std::size_t const>) { unused(); }
  void all_reduce(std::span<float>) { unused(); }

private:
  /// The size checks of collective::Nccl (Ledger::exchange) on the caller's buffers; a throwaway
  /// ledger, since the bytes are counted by the InProcess call that follows.
  auto check_sizes(moe::collective::Op op, std::span<std::byte const> in, std::span<std::size_t const> send_counts,
                   std::span<std::byte> out, std::span<std::size_t const> recv_counts) const {
    moe::collective::detail::Ledger checks(rank(), size());
    return checks.exchange(op, in.size(), send_counts, out.size(), recv_counts);
  }
  [[noreturn]] static void unused() { moe::fail("StagedDevice: operation not used by the device paths under test"); }
  std::vector<std::byte> to_host(std::span<std::byte const> d) const {
    namespace kc = moe::kernels::cuda;
    std::vector<std::byte> h(d.size());
    if (!h.empty())
      kc::check_cuda(cudaMemcpyAsync(h.data(), d.data(), d.size(), cudaMemcpyDeviceToHost, stream_), "staging D2H");
    kc::check_cuda(cudaStreamSynchronize(stream_), "staging sync (to host)");
    return h;
  }
  void to_device(std::vector<std::byte> const& h, std::span<std::byte> d) const {
    namespace kc = moe::kernels::cuda;
    if (!h.empty())
      kc::check_cuda(cudaMemcpyAsync(d.data(), h.data(), h.size(), cudaMemcpyHostToDevice, stream_), "staging H2D");
    kc::check_cuda(cudaStreamSynchronize(stream_), "staging sync (to device)");
  }
  moe::collective::InProcess<N>* host_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace moe::test
