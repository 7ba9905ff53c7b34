"""A drop-in EPLB policy for vLLM (0.33's AbstractEplbPolicy interface).

    from moe_compose.vllm import MoeComposeEplbPolicy, register
    register()   # EPLB_POLICIES["default"] = MoeComposeEplbPolicy, in every process that calls it

or, without touching code, `MOE_COMPOSE_VLLM_EPLB=1` with moe_compose installed: vLLM loads the
`vllm.general_plugins` entry point of this package in every worker, and register() swaps the policy
when that variable is set (docs/engines.md).

rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks, old_global_expert_indices)
returns phy2log [layers, num_replicas] int64 (a torch tensor when weight is one, else numpy). Without
the old placement it is EPLB (eplb.py's plan); with it, the minimal-move rebalance: the largest GPU
load within (1 + tolerance) of EPLB's, keeping experts on the GPUs that hold them.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from . import _arrays, rebalance, rebalance_experts as _eplb

try:  # subclass vLLM's abstract policy when vLLM is importable
    from vllm.distributed.eplb.policy.abstract import AbstractEplbPolicy as _Base
except Exception:  # vLLM absent (or not importable here): a plain base class
    _Base = object

__all__ = ["MoeComposeEplbPolicy", "register"]


class MoeComposeEplbPolicy(_Base):
    #: Largest GPU load allowed, relative to EPLB's from scratch (0.01: within 1%).
    tolerance: float = 0.01
    #: Cap on the slots per layer that need an expert from another GPU (None: no cap).
    max_copies_per_layer: Optional[int] = None
    #: The last rebalance's details (transfers, copies, loads), for logging.
    last = None

    @classmethod
    def rebalance_experts(cls, weight, num_replicas: int, num_groups: int, num_nodes: int, num_ranks: int,
                          old_global_expert_indices=None):
        torch_in = _arrays.is_torch(weight)
        if old_global_expert_indices is None:
            phy2log = _eplb(weight, num_replicas, num_groups, num_nodes, num_ranks)[0]
            cls.last = None
        else:
            old = _arrays.indices(old_global_expert_indices, "old_global_expert_indices")
            if old.shape[1] != int(num_replicas):
                raise ValueError(f"old_global_expert_indices has {old.shape[1]} slots per layer, num_replicas is "
                                 f"{num_replicas}")
            r = rebalance(weight, old, num_ranks, num_groups=num_groups, num_nodes=num_nodes,
                          tolerance=cls.tolerance, max_copies_per_layer=cls.max_copies_per_layer)
            cls.last = r
            phy2log = r.phy2log
        if torch_in:
            import torch

            return torch.from_numpy(phy2log)
        return phy2log


def register(force: bool = False) -> bool:
    """Makes MoeComposeEplbPolicy vLLM's "default" EPLB policy in this process. As the
    vllm.general_plugins entry point it acts only when MOE_COMPOSE_VLLM_EPLB=1 (or force=True)."""
    if not force and os.environ.get("MOE_COMPOSE_VLLM_EPLB", "") not in ("1", "true", "yes"):
        return False
    from vllm.distributed.eplb import policy as vllm_policy

    vllm_policy.EPLB_POLICIES["default"] = MoeComposeEplbPolicy
    return True
