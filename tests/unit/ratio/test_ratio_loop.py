"""The conductor's controller loop (conductor/autoscale.py) over a real ClusterView and
Scheduler: a queued prefill side asks for more prefill, the gauges and the DesiredInstances
message say so, draining instances do not count as running, and rejections count as misses."""

from __future__ import annotations

import prometheus_client

from crescent.common.codec import decode, encode
from crescent.common.etcd import MirrorEvent
from crescent.common.messages import DesiredInstances, InstanceInfo, InstanceLoad
from crescent.conductor.autoscale import RatioLoop
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.policy import RejectReason
from crescent.conductor.ratio import InstanceCounts
from crescent.conductor.scheduler import Scheduler
from crescent.conductor.settings import ConductorSettings

MODEL = "m"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def cluster(settings: ConductorSettings) -> tuple[ClusterView, RatioLoop, Clock]:
    clock = Clock()
    view = ClusterView(clock=clock)
    for role, instance_id in (("prefill", "p0"), ("decode", "d0"), ("decode", "d1")):
        info = InstanceInfo(
            role=role, instance_id=instance_id, node="n", model=MODEL, kv_capacity_tokens=10**6
        )
        view.apply_registry(
            MirrorEvent(f"/crescent/c/instances/{role}/{instance_id}", encode(info))
        )
    return view, RatioLoop(settings, view, Scheduler(settings, view, clock), clock), clock


def load(role: str, instance_id: str, **fields) -> InstanceLoad:
    return InstanceLoad(
        role=role, instance_id=instance_id, node="n", sent_at=0, period_s=0.2, **fields
    )


def gauge(role: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(
        "crescent_desired_instances", {"model": MODEL, "role": role}
    )


def test_a_queued_prefill_side_asks_for_more_prefill():
    settings = ConductorSettings(
        ttft_slo_s=2.0,
        ratio_persist_windows=1,
        ratio_urgent_persist_windows=1,
        ratio_cooldown_windows=0,
    )
    view, ratio, clock = cluster(settings)
    for _ in range(5):
        view.apply_load(load("prefill", "p0", num_queued=4, queue_time_s=6.0))
        view.apply_load(load("decode", "d0"))
        view.apply_load(load("decode", "d1", is_accepting=False, not_accepting_reason="draining"))
        ratio.sample()
        clock.now += 0.2
    assert ratio.running(MODEL) == InstanceCounts(1, 1)  # d1 is on its way out
    decision = ratio.decide()[MODEL]
    assert decision.is_change and decision.desired == InstanceCounts(2, 1)
    assert (gauge("prefill"), gauge("decode")) == (2, 1)
    assert ratio.desired(MODEL) == {"prefill": 2, "decode": 1}
    message = decode(encode(ratio.message(MODEL, decision, "conductor-0")), DesiredInstances)
    assert (message.prefill, message.decode, message.model) == (2, 1, MODEL)
    assert message.imbalance < 1 and message.reason.startswith("add-prefill")


def test_rejections_count_against_the_slo_of_the_side_that_refused():
    _, ratio, _ = cluster(ConductorSettings())
    ratio.record_rejection(MODEL, RejectReason.TTFT_SLO)
    ratio.window(MODEL).add_ttft(0.1)
    ratio.record_rejection(MODEL, RejectReason.NO_DECODE)
    signal = ratio.window(MODEL).close()
    assert signal.ttft_attainment == 0.5 and signal.tbt_attainment == 0.0
