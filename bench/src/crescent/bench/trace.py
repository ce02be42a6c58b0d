"""Mooncake-format request traces: one JSON object per line with `timestamp` (ms from the trace
start), `input_length`, `output_length` and `hash_ids` (one id per TRACE_BLOCK_TOKENS-token
block of the prompt, the last block possibly partial; equal ids mean equal content *and* equal
prefix). Both `crescent replay` and `crescent sim` read traces through here, so a bad line is
refused the same way by both, naming its line number.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

TRACE_BLOCK_TOKENS = 512
# The first 1,000 requests of the Mooncake arXiv trace as the repository keeps them
# (tests/data/README.md): a bench's default trace, found only where crescent-bench runs from its
# source tree (an editable install).
MOONCAKE_TRACE_SLICE = (
    Path(__file__).resolve().parents[4] / "tests" / "data" / "mooncake_trace_slice.jsonl"
)


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the file and line."""


@dataclass(frozen=True)
class TraceRequest:
    index: int  # position in the trace, from 0
    arrival_s: float  # from the first request of the trace
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    @property
    def num_full_blocks(self) -> int:
        """Blocks wholly inside the prompt: only these can be cached and reused."""
        return self.input_length // TRACE_BLOCK_TOKENS


def _field(record: dict, name: str, where: str) -> int:
    value = record.get(name)
    if value is None:
        raise TraceError(f"{where}: missing field {name!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise TraceError(f"{where}: {name!r} must be an integer, got {value!r}")
    return int(value)


def parse_line(line: str, where: str) -> tuple[int, int, int, tuple[int, ...]]:
    """(timestamp_ms, input_length, output_length, hash_ids) of one line, checked."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not JSON ({exc.msg})") from exc
    if not isinstance(record, dict):
        raise TraceError(f"{where}: a line must be a JSON object")
    timestamp = _field(record, "timestamp", where)
    input_length = _field(record, "input_length", where)
    output_length = _field(record, "output_length", where)
    if timestamp < 0 or input_length < 1 or output_length < 1:
        raise TraceError(
            f"{where}: timestamp must be >= 0 and lengths >= 1, got timestamp {timestamp}, "
            f"input_length {input_length}, output_length {output_length}"
        )
    hash_ids = record.get("hash_ids")
    if not isinstance(hash_ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in hash_ids
    ):
        raise TraceError(f"{where}: 'hash_ids' must be a list of non-negative integers")
    expected = math.ceil(input_length / TRACE_BLOCK_TOKENS)
    if len(hash_ids) != expected:
        raise TraceError(
            f"{where}: {len(hash_ids)} hash_ids contradict input_length {input_length} "
            f"({expected} blocks of {TRACE_BLOCK_TOKENS} tokens)"
        )
    return timestamp, input_length, output_length, tuple(hash_ids)


def load_trace(path: Path, limit: int | None = None) -> list[TraceRequest]:
    """The first `limit` requests (all when None), arrival times relative to the first one."""
    if limit is not None and limit < 1:
        raise TraceError(f"--limit must be >= 1, got {limit}")
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace {path}: {exc}") from exc
    requests: list[TraceRequest] = []
    first_ms = previous_ms = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        timestamp, input_length, output_length, hash_ids = parse_line(line, where)
        if previous_ms is not None and timestamp < previous_ms:
            raise TraceError(
                f"{where}: timestamp {timestamp} is before the previous line's {previous_ms}"
            )
        if first_ms is None:
            first_ms = timestamp
        previous_ms = timestamp
        requests.append(
            TraceRequest(
                len(requests),
                (timestamp - first_ms) / 1000.0,
                input_length,
                output_length,
                hash_ids,
            )
        )
        if limit is not None and len(requests) >= limit:
            break
    if not requests:
        raise TraceError(f"trace {path} has no requests")
    return requests
