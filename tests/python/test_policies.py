"""The drop-in policies: vLLM's rebalance_experts interface and SGLang's, with numpy inputs (no
engine, no torch needed) and with torch inputs where torch is importable (skipped otherwise)."""
import json

import numpy as np
import pytest

import moe_compose as mc
from moe_compose.sglang import rebalance_experts as sglang_rebalance
from moe_compose.vllm import MoeComposeEplbPolicy
from conftest import DATA, torch_or_skip

CASES = json.loads((DATA / "eplb-torch" / "cases.json").read_text())["cases"]


def test_vllm_policy_without_old_placement_is_eplb():
    for c in CASES[:12]:
        w = np.array(c["weight"], dtype=np.float32)
        got = MoeComposeEplbPolicy.rebalance_experts(w, c["num_replicas"], c["num_groups"], c["num_nodes"], c["num_gpus"])
        np.testing.assert_array_equal(got, c["phy2log"])


def test_vllm_policy_with_old_placement_moves_little():
    rng = np.random.default_rng(0)
    w0 = rng.gamma(0.7, 100, size=(4, 64)).astype(np.float32)
    old = MoeComposeEplbPolicy.rebalance_experts(w0, 80, 8, 2, 16)
    w1 = (w0 * rng.uniform(0.75, 1.25, size=w0.shape)).astype(np.float32)
    new, r = MoeComposeEplbPolicy.rebalance_experts_with_details(w1, 80, 8, 2, 16, old)
    assert new.shape == old.shape and new.dtype == np.int64
    np.testing.assert_array_equal(new, MoeComposeEplbPolicy.rebalance_experts(w1, 80, 8, 2, 16, old))
    assert r is not None and (r.max_load <= 1.01 * r.eplb_max_load * (1 + 1e-9)).all()
    assert int(r.copies.sum()) < 0.3 * old.size
    with pytest.raises(ValueError, match="not whole GPUs of 5 slots"):
        MoeComposeEplbPolicy.rebalance_experts(w1, 80, 8, 2, 16, old[:, :64])


def test_vllm_policy_torch_in_torch_out():
    torch = torch_or_skip()
    c = CASES[0]
    w = torch.tensor(c["weight"], dtype=torch.float32)
    got = MoeComposeEplbPolicy.rebalance_experts(w, c["num_replicas"], c["num_groups"], c["num_nodes"], c["num_gpus"])
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64
    new = MoeComposeEplbPolicy.rebalance_experts(w * 1.1, c["num_replicas"], c["num_groups"], c["num_nodes"],
                                                 c["num_gpus"], got)
    assert isinstance(new, torch.Tensor) and torch.equal(new, got)  # uniform scaling: nothing moves


def test_vllm_policy_subclasses_vllms_abstract_policy_when_importable():
    abstract = pytest.importorskip("vllm.distributed.eplb.policy.abstract", reason="vLLM is not importable")
    assert issubclass(MoeComposeEplbPolicy, abstract.AbstractEplbPolicy)


@pytest.mark.parametrize("algorithm", ["deepseek", "deepseek_hierarchical"])
def test_sglang_matches_eplb(algorithm):
    for c in CASES[:12]:
        w = np.array(c["weight"], dtype=np.float32)
        per_rank = np.stack([w / 2, w / 2])  # [X, layers, experts], summed by SGLang
        phy2log, log2phy, logcnt = sglang_rebalance(per_rank, c["num_replicas"], c["num_replicas"] // c["num_gpus"],
                                                    c["num_groups"], c["num_nodes"], algorithm)
        ref = mc.eplb(per_rank.sum(axis=0), c["num_replicas"], c["num_groups"], c["num_nodes"], c["num_gpus"],
                      hierarchical=algorithm == "deepseek_hierarchical")
        for a, b in zip((phy2log, log2phy, logcnt), ref):
            np.testing.assert_array_equal(a, b)
        if algorithm == "deepseek_hierarchical" and c["num_groups"] % c["num_nodes"] == 0:
            np.testing.assert_array_equal(phy2log, c["phy2log"])


