"""JobOutcomes: a prefill instance answers for its recent jobs to a conductor whose NATS
connection dropped before the job's reply came."""

from __future__ import annotations

import asyncio

import pytest

from crescent.common.messages import PrefillResult
from crescent.prefill.outcomes import JobOutcomes, JobRunning, JobUnknown

RESULT = PrefillResult(request_id="j", first_token=7, num_computed_tokens=10)


async def test_a_running_job_is_waited_for_and_a_finished_one_answered_until_forgotten():
    outcomes = JobOutcomes(memory_s=10.0)
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
    outcomes = JobOutcomes(memory_s=10.0)
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
