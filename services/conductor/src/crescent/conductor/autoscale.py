"""The conductor's P/D ratio controller loop (paper §5.1): plan = controller(window) → publish.

Every telemetry period it samples each usable instance's SLO load into the model's window; the
request path adds each first token's TTFT, each token gap's TBT and each rejection (a rejection
is a miss of the SLO that caused it). Every ratio_window_s it closes the window, steps the
model's RatioController and makes the desired counts known twice: as the gauges
crescent_desired_instances{model, role} (a Kubernetes autoscaler scales by them) and under
autoscale/<model> in etcd with this conductor's lease (`crescent up --autoscale` acts on it).
The conductor decides; it starts and stops nothing itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aetcd

from crescent.common.bounds import MAX_IMBALANCE
from crescent.common.codec import encode
from crescent.common.messages import DesiredInstances
from crescent.common.service import Runtime
from crescent.conductor import metrics
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.policy import RejectReason
from crescent.conductor.ratio import (
    InstanceCounts,
    RatioController,
    RatioDecision,
    RatioSignal,
    RatioWindow,
)
from crescent.conductor.scheduler import Scheduler
from crescent.conductor.settings import ConductorSettings

log = logging.getLogger(__name__)

_TTFT_REASONS = (RejectReason.TTFT_SLO, RejectReason.NO_PREFILL)


class RatioLoop:
    def __init__(
        self,
        settings: ConductorSettings,
        view: ClusterView,
        scheduler: Scheduler,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.view = view
        self.scheduler = scheduler
        self.clock = clock
        self._windows: dict[str, RatioWindow] = {}
        self._controllers: dict[str, RatioController] = {}
        self.last_signals: dict[str, RatioSignal] = {}  # of each model's latest closed window

    def window(self, model: str) -> RatioWindow:
        """The model's current window (closing it starts the next in place)."""
        window = self._windows.get(model)
        if window is None:
            window = self._windows[model] = RatioWindow(
                self.settings.ttft_slo_s, self.settings.tbt_slo_s
            )
        return window

    def record_rejection(self, model: str, reason: RejectReason) -> None:
        """A request turned away missed the SLO of the side that could not take it."""
        window = self.window(model)
        if reason in _TTFT_REASONS:
            window.add_ttft(float("inf"))
        else:
            window.add_tbt(float("inf"))

    def sample(self) -> None:
        for model in self.view.models():
            self.window(model).add_loads(*self.scheduler.slo_loads(model))

    def running(self, model: str) -> InstanceCounts:
        now = self.clock()
        return InstanceCounts(
            self.view.count_serving("prefill", model, now),
            self.view.count_serving("decode", model, now),
        )

    def desired(self, model: str) -> dict[str, int] | None:
        """The model's desired counts by role; None before its first window closed."""
        controller = self._controllers.get(model)
        if controller is None:
            return None
        return {"prefill": controller.desired.prefill, "decode": controller.desired.decode}

    def decide(self) -> dict[str, RatioDecision]:
        """Close every model's window and step its controller; the gauges follow."""
        decisions = {}
        for model in self.view.models():
            signal = self.last_signals[model] = self.window(model).close()
            running = self.running(model)
            controller = self._controllers.get(model)
            if controller is None:
                controller = self._controllers[model] = RatioController(
                    self.settings.ratio_config(), running
                )
            decision = decisions[model] = controller.step(signal, running)
            for role in ("prefill", "decode"):
                metrics.DESIRED_INSTANCES.labels(model, role).set(decision.desired.of(role))
            for slo, share in (("ttft", signal.ttft_attainment), ("tbt", signal.tbt_attainment)):
                if share is not None:
                    metrics.SLO_ATTAINMENT.labels(model, slo).set(share)
            if decision.is_change:
                log.info(
                    "desired instances changed",
                    extra={
                        "model": model,
                        "prefill": decision.desired.prefill,
                        "decode": decision.desired.decode,
                        "running_prefill": running.prefill,
                        "running_decode": running.decode,
                        "reason": decision.proposal.reason,
                        "imbalance": signal.imbalance,
                    },
                )
        return decisions

    def message(self, model: str, decision: RatioDecision, conductor: str) -> DesiredInstances:
        signal = self.last_signals.get(model)
        factor = signal.imbalance if signal is not None else None
        if factor is not None:
            factor = min(factor, MAX_IMBALANCE)  # an overloaded side's load has no ceiling
        return DesiredInstances(
            model=model,
            prefill=decision.desired.prefill,
            decode=decision.desired.decode,
            decided_at=time.time(),
            conductor=conductor,
            imbalance=factor,
            reason=f"{decision.proposal.action.value}: {decision.proposal.reason}",
        )

    async def run(self, runtime: Runtime) -> None:
        """Sample every telemetry period, decide and publish every window, until cancelled."""
        period_s = self.settings.telemetry_period_s
        window_s = self.settings.ratio_window_s
        window_ends = self.clock() + window_s
        while True:
            await asyncio.sleep(period_s)
            self.sample()
            if self.clock() < window_ends:
                continue
            window_ends += window_s
            for model, decision in self.decide().items():
                await self._publish(runtime, self.message(model, decision, runtime.instance_id))

    async def _publish(self, runtime: Runtime, desired: DesiredInstances) -> None:
        """Write autoscale/<model> under this conductor's lease; a failed write waits for the
        next window (the gauges already say the same)."""
        key = runtime.keys.autoscale(desired.model)
        try:
            async with asyncio.timeout(self.settings.connect_timeout_s):
                await runtime.leased.put(key, encode(desired))
        except (TimeoutError, aetcd.exceptions.ClientError, OSError) as exc:
            log.warning(
                "desired instances not written to etcd", extra={"key": key, "error": repr(exc)}
            )
