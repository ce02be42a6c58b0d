"""Entries kept for a fixed time after they are put, then forgotten: what a worker remembers of
requests that ended (a cancel to honour, chunks to resend, a job's outcome to answer for).

Every entry lives the same `memory_s`, so entries expire in the order they were put, and the
expired ones are dropped from the front at each put: the cost per put stays constant however
many entries are kept, where rebuilding the map at each put would cost one step per entry kept
(thousands at a few hundred requests a second)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Recent(Generic[K, V]):
    def __init__(self, memory_s: float) -> None:
        self.memory_s = memory_s
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()  # key → (until, value)

    def put(self, key: K, value: V, now: float) -> None:
        """Keep `value` under `key` until `now` + memory_s (a key put again starts over)."""
        while self._entries:
            key_first, (until, _) = next(iter(self._entries.items()))
            if until > now:
                break
            del self._entries[key_first]
        self._entries.pop(key, None)
        self._entries[key] = (now + self.memory_s, value)

    def get(self, key: K, now: float) -> V | None:
        """The value kept under `key`; None when there is none, or it has expired."""
        until, value = self._entries.get(key, (0.0, None))
        return value if until > now else None

    def __len__(self) -> int:
        return len(self._entries)
