"""Continuous batching bookkeeping shared by decode instances and coupled (vLLM-style) ones.

Every decode step that ends emits one token to each request in the batch. Instead of keeping a
list of intervals per request, the batch keeps the times of its emissions: a request that joins
before emission k and needs m more tokens leaves after emission k + m − 1, and its token
intervals are the gaps between those emissions (the first from its first token, which came out
of prefill). Per step the work is O(1) plus the requests that leave.
"""

from __future__ import annotations

from crescent.bench.sim.request import SimRequest
from crescent.bench.slo import tbt_of


class Batch:
    def __init__(self) -> None:
        self.emissions: list[float] = []
        self._leaving: dict[int, list[SimRequest]] = {}
        self.num_running = 0
        self.context_tokens = 0

    def add(self, request: SimRequest) -> None:
        """Join before the next emission; needs num_output − 1 more tokens (≥ 1)."""
        first = len(self.emissions)
        request.first_emission = first
        request.last_emission = first + request.num_output - 2
        self._leaving.setdefault(request.last_emission, []).append(request)
        self.num_running += 1
        self.context_tokens += request.num_prompt + 1

    def emit(self, now: float) -> list[SimRequest]:
        """A step ended at `now`: everyone got a token; returns the requests that are done."""
        index = len(self.emissions)
        self.emissions.append(now)
        self.context_tokens += self.num_running
        done = self._leaving.pop(index, None)
        if not done:
            return []
        for request in done:
            self.num_running -= 1
            self.context_tokens -= request.num_prompt + request.num_output
            request.tbt_s = self.tbt_of(request)
        return done

    def tbt_of(self, request: SimRequest) -> float:
        """The paper's TBT of a request that has left: mean of its longest 10 % of intervals."""
        times = self.emissions[request.first_emission : request.last_emission + 1]
        previous = request.first_token_s
        intervals = []
        for time_s in times:
            intervals.append(time_s - previous)
            previous = time_s
        return tbt_of(intervals)
