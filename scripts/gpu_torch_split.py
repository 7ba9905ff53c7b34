#!/usr/bin/env python3
"""The per-batch split on the GPU from PyTorch: moe_compose.device.DeviceBatchSplit on torch CUDA
tensors, through libmoe_compose_cuda.so (python/src/device_split.cu), checked and timed.

    python3 scripts/gpu_torch_split.py --lib build-gpu/tests/cuda/libmoe_compose_cuda.so --out torch_split.json

Layout (synthetic, seeded): DeepSeek-V3's 256 experts on 32 GPUs of 9 slots (4 servers of 8), the
32 most popular experts (Gamma(0.7) popularity, numpy seed 11) with a second copy, the copies dealt
to the least loaded GPU with room. Per size (16, 256 and 4096 tokens per rank, top-8 experts per
token drawn by popularity, torch seed 1), the 32 ranks' top-k ids on one GPU:
  - checks: each rank's counts equal torch.bincount of its ids; every pair lands in a slot holding
    its expert; the GPUs' received pairs over all ranks' dispatches equal the plan's loads, whose
    maximum is the outcome's max_load; that maximum lies between the mean (rounded up) and the
    busiest GPU when every pair goes to its expert's first copy; rank 0's count, plan and dispatch
    captured in a CUDA graph (torch.cuda.graph, the calls on torch's current stream) and replayed
    give the eager result;
  - times: that graph (count, plan, dispatch of one rank: what a layer adds per batch), replayed 20
    times back to back; the three calls eagerly from Python (their launch cost included), 100 times.
The device code under it is checked bit for bit against the host split by ctest -L cuda
(test_batch_split_cuda); this checks the Python glue on a real device and gives its cost.
Exit status: 0 done, 3 PyTorch, its CUDA device or the library is missing (nothing measured), 1 a
check failed or another error.
"""
import argparse
import importlib.util
import json
import math
import os
import sys

import numpy as np

GPUS, PER_SERVER, SLOTS_PER_GPU, EXPERTS, TOP_K = 32, 8, 9, 256, 8


def layout():
    rng = np.random.default_rng(11)
    pop = rng.gamma(0.7, 1.0, EXPERTS)
    extra = GPUS * SLOTS_PER_GPU - EXPERTS
    copies = np.ones(EXPERTS, dtype=int)
    copies[np.argsort(-pop, kind="stable")[:extra]] += 1
    load = np.zeros(GPUS)
    held = [[] for _ in range(GPUS)]
    items = sorted(((pop[e] / copies[e], e) for e in range(EXPERTS) for _ in range(copies[e])), reverse=True)
    for w, e in items:
        g = min((g for g in range(GPUS) if len(held[g]) < SLOTS_PER_GPU and e not in held[g]), key=lambda g: load[g])
        held[g].append(e)
        load[g] += w
    return np.array([e for g in range(GPUS) for e in held[g]], dtype=np.int64), pop


