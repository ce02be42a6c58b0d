"""The paper's per-request metrics (§7.1), shared by the simulator and the replay client.

TBT is the mean of the longest 10 % of a request's token intervals (at least one interval), so a
request that stalls now and then is judged by its stalls, not by its average. A request is
*effective* when it completed with TTFT and TBT both within their SLOs; the effective request
capacity is the share of effective requests among all requests sent, rejected ones included.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

LONGEST_SHARE = 0.1


@dataclass(frozen=True)
class SloTargets:
    ttft_s: float
    tbt_s: float

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tbt_s > 0):
            raise ValueError(f"SLOs must be > 0, got TTFT {self.ttft_s} s, TBT {self.tbt_s} s")


def tbt_of(intervals: Sequence[float]) -> float:
    """Mean of the longest ceil(10 %) of the intervals; 0 for a request with no interval."""
    if not intervals:
        return 0.0
    count = max(1, math.ceil(LONGEST_SHARE * len(intervals)))
    longest = sorted(intervals, reverse=True)[:count]
    return sum(longest) / count


def is_effective(ok: bool, ttft_s: float | None, tbt_s: float | None, slo: SloTargets) -> bool:
    return ok and ttft_s is not None and ttft_s <= slo.ttft_s and (tbt_s or 0.0) <= slo.tbt_s


def effective_capacity(
    outcomes: Iterable[tuple[bool, float | None, float | None]], slo: SloTargets
) -> float:
    """Share of (ok, ttft, tbt) outcomes that met both SLOs; 0 for no requests."""
    flags = [is_effective(ok, ttft, tbt, slo) for ok, ttft, tbt in outcomes]
    return sum(flags) / len(flags) if flags else 0.0


def percentile(values: Sequence[float], share: float) -> float:
    """Nearest-rank percentile (share in [0, 1]); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[rank - 1]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
