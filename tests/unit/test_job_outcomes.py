"""JobOutcomes: a prefill instance answers for its recent jobs to a conductor whose NATS
connection dropped before the job's reply came."""

from __future__ import annotations

import asyncio

import pytest

from crescent.common.messages import PrefillResult, TokenLogprobs
from crescent.prefill.outcomes import JobOutcomes, JobRunning, JobUnknown

RESULT = PrefillResult(request_id="j", first_token=7, num_computed_tokens=10)


async def test_a_running_job_is_waited_for_and_a_finished_one_answered_until_forgotten():
    outcomes = JobOutcomes(memory_s=10.0, max_bytes=1 << 20)
    outcome = outcomes.open("j")
    with pytest.raises(JobRunning):
        await outcomes.result("j", wait_s=0.01, now=1.0)
    asking = asyncio.ensure_future(outcomes.result("j", wait_s=5.0, now=1.0))
    await asyncio.sleep(0)
    outcome.set_result(RESULT)
    outcomes.end("j", now=2.0)
    assert await asking == RESULT
    assert await outcomes.result("j", wait_s=0.0, now=11.0) == RESULT
    with pytest.raises(JobUnknown):
        await outcomes.result("j", wait_s=0.0, now=12.5)


async def test_a_failed_job_answers_its_error_and_a_cancelled_or_unknown_one_is_unknown():
    outcomes = JobOutcomes(memory_s=10.0, max_bytes=1 << 20)
    outcomes.open("failed").set_exception(ValueError("boom"))
    outcomes.end("failed", now=0.0)
    with pytest.raises(ValueError, match="boom"):
        await outcomes.result("failed", wait_s=1.0, now=1.0)
    cancelled = outcomes.open("cancelled")
    asking = asyncio.ensure_future(outcomes.result("cancelled", wait_s=5.0, now=0.0))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(JobUnknown, match="cancelled"):
        await asking
    with pytest.raises(JobUnknown):
        await outcomes.result("never", wait_s=1.0, now=1.0)


async def test_past_their_bytes_the_oldest_results_are_forgotten_first():
    logprobs = [TokenLogprobs(logprob=-1.0, top_ids=[1] * 20, top_logprobs=[-2.0] * 20)] * 100
    large = PrefillResult(
        request_id="j", first_token=7, num_computed_tokens=100, prompt_logprobs=logprobs
    )
    outcomes = JobOutcomes(
        memory_s=60.0, max_bytes=400_000
    )  # two such results (~175 KB each), not three
    for job_id in ("a", "b", "c"):
        outcomes.open(job_id).set_result(large)
        outcomes.end(job_id, now=1.0)
    with pytest.raises(JobUnknown):
        await outcomes.result("a", wait_s=0.0, now=2.0)
    assert await outcomes.result("c", wait_s=0.0, now=2.0) == large
    assert await outcomes.result("b", wait_s=0.0, now=2.0) == large
