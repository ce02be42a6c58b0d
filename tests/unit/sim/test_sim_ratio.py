"""The P/D ratio controller on simulated time: the counts follow a mix that shifts from
prefill-heavy to decode-heavy, and stay put without the controller; drained instances leave
only once they hold no work, so every admitted request completes."""

import pytest
from sim_helpers import item

from crescent.bench.sim.config import SimConfig, SimConfigError
from crescent.bench.sim.ratio_experiment import phase_of, shifting_mix
from crescent.bench.sim.request import Status
from crescent.bench.sim.run import SimRun
from crescent.conductor.ratio import Bounds, InstanceCounts, RatioConfig

PHASE_S = 240.0
# Prefill-heavy: a 16k-token prompt of new blocks every 0.4 s, two output tokens. Decode-heavy:
# a 1k-token prompt every 0.1 s with 1,500 output tokens, on a decode-bound device.
PREFILL_HEAVY = [
    item(i, i * 0.4, [10_000 + 32 * i + b for b in range(32)], output_length=2)
    for i in range(int(PHASE_S / 0.4))
]
DECODE_HEAVY = [
    item(
        len(PREFILL_HEAVY) + i,
        PHASE_S + i * 0.1,
        [900_000 + 2 * i, 900_001 + 2 * i],
        output_length=1500,
    )
    for i in range(int(PHASE_S / 0.1))
]
TRACE = PREFILL_HEAVY + DECODE_HEAVY
RATIO = RatioConfig(bounds=Bounds(1, 7, 1, 7, max_total=8), persist_windows=2, cooldown_windows=1)


def run(ratio: RatioConfig | None) -> SimRun:
    config = SimConfig(
        num_prefill=2,
        num_decode=2,
        memory_gbps=4000.0,
        ratio=ratio,
        ratio_window_s=10.0,
        instance_start_s=10.0,
    )
    return SimRun(config, TRACE).run()


def counts_at(timeline: list[list[float]], start_s: float, end_s: float) -> InstanceCounts:
    """The most prefill and decode instances serving between start_s and end_s."""
    rows = [row for row in timeline if start_s <= row[0] < end_s]
    return InstanceCounts(max(row[3] for row in rows), max(row[4] for row in rows))


def test_the_counts_follow_the_mix():
    controlled = run(RATIO)
    timeline = controlled.cluster.ratio.timeline
    prefill_phase = counts_at(timeline, PHASE_S / 2, PHASE_S)
    decode_phase = counts_at(timeline, PHASE_S * 1.5, PHASE_S * 2)
    assert prefill_phase.prefill > 2 and prefill_phase.prefill > decode_phase.prefill
    assert decode_phase.decode > 2 and decode_phase.decode > prefill_phase.decode
    assert all(row[3] + row[4] <= 8 for row in timeline)
    assert {r.status for r in controlled.requests} <= {Status.OK, Status.REJECTED}  # none lost

    static = run(None)
    assert static.cluster.serving() == InstanceCounts(2, 2) and static.cluster.ratio is None
    # 2P2D has too little decode room for the decode-heavy phase; the controller makes it.
    assert rejected(controlled) < rejected(static) / 2


def rejected(run: SimRun) -> int:
    return sum(r.status is not Status.OK for r in run.requests)


def test_shifting_mix_turns_the_middle_third_decode_heavy():
    trace = [
        item(i, i * 1.0, list(range(100 * i, 100 * i + 20)), output_length=300) for i in range(9)
    ]
    mixed = shifting_mix(trace)
    phases = [phase_of(r.arrival_s, trace[-1].arrival_s) for r in mixed]
    assert phases == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [r.output_length for r in mixed] == [16] * 3 + [2048] * 3 + [16] * 3
    assert all(r.input_length == 4096 and len(r.hash_ids) == 9 for r in mixed[3:6])


def test_a_controller_on_a_coupled_cluster_is_refused():
    with pytest.raises(SimConfigError):
        SimConfig(coupled="vllm", ratio=RATIO).validate()
    with pytest.raises(SimConfigError):
        SimConfig(ratio=RatioConfig(bounds=Bounds(min_decode=0))).validate()
