"""Algorithm 1 worked by hand: T_transfer + T_queue + T_prefill per instance, the balancing
threshold at, above and below its edge, ties, transfer sources and the §4.2 cost test."""

from __future__ import annotations

import random

import numpy as np
import pytest
from policy_helpers import BLOCK, chain, index_with, linear_predictors, prefill, request

from crescent.conductor.policy import BandwidthTable, CostPredictors, InstanceSnapshot
from crescent.conductor.policy.columns import InstanceColumns
from crescent.conductor.policy.kv_centric import choose_prefill, exceeds_threshold, price_local
from crescent.engine.cost_model import CostModel

H = chain("req", 6)
P = linear_predictors()  # prefill 1 ms per uncached token; 100 B of KV per token
BW = BandwidthTable(1e6)  # so a transferred token costs 0.1 ms


def choose(candidates, index, threshold=1.5, bandwidth=BW, predictors=P, req=None, **kw):
    req = req or request(H)
    return choose_prefill(
        req, candidates, index.match(req.block_hashes), bandwidth, predictors, threshold, **kw
    )


@pytest.mark.parametrize(
    ("best", "local", "threshold", "expected"),
    [
        (6, 4, 1.5, False),  # exactly at the threshold: compute (line 5 is a strict >)
        (6, 4, 1.49, True),  # just above
        (6, 4, 1.51, False),  # just below
        (6, 3, 1.5, True),
        (6, 0, 1e9, True),  # holding nothing is an infinite ratio
        (0, 0, 1.5, False),  # nothing to pull anywhere
        (6, 6, 0.5, False),  # even a threshold below 1 never pulls what is already here
    ],
)
def test_threshold_is_a_strict_ratio(best, local, threshold, expected):
    assert exceeds_threshold(best, local, threshold) is expected


@pytest.mark.parametrize(("threshold", "transfers"), [(1.5, False), (1.49, True), (1.51, False)])
def test_threshold_edge_decides_between_local_prefix_and_pull(threshold, transfers):
    index = index_with({"nb": H, "nx": H[:4]})
    choice = choose([prefill("x", "nx")], index, threshold)
    n = 6 * BLOCK + 1
    if transfers:  # pull 2 blocks (32 tokens · 100 B at 1 MB/s), compute 1 token
        assert choice.source_node == "nb" and choice.pull_hashes == tuple(H[4:6])
        assert choice.prefix_tokens == 96 and choice.local_prefix_tokens == 64
        assert choice.transfer_s == pytest.approx(32 * 100 / 1e6)
        assert choice.prefill_s == pytest.approx(0.001)
    else:  # compute the 33 tokens after the local 4 blocks
        assert choice.source_node is None and choice.pull_hashes == ()
        assert choice.prefix_tokens == 64 and choice.transfer_s == 0.0
        assert choice.prefill_s == pytest.approx((n - 64) * 0.001)


def test_busy_holder_loses_to_an_idle_instance_that_pulls_the_prefix():
    index = index_with({"na": H})
    choice = choose([prefill("a", "na", queue_s=1.0), prefill("b", "nb")], index)
    # b: pull 96 tokens (9.6 ms) + no queue + 1 token (1 ms) = 10.6 ms; a: 1 s + 1 ms.
    assert choice.instance_id == "b" and choice.source_node == "na"
    assert choice.predicted_ttft_s == pytest.approx(0.0106)
    assert (choice.transfer_s, choice.queue_s) == (pytest.approx(0.0096), 0.0)


def test_holder_wins_when_its_queue_is_short():
    index = index_with({"na": H})
    choice = choose([prefill("a", "na", queue_s=0.005), prefill("b", "nb")], index)
    assert choice.instance_id == "a" and choice.source_node is None
    assert choice.predicted_ttft_s == pytest.approx(0.006)


def test_local_cache_aware_never_pulls():
    index = index_with({"na": H})
    choice = choose(
        [prefill("a", "na", queue_s=1.0), prefill("b", "nb")], index, allow_transfer=False
    )
    assert choice.instance_id == "b" and choice.prefix_tokens == 0 and choice.pull_hashes == ()
    assert choice.predicted_ttft_s == pytest.approx(0.097)


def test_equal_ttfts_go_to_the_smaller_instance_id():
    # Powers of two, so both sums are exact: a pull of 32 tokens costs 2⁻⁹ s, the holder queues
    # 2⁻⁹ s.
    predictors = CostPredictors(lambda n, p: (n - p) * 2**-10, lambda b, c: 0.0, 64.0)
    bandwidth = BandwidthTable(2**20)
    hashes = chain("tie", 2)
    index = index_with({"n-holder": hashes})
    req = request(hashes)
    for puller, holder, winner in (("p0", "p1", "p0"), ("p1", "p0", "p0")):
        candidates = [prefill(holder, "n-holder", queue_s=2**-9), prefill(puller, "n-empty")]
        choice = choose(candidates, index, bandwidth=bandwidth, predictors=predictors, req=req)
        assert choice.instance_id == winner
    same = [prefill("b"), prefill("a"), prefill("c")]
    assert choose(same, index_with({})).instance_id == "a"


