"""Entries kept for a fixed time after they are put, then forgotten: what a worker remembers of
requests that ended (a cancel to honour, chunks to resend, a job's outcome to answer for).

Every entry lives the same `memory_s`, so entries expire in the order they were put, and the
expired ones are dropped from the front at each put: the cost per put stays constant however
many entries are kept, where rebuilding the map at each put would cost one step per entry kept
(thousands at a few hundred requests a second).

What is kept can also be bounded in bytes (`max_bytes`, each entry put with its size): a
stream's chunks with 20 logprobs a token, or a long prompt's logprobs, are megabytes each, and
a busy instance ends hundreds of requests a minute. Past the bound the oldest entries go
first, before their time: a late ask for one then finds nothing, as after memory_s."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Recent(Generic[K, V]):
    def __init__(self, memory_s: float, max_bytes: int | None = None) -> None:
        self.memory_s = memory_s
        self.max_bytes = max_bytes
        self.num_bytes = 0  # of the entries kept, as put
        # key → (until, value, its bytes)
        self._entries: OrderedDict[K, tuple[float, V, int]] = OrderedDict()

    def put(self, key: K, value: V, now: float, num_bytes: int = 0) -> None:
        """Keep `value` under `key` until `now` + memory_s (a key put again starts over), then
        drop the oldest entries while the rest hold more than max_bytes (this one is kept)."""
        while self._entries:
            key_first, (until, _, _) = next(iter(self._entries.items()))
            if until > now:
                break
            self._drop(key_first)
        if key in self._entries:
            self._drop(key)
        self._entries[key] = (now + self.memory_s, value, num_bytes)
        self.num_bytes += num_bytes
        while self.max_bytes is not None and self.num_bytes > self.max_bytes:
            key_first = next(iter(self._entries))
            if key_first == key:
                break
            self._drop(key_first)

    def get(self, key: K, now: float) -> V | None:
        """The value kept under `key`; None when there is none, or it has expired."""
        until, value, _ = self._entries.get(key, (0.0, None, 0))
        return value if until > now else None

    def _drop(self, key: K) -> None:
        self.num_bytes -= self._entries.pop(key)[2]

    def __len__(self) -> int:
        return len(self._entries)
