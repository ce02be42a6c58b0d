"""The discrete-event loop: a heap of (time, sequence, callback, argument).

Events at the same time run in the order they were scheduled (the sequence number breaks ties),
so a run is deterministic and a callback scheduled "now" runs after every event already due now.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._sequence = 0
        self.num_events = 0

    def at(self, time_s: float, callback: Callable[[Any], None], argument: Any = None) -> None:
        """Run `callback(argument)` at `time_s` (never before now)."""
        self._sequence += 1
        heapq.heappush(self._heap, (max(time_s, self.now), self._sequence, callback, argument))

    def after(self, delay_s: float, callback: Callable[[Any], None], argument: Any = None) -> None:
        self.at(self.now + delay_s, callback, argument)

    def clock(self) -> float:
        return self.now

    def run(self) -> None:
        heap, pop = self._heap, heapq.heappop
        while heap:
            time_s, _, callback, argument = pop(heap)
            self.now = time_s
            self.num_events += 1
            callback(argument)
