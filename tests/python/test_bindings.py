"""Topologies, the traffic model, CRAFT, ILPLoad, the joint planner, slot maps and the engines'
importers and plan files from Python, checked against independent computations and fixtures."""
import numpy as np
import pytest

import moe_compose as mc
from conftest import DATA


def test_topology_builders_and_hops():
    t = mc.fat_tree(2, 2, 4)
    assert (t.gpus, t.servers) == (16, 4)
    h = t.gpu_hops()
    assert h.shape == (16, 16) and (np.diag(h) == 0).all()
    assert t.hops(0, 3) == 0 and t.hops(0, 4) == 2 and t.hops(0, 8) == 4
    assert mc.paper_cluster("dragonfly").gpus == 256
    text = t.write()
    path = "/tmp/moe_compose_topo_test.tsv"
    open(path, "w").write(text)
    assert (mc.read_topology(path).gpu_hops() == h).all()


def test_evaluate_plan_loads_match_numpy():
    rng = np.random.default_rng(1)
    w = rng.gamma(0.7, 100, size=(3, 16))
    phy2log = mc.rebalance_experts(w, 20, 1, 1, 4)[0]
    r = mc.evaluate_plan(mc.fat_tree(1, 2, 2), phy2log, w)
    for l in range(3):
        cnt = np.bincount(phy2log[l], minlength=16)
        gpu = (w[l] / cnt)[phy2log[l]].reshape(4, 5).sum(axis=1)
        assert r["max_gpu_load"][l] == pytest.approx(gpu.max())
        assert r["mean_gpu_load"][l] == pytest.approx(w[l].sum() / 4)
    assert (r["dispatch_time"] > 0).all()


def test_rebalance_transfer_time_is_positive_and_inside_a_node_is_faster():
    rng = np.random.default_rng(2)
    w0 = rng.gamma(0.7, 100, size=(2, 32)).astype(np.float32)
    old = mc.rebalance_experts(w0, 40, 4, 2, 8)[0]
    r = mc.rebalance(w0 * rng.uniform(0.5, 1.5, size=w0.shape).astype(np.float32), old, 8, num_groups=4, num_nodes=2)
    t = r.transfer_time(mc.node_topology(8, 2), mc.expert_bytes())
    assert t["bytes"] == pytest.approx(len(r.transfers) * mc.expert_bytes())
    assert t["seconds"] == pytest.approx(t["layer_seconds"].sum())


def test_craft_ilp_joint_and_slot_map():
    rng = np.random.default_rng(3)
    prof = rng.gamma(0.7, 100, size=(6, 2, 16))
    c = mc.craft(prof, 4, replication_factor=1)
    assert c["primary"].shape == (2, 16) and len(c["copies"]) == 2
    for l in range(2):
        for e in range(16):
            assert c["primary"][l, e] == c["copies"][l][e][0]
    phy2log = mc.slot_map(c["copies"], 4, prof.sum(axis=0))
    for l in range(2):
        assert set(phy2log[l].tolist()) == set(range(16))
    topo = mc.fat_tree(2, 2, 1)
    ilp = mc.ilp_load(topo, prof.sum(axis=0))
    a = ilp["assignment"]
    assert a.shape == (2, 16) and (np.bincount(a.ravel(), minlength=4) <= ilp["c_exp"]).all()
    j = mc.joint(topo, prof.sum(axis=0))
    assert len(j["copies"]) == 2 and (j["max_load_ratio"] >= 1 - 1e-9).all()


def test_importers_on_the_engines_fixtures():
    s = mc.import_sglang_stat(DATA / "engine-formats" / "sglang-stat" / "expert_distribution_recorder_1763900000.123456.pt", 256)
    assert s["loads"].shape == (4, 58, 256) and s["loads"].sum() == 3801088
    assert s["decoder_layers"][0] == 3 and s["decoder_layers"][-1] == 60
    t = mc.import_trtllm_stat(DATA / "engine-formats" / "trtllm-expert-statistic", 256)
    assert t["loads"].shape == (2, 58, 256) and t["loads"].sum() == 1900544 and t["top_k"] == 8


@pytest.mark.parametrize("fmt", ["sglang", "trtllm", "vllm", "vllm-ascend"])
def test_engine_plan_round_trip(tmp_path, fmt):
    rng = np.random.default_rng(4)
    phy2log = mc.rebalance_experts(rng.gamma(0.7, 100, size=(5, 16)), 24, 4, 2, 8)[0]
    path = tmp_path / f"plan.{fmt}"
    mc.write_engine_plan(fmt, path, phy2log, 8, 16, hidden_layers=7, first_moe=2)
    back = mc.read_engine_plan(fmt, path, 8, 16, hidden_layers=7, first_moe=2)
    np.testing.assert_array_equal(back, phy2log)


@pytest.mark.parametrize("fmt", ["sglang", "trtllm", "vllm", "vllm-ascend"])
def test_engine_plan_round_trip_with_more_slots_per_gpu_than_experts(fmt, tmp_path):
    """A GPU may hold more slots than there are experts (two copies of one expert on it, as EPLB
    places them): every format reads back what its writer wrote."""
    phy2log = np.array([[0, 1, 2, 0, 1, 2, 0, 1], [2, 2, 1, 0, 0, 1, 2, 0]])  # 3 experts, 2 GPUs of 4 slots
    path = tmp_path / "plan"
    mc.write_engine_plan(fmt, path, phy2log, num_gpus=2, experts=3, hidden_layers=3, first_moe=1)
    np.testing.assert_array_equal(mc.read_engine_plan(fmt, path, 2, 3, 3, 1), phy2log)
