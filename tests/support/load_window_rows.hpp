#pragma once
// The disaggregated layers' load window in the tests: the rows a live::LoadWindow holds, as plain
// vectors, and the row one pass must give, counted from the routes and the documented copy rule
// without the library's code.

#include <array>
#include <cstddef>
#include <vector>

#include "moe/layer/live.hpp"

namespace moe::test {

/// Each pass the window holds, oldest first: pairs per expert, then pairs each rank received.
inline std::vector<std::vector<long long>> window_rows(live::LoadWindow const& w) {
  std::vector<std::vector<long long>> out;
  for (int i = 0; i < w.size(); ++i) {
    std::vector<long long> row(w.experts(i).begin(), w.experts(i).end());
    row.insert(row.end(), w.rank_loads(i).begin(), w.rank_loads(i).end());
    out.push_back(std::move(row));
  }
  return out;
}

/// The window row of one pass of a disaggregated layer on `ranks` ranks, the first `ag` of them
/// attention ranks with `tokens` tokens each: `ids` holds every token's `k` routed experts (AG rank
/// p's token t at (p * tokens + t) * k); token t of AG rank p sends its pair of expert e to copy
/// (p + t) mod n of the n EG indices `copies[e]` lists, and EG index g is rank ag + g.
inline std::vector<long long> disaggregated_row(std::vector<int> const& ids, std::size_t k, int ag, int tokens,
                                                std::vector<std::vector<int>> const& copies, int ranks) {
  std::size_t E = copies.size();
  std::vector<long long> row(E + static_cast<std::size_t>(ranks), 0);
  for (int p = 0; p < ag; ++p)
    for (int t = 0; t < tokens; ++t)
      for (std::size_t q = 0; q < k; ++q) {
        int e = ids[(static_cast<std::size_t>(p) * static_cast<std::size_t>(tokens) + static_cast<std::size_t>(t)) * k + q];
        auto const& c = copies[static_cast<std::size_t>(e)];
        ++row[static_cast<std::size_t>(e)];
        ++row[E + static_cast<std::size_t>(ag + c[static_cast<std::size_t>((p + t) % static_cast<int>(c.size()))])];
      }
  return row;
}

/// The dispatch records of one pass of a disaggregated layer, counted as disaggregated_row counts
/// pairs: records[p][g] is the number of tokens of AG rank p that send at least one pair to EG
/// index g (a record carries every pair of its token bound for one rank).
inline std::vector<std::vector<long long>> disaggregated_records(std::vector<int> const& ids, std::size_t k, int ag,
                                                                 int tokens, std::vector<std::vector<int>> const& copies,
                                                                 int eg) {
  std::vector<std::vector<long long>> records(static_cast<std::size_t>(ag),
                                              std::vector<long long>(static_cast<std::size_t>(eg), 0));
  for (int p = 0; p < ag; ++p)
    for (int t = 0; t < tokens; ++t) {
      std::vector<bool> hit(static_cast<std::size_t>(eg), false);
      for (std::size_t q = 0; q < k; ++q) {
        int e = ids[(static_cast<std::size_t>(p) * static_cast<std::size_t>(tokens) + static_cast<std::size_t>(t)) * k + q];
        auto const& c = copies[static_cast<std::size_t>(e)];
        hit[static_cast<std::size_t>(c[static_cast<std::size_t>((p + t) % static_cast<int>(c.size()))])] = true;
      }
      for (int g = 0; g < eg; ++g) records[static_cast<std::size_t>(p)][static_cast<std::size_t>(g)] += hit[static_cast<std::size_t>(g)];
    }
  return records;
}

/// What Layer::read_record_counts() gives rank `rank` of a disaggregated layer with `ag` AG ranks,
/// from the (AG x EG) records of disaggregated_records: (records_local, records_remote,
/// records_received) = (0, row `rank`'s sum, 0) on an AG rank, (0, 0, column `rank - ag`'s sum) on
/// an EG rank.
inline std::array<long long, 3> disaggregated_rank_records(std::vector<std::vector<long long>> const& records, int ag,
                                                           int rank) {
  long long sent = 0, received = 0;
  for (std::size_t p = 0; p < records.size(); ++p)
    for (std::size_t g = 0; g < records[p].size(); ++g) {
      if (static_cast<int>(p) == rank) sent += records[p][g];
      if (ag + static_cast<int>(g) == rank) received += records[p][g];
    }
  return {0, sent, received};
}

}  // namespace moe::test
