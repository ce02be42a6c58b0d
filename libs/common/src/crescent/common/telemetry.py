"""The "recent" in telemetry: an exponentially weighted mean, so one slow request moves the
reported figure a little and a lasting change moves it within a few samples."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Ewma:
    weight: float = 0.2  # of the newest sample
    value: float = 0.0
    num_samples: int = 0

    def add(self, sample: float) -> None:
        self.value = (
            sample
            if self.num_samples == 0
            else (1 - self.weight) * self.value + self.weight * sample
        )
        self.num_samples += 1
