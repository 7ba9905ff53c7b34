"""moe_compose.BatchSplit, the per-batch replica split over an engine's slots, against a brute force
that shares nothing with it: every way of splitting each expert's pairs over its copies is tried,
and the best by (largest GPU load, then pairs on their own GPU, then on their own server) is the
reference. Seeded synthetic layouts and counts (numpy's default_rng), small enough to enumerate."""
import itertools

import numpy as np
import pytest

import moe_compose as mc


def compositions(n, k):
    """Every way of writing n as an ordered sum of k non-negative integers."""
    if k == 1:
        yield (n,)
        return
    for first in range(n + 1):
        for rest in compositions(n - first, k - 1):
            yield (first,) + rest


def brute_force(phy2log, gpus, per_server, counts):
    """(max load, local, same server) of the best split: over all amounts each copy (distinct GPU of
    an expert) receives; for given amounts, the pairs that can stay on their GPU are, per copy, the
    smaller of what it receives and what its own GPU sends, and on their server, per (expert,
    server), the smaller of what the server's copies receive and what its GPUs send."""
    S = len(phy2log) // gpus
    experts = counts.shape[1]
    copies = [sorted({p // S for p in range(len(phy2log)) if phy2log[p] == e}) for e in range(experts)]
    server = [g // per_server for g in range(gpus)]
    choices = [list(compositions(int(counts[:, e].sum()), len(copies[e]))) for e in range(experts)]
    best = None
    for ys in itertools.product(*choices):
        load = [0] * gpus
        local = same = 0
        for e, y in enumerate(ys):
            recv, sent = {}, {}
            for g, amount in zip(copies[e], y):
                load[g] += amount
                local += min(amount, int(counts[g, e]))
                recv[server[g]] = recv.get(server[g], 0) + amount
            for g in range(gpus):
                sent[server[g]] = sent.get(server[g], 0) + int(counts[g, e])
            same += sum(min(r, sent[s]) for s, r in recv.items())
        key = (max(load), -local, -same)
        if best is None or key < best:
            best = key
    return best[0], -best[1], -best[2]


def random_case(rng):
    """A layout of 2-4 GPUs (1 or 2 servers), 3-5 experts, 1-3 slots per GPU holding every expert,
    and counts of 0-3 pairs per (GPU, expert); drawn again while the brute force would try more than
    20,000 splits."""
    while True:
        servers, per_server = int(rng.integers(1, 3)), int(rng.integers(1, 3))
        if servers * per_server == 1:
            per_server = 2
        gpus = servers * per_server
        experts = int(rng.integers(3, 6))
        S = int(rng.integers(-(-experts // gpus), 4))
        phy2log = np.concatenate([np.arange(experts), rng.integers(0, experts, size=gpus * S - experts)])
        rng.shuffle(phy2log)
        counts = rng.integers(0, 4, size=(gpus, experts))
        tries = 1
        for e in range(experts):
            k = len({p // S for p in range(gpus * S) if phy2log[p] == e})
            n = int(counts[:, e].sum())
            tries *= len(list(compositions(n, k))) if k > 1 else 1
        if tries <= 20000:
            return phy2log, gpus, per_server, counts


def deal_pairs(rng, counts_row):
    """A rank's topk_ids with exactly counts_row[e] pairs of expert e, in a random token order, as
    [tokens, 1] (the split deals pairs in token order whatever their k)."""
    ids = np.repeat(np.arange(len(counts_row)), counts_row)
    rng.shuffle(ids)
    return ids.reshape(-1, 1)


def test_split_equals_brute_force_and_dispatch_delivers_it():
    rng = np.random.default_rng(20261205)
    cases = 0
    for _ in range(300):
        phy2log, gpus, per_server, counts = random_case(rng)
        S = len(phy2log) // gpus
        want = brute_force(phy2log, gpus, per_server, counts)
        split = mc.BatchSplit(phy2log, gpus, per_server)
        out = split.plan(counts)
        assert (out["max_load"], out["local"], out["same_server"]) == want, (phy2log.tolist(), counts.tolist())
        # dispatch: every pair to a slot of its expert; the GPUs receive plan()'s loads and the local
        # and same-server pairs are plan()'s
        load = np.zeros(gpus, dtype=np.int64)
        local = same = 0
        for r in range(gpus):
            topk = deal_pairs(rng, counts[r])
            slots = split.dispatch(r, topk)
            assert slots.shape == topk.shape and slots.dtype == np.int64
            assert (phy2log[slots] == topk).all()
            g = slots // S
            np.add.at(load, g.ravel(), 1)
            local += int((g == r).sum())
            same += int((g // per_server == r // per_server).sum())
            np.testing.assert_array_equal(split.dispatch(r, topk), slots)  # deterministic
        np.testing.assert_array_equal(load, out["load"])
        assert load.max() == out["max_load"] and local == out["local"] and same == out["same_server"]
        cases += 1
    assert cases == 300


def test_hot_expert_and_empty_batch():
    # 4 GPUs on 2 servers, expert 0 on every GPU: all of a batch's pairs to expert 0 spread evenly
    phy2log = np.array([0, 1, 0, 2, 0, 3, 0, 1])
    split = mc.BatchSplit(phy2log, 4, 2)
    counts = np.zeros((4, 4), dtype=np.int64)
    counts[1, 0] = 10
    out = split.plan(counts)
    assert out["max_load"] == 3 and out["load"].sum() == 10
    assert out["local"] == 3 and out["same_server"] == 6
    out = split.plan(np.zeros((4, 4), dtype=np.int64))
    assert out["max_load"] == 0 and out["local"] == 0 and not out["load"].any()
    assert split.dispatch(2, np.zeros((0, 8), dtype=np.int64)).shape == (0, 8)


def test_two_slots_of_one_expert_on_one_gpu_serve_as_one_copy():
    phy2log = np.array([0, 0, 1, 1, 2, 0])  # GPU 0: experts 0, 0, 1; GPU 1: 1, 2, 0
    split = mc.BatchSplit(phy2log, 2, 1)
    counts = np.array([[4, 0, 0], [0, 0, 2]])
    out = split.plan(counts)
    assert out["max_load"] == 3
    slots = split.dispatch(0, np.array([[0], [0], [0], [0]]))
    # three pairs to the first slot of expert 0 on GPU 0 (never the second), one to GPU 1's
    assert (slots == 0).sum() == 3 and (slots == 5).sum() == 1


def test_minus_one_entries_pass_through():
    split = mc.BatchSplit(np.array([0, 1, 1, 0]), 2, 2)
    split.plan(np.array([[1, 1], [0, 0]]))
    np.testing.assert_array_equal(split.dispatch(0, np.array([[0, -1], [-1, 1]])) >= 0, [[True, False], [False, True]])


def test_torch_inputs():
    torch = pytest.importorskip("torch", reason="torch is not installed: the torch-input variant is skipped")
    split = mc.BatchSplit(torch.tensor([0, 1, 2, 1]), 2, 1)
    out = split.plan(torch.tensor([[2, 1, 0], [0, 1, 3]], dtype=torch.int32))
    assert out["max_load"] == 4
    assert split.dispatch(1, torch.tensor([[1, 2], [2, 2]])).shape == (2, 2)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: mc.BatchSplit(np.array([0, 1, 2]), 2, 1), "3 slots do not split over 2 GPUs"),
        (lambda: mc.BatchSplit(np.array([0, 2, 2, 0]), 2, 1), "no slot for expert 1"),
        (lambda: mc.BatchSplit(np.array([0, -1, 1, 0]), 2, 1), "phy2log[1] = -1"),
        (lambda: mc.BatchSplit(np.array([0, 1, 1, 0]), 2, 3), "not a multiple of gpus_per_server"),
        (lambda: mc.BatchSplit(np.zeros(0, dtype=np.int64), 2, 1), "phy2log must have between 1 and"),
        (lambda: mc.BatchSplit(np.arange(70000) % 2, 70000, 1), "num_gpus must be in [1, 65536], got 70000"),
        (lambda: mc.BatchSplit(np.array([0, 1, 1, 0]), 2, 1, slack_permille=-1), "slack_permille must be in [0, 1000000]"),
        (lambda: mc.BatchSplit(np.array([0, 1, 1, 0]), 2, 1).plan(np.array([[2**31, 0], [0, 0]])),
         "counts[0][0] = 2147483648 is negative or above 2^31 - 1"),
        (lambda: mc.BatchSplit(np.array([0, 1, 1, 0]), 2, 1).plan(np.zeros((2, 3), dtype=np.int64)),
         "counts must be num_gpus x experts = 2 x 2, got 2 x 3"),
        (lambda: mc.BatchSplit(np.array([0, 1, 1, 0]), 2, 1).plan(np.array([[1, 0], [-2, 0]])), "counts[1][0] = -2"),
        (lambda: mc.BatchSplit(np.array([0, 1, 1, 0]), 2, 1).dispatch(0, np.array([[0]])), "dispatch before plan"),
    ],
)
def test_bad_input_is_named(make, message):
    with pytest.raises(ValueError) as e:
        make()
    assert message in str(e.value)


def test_dispatch_refuses_pairs_plan_was_not_given():
    split = mc.BatchSplit(np.array([0, 1, 1, 0]), 2, 1)
    split.plan(np.array([[2, 0], [0, 1]]))
    with pytest.raises(ValueError) as e:
        split.dispatch(0, np.array([[0], [1]]))
    assert "rank 0's topk_ids hold 1 pairs of expert 0, the counts given to plan() 2" in str(e.value)
    with pytest.raises(ValueError) as e:
        split.dispatch(1, np.array([[2]]))
    assert "topk_ids[0][0] = 2 is outside [0, 2)" in str(e.value)
    with pytest.raises(ValueError) as e:
        split.dispatch(2, np.array([[0]]))
    assert "rank 2 is outside [0, 2)" in str(e.value)


def test_refused_counts_leave_the_last_plan_in_force():
    split = mc.BatchSplit(np.array([0, 1, 2, 0, 1, 2]), 2, 1)
    counts = np.array([[3, 1, 0], [0, 2, 2]])
    split.plan(counts)
    topk = np.array([[0], [0], [1], [0]])
    before = split.dispatch(0, topk)
    with pytest.raises(ValueError) as e:
        split.plan(np.array([[9, 9, 9], [9, 9, -1]]))
    assert "counts[1][2] = -1" in str(e.value)
    np.testing.assert_array_equal(split.dispatch(0, topk), before)
