"""Online correction of each instance's published cost model from what its requests took.

A published profile is measured once, on an idle engine; under load an engine runs slower or
faster (a shared CPU, batching, a store in the path), and the control path adds time the model
knows nothing of. So for every instance a ratio measured / published is learned per kind of
time, and an overhead in seconds beside it:

- `prefill`: compute time against the profile's T_prefill (it also scales the queue, which the
  worker predicts with the same profile);
- `transfer`: the planned prefix pull against T_transfer from measured bandwidth;
- `decode`: the mean time between tokens against the profile's step time;
- `overhead_s`: the conductor's placement-to-first-token time minus the worker's own queue +
  compute, i.e. messaging and lookups.

Each is the median of the instance's last `window` samples. Samples are the published model's
own error, log(measured / published), not the corrected one's: with many requests in flight,
learning from predictions made before the latest corrections would overshoot. A median, not a
mean, because on a busy machine a few requests take many times their usual time (an engine's
first requests, a burst of contention): they must not move the price of the next ones, and the
median is what minimises the typical (median) error. Ratios stay within [1/max_ratio,
max_ratio]. Plain Python: the simulator can learn the same way.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

KINDS = ("prefill", "transfer", "decode")


@dataclass
class InstanceCorrection:
    ratios: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 1.0))
    overhead_s: float = 0.0
    samples: dict[str, deque] = field(default_factory=dict)  # kind or "overhead" → recent samples

    @property
    def num_samples(self) -> dict[str, int]:
        return {kind: len(recent) for kind, recent in self.samples.items()}


@dataclass
class CostCorrection:
    window: int = 16  # samples per instance and kind that the median is taken over
    max_ratio: float = 10.0
    is_enabled: bool = True
    instances: dict[str, InstanceCorrection] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (self.window >= 1 and self.max_ratio >= 1):
            raise ValueError(
                f"bad cost correction: window {self.window}, max_ratio {self.max_ratio}"
            )

    def of(self, instance_id: str) -> InstanceCorrection:
        """The instance's correction now (the identity for one never observed, or when off)."""
        if not self.is_enabled:
            return InstanceCorrection()
        return self.instances.get(instance_id) or InstanceCorrection()

    def ratio(self, instance_id: str, kind: str) -> float:
        return self.of(instance_id).ratios[kind]

    def observe(self, instance_id: str, kind: str, published_s: float, measured_s: float) -> None:
        """One request took `measured_s` where the instance's published model said `published_s`."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
        if not (published_s > 0 and measured_s > 0) or not self.is_enabled:
            return
        state = self.instances.setdefault(instance_id, InstanceCorrection())
        bound = math.log(self.max_ratio)
        sample = max(-bound, min(bound, math.log(measured_s / published_s)))
        state.ratios[kind] = math.exp(self._median_with(state, kind, sample))

    def observe_overhead(self, instance_id: str, overhead_s: float) -> None:
        """Time the conductor saw beyond the worker's queue + compute (never below 0)."""
        if not self.is_enabled:
            return
        state = self.instances.setdefault(instance_id, InstanceCorrection())
        state.overhead_s = self._median_with(state, "overhead", max(0.0, overhead_s))

    def _median_with(self, state: InstanceCorrection, kind: str, sample: float) -> float:
        recent = state.samples.setdefault(kind, deque(maxlen=self.window))
        recent.append(sample)
        return statistics.median(recent)

    def forget(self, instance_id: str) -> None:
        """The instance left: a new process under its id starts from its own profile."""
        self.instances.pop(instance_id, None)
