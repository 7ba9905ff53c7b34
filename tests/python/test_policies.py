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
    ref = mc.eplb(t.sum(axis=0, dtype=np.float16).astype(np.float32), 24, 4, 2, 4, hierarchical=False)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    assert t.sum(axis=0, dtype=np.float16)[0, 0] == 2048 and t.astype(np.float32).sum(axis=0)[0, 0] == 2049
    torch = torch_or_skip()
    tb = torch.tensor(t.astype(np.float32)).to(torch.bfloat16)
    got = sglang_rebalance(tb, 24, 6, 4, 2, "deepseek")
    ref = mc.eplb(tb.sum(dim=0).float().numpy(), 24, 4, 2, 4, hierarchical=False)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a.numpy(), b)
