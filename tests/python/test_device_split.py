"""moe_compose.DeviceBatchSplit (the per-batch split on the device, through libmoe_compose_cuda's C
interface) against the host binding, moe_compose.BatchSplit, whose splits test_batch_split.py checks
against a brute force.

The library is the one MOE_COMPOSE_DEVICE_LIB names: scripts/test.sh gives the build of
python/src/device_split.cu for the CPU emulator of tests/emu (libmoe_compose_cuda_emu.so), whose
moe_compose_test_* calls provide the device memory here; on a GPU machine torch tensors would take
its place. Without the variable the module is skipped (a build without the emulator has no library)."""

import ctypes
import os

import numpy as np
import pytest

import moe_compose as mc
from moe_compose import device as mdev

LIB = os.environ.get("MOE_COMPOSE_DEVICE_LIB")
pytestmark = pytest.mark.skipif(not LIB, reason="MOE_COMPOSE_DEVICE_LIB is not set (scripts/test.sh sets it to the "
                                                "emulated library)")


def _lib():
    lib = mdev.load_library(LIB)
    if not hasattr(lib, "moe_compose_test_malloc"):
        pytest.skip("the library has no test memory calls (not the emulated build)")
    vp = ctypes.c_void_p
    lib.moe_compose_test_malloc.argtypes = (ctypes.c_int64, ctypes.POINTER(vp))
    lib.moe_compose_test_free.argtypes = (vp,)
    lib.moe_compose_test_upload.argtypes = (vp, vp, ctypes.c_int64)
    lib.moe_compose_test_download.argtypes = (vp, vp, ctypes.c_int64)
    return lib


