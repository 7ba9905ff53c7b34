#pragma once
// Collective operations checked against values written out by hand from the rank numbers, for any
// collective (InProcess threads or MPI processes). run_collective_cases returns a list of failures
// instead of asserting, so it can run on threads.

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "moe/collective/concept.hpp"

namespace moe::test {

template <class Comm>
std::vector<std::string> run_collective_cases(Comm& c) {
  std::vector<std::string> bad;
  auto expect = [&](bool ok, std::string what) {
    if (!ok) bad.push_back("rank " + std::to_string(c.rank()) + ": " + what);
  };
  int n = c.size(), me = c.rank();
  auto N = static_cast<std::size_t>(n);
  c.reset_counters();

  // all_to_all_v: rank p sends (p + q) bytes of value 16p + q to rank q.
  std::vector<std::size_t> sc(N), rc(N);
  std::vector<std::byte> send, recv;
  for (int q = 0; q < n; ++q) {
    sc[static_cast<std::size_t>(q)] = static_cast<std::size_t>(me + q);
    rc[static_cast<std::size_t>(q)] = static_cast<std::size_t>(q + me);
    for (int i = 0; i < me + q; ++i) send.push_back(static_cast<std::byte>(16 * me + q));
  }
  recv.resize(std::accumulate(rc.begin(), rc.end(), std::size_t{0}));
  c.all_to_all_v(send, sc, recv, rc);
  std::size_t at = 0;
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < p + me; ++i) expect(recv[at++] == static_cast<std::byte>(16 * p + me), "all_to_all_v payload");
  std::size_t remote = std::accumulate(sc.begin(), sc.end(), std::size_t{0}) - sc[static_cast<std::size_t>(me)];
  expect(c.counters()[collective::Op::all_to_all_v] == remote, "all_to_all_v byte count");
  // What the in-process backend really copies into this rank (a separate figure from the
  // modelled counters): here the bytes the other ranks send to it, sum over p != me of p + me.
  std::size_t copied_before = 0;
  auto copied_since = [&]() -> std::size_t {
    if constexpr (requires { c.bytes_copied_from_peers(); }) {
      std::size_t now = c.bytes_copied_from_peers(), since = now - copied_before;
      copied_before = now;
      return since;
    } else {
      return 0;
    }
  };
  constexpr bool counts_copies = requires { c.bytes_copied_from_peers(); };
  {
    std::size_t from_peers = 0;
    for (int p = 0; p < n; ++p)
      if (p != me) from_peers += static_cast<std::size_t>(p + me);
    std::size_t got = copied_since();
    if (counts_copies) expect(got == from_peers, "all_to_all_v bytes copied from peers");
  }

  // reduce_scatter_v: rank p contributes value (p + 1) * (i + 1) at element i; rank q keeps q + 1 elements.
  std::vector<std::size_t> counts(N);
  for (int q = 0; q < n; ++q) counts[static_cast<std::size_t>(q)] = static_cast<std::size_t>(q + 1);
  std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  std::vector<float> in(total), out(counts[static_cast<std::size_t>(me)]);
  for (std::size_t i = 0; i < total; ++i) in[i] = float(me + 1) * float(i + 1);
  c.reduce_scatter_v(in, out, counts);
  std::size_t offset = std::accumulate(counts.begin(), counts.begin() + me, std::size_t{0});
  float ranks_sum = float(n * (n + 1) / 2);
  for (std::size_t i = 0; i < out.size(); ++i) expect(out[i] == ranks_sum * float(offset + i + 1), "reduce_scatter_v value");
  expect(c.counters()[collective::Op::reduce_scatter] == (total - out.size()) * sizeof(float), "reduce_scatter bytes");
  // Copied: this rank's slice out of every other rank's input.
  {
    std::size_t got = copied_since();
    if (counts_copies) expect(got == (N - 1) * out.size() * sizeof(float), "reduce_scatter bytes copied from peers");
  }

  // all_gather_v: rank p contributes p + 2 bytes of value p.
  std::vector<std::size_t> gc(N);
  for (int q = 0; q < n; ++q) gc[static_cast<std::size_t>(q)] = static_cast<std::size_t>(q + 2);
  std::vector<std::byte> mine(static_cast<std::size_t>(me + 2), static_cast<std::byte>(me));
  std::vector<std::byte> all(std::accumulate(gc.begin(), gc.end(), std::size_t{0}));
  c.all_gather_v(mine, all, gc);
  at = 0;
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < p + 2; ++i) expect(all[at++] == static_cast<std::byte>(p), "all_gather_v payload");
  expect(c.counters()[collective::Op::all_gather] == static_cast<std::size_t>(n - 1) * mine.size(), "all_gather bytes");
  // Copied: every other rank's contribution, p + 2 bytes from rank p.
  {
    std::size_t got = copied_since();
    if (counts_copies) expect(got == all.size() - mine.size(), "all_gather bytes copied from peers");
  }

  // all_reduce: sum of (p + 1) * (i + 1).
  std::vector<float> v(6);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(me + 1) * float(i + 1);
  c.all_reduce(v);
  for (std::size_t i = 0; i < v.size(); ++i) expect(v[i] == ranks_sum * float(i + 1), "all_reduce value");
  expect(c.counters()[collective::Op::all_reduce] == 2 * (N - 1) * v.size() * sizeof(float) / N, "all_reduce bytes");
  // Copied: the whole vector of every other rank (not the ring model's 2 (N - 1) / N).
  {
    std::size_t got = copied_since();
    if (counts_copies) expect(got == (N - 1) * v.size() * sizeof(float), "all_reduce bytes copied from peers");
  }

  // send/recv around a ring, then a barrier.
  int next = (me + 1) % n, prev = (me + n - 1) % n;
  std::vector<std::byte> msg(static_cast<std::size_t>(3 + me), static_cast<std::byte>(me)), got(static_cast<std::size_t>(3 + prev));
  if (me % 2 == 0) {
    c.send(msg, next, 7);
    c.recv(got, prev, 7);
  } else {
    c.recv(got, prev, 7);
    c.send(msg, next, 7);
  }
  for (auto b : got) expect(b == static_cast<std::byte>(prev), "send/recv payload");
  c.barrier();
  return bad;
}

}  // namespace moe::test
