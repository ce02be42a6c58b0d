"""Faults on a schedule while a replay runs: what `kill -9` and `SIGSTOP` of serving processes
do to a user's own traffic.

The replay runs on a worker thread; this (the main) thread sends each fault's signals at its
time after the replay started and, every SUPERVISE_PERIOD_S, lets the caller's supervisor
restart what exited. Processes are restarted from the main thread because a child's
parent-death signal follows the thread that forked it (ManagedProcess.start).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

SUPERVISE_PERIOD_S = 0.2


class Signalled(Protocol):
    def signal(self, sig: int) -> None: ...


@dataclass(frozen=True)
class Fault:
    at_s: float  # after the replay starts
    action: Literal["kill", "pause"]  # SIGKILL (the supervisor restarts it); SIGSTOP, SIGCONT
    target: str  # the process's name
    pause_s: float = 0.0  # "pause": how long it stays stopped

    def __post_init__(self) -> None:
        if self.action not in ("kill", "pause"):
            raise ValueError(f"a fault is kill or pause, got {self.action!r}")
        if self.at_s < 0 or (self.action == "pause") != (self.pause_s > 0):
            raise ValueError(f"bad fault timing: {self}")

    def describe(self) -> str:
        if self.action == "kill":
            return f"{self.at_s:g} s: kill -9 {self.target}"
        return f"{self.at_s:g} s: SIGSTOP {self.target} for {self.pause_s:g} s"


def run_with_faults(
    replay: Callable[[], dict],
    faults: Sequence[Fault],
    process: Callable[[str], Signalled],
    supervise: Callable[[], None],
) -> dict:
    """`replay()`'s result, with the faults injected while it ran. A pause still on when the
    replay ends is lifted; a fault not yet due is not injected (the row lists those that were,
    under `faults`)."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["row"] = replay()
        except BaseException as exc:  # re-raised on the main thread below
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="replay", daemon=True)
    started_at = time.monotonic()
    worker.start()
    # (time, fault, signal): a pause is two signals, its SIGCONT pause_s after its SIGSTOP
    signals = sorted(
        (
            (fault.at_s + (fault.pause_s if sig == signal.SIGCONT else 0.0), fault, sig)
            for fault in faults
            for sig in _signals(fault)
        ),
        key=lambda item: item[0],
    )
    injected: list[Fault] = []
    while worker.is_alive():
        elapsed = time.monotonic() - started_at
        while signals and signals[0][0] <= elapsed:
            _, fault, sig = signals.pop(0)
            process(fault.target).signal(sig)
            if sig != signal.SIGCONT:
                injected.append(fault)
        supervise()
        worker.join(SUPERVISE_PERIOD_S)
    for _, fault, sig in signals:  # the replay ended during a pause
        if sig == signal.SIGCONT and fault in injected:
            process(fault.target).signal(sig)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    row = dict(outcome["row"])  # type: ignore[arg-type]
    row["faults"] = [fault.describe() for fault in injected]
    return row


def _signals(fault: Fault) -> tuple[int, ...]:
    if fault.action == "kill":
        return (signal.SIGKILL,)
    return (signal.SIGSTOP, signal.SIGCONT)
