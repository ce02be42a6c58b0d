"""What became of this instance's jobs, kept a while after each ends: a conductor whose NATS
connection dropped while it waited for a job asks for its result (PrefillResultAsk) rather than
compute the prompt again elsewhere, since the job's reply may have been lost on the way."""

from __future__ import annotations

import asyncio

from crescent.common.errors import RecoverableError
from crescent.common.held_bytes import result_bytes
from crescent.common.messages import PrefillResult
from crescent.common.recent import Recent


class JobRunning(RecoverableError):
    """The job asked about is still queued or computing: ask again."""


class JobUnknown(RecoverableError):
    """No job of that id ran here lately, or it was cancelled: its conductor moves it."""


class JobOutcomes:
    """Each job's outcome while it runs and `memory_s` after; ended jobs' results hold at most
    about `max_bytes` (a long prompt's logprobs are megabytes), the oldest forgotten first."""

    def __init__(self, memory_s: float, max_bytes: int) -> None:
        self._running: dict[str, asyncio.Future[PrefillResult]] = {}
        self._ended: Recent[str, asyncio.Future[PrefillResult]] = Recent(memory_s, max_bytes)

    def open(self, job_id: str) -> asyncio.Future[PrefillResult]:
        """The future of a job starting now: its result, its error, or cancelled."""
        outcome: asyncio.Future[PrefillResult] = asyncio.get_running_loop().create_future()
        # a job's error is answered to its conductor already; nobody need ask for it again
        outcome.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._running[job_id] = outcome
        return outcome

    def end(self, job_id: str, now: float) -> None:
        """The job is done: keep its outcome until `now` + memory_s."""
        outcome = self._running.pop(job_id, None)
        if outcome is not None:
            self._ended.put(job_id, outcome, now, _held_bytes(outcome))

    async def result(self, job_id: str, wait_s: float, now: float) -> PrefillResult:
        """The job's result, or the error it ended with, within `wait_s`; JobRunning past it."""
        outcome = self._running.get(job_id) or self._ended.get(job_id, now)
        if outcome is None or outcome.cancelled():
            raise JobUnknown(f"no job {job_id} here to answer for")
        try:
            async with asyncio.timeout(wait_s):
                return await asyncio.shield(outcome)
        except TimeoutError:
            raise JobRunning(f"job {job_id} is still queued or computing") from None
        except asyncio.CancelledError:
            if outcome.cancelled():  # cancelled while this waited; this task goes on
                raise JobUnknown(f"job {job_id} was cancelled") from None
            raise


def _held_bytes(outcome: asyncio.Future[PrefillResult]) -> int:
    """What a job's outcome holds: its result's logprobs; an error or a cancel next to nothing."""
    if outcome.done() and not outcome.cancelled() and outcome.exception() is None:
        return result_bytes(outcome.result())
    return 0
