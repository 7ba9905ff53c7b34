"""Issue 37 item 5: Python errors name the argument that is wrong, with (layer, expert) positions."""
import numpy as np
import pytest

import moe_compose as mc

W = np.random.default_rng(0).gamma(0.7, 100, size=(2, 16))


def test_wrong_loads_shape_is_blamed_on_loads():
    phy = mc.eplb(W.astype(np.float32), 24, 1, 1, 4)[0]
    with pytest.raises(ValueError, match=r"loads has 8 experts per layer.*\[layers, experts\]"):
        mc.evaluate_plan(mc.fat_tree(1, 2, 2, 1), phy, W[:, :8])
    with pytest.raises(ValueError, match="loads has 1 layers, phy2log 2"):
        mc.evaluate_plan(mc.fat_tree(1, 2, 2, 1), phy, W[:1])


def test_experts_zero_is_named():
    with pytest.raises(ValueError, match="experts must be positive, got 0"):
        mc.import_vllm_routed_experts("unused.json", 0)


def test_nan_positions_as_layer_expert():
    bad = W.copy()
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"loads: layer 1, expert 3 is nan"):
        mc.ilp_load(mc.fat_tree(1, 2, 2, 1), bad)
    with pytest.raises(ValueError, match=r"loads: layer 1, expert 3 is nan"):
        mc.joint(mc.fat_tree(1, 2, 2, 1), bad)
    with pytest.raises(ValueError, match=r"loads: batch 0, layer 1, expert 3 is nan"):
        mc.craft(bad, 4)


def test_ilp_load_negative_capacity_rejected():
    with pytest.raises(ValueError, match="c_layer=-1"):
        mc.ilp_load(mc.fat_tree(1, 2, 2, 1), W, c_layer=-1)


def test_slot_map_refuses_nan_and_negative_loads():
    """slot_map's loads rank the experts for the spare slots: NaN or negative ones are refused, as
    every other planner's loads are, not silently used."""
    copies = [[[0], [1], [0]]]  # 3 experts on 2 GPUs: GPU 0 has a spare slot
    np.testing.assert_array_equal(mc.slot_map(copies, 2, [[1.0, 2.0, 3.0]]), [[0, 2, 1, 1]])
    with pytest.raises(ValueError, match=r"loads: layer 0, expert 2 is nan"):
        mc.slot_map(copies, 2, [[1.0, 2.0, np.nan]])
    with pytest.raises(ValueError, match=r"loads: layer 0, expert 0 is -1.0"):
        mc.slot_map(copies, 2, [[-1.0, 2.0, 3.0]])