class EmuArray:
    """Device memory of the emulated library, with the CUDA array interface; view() is a window
    into it (no memory of its own)."""

    def __init__(self, shape, dtype, owner=None, ptr=None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self._owner = owner
        if ptr is None:
            p = ctypes.c_void_p()
            assert _lib().moe_compose_test_malloc(max(self.nbytes, 1), ctypes.byref(p)) == 0
            self.ptr = p.value
        else:
            self.ptr = ptr

    @classmethod
    def of(cls, host):
        a = cls(host.shape, host.dtype)
        a.upload(host)
        return a

    def upload(self, host):
        host = np.ascontiguousarray(host, dtype=self.dtype)
        assert host.shape == self.shape
        if self.nbytes:
            assert _lib().moe_compose_test_upload(self.ptr, host.ctypes.data, self.nbytes) == 0

    def fill(self, value):
        self.upload(np.full(self.shape, value, dtype=self.dtype))

    def download(self):
        out = np.empty(self.shape, dtype=self.dtype)
        assert _lib().moe_compose_test_synchronize() == 0
        if self.nbytes:
            assert _lib().moe_compose_test_download(out.ctypes.data, self.ptr, self.nbytes) == 0
        return out

    def row(self, r):
        n = self.shape[1]
        return EmuArray((n,), self.dtype, owner=self, ptr=self.ptr + r * n * self.dtype.itemsize)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": None}

    def __del__(self):
        if self._owner is None and getattr(self, "ptr", None):
            _lib().moe_compose_test_free(self.ptr)


def engine_case(rng, stray=False):
    """A layer of engine slots (every expert once, the rest random, so an expert may hold two slots
    of one GPU) and each rank's top-k ids with padding (-1) and, with stray, ids past the experts."""
    per_server = int(rng.integers(1, 4))
    G = per_server * int(rng.integers(1, 4))
    S = int(rng.integers(1, 6))
    P = G * S
    E = int(rng.integers(1, P + 1))
    phy2log = np.concatenate([np.arange(E), rng.integers(0, E, P - E)])
    rng.shuffle(phy2log)
    K = int(rng.integers(1, 4))
    pop = rng.gamma(0.6, 1.0, E) + 1e-9
    ids = []
    for _ in range(G):
        T = int(rng.integers(0, 30))
        v = rng.choice(E, size=(T, K), p=pop / pop.sum()).astype(np.int64)
        u = rng.integers(0, 20, size=(T, K))
        v[u == 0] = -1
        if stray:
            v[u == 1] = E + rng.integers(0, 3, size=int((u == 1).sum()))
        ids.append(v)
    return phy2log, G, per_server, E, ids


@pytest.mark.parametrize("seed", range(80))
def test_device_split_equals_the_host_binding(seed):
    rng = np.random.default_rng(seed)
    phy2log, G, per_server, E, ids = engine_case(rng, stray=seed % 3 == 0)
    id_dtype = np.int32 if seed % 2 else np.int64
    out_dtype = np.int64 if seed % 4 < 2 else np.int32
    most = max(1, max(v.size for v in ids))
    split = mdev.DeviceBatchSplit(phy2log, G, per_server, most)
    assert (split.num_gpus, split.experts, split.max_pairs) == (G, E, most)
    counts = EmuArray((G, E), np.int32)
    counts.fill(-7)
    d_ids = [EmuArray.of(v.astype(id_dtype)) for v in ids]
    for r in range(G):
        split.count(d_ids[r], counts.row(r))
    load, outcome = EmuArray((G,), np.int64), EmuArray((4,), np.int64)
    split.plan(counts, load, outcome)
    outs = []
    for r in range(G):
        o = EmuArray(ids[r].shape, out_dtype)
        o.fill(-9)
        split.dispatch(r, d_ids[r], o)
        outs.append(o)

    # the counts, by numpy
    want = np.zeros((G, E), dtype=np.int64)
    for r, v in enumerate(ids):
        ok = v[(v >= 0) & (v < E)]
        np.add.at(want[r], ok, 1)
    np.testing.assert_array_equal(counts.download(), want)
    host = mc.BatchSplit(phy2log, G, per_server)
    h = host.plan(want)
    assert list(outcome.download()) == [h["max_load"], h["local"], h["same_server"], 0]
    np.testing.assert_array_equal(load.download(), h["load"])
    got_load = np.zeros(G, dtype=np.int64)
    S = phy2log.size // G
    for r, v in enumerate(ids):
        got = outs[r].download()
        host_ids = np.where((v >= 0) & (v < E), v, -1)  # the host refuses ids past the experts
        np.testing.assert_array_equal(got, host.dispatch(r, host_ids), err_msg=f"rank {r}")
        served = got[host_ids >= 0]
        np.testing.assert_array_equal(phy2log[served], host_ids[host_ids >= 0])  # a slot of the pair's expert
        np.add.at(got_load, served // S, 1)
    np.testing.assert_array_equal(got_load, h["load"])
    split.close()


def test_every_pair_to_one_expert_and_no_pairs():
    phy2log = np.array([0, 1, 0, 0, 2, 3, 4, 0])  # expert 0 on GPUs 0, 1 (twice) and 3
    split = mdev.DeviceBatchSplit(phy2log, 4, 2, 16)
    ids = [np.zeros((r + 2, 2), dtype=np.int64) for r in range(3)] + [np.zeros((0, 2), dtype=np.int64)]
    counts = EmuArray((4, 5), np.int32)
    d_ids = [EmuArray.of(v) for v in ids]
    for r in range(4):
        split.count(d_ids[r], counts.row(r))
    outcome = EmuArray((4,), np.int64)
    split.plan(counts, outcome=outcome)
    host = mc.BatchSplit(phy2log, 4, 2)
    h = host.plan(counts.download())
    assert outcome.download()[0] == h["max_load"] == 6  # 18 pairs of expert 0 over its three GPUs
    for r in range(4):
        o = EmuArray(ids[r].shape, np.int64)
        split.dispatch(r, d_ids[r], o)
        np.testing.assert_array_equal(o.download(), host.dispatch(r, ids[r]))


def test_a_negative_count_is_reported_in_the_outcome():
    split = mdev.DeviceBatchSplit(np.array([0, 1, 1, 0]), 2, 1, 4)
    counts = EmuArray.of(np.array([[1, 0], [-1, 2]], dtype=np.int32))
    outcome = EmuArray((4,), np.int64)
    split.plan(counts, outcome=outcome)
    assert outcome.download()[3] == 1


def test_bad_input_is_named():
    split = mdev.DeviceBatchSplit(np.array([0, 1, 1, 0]), 2, 1, 4)
    ids = EmuArray.of(np.zeros((2, 2), dtype=np.int64))
    row = EmuArray((2,), np.int32)
    with pytest.raises(TypeError, match="topk_ids must be a device array"):
        split.count(np.zeros(4, dtype=np.int64), row)
    with pytest.raises(TypeError, match="counts_row must be int32, got typestr '<i8'"):
        split.count(ids, EmuArray((2,), np.int64))
    with pytest.raises(TypeError, match="topk_ids must be int32 or int64, got typestr '<f4'"):
        split.count(EmuArray((4,), np.float32), row)
    with pytest.raises(mc.MoeError, match=r"counts must have shape \(2, 2\), got \(2, 3\)"):
        split.plan(EmuArray((2, 3), np.int32))
    with pytest.raises(mc.MoeError, match="dispatch of 6 pairs; this split was built for at most 4"):
        split.dispatch(0, EmuArray((3, 2), np.int64), EmuArray((3, 2), np.int64))
    with pytest.raises(mc.MoeError, match=r"physical_ids must have shape \(2, 2\), got \(4,\)"):
        split.dispatch(0, ids, EmuArray((4,), np.int64))
    with pytest.raises(mc.MoeError, match=r"dispatch for rank 2, outside \[0, 2\)"):
        split.dispatch(2, ids, EmuArray((2, 2), np.int64))
    with pytest.raises(mc.MoeError, match=r"dispatch for rank 4294967296, outside \[0, 2\)"):
        split.dispatch(2**32, ids, EmuArray((2, 2), np.int64))
    with pytest.raises(mc.MoeError, match="phy2log has no slot for expert 1"):
        mdev.DeviceBatchSplit(np.array([0, 2, 2, 0]), 2, 1, 4)
    with pytest.raises(mc.MoeError, match="max_pairs must be in"):
        mdev.DeviceBatchSplit(np.array([0, 1, 1, 0]), 2, 1, 0)
    with pytest.raises(mc.MoeError, match="one layer's table"):
        mdev.DeviceBatchSplit(np.array([[0, 1, 1, 0]]), 2, 1, 4)
    with pytest.raises(mc.MoeError, match="slack_permille must be in"):
        mdev.DeviceBatchSplit(np.array([0, 1, 1, 0]), 2, 1, 4, slack_permille=-1)
    with pytest.raises(mc.MoeError, match="is not at"):
        mdev.DeviceBatchSplit(np.array([0, 1, 1, 0]), 2, 1, 4, library="/nonexistent/libmoe_compose_cuda.so")
    split.close()
    with pytest.raises(mc.MoeError, match="closed"):
        split.count(ids, row)
