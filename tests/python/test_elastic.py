"""Issue 34: the vLLM drop-in on the calls vLLM's elastic EP and hierarchical EPLB make.

Scale-down: vLLM (eplb_state.py, rearrange with a rank_mapping) passes the old, wider map: ranks
[num_ranks, old ranks) leave, ranks below keep their index (rebalance_execute.py's rank mapping).
Scale-up: new slots arrive as -1 (reconfigure_physical_expert_slots). The group-to-node rule: when
EPLB would use its hierarchical policy (num_groups % num_nodes == 0), every expert group's copies
stay on one node. The references are independent: the plan's validity and loads are recomputed
here, and EPLB from scratch (eplb.py's plan, checked against torch elsewhere) is the balance bound."""
import threading

import numpy as np
import pytest

import moe_compose as mc
from moe_compose.vllm import MoeComposeEplbPolicy

Policy = MoeComposeEplbPolicy


def gpu_loads(w, row, gpus):
    cnt = np.bincount(row, minlength=w.shape[0])
    per = w[row] / cnt[row]
    return per.reshape(gpus, -1).sum(axis=1)


def check_valid(new, experts, slots):
    assert new.shape[1] == slots and new.dtype == np.int64
    for row in new:
        assert row.min() >= 0 and row.max() < experts
        assert (np.bincount(row, minlength=experts) >= 1).all(), "every expert has a slot"


def copies(old, new, gpus_new, S):
    """Slots of the new map whose rank held no copy of their expert before (old: per old rank)."""
    n = 0
    for l in range(new.shape[0]):
        for p in range(new.shape[1]):
            g = p // S
            held = old[l, g * S:(g + 1) * S] if (g + 1) * S <= old.shape[1] else np.array([], dtype=np.int64)
            n += int(new[l, p] not in held)
    return n


