#pragma once
// s-EG: balanced token-expert co-clustering (Speculative MoE, section 3.4 and Appendix B).
//
// Given, for one MoE layer, the profiled activations c(t, e) (how often token t chose expert e) and
// the token frequencies f(t), find
//   - an expert -> device grouping with exactly experts/devices experts per device, and
//   - a token -> device table (where s-TS re-batches each token before the gate),
// such that most activations are local (expert on the token's device) while the token frequency
// per device stays balanced. The paper's objective is
//     J = sum_d (F_d - F/D)^2  +  lambda * sum_{t,e: dev(e) != dev(t)} c(t, e)
// with F_d the token frequency on device d; `objective()` evaluates a normalised form of it.
//
// Solvers:
//   solve_cross_entropy  the cross-entropy method of Algorithm 1 (seeded, deterministic)
//   balanced_kmeans      two-stage balanced k-means baseline (experts first, then tokens)
//   solve_metis          METIS baseline, in moe/speculative/cocluster_metis.hpp (needs libmetis)
//   refine, assign_tokens_to  the best responses every solver shares (cocluster_problem.hpp)
//
// One header per method; this one includes the problem and the first two solvers.

#include "moe/speculative/cocluster_cross_entropy.hpp"
#include "moe/speculative/cocluster_kmeans.hpp"
#include "moe/speculative/cocluster_problem.hpp"
