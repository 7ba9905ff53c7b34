// collective::Nccl itself at world sizes 1, 2 and 4: one thread per rank, each with its own device
// and stream, every operation the library uses (all_to_all_v, reduce_scatter_v, all_gather_v,
// all_reduce, send/recv, barrier, duplicate) against values computed here from the rank formulas.
// On a GPU machine this needs as many devices as ranks (cases with more ranks are skipped); in CI
// it runs on the CUDA emulator's in-process NCCL (tests/emu).

#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_support.cuh"
#include "moe/collective/nccl.hpp"

namespace kc = moe::kernels::cuda;
using moe::test::Device;

namespace {

/// Byte i of the message from rank p to rank q.
std::byte payload(int p, int q, std::size_t i) { return static_cast<std::byte>((p * 31 + q * 7 + static_cast<int>(i) * 3) & 0xff); }
/// Bytes rank p sends to rank q (0 for some pairs).
std::size_t pair_bytes(int p, int q) { return static_cast<std::size_t>((3 * p + q) % 4) * 5; }

/// Runs `body(rank, comm)` on `world` threads, each on its own device and stream; returns the
/// failures the ranks reported (Catch2's macros are not thread-safe).
std::vector<std::string> on_ranks(int world, std::function<void(int, moe::collective::Nccl&, std::vector<std::string>&)> body) {
  auto id = moe::collective::Nccl::unique_id();
  std::vector<std::vector<std::string>> failures(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      auto& f = failures[static_cast<std::size_t>(r)];
      try {
        kc::check_cuda(cudaSetDevice(r), "cudaSetDevice");
        // A blocking stream: the buffers are poisoned with cudaMemset on the legacy stream, which a
        // non-blocking stream would not wait for.
        moe::test::Stream s;
        {
          auto comm = moe::collective::Nccl::create(r, world, id, s);
          body(r, comm, f);
        }
        s.synchronize("cudaStreamSynchronize");
      } catch (std::exception const& e) {
        f.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  for (auto& t : threads) t.join();
  std::vector<std::string> all;
  for (auto& f : failures) all.insert(all.end(), f.begin(), f.end());
  return all;
}

template <class T>
std::vector<T> fetch(Device<T> const& d, cudaStream_t s) {
  kc::check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return d.download();
}

void exercise(int r, moe::collective::Nccl& comm, std::vector<std::string>& f) {
  int const w = comm.size();
  cudaStream_t const s = comm.stream();
  auto fail = [&](std::string const& m) { f.push_back("rank " + std::to_string(r) + ": " + m); };
  // all_to_all_v
  std::vector<std::size_t> sc(static_cast<std::size_t>(w)), rc(static_cast<std::size_t>(w));
  std::vector<std::byte> in;
  for (int q = 0; q < w; ++q) {
    sc[static_cast<std::size_t>(q)] = pair_bytes(r, q);
    rc[static_cast<std::size_t>(q)] = pair_bytes(q, r);
    for (std::size_t i = 0; i < pair_bytes(r, q); ++i) in.push_back(payload(r, q, i));
  }
  std::size_t rtotal = 0;
  for (auto c : rc) rtotal += c;
  Device<std::byte> din(in.empty() ? std::vector<std::byte>(1) : in), dout(rtotal ? rtotal : 1);
  dout.poison();
  comm.all_to_all_v({din.get(), in.size()}, sc, {dout.get(), rtotal}, rc);
  auto got = fetch(dout, s);
  std::size_t at = 0;
  for (int p = 0; p < w; ++p)
    for (std::size_t i = 0; i < pair_bytes(p, r); ++i, ++at)
      if (got[at] != payload(p, r, i)) {
        fail("all_to_all_v byte " + std::to_string(i) + " from rank " + std::to_string(p));
        return;
      }
  // reduce_scatter_v: rank q receives the sum over p of p's slice q.
  std::vector<std::size_t> counts(static_cast<std::size_t>(w));
  std::size_t total = 0;
  for (int q = 0; q < w; ++q) total += counts[static_cast<std::size_t>(q)] = static_cast<std::size_t>(3 + q);
  std::vector<float> vals(total);
  for (std::size_t i = 0; i < total; ++i) vals[i] = static_cast<float>(r * 1000 + static_cast<int>(i));
  Device<float> rin(vals), rout(counts[static_cast<std::size_t>(r)]);
  rout.poison();
  comm.reduce_scatter_v({rin.get(), total}, {rout.get(), counts[static_cast<std::size_t>(r)]}, counts);
  auto red = fetch(rout, s);
  std::size_t off = 0;
  for (int q = 0; q < r; ++q) off += counts[static_cast<std::size_t>(q)];
  for (std::size_t i = 0; i < red.size(); ++i) {
    float want = 0;
    for (int p = 0; p < w; ++p) want += static_cast<float>(p * 1000 + static_cast<int>(off + i));
    if (red[i] != want) fail("reduce_scatter_v element " + std::to_string(i) + ": " + std::to_string(red[i]) + " != " + std::to_string(want));
  }
  // all_gather_v: rank p contributes p + 1 bytes of value p.
  std::vector<std::size_t> gc(static_cast<std::size_t>(w));
  std::size_t gtotal = 0;
  for (int p = 0; p < w; ++p) gtotal += gc[static_cast<std::size_t>(p)] = static_cast<std::size_t>(p + 1);
  Device<std::byte> gin(std::vector<std::byte>(static_cast<std::size_t>(r + 1), static_cast<std::byte>(r))), gout(gtotal);
  gout.poison();
  comm.all_gather_v({gin.get(), static_cast<std::size_t>(r + 1)}, {gout.get(), gtotal}, gc);
  auto gathered = fetch(gout, s);
  at = 0;
  for (int p = 0; p < w; ++p)
    for (int i = 0; i <= p; ++i, ++at)
      if (gathered[at] != static_cast<std::byte>(p)) fail("all_gather_v byte " + std::to_string(at));
  // all_reduce
  std::vector<float> ar(17);
  for (std::size_t i = 0; i < ar.size(); ++i) ar[i] = static_cast<float>(r + static_cast<int>(i));
  Device<float> dar(ar);
  comm.all_reduce({dar.get(), ar.size()});
  auto summed = fetch(dar, s);
  for (std::size_t i = 0; i < summed.size(); ++i)
    if (summed[i] != static_cast<float>(w * static_cast<int>(i) + w * (w - 1) / 2)) fail("all_reduce element " + std::to_string(i));
  // send / recv around the ring (even ranks send first, odd ranks receive first: no deadlock)
  if (w > 1) {
    int next = (r + 1) % w, prev = (r + w - 1) % w;
    Device<std::byte> sbuf(std::vector<std::byte>(9, static_cast<std::byte>(r))), rbuf(9);
    rbuf.poison();
    if (r % 2 == 0) {
      comm.send({sbuf.get(), 9}, next, 0);
      comm.recv({rbuf.get(), 9}, prev, 0);
    } else {
      comm.recv({rbuf.get(), 9}, prev, 0);
      comm.send({sbuf.get(), 9}, next, 0);
    }
    auto ring = fetch(rbuf, s);
    for (auto b : ring)
      if (b != static_cast<std::byte>(prev)) fail("recv from rank " + std::to_string(prev) + ": got " + std::to_string(static_cast<int>(b)));
  }
  comm.barrier();
  // A duplicate communicator is independent of the first and works the same.
  auto dup = comm.duplicate();
  Device<float> one(std::vector<float>(1, 1.0f));
  dup.all_reduce({one.get(), 1});
  if (fetch(one, dup.stream())[0] != static_cast<float>(w)) fail("all_reduce on the duplicate");
}

}  // namespace

TEST_CASE("collective::Nccl at world sizes 1, 2 and 4 (one thread per rank)", "[nccl]") {
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  for (int world : {1, 2, 4}) {
    if (world > devices) {
      WARN("world size " << world << " needs " << world << " devices; skipped");
      continue;
    }
    INFO("world size " << world);
    auto failures = on_ranks(world, exercise);
    for (auto const& m : failures) FAIL_CHECK(m);
    CHECK(failures.empty());
  }
}
