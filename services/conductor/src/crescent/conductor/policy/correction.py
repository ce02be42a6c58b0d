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
That typical correction is republished only when the peers' median moves by more than
TYPICAL_TOLERANCE (relative): every republication reprices each instance that relies on it,
hundreds of them in a large cluster, and a rounding's worth of drift is not worth that.

Consumers that cache prices (the conductor's Pricing) learn what changed from `changed`
(instances whose own correction moved) and `typical_changed` (kinds whose typical did).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from dataclasses import dataclass, field

KINDS = ("prefill", "transfer", "decode")
OVERHEAD = "overhead"
TYPICAL_TOLERANCE = 0.01


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
    # Instances whose own correction changed, and kinds (or OVERHEAD) whose typical correction
    # was republished, since a consumer last cleared them.
    changed: set[str] = field(default_factory=set)
    typical_changed: set[str] = field(default_factory=set)
    _typical: InstanceCorrection = field(default_factory=InstanceCorrection)
    # kind or OVERHEAD → the learned values of the instances that have samples of it, sorted:
    # the peers' median in O(log n) per sample instead of a sort over every instance.
    _learned: dict[str, list[float]] = field(
        default_factory=lambda: {kind: [] for kind in (*KINDS, OVERHEAD)}
    )

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
        typical = self._typical
        if known is None:
            return typical
        samples = known.samples
        if len(samples) == len(KINDS) + 1:  # a kind's deque, once made, is never empty
            return known
        ratios = {k: known.ratios[k] if k in samples else typical.ratios[k] for k in KINDS}
        overhead_s = known.overhead_s if OVERHEAD in samples else typical.overhead_s
        return InstanceCorrection(ratios, overhead_s, samples)

    def has_samples(self, instance_id: str, kind: str) -> bool:
        known = self.instances.get(instance_id)
        return known is not None and kind in known.samples

    def typical(self) -> InstanceCorrection:
        """The median correction of the instances observed so far, per kind and for the
        overhead, as last republished (within TYPICAL_TOLERANCE of the current medians)."""
        return self._typical

    def ratio(self, instance_id: str, kind: str) -> float:
        """`of(instance_id).ratios[kind]`, without building the whole correction."""
        if not self.is_enabled:
            return 1.0
        known = self.instances.get(instance_id)
        if known is not None and kind in known.samples:
            return known.ratios[kind]
        return self._typical.ratios[kind]

    def observe(self, instance_id: str, kind: str, published_s: float, measured_s: float) -> None:
        """One request took `measured_s` where the instance's published model said `published_s`."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
        if not (published_s > 0 and measured_s > 0) or not self.is_enabled:
            return
        state = self.instances.setdefault(instance_id, InstanceCorrection())
        bound = math.log(self.max_ratio)
        sample = max(-bound, min(bound, math.log(measured_s / published_s)))
        old = state.ratios[kind] if kind in state.samples else None
        state.ratios[kind] = math.exp(self._median_with(state, kind, sample))
        self._relearn(instance_id, kind, old, state.ratios[kind])

    def observe_overhead(self, instance_id: str, overhead_s: float) -> None:
        """Time the conductor saw beyond the worker's queue + compute (never below 0)."""
        if not self.is_enabled:
            return
        state = self.instances.setdefault(instance_id, InstanceCorrection())
        old = state.overhead_s if OVERHEAD in state.samples else None
        state.overhead_s = self._median_with(state, OVERHEAD, max(0.0, overhead_s))
        self._relearn(instance_id, OVERHEAD, old, state.overhead_s)

    def _median_with(self, state: InstanceCorrection, kind: str, sample: float) -> float:
        recent = state.samples.setdefault(kind, deque(maxlen=self.window))
        recent.append(sample)
        return statistics.median(recent)

    def _relearn(self, instance_id: str, kind: str, old: float | None, new: float | None) -> None:
        """The instance's learned value of `kind` went from `old` to `new` (None: none)."""
        learned = self._learned[kind]
        if old is not None:
            del learned[bisect.bisect_left(learned, old)]
        if new is not None:
            bisect.insort(learned, new)
        self.changed.add(instance_id)
        self._republish(kind)

    def _republish(self, kind: str) -> None:
        learned = self._learned[kind]
        count = len(learned)
        default = 0.0 if kind == OVERHEAD else 1.0
        median = (
            (
                learned[count // 2]
                if count % 2
                else (learned[count // 2 - 1] + learned[count // 2]) / 2
            )
            if count
            else default
        )
        typical = self._typical
        published = typical.overhead_s if kind == OVERHEAD else typical.ratios[kind]
        if median == published or (
            count and abs(median - published) <= TYPICAL_TOLERANCE * abs(published)
        ):
            return
        if kind == OVERHEAD:
            self._typical = InstanceCorrection(dict(typical.ratios), median)
        else:
            self._typical = InstanceCorrection({**typical.ratios, kind: median}, typical.overhead_s)
        self.typical_changed.add(kind)

    def forget(self, instance_id: str) -> None:
        """The instance left: a new process under its id starts from its own profile."""
        state = self.instances.pop(instance_id, None)
        if state is None:
            return
        for kind in state.samples:
            self._relearn(
                instance_id,
                kind,
                state.overhead_s if kind == OVERHEAD else state.ratios[kind],
                None,
            )
