"""The per-batch replica split on the GPU, for an engine's own MoE layer.

`moe_compose.BatchSplit` splits on the host; an engine that used it per layer would copy the counts
to the host and wait for them. `DeviceBatchSplit` runs the same split on the device
(kernels::cuda::DeviceSlotSplit, include/moe/kernels/slot_split.cuh) and gives the same slots, with
no synchronisation and no copy to the host, so an engine can capture it in its CUDA graph. Per layer
and batch, on the engine's stream:

    split.count(topk_ids, row)          # this rank's row of counts (experts int32)
    # the engine all-gathers the rows into counts [num_gpus, experts] int32
    split.plan(counts)                  # the split, the same on every rank
    split.dispatch(rank, topk_ids, physical_ids)   # each pair's physical slot, -1 for padding

Arrays are device arrays with the CUDA array interface (torch CUDA tensors, CuPy arrays), C-contiguous;
top-k ids and physical ids are int32 or int64. The calls go through ctypes to a shared library with no
Python in it, libmoe_compose_cuda.so: built by nvcc with the package (CMAKE_ARGS=-DMOE_COMPOSE_CUDA=ON
pip install ./python) or by the repository's CMake build (target moe_compose_cuda); pass its path as
`library` or in MOE_COMPOSE_DEVICE_LIB otherwise.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Optional

import numpy as np

try:
    from ._core import MoeError
except ImportError:  # this file loaded on its own, without the built package (scripts/gpu_torch_split.py)
    class MoeError(ValueError):
        """The device split's refusals (moe_compose.MoeError in the package)."""

__all__ = ["DeviceBatchSplit", "load_library"]

_c_int64_p = ctypes.POINTER(ctypes.c_int64)
_ERR_LEN = 1024


def _default_library() -> str:
    path = os.environ.get("MOE_COMPOSE_DEVICE_LIB")
    if path:
        return path
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libmoe_compose_cuda.so")


_libraries: dict = {}


def load_library(path: Optional[str] = None) -> ctypes.CDLL:
    """The device split's library (default: MOE_COMPOSE_DEVICE_LIB, else the package's own
    libmoe_compose_cuda.so), loaded once per path."""
    path = path or _default_library()
    if path in _libraries:
        return _libraries[path]
    if not os.path.exists(path):
        raise MoeError(f"the device split's library is not at {path}: build the package with "
                       "CMAKE_ARGS=-DMOE_COMPOSE_CUDA=ON, or give its path (library=, MOE_COMPOSE_DEVICE_LIB)")
    lib = ctypes.CDLL(path)
    err = (ctypes.c_char_p, ctypes.c_size_t)
    vp = ctypes.c_void_p
    lib.moe_compose_split_create.argtypes = (_c_int64_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                             ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(vp)) + err
    lib.moe_compose_split_destroy.argtypes = (vp,)
    lib.moe_compose_split_destroy.restype = None
    lib.moe_compose_split_shape.argtypes = (vp, _c_int64_p, _c_int64_p, _c_int64_p) + err
    lib.moe_compose_split_count.argtypes = (vp, ctypes.c_int, vp, ctypes.c_int64, vp, vp) + err
    lib.moe_compose_split_plan.argtypes = (vp, vp, vp, vp, vp) + err
    lib.moe_compose_split_dispatch.argtypes = (vp, ctypes.c_int, ctypes.c_int, vp, ctypes.c_int64, ctypes.c_int, vp,
                                               vp) + err
    for name in ("create", "shape", "count", "plan", "dispatch"):
        getattr(lib, f"moe_compose_split_{name}").restype = ctypes.c_int
    _libraries[path] = lib
    return lib


def _interface(a: Any, what: str) -> dict:
    try:
        cai = a.__cuda_array_interface__
    except AttributeError:
        raise TypeError(f"{what} must be a device array with the CUDA array interface (a torch CUDA tensor, a CuPy "
                        f"array), got {type(a).__name__}") from None
    return cai


def _device_array(a: Any, what: str, dtypes: tuple, shape: Optional[tuple] = None) -> tuple:
    """(pointer, number of items, item bytes, shape) of a C-contiguous device array of one of
    `dtypes` ('<i4', '<i8'), of `shape` when given."""
    cai = _interface(a, what)
    typestr = cai["typestr"]
    if typestr not in dtypes:
        names = {"<i4": "int32", "<i8": "int64"}
        raise TypeError(f"{what} must be {' or '.join(names[d] for d in dtypes)}, got typestr {typestr!r}")
    dims = tuple(int(d) for d in cai["shape"])
    if shape is not None and dims != shape:
        raise MoeError(f"{what} must have shape {shape}, got {dims}")
    item = np.dtype(typestr).itemsize
    strides = cai.get("strides")
    if strides is not None:
        want, step = [], item
        for d in reversed(dims):
            want.append(step)
            step *= d
        if tuple(int(s) for s in strides) != tuple(reversed(want)) and int(np.prod(dims)) > 1:
            raise MoeError(f"{what} must be C-contiguous, got strides {tuple(strides)} for shape {dims}")
    ptr = int(cai["data"][0])
    n = int(np.prod(dims)) if dims else 1
    if n > 0 and ptr == 0:
        raise MoeError(f"{what} has {n} items at a null pointer")
    return ptr, n, item, dims


