"""This process's registered segments, by name (for local entries) and by numeric id (what
the tcp wire protocol carries, so a request header stays fixed-size); and local-only ones (a
caller's buffers, crescent.transfer.buffers), by name alone, which no peer can address."""

from __future__ import annotations

import threading

from crescent.transfer.errors import SegmentNotFound
from crescent.transfer.segment import Segment


class SegmentRegistry:
    """Name and id maps of registered segments.

    Ids are never reused within a process, so a request carrying the id of a segment that
    was unregistered (and maybe re-registered under the same name) is refused instead of
    landing in the wrong memory. Server threads read it while the event loop changes it.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[int, Segment]] = {}
        self._by_id: dict[int, Segment] = {}
        self._local_only: dict[str, Segment] = {}
        self._next_id = 1
        self._lock = threading.Lock()

    def add(self, segment: Segment) -> int:
        with self._lock:
            if segment.name in self._by_name:
                raise ValueError(f"segment {segment.name!r} is already registered")
            segment_id = self._next_id
            self._next_id += 1
            self._by_name[segment.name] = (segment_id, segment)
            self._by_id[segment_id] = segment
            return segment_id

    def add_local(self, segment: Segment) -> None:
        """Allow `segment` as the local side of entries; it gets no id, so it is never served."""
        with self._lock:
            if segment.name in self._by_name or segment.name in self._local_only:
                raise ValueError(f"segment {segment.name!r} is already registered")
            self._local_only[segment.name] = segment

    def remove_local(self, name: str) -> Segment:
        with self._lock:
            try:
                return self._local_only.pop(name)
            except KeyError:
                raise SegmentNotFound(name) from None

    def is_local_only(self, name: str) -> bool:
        return name in self._local_only

    def remove(self, name: str) -> Segment:
        with self._lock:
            try:
                segment_id, segment = self._by_name.pop(name)
            except KeyError:
                raise SegmentNotFound(name) from None
            del self._by_id[segment_id]
            return segment

    def get(self, name: str) -> Segment:
        segment = self.find(name)
        if segment is None:
            raise SegmentNotFound(name)
        return segment

    def find(self, name: str) -> Segment | None:
        entry = self._by_name.get(name)
        return entry[1] if entry is not None else self._local_only.get(name)

    def id_of(self, name: str) -> int:
        entry = self._by_name.get(name)
        if entry is None:
            raise SegmentNotFound(name)
        return entry[0]

    def by_id(self, segment_id: int) -> Segment | None:
        return self._by_id.get(segment_id)

    def segments(self) -> list[Segment]:
        with self._lock:
            return [segment for _, segment in self._by_name.values()]
