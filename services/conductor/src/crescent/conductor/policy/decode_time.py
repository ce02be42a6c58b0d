"""t_d, the uniform decode duration of prediction-based early rejection (paper §4.3.4).

Learned from telemetry as a mean of observed decode durations in which older observations fade
with a half-life, so t_d follows the workload through the day (chat in the evening, documents
by day). A prior with a fixed weight keeps the estimate sane before the first observations and
pulls it back after a long quiet spell.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DecodeTimeEstimator:
    prior_s: float = 10.0
    prior_weight: float = 1.0
    half_life_s: float = 300.0
    _weighted_sum: float = 0.0
    _weight: float = 0.0
    _at: float | None = None

    def __post_init__(self) -> None:
        if not (self.prior_s > 0 and self.prior_weight >= 0 and self.half_life_s > 0):
            raise ValueError(
                f"bad decode time estimator: prior {self.prior_s} s, weight "
                f"{self.prior_weight}, half-life {self.half_life_s} s"
            )

    def observe(self, duration_s: float, now: float) -> None:
        """A request's decode took `duration_s` (from joining the batch to its last token)."""
        if duration_s < 0:
            raise ValueError(f"decode duration must be >= 0, got {duration_s}")
        self._decay_to(now)
        self._weighted_sum += duration_s
        self._weight += 1.0

    def estimate(self, now: float) -> float:
        factor = self._factor(now)
        weight = self._weight * factor + self.prior_weight
        if weight == 0:
            return self.prior_s
        return (self._weighted_sum * factor + self.prior_s * self.prior_weight) / weight

    def _factor(self, now: float) -> float:
        if self._at is None:
            return 1.0
        return 0.5 ** (max(0.0, now - self._at) / self.half_life_s)

    def _decay_to(self, now: float) -> None:
        factor = self._factor(now)
        self._weighted_sum *= factor
        self._weight *= factor
        self._at = now if self._at is None else max(self._at, now)
