"""`crescent sim experiment ratio`: the P/D ratio controller (paper §5.1) tracking a mix that
shifts, against static splits of the same budget.

The trace keeps its arrivals and prefixes; its mix is made to shift as the paper's day and
evening do, in three equal spans of time: prefill-heavy (outputs cut to 16 tokens),
decode-heavy (prompts cut to their first DECODE_INPUT tokens, outputs set to DECODE_OUTPUT),
prefill-heavy again. The decode device is slowed to DECODE_MEMORY_GBPS (decode-bound: with the
A800's full HBM bandwidth decode never comes near a 100 ms TBT SLO, and no mix needs more of
it). The controlled cluster starts at 6P6D within a budget of 12 instances; the static ones run
6P6D, 8P4D and 4P8D throughout.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from crescent.bench.sim.cli import config_from
from crescent.bench.sim.request import Status
from crescent.bench.sim.run import SimRun
from crescent.bench.slo import SloTargets, effective_capacity
from crescent.bench.trace import TRACE_BLOCK_TOKENS, TraceRequest
from crescent.conductor.ratio import Bounds, RatioConfig

PHASES = ("prefill-heavy", "decode-heavy", "prefill-heavy again")
PREFILL_PHASE_OUTPUT = 16
DECODE_INPUT = 4096
DECODE_OUTPUT = 2048
DECODE_MEMORY_GBPS = 4000.0
BUDGET = 12
CONTROLLER = RatioConfig(
    bounds=Bounds(2, 10, 2, 10, BUDGET),
    persist_windows=3,
    urgent_persist_windows=1,
    cooldown_windows=1,
)
WINDOW_S = 10.0
INSTANCE_START_S = 15.0
STATIC_SPLITS = ((6, 6), (8, 4), (4, 8))


def phase_of(arrival_s: float, end_s: float) -> int:
    return min(len(PHASES) - 1, int(len(PHASES) * arrival_s / end_s)) if end_s > 0 else 0


def shifting_mix(trace: Sequence[TraceRequest]) -> list[TraceRequest]:
    """The trace with its mix forced to shift (see the module docstring)."""
    end_s = trace[-1].arrival_s if trace else 0.0
    shifted = []
    for item in trace:
        if phase_of(item.arrival_s, end_s) == 1:
            num_input = min(item.input_length, DECODE_INPUT)
            shifted.append(
                dataclasses.replace(
                    item,
                    input_length=num_input,
                    output_length=DECODE_OUTPUT,
                    hash_ids=item.hash_ids[: num_input // TRACE_BLOCK_TOKENS + 1],
                )
            )
        else:
            shifted.append(
                dataclasses.replace(
                    item, output_length=min(item.output_length, PREFILL_PHASE_OUTPUT)
                )
            )
    return shifted


def _by_phase(run: SimRun) -> list[float]:
    """Effective request capacity of the requests that arrived in each phase."""
    slo = SloTargets(run.config.ttft_slo_s, run.config.tbt_slo_s)
    end_s = max(r.arrival_s for r in run.requests)
    return [
        round(
            effective_capacity(
                (
                    (r.status is Status.OK, r.ttft_s, r.tbt_s)
                    for r in run.requests
                    if phase_of(r.arrival_s, end_s) == phase
                ),
                slo,
            ),
            4,
        )
        for phase in range(len(PHASES))
    ]


def _instance_s(timeline: list[list[float]], end_s: float) -> float:
    """Instance-seconds served, from the controller's timeline of serving counts."""
    total = 0.0
    for (t, _, _, prefill, decode, _), (t_next, *_) in zip(timeline, [*timeline[1:], [end_s]]):
        total += (prefill + decode) * max(0.0, t_next - t)
    return total


def ratio(trace: Sequence[TraceRequest], args: argparse.Namespace) -> list[dict]:
    mixed = shifting_mix(trace)
    cases = []
    for num_prefill, num_decode in STATIC_SPLITS:
        run = SimRun(
            config_from(
                args, num_prefill=num_prefill, num_decode=num_decode, memory_gbps=DECODE_MEMORY_GBPS
            ),
            mixed,
        ).run()
        cases.append(
            {
                **run.summary(f"static {num_prefill}P{num_decode}D"),
                "by_phase": _by_phase(run),
                "instance_s": (num_prefill + num_decode) * run.loop.now,
            }
        )
    run = SimRun(
        config_from(
            args,
            num_prefill=6,
            num_decode=6,
            memory_gbps=DECODE_MEMORY_GBPS,
            ratio=CONTROLLER,
            ratio_window_s=WINDOW_S,
            instance_start_s=INSTANCE_START_S,
        ),
        mixed,
    ).run()
    timeline = run.cluster.ratio.timeline
    cases.append(
        {
            **run.summary("controller"),
            "by_phase": _by_phase(run),
            "instance_s": _instance_s(timeline, run.loop.now),
            "num_changes": run.cluster.ratio.num_changes,
            "phase_ends_s": [
                round(max(r.arrival_s for r in run.requests) * (i + 1) / len(PHASES), 3)
                for i in range(len(PHASES))
            ],
            "count_timeline": timeline,
        }
    )
    return cases
