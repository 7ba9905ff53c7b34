"""A drop-in for SGLang's EPLB (0.5.23: sglang.srt.eplb.eplb_algorithms.rebalance_experts).

    import moe_compose.sglang
    moe_compose.sglang.install()   # sglang.srt.eplb.eplb_algorithms.rebalance_experts = ours

SGLang has no registry of EPLB algorithms: install() replaces the module function, which SGLang
looks up at each call. SGLang's general plugins (entry point group sglang.srt.plugins, loaded in
every process) call plugin(), which installs it when MOE_COMPOSE_SGLANG_EPLB=1 (docs/engines.md).

rebalance_experts(tokens_per_expert, num_physical_experts, num_local_physical_experts, num_groups,
num_nodes, algorithm) -> (phy2log, log2phy, logcnt), as SGLang's: tokens_per_expert [X, layers,
experts] is summed over its first axis as torch sums it; the deepseek and deepseek_hierarchical
algorithms give SGLang's deepseek.py plan (eplb.py's, with the pack weights summed in double as
deepseek.py sums them); the others are passed on to SGLang's own function when it is installed, else
raise NotImplementedError.
"""

from __future__ import annotations

import numpy as np

from . import _arrays, _core

__all__ = ["rebalance_experts", "install"]

_original = None


def _name(algorithm) -> str:
    return str(getattr(algorithm, "name", algorithm))


def rebalance_experts(tokens_per_expert, num_physical_experts: int, num_local_physical_experts: int, num_groups,
                      num_nodes: int, algorithm):
    name = _name(algorithm)
    if name not in ("deepseek", "deepseek_hierarchical"):
        if _original is not None:
            return _original(tokens_per_expert, num_physical_experts, num_local_physical_experts, num_groups, num_nodes,
                             algorithm)
        raise NotImplementedError(f"moe_compose.sglang: algorithm {name!r} (supported: deepseek, "
                                  "deepseek_hierarchical)")
    torch_in = _arrays.is_torch(tokens_per_expert)
    if torch_in:
        # As SGLang: tokens_per_expert.sum(dim=0) in the caller's dtype (a float16 or bfloat16 sum
        # rounds to that dtype: 2048 + 1 stays 2048 in bfloat16), then .float() (deepseek.py).
        t = tokens_per_expert.detach().cpu()
        if t.dim() != 3:
            raise ValueError(f"tokens_per_expert must be [X, layers, experts], got shape {tuple(t.shape)}")
        if t.dtype.is_complex or t.dtype == _torch_bool():
            raise TypeError(f"tokens_per_expert must hold integers or floats, got dtype {t.dtype}")
        weight = t.sum(dim=0).float()
    else:
        t = _arrays._numpy(tokens_per_expert, "tokens_per_expert")
        if getattr(t, "ndim", 0) != 3:
            raise ValueError(f"tokens_per_expert must be [X, layers, experts], got shape {tuple(np.shape(t))}")
        if t.dtype.kind not in "iuf":
            raise TypeError(f"tokens_per_expert must hold integers or floats, got dtype {t.dtype}")
        weight = _sum_like_torch(t)
    phy = _arrays.count(num_physical_experts, "num_physical_experts")
    local = _arrays.count(num_local_physical_experts, "num_local_physical_experts")
    if phy % local:
        raise ValueError(f"{phy} physical experts do not split into ranks of {local}")
    hierarchical = name == "deepseek_hierarchical"
    groups = 1 if num_groups is None else num_groups
    # SGLang's deepseek.py is eplb.py except that it sums the pack weights in Python floats (double)
    # where eplb.py sums float32 tensors: the plans differ where float32 rounding ties two packs.
    w = _arrays.loads(weight, "tokens_per_expert")
    out = _core.eplb(w, phy, _arrays.count(groups, "num_groups"), _arrays.count(num_nodes, "num_nodes"), phy // local,
                     hierarchical, True)
    if torch_in:
        import torch

        return tuple(torch.from_numpy(x) for x in out)
    return out


def _sum_like_torch(t: np.ndarray) -> np.ndarray:
    """tokens_per_expert.sum(dim=0) as torch computes it on a CPU tensor of the same dtype: integers
    are summed in int64 (torch promotes every integer dtype to int64; summing in a narrow dtype
    would wrap, 2 x 40000 in uint16 is 14464), float16 is accumulated in float32 and rounded to
    float16 once (so 2048 + 1 + 1 is 2050, not 2048), other floats in their own dtype."""
    if t.dtype.kind in "iu":
        if t.dtype == np.uint64 and t.size and t.max() > np.iinfo(np.int64).max:
            raise ValueError("tokens_per_expert holds a count above int64")
        return t.astype(np.int64, copy=False).sum(axis=0)
    if t.dtype == np.float16:
        return t.sum(axis=0, dtype=np.float32).astype(np.float16)
    return t.sum(axis=0, dtype=t.dtype)


def _torch_bool():
    import torch

    return torch.bool


def install() -> None:
    """Replaces sglang.srt.eplb.eplb_algorithms.rebalance_experts with this module's function."""
    global _original
    from sglang.srt.eplb import eplb_algorithms

    if eplb_algorithms.rebalance_experts is not rebalance_experts:
        _original = eplb_algorithms.rebalance_experts
        eplb_algorithms.rebalance_experts = rebalance_experts


def plugin() -> bool:
    """The `sglang.srt.plugins` entry point (SGLang's general plugins, loaded in every process):
    installs this module's rebalance_experts when MOE_COMPOSE_SGLANG_EPLB=1."""
    import os

    if os.environ.get("MOE_COMPOSE_SGLANG_EPLB", "") not in ("1", "true", "yes"):
        return False
    install()
    return True
