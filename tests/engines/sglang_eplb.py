#!/usr/bin/env python3
"""SGLang's own EPLB entry point against moe_compose.sglang, in the caller's dtype.

Installed from the wheel by scripts/engine_check.sh (nothing of SGLang is copied here). On 53
seeded cases (shapes with and without groups that split over nodes, and five whose packs tie in float32
but not in double; counts [X, layers, experts]),
sglang.srt.eplb.eplb_algorithms.rebalance_experts (the function ExpertLocationMetadata.init_by_eplb
calls) and moe_compose.sglang.rebalance_experts must return identical (phy2log, log2phy, logcnt)
for integer, float32, float16 and bfloat16 counts, with both deepseek algorithms. Then install()
must put ours in SGLang's module, where SGLang looks the function up. No stub is needed.

init_by_eplb itself is not called: it needs SGLang's runtime context (parallel and exec configs)
and a model architecture, which only a running server sets up.
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from sglang.srt.eplb import eplb_algorithms
from sglang.srt.eplb.eplb_algorithms import EplbAlgorithm

import moe_compose.sglang as ours

DTYPES = (torch.int64, torch.float32, torch.float16, torch.bfloat16)


def cases():
    rng = np.random.default_rng(2325)
    out = []
    for i in range(48):
        nodes = int(rng.choice([1, 2, 4]))
        gpus = nodes * int(rng.integers(1, 5))
        groups = int(rng.choice([1, 2, 4, 8]))
        experts = groups * int(rng.integers(2, 9))
        per_gpu = -(-experts // gpus) + int(rng.integers(0, 3))
        if groups % nodes == 0:  # the hierarchical policy needs each node to hold its experts
            per_gpu = max(per_gpu, -(-experts // (gpus)) + 1)
        layers = int(rng.integers(1, 5))
        x = int(rng.integers(1, 4))
        counts = rng.gamma(0.6, 3000.0, size=(x, layers, experts))
        out.append((counts, gpus * per_gpu, per_gpu, groups, nodes))
    # Ties: SGLang's deepseek.py sums the pack weights in Python floats (double), eplb.py in float32;
    # where float32 rounding ties two packs the plans differ, and ours must follow deepseek.py.
    out.append((np.array([[[2.0**24, 2.0**24, 1, 1, 0.75, 0.5]]]), 6, 3, 1, 1))
    for i in range(4):  # wide layers whose bfloat16 and float16 counts round into ties
        out.append((rng.gamma(0.6, 3000.0, size=(2, 3, 120)), 176, 11, 1, 1))
    return out


def main() -> int:
    original = eplb_algorithms.rebalance_experts
    total = same = 0
    mismatches = []
    for i, (counts, phy, local, groups, nodes) in enumerate(cases()):
        for dtype in DTYPES:
            t = torch.tensor(np.rint(counts) if not dtype.is_floating_point else counts).to(dtype)
            if not torch.isfinite(t.float()).all():
                continue  # 2^24 in float16; ours refuses infinite loads by name
            for algo in (EplbAlgorithm.deepseek, EplbAlgorithm.deepseek_hierarchical):
                if algo == EplbAlgorithm.deepseek_hierarchical and groups % nodes:
                    continue
                try:
                    ref = original(t, phy, local, groups, nodes, algo)
                except AssertionError:
                    continue  # a shape SGLang's algorithm refuses
                got = ours.rebalance_experts(t, phy, local, groups, nodes, algo)
                total += 1
                ok = all(torch.equal(torch.as_tensor(a), b) for a, b in zip(got, ref))
                same += ok
                if not ok:
                    mismatches.append((i, str(dtype), algo.name))
    print(f"SGLang EPLB vs moe_compose.sglang: {same} of {total} identical "
          f"(int64, float32, float16, bfloat16 counts; deepseek and deepseek_hierarchical)")
    for m in mismatches[:10]:
        print("  differs:", m)
    ours.install()
    installed = eplb_algorithms.rebalance_experts is ours.rebalance_experts
    print("install(): SGLang's eplb_algorithms.rebalance_experts is moe_compose's:", installed)
    ok = same == total and total > 0 and installed
    print("SGLang EPLB check:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
