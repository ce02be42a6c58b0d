"""Scheduling benchmark: how long one decision of the conductor takes, end to end.

For 8, 64 and 512 prefill instances (each on its own node, with as many decode instances) and
prompts of 16, 256 and 1,024 blocks of 512 tokens, a real Scheduler is fed as a running
conductor is (schedule_cluster): registry entries, a published cost profile per instance (two
kinds of hardware), telemetry, online corrections learned from earlier requests, and a block
index with a replicated system prompt and partial session prefixes. Each timed call is
`Scheduler.schedule(request, model)`, what the conductor runs per request: the view's
snapshots of both roles (each instance priced by its own corrected model), usable-instance
filters, prefix matching, Algorithm 1, the decode choice and early rejection. Between two
timed calls the scheduler records the decision, learns from a finished request and reads
telemetry; of these only the recording, which the conductor also runs for every request
(`Scheduler.record`: the request's assignments, the blocks' heat, the feedback's prediction),
is timed, apart (`record_p50_us`, `record_p99_us`). Requests cycle over 64 prompts. The
least-loaded baseline is timed the same way on a cluster built from the same seed.

`--admission predictive --inflight N` times the other admission with N requests in flight (8
by default): it projects each decode instance's batch from every one of them.

Times are from time.perf_counter_ns, reported as p50 / p99 in microseconds, with the same
percentiles of the thread's CPU time (time.thread_time_ns): on a shared host, wall-time tails
that CPU time lacks are the process waiting for a core, not the scheduler.

    python -m crescent.bench.schedule_bench --json schedule.json
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import time
from pathlib import Path

from crescent.bench.cli import add_admission_arguments
from crescent.bench.schedule_cluster import MODEL, ConductorLoad, build_conductor

INSTANCES = (8, 64, 512)
BLOCKS = (16, 256, 1024)
WARMUP = 64
TARGET_CASE, TARGET_P99_US = "512x1024", 1000.0
POLICIES = ("kv-centric", "least-loaded")


def time_scheduler(load: ConductorLoad, repeat: int) -> dict:
    scheduler, requests = load.scheduler, load.requests
    # Warm caches and code paths, and reach the steady state: the requests in flight too.
    for i in range(WARMUP + load.num_inflight):
        load.between_decisions(scheduler.schedule(requests[i % len(requests)], MODEL))
    gc.collect()
    gc.freeze()  # as the conductor does once its state is loaded (app.py)
    wall, cpu, recorded = [], [], []
    for i in range(repeat):
        request = requests[i % len(requests)]
        start, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
        outcome = scheduler.schedule(request, MODEL)
        cpu.append(time.thread_time_ns() - start_cpu)
        wall.append(time.perf_counter_ns() - start)
        recorded.append(load.between_decisions(outcome))
    gc.unfreeze()  # the next case's cluster replaces this one
    # CPU time beside wall time tells the code's own cost from time spent preempted on a busy host.
    return {
        "p50_us": _percentile(wall, 0.50),
        "p99_us": _percentile(wall, 0.99),
        "cpu_p50_us": _percentile(cpu, 0.50),
        "cpu_p99_us": _percentile(cpu, 0.99),
        "record_p50_us": _percentile(recorded, 0.50),
        "record_p99_us": _percentile(recorded, 0.99),
    }


def _percentile(samples_ns: list[int], q: float) -> float:
    ordered = sorted(samples_ns)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] / 1e3


def run_schedule_bench(
    repeat: int = 200,
    instances: tuple[int, ...] = INSTANCES,
    blocks: tuple[int, ...] = BLOCKS,
    admission: str = "early",
    num_inflight: int = 8,
) -> dict:
    """Every (instances, blocks) case for kv-centric, then least-loaded on the same cluster."""
    cases: dict[str, list[dict]] = {policy: [] for policy in POLICIES}
    for num_instances in instances:
        for num_blocks in blocks:
            name = f"{num_instances}x{num_blocks}"
            for policy in POLICIES:
                load = build_conductor(
                    num_instances,
                    num_blocks,
                    policy=policy,
                    admission=admission,
                    num_inflight=num_inflight,
                )
                label = name if policy == POLICIES[0] else f"{policy}-{name}"
                cases[policy].append({"case": label, **time_scheduler(load, repeat)})
                del load
    return {
        "bench": "schedule",
        "repeat": repeat,
        "block_size": 512,
        "admission": admission,
        "inflight": num_inflight,
        "cases": [case for policy in POLICIES for case in cases[policy]],
    }


def format_table(result: dict) -> str:
    lines = [
        (
            f"{result['bench']} (decision time per request, {result['repeat']} requests per "
            f"case, {result['admission']} admission, {result['inflight']} in flight)"
        ),
        (
            f"{'case':<28}{'p50 µs':>10}{'p99 µs':>10}{'cpu p50 µs':>12}{'cpu p99 µs':>12}"
            f"{'record p50 µs':>15}{'record p99 µs':>15}"
        ),
    ]
    for case in result["cases"]:
        lines.append(
            f"{case['case']:<28}{case['p50_us']:>10.1f}{case['p99_us']:>10.1f}"
            f"{case['cpu_p50_us']:>12.1f}{case['cpu_p99_us']:>12.1f}"
            f"{case['record_p50_us']:>15.1f}{case['record_p99_us']:>15.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--repeat", type=int, default=200, help="timed decisions per case (default 200)"
    )
    add_admission_arguments(parser)
    args = parser.parse_args(argv)
    logging.getLogger("crescent").setLevel(logging.ERROR)  # the bench's feedback is not news
    result = run_schedule_bench(args.repeat, admission=args.admission, num_inflight=args.inflight)
    print(format_table(result))
    target = next((c for c in result["cases"] if c["case"] == TARGET_CASE), None)
    if target is not None:
        verdict = "meets" if target["p99_us"] < TARGET_P99_US else "MISSES"
        print(
            f"{TARGET_CASE}: p99 {target['p99_us']:.1f} µs {verdict} "
            f"the {TARGET_P99_US:.0f} µs target"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
