#!/usr/bin/env python3
"""moe_compose.BatchSplit against SGLang's own per-batch dispatch (docs/results/batch-balance.md,
section (4)).

  python benchmarks/python/sglang_lp_dispatch.py [--batches 20] [--json out.json]

Run it with a Python that has SGLang 0.5.23 (its wheel installed without dependencies), torch and
moe_compose: the engines' environment of scripts/engine_check.sh has all three
(~/.cache/moe-compose/engine-check-venv/bin/python).

SGLang 0.5.23 balances each batch with `--ep-dispatch-algorithm lp`: every rank counts its tokens
per logical expert, the counts are all-reduced, and a linear program (sglang/srt/eplb/
lplb_solver.py) gives each copy of a replicated expert a share of that expert's tokens, so that
the largest GPU load is least; each token then draws its copy at random from those shares. The
solver and the draw are CUDA kernels that need a Hopper GPU; SGLang ships pure-torch references of
both (sglang/test/kernels/lplb.py; by its comments the solver's follows the kernel's iterations one
by one, and the draw's gives the kernel's choices for the same random numbers), and this program
runs those on the CPU:
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

Scenarios (--models; seeded):
  deepseek-v3 (synthetic; the scenario of bench_batch_split with numpy's generator): 256 experts,
    top-8, 32 GPUs in 4 nodes of 8, 288 slots; popularity Gamma(0.7) (seed 11), and the plan made
    from it; each batch multiplies every expert's popularity by U(1 - d, 1 + d) (d = 0, 0.25, 0.5;
    seed 1000 + batch).
  olmoe (real marginals: tests/data/olmoe-routing, OLMoE-1B-7B layer 7): 64 experts, top-8, 16 GPUs
    in 2 nodes of 8, 80 slots; the plan from the arxiv counts; batches from arxiv (times the drift
    as above) and from github (a switch of domain).
  mixtral (the same data, Mixtral-8x7B layer 7): 8 experts, top-2, 8 GPUs in one node, 16 slots.
Plans (--plans): eplb.py's (moe_compose.rebalance_experts; DeepSeek-V3 hierarchical with 8 groups,
every expert's copies on one node) and moe_compose's joint planner (nodes under one switch; copies
across nodes). Each rank draws its tokens (top-k distinct experts in proportion to the batch's
popularity) with seed 100000 x batch + 100 + rank. Per batch: the largest pairs any GPU receives
over the mean, the pairs served on their own GPU and those that leave their node; means over the
batches. SGLang's draws are seeded (torch.Generator, seed 7 + batch).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import types

import numpy as np

DATA = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "olmoe-routing"
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


def stand_in_context(expert_location, sc, a2a_backend):
    """What expert_location's functions read from SGLang's runtime context."""
    moe = types.SimpleNamespace(moe_a2a_backend=a2a_backend, ep_join_mode=None)
    parallel = types.SimpleNamespace(ep_size=sc.gpus, nnodes=sc.gpus // sc.per_node)
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


@dataclasses.dataclass
class Scenario:
    name: str
    experts: int
    topk: int
    gpus: int
    per_node: int
    slots: int
    groups: int            # eplb.py's expert groups
    pop: np.ndarray        # the popularity the plan is made from
    switch: np.ndarray = None  # another domain's popularity (real data), the "switch" row

    def drifts(self, arg):
        out = [("none" if d == 0 else f"±{d:.0%}", d, None) for d in (float(x) for x in arg.split(","))]
        if self.switch is not None:
            out.append(("github", 0.0, self.switch))
        return out


def marginal(model, domain, layer=7):
    """An expert's share of the layer's top-k choices in the recorded routing (expert_counts.tsv)."""
    rows = np.loadtxt(DATA / model / domain / "expert_counts.tsv", skiprows=1, dtype=np.int64)
    rows = rows[rows[:, 0] == layer]
    counts = np.zeros(int(rows[:, 1].max()) + 1)
    counts[rows[:, 1]] = rows[:, 2]
    return counts / counts.sum()


def scenario(name):
    if name == "deepseek-v3":
        return Scenario(name, 256, 8, 32, 8, 288, 8, np.random.default_rng(11).gamma(0.7, 1.0, size=256))
    if name == "olmoe":
        return Scenario(name, 64, 8, 16, 8, 80, 1, marginal("olmoe-1b-7b", "arxiv"), marginal("olmoe-1b-7b", "github"))
    if name == "mixtral":
        return Scenario(name, 8, 2, 8, 8, 16, 1, marginal("mixtral-8x7b", "arxiv"), marginal("mixtral-8x7b", "github"))
    sys.exit(f"sglang_lp_dispatch: unknown model '{name}' (deepseek-v3, olmoe, mixtral)")


def draw_batch(rng_seed, weights, tokens, sc):
    """tokens x topk distinct experts per token, drawn in proportion to `weights` without repeats
    (Gumbel top-k: the distribution of drawing again whenever an expert repeats)."""
    rng = np.random.default_rng(rng_seed)
    g = rng.gumbel(size=(tokens, sc.experts)) + np.log(weights / weights.sum())
    return np.argsort(-g, axis=1)[:, :sc.topk].astype(np.int64)


def make_plan(plan, sc, mc):
    """phy2log [slots] of eplb.py's plan or moe_compose's joint plan (the nodes under one switch)."""
    nodes = sc.gpus // sc.per_node
    if plan == "eplb":
        return mc.rebalance_experts(sc.pop[None].astype(np.float32), sc.slots, sc.groups, nodes, sc.gpus)[0][0]
    if plan == "joint":
        j = mc.joint(mc.fat_tree(1, nodes, sc.per_node, 1), sc.pop[None], sc.slots // sc.gpus)
        return mc.slot_map(j["copies"], sc.gpus, sc.pop[None], sc.slots // sc.gpus)[0]
    sys.exit(f"sglang_lp_dispatch: unknown plan '{plan}' (eplb, joint)")


def run_plan(args, sc, plan, torch, expert_location, lplb_solver, reference, mc):
    phy2log = make_plan(plan, sc, mc)
    S = sc.slots // sc.gpus
    node_of_slot = np.arange(sc.slots) // S // sc.per_node
    rank = np.arange(sc.gpus)[:, None, None]
    p2l = torch.tensor(phy2log[None])

    # SGLang's copy lists: all candidates (no a2a backend) and per rank (DeepEP); its static map.
    stand_in_context(expert_location, sc, "none")
    full = expert_location._compute_logical_to_all_physical_map(p2l, sc.experts, sc.gpus, moe_ep_rank=0)[0]
    stand_in_context(expert_location, sc, "deepep")
    per_rank = [expert_location._compute_logical_to_all_physical_map(p2l, sc.experts, sc.gpus, moe_ep_rank=r)[0]
                for r in range(sc.gpus)]
    static = [expert_location.compute_logical_to_rank_dispatch_physical_map(full[None], sc.gpus, sc.slots, ep_rank=r)[0]
              for r in range(sc.gpus)]
    num_valid = (full != -1).sum(dim=1)
    solver = lplb_solver.LPLBSolver(torch.tensor(phy2log), full, sc.gpus, None, num_valid)
    ours = mc.BatchSplit(phy2log, sc.gpus, sc.per_node)

    rows = []
    for label, drift, base in sc.drifts(args.drifts):
        for tokens in [int(t) for t in args.sizes.split(",")]:
            batches = args.batches if tokens < 4096 else max(1, args.batches // 2)
            ratio, remote, own = ({m: [] for m in METHODS} for _ in range(3))
            lp_value = []
            fallbacks = 0
            for b in range(batches):
                now = (sc.pop if base is None else base) * np.random.default_rng(1000 + b).uniform(
                    1 - drift, 1 + drift, size=sc.experts)
                ids = [draw_batch(100000 * b + 100 + r, now, tokens, sc) for r in range(sc.gpus)]
                counts = np.stack([np.bincount(i.ravel(), minlength=sc.experts) for i in ids])
                mean = tokens * sc.topk
                # SGLang's LP: one solve from the all-reduced counts, then each rank's draw
                A, rhs, t1 = prep_inputs(torch, solver, torch.tensor(counts.sum(0), dtype=torch.float32))
                x = reference.solve_ipm_torch_reference(A, rhs, solver.c_vec)
                fallbacks += bool((x == 0.5).all())
                # the LP's own value of the largest GPU load (its variable M, a share of all pairs)
                lp_value.append(float(x[-2]) * counts.sum() / mean)
                gen = torch.Generator().manual_seed(7 + b)
                out = {m: [] for m in METHODS}
                for r in range(sc.gpus):
                    t = torch.tensor(ids[r])
                    u = torch.rand(t.numel(), generator=gen)
                    out["static"].append(static[r][t].numpy())
                    out["lp, no a2a"].append(
                        reference.dispatch_probability_torch_reference(t, shares(torch, solver, x, t1, full), full, u).numpy())
                    out["lp, deepep"].append(reference.dispatch_probability_torch_reference(
                        t, shares(torch, solver, x, t1, per_rank[r]), per_rank[r], u).numpy())
                ours.plan(counts)
                out["BatchSplit"] = [ours.dispatch(r, ids[r]) for r in range(sc.gpus)]
                for m in METHODS:
                    slots = np.stack(out[m])  # gpus x tokens x topk
                    assert (phy2log[slots] == np.stack(ids)).all(), m
                    ratio[m].append(np.bincount((slots // S).ravel(), minlength=sc.gpus).max() / mean)
                    remote[m].append(float((node_of_slot[slots] != rank // sc.per_node).mean()))
                    own[m].append(float((slots // S == rank).mean()))
                worse = [m for m in METHODS if ratio[m][-1] < ratio["BatchSplit"][-1]]
                if args.check and worse:
                    sys.exit(f"sglang_lp_dispatch: {sc.name}, {plan} plan, batch {b} at {tokens} tokens: "
                             f"{', '.join(worse)} loads its busiest GPU less than BatchSplit "
                             f"({ratio['BatchSplit'][-1]:.4f} x the mean), which splits at the least largest load")
            row = {"model": sc.name, "plan": plan, "drift": label, "tokens": tokens, "batches": batches,
                   "ipm_fallbacks": fallbacks, "ipm_value": float(np.mean(lp_value))}
            for m in METHODS:
                row[m] = {"max_over_mean": float(np.mean(ratio[m])), "cross_node": float(np.mean(remote[m])),
                          "own_gpu": float(np.mean(own[m]))}
            rows.append(row)
            print(f"{sc.name} {plan} drift {label} tokens {tokens:5d} ({batches} batches, IPM fallbacks {fallbacks}): " +
                  "; ".join(f"{m} {row[m]['max_over_mean']:.3f} / {row[m]['own_gpu']:.1%} / {row[m]['cross_node']:.1%}"
                            for m in METHODS) + f"; IPM's value {row['ipm_value']:.3f}", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="deepseek-v3,olmoe,mixtral")
    ap.add_argument("--plans", default="eplb,joint")
    ap.add_argument("--batches", type=int, default=20, help="batches per row; at 4096 tokens per rank half")
    ap.add_argument("--sizes", default="16,64,256,4096", help="tokens per rank")
    ap.add_argument("--drifts", default="0,0.25,0.5", help="d of U(1 - d, 1 + d) per expert")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--check", action="store_true",
                    help="a short run (2 batches at 16 and 256 tokens, drift +-50 %%, DeepSeek-V3) that fails "
                         "unless BatchSplit's largest GPU load is at most every SGLang dispatch's on every batch "
                         "(scripts/engine_check.sh)")
    args = ap.parse_args()
    if args.check:
        args.models, args.batches, args.sizes, args.drifts = "deepseek-v3", 2, "16,256", "0.5"
    torch, expert_location, lplb_solver, reference = sglang_modules()
    import moe_compose as mc

    rows = []
    for model in args.models.split(","):
        sc = scenario(model)
        for plan in args.plans.split(","):
            rows += run_plan(args, sc, plan, torch, expert_location, lplb_solver, reference, mc)
    print("\nlargest GPU load / mean (pairs on their own GPU, pairs leaving their node)")
    print("\n| model | plan | drift | tokens/rank | " + " | ".join(METHODS) + " | IPM's value | IPM fallbacks |")
    print("|---|---|---|---:|" + "---:|" * len(METHODS) + "---:|---:|")
    for row in rows:
        print(f"| {row['model']} | {row['plan']} | {row['drift']} | {row['tokens']} | " +
              " | ".join(f"{row[m]['max_over_mean']:.3f} ({row[m]['own_gpu']:.1%}, {row[m]['cross_node']:.1%})"
                         for m in METHODS) + f" | {row['ipm_value']:.3f} | {row['ipm_fallbacks']} / {row['batches']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.check:
        print("sglang_lp_dispatch: BatchSplit's largest GPU load at most SGLang's static and LP dispatches' on every batch")


if __name__ == "__main__":
    main()
