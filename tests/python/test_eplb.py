"""EPLB from Python against eplb.py's own outputs (96 cases recorded under torch 2.15)."""
import json

import numpy as np
import pytest

import moe_compose as mc
from conftest import DATA, torch_or_skip

CASES = json.loads((DATA / "eplb-torch" / "cases.json").read_text())["cases"]


def _args(c):
    return c["num_replicas"], c["num_groups"], c["num_nodes"], c["num_gpus"]


@pytest.mark.parametrize("i", range(len(CASES)))
def test_identical_to_eplb_py(i):
    c = CASES[i]
    phy2log, log2phy, logcnt = mc.rebalance_experts(np.array(c["weight"], dtype=np.float32), *_args(c))
    assert phy2log.dtype == np.int64 and log2phy.dtype == np.int64 and logcnt.dtype == np.int64
    np.testing.assert_array_equal(phy2log, c["phy2log"])
    np.testing.assert_array_equal(log2phy, c["log2phy"])
    np.testing.assert_array_equal(logcnt, c["logcnt"])


def test_float64_and_int_inputs_give_the_float32_plan():
    c = CASES[0]
    ref = mc.rebalance_experts(np.array(c["weight"], dtype=np.float32), *_args(c))
    got = mc.rebalance_experts(np.array(c["weight"], dtype=np.float64), *_args(c))
    for a, b in zip(ref, got):
        np.testing.assert_array_equal(a, b)
    ints = mc.rebalance_experts(np.arange(24).reshape(2, 12), 16, 4, 2, 8)[0]
    np.testing.assert_array_equal(ints, mc.rebalance_experts(np.arange(24, dtype=np.float32).reshape(2, 12), 16, 4, 2, 8)[0])


def test_torch_inputs():
    torch = torch_or_skip()
    for c in CASES[:8]:
        w = torch.tensor(c["weight"], dtype=torch.float32)
        phy2log, log2phy, logcnt = mc.rebalance_experts(w, *_args(c))
        np.testing.assert_array_equal(phy2log, c["phy2log"])
        np.testing.assert_array_equal(log2phy, c["log2phy"])


def test_explicit_policy():
    c = next(c for c in CASES if c["num_groups"] % c["num_nodes"] == 0 and c["num_nodes"] > 1)
    w = np.array(c["weight"], dtype=np.float32)
    np.testing.assert_array_equal(mc.eplb(w, *_args(c), hierarchical=True)[0], c["phy2log"])
    glob = mc.eplb(w, *_args(c), hierarchical=False)[0]
    np.testing.assert_array_equal(glob, mc.eplb(w, c["num_replicas"], 1, 1, c["num_gpus"])[0])
