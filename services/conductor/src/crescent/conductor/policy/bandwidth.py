"""Measured node-to-node bandwidth, the denominator of T_transfer (paper §4.1).

The conductor feeds it what transfers actually achieved; until a pair has been measured the
default applies, so a fresh conductor still prices transfers sensibly.
"""

from __future__ import annotations

from collections.abc import Mapping

DEFAULT_BYTES_PER_S = 12.5e9  # one 100 Gb/s NIC


class BandwidthTable:
    """(source node, destination node) → bytes/s; directional, since links congest per direction."""

    def __init__(self, default_bytes_per_s: float = DEFAULT_BYTES_PER_S,
                 measured: Mapping[tuple[str, str], float] | None = None) -> None:
        _check_rate(default_bytes_per_s)
        self.default_bytes_per_s = default_bytes_per_s
        self._measured: dict[tuple[str, str], float] = {}
        for (src, dst), rate in (measured or {}).items():
            self.set(src, dst, rate)

    def get(self, src: str, dst: str) -> float:
        return self._measured.get((src, dst), self.default_bytes_per_s)

    def set(self, src: str, dst: str, bytes_per_s: float) -> None:
        _check_rate(bytes_per_s)
        self._measured[(src, dst)] = bytes_per_s

    def transfer_s(self, src: str, dst: str, num_bytes: float) -> float:
        return num_bytes / self.get(src, dst)


def _check_rate(bytes_per_s: float) -> None:
    if not bytes_per_s > 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bytes_per_s}")
