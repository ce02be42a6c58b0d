"""The conductor's P/D ratio controller (conductor/ratio, paper §5.1) on simulated time.

The same RatioWindow and RatioController the conductor runs: each telemetry period the
conductor's SLO loads (`Scheduler.slo_loads`) go into the window, each first token's TTFT,
each finished request's TBT and each rejection are its SLO outcomes, and every window the
controller decides. The simulated cluster then does what `crescent up --autoscale` does: a new
instance serves after `instance_start_s` (a process starting, a model loading), a surplus one
stops taking work and leaves once what it holds is done.
"""

from __future__ import annotations

from crescent.conductor.ratio import InstanceCounts, RatioConfig, RatioController, RatioWindow

_TTFT_REASONS = ("ttft-slo", "no-prefill", "prefill-load")


class SimRatio:
    def __init__(
        self, config: RatioConfig, ttft_slo_s: float, tbt_slo_s: float, initial: InstanceCounts
    ) -> None:
        self.window = RatioWindow(ttft_slo_s, tbt_slo_s)
        self.controller = RatioController(config, initial)
        self.timeline: list[
            list[float]
        ] = []  # [time, desired P, desired D, serving P, serving D, f_im]
        self.num_changes = 0

    def record_rejection(self, reason: str) -> None:
        """A request turned away missed the SLO of the side that could not take it."""
        if reason in _TTFT_REASONS:
            self.window.add_ttft(float("inf"))
        else:
            self.window.add_tbt(float("inf"))

    def step(self, now: float, serving: InstanceCounts) -> InstanceCounts:
        """Close the window and decide; returns the desired counts."""
        signal = self.window.close()
        decision = self.controller.step(signal, serving)
        self.num_changes += decision.is_change
        factor = signal.imbalance
        self.timeline.append(
            [
                round(now, 3),
                decision.desired.prefill,
                decision.desired.decode,
                serving.prefill,
                serving.decode,
                round(factor, 4) if factor is not None else None,
            ]
        )
        return decision.desired
