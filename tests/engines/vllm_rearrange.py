#!/usr/bin/env python3
"""vLLM's own expert-weight rearrangement with moe_compose's policy, on 4 gloo processes (CPU).

Installed from the wheels by scripts/engine_check.sh (nothing of vLLM is copied here). For each
scenario (steady state, elastic scale-down 4 -> 3 ranks, scale-up 3 -> 4 ranks) and each policy
(moe_compose.vllm.MoeComposeEplbPolicy, vLLM's DefaultEplbPolicy), the plan is made by the policy
with the arguments vLLM's EplbState.rearrange() passes it (the old map as vLLM holds it: wider on
scale-down, -1 in the new rank's slots on scale-up), then vLLM's rearrange_expert_weights_inplace
moves the weights with its TorchDistGlooStagedEplbCommunicator over a gloo group, with the
rank_mapping vLLM's elastic EP passes. Afterwards every rank's expert weights must equal those of
the planned experts (each weight row encodes its layer and logical expert), and the experts each
rank received (counted at the communicator's add_recv) are summed per policy.

Stubbed, GPU-only: torch.accelerator.current_stream() (the communicator synchronises the device
stream before its gloo send/recv; on a CPU-only torch there is no accelerator, so it returns an
object whose synchronize() does nothing), and the communicator module's PIN_MEMORY flag is set to
False (vLLM sets it when the CUDA toolkit is importable; pinning needs a driver). Nothing else is
replaced.
"""
from __future__ import annotations

import json
import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

L, E, S, HIDDEN = 8, 32, 12, 16  # layers, logical experts, slots per rank, weight row width
GROUPS, NODES = 4, 2             # hierarchical (groups % nodes == 0): the group-to-node rule applies
STEPS = 4                        # drift steps of the steady scenario


def expert_row(layer: int, expert: int, k: int) -> torch.Tensor:
    return torch.full((HIDDEN * (k + 1),), float(layer * 1000 + expert) + 0.25 * k)


def _stub_gpu_only():
    if not torch.cuda.is_available():  # the CUDA build of torch names cuda as its accelerator even without a driver
        class _NoStream:
            def synchronize(self):
                pass
        torch.accelerator.current_stream = lambda *a, **k: _NoStream()
    import vllm.distributed.eplb.eplb_communicator as communicator

    communicator.PIN_MEMORY = False


