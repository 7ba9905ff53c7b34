"""moe_compose: moe-compose's planners for Python (C++ headers under include/moe, bound with nanobind).

EPLB identical to DeepSeek's eplb.py, rebalancing that moves the fewest expert weights (with the
transfer list and its modelled time), CRAFT, ILPLoad, the joint planner, the per-batch replica
split (BatchSplit), topologies, the traffic model, and the engines' statistics importers and plan
writers. Arrays in: numpy arrays, torch tensors (CPU, without copies where the dtype fits) or
anything with the array protocol; arrays out: numpy. Errors raise MoeError (a ValueError) with the
library's message, or TypeError for a wrong dtype. Planners run with the GIL released. Drop-in policies: moe_compose.vllm, moe_compose.sglang.
The per-batch split on the GPU, on torch CUDA tensors: moe_compose.device (a library built with nvcc).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import _arrays
from ._core import (
    MoeError,
    Topology,
    dragonfly,
    dragonfly_sparse,
    fat_tree,
    fat_tree_sparse,
    paper_cluster,
    read_topology,
)
from . import _core

__all__ = [
    "MoeError", "Topology", "fat_tree", "fat_tree_sparse", "dragonfly", "dragonfly_sparse", "read_topology",
    "paper_cluster", "rebalance_experts", "eplb", "rebalance", "Rebalance", "transfer_time", "evaluate_plan",
    "craft", "ilp_load", "joint", "slot_map", "import_sglang_stat", "import_trtllm_stat",
    "import_vllm_routed_experts", "write_engine_plan", "read_engine_plan", "node_topology", "expert_bytes",
    "BatchSplit",
]


def rebalance_experts(weight, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int):
    """eplb.py's rebalance_experts: weight [layers, experts] -> (phy2log [layers, num_replicas],
    log2phy [layers, experts, max copies] (-1 padded), logcnt [layers, experts]), int64 numpy arrays,
    identical to eplb.py under torch (the hierarchical policy when num_groups % num_nodes == 0)."""
    w = _arrays.loads(weight, "weight")
    return _core.eplb(w, _arrays.count(num_replicas, "num_replicas"), _arrays.count(num_groups, "num_groups"),
                      _arrays.count(num_nodes, "num_nodes"), _arrays.count(num_gpus, "num_gpus"))


def eplb(weight, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int,
         hierarchical: Optional[bool] = None):
    """EPLB with the policy chosen explicitly (hierarchical=True/False) or as eplb.py does (None)."""
    w = _arrays.loads(weight, "weight")
    return _core.eplb(w, _arrays.count(num_replicas, "num_replicas"), _arrays.count(num_groups, "num_groups"),
                      _arrays.count(num_nodes, "num_nodes"), _arrays.count(num_gpus, "num_gpus"), hierarchical)


@dataclass
class Rebalance:
    """A minimal-move rebalance (moe/replication/migration.hpp).

    phy2log, log2phy, logcnt: the new layout, as eplb.py's outputs.
    transfers: [N, 5] int64 rows (layer, slot, expert, src_gpu, dst_gpu), one per slot whose GPU had
    no copy of its new expert. copies: per layer, len(transfers of the layer). max_load,
    eplb_max_load, old_max_load, mean_load: per layer GPU loads (new layout, EPLB from scratch, the
    old layout under the new loads, mean). fallback: per layer, 1 where the layout is EPLB's,
    relabelled to the old GPUs. scattered_groups: per layer, expert groups with copies on more than
    one node (0 wherever group_rule holds). group_rule: True when EPLB would use its hierarchical
    policy (num_groups % num_nodes == 0, more than one node) and every group was kept on one node;
    False when that rule does not apply (EPLB's global policy, as eplb.py falls back). old_gpus: GPUs
    of the old placement (more than num_gpus after a scale-down: transfer sources may be >= num_gpus)."""

    phy2log: np.ndarray
    log2phy: np.ndarray
    logcnt: np.ndarray
    transfers: np.ndarray
    copies: np.ndarray
    max_load: np.ndarray
    eplb_max_load: np.ndarray
    old_max_load: np.ndarray
    mean_load: np.ndarray
    fallback: np.ndarray
    steps: np.ndarray
    scattered_groups: np.ndarray
    group_rule: bool
    old_gpus: int
    num_gpus: int

    def transfer_time(self, topology: Topology, expert_bytes: float) -> dict:
        """Modelled duration of the transfers on `topology` (see transfer_time)."""
        return transfer_time(topology, self.transfers, self.phy2log.shape[0], expert_bytes)


def rebalance(weight, old_phy2log, num_gpus: int, *, num_groups: int = 1, num_nodes: int = 1,
              tolerance: float = 0.01, max_copies_per_layer: Optional[int] = None,
              candidate_gpus: int = 3, hot_experts: int = 2, num_replicas: Optional[int] = None) -> Rebalance:
    """Rebalance keeping experts where they are: new loads weight [layers, experts] and the current
    layout old_phy2log [layers, old slots] (slot p on GPU p // S, S = num_replicas / num_gpus). The
    largest GPU load stays within (1 + tolerance) x EPLB's from scratch (num_groups, num_nodes as for
    EPLB, whose group-to-node rule is kept when it applies); a larger tolerance, or
    max_copies_per_layer, trades balance for fewer copies. The cap bounds the search's copies; those the
    layout needs first (the group-to-node rule, elastic re-homing and filling) can exceed it on their
    own, and Rebalance.copies counts them all.

    Elastic expert parallelism (as vLLM passes it): num_replicas (default: the old width) below the
    old width means GPUs num_gpus.. of the old layout leave (their experts are re-homed); -1 entries
    are empty slots (a new GPU's), filled with copies."""
    w = _arrays.loads(weight, "weight")
    old = _arrays.indices(old_phy2log, "old_phy2log")
    if old.shape[0] != w.shape[0]:
        raise ValueError(f"old_phy2log has {old.shape[0]} layers, weight has {w.shape[0]}")
    tol = float(tolerance)
    if not np.isfinite(tol) or tol < 0:
        raise ValueError(f"tolerance must be >= 0 and finite, got {tolerance!r}")
    cap = -1 if max_copies_per_layer is None else int(max_copies_per_layer)
    if max_copies_per_layer is not None and cap < 0:
        raise ValueError(f"max_copies_per_layer must be >= 0, got {max_copies_per_layer}")
    reps = 0 if num_replicas is None else _arrays.count(num_replicas, "num_replicas")
    d = _core.rebalance(w, old, _arrays.count(num_gpus, "num_gpus"), tol, cap, _arrays.count(num_groups, "num_groups"),
                        _arrays.count(num_nodes, "num_nodes"), _arrays.count(candidate_gpus, "candidate_gpus"),
                        _arrays.count(hot_experts, "hot_experts"), reps)
    return Rebalance(num_gpus=int(num_gpus), **d)


def node_topology(num_gpus: int, num_nodes: int) -> Topology:
    """num_nodes servers of num_gpus / num_nodes GPUs under one switch (the default cluster of a rebalance)."""
    g, n = _arrays.count(num_gpus, "num_gpus"), _arrays.count(num_nodes, "num_nodes")
    if g % n:
        raise ValueError(f"{g} GPUs do not split over {n} nodes")
    return fat_tree(1, n, g // n, 1)


def expert_bytes(hidden: int = 7168, expert_ffn: int = 2048, bytes_per_param: float = 1.0) -> float:
    """Bytes of one expert's weights (gate, up and down projections): 3 x hidden x ffn x bytes per
    parameter (DeepSeek-V3 in FP8 by default: 44 MB)."""
    return 3.0 * hidden * expert_ffn * bytes_per_param


def transfer_time(topology: Topology, transfers, layers: int, expert_bytes: float) -> dict:
    """Modelled time of a transfer list ([N, 5]: layer, slot, expert, src, dst, sorted by layer) on a
    topology with the link-level traffic model: per layer the busiest directed link's bytes over its
    bandwidth plus the largest path latency; layers one after another. Returns seconds,
    layer_seconds, bytes, inter_node_bytes."""
    t = _arrays.indices(transfers, "transfers")
    if t.shape[0] == 0:
        t = np.zeros((0, 5), dtype=np.int64)
    return _core.transfer_time(topology, t, _arrays.count(layers, "layers"), float(expert_bytes))


def evaluate_plan(topology: Topology, phy2log, loads, hidden: int = 7168, bytes_per_element: float = 2.0) -> dict:
    """The traffic model's evaluation of a slot layout per layer: tokens from every GPU, each expert's
    load split over its slots; dispatch_time, combine_time, hop_bytes, max_gpu_load, mean_gpu_load."""
    p = _arrays.indices(phy2log, "phy2log")
    ld = _finite(_arrays.loads(loads, "loads", dtype=np.float64), "loads")
    if ld.shape[0] != p.shape[0]:
        raise ValueError(f"loads has {ld.shape[0]} layers, phy2log {p.shape[0]}")
    if p.size and p.max() >= ld.shape[1]:
        raise ValueError(f"loads has {ld.shape[1]} experts per layer, but phy2log names expert {int(p.max())}: "
                         f"loads must be [layers, experts]")
    return _core.evaluate_plan(topology, p, ld, _arrays.count(hidden, "hidden"), float(bytes_per_element))


def _finite(a: np.ndarray, name: str) -> np.ndarray:
    """a, after checking every entry is finite and >= 0; the first bad one is named by its position
    ((layer, expert) for [layers, experts]; (batch, layer, expert) for profiles)."""
    bad = ~np.isfinite(a) | (a < 0)
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        names = ("layer", "expert") if a.ndim == 2 else ("batch", "layer", "expert")
        where = ", ".join(f"{n} {i}" for n, i in zip(names, pos))
        raise ValueError(f"{name}: {where} is {a[pos]}; loads must be finite and >= 0")
    return a


def craft(loads, gpus: int, replication_factor: int = 0, threads: int = 1) -> dict:
    """CRAFT replication on a load profile [batches, layers, experts] (a 2-D array is one batch)."""
    a = _arrays._numpy(loads, "loads")
    if getattr(a, "ndim", 0) == 2:
        a = a[None]
    return _core.craft(_finite(_arrays.loads(a, "loads", ndim=3, dtype=np.float64), "loads"), _arrays.count(gpus, "gpus"),
                       int(replication_factor), int(threads))


def ilp_load(topology: Topology, loads, c_layer: int = 0, c_exp: int = 0) -> dict:
    """ILPLoad placement (exact, as a min-cost flow) of loads [layers, experts] on a topology."""
    c_layer, c_exp = _arrays.integer(c_layer, "c_layer"), _arrays.integer(c_exp, "c_exp")
    if c_layer < 0 or c_exp < 0:
        raise ValueError(f"c_layer and c_exp must be >= 0 (0: moe_plan's defaults), got c_layer={c_layer}, c_exp={c_exp}")
    return _core.ilp_load(topology, _finite(_arrays.loads(loads, "loads", dtype=np.float64), "loads"), c_layer, c_exp)


def joint(topology: Topology, loads, slots_per_gpu: int = 0, eps: float = 0.05) -> dict:
    """The joint planner (replica counts, placement, routing) on loads [layers, experts]."""
    return _core.joint(topology, _finite(_arrays.loads(loads, "loads", dtype=np.float64), "loads"), int(slots_per_gpu),
                       float(eps))


def slot_map(copies, gpus: int, loads, slots_per_gpu: int = 0) -> np.ndarray:
    """Engine slots (phy2log) from per-layer, per-expert GPU lists (as craft/joint return them)."""
    return _core.slot_map(copies, _arrays.count(gpus, "gpus"), int(slots_per_gpu),
                          _finite(_arrays.loads(loads, "loads", dtype=np.float64), "loads"))


def import_sglang_stat(path, experts: int = 0) -> dict:
    return _core.import_sglang_stat(str(path), int(experts))


def import_trtllm_stat(directory, experts: int = 0) -> dict:
    return _core.import_trtllm_stat(str(directory), int(experts))


def import_vllm_routed_experts(path, experts: int) -> dict:
    return _core.import_vllm_routed_experts(str(path), _arrays.count(experts, "experts"))


def write_engine_plan(format: str, path, phy2log, num_gpus: int, experts: int, hidden_layers: int = 0,
                      first_moe: int = 0) -> None:
    """Writes phy2log [moe layers, P] as `format` (sglang, trtllm, vllm, vllm-ascend; docs/engines.md)."""
    _core.write_engine_plan(format, str(path), _arrays.indices(phy2log, "phy2log"), _arrays.count(num_gpus, "num_gpus"),
                            _arrays.count(experts, "experts"), int(hidden_layers), int(first_moe))


def read_engine_plan(format: str, path, num_gpus: int, experts: int, hidden_layers: int, first_moe: int = 0) -> np.ndarray:
    return _core.read_engine_plan(format, str(path), int(num_gpus), int(experts), int(hidden_layers), int(first_moe))


class BatchSplit:
    """The per-batch replica split of one MoE layer (moe/replication/batch_split.hpp) over an engine's
    slots: each batch's pairs of an expert are split over its copies so that the most pairs any GPU
    receives is the least possible (the LP optimum rounded up); among such splits pairs stay on their
    own GPU, then on their own server (gpus_per_server GPUs), before crossing the network. Integer
    and deterministic: every rank computes the same split from the same counts.

    phy2log [P]: the expert of each slot, slot p on GPU p // (P / num_gpus) (one layer of SGLang's
    physical_to_logical_map or vLLM's; experts are 0 .. max(phy2log)). Two slots of one expert on one
    GPU serve as one copy, the first of them receiving its pairs. slack_permille > 0 lets the
    tie-breaks load a GPU up to that many thousandths over the mean load, to keep more pairs off
    the network (split::Layout::slack_permille).

        split = BatchSplit(phy2log, num_gpus=32, gpus_per_server=8)
        out = split.plan(counts)            # counts [num_gpus, experts]: every rank's pairs per expert
        slots = split.dispatch(r, topk_ids) # rank r's [tokens, k] logical ids -> physical slot ids

    plan() returns max_load, local (pairs on their own GPU), same_server (on their own server, local
    included) and load [num_gpus] (pairs each GPU receives). dispatch() deals rank r's pairs of each
    expert over the split in token order; topk_ids must hold exactly the pairs counts[r] gave plan()
    (-1 entries, no expert, stay -1). Counts that plan() refuses leave the last plan in force. Unlike
    the planners, plan() holds the GIL (a split takes microseconds): share one object between
    threads only with a lock."""

    def __init__(self, phy2log, num_gpus: int, gpus_per_server: int, slack_permille: int = 0):
        p = _arrays.indices(phy2log, "phy2log", ndim=1)
        self._s = _core.SlotSplit(p, _arrays.count(num_gpus, "num_gpus"), _arrays.count(gpus_per_server, "gpus_per_server"),
                                  _arrays.integer(slack_permille, "slack_permille"))

    @property
    def num_gpus(self) -> int:
        return self._s.num_gpus

    @property
    def experts(self) -> int:
        return self._s.experts

    def plan(self, counts) -> dict:
        """Splits the batch of counts [num_gpus, experts] (pairs per source rank and expert)."""
        return self._s.plan(_arrays.indices(counts, "counts"))

    def dispatch(self, rank: int, topk_ids) -> np.ndarray:
        """Physical slot ids for rank `rank`'s topk_ids [tokens, k] under the last plan()."""
        return self._s.dispatch(_arrays.integer(rank, "rank"), _arrays.indices(topk_ids, "topk_ids"))

    def counts(self, topk_ids) -> np.ndarray:
        """One rank's row of counts from its topk_ids [tokens, k] (-1 entries left out)."""
        t = _arrays.indices(topk_ids, "topk_ids")
        t = t[t >= 0]
        if t.size and t.max() >= self.experts:
            raise ValueError(f"topk_ids names expert {int(t.max())}, the layer has {self.experts}")
        return np.bincount(t, minlength=self.experts).astype(np.int64)
