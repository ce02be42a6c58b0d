"""Online correction of each instance's published cost model from what its requests took.

A published profile is measured once, on an idle engine; under load an engine runs slower or
faster (a shared CPU, batching, a store in the path), and the control path adds time the model
knows nothing of. So for every instance a ratio measured / predicted is learned per kind of
time, and an overhead in seconds beside it:

- `prefill`: compute time against the profile's T_prefill (it also scales the queue, which the
  worker predicts with the same profile);
- `transfer`: the planned prefix pull against T_transfer from measured bandwidth;
- `decode`: the mean time between tokens against the profile's step time;
- `overhead_s`: the conductor's placement-to-first-token time minus the worker's own queue +
  compute, i.e. messaging and lookups.

Each ratio is a moving average of log(measured / published), the published model's own error
(not the corrected one's: with many requests in flight, learning from predictions made before
the latest corrections would overshoot). The first samples are averaged evenly (weight 1/k),
later ones with `weight`, so an instance is priced right after a few requests and a noisy
machine moves the ratio little per request. Samples are clipped to [1/max_ratio, max_ratio], so
a few absurd ones cannot take an instance out of the running. Plain Python: the simulator can
learn the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

KINDS = ("prefill", "transfer", "decode")


@dataclass
class InstanceCorrection:
    ratios: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 1.0))
    overhead_s: float = 0.0
    num_samples: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys((*KINDS, "overhead"), 0)
    )


@dataclass
class CostCorrection:
    weight: float = 0.1  # share of a sample's log error taken at once, after the first 1/weight
    max_ratio: float = 10.0
    is_enabled: bool = True
    instances: dict[str, InstanceCorrection] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (0 < self.weight <= 1 and self.max_ratio >= 1):
            raise ValueError(
                f"bad cost correction: weight {self.weight}, max_ratio {self.max_ratio}"
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
        current = math.log(state.ratios[kind])
        state.ratios[kind] = math.exp(current + self._weight(state, kind) * (sample - current))

    def observe_overhead(self, instance_id: str, overhead_s: float) -> None:
        """Time the conductor saw beyond the worker's queue + compute (never below 0)."""
        if not self.is_enabled:
            return
        state = self.instances.setdefault(instance_id, InstanceCorrection())
        state.overhead_s += self._weight(state, "overhead") * (
            max(0.0, overhead_s) - state.overhead_s
        )

    def _weight(self, state: InstanceCorrection, kind: str) -> float:
        state.num_samples[kind] += 1
        return max(self.weight, 1.0 / state.num_samples[kind])

    def forget(self, instance_id: str) -> None:
        """The instance left: a new process under its id starts from its own profile."""
        self.instances.pop(instance_id, None)
