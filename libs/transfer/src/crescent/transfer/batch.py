"""The batch API's data: entries in, per-entry results out, and the batch deadline."""

from __future__ import annotations

import enum
import numbers
import time
from dataclasses import dataclass

from crescent.transfer.errors import BadEntry, TransferError, TransferTimeout


class Op(enum.Enum):
    """READ copies remote bytes into local memory; WRITE copies local bytes to the remote."""

    READ = "read"
    WRITE = "write"


@dataclass(frozen=True, slots=True)
class TransferEntry:
    """One contiguous copy between a local registered segment and a remote one."""

    op: Op
    local_segment: str
    local_offset: int
    remote_segment: str
    remote_offset: int
    length: int

    def check(self) -> None:
        """Raise BadEntry for an entry no segment could satisfy."""
        if not isinstance(self.op, Op):
            raise BadEntry(f"op must be an Op, got {self.op!r}")
        if not self.local_segment or not self.remote_segment:
            raise BadEntry("segment names must not be empty")
        for field in ("local_offset", "remote_offset", "length"):
            value = getattr(self, field)
            if not isinstance(value, numbers.Integral):
                raise BadEntry(f"{field} must be an integer, got {value!r}")
        if self.local_offset < 0 or self.remote_offset < 0:
            raise BadEntry(f"offsets must be >= 0, got {self.local_offset}, {self.remote_offset}")
        if self.length < 0:
            raise BadEntry(f"length must be >= 0, got {self.length}")


@dataclass(frozen=True, slots=True)
class Deadline:
    """An absolute point on the monotonic clock plus the timeout it came from (for errors).

    Threads and the event loop both read it, so it uses time.monotonic, which is also the
    clock of asyncio's default loop.
    """

    at: float
    timeout: float

    @classmethod
    def after(cls, timeout: float) -> Deadline:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        return cls(time.monotonic() + timeout, timeout)

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def is_expired(self) -> bool:
        return time.monotonic() >= self.at

    def timeout_error(self, segment: str) -> TransferTimeout:
        return TransferTimeout(segment, self.timeout)


@dataclass(frozen=True, slots=True)
class BatchResult:
    """Per-entry outcome, in entry order: None for success, else the entry's error."""

    errors: tuple[TransferError | None, ...]

    @property
    def is_ok(self) -> bool:
        return all(error is None for error in self.errors)

    @property
    def num_failed(self) -> int:
        return sum(error is not None for error in self.errors)

    def failed(self) -> list[tuple[int, TransferError]]:
        """(entry index, error) for every failed entry."""
        return [(i, error) for i, error in enumerate(self.errors) if error is not None]

    def raise_for_errors(self) -> None:
        """Raise the first entry's error (a TransferError subclass) if any entry failed."""
        for error in self.errors:
            if error is not None:
                raise error
