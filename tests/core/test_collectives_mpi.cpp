// The Mpi collective against the same hand-written expectations (run under mpirun).
#include <catch2/catch.hpp>

#include "collective_cases.hpp"
#include "moe/collective/mpi.hpp"

TEST_CASE("Mpi collectives move and count the right bytes", "[collective][mpi]") {
  moe::collective::Mpi comm;
  auto bad = moe::test::run_collective_cases(comm);
  INFO((bad.empty() ? std::string() : bad.front()));
  CHECK(bad.empty());
}

// MPI's counts and displacements are ints. Rank 1 receives 1.1e9 bytes from each of ranks 0 and 2,
// 2.2e9 in all (past INT_MAX), while each sender stays under it: rank 1 refused the call alone and
// the senders waited in MPI_Alltoallv for ever. Hidden (4.4 GB of buffers over the three ranks):
// mpirun -n 3 test_collectives_mpi "[large]".
TEST_CASE("Mpi all_to_all_v receives more than 2^31 bytes", "[.][large][collective][mpi]") {
  moe::collective::Mpi comm;
  REQUIRE(comm.size() == 3);
  constexpr std::size_t big = 1100000000;
  int me = comm.rank();
  auto value = [](int from, std::size_t i) { return static_cast<std::byte>((from * 7 + i % 251) & 0xff); };
  std::vector<std::size_t> sc(3, 0), rc(3, 0);
  std::vector<std::byte> send, recv;
  if (me == 1) {
    rc[0] = rc[2] = big;
    recv.resize(2 * big);
  } else {
    sc[1] = big;
    send.resize(big);
    for (std::size_t i = 0; i < big; ++i) send[i] = value(me, i);
  }
  comm.reset_counters();
  std::string error;
  try {
    comm.all_to_all_v(send, sc, recv, rc);
  } catch (std::exception const& e) {
    error = e.what();
  }
  INFO(error);
  REQUIRE(error.empty());
  std::size_t wrong = 0;
  if (me == 1)
    for (int from : {0, 2})
      for (std::size_t i = 0; i < big; ++i) wrong += recv[(from == 0 ? 0 : big) + i] != value(from, i);
  CHECK(wrong == 0);
  CHECK(comm.counters()[moe::collective::Op::all_to_all_v] == (me == 1 ? 0 : big));
}
