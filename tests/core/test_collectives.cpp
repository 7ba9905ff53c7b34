// InProcess<N> collectives against hand-written expectations; errors abort every rank cleanly.
#include <catch2/catch.hpp>

#include <array>
#include <mutex>

#include "collective_cases.hpp"
#include "moe/collective/in_process.hpp"

template <int N>
void check_world() {
  std::mutex m;
  std::vector<std::string> failures;
  moe::collective::run_in_process<N>([&](auto& comm) {
    auto bad = moe::test::run_collective_cases(comm);
    std::lock_guard lock(m);
    failures.insert(failures.end(), bad.begin(), bad.end());
  });
  INFO((failures.empty() ? std::string() : failures.front()));
  CHECK(failures.empty());
}

TEST_CASE("InProcess collectives move and count the right bytes", "[collective]") {
  check_world<1>();
  check_world<2>();
  check_world<3>();
  check_world<4>();
}

TEST_CASE("a failing rank aborts the world instead of hanging", "[collective][errors]") {
  CHECK_THROWS_WITH(moe::collective::run_in_process<3>([](auto& comm) {
                      if (comm.rank() == 1) throw moe::Error("rank 1 gave up");
                      comm.barrier();
                    }),
                    Catch::Contains("rank 1 gave up"));
  // Mismatched counts are reported, not silently truncated.
  CHECK_THROWS_WITH(moe::collective::run_in_process<2>([](auto& comm) {
                      std::vector<std::byte> in(4), out(8);
                      std::vector<std::size_t> sc{2, 2}, rc{2, comm.rank() == 0 ? 3u : 2u};
                      comm.all_to_all_v(in, sc, out, rc);
                    }),
                    Catch::Contains("expects 3"));
  // The same for the other collectives. The rank that finds the mismatch raises it only after the
  // closing barrier, so that no rank still reads the buffers it frees when it unwinds (under ASan,
  // raising it at once was a heap-use-after-free in the peer).
  CHECK_THROWS_WITH(moe::collective::run_in_process<2>([](auto& comm) {
                      bool r0 = comm.rank() == 0;
                      std::vector<std::byte> in(r0 ? 2 : 3), out(r0 ? 4 : 5);
                      std::vector<std::size_t> counts{2, r0 ? 2u : 3u};
                      comm.all_gather_v(in, out, counts);
                    }),
                    Catch::Contains("all_gather_v: rank 1 contributes 3 bytes but rank 0 expects 2"));
  CHECK_THROWS_WITH(moe::collective::run_in_process<2>([](auto& comm) {
                      std::vector<float> data(comm.rank() == 0 ? 2 : 3);
                      comm.all_reduce(data);
                    }),
                    Catch::Contains("all_reduce: rank"));
  CHECK_THROWS_WITH(moe::collective::run_in_process<2>([](auto& comm) {
                      bool r0 = comm.rank() == 0;
                      std::vector<float> in(r0 ? 4 : 6), out(r0 ? 2 : 3);
                      std::vector<std::size_t> counts{r0 ? 2u : 3u, r0 ? 2u : 3u};
                      comm.reduce_scatter_v(in, out, counts);
                    }),
                    Catch::Contains("reduce_scatter_v: rank 0 contributes 4 elements, rank 1 reads up to 6"));
  CHECK_THROWS_WITH(moe::collective::run_in_process<2>([](auto& comm) {
                      std::vector<std::byte> m(4);
                      if (comm.rank() == 0) comm.send(m, 1, 0);
                      if (comm.rank() == 1) {
                        std::vector<std::byte> small(2);
                        comm.recv(small, 0, 0);
                      }
                    }),
                    Catch::Contains("expected 2 bytes"));
}