def test_source_is_the_best_holder_with_the_fastest_link():
    index = index_with({"n1": H, "n2": H, "nx": H[:1]})
    bandwidth = BandwidthTable(1e6, {("n2", "nx"): 2e6})
    choice = choose([prefill("x", "nx")], index, bandwidth=bandwidth)
    assert choice.source_node == "n2" and choice.transfer_s == pytest.approx(80 * 100 / 2e6)
    assert choose([prefill("x", "nx")], index).source_node == "n1"  # equal links: by name


def test_pull_slower_than_recompute_is_skipped_unless_following_algorithm_1_verbatim():
    index = index_with({"nb": H})
    slow = BandwidthTable(1e4)  # 10 ms per token pulled vs 1 ms per token computed
    cheap = choose([prefill("x", "nx")], index, bandwidth=slow)
    assert cheap.source_node is None and cheap.predicted_ttft_s == pytest.approx(0.097)
    verbatim = choose([prefill("x", "nx")], index, bandwidth=slow, transfer_only_if_cheaper=False)
    assert verbatim.source_node == "nb" and verbatim.predicted_ttft_s == pytest.approx(0.96 + 0.001)


def test_fully_cached_prompt_still_computes_its_last_token():
    index = index_with({"na": H})
    req = request(H, num_prompt_tokens=6 * BLOCK)
    choice = choose([prefill("a", "na")], index, req=req)
    assert choice.prefix_tokens == 96 and choice.prefill_s == pytest.approx(0.001)


def test_instances_sharing_a_node_share_its_prefix():
    index = index_with({"shared": H[:3]})
    a, b = prefill("a", "shared", queue_s=0.01), prefill("b", "shared")
    choice = choose([a, b], index, threshold=10.0)
    assert choice.instance_id == "b" and choice.local_prefix_tokens == 48
    assert price_local(request(H), a, index.match(H), P).local_prefix_tokens == 48


def test_no_candidates_and_bad_threshold():
    assert choose([], index_with({})) is None
    with pytest.raises(ValueError):
        choose([prefill("a")], index_with({}), threshold=0.0)


def test_paper_scale_example_with_the_emulated_cost_model():
    """LLaMA2-7B on a 100 TFLOP/s device, 512-token blocks as in the Mooncake traces, 100 Gb/s
    links: an 8k-token prompt whose 16 blocks live on a node queued for 2 s, and an idle node
    holding the first 8. Pulling 8 blocks (4,096 tokens · 512 KiB) takes 0.172 s and saves
    far more compute, so the idle instance pulls and wins."""
    model = CostModel()
    predictors = CostPredictors(model.prefill_s, model.decode_step_s, model.dims.kv_bytes_per_token)
    hashes = chain("doc", 16)
    index = index_with({"hot": hashes, "idle": hashes[:8]})
    req = request(hashes, num_prompt_tokens=16 * 512 + 100, block_size=512)
    choice = choose(
        [prefill("p-hot", "hot", queue_s=2.0), prefill("p-idle", "idle")],
        index,
        bandwidth=BandwidthTable(12.5e9),
        predictors=predictors,
        req=req,
    )
    n, d, layers = 16 * 512 + 100, 4096, 32
    expected_prefill = layers * (4 * (n * n - 8192**2) * d + 22 * (n - 8192) * d * d) / 100e12
    assert choice.instance_id == "p-idle" and choice.source_node == "hot"
    assert choice.transfer_s == pytest.approx(8 * 512 * 524288 / 12.5e9)
    assert choice.prefill_s == pytest.approx(expected_prefill)
    assert choice.predicted_ttft_s < 2.0


def test_link_rates_are_the_rates_fastest_source_picks():
    """The rates the KV-centric bound reads per row: what fastest_source gives each row's node
    for a few sources (two rows share a node; a subset reads its own rows; a source with links
    measured to most nodes is read by row), and no less than that for many."""
    rng = random.Random(5)
    nodes = [f"n{i}" for i in range(20)]
    table = BandwidthTable(1e6)
    for _ in range(60):
        table.set(rng.choice(nodes), rng.choice(nodes), rng.choice([5e5, 1e6, 2e6, 4e6]))
    for node in nodes:
        table.set("everywhere", node, rng.choice([5e5, 4e6]))
    rows = [*nodes, "n3", "unmeasured"]
    columns = InstanceColumns.of(
        [InstanceSnapshot(f"i{i}", n, 0, 0, 0.0, 0, 1) for i, n in enumerate(rows)]
    )
    subset = columns.where(np.arange(len(rows)) % 3 != 0)
    for sources in (
        ["n1"],
        ["everywhere"],
        ["n2", "everywhere"],
        rng.sample(nodes, 4),
        rng.sample(nodes, 9),
    ):
        for part in (columns, subset):
            rates = part.link_rates(table, sources).tolist()
            exact = [table.fastest_source(sources, node)[1] for node in part.nodes]
            if len(sources) <= 4:
                assert rates == exact
            else:
                assert all(rate >= fastest for rate, fastest in zip(rates, exact))
