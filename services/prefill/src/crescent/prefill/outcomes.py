"""What became of this instance's jobs, kept a while after each ends: a conductor whose NATS
connection dropped while it waited for a job asks for its result (PrefillResultAsk) rather than
compute the prompt again elsewhere, since the job's reply may have been lost on the way."""

from __future__ import annotations

import asyncio
import math

from crescent.common.errors import RecoverableError
from crescent.common.messages import PrefillResult


class JobRunning(RecoverableError):
    """The job asked about is still queued or computing: ask again."""


class JobUnknown(RecoverableError):
    """No job of that id ran here lately, or it was cancelled: its conductor moves it."""


class JobOutcomes:
    def __init__(self, memory_s: float) -> None:
        self.memory_s = memory_s
        self._outcomes: dict[str, tuple[asyncio.Future[PrefillResult], float]] = {}  # → until

    def open(self, job_id: str, now: float) -> asyncio.Future[PrefillResult]:
        """The future of a job starting now: its result, its error, or cancelled."""
        self._outcomes = {job: kept for job, kept in self._outcomes.items() if kept[1] > now}
        outcome: asyncio.Future[PrefillResult] = asyncio.get_running_loop().create_future()
        # a job's error is answered to its conductor already; nobody need ask for it again
        outcome.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._outcomes[job_id] = (outcome, math.inf)
        return outcome

    def end(self, job_id: str, now: float) -> None:
        """The job is done: keep its outcome until `now` + memory_s."""
        if job_id in self._outcomes:
            self._outcomes[job_id] = (self._outcomes[job_id][0], now + self.memory_s)

    async def result(self, job_id: str, wait_s: float, now: float) -> PrefillResult:
        """The job's result, or the error it ended with, within `wait_s`; JobRunning past it."""
        outcome, kept_until = self._outcomes.get(job_id, (None, 0.0))
        if outcome is None or kept_until <= now or outcome.cancelled():
            raise JobUnknown(f"no job {job_id} here to answer for")
        try:
            return await asyncio.wait_for(asyncio.shield(outcome), wait_s)
        except TimeoutError:
            raise JobRunning(f"job {job_id} is still queued or computing") from None
        except asyncio.CancelledError:
            if outcome.cancelled():  # cancelled while this waited; this task goes on
                raise JobUnknown(f"job {job_id} was cancelled") from None
            raise
