"""Bad input raises a clear Python error; random malformed arrays never crash the interpreter."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import moe_compose as mc

W = np.arange(24, dtype=np.float32).reshape(2, 12) + 1
OLD = np.stack([np.arange(16) % 12, (np.arange(16) + 5) % 12])


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: mc.rebalance_experts(W[0], 16, 4, 2, 8), ValueError, "2 dimensions"),
        (lambda: mc.rebalance_experts(W.astype(np.complex64), 16, 4, 2, 8), TypeError, "integers or floats"),
        (lambda: mc.rebalance_experts(np.array([["a"] * 12] * 2), 16, 4, 2, 8), TypeError, "integers or floats"),
        (lambda: mc.rebalance_experts(-W, 16, 4, 2, 8), mc.MoeError, "negative or not finite"),
        (lambda: mc.rebalance_experts(np.where(W > 5, np.nan, W), 16, 4, 2, 8), mc.MoeError, "not finite"),
        (lambda: mc.rebalance_experts(W, 18, 4, 2, 8), mc.MoeError, "do not split over 8"),
        (lambda: mc.rebalance_experts(W, 8, 4, 2, 8), mc.MoeError, "at least the number of experts"),
        (lambda: mc.rebalance_experts(W, 16, 5, 1, 8), mc.MoeError, "groups"),
        (lambda: mc.rebalance_experts(W, 16, 4, 2, 0), ValueError, "num_gpus must be positive"),
        (lambda: mc.rebalance_experts(W, 16.5, 4, 2, 8), TypeError, "num_replicas must be an integer"),
        (lambda: mc.rebalance_experts(np.zeros((2, 0), np.float32), 16, 4, 2, 8), mc.MoeError, "empty"),
        (lambda: mc.rebalance(W, OLD[:1], 8), ValueError, "1 layers"),
        (lambda: mc.rebalance(W, OLD[:, :12], 8), mc.MoeError, "do not split over 8"),
        (lambda: mc.rebalance(W, OLD.astype(np.float64), 8), TypeError, "integers"),
        (lambda: mc.rebalance(W, OLD + 12, 8), mc.MoeError, "outside [-1, 12)"),
        (lambda: mc.rebalance(W, np.zeros((2, 16), np.int64), 8), mc.MoeError, "no slot for expert 1"),
        (lambda: mc.rebalance(W, OLD, 8, tolerance=-1), ValueError, "tolerance"),
        (lambda: mc.rebalance(W, OLD, 8, tolerance=float("nan")), ValueError, "tolerance"),
        (lambda: mc.rebalance(W, OLD, 8, num_groups=3, num_nodes=3), mc.MoeError, "do not split over 3 nodes"),
        (lambda: mc.transfer_time(mc.fat_tree(1, 2, 2), [[0, 0, 0, 0, 9]], 1, 1e6), mc.MoeError, "outside"),
        (lambda: mc.read_topology("/nonexistent/topo.tsv"), mc.MoeError, "/nonexistent/topo.tsv"),
        (lambda: mc.fat_tree(0, 2, 2), mc.MoeError, "leaves"),
        (lambda: mc.fat_tree(1, 2, 2).hops(0, 7), mc.MoeError, "must be in [0, 4)"),
        (lambda: mc.import_sglang_stat("/nonexistent.pt"), mc.MoeError, "nonexistent"),
        (lambda: mc.write_engine_plan("nope", "/tmp/x", OLD, 8, 12), mc.MoeError, "nope"),
    ],
)
def test_clear_errors(call, error, words):
    with pytest.raises(error) as e:
        call()
    assert words in str(e.value)


def test_moe_error_is_a_value_error():
    assert issubclass(mc.MoeError, ValueError)


FUZZ = textwrap.dedent(
    """
    import numpy as np, moe_compose as mc
    rng = np.random.default_rng(SEED)
    dtypes = [np.float32, np.float64, np.int64, np.int32, np.uint8, np.bool_, np.complex64, object, np.float16]
    def arr():
        nd = int(rng.integers(0, 4))
        shape = tuple(int(x) for x in rng.integers(0, 7, size=nd))
        dt = dtypes[int(rng.integers(len(dtypes)))]
        a = rng.normal(0, 50, size=shape)
        if rng.random() < 0.3: a[...] = rng.choice([np.nan, np.inf, -1.0, 1e38, 0.0])
        try: return a.astype(dt)
        except Exception: return a
    def num():
        return [int(rng.integers(-3, 40)), 2**31, -2**40, 0, 1.5, None, "4"][int(rng.integers(0, 7)) if rng.random() < 0.2 else 0]
    calls = [
        lambda: mc.rebalance_experts(arr(), num(), num(), num(), num()),
        lambda: mc.eplb(arr(), num(), num(), num(), num(), hierarchical=bool(rng.integers(2))),
        lambda: mc.rebalance(arr(), arr(), num(), num_groups=num(), num_nodes=num(), tolerance=float(rng.normal())),
        lambda: mc.transfer_time(mc.fat_tree(1, 2, 2), arr(), num(), float(rng.normal(1e6, 1e6))),
        lambda: mc.evaluate_plan(mc.fat_tree(1, 2, 2), arr(), arr()),
        lambda: mc.craft(arr(), num()),
        lambda: mc.ilp_load(mc.fat_tree(1, 2, 2), arr()),
        lambda: mc.joint(mc.fat_tree(1, 2, 2), arr(), num()),
        lambda: mc.slot_map([[[0]]], num(), arr()),
        lambda: mc.BatchSplit(arr(), num(), num(), num()),
        lambda: split_plan(),
        lambda: split_dispatch(),
    ]
    split = mc.BatchSplit(np.array([0, 1, 2, 3, 4, 5, 0, 1]), 4, 2)  # 4 GPUs, 2 per server, 6 experts
    planned = {}
    def split_plan():
        c = arr() if rng.random() < 0.5 else rng.integers(-int(rng.random() < 0.2), 5, size=(4, 6))
        split.plan(c)
        planned["counts"] = np.asarray(c, dtype=np.int64)
    def split_dispatch():
        r = num() if rng.random() < 0.3 else int(rng.integers(0, 4))
        if "counts" in planned and isinstance(r, int) and 0 <= r < 4 and rng.random() < 0.6:
            t = np.repeat(np.arange(6), planned["counts"][r])  # the pairs plan() was given
            rng.shuffle(t)
            t = t.reshape(-1, 1)
        else:
            t = arr() if rng.random() < 0.5 else rng.integers(-2, 7, size=(int(rng.integers(0, 5)), 2))
        split.dispatch(r, t)
    ok = errors = 0
    for i in range(COUNT):
        try:
            calls[i % len(calls)]()
            ok += 1
        except (ValueError, TypeError, MemoryError, OverflowError, NotImplementedError) as e:
            assert str(e), "an error without a message"
            errors += 1
    print("fuzz", ok, "accepted", errors, "refused")
    """
)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fuzz_malformed_arrays_never_crash(seed):
    # In a child process: a crash (segfault, abort) fails this test instead of killing pytest.
    code = FUZZ.replace("SEED", str(seed)).replace("COUNT", "600")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"interpreter died or raised (rc {p.returncode}):\n{p.stdout}\n{p.stderr[-3000:]}"
    assert "refused" in p.stdout
