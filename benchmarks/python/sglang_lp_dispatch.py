#!/usr/bin/env python3
"""moe_compose.BatchSplit against SGLang's own per-batch dispatch (docs/results/batch-balance.md,
"SGLang's LP dispatch").

  python benchmarks/python/sglang_lp_dispatch.py [--batches 20] [--json out.json]

Run it with a Python that has SGLang 0.5.23 (its wheel installed without dependencies), torch and
moe_compose: the engines' environment of scripts/engine_check.sh has all three
(~/.cache/moe-compose/engine-check-venv/bin/python).

SGLang 0.5.23 balances each batch with `--ep-dispatch-algorithm lp`: every rank counts its tokens
per logical expert, the counts are all-reduced, and a linear program (sglang/srt/eplb/
lplb_solver.py) gives each copy of a replicated expert a share of that expert's tokens, so that
the largest GPU load is least; each token then draws its copy at random from those shares. The
solver and the draw are CUDA kernels that need a Hopper GPU; SGLang ships pure-torch references of
both (sglang/test/kernels/lplb.py: "mirrors the barrier-method iteration ... step-for-step";
dispatch "bit-equivalent ... for identical random_vals"), and this program runs those on the CPU:
  - LPLBSolver.__init__ (SGLang's code) builds the LP from the layout; only its JIT warm-up of the
    CUDA kernel is skipped;
  - the LP's inputs and its output's conversion to per-copy shares are each a short kernel
    (csrc/lplb/lp_prep.cuh, lp_post.cuh) whose header gives its torch equivalent; those few lines
    are written out here (prep_inputs, shares) from those comments;
  - solve_ipm_torch_reference and dispatch_probability_torch_reference are SGLang's own.
SGLang's copy lists come from its own functions (sglang/srt/eplb/expert_location.py) with its
runtime context replaced by a stand-in holding what they read (ep_size, nnodes, the a2a backend):
  - "lp, no a2a": --moe-a2a-backend none: every copy is a candidate on every rank;
  - "lp, deepep": an all-to-all backend (DeepEP): _compute_logical_to_all_physical_map keeps, per
    rank, only the copy on its GPU, or on its node where that narrows the candidates, and the LP's
    shares apply to the rest;
  - "static": SGLang's static dispatch (compute_logical_to_rank_dispatch_physical_map, per rank).
moe_compose.BatchSplit (exact: the least largest load, then own GPU, then own server) is run on the
same batches.

Scenario (synthetic, seeded; the scenario of bench_batch_split with numpy's generator): DeepSeek-V3
at EP32, 256 experts, top-8 distinct experts per token, 32 GPUs in 4 nodes of 8; the plan is
eplb.py's (moe_compose.rebalance_experts, identical) of 288 slots from the mean popularity, drawn
Gamma(0.7) (seed 11); each batch multiplies every expert's popularity by U(1 - d, 1 + d) (d = 0,
0.25, 0.5; seed 1000 + batch) and draws each rank's tokens from it (seed 100000 x batch + 100 +
rank). Per batch: the largest pairs any GPU receives over the mean, and the share of pairs that
leave their GPU's node (cross the network); means over the batches. SGLang's draws are seeded
(torch.Generator, seed 7 + batch).
"""

from __future__ import annotations

import argparse
import json
import sys
import types

import numpy as np

EXPERTS, TOPK, GPUS, PER_NODE, SLOTS = 256, 8, 32, 8, 288
METHODS = ["static", "lp, no a2a", "lp, deepep", "BatchSplit"]


def sglang_modules():
    try:
        import torch
        import sglang.kernels.ops.lplb.torch_solver as torch_solver
        from sglang.srt.eplb import expert_location, lplb_solver
        from sglang.test.kernels import lplb as reference
    except ImportError as e:
        sys.exit(f"sglang_lp_dispatch: needs SGLang 0.5.23 and torch ({e}); run it with the engines' environment "
                 "of scripts/engine_check.sh")
    # LPLBSolver.__init__ JIT-compiles and warms up the CUDA solver; the CPU run uses the reference.
    torch_solver.warmup = lambda *args, **kwargs: None
    return torch, expert_location, lplb_solver, reference


