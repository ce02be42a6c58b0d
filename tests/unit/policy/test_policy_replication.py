"""Hot-spot replication orders and the P/D imbalance factor."""

from __future__ import annotations

import pytest
from policy_helpers import chain, index_with, prefill

from crescent.conductor.policy import BandwidthTable, BlockHeat, PrefillChoice, ReplicationReason
from crescent.conductor.policy.imbalance import imbalance_factor, slo_load, trimmed_mean
from crescent.conductor.policy.replication import (
    HotSpotConfig,
    hot_spot_orders,
    on_demand_order,
    rank_target_nodes,
)

SYS = chain("system-prompt", 3)


def test_on_demand_order_only_when_the_choice_pulls():
    pulled = PrefillChoice("b", "nb", 96, 0, "na", tuple(SYS), 0.01, 0.0, 0.001)
    order = on_demand_order(pulled)
    assert (order.source_node, order.target_node, order.hashes, order.reason) == (
        "na",
        "nb",
        tuple(SYS),
        ReplicationReason.ON_DEMAND,
    )
    assert on_demand_order(PrefillChoice("a", "na", 96, 96, None, (), 0.0, 0.0, 0.001)) is None


def hot_index():
    index = index_with({"n0": SYS, "n1": SYS[:1]})
    heat = BlockHeat(index)
    cold = chain("cold", 1)
    index.add_many(cold, "n2")
    for t in range(10):
        heat.record_hits(SYS, now=float(t))
    heat.record_hits(cold, now=9.0)
    return heat


def test_hot_pass_replicates_hot_prefixes_whole_onto_the_least_loaded_nodes():
    index = hot_index()
    targets = rank_target_nodes(
        [
            prefill("a", "n2", queue_s=0.5),
            prefill("b", "n1", queue_s=0.1),
            prefill("c", "n3", queue_s=0.1),
            prefill("d", "n4", is_stale=True),
        ]
    )
    assert targets == ["n1", "n3", "n2"]
    orders = hot_spot_orders(
        index,
        targets,
        BandwidthTable(1e9, {("n1", "n3"): 2e9}),
        now=9.0,
        config=HotSpotConfig(num_hottest=10, replica_cap=3, min_hits=5.0),
    )
    summary = [(o.source_node, o.target_node, o.hashes, o.reason) for o in orders]
    assert summary == [
        ("n0", "n1", tuple(SYS[1:]), ReplicationReason.HOT_SPOT),  # n1 already has block 0
        ("n1", "n3", (SYS[0],), ReplicationReason.HOT_SPOT),  # the faster link for block 0
    ]
    # SYS[0] now has 3 replicas planned (n0, n1, n3): the cap. The cold block got none.


def test_hot_pass_respects_the_cap_and_the_hit_floor():
    index = hot_index()
    assert (
        hot_spot_orders(index, ["n1", "n3"], BandwidthTable(), 9.0, HotSpotConfig(replica_cap=1))
        == []
    )
    assert (
        hot_spot_orders(index, ["n1", "n3"], BandwidthTable(), 9.0, HotSpotConfig(min_hits=100))
        == []
    )
    assert (
        hot_spot_orders(
            index, ["n1", "n3"], BandwidthTable(), 9.0 + 3600, HotSpotConfig(min_hits=1)
        )
        == []
    )


def test_trimmed_mean_drops_a_tenth_from_each_end():
    samples = [100.0] + [1.0] * 8 + [-100.0]
    assert trimmed_mean(samples) == 1.0
    assert trimmed_mean([1.0, 2.0, 3.0]) == 2.0  # fewer than 10 samples: nothing to drop
    with pytest.raises(ValueError):
        trimmed_mean([])


def test_imbalance_factor_points_at_the_overloaded_side():
    decode_busy = imbalance_factor([slo_load(3.0, 30.0)] * 10, [slo_load(0.3, 0.1)] * 10)
    assert decode_busy == pytest.approx((3.0 + 1) / (0.1 + 1))
    assert imbalance_factor([2.0] * 5, [0.5] * 5) == pytest.approx(1.5 / 3.0)
    outlier = imbalance_factor([0.5] * 9 + [50.0], [0.5] * 10)
    assert outlier == pytest.approx(1.0)
