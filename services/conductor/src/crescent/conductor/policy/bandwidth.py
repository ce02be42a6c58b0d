"""Measured node-to-node bandwidth, the denominator of T_transfer (paper §4.1).

The conductor feeds it what transfers actually achieved; until a pair has been measured the
default applies, so a fresh conductor still prices transfers sensibly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

DEFAULT_BYTES_PER_S = 12.5e9  # one 100 Gb/s NIC


class BandwidthTable:
    """(source node, destination node) → bytes/s; directional, since links congest per direction."""

    def __init__(
        self,
        default_bytes_per_s: float = DEFAULT_BYTES_PER_S,
        measured: Mapping[tuple[str, str], float] | None = None,
    ) -> None:
        _check_rate(default_bytes_per_s)
        self.default_bytes_per_s = default_bytes_per_s
        self._measured: dict[tuple[str, str], float] = {}
        self._measured_into: dict[str, dict[str, float]] = {}  # destination → {source: rate}
        self._measured_from: dict[str, dict[str, float]] = {}  # source → {destination: rate}
        self._max_rate: float | None = None  # cached fastest link; None after a change
        for (src, dst), rate in (measured or {}).items():
            self.set(src, dst, rate)

    def get(self, src: str, dst: str) -> float:
        return self._measured.get((src, dst), self.default_bytes_per_s)

    def set(self, src: str, dst: str, bytes_per_s: float) -> None:
        _check_rate(bytes_per_s)
        self._measured[(src, dst)] = bytes_per_s
        self._measured_into.setdefault(dst, {})[src] = bytes_per_s
        self._measured_from.setdefault(src, {})[dst] = bytes_per_s
        self._max_rate = None

    def max_rate(self) -> float:
        """The fastest link anywhere (the default included): a floor for any transfer's time."""
        if self._max_rate is None:
            self._max_rate = max(
                self.default_bytes_per_s, max(self._measured.values(), default=0.0)
            )
        return self._max_rate

    def fastest_source(self, sources: Iterable[str], dst: str) -> tuple[str, float]:
        """The source with the most bandwidth to `dst`, and that rate; equal links go to the
        smaller name. The one rule for where a copy of a block is read from. `sources` must not
        be empty."""
        default = self.default_bytes_per_s
        measured = self._measured_into.get(dst)
        if measured is None:  # every link into dst runs at the default
            return min(sources), default
        best_source, best_rate = "", 0.0
        for source in sources:
            rate = measured.get(source, default)
            if rate > best_rate or (rate == best_rate and source < best_source):
                best_source, best_rate = source, rate
        return best_source, best_rate

    def measured_from(self, source: str) -> Mapping[str, float]:
        """Destination → rate of the links out of `source` that have been measured."""
        return self._measured_from.get(source, {})

    def transfer_s(self, src: str, dst: str, num_bytes: float) -> float:
        return num_bytes / self.get(src, dst)


def _check_rate(bytes_per_s: float) -> None:
    if not bytes_per_s > 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bytes_per_s}")
