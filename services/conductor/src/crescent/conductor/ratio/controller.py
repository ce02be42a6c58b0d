"""The P/D ratio controller of the paper's §5.1: how many prefill and decode instances to run.

Once per window it reads that window's signal (each side's mean SLO load, hence f_im, and the
share of requests that met the TTFT and TBT SLOs) and proposes one step:

- a side that misses its SLO (attainment below target, or load near its SLO) gets one more
  instance; when both do, the heavier side by f_im (the paper: scale out the heavier side);
  if the total budget is spent, the lighter side gives one up instead (the ratio shifts);
- f_im outside the band [1/band, band] with no SLO trouble: the lighter side gives up an idle
  instance, or, if it is at its minimum, the heavier side gets one;
- both sides idle: the lighter side gives one up (scale in the less-loaded side).

Production traffic is skewed, so driving f_im straight to 1 oscillates. A proposal is carried
out only after it has persisted for `persist_windows` windows in a row (a side that misses its
SLO grows after `urgent_persist_windows`: capacity is added faster than it is removed), no
sooner than `cooldown_windows` after the last change, and not while the last change has yet to
take effect
(the cluster does not run the desired counts yet, for at most `settle_windows`). Each change is
one instance, within the bounds.

Pure: no I/O, no clock; the conductor and the simulator call `step` once per window.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from crescent.conductor.ratio.window import RatioSignal


class RatioConfigError(ValueError):
    """Bounds or thresholds the controller cannot work with."""


@dataclass(frozen=True)
class InstanceCounts:
    prefill: int
    decode: int

    @property
    def total(self) -> int:
        return self.prefill + self.decode

    def of(self, role: str) -> int:
        return self.prefill if role == "prefill" else self.decode

    def plus(self, role: str, delta: int) -> InstanceCounts:
        return replace(self, **{role: self.of(role) + delta})


@dataclass(frozen=True)
class Bounds:
    min_prefill: int = 1
    max_prefill: int = 8
    min_decode: int = 1
    max_decode: int = 8
    max_total: int = 0  # instances of both roles together (0: max_prefill + max_decode)

    def validate(self) -> None:
        if (
            not 1 <= self.min_prefill <= self.max_prefill
            or not 1 <= self.min_decode <= self.max_decode
        ):
            raise RatioConfigError(
                f"need 1 <= min <= max for each role, got prefill "
                f"{self.min_prefill}..{self.max_prefill}, decode "
                f"{self.min_decode}..{self.max_decode}"
            )
        if self.max_total and self.max_total < self.min_prefill + self.min_decode:
            raise RatioConfigError(
                f"max_total {self.max_total} is below the minimums' sum "
                f"{self.min_prefill + self.min_decode}"
            )

    def low(self, role: str) -> int:
        return self.min_prefill if role == "prefill" else self.min_decode

    def high(self, role: str) -> int:
        return self.max_prefill if role == "prefill" else self.max_decode

    @property
    def total_budget(self) -> int:
        return self.max_total or self.max_prefill + self.max_decode

    def clamp(self, counts: InstanceCounts) -> InstanceCounts:
        prefill = min(max(counts.prefill, self.min_prefill), self.max_prefill)
        decode = min(max(counts.decode, self.min_decode), self.max_decode)
        while prefill + decode > self.total_budget:  # trim the larger side first
            if prefill - self.min_prefill >= decode - self.min_decode:
                prefill -= 1
            else:
                decode -= 1
        return InstanceCounts(prefill, decode)


@dataclass(frozen=True)
class RatioConfig:
    bounds: Bounds = Bounds()
    imbalance_band: float = 1.5  # f_im beyond [1/band, band]: the ratio is off
    busy_load: float = 0.8  # a side whose mean SLO load exceeds this is close to missing its SLO
    idle_load: float = 0.2  # a side below this has capacity to spare
    attainment_target: float = 0.9  # share of requests within their SLO below which a side is short
    persist_windows: int = 3
    urgent_persist_windows: int = 2  # for a proposal that grows a side missing its SLO
    cooldown_windows: int = 2
    settle_windows: int = 6

    def validate(self) -> None:
        self.bounds.validate()
        if not self.imbalance_band > 1:
            raise RatioConfigError(f"imbalance_band must be > 1, got {self.imbalance_band}")
        if not 0 <= self.idle_load < self.busy_load:
            raise RatioConfigError(
                f"need 0 <= idle_load < busy_load, got {self.idle_load}, {self.busy_load}"
            )
        if not 0 < self.attainment_target <= 1:
            raise RatioConfigError(
                f"attainment_target must be in (0, 1], got {self.attainment_target}"
            )
        if min(self.persist_windows, self.urgent_persist_windows) < 1:
            raise RatioConfigError("persist_windows and urgent_persist_windows must be >= 1")
        if self.cooldown_windows < 0 or self.settle_windows < 0:
            raise RatioConfigError("cooldown_windows and settle_windows must be >= 0")


class Action(enum.Enum):
    HOLD = "hold"
    ADD_PREFILL = "add-prefill"
    ADD_DECODE = "add-decode"
    REMOVE_PREFILL = "remove-prefill"
    REMOVE_DECODE = "remove-decode"

    @staticmethod
    def add(role: str) -> Action:
        return Action.ADD_PREFILL if role == "prefill" else Action.ADD_DECODE

    @staticmethod
    def remove(role: str) -> Action:
        return Action.REMOVE_PREFILL if role == "prefill" else Action.REMOVE_DECODE

    def apply(self, counts: InstanceCounts) -> InstanceCounts:
        if self is Action.HOLD:
            return counts
        role = "prefill" if self in (Action.ADD_PREFILL, Action.REMOVE_PREFILL) else "decode"
        return counts.plus(role, 1 if self in (Action.ADD_PREFILL, Action.ADD_DECODE) else -1)


@dataclass(frozen=True)
class Proposal:
    action: Action
    reason: str
    is_urgent: bool = False  # it makes room for a side that misses its SLO


def _other(role: str) -> str:
    return "decode" if role == "prefill" else "prefill"


def propose(signal: RatioSignal, desired: InstanceCounts, config: RatioConfig) -> Proposal:
    """The one step this window's signal asks for, given the counts desired so far."""
    factor = signal.imbalance
    if factor is None:
        return Proposal(Action.HOLD, "no load samples from one side")
    bounds = config.bounds
    heavier = "decode" if factor >= 1 else "prefill"
    short = [role for role in ("prefill", "decode") if _is_short(signal, role, config)]
    if short:
        role = short[0] if len(short) == 1 else heavier
        return _grow(
            role, desired, config, f"{role} misses its SLO (f_im {factor:.2f})", is_urgent=True
        )
    if factor > config.imbalance_band or factor < 1 / config.imbalance_band:
        lighter = _other(heavier)
        reason = (
            f"f_im {factor:.2f} outside "
            f"[{1 / config.imbalance_band:.2f}, {config.imbalance_band:.2f}]"
        )
        if signal.load(lighter) < config.idle_load and desired.of(lighter) > bounds.low(lighter):
            return Proposal(Action.remove(lighter), f"{reason}: {lighter} idle")
        return _grow(heavier, desired, config, reason, is_urgent=False)
    if max(signal.prefill_load, signal.decode_load) < config.idle_load:
        for role in (_other(heavier), heavier):
            if desired.of(role) > bounds.low(role):
                return Proposal(Action.remove(role), f"both sides idle: fewer {role}")
    return Proposal(Action.HOLD, f"balanced (f_im {factor:.2f})")