def test_sglang_enum_torch_and_unsupported():
    class Algo:  # SGLang passes an EplbAlgorithm enum member: only its name is read
        name = "deepseek_vec"

    with pytest.raises(NotImplementedError, match="deepseek_vec"):
        sglang_rebalance(np.ones((1, 2, 12)), 16, 2, 4, 2, Algo())
    with pytest.raises(ValueError, match=r"\[X, layers, experts\]"):
        sglang_rebalance(np.ones((2, 12)), 16, 2, 4, 2, "deepseek")
    torch = torch_or_skip()
    c = CASES[0]
    t = torch.tensor(c["weight"], dtype=torch.float32)[None]
    out = sglang_rebalance(t, c["num_replicas"], c["num_replicas"] // c["num_gpus"], c["num_groups"], c["num_nodes"],
                           "deepseek_hierarchical")
    assert all(isinstance(x, torch.Tensor) for x in out)
    assert out[0].tolist() == c["phy2log"]


def test_plugins_act_only_when_asked(monkeypatch):
    import moe_compose.sglang
    import moe_compose.vllm

    monkeypatch.delenv("MOE_COMPOSE_VLLM_EPLB", raising=False)
    monkeypatch.delenv("MOE_COMPOSE_SGLANG_EPLB", raising=False)
    assert moe_compose.vllm.register() is False
    assert moe_compose.sglang.plugin() is False


def test_sglang_sums_in_the_callers_dtype():
    """SGLang sums tokens_per_expert over its first axis in the caller's dtype (then float32): in
    float16, 2048 + 1 stays 2048. The real SGLang is compared in every dtype by
    tests/engines/sglang_eplb.py (scripts/engine_check.sh)."""
    rng = np.random.default_rng(9)
    t = rng.gamma(0.6, 3000.0, size=(3, 2, 16)).astype(np.float16)
    t[0, 0, :2], t[1, 0, :2], t[2, 0, :2] = 2048, 1, 0  # expert 0 and 1 of layer 0: 2048 in float16
    got = sglang_rebalance(t, 24, 6, 4, 2, "deepseek")
    # torch's sum of a float16 tensor accumulates in float32 and rounds to float16 once.
    summed = t.astype(np.float32).sum(axis=0).astype(np.float16)
    ref = mc.eplb(summed.astype(np.float32), 24, 4, 2, 4, hierarchical=False)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    assert summed[0, 0] == 2048 and t.astype(np.float32).sum(axis=0)[0, 0] == 2049
    torch = torch_or_skip()
    tb = torch.tensor(t.astype(np.float32)).to(torch.bfloat16)
    got = sglang_rebalance(tb, 24, 6, 4, 2, "deepseek")
    ref = mc.eplb(tb.sum(dim=0).float().numpy(), 24, 4, 2, 4, hierarchical=False)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a.numpy(), b)