def load_device_module(root):
    spec = importlib.util.spec_from_file_location("moe_compose_device", os.path.join(root, "python", "moe_compose",
                                                                                       "device.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="libmoe_compose_cuda.so (target moe_compose_cuda)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        import torch
    except ImportError as exc:
        print(f"gpu_torch_split: PyTorch not importable ({exc}); nothing measured", flush=True)
        return 3
    if not torch.cuda.is_available():
        print(f"gpu_torch_split: torch {torch.__version__} sees no CUDA device; nothing measured", flush=True)
        return 3
    if not os.path.exists(args.lib):
        print(f"gpu_torch_split: no library at {args.lib}; nothing measured", flush=True)
        return 3
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dev = load_device_module(root)
    phy2log, pop = layout()
    cuda = torch.device("cuda")
    table = torch.from_numpy(phy2log).to(cuda)
    first_gpu = torch.empty(EXPERTS, dtype=torch.int64)
    for p in range(phy2log.size - 1, -1, -1):
        first_gpu[int(phy2log[p])] = p // SLOTS_PER_GPU
    first_gpu = first_gpu.to(cuda)
    popularity = torch.from_numpy(pop).to(cuda)
    torch.manual_seed(1)
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": []}
    ok = True
    for tokens in (16, 256, 4096):
        ids = [torch.multinomial(popularity.expand(tokens, EXPERTS), TOP_K).to(torch.int32) for _ in range(GPUS)]
        split = dev.DeviceBatchSplit(phy2log, GPUS, PER_SERVER, tokens * TOP_K, library=args.lib)
        counts = torch.full((GPUS, EXPERTS), -1, dtype=torch.int32, device=cuda)
        load = torch.zeros(GPUS, dtype=torch.int64, device=cuda)
        outcome = torch.zeros(4, dtype=torch.int64, device=cuda)
        phys = [torch.full_like(i, -9) for i in ids]
        for r in range(GPUS):
            split.count(ids[r], counts[r])
        split.plan(counts, load, outcome)
        for r in range(GPUS):
            split.dispatch(r, ids[r], phys[r])
        torch.cuda.synchronize()
        problems = []
        for r in range(GPUS):
            if not torch.equal(counts[r].long(), torch.bincount(ids[r].flatten().long(), minlength=EXPERTS)):
                problems.append(f"rank {r}: counts differ from torch.bincount")
            if not torch.equal(table[phys[r].long()], ids[r].long()):
                problems.append(f"rank {r}: a pair in a slot that does not hold its expert")
        received = torch.bincount(torch.cat([p.flatten() for p in phys]).long() // SLOTS_PER_GPU, minlength=GPUS)
        fixed = torch.bincount(torch.cat([first_gpu[i.flatten().long()] for i in ids]), minlength=GPUS)
        o = outcome.tolist()
        total = GPUS * tokens * TOP_K
        if not torch.equal(received, load):
            problems.append("the GPUs' received pairs differ from the plan's loads")
        if o[3] != 0 or o[0] != int(load.max()):
            problems.append(f"outcome {o} does not match the loads' maximum {int(load.max())}")
        if not math.ceil(total / GPUS) <= o[0] <= int(fixed.max()):
            problems.append(f"max load {o[0]} outside [{math.ceil(total / GPUS)}, {int(fixed.max())}]")
        # rank 0's three calls in a CUDA graph, on torch's capture stream
        eager = phys[0].clone()
        row0, out0 = torch.empty(EXPERTS, dtype=torch.int32, device=cuda), torch.full_like(ids[0], -9)
        graph_counts = counts.clone()
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch asks before a capture
            split.count(ids[0], row0)
        torch.cuda.current_stream().wait_stream(side)
        reps = 20
        with torch.cuda.graph(graph):
            for _ in range(reps):
                split.count(ids[0], graph_counts[0])
                split.plan(graph_counts)
                split.dispatch(0, ids[0], out0)
        graph.replay()
        torch.cuda.synchronize()
        if not torch.equal(out0, eager):
            problems.append("the graph's replay differs from the eager dispatch")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        for _ in range(5):
            graph.replay()
        end.record()
        end.synchronize()
        graph_us = start.elapsed_time(end) * 1e3 / (5 * reps)
        for _ in range(10):
            split.count(ids[0], counts[0]), split.plan(counts), split.dispatch(0, ids[0], out0)
        start.record()
        for _ in range(100):
            split.count(ids[0], counts[0])
            split.plan(counts)
            split.dispatch(0, ids[0], out0)
        end.record()
        end.synchronize()
        eager_us = start.elapsed_time(end) * 1e3 / 100
        row = {"tokens": tokens, "pairs_per_rank": tokens * TOP_K, "graph_us": round(graph_us, 2),
               "eager_us": round(eager_us, 2), "max_load": o[0], "mean_load": total / GPUS,
               "first_copy_max": int(fixed.max()), "local": o[1], "same_server": o[2],
               "checks": "ok" if not problems else "; ".join(problems)}
        out["rows"].append(row)
        print(row, flush=True)
        ok &= not problems
        split.close()
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, args.out)
    if not ok:
        print("gpu_torch_split: a check failed (rows above)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