def scattered(row, experts, groups, nodes, gpus, S):
    """(group) of one layer whose copies sit on more than one node."""
    per_node = gpus // nodes
    gsize = experts // groups
    node_sets = [set() for _ in range(groups)]
    for p, e in enumerate(row):
        node_sets[e // gsize].add((p // S) // per_node)
    return sum(len(s) > 1 for s in node_sets)


def drift(rng, w):
    return (w * rng.uniform(0.75, 1.25, size=w.shape)).astype(np.float32)


def test_scale_down_old_map_wider_than_num_replicas():
    rng = np.random.default_rng(1)
    L, E, S = 4, 16, 6
    w0 = rng.gamma(0.7, 100, size=(L, E)).astype(np.float32)
    old = Policy.rebalance_experts(w0, 4 * S, 1, 1, 4)  # 4 ranks
    w1 = drift(rng, w0)
    new = Policy.rebalance_experts(w1, 3 * S, 1, 1, 3, old)  # rank 3 leaves
    check_valid(new, E, 3 * S)
    # Experts of the departed rank re-homed; what stays on ranks 0..2 mostly stays.
    ref = mc.eplb(w1, 3 * S, 1, 1, 3)[0]
    for l in range(L):
        assert gpu_loads(w1[l], new[l], 3).max() <= 1.01 * gpu_loads(w1[l], ref[l], 3).max() * (1 + 1e-6)
    departed_only = sum(len(set(old[l, 3 * S:]) - set(old[l, :3 * S])) for l in range(L))
    moved = copies(old, new, 3, S)
    assert moved >= departed_only
    assert moved < copies(old, ref, 3, S)


def test_scale_up_new_slots_arrive_as_minus_one():
    rng = np.random.default_rng(2)
    L, E, S = 4, 16, 6
    w0 = rng.gamma(0.7, 100, size=(L, E)).astype(np.float32)
    old = Policy.rebalance_experts(w0, 3 * S, 1, 1, 3)
    padded = np.concatenate([old, np.full((L, S), -1, dtype=np.int64)], axis=1)  # rank 3 joins
    w1 = drift(rng, w0)
    new = Policy.rebalance_experts(w1, 4 * S, 1, 1, 4, padded)
    check_valid(new, E, 4 * S)
    ref = mc.eplb(w1, 4 * S, 1, 1, 4)[0]
    for l in range(L):
        assert gpu_loads(w1[l], new[l], 4).max() <= 1.01 * gpu_loads(w1[l], ref[l], 4).max() * (1 + 1e-6)
    # The new rank's S slots must be filled, by copies; the old ranks move little.
    moved = copies(padded, new, 4, S)
    assert L * S <= moved < copies(padded, ref, 4, S)


def test_scale_up_and_down_through_rebalance_reports_sources():
    rng = np.random.default_rng(3)
    L, E, S = 2, 12, 4
    w = rng.gamma(0.7, 100, size=(L, E)).astype(np.float32)
    old = mc.eplb(w, 4 * S, 1, 1, 4)[0]
    r = mc.rebalance(drift(rng, w), old, 3, num_replicas=3 * S)
    assert r.phy2log.shape == (L, 3 * S)
    for layer, slot, expert, src, dst in r.transfers:
        assert dst == slot // S and src != dst
        assert expert in old[layer, src * S:(src + 1) * S]  # a departed rank (src 3) may send
    assert int(r.copies.sum()) == len(r.transfers) == copies(old, r.phy2log, 3, S)


def test_group_rule_kept_on_deepseek_v3_shape():
    """DeepSeek-V3: 256 experts in 8 groups, 288 slots on 32 GPUs in 4 nodes (the drift benchmark's
    shape, fewer layers): EPLB's hierarchical policy keeps every group on one node; so must we."""
    rng = np.random.default_rng(4)
    L, E, P, G, N, groups = 6, 256, 288, 32, 4, 8
    w = rng.gamma(0.7, 100, size=(L, E)).astype(np.float32)
    old = mc.eplb(w, P, groups, N, G)[0]
    total_copies = 0
    for step in range(4):
        w = drift(rng, w)
        r = mc.rebalance(w, old, G, num_groups=groups, num_nodes=N)
        assert r.group_rule
        for l in range(L):
            assert scattered(r.phy2log[l], E, groups, N, G, P // G) == 0
        np.testing.assert_array_equal(r.scattered_groups, 0)
        assert (r.max_load <= 1.01 * r.eplb_max_load * (1 + 1e-9)).all()
        total_copies += int(r.copies.sum())
        old = r.phy2log
    assert total_copies < 0.2 * 4 * L * P  # few moves


def test_group_rule_not_applicable_says_so():
    rng = np.random.default_rng(5)
    w = rng.gamma(0.7, 100, size=(2, 12)).astype(np.float32)
    old = mc.eplb(w, 16, 3, 1, 4)[0]
    r = mc.rebalance(drift(rng, w), old, 4, num_groups=3, num_nodes=2)  # 3 groups do not split over 2 nodes
    assert not r.group_rule  # EPLB's global policy, as eplb.py falls back


def test_num_gpus_not_divisible_by_nodes_plans_like_default():
    """groups % nodes != 0 and gpus % nodes != 0: vLLM's default plans (global policy); so do we."""
    rng = np.random.default_rng(6)
    w = rng.gamma(0.7, 100, size=(2, 12)).astype(np.float32)
    old = Policy.rebalance_experts(w, 15, 3, 2, 5)
    new = Policy.rebalance_experts(drift(rng, w), 15, 3, 2, 5, old)
    check_valid(new, 12, 15)




@pytest.mark.parametrize("num_replicas, num_groups, num_nodes, num_ranks", [
    (16, 5, 1, 4),   # 12 experts do not split into 5 groups (hierarchical)
    (18, 4, 2, 4),   # 18 slots do not split over 4 ranks
    (8, 4, 2, 4),    # fewer slots than experts
    (16, 4, 2, 3),   # 3 ranks do not split over 2 nodes (hierarchical)
])
def test_invalid_parameters_raise_assertion_error_as_vllm(num_replicas, num_groups, num_nodes, num_ranks):
    w = np.ones((2, 12), dtype=np.float32)
    with pytest.raises(AssertionError):
        Policy.rebalance_experts(w, num_replicas, num_groups, num_nodes, num_ranks)
    old = np.tile(np.arange(16) % 12, (2, 1))
    with pytest.raises(AssertionError):
        Policy.rebalance_experts(w, num_replicas, num_groups, num_nodes, num_ranks, old)


def test_no_shared_class_state_between_calls():
    assert not hasattr(Policy, "last")
    rng = np.random.default_rng(7)
    results = {}

    def call(i):
        w = rng_local = np.random.default_rng(100 + i).gamma(0.7, 100, size=(3, 32)).astype(np.float32)
        old = mc.eplb(w, 40, 4, 2, 8)[0]
        phy, details = Policy.rebalance_experts_with_details(drift(np.random.default_rng(i), w), 40, 4, 2, 8, old)
        results[i] = (phy, details, old, rng_local)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (phy, details, old, _) in results.items():
        np.testing.assert_array_equal(phy, details.phy2log)
        assert int(details.copies.sum()) == copies(old, phy, 8, 5)
