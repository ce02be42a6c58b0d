"""The conductor's cache hit rate counts the prefix tokens each prefill really loaded (its
PrefillResult), not the ones the plan expected: a prefix evicted between plan and prefill, or a
pull that failed, is a miss."""

import dataclasses

from crescent.common.messages import PrefillResult
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.policy import Decision, DecodeChoice, PrefillChoice, ScheduleRequest
from crescent.conductor.scheduler import Scheduler
from crescent.conductor.settings import ConductorSettings


def decision(prefix_tokens: int) -> Decision:
    prefill = PrefillChoice(
        instance_id="p0",
        node="n0",
        prefix_tokens=prefix_tokens,
        local_prefix_tokens=prefix_tokens,
        source_node=None,
        pull_hashes=(),
        transfer_s=0.0,
        queue_s=0.0,
        prefill_s=0.1,
    )
    return Decision(prefill, DecodeChoice("d0", 0.01))


def result(request_id: str, num_cached_tokens: int) -> PrefillResult:
    return PrefillResult(
        request_id=request_id,
        first_token=1,
        num_computed_tokens=1100 - num_cached_tokens,
        num_cached_tokens=num_cached_tokens,
    )


def test_hit_rate_is_what_the_prefills_loaded_not_what_was_planned():
    scheduler = Scheduler(
        ConductorSettings(block_size=512), ClusterView(clock=lambda: 0.0), lambda: 0.0
    )
    request = ScheduleRequest(
        "r1", [b"\x01" * 16, b"\x02" * 16], num_prompt_tokens=1100, block_size=512
    )
    planned = decision(prefix_tokens=1024)
    scheduler.record(request, planned)
    assert scheduler.cache_hit_rate == 0.0  # nothing has been prefilled yet

    scheduler.on_prefilled(request, planned, result("r1", 0), measured_s=0.1)  # the prefix was gone
    assert scheduler.cache_hit_rate == 0.0
    second = dataclasses.replace(request, request_id="r2")
    scheduler.on_prefilled(second, planned, result("r2", 1024), measured_s=0.1)
    assert scheduler.cache_hit_rate == 1024 / 2200


def test_a_prompt_computed_on_decode_counts_in_the_hit_rate():
    """Conditional disaggregation: the decode instance computed the prompt and said on its
    first token chunk how much it loaded from its node's store."""
    scheduler = Scheduler(
        ConductorSettings(block_size=512), ClusterView(clock=lambda: 0.0), lambda: 0.0
    )
    scheduler.on_computed_on_decode("r1", num_prompt_tokens=1100, num_cached_tokens=1024)
    scheduler.on_computed_on_decode("r2", num_prompt_tokens=100, num_cached_tokens=0)
    assert scheduler.cache_hit_rate == 1024 / 1200
