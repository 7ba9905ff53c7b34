"""Array conversions of the thin Python layer: numpy arrays, torch tensors and anything with the
array protocol in; C-contiguous CPU numpy arrays of one dtype out (no copy when already so)."""

from __future__ import annotations

import numpy as np


def is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _numpy(x, name: str) -> np.ndarray:
    if is_torch(x):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if not (t.dtype.is_floating_point or t.dtype.is_complex) and str(t.dtype) == "torch.bool":
            raise TypeError(f"{name} must hold numbers, got a tensor of {t.dtype}")
        if str(t.dtype) in ("torch.bfloat16", "torch.float16"):
            t = t.float()
        return t.numpy()
    try:
        return np.asarray(x)
    except Exception as e:  # objects numpy cannot read
        raise TypeError(f"{name} must be an array (numpy, torch, or anything with the array protocol): {e}") from None


def loads(x, name: str = "weight", ndim: int = 2, dtype=np.float32) -> np.ndarray:
    """Loads as a C-contiguous array of `dtype` with `ndim` dimensions; integers and floats accepted."""
    a = _numpy(x, name)
    if a.dtype.kind not in "iuf":
        raise TypeError(f"{name} must hold integers or floats, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(a.shape)}")
    return np.ascontiguousarray(a, dtype=dtype)


def indices(x, name: str, ndim: int = 2) -> np.ndarray:
    """Integer indices as a C-contiguous int64 array with `ndim` dimensions."""
    a = _numpy(x, name)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(a.shape)}")
    if a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} holds an index above int64")
    return np.ascontiguousarray(a, dtype=np.int64)


def integer(x, name: str) -> int:
    """A Python int (numpy and torch integer scalars accepted), any sign."""
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise TypeError(f"{name} must be an integer, got {x!r}")
    return int(x.__index__())


def count(x, name: str) -> int:
    """A positive Python int (numpy and torch integer scalars accepted)."""
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise TypeError(f"{name} must be an integer, got {x!r}")
    v = int(x.__index__())
    if v <= 0:
        raise ValueError(f"{name} must be positive, got {v}")
    return v
