"""Validation of the simulator against figures computed here, independently of it:
(a) with unbounded caches its hit rate is the trace's theoretical maximum; (b) one node with one
LRU pool of C tokens hits what a plain LRU replay of the same trace hits."""

from collections import OrderedDict
from pathlib import Path

import pytest
from sim_helpers import spaced

from crescent.bench.sim.config import SimConfig
from crescent.bench.sim.run import simulate
from crescent.bench.trace import load_trace

SLICE = Path(__file__).resolve().parents[2] / "data" / "mooncake_trace_slice.jsonl"
# Outputs of 1 never decode, but the conductor still reserves their KV on a decode instance at
# placement: room enough that no request is turned away for it.
NO_DECODE_LIMIT = 10**12


def full_blocks(request):
    return request.hash_ids[: request.input_length // 512]


def reused_tokens(request, num_blocks):
    return min(num_blocks * 512, request.input_length - 1)  # the last token is always computed


def theoretical_max(trace):
    seen = set()
    hit = total = 0
    for request in trace:
        blocks = full_blocks(request)
        run = next((i for i, block in enumerate(blocks) if block not in seen), len(blocks))
        hit += reused_tokens(request, run)
        total += request.input_length
        seen.update(blocks)
    return hit / total


def lru_replay(trace, capacity_tokens):
    cache = OrderedDict()
    limit = capacity_tokens // 512
    hit = total = 0
    for request in trace:
        blocks = full_blocks(request)
        run = 0
        while run < len(blocks) and blocks[run] in cache:
            run += 1
        hit += reused_tokens(request, run)
        total += request.input_length
        for block in blocks:
            cache[block] = None
            cache.move_to_end(block)
        while len(cache) > limit:
            cache.popitem(last=False)
    return hit / total


def test_unbounded_cache_on_one_node_reaches_the_theoretical_maximum():
    """Requests far enough apart that each job finds its predecessors' blocks stored when it
    comes (a job counts only what is stored then, as the prefill worker does)."""
    trace = spaced(load_trace(SLICE), gap_s=30.0)
    config = SimConfig(
        num_prefill=1,
        num_decode=1,
        output_limit=1,
        cache_tokens_per_node=None,
        decode_kv_tokens=NO_DECODE_LIMIT,
        telemetry_period_s=1.0,
    )
    result = simulate(config, trace)
    assert result["hit_rate"] == pytest.approx(theoretical_max(trace), abs=1e-12)
    assert result["hit_rate"] > 0.3


def test_unbounded_global_pool_over_many_nodes_reaches_it_too():
    """Eight prefill nodes: every prefix held anywhere is pulled (threshold just above 1), and
    requests are far enough apart that each finds its predecessors' blocks."""
    trace = spaced(load_trace(SLICE, limit=300), gap_s=30.0)
    config = SimConfig(
        num_prefill=8,
        num_decode=2,
        output_limit=1,
        cache_tokens_per_node=None,
        kvcache_balancing_threshold=1.0,
        decode_kv_tokens=NO_DECODE_LIMIT,
        hot_spot_period_s=0,
        telemetry_period_s=1.0,
    )  # an idle cluster: fewer ticks
    result = simulate(config, trace)
    assert result["hit_rate"] == pytest.approx(theoretical_max(trace), abs=1e-12)


@pytest.mark.parametrize("capacity_tokens", [200_000, 1_000_000, 3_000_000])
def test_one_global_lru_matches_an_independent_lru_replay(capacity_tokens):
    trace = load_trace(SLICE)
    config = SimConfig(
        num_prefill=1,
        num_decode=1,
        output_limit=1,
        cache_tokens_per_node=capacity_tokens,
        hot_spot_period_s=0,
        decode_kv_tokens=NO_DECODE_LIMIT,
    )
    expected = lru_replay(trace, capacity_tokens)
    assert simulate(config, trace)["hit_rate"] == pytest.approx(expected, abs=0.02)
    assert expected < theoretical_max(trace)
