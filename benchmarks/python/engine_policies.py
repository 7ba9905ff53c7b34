#!/usr/bin/env python3
"""moe_compose's rebalancing against the engines' own EPLB policies (docs/engines.md, issue 27).

  python3 benchmarks/python/engine_policies.py drift [--snapshots 24]   moves and balance
  python3 benchmarks/python/engine_policies.py speed [--repeats 30]     time per call, one core

The engines' policies are loaded by file path from their PyPI wheels (vllm==0.33.0,
sglang==0.5.23; pass the .whl files or install them with `pip install --no-deps`), without importing
the rest of the engine: vLLM's vllm/distributed/eplb/policy/{abstract,default}.py and SGLang's
sglang/srt/eplb/eplb_algorithms/deepseek.py need only numpy and torch.

drift: a sequence of load snapshots, each policy rebalancing from its own previous layout:
  DeepSeek-V3: 58 layers x 256 experts -> 288 slots on 32 GPUs in 4 nodes (8 groups); loads start
    Gamma(0.7)-distributed and every snapshot multiplies each expert's load by U(0.75, 1.25).
  OLMoE-1B-7B: the real routing counts of tests/data/olmoe-routing (layers 0, 7, 15; 64 experts)
    -> 72 slots on 8 GPUs in 2 nodes; snapshot t draws 4096 tokens x top-8 (seeded) from a mixture
    of the four domains that drifts arxiv -> book -> c4 -> github -> arxiv.
  Per rebalance: slots whose GPU had no copy of their new expert (copies from another GPU), the
  largest GPU load / mean (mean over layers, and relative to EPLB from scratch), and the modelled
  transfer time (moe_compose.transfer_time: nodes of 8 / 4 GPUs under one switch, H100 links;
  expert sizes: DeepSeek-V3 FP8 44 MB, OLMoE BF16 12.6 MB). Sources are chosen for every policy by
  the same rule (a GPU that held the expert, same node first, then the least busy sender).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import statistics
import sys
import tempfile
import time
import types
import zipfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _member(source: str | None, package: str, member: str, tmp: pathlib.Path) -> pathlib.Path:
    """A file of an engine's package: from a wheel (.whl), a folder, or the installed package."""
    if source and source.endswith(".whl"):
        with zipfile.ZipFile(source) as z:
            z.extract(member, tmp)
        return tmp / member
    if source:
        return pathlib.Path(source) / member
    spec = importlib.util.find_spec(package)  # top-level: finds the folder without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{package} not found: pass its wheel (--{package}-wheel) or pip install --no-deps it")
    return pathlib.Path(list(spec.submodule_search_locations)[0]).parent / member


def _load(name: str, path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_engine_policies(vllm_wheel: str | None, sglang_wheel: str | None):
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="moe_engine_policies_"))
    base = "vllm/distributed/eplb/policy/"
    abstract = _member(vllm_wheel, "vllm", base + "abstract.py", tmp)
    default = _member(vllm_wheel, "vllm", base + "default.py", tmp)
    pkg = types.ModuleType("vllm_eplb_policy")  # a stand-in package for default.py's relative import
    pkg.__path__ = [str(abstract.parent)]
    sys.modules["vllm_eplb_policy"] = pkg
    _load("vllm_eplb_policy.abstract", abstract)
    vllm_default = _load("vllm_eplb_policy.default", default).DefaultEplbPolicy
    sglang_deepseek = _load("sglang_deepseek", _member(sglang_wheel, "sglang",
                                                        "sglang/srt/eplb/eplb_algorithms/deepseek.py", tmp))
    return vllm_default, sglang_deepseek


# ---------------------------------------------------------------------------------------------
# Metrics, computed here independently of the library.