def _eplb_of(summed, phy, local, groups, nodes, algorithm):
    return mc.eplb(np.asarray(summed, dtype=np.float32), phy, groups, nodes, phy // local,
                   hierarchical=algorithm == "deepseek_hierarchical")


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.uint16, np.int32])
def test_sglang_numpy_integer_counts_do_not_wrap(dtype):
    """SGLang sums tokens_per_expert with torch, which sums every integer dtype in int64: numpy
    counts of a narrow dtype must not wrap around (2 x 40000 in uint16 is 14464)."""
    info = np.iinfo(dtype)
    t = np.full((3, 2, 8), info.max // 16, dtype=dtype)
    t[:, :, 0] = info.max // 2 + 1  # the hottest expert: 3 x this overflows the dtype (wraps low or negative)
    t[:, :, 1] = info.max // 4      # 3 x this fits
    t[:, 1, 5] = 0
    exact = t.astype(np.int64).sum(axis=0)
    for algorithm in ("deepseek", "deepseek_hierarchical"):
        got = sglang_rebalance(t, 12, 3, 2, 2, algorithm)
        ref = _eplb_of(exact, 12, 3, 2, 2, algorithm)
        for a, b in zip(got, ref):
            np.testing.assert_array_equal(a, b)
        assert (got[2][:, 0] == got[2].max(axis=1)).all(), "the hottest expert gets the most copies"


@pytest.mark.parametrize("dtype", ["uint8", "int16", "int32"])
def test_torch_sums_integer_counts_in_int64(dtype):
    """The reference of the test above: torch.sum of an integer tensor is int64 and does not wrap."""
    torch = torch_or_skip()
    t = torch.full((3, 4), int(np.iinfo(dtype).max) // 2 + 1, dtype=getattr(torch, dtype))
    s = t.sum(dim=0)
    assert s.dtype == torch.int64 and (s == 3 * (int(np.iinfo(dtype).max) // 2 + 1)).all()


def test_sglang_numpy_float16_sums_like_torch():
    """torch sums float16 in float32 and rounds once: 2048 + 1 + 1 is 2050, where a float16
    running sum stays at 2048."""
    t = np.zeros((3, 1, 8), dtype=np.float16)
    t[:, 0, :] = [[2048, 2049, 1, 7, 3, 5, 9, 11], [1, 0, 1, 2, 3, 4, 5, 6], [1, 0, 2045, 0, 0, 0, 0, 0]]
    t[0, 0, 1] = 2050  # 2050 + 0 + 0 in both
    summed = t.astype(np.float32).sum(axis=0).astype(np.float16)
    assert summed[0, 0] == 2050 and t.sum(axis=0, dtype=np.float16)[0, 0] == 2048
    got = sglang_rebalance(t, 10, 5, 1, 1, "deepseek")
    ref = _eplb_of(summed, 10, 5, 1, 1, "deepseek")
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)


def test_torch_sums_float16_in_float32():
    """The reference of the test above: torch's float16 sum rounds once, 2048 + 1 + 1 = 2050."""
    torch = torch_or_skip()
    t = torch.tensor([[2048.0], [1.0], [1.0]], dtype=torch.float16)
    assert t.sum(dim=0).item() == 2050


# Two GPUs of three slots, six experts, no redundancy (SGLang's global policy): the plan is
# balanced_packing of the loads. After 2^24, 2^24 and 1 the GPUs weigh 2^24 + 1 and 2^24; eplb.py
# sums pack weights in float32 (2^24 + 1 rounds to 2^24: a tie, the next 1 joins GPU 0), SGLang
# 0.5.23's deepseek.py sums weight.tolist() in Python floats (the next 1 goes to GPU 1).
TIE = np.array([[[16777216.0, 16777216.0, 1.0, 1.0, 0.75, 0.5]]], dtype=np.float32)


def test_sglang_packs_like_sglangs_deepseek_py():
    phy2log, log2phy, logcnt = sglang_rebalance(TIE, 6, 3, 1, 1, "deepseek")
    np.testing.assert_array_equal(phy2log, [[0, 2, 4, 1, 3, 5]])  # SGLang's plan (double pack weights)
    np.testing.assert_array_equal(mc.eplb(TIE[0], 6, 1, 1, 2)[0], [[0, 2, 3, 1, 4, 5]])  # eplb.py's (float32)
    np.testing.assert_array_equal(logcnt, np.ones((1, 6)))
    np.testing.assert_array_equal(log2phy[0, :, 0], [0, 3, 1, 4, 2, 5])


def test_sglang_matches_sglangs_own_code_on_ties():
    """SGLang's own eplb_algorithms.rebalance_experts (when SGLang is importable) on the case above and
    on tie-heavy counts: bfloat16 sums and large integer counts whose pack sums pass 2^24."""
    torch = torch_or_skip()
    algorithms = pytest.importorskip("sglang.srt.eplb.eplb_algorithms", reason="SGLang is not importable")
    original = algorithms.rebalance_experts
    if getattr(original, "__module__", "") == "moe_compose.sglang":
        import moe_compose.sglang as ours_mod
        original = ours_mod._original
    rng = np.random.default_rng(5)
    cases = [(torch.tensor(TIE), 6, 3, 1, 1)]
    for _ in range(12):
        x = rng.gamma(0.6, 3000.0, size=(2, 3, 120))
        cases.append((torch.tensor(x).to(torch.bfloat16), 176, 11, 8, 4))
        cases.append((torch.tensor(np.rint(x * 3000)).to(torch.int64), 176, 11, 8, 4))
    for t, phy, local, groups, nodes in cases:
        for name in ("deepseek", "deepseek_hierarchical"):
            algo = algorithms.EplbAlgorithm[name]
            ref = original(t, phy, local, groups, nodes, algo)
            got = sglang_rebalance(t, phy, local, groups, nodes, algo)
            for a, b in zip(got, ref):
                assert torch.equal(a, b), (name, tuple(t.shape), str(t.dtype))