def _stream_of(stream: Any, like: Any) -> int:
    """The cudaStream_t to launch on: an int, an object with .cuda_stream (torch) or .ptr (CuPy);
    None: torch's current stream on `like`'s device when `like` is a torch tensor, else the
    default stream."""
    if stream is None:
        if type(like).__module__.split(".")[0] == "torch":
            import torch  # the array is torch's, so torch is there
            return int(torch.cuda.current_stream(like.device).cuda_stream)
        return 0
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    return int(stream)


class DeviceBatchSplit:
    """The per-batch split of one layer over an engine's slots, on the GPU (see the module's text).

    phy2log: the layer's physical slot -> logical expert table (host array, num_gpus x slots per GPU
    entries, GPU-major), as for BatchSplit. max_pairs: the most ids (tokens x top-k, padding
    included) one dispatch() takes; its sort's buffers are allocated here, once, on the current CUDA
    device. Not for concurrent calls on several streams (the calls share the object's buffers)."""

    def __init__(self, phy2log, num_gpus: int, gpus_per_server: int, max_pairs: int, slack_permille: int = 0,
                 library: Optional[str] = None):
        self._lib = load_library(library)
        self._handle = None
        table = np.asarray(phy2log)
        if table.ndim != 1:
            raise MoeError(f"phy2log must be one layer's table (1-D), got {table.ndim} dimensions")
        if table.dtype.kind not in "iu":
            raise TypeError(f"phy2log must hold integers, got {table.dtype}")
        table = np.ascontiguousarray(table, dtype=np.int64)
        handle = ctypes.c_void_p()
        self._call("create", table.ctypes.data_as(_c_int64_p), table.size, int(num_gpus), int(gpus_per_server),
                   int(max_pairs), int(slack_permille), ctypes.byref(handle))
        self._handle = handle
        g, e, m = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
        self._call("shape", handle, ctypes.byref(g), ctypes.byref(e), ctypes.byref(m))
        self.num_gpus, self.experts, self.max_pairs = g.value, e.value, m.value

    def _call(self, name: str, *args) -> None:
        err = ctypes.create_string_buffer(_ERR_LEN)
        if getattr(self._lib, f"moe_compose_split_{name}")(*args, err, _ERR_LEN) != 0:
            raise MoeError(err.value.decode(errors="replace"))

    def _live(self):
        if self._handle is None:
            raise MoeError("this DeviceBatchSplit is closed")
        return self._handle

    def count(self, topk_ids, counts_row, stream=None) -> None:
        """This rank's row of the counts: counts_row (experts int32, device) = the pairs of each
        expert among topk_ids (int32 or int64, device, any shape), ids outside [0, experts) left
        out."""
        ids, n, item, _ = _device_array(topk_ids, "topk_ids", ("<i4", "<i8"))
        row = _device_array(counts_row, "counts_row", ("<i4",), (self.experts,))[0]
        self._call("count", self._live(), item, ids, n, row, _stream_of(stream, topk_ids))

    def plan(self, counts, load=None, outcome=None, stream=None) -> None:
        """Splits the batch of counts ([num_gpus, experts] int32, device: every rank's row from
        count()). load ([num_gpus] int64, device) and outcome ([4] int64, device: max_load, local,
        same_server, bad; bad != 0: a negative count, nothing split) receive the split's figures
        when given."""
        c = _device_array(counts, "counts", ("<i4",), (self.num_gpus, self.experts))[0]
        lp = _device_array(load, "load", ("<i8",), (self.num_gpus,))[0] if load is not None else None
        op = _device_array(outcome, "outcome", ("<i8",), (4,))[0] if outcome is not None else None
        self._call("plan", self._live(), c, lp, op, _stream_of(stream, counts))

    def dispatch(self, rank: int, topk_ids, physical_ids, stream=None) -> None:
        """This rank's pairs under the last plan(): physical_ids (the shape of topk_ids, int32 or
        int64, device) = the physical slot serving each pair, -1 for ids outside [0, experts). rank:
        the row of the counts these ids were counted into."""
        rank = int(rank)
        if not 0 <= rank < self.num_gpus:  # before ctypes, which would refuse a rank past int's range
            raise MoeError(f"device slot split: dispatch for rank {rank}, outside [0, {self.num_gpus})")
        ids, n, item, shape = _device_array(topk_ids, "topk_ids", ("<i4", "<i8"))
        out, _, out_item, _ = _device_array(physical_ids, "physical_ids", ("<i4", "<i8"), shape)
        self._call("dispatch", self._live(), rank, item, ids, n, out_item, out, _stream_of(stream, topk_ids))

    def close(self) -> None:
        """Frees the device buffers now (also done when the object is collected)."""
        if self._handle is not None:
            self._lib.moe_compose_split_destroy(self._handle)
            self._handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