def gpu_loads(w: np.ndarray, phy2log: np.ndarray, gpus: int) -> np.ndarray:
    L, P = phy2log.shape
    E = w.shape[1]
    cnt = np.stack([np.bincount(phy2log[l], minlength=E) for l in range(L)])
    per_slot = np.take_along_axis(w.astype(np.float64) / cnt, phy2log, axis=1)
    return per_slot.reshape(L, gpus, P // gpus).sum(axis=2)


def copies_needed(old: np.ndarray, new: np.ndarray, gpus: int, experts: int) -> np.ndarray:
    """Per layer: slots whose GPU held no copy of their new expert."""
    L, P = old.shape
    S = P // gpus
    had = np.zeros((L, gpus, experts), dtype=bool)
    lay = np.repeat(np.arange(L), P)
    had[lay, np.tile(np.arange(P) // S, L), old.ravel()] = True
    need = ~had[lay, np.tile(np.arange(P) // S, L), new.ravel()]
    return need.reshape(L, P).sum(axis=1)


def transfers_for(old: np.ndarray, new: np.ndarray, gpus: int, nodes: int) -> np.ndarray:
    """The transfer list of a layout change, by the rule migration.hpp uses for its own."""
    L, P = old.shape
    S, per_node = P // gpus, gpus // nodes
    rows = []
    for l in range(L):
        held = [set(old[l, g * S:(g + 1) * S].tolist()) for g in range(gpus)]
        holders = {}
        for g in range(gpus):
            for e in held[g]:
                holders.setdefault(e, []).append(g)
        sends = [0] * gpus
        for p in range(P):
            g, e = p // S, int(new[l, p])
            if e in held[g]:
                continue
            src = min(holders[e], key=lambda c: (c // per_node != g // per_node, sends[c], c))
            sends[src] += 1
            rows.append((l, p, e, src, g))
    return np.array(rows, dtype=np.int64).reshape(-1, 5)


# ---------------------------------------------------------------------------------------------
def scattered_groups(phy2log: np.ndarray, experts: int, groups: int, nodes: int, gpus: int) -> int:
    """(layer, group) pairs whose experts' slots sit on more than one node (GPU g on node
    g // (gpus / nodes)): EPLB's hierarchical policy keeps each at one node."""
    L, P = phy2log.shape
    node = (np.arange(P) // (P // gpus)) // (gpus // nodes)
    group = phy2log // (experts // groups)
    n = 0
    for l in range(L):
        for k in range(groups):
            n += len(set(node[group[l] == k].tolist())) > 1
    return n


# Scenarios.

def deepseek_snapshots(n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    w = rng.gamma(0.7, 1000.0, size=(58, 256))
    out = [w.astype(np.float32)]
    for _ in range(n):
        w = w * rng.uniform(0.75, 1.25, size=w.shape)
        out.append(w.astype(np.float32))
    return out


def olmoe_snapshots(n: int, seed: int = 2):
    base = ROOT / "tests" / "data" / "olmoe-routing" / "olmoe-1b-7b"
    domains = ["arxiv", "book", "c4", "github"]
    marg = []
    for d in domains:
        rows = np.loadtxt(base / d / "expert_counts.tsv", skiprows=1, dtype=np.int64)
        layers = sorted(set(rows[:, 0].tolist()))
        m = np.zeros((len(layers), 64))
        for lay, e, c in rows:
            m[layers.index(lay), e] = c
        marg.append(m / m.sum(axis=1, keepdims=True))
    rng = np.random.default_rng(seed)
    out = []
    for t in range(n + 1):
        x = 4.0 * t / (n + 1)  # position along arxiv -> book -> c4 -> github -> arxiv
        i, f = int(x) % 4, x - int(x)
        mix = (1 - f) * marg[i] + f * marg[(i + 1) % 4]
        # 4096 tokens x top-8 per layer (multinomial draws from the mixture's marginals)
        out.append(np.stack([rng.multinomial(4096 * 8, mix[l] / mix[l].sum()) for l in range(mix.shape[0])]).astype(np.float32))
    return out


SCENARIOS = {
    "DeepSeek-V3": dict(snapshots=deepseek_snapshots, slots=288, groups=8, nodes=4, gpus=32, expert_bytes=3 * 7168 * 2048 * 1.0),
    "OLMoE-1B-7B": dict(snapshots=olmoe_snapshots, slots=72, groups=1, nodes=2, gpus=8, expert_bytes=3 * 2048 * 1024 * 2.0),
}


def drift(args):
    import torch

    import moe_compose as mc

    vllm_default, _ = load_engine_policies(args.vllm_wheel, args.sglang_wheel)
    print(f"# drift: {args.snapshots} rebalances per scenario; vLLM policy {vllm_default.__module__}")
    print("| model | policy | copies from another GPU per rebalance (% of slots) | max GPU load / mean | "
          "max load vs EPLB (mean, worst layer) | modelled transfer time per rebalance | "
          "groups on more than one node (per rebalance, of layers x groups) |")
    print("|---|---|---|---|---|---|---|")
    for name, sc in SCENARIOS.items():
        snaps = sc["snapshots"](args.snapshots)
        P, groups, nodes, G = sc["slots"], sc["groups"], sc["nodes"], sc["gpus"]
        E = snaps[0].shape[1]
        topo = mc.node_topology(G, nodes)
        start = mc.rebalance_experts(snaps[0], P, groups, nodes, G)[0]

        def eplb(w, old):
            return mc.rebalance_experts(w, P, groups, nodes, G)[0]

        def vllm(w, old):
            return vllm_default.rebalance_experts(torch.from_numpy(w), P, groups, nodes, G, torch.from_numpy(old)).numpy()

        def ours(tol):
            return lambda w, old: mc.rebalance(w, old, G, num_groups=groups, num_nodes=nodes, tolerance=tol).phy2log

        policies = [("EPLB from scratch", eplb), ("vLLM 0.33 DefaultEplbPolicy (old placement)", vllm),
                    ("moe_compose.rebalance, tolerance 0.01", ours(0.01)), ("moe_compose.rebalance, tolerance 0.05", ours(0.05))]
        for pname, fn in policies:
            cur = start.copy()
            moves, ratio, vs, worst, secs, split = [], [], [], [], [], []
            for w in snaps[1:]:
                new = np.asarray(fn(w, cur), dtype=np.int64)
                ref = mc.rebalance_experts(w, P, groups, nodes, G)[0]
                loads, ref_loads = gpu_loads(w, new, G), gpu_loads(w, ref, G)
                mean = w.astype(np.float64).sum(axis=1) / G
                moves.append(int(copies_needed(cur, new, G, E).sum()))
                ratio.append(float((loads.max(axis=1) / mean).mean()))
                rel = loads.max(axis=1) / ref_loads.max(axis=1)
                vs.append(float(rel.mean()))
                worst.append(float(rel.max()))
                secs.append(mc.transfer_time(topo, transfers_for(cur, new, G, nodes), new.shape[0], sc["expert_bytes"])["seconds"])
                split.append(scattered_groups(new, E, groups, nodes, G))
                cur = new
            m = statistics.mean(moves)
            print(f"| {name} | {pname} | {m:,.0f} ({100 * m / cur.size:.1f}%) | {statistics.mean(ratio):.4f} | "
                  f"{statistics.mean(vs):.4f}, {max(worst):.4f} | {1e3 * statistics.mean(secs):.1f} ms | "
                  + (f"{statistics.mean(split):.1f} of {new.shape[0] * groups} |" if groups % nodes == 0 and nodes > 1
                     else "n/a (EPLB's global policy) |"))
        sys.stdout.flush()


def speed(args):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    import torch

    torch.set_num_threads(1)
    import moe_compose as mc
    from moe_compose.sglang import rebalance_experts as mc_sglang
    from moe_compose.vllm import MoeComposeEplbPolicy

    vllm_default, sglang_deepseek = load_engine_policies(args.vllm_wheel, args.sglang_wheel)
    L, E, P, G, N, groups = 58, 256, 288, 32, 4, 8
    rng = np.random.default_rng(3)
    w0 = torch.from_numpy(rng.gamma(0.7, 1000.0, size=(L, E)).astype(np.float32))
    w1 = w0 * torch.from_numpy(rng.uniform(0.75, 1.25, size=(L, E)).astype(np.float32))
    old = MoeComposeEplbPolicy.rebalance_experts(w0, P, groups, N, G)
    tokens = w1[None].to(torch.int64)  # SGLang's tokens_per_expert [X, layers, experts]
    cases = [
        ("moe_compose.vllm policy, no old placement (EPLB)", lambda: MoeComposeEplbPolicy.rebalance_experts(w1, P, groups, N, G)),
        ("moe_compose.vllm policy, with old placement (minimal moves)",
         lambda: MoeComposeEplbPolicy.rebalance_experts(w1, P, groups, N, G, old)),
        ("moe_compose.sglang rebalance_experts (deepseek_hierarchical)",
         lambda: mc_sglang(tokens, P, P // G, groups, N, "deepseek_hierarchical")),
        ("vLLM 0.33 DefaultEplbPolicy, no old placement", lambda: vllm_default.rebalance_experts(w1, P, groups, N, G)),
        ("vLLM 0.33 DefaultEplbPolicy, with old placement", lambda: vllm_default.rebalance_experts(w1, P, groups, N, G, old)),
        ("SGLang 0.5.23 deepseek (hierarchical; eplb.py)",
         lambda: sglang_deepseek.rebalance_experts(tokens.sum(dim=0), P, groups, N, G, True)),
    ]
    print(f"# speed: DeepSeek-V3, {L} layers x {E} experts -> {P} slots on {G} GPUs in {N} nodes; torch inputs, "
          f"outputs as each returns them; one core (affinity {sorted(os.sched_getaffinity(0))}, torch threads 1); "
          f"median of {args.repeats}; load average {os.getloadavg()[0]:.1f}")
    print("| policy | wall ms (median) | CPU ms (median) | min wall ms |")
    print("|---|---|---|---|")
    for name, fn in cases:
        fn()
        reps = args.repeats if "moe_compose" in name else max(3, args.repeats // 5)
        wall, cpu = [], []
        for _ in range(reps):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        print(f"| {name} | {1e3 * statistics.median(wall):.2f} | {1e3 * statistics.median(cpu):.2f} | {1e3 * min(wall):.2f} |")
        sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["drift", "speed"])
    ap.add_argument("--vllm-wheel", help="vllm-0.33.0-*.whl (default: the installed vllm package's files)")
    ap.add_argument("--sglang-wheel", help="sglang-0.5.23-*.whl (default: the installed sglang package's files)")
    ap.add_argument("--snapshots", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    (drift if args.what == "drift" else speed)(args)


if __name__ == "__main__":
    main()
