"""One instance's assignments from this conductor that its telemetry does not count yet.

The conductor adds them to the instance's reported load (cluster_view.py). Each carries the
number its job or reservation was sent with; a report that says it received up to a number
(InstanceLoad.received) counts every assignment numbered up to it, which then leave here.

Taking back work the instance has already counted works the other way round: the cancel goes
out under a new number, and until a report acknowledges that number (the instance has let the
work go), the conductor takes the work off the reported load. A release whose acknowledgement
never comes (an instance that does not number what it receives) lapses after RELEASE_MEMORY_S.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RELEASE_MEMORY_S = 10.0


@dataclass(frozen=True)
class Assigned:
    number: int
    num_tokens: int  # prefill: the prompt; decode: the KV room it holds
    queue_s: float  # prefill: the compute it adds to the queue
    at: float = 0.0  # releases: when the cancel went out
    num_context_tokens: int = 0  # decode: the prompt it brings to the batch


@dataclass
class Unacknowledged:
    by_request: dict[str, Assigned] = field(default_factory=dict)
    # Work taken back that the last report still counted, by the cancel's number (amounts > 0).
    released: dict[int, Assigned] = field(default_factory=dict)
    # Assignments less releases: what this conductor adds to the reported load. Kept by adding
    # and taking away, per change rather than summed anew: the queue in whole nanoseconds, so
    # that no rounding error builds up and nothing left means exactly zero.
    num_requests: int = 0
    num_tokens: int = 0
    queue_ns: int = 0
    num_context_tokens: int = 0

    @property
    def queue_s(self) -> float:
        return self.queue_ns / 1e9

    def add(self, request_id: str, assigned: Assigned) -> None:
        old = self.by_request.get(request_id)
        if old is not None:
            self._count(old, -1)
        self.by_request[request_id] = assigned
        self._count(assigned, 1)

    def remove(self, request_id: str) -> bool:
        """Whether the request had an assignment here."""
        assigned = self.by_request.pop(request_id, None)
        if assigned is None:
            return False
        self._count(assigned, -1)
        return True

    def release(self, released: Assigned) -> None:
        """Work the instance counted is taken back by a cancel numbered `released.number`."""
        old = self.released.get(released.number)
        if old is not None:
            self._count(old, 1)
        self.released[released.number] = released
        self._count(released, -1)

    def acknowledge(self, number: int, now: float) -> list[str]:
        """A report counts everything numbered up to `number`: those leave; their request ids.
        Releases it acknowledges, or too old to wait for, leave too."""
        counted = [r for r, assigned in self.by_request.items() if assigned.number <= number]
        for request_id in counted:
            self._count(self.by_request.pop(request_id), -1)
        let_go = [
            n for n, r in self.released.items() if n <= number or now - r.at > RELEASE_MEMORY_S
        ]
        for released_number in let_go:
            self._count(self.released.pop(released_number), 1)
        return counted

    def _count(self, assigned: Assigned, sign: int) -> None:
        self.num_requests += sign
        self.num_tokens += sign * assigned.num_tokens
        self.queue_ns += sign * round(assigned.queue_s * 1e9)
        self.num_context_tokens += sign * assigned.num_context_tokens
