#pragma once
// Rows swapped between ranks over point-to-point messages (send / recv), for communicators that
// have them (collective::PointToPoint, and the device communicators of the disaggregated paths).

#include <cstddef>
#include <span>

namespace moe::collective {

/// Each of the first `ranks` ranks sends its row to every other one of them and receives theirs:
/// `row(p)` is rank p's row (a span of trivially copyable elements, as long on every rank), and
/// this rank (`me`) fills the others' rows. Pair by pair in one global order, the lower rank
/// sending first, so blocking sends cannot deadlock; (ranks - 1) rows sent per rank. Ranks at or
/// past `ranks` take no part. On device communicators the messages go on the stream set on `comm`.
template <class Comm, class Row>
void swap_rows_pairwise(Comm& comm, int me, int ranks, Row&& row, int tag) {
  for (int p = 0; p < ranks; ++p)
    for (int q = p + 1; q < ranks; ++q) {
      if (me == p) {
        comm.send(std::as_bytes(row(p)), q, tag);
        comm.recv(std::as_writable_bytes(row(q)), q, tag);
      } else if (me == q) {
        comm.recv(std::as_writable_bytes(row(p)), p, tag);
        comm.send(std::as_bytes(row(q)), p, tag);
      }
    }
}

}  // namespace moe::collective
