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

An instance, or a kind of time, with no samples yet is priced like its observed peers (the
median of theirs), not by its bare profile: the overhead above is paid by every instance, and an
unobserved one priced without it would look cheaper than one holding the request's prefix.
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
    _typical: InstanceCorrection | None = None  # the peers' medians; None: to be worked out again

    def __post_init__(self) -> None:
        if not (self.window >= 1 and self.max_ratio >= 1):
            raise ValueError(
                f"bad cost correction: window {self.window}, max_ratio {self.max_ratio}"
            )

    def of(self, instance_id: str) -> InstanceCorrection:
        """The instance's correction now: what it learned, and its peers' typical correction for
        what it has no samples of yet (the identity when nothing was observed, or when off)."""
        if not self.is_enabled:
            return InstanceCorrection()
        known = self.instances.get(instance_id)
        typical = self.typical()
        if known is None:
            return typical
        if all(known.samples.get(kind) for kind in (*KINDS, "overhead")):
            return known
        ratios = {k: known.ratios[k] if known.samples.get(k) else typical.ratios[k] for k in KINDS}
        overhead_s = known.overhead_s if known.samples.get("overhead") else typical.overhead_s
        return InstanceCorrection(ratios, overhead_s, known.samples)

    def typical(self) -> InstanceCorrection:
        """The median correction of the instances observed so far, per kind and for the overhead."""
        if self._typical is None:
            ratios = {}
            for kind in KINDS:
                learned = [c.ratios[kind] for c in self.instances.values() if c.samples.get(kind)]
                ratios[kind] = statistics.median(learned) if learned else 1.0
            overheads = [c.overhead_s for c in self.instances.values() if c.samples.get("overhead")]
            self._typical = InstanceCorrection(
                ratios, statistics.median(overheads) if overheads else 0.0
            )
        return self._typical

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
        self._typical = None

    def observe_overhead(self, instance_id: str, overhead_s: float) -> None:
        """Time the conductor saw beyond the worker's queue + compute (never below 0)."""
        if not self.is_enabled:
            return
        state = self.instances.setdefault(instance_id, InstanceCorrection())
        state.overhead_s = self._median_with(state, "overhead", max(0.0, overhead_s))
        self._typical = None

    def _median_with(self, state: InstanceCorrection, kind: str, sample: float) -> float:
        recent = state.samples.setdefault(kind, deque(maxlen=self.window))
        recent.append(sample)
        return statistics.median(recent)

    def forget(self, instance_id: str) -> None:
        """The instance left: a new process under its id starts from its own profile."""
        self.instances.pop(instance_id, None)
        self._typical = None
