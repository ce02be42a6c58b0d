"""The prefill instance's FIFO in front of its engine, counted in tokens.

By default one job computes at a time: the conductor predicts a job's queue time as the sum of
the jobs ahead of it, each priced alone, and corrects that sum with each job's measured compute
time. vLLM could batch: held to one job at a time it idles between jobs and never lets a short
prompt share a step with a long one's last chunk, which plain vLLM does. With a token capacity
(`--prefill-batch-tokens`) jobs enter vLLM in arrival order while the tokens still to compute
inside it are under the capacity, and still wait behind everything that arrived before them.
But a job that shares the engine takes longer than its price alone, so the conductor's
correction learns a larger ratio and applies it to the whole queue: in `crescent bench predict`
the corrected TTFT error went from a median 0.18 (one at a time) to 2.7–3.5. Batched jobs need
a queue model of their own before this can be the default.
"""

from __future__ import annotations

import asyncio
from collections import deque


class ComputeGate:
    """FIFO admission of jobs by their uncached tokens; `capacity_tokens=0` admits one job at a
    time. The head of the line is admitted when the engine is empty or holds fewer tokens than
    the capacity; nobody overtakes it."""

    def __init__(self, capacity_tokens: int = 0) -> None:
        self.capacity_tokens = capacity_tokens
        self.tokens_inside = 0
        self.jobs_inside = 0
        self._waiting: deque[tuple[asyncio.Future[None], int]] = deque()

    def _has_room(self) -> bool:
        if self.jobs_inside == 0:
            return True
        return self.capacity_tokens > 0 and self.tokens_inside < self.capacity_tokens

    async def enter(self, num_tokens: int) -> None:
        """Wait for this job's turn; cancelling the wait gives the turn to the next job."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((turn, num_tokens))
        self._admit_waiting()
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.leave(num_tokens)  # admitted in the tick it was cancelled: hand the turn on
            elif (turn, num_tokens) in self._waiting:
                self._waiting.remove((turn, num_tokens))
            raise

    def leave(self, num_tokens: int) -> None:
        """The job's compute is over (done, failed or cancelled)."""
        self.jobs_inside -= 1
        self.tokens_inside -= num_tokens
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        while self._waiting and self._has_room():
            turn, num_tokens = self._waiting.popleft()
            if turn.done():  # its waiter was cancelled
                continue
            self.jobs_inside += 1
            self.tokens_inside += num_tokens
            turn.set_result(None)
