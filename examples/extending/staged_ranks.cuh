#pragma once
// Several ranks of the device moe::Layer on one GPU, for examples/extending/device.cu.
//
// StagedRanks<N> is a collective over device memory (Memory::device) whose exchanges travel through
// host memory: it copies the caller's device bytes to the host, hands them to the in-process
// collective moe::collective::InProcess<N> (one thread per rank), and copies what comes back to
// the caller's device buffer. It has only what the device path asks of a collective that
// exchanges (include/moe/collective/concept.hpp: Exchange and StreamOrdered): rank, size,
// set_stream, all_to_all, all_to_all_v, all_gather_v and the byte counters. On several GPUs,
// moe::collective::Nccl takes its place and the program is otherwise the same.
//
// Stream order: each call first lets the work enqueued on the stream given by set_stream finish
// (the bytes to send are written by kernels on that stream), and returns once the received bytes
// are in the caller's buffer. Slow, but every rank sees exactly what NCCL would deliver.
//
// The test suite has its own staged collective (tests/cuda/staged_collective.cuh) with NCCL's
// buffer-size checks and the point-to-point calls of the disaggregated paths; an example does not
// include test helpers, and this one keeps to what the program needs.
#include <cuda_runtime.h>

#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/collective/in_process.hpp"
#include "moe/kernels/cuda_common.cuh"

namespace extending {

template <int N>
class StagedRanks {
public:
  static constexpr moe::collective::Memory memory = moe::collective::Memory::device;

  explicit StagedRanks(moe::collective::InProcess<N>& host) : host_(&host) {}

  [[nodiscard]] int rank() const { return host_->rank(); }
  [[nodiscard]] int size() const { return host_->size(); }
  /// The stream whose work each exchange waits for and on which it copies.
  void set_stream(cudaStream_t stream) { stream_ = stream; }
  /// Bytes sent to other ranks, per operation (counted by the in-process collective).
  [[nodiscard]] moe::collective::Counters const& counters() const { return host_->counters(); }
  void reset_counters() { host_->reset_counters(); }

  void all_to_all(std::span<std::byte const> in, std::span<std::byte> out, std::size_t block) {
    auto sent = download(front(in, block * N));
    std::vector<std::byte> got(block * N);
    host_->all_to_all(sent, got, block);
    upload(got, out);
  }
  void all_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send_counts, std::span<std::byte> out,
                    std::span<std::size_t const> recv_counts) {
    auto sent = download(front(in, std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0})));
    std::vector<std::byte> got(std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}));
    host_->all_to_all_v(sent, send_counts, got, recv_counts);
    upload(got, out);
  }
  void all_gather_v(std::span<std::byte const> in, std::span<std::byte> out, std::span<std::size_t const> counts) {
    auto sent = download(in);
    std::vector<std::byte> got(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
    host_->all_gather_v(sent, got, counts);
    upload(got, out);
  }

private:
  /// The first `n` bytes of the send buffer `in`, which must hold them.
  static std::span<std::byte const> front(std::span<std::byte const> in, std::size_t n) {
    moe::check(n <= in.size(), "StagedRanks: ", n, " bytes to send from a buffer of ", in.size());
    return in.first(n);
  }
  /// The device bytes `d`, once the stream's earlier work has written them.
  std::vector<std::byte> download(std::span<std::byte const> d) const {
    namespace kc = moe::kernels::cuda;
    std::vector<std::byte> h(d.size());
    if (!h.empty())
      kc::check_cuda(cudaMemcpyAsync(h.data(), d.data(), h.size(), cudaMemcpyDeviceToHost, stream_),
                     "StagedRanks: to host");
    kc::check_cuda(cudaStreamSynchronize(stream_), "StagedRanks: stream sync");
    return h;
  }
  /// `h` into the front of the device buffer `d`; returns when the copy is done.
  void upload(std::vector<std::byte> const& h, std::span<std::byte> d) const {
    namespace kc = moe::kernels::cuda;
    moe::check(h.size() <= d.size(), "StagedRanks: ", h.size(), " bytes received into a buffer of ", d.size());
    if (!h.empty())
      kc::check_cuda(cudaMemcpyAsync(d.data(), h.data(), h.size(), cudaMemcpyHostToDevice, stream_),
                     "StagedRanks: to device");
    kc::check_cuda(cudaStreamSynchronize(stream_), "StagedRanks: stream sync");
  }

  moe::collective::InProcess<N>* host_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace extending
