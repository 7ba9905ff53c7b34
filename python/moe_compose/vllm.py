"""A drop-in EPLB policy for vLLM (the AbstractEplbPolicy interface of vLLM 0.33 and 0.34).

    from moe_compose.vllm import MoeComposeEplbPolicy, register
    register()   # EPLB_POLICIES["default"] = MoeComposeEplbPolicy, in every process that calls it

or, without touching code, `MOE_COMPOSE_VLLM_EPLB=1` with moe_compose installed: vLLM loads the
`vllm.general_plugins` entry point of this package in every worker, and register() swaps the policy
when that variable is set (docs/engines.md).

rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks, old_global_expert_indices)
returns phy2log [layers, num_replicas] int64 (a torch tensor when weight is one, else numpy). Without
the old placement it is EPLB (eplb.py's plan); with it, the minimal-move rebalance: the largest GPU
load within (1 + tolerance) of EPLB's, keeping experts on the GPUs that hold them, and every expert
group on one node when EPLB would use its hierarchical policy (num_groups % num_nodes == 0).

The calls vLLM's elastic EP makes are answered: on scale-down the old map is wider than
num_replicas (ranks num_ranks.. leave, as vLLM's rank mapping drops the last ranks), on scale-up the
new ranks' slots are -1. Parameters vLLM's DefaultEplbPolicy rejects with an AssertionError raise
one here too (with a message naming the parameter). rebalance_experts_with_details() returns the
rebalance's transfers and loads with the plan, per call (no state is kept on the class).
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from . import Rebalance, _arrays, rebalance, rebalance_experts as _eplb

try:  # subclass vLLM's abstract policy when vLLM is importable
    from vllm.distributed.eplb.policy.abstract import AbstractEplbPolicy as _Base
except Exception:  # vLLM absent (or not importable here): a plain base class
    _Base = object

__all__ = ["MoeComposeEplbPolicy", "register"]


def _check_like_default(num_logical: int, num_replicas: int, num_groups: int, num_nodes: int, num_ranks: int) -> None:
    """The assertions of vLLM's DefaultEplbPolicy (policy/default.py), as AssertionErrors that name
    the parameter: vLLM's callers and tests expect that type."""
    for name, v in (("num_replicas", num_replicas), ("num_groups", num_groups), ("num_nodes", num_nodes),
                    ("num_ranks", num_ranks)):
        assert v > 0, f"{name} must be positive, got {v}"
    if num_groups % num_nodes == 0:  # the hierarchical policy
        assert num_logical % num_groups == 0, f"{num_logical} logical experts do not split into num_groups={num_groups}"
        assert num_ranks % num_nodes == 0, f"num_ranks={num_ranks} do not split over num_nodes={num_nodes}"
    assert num_replicas % num_ranks == 0, f"num_replicas={num_replicas} do not split over num_ranks={num_ranks}"
    assert num_replicas >= num_logical, f"num_replicas={num_replicas} cannot hold {num_logical} logical experts"


class MoeComposeEplbPolicy(_Base):
    #: Largest GPU load allowed, relative to EPLB's from scratch (0.01: within 1%). Configuration,
    #: read at each call (set it on a subclass to change it for one engine).
    tolerance: float = 0.01
    #: Cap on the slots per layer that need an expert from another GPU (None: no cap).
    max_copies_per_layer: Optional[int] = None

    @classmethod
    def rebalance_experts_with_details(cls, weight, num_replicas: int, num_groups: int, num_nodes: int,
                                       num_ranks: int, old_global_expert_indices=None):
        """(phy2log, details): details is this call's moe_compose.Rebalance (transfers, copies, loads,
        group_rule), or None without an old placement (EPLB from scratch)."""
        torch_in = _arrays.is_torch(weight)
        w = _arrays.loads(weight, "weight")
        num_replicas, num_groups, num_nodes, num_ranks = (
            _arrays.integer(v, name) for v, name in ((num_replicas, "num_replicas"), (num_groups, "num_groups"),
                                                     (num_nodes, "num_nodes"), (num_ranks, "num_ranks")))
        _check_like_default(w.shape[1], num_replicas, num_groups, num_nodes, num_ranks)
        details: Optional[Rebalance] = None
        if old_global_expert_indices is None:
            phy2log = _eplb(w, num_replicas, num_groups, num_nodes, num_ranks)[0]
        else:
            old = _arrays.indices(old_global_expert_indices, "old_global_expert_indices")
            details = rebalance(w, old, num_ranks, num_groups=num_groups, num_nodes=num_nodes,
                                tolerance=cls.tolerance, max_copies_per_layer=cls.max_copies_per_layer,
                                num_replicas=num_replicas)
            phy2log = details.phy2log
        if torch_in:
            import torch

            return torch.from_numpy(phy2log), details
        return phy2log, details

    @classmethod
    def rebalance_experts(cls, weight, num_replicas: int, num_groups: int, num_nodes: int, num_ranks: int,
                          old_global_expert_indices=None):
        return cls.rebalance_experts_with_details(weight, num_replicas, num_groups, num_nodes, num_ranks,
                                                  old_global_expert_indices)[0]


def register(force: bool = False) -> bool:
    """Makes MoeComposeEplbPolicy vLLM's "default" EPLB policy in this process. As the
    vllm.general_plugins entry point it acts only when MOE_COMPOSE_VLLM_EPLB=1 (or force=True)."""
    if not force and os.environ.get("MOE_COMPOSE_VLLM_EPLB", "") not in ("1", "true", "yes"):
        return False
    from vllm.distributed.eplb import policy as vllm_policy

    vllm_policy.EPLB_POLICIES["default"] = MoeComposeEplbPolicy
    return True
