"""What a worker has received from each conductor, for its telemetry to acknowledge.

A conductor adds the jobs and reservations it sends to the load an instance last reported,
until a report counts them. A report built before a job arrived cannot count it, so each
assignment carries its conductor's number, and the worker reports, per conductor, the highest
number it has taken in (InstanceLoad.received): the conductor keeps adding only what it sent
after that. A conductor whose assignments stop coming is forgotten after FORGET_AFTER_S, so a
worker outliving many conductors does not report them all forever.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FORGET_AFTER_S = 300.0


@dataclass
class ReceivedAssignments:
    forget_after_s: float = FORGET_AFTER_S
    # conductor id → (highest assignment number received, when the latest one came)
    _latest: dict[str, tuple[int, float]] = field(default_factory=dict)

    def note(self, conductor: str, number: int, now: float) -> None:
        """The assignment numbered `number` from `conductor` is counted in this worker's load
        from now on (unnumbered ones, conductor "" or number 0, are not tracked)."""
        if not conductor or number <= 0:
            return
        held = self._latest.get(conductor)
        self._latest[conductor] = (max(number, held[0]) if held else number, now)

    def latest(self, now: float) -> dict[str, int]:
        """Per conductor heard within forget_after_s, the highest number received."""
        self._latest = {
            c: held for c, held in self._latest.items() if now - held[1] <= self.forget_after_s
        }
        return {c: number for c, (number, _) in self._latest.items()}
