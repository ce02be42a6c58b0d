"""When to restart a crashed process: capped exponential backoff per process, forgiven once the
process has run long enough to count as healthy. Pure bookkeeping with time passed in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    first_s: float = 0.5  # delay before restarting after a first crash
    max_s: float = 10.0  # the delay doubles with each crash in a row, up to this
    stable_s: float = 30.0  # after a run this long, a crash counts as the first again

    def delay_s(self, num_crashes: int) -> float:
        return min(self.first_s * 2 ** (num_crashes - 1), self.max_s)


class RestartSchedule:
    """Per process name: how many crashes in a row, and when the pending restart is due."""

    def __init__(self, backoff: Backoff) -> None:
        self.backoff = backoff
        self._num_crashes: dict[str, int] = {}
        self._due_at: dict[str, float] = {}

    def is_pending(self, name: str) -> bool:
        return name in self._due_at

    def num_crashes(self, name: str) -> int:
        return self._num_crashes.get(name, 0)

    def add_crash(self, name: str, ran_s: float, now: float) -> float:
        """Record that `name` exited after running `ran_s`; returns the delay before its restart."""
        is_streak = ran_s < self.backoff.stable_s
        num_crashes = self._num_crashes.get(name, 0) + 1 if is_streak else 1
        self._num_crashes[name] = num_crashes
        delay_s = self.backoff.delay_s(num_crashes)
        self._due_at[name] = now + delay_s
        return delay_s

    def take_due(self, name: str, now: float) -> bool:
        """True once the pending restart of `name` is due; it is then no longer pending."""
        if name not in self._due_at or now < self._due_at[name]:
            return False
        del self._due_at[name]
        return True

    def forget(self, name: str) -> None:
        """Drop a pending restart (the process was stopped on purpose or started by hand)."""
        self._due_at.pop(name, None)