def stand_in_context(expert_location, a2a_backend):
    """What expert_location's functions read from SGLang's runtime context."""
    moe = types.SimpleNamespace(moe_a2a_backend=a2a_backend, ep_join_mode=None)
    parallel = types.SimpleNamespace(ep_size=GPUS, nnodes=GPUS // PER_NODE)
    expert_location.get_exec = lambda: types.SimpleNamespace(moe=moe)
    expert_location.get_parallel = lambda: parallel
    expert_location._prefer_same_node_experts = lambda: True


def prep_inputs(torch, solver, global_counts):
    """lp_prep.cuh's torch equivalent (its header comment): the LP's right-hand side and last column."""
    total = global_counts.sum()
    norm = global_counts / total.clamp(min=1.0)
    t1 = norm[solver.log_single]
    b1 = norm[solver.log_replicated]
    b2 = -(solver.B1 @ t1).flatten()
    b = torch.cat([b1, b2])
    A = solver._A_full.clone()
    A[:, -1] = b - solver._A_base_row_sum
    return A, b, t1


def shares(torch, solver, x, t1, log2phy):
    """lp_post.cuh's torch equivalent: each candidate copy's share (log2phy -1 entries get 0)."""
    phy = torch.zeros(solver.num_single + solver.num_red_phy + 1, dtype=torch.float32)
    phy[solver.phy_replicated] = x[: solver.num_red_phy].clamp(min=0)
    phy[solver.phy_single] = t1
    return torch.take(phy, log2phy)


def draw_batch(rng_seed, weights, tokens):
    """tokens x TOPK distinct experts, each token drawn from `weights` without repeats."""
    rng = np.random.default_rng(rng_seed)
    p = weights / weights.sum()
    # Sampling without replacement in proportion to p, one token at a time, as the C++ scenario does
    # (a draw that repeats an expert is drawn again): Gumbel top-k gives the same distribution.
    g = rng.gumbel(size=(tokens, EXPERTS)) + np.log(p)
    return np.argsort(-g, axis=1)[:, :TOPK].astype(np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=20, help="batches per (drift, size); 4096 tokens: half")
    ap.add_argument("--sizes", default="16,64,256,4096")
    ap.add_argument("--drifts", default="0,0.25,0.5")
    ap.add_argument("--plans", default="eplb,joint")
    ap.add_argument("--json", help="write the per-setting means here")
    ap.add_argument("--check", action="store_true",
                    help="a short run (2 batches at 16 and 256 tokens, drift +-50 %%) that fails unless BatchSplit's "
                         "largest GPU load is at most every SGLang dispatch's on every batch (scripts/engine_check.sh)")
    args = ap.parse_args()
    if args.check:
        args.batches, args.sizes, args.drifts = 2, "16,256", "0.5"
    torch, expert_location, lplb_solver, reference = sglang_modules()
    import moe_compose as mc

    pop = np.random.default_rng(11).gamma(0.7, 1.0, size=EXPERTS)
    rows = []
    for plan in args.plans.split(","):
        rows += run_plan(args, plan, pop, torch, expert_location, lplb_solver, reference, mc)
    print("\nlargest GPU load / mean (pairs on their own GPU, pairs leaving their node)")
    print("\n| plan | drift | tokens/rank | " + " | ".join(METHODS) + " | IPM's value | IPM fallbacks |")
    print("|---|---|---:|" + "---:|" * len(METHODS) + "---:|---:|")
    for row in rows:
        print(f"| {row['plan']} | ±{row['drift']:.0%} | {row['tokens']} | " +
              " | ".join(f"{row[m]['max_over_mean']:.3f} ({row[m]['own_gpu']:.1%}, {row[m]['cross_node']:.1%})"
                         for m in METHODS) + f" | {row['ipm_value']:.3f} | {row['ipm_fallbacks']} / {row['batches']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.check:
        print("sglang_lp_dispatch: BatchSplit's largest GPU load at most SGLang's static and LP dispatches' on every batch")


def make_plan(plan, pop, mc):
    """phy2log [SLOTS] of eplb.py's plan or moe_compose's joint plan (4 nodes of 8 under one switch)."""
    if plan == "eplb":
        return mc.rebalance_experts(pop[None].astype(np.float32), SLOTS, 8, GPUS // PER_NODE, GPUS)[0][0]
    if plan == "joint":
        j = mc.joint(mc.fat_tree(1, GPUS // PER_NODE, PER_NODE, 1), pop[None], SLOTS // GPUS)
        return mc.slot_map(j["copies"], GPUS, pop[None], SLOTS // GPUS)[0]
    sys.exit(f"sglang_lp_dispatch: unknown plan '{plan}' (eplb, joint)")


def run_plan(args, plan, pop, torch, expert_location, lplb_solver, reference, mc):
    phy2log = make_plan(plan, pop, mc)
    S = SLOTS // GPUS
    node_of_slot = np.arange(SLOTS) // S // PER_NODE
    p2l = torch.tensor(phy2log[None])

    # SGLang's copy lists: all candidates (no a2a backend) and per rank (DeepEP); its static map.
    stand_in_context(expert_location, "none")
    full = expert_location._compute_logical_to_all_physical_map(p2l, EXPERTS, GPUS, moe_ep_rank=0)[0]
    stand_in_context(expert_location, "deepep")
    per_rank = [expert_location._compute_logical_to_all_physical_map(p2l, EXPERTS, GPUS, moe_ep_rank=r)[0]
                for r in range(GPUS)]
    static = [expert_location.compute_logical_to_rank_dispatch_physical_map(full[None], GPUS, SLOTS, ep_rank=r)[0]
              for r in range(GPUS)]
    num_valid = (full != -1).sum(dim=1)
    solver = lplb_solver.LPLBSolver(torch.tensor(phy2log), full, GPUS, None, num_valid)
    ours = mc.BatchSplit(phy2log, GPUS, PER_NODE)

    methods = METHODS
    rows = []
    for drift in [float(d) for d in args.drifts.split(",")]:
        for tokens in [int(t) for t in args.sizes.split(",")]:
            batches = args.batches if tokens < 4096 else max(1, args.batches // 2)
            ratio = {m: [] for m in methods}
            remote = {m: [] for m in methods}
            own = {m: [] for m in methods}
            lp_value = []
            fallbacks = 0
            for b in range(batches):
                now = pop * np.random.default_rng(1000 + b).uniform(1 - drift, 1 + drift, size=EXPERTS)
                ids = [draw_batch(100000 * b + 100 + r, now, tokens) for r in range(GPUS)]
                counts = np.stack([np.bincount(i.ravel(), minlength=EXPERTS) for i in ids])
                mean = tokens * TOPK
                # SGLang's LP: one solve from the all-reduced counts, then each rank's draw
                A, rhs, t1 = prep_inputs(torch, solver, torch.tensor(counts.sum(0), dtype=torch.float32))
                x = reference.solve_ipm_torch_reference(A, rhs, solver.c_vec)
                fallbacks += bool((x == 0.5).all())
                # the LP's own value of the largest GPU load (its variable M, a share of all pairs)
                lp_value.append(float(x[-2]) * counts.sum() / mean)
                gen = torch.Generator().manual_seed(7 + b)
                out = {m: [] for m in methods}
                for r in range(GPUS):
                    t = torch.tensor(ids[r])
                    u = torch.rand(t.numel(), generator=gen)
                    out["static"].append(static[r][t].numpy())
                    out["lp, no a2a"].append(
                        reference.dispatch_probability_torch_reference(t, shares(torch, solver, x, t1, full), full, u).numpy())
                    out["lp, deepep"].append(reference.dispatch_probability_torch_reference(
                        t, shares(torch, solver, x, t1, per_rank[r]), per_rank[r], u).numpy())
                ours.plan(counts)
                out["BatchSplit"] = [ours.dispatch(r, ids[r]) for r in range(GPUS)]
                for m in methods:
                    slots = np.stack(out[m])  # GPUS x tokens x TOPK
                    assert (phy2log[slots] == np.stack(ids)).all(), m
                    load = np.bincount((slots // S).ravel(), minlength=GPUS)
                    ratio[m].append(load.max() / mean)
                    src_node = (np.arange(GPUS) // PER_NODE)[:, None, None]
                    remote[m].append(float((node_of_slot[slots] != src_node).mean()))
                    own[m].append(float((slots // S == np.arange(GPUS)[:, None, None]).mean()))
                worse = [m for m in methods if ratio[m][-1] < ratio["BatchSplit"][-1]]
                if args.check and worse:
                    sys.exit(f"sglang_lp_dispatch: {plan} plan, batch {b} at {tokens} tokens: {', '.join(worse)} "
                             f"loads its busiest GPU less than BatchSplit ({ratio['BatchSplit'][-1]:.4f} x the mean), "
                             "which splits at the least largest load")
            row = {"plan": plan, "drift": drift, "tokens": tokens, "batches": batches, "ipm_fallbacks": fallbacks,
                   "ipm_value": float(np.mean(lp_value))}
            for m in methods:
                row[m] = {"max_over_mean": float(np.mean(ratio[m])), "cross_node": float(np.mean(remote[m])),
                          "own_gpu": float(np.mean(own[m]))}
            rows.append(row)
            print(f"{plan} drift +-{drift:.0%} tokens {tokens:5d} ({batches} batches, IPM fallbacks {fallbacks}): " +
                  "; ".join(f"{m} {row[m]['max_over_mean']:.3f} / {row[m]['own_gpu']:.1%} / {row[m]['cross_node']:.1%}"
                            for m in methods) + f"; IPM's value {row['ipm_value']:.3f}",
                  flush=True)
    return rows


if __name__ == "__main__":
    main()