def worker(rank, world, port, plans, out_dir):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    _stub_gpu_only()
    from vllm.distributed.eplb.eplb_communicator import TorchDistGlooStagedEplbCommunicator
    from vllm.distributed.eplb.rebalance_execute import rearrange_expert_weights_inplace

    group = dist.group.WORLD
    results = []
    for name, steps in plans:
        for old, new, rank_mapping in steps:
            old_t, new_t = torch.tensor(old), torch.tensor(new)
            # The weights this rank holds now: the old map's rows of this rank (garbage where -1 or
            # where the rank is new).
            weights = []
            for layer in range(L):
                per = []
                for k in range(2):
                    w = torch.full((S, HIDDEN * (k + 1)), -1.0)
                    for i in range(S):
                        p = rank * S + i
                        if p < old_t.shape[1] and old_t[layer, p] >= 0:
                            w[i] = expert_row(layer, int(old_t[layer, p]), k)
                    per.append(w)
                weights.append(per)
            buffer = [torch.empty_like(w) for w in weights[0]]
            comm = TorchDistGlooStagedEplbCommunicator(cpu_group=group)
            received = [0]
            add_recv = comm.add_recv

            def counting_recv(tensors, src_rank, expert_id, add_recv=add_recv, received=received):
                received[0] += 1
                return add_recv(tensors, src_rank, expert_id)

            comm.add_recv = counting_recv
            rm = None if rank_mapping is None else {int(a): int(b) for a, b in rank_mapping.items()}
            rearrange_expert_weights_inplace(old_t, new_t, weights, buffer, group, comm, False, rm)
            # The rank's index in the new layout (scale-down: the departing rank holds nothing).
            new_rank = rank if rm is None or len(rm) != world else rm[rank]
            wrong = 0
            if new_rank >= 0 and (new_rank + 1) * S <= new_t.shape[1]:
                for layer in range(L):
                    for i in range(S):
                        e = int(new_t[layer, new_rank * S + i])
                        for k in range(2):
                            wrong += int(not torch.equal(weights[layer][k][i], expert_row(layer, e, k)))
            results.append({"plan": name, "rank": rank, "received": received[0], "wrong_rows": wrong})
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def make_plans():
    from vllm.distributed.eplb.policy.default import DefaultEplbPolicy
    from moe_compose.vllm import MoeComposeEplbPolicy

    rng = np.random.default_rng(34)
    w0 = torch.tensor(rng.gamma(0.7, 100, size=(L, E)), dtype=torch.float32)
    start4 = DefaultEplbPolicy.rebalance_experts(w0, 4 * S, GROUPS, NODES, 4)
    start3 = DefaultEplbPolicy.rebalance_experts(w0, 3 * S, GROUPS, 1, 3)  # 3 ranks: one node
    plans, scattered = [], {}
    for policy in (MoeComposeEplbPolicy, DefaultEplbPolicy):
        tag = "moe_compose" if policy is MoeComposeEplbPolicy else "vllm_default"
        # Steady: STEPS drifts, each from the previous plan, as vLLM's periodic rearrange().
        w, old, steps = w0.clone(), start4, []
        for _ in range(STEPS):
            w = w * torch.tensor(rng.uniform(0.75, 1.25, size=(L, E)), dtype=torch.float32)
            new = policy.rebalance_experts(w, 4 * S, GROUPS, NODES, 4, old)
            steps.append((old.tolist(), new.tolist(), None))
            old = new
        plans.append((f"{tag}/steady", steps))
        scattered[tag] = sum(_scattered(np.asarray(s[1])) for s in steps)
        # Scale-down 4 -> 3 ranks (rank 3 leaves): num_nodes 1 (3 ranks on 2 nodes do not split;
        # vLLM's rearrange() then sets num_nodes = 1), the old map 4 ranks wide.
        w1 = w0 * 1.1
        new = policy.rebalance_experts(w1, 3 * S, GROUPS, 1, 3, start4)
        plans.append((f"{tag}/scale-down", [(start4.tolist(), new.tolist(), {0: 0, 1: 1, 2: 2, 3: -1})]))
        # Scale-up 3 -> 4 ranks: the old map padded with -1 for the new rank's slots
        # (reconfigure_physical_expert_slots), rearranged without a rank mapping.
        padded = torch.cat([start3, torch.full((L, S), -1, dtype=start3.dtype)], dim=1)
        new = policy.rebalance_experts(w1, 4 * S, GROUPS, NODES, 4, padded)
        plans.append((f"{tag}/scale-up", [(padded.tolist(), new.tolist(), None)]))  # elastic_execute: no mapping
    return plans, scattered


def _scattered(phy2log):
    n = 0
    for row in phy2log:
        nodes = [set() for _ in range(GROUPS)]
        for p, e in enumerate(row):
            nodes[e // (E // GROUPS)].add((p // S) // (4 // NODES))
        n += sum(len(s) > 1 for s in nodes)
    return n


def main():
    import tempfile

    plans, scattered = make_plans()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(4, port, plans, d), nprocs=4, join=True)
        rows = []
        for r in range(4):
            rows += json.load(open(os.path.join(d, f"rank{r}.json")))
    summary = {}
    for x in rows:
        s = summary.setdefault(x["plan"], {"received": 0, "wrong_rows": 0})
        s["received"] += x["received"]
        s["wrong_rows"] += x["wrong_rows"]
    ok = True
    print(f"{'plan':28s} {'experts moved':>13s} {'wrong rows':>10s}")
    for name, s in summary.items():
        # Two weight tensors per expert: add_recv is called once per expert with both.
        print(f"{name:28s} {s['received']:13d} {s['wrong_rows']:10d}")
        ok &= s["wrong_rows"] == 0
    print(f"groups on more than one node over the steady steps: moe_compose {scattered['moe_compose']}, "
          f"vllm_default {scattered['vllm_default']}")
    for scen in ("steady", "scale-down", "scale-up"):
        ours, theirs = summary[f"moe_compose/{scen}"]["received"], summary[f"vllm_default/{scen}"]["received"]
        if ours > theirs:
            print(f"FAIL {scen}: moe_compose moved {ours} experts, vLLM's default {theirs}")
            ok = False
    if scattered["moe_compose"] != 0:
        print("FAIL: moe_compose scattered expert groups over nodes")
        ok = False
    print("vLLM rearrangement check:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