def _is_short(signal: RatioSignal, role: str, config: RatioConfig) -> bool:
    attainment = signal.ttft_attainment if role == "prefill" else signal.tbt_attainment
    return signal.load(role) > config.busy_load or (
        attainment is not None and attainment < config.attainment_target
    )


def _grow(
    role: str, desired: InstanceCounts, config: RatioConfig, reason: str, is_urgent: bool
) -> Proposal:
    """One more `role` instance; for a side missing its SLO (`is_urgent`) with the total budget
    spent, one fewer of the other role instead, so the ratio still moves."""
    bounds = config.bounds
    if desired.of(role) >= bounds.high(role):
        return Proposal(Action.HOLD, f"{reason}; {role} at its maximum {bounds.high(role)}")
    if desired.total < bounds.total_budget:
        return Proposal(Action.add(role), reason, is_urgent)
    other = _other(role)
    if is_urgent and desired.of(other) > bounds.low(other):
        return Proposal(
            Action.remove(other),
            f"{reason}; total at {bounds.total_budget}: fewer {other} first",
            is_urgent,
        )
    return Proposal(Action.HOLD, f"{reason}; total at its maximum {bounds.total_budget}")


@dataclass(frozen=True)
class RatioDecision:
    desired: InstanceCounts
    proposal: Proposal
    is_change: bool  # `desired` changed in this window
    num_persisted: int  # windows in a row the proposal has been made


class RatioController:
    """`propose` with hysteresis, holding the desired counts between windows."""

    def __init__(self, config: RatioConfig, initial: InstanceCounts) -> None:
        config.validate()
        self.config = config
        self.desired = config.bounds.clamp(initial)
        self._pending = Action.HOLD
        self._num_persisted = 0
        self._windows_since_change = config.cooldown_windows  # the first change needs no cooldown
        self._windows_unsettled = 0

    def step(self, signal: RatioSignal, running: InstanceCounts) -> RatioDecision:
        """One window: `signal` measured over it, `running` the instances serving at its end."""
        self._windows_since_change += 1
        proposal = propose(signal, self.desired, self.config)
        if proposal.action is Action.HOLD or proposal.action is not self._pending:
            self._num_persisted = 0
        self._pending = proposal.action
        if proposal.action is not Action.HOLD:
            self._num_persisted += 1
        self._windows_unsettled = self._windows_unsettled + 1 if running != self.desired else 0
        is_settled = (
            self._windows_unsettled == 0 or self._windows_unsettled > self.config.settle_windows
        )
        needed = (
            self.config.urgent_persist_windows
            if proposal.is_urgent
            else self.config.persist_windows
        )
        is_change = (
            self._num_persisted >= needed
            and is_settled
            and self._windows_since_change > self.config.cooldown_windows
        )
        num_persisted = self._num_persisted
        if is_change:
            self.desired = proposal.action.apply(self.desired)
            self._num_persisted = 0
            self._pending = Action.HOLD
            self._windows_since_change = 0
            self._windows_unsettled = 0
        return RatioDecision(self.desired, proposal, is_change, num_persisted)
