"""The connector's timeline as JSON lines (wall-clock seconds), for tests and debugging:
when each layer of a step finished computing, when it reached each store, what loaded."""

from __future__ import annotations

import json
import threading
import time


class EventLog:
    """Appends one JSON object per event to `path`; a no-op when `path` is empty."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115 (closed in close())
        self._lock = threading.Lock()

    def write(self, event: str, **fields) -> None:
        if self._file is None:
            return
        fields.setdefault("t", time.time())
        line = json.dumps({"event": event, **fields}, default=str)
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_events(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
