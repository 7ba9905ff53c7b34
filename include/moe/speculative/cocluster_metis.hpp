#pragma once
// METIS baseline for s-EG co-clustering (optional: needs Debian's libmetis-dev; link with -lmetis).
//
// The token-expert activation matrix becomes an undirected bipartite graph: one vertex per token row
// and per expert, an edge (token, expert) weighted by the activation count. METIS_PartGraphKway cuts
// it into D parts with two balance constraints (token frequency, expert count). METIS balances the
// expert count only up to its tolerance, so a repair step then moves experts (least lost local
// activations first) until every device holds exactly E/D experts. Tokens keep METIS's labels.
//
// MOE_HAS_METIS is 1 when <metis.h> is available (the function exists), 0 otherwise.

#include "moe/speculative/cocluster_problem.hpp"

#if __has_include(<metis.h>)
#include <metis.h>
#define MOE_HAS_METIS 1
#else
#define MOE_HAS_METIS 0
#endif

#if MOE_HAS_METIS
#include <cmath>
#include <limits>
#include <vector>

namespace moe::speculative {

struct MetisOptions {
  double token_tolerance = 1.1;   ///< allowed max/mean of the token frequency per part
  double expert_tolerance = 1.05; ///< allowed max/mean of the expert count per part (before repair)
  int seed = 1;
};

inline CoclusterResult solve_metis(CoclusterProblem const& p, MetisOptions const& opt = {}) {
  p.validate();
  auto N = p.rows();
  auto E = static_cast<std::size_t>(p.experts);
  auto D = static_cast<std::size_t>(p.devices);
  auto V = N + E;
  check(V < static_cast<std::size_t>(std::numeric_limits<idx_t>::max() / 4), "metis: graph too large");
  // Adjacency (CSR): token rows first, then experts.
  std::vector<std::vector<std::pair<idx_t, idx_t>>> expert_adj(E);
  std::vector<idx_t> xadj(V + 1, 0), adjncy, adjwgt;
  adjncy.reserve(2 * p.expert.size());
  adjwgt.reserve(2 * p.expert.size());
  auto iw = [](double w) { return static_cast<idx_t>(std::max(1.0, std::round(w))); };
  for (std::size_t i = 0; i < N; ++i) {
    for (auto j = p.offsets[i]; j < p.offsets[i + 1]; ++j) {
      auto ju = static_cast<std::size_t>(j);
      auto e = static_cast<std::size_t>(p.expert[ju]);
      adjncy.push_back(static_cast<idx_t>(N + e));
      adjwgt.push_back(iw(p.weight[ju]));
      expert_adj[e].push_back({static_cast<idx_t>(i), iw(p.weight[ju])});
    }
    xadj[i + 1] = static_cast<idx_t>(adjncy.size());
  }
  for (std::size_t e = 0; e < E; ++e) {
    for (auto [t, w] : expert_adj[e]) {
      adjncy.push_back(t);
      adjwgt.push_back(w);
    }
    xadj[N + e + 1] = static_cast<idx_t>(adjncy.size());
  }
  idx_t ncon = 2;
  std::vector<idx_t> vwgt(2 * V, 0);
  for (std::size_t i = 0; i < N; ++i) vwgt[2 * i] = iw(p.frequency[i]);
  for (std::size_t e = 0; e < E; ++e) vwgt[2 * (N + e) + 1] = 1;
  idx_t nv = static_cast<idx_t>(V), nparts = static_cast<idx_t>(D), objval = 0;
  std::vector<real_t> ubvec = {static_cast<real_t>(opt.token_tolerance), static_cast<real_t>(opt.expert_tolerance)};
  std::vector<idx_t> part(V, 0);
  idx_t options[METIS_NOPTIONS];
  METIS_SetDefaultOptions(options);
  options[METIS_OPTION_SEED] = opt.seed;
  options[METIS_OPTION_NUMBERING] = 0;
  int status = D == 1 ? METIS_OK
                      : METIS_PartGraphKway(&nv, &ncon, xadj.data(), adjncy.data(), vwgt.data(), nullptr,
                                            adjwgt.data(), &nparts, nullptr, ubvec.data(), options, &objval,
                                            part.data());
  check(status == METIS_OK, "metis: METIS_PartGraphKway failed with status ", status);

  std::vector<int> token_device(N), expert_device(E);
  for (std::size_t i = 0; i < N; ++i) token_device[i] = static_cast<int>(part[i]);
  for (std::size_t e = 0; e < E; ++e) expert_device[e] = static_cast<int>(part[N + e]);

  // Repair: exactly E/D experts per device. local[e][d] = activations of e from tokens on d.
  std::vector<double> local(E * D, 0.0);
  for (std::size_t i = 0; i < N; ++i)
    for (auto j = p.offsets[i]; j < p.offsets[i + 1]; ++j) {
      auto ju = static_cast<std::size_t>(j);
      local[static_cast<std::size_t>(p.expert[ju]) * D + static_cast<std::size_t>(token_device[i])] += p.weight[ju];
    }
  auto per = static_cast<std::size_t>(p.experts_per_device());
  std::vector<std::size_t> count(D, 0);
  for (int d : expert_device) ++count[static_cast<std::size_t>(d)];
  while (true) {
    double best = std::numeric_limits<double>::lowest();
    std::size_t be = E, bd = D;
    for (std::size_t e = 0; e < E; ++e) {
      auto from = static_cast<std::size_t>(expert_device[e]);
      if (count[from] <= per) continue;
      for (std::size_t d = 0; d < D; ++d) {
        if (count[d] >= per) continue;
        double gain = local[e * D + d] - local[e * D + from];
        if (gain > best) {
          best = gain;
          be = e;
          bd = d;
        }
      }
    }
    if (be == E) break;
    --count[static_cast<std::size_t>(expert_device[be])];
    ++count[bd];
    expert_device[be] = static_cast<int>(bd);
  }
  return detail::finish(p, std::move(expert_device), std::move(token_device), 1);
}

}  // namespace moe::speculative
#endif
