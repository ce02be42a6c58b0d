"""`crescent bench control-plane`: what the control path costs, with compute taken out.

The emulated engine runs at time scale 0, so every millisecond measured is HTTP, tokenizing,
scheduling, NATS hops, the decode batch loop and SSE/JSON relaying. Side by side in one run:
  http-direct  an aiohttp server answering the same JSON without a cluster (the baseline);
  1P1D, 4P4D   a real local cluster (all services as processes);
  1P1D-on-decode  1P1D whose conductor has the decode instance compute prompts of up to 512
               uncached tokens itself (`--local-prefill 512`): the bench's prompt never visits
               the prefill instance, the path a short prompt takes under `--local-prefill auto`.
  floor-1P1D   1P1D's NATS messages between three bare processes doing nothing else
               (messaging_floor.py): what the hops cost; the rest of 1P1D's is Crescent's work.
Latency is measured one request at a time (no queueing); requests/s with `concurrency` in flight.
With --compare CHECKOUT (another checkout of this repository, such as a git worktree of an
older commit) each cluster case also runs from that checkout's code, both clusters up at once:
the one-at-a-time requests take turns and the loaded runs go in halves, A B B A, so the
machine's load falls on both alike and a change under a millisecond shows (each cluster's
absolute figures are higher than alone: the other's telemetry shares the cores).
One more case, in this process, times what the conductor does with a body whose prompt is
8,000 token ids (strict JSON, then the OpenAI fields checked into a request) against the
standard library's json.loads of the same bytes.
`cpu_ms_per_request` is the CPU time the serving processes (for a cluster: every one of them,
NATS and etcd included) spent during the loaded run, per request: unlike latency and requests/s,
it barely moves when other work shares the machine's cores. A cluster case splits it by role,
`cpu_ms_<role>` (conductor, prefill, decode, store, nats, etcd; all instances of a role
together), which says whose work a change should take off.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from crescent.bench.conductor_metrics import num_prefilled_on_decode
from crescent.bench.load import LoadResult, run_load, run_turns
from crescent.cluster.infra import nats_spec
from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.cluster.processes import ManagedProcess, is_port_open
from crescent.common.ports import free_port
from crescent.conductor.http_body import parse_json
from crescent.conductor.openai_api import parse_completion

MODEL = "crescent-emulated"
WARMUP_REQUESTS = 20
NUM_PROMPT_IDS = 8000
NUM_PARSES = 200
REPOSITORY = Path(__file__).resolve().parents[4]  # bench/src/crescent/bench/<this file>
FLOOR_CASE = "floor-1P1D"
# name, prefill and decode instances each, conductor flags, whether decode computes the prompts
CLUSTER_CASES = (
    ("1P1D", 1, [], False),
    ("4P4D", 4, [], False),
    ("1P1D-on-decode", 1, ["--local-prefill", "512"], True),
)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
    return ticks / os.sysconf("SC_CLK_TCK")


def _num_serial(num_requests: int) -> int:
    """Requests sent one at a time for the latency figures."""
    return max(num_requests // 4, 50)


@dataclass
class Target:
    """A server measured: where it answers, and the processes whose CPU time it costs (their
    roles by pid; a bare server has one role, "server")."""

    url: str
    roles: dict[int, str]


def _measure(
    targets: list[Target], num_requests: int, concurrency: int, max_tokens: int
) -> list[dict]:
    """Each target's figures. Two targets (--compare) are measured side by side: the one-at-a-
    time requests take turns, and the loaded runs go in two halves in the order A B B A."""
    body = {
        "model": MODEL,
        "prompt": "Benchmark the control path of Crescent. " * 4,
        "max_tokens": max_tokens,
    }
    urls = [target.url for target in targets]
    asyncio.run(run_turns(urls, body, WARMUP_REQUESTS))
    serial = asyncio.run(run_turns(urls, body, _num_serial(num_requests)))
    loaded: list[list[LoadResult]] = [[] for _ in targets]
    cpu_s: list[dict[str, float]] = [dict.fromkeys(t.roles.values(), 0.0) for t in targets]
    order = list(range(len(targets)))
    num_halves = 1 if len(targets) == 1 else 2
    for k in order + order[::-1] if num_halves == 2 else order:
        cpu_before = {pid: _cpu_seconds(pid) for pid in targets[k].roles}
        loaded[k].append(
            asyncio.run(run_load(urls[k], body, num_requests // num_halves, concurrency))
        )
        for pid, role in targets[k].roles.items():
            cpu_s[k][role] += _cpu_seconds(pid) - cpu_before[pid]
    figures = []
    for k, target in enumerate(targets):
        num_errors = serial[k].num_errors + sum(run.num_errors for run in loaded[k])
        if num_errors:
            raise RuntimeError(f"{target.url}: {num_errors} requests failed")
        num_loaded = sum(run.num_requests for run in loaded[k])
        loaded_latencies = LoadResult(
            num_loaded,
            0,
            sum(run.seconds for run in loaded[k]),
            [latency for run in loaded[k] for latency in run.latencies_s],
        )
        figure = {
            "rps": round(loaded_latencies.requests_per_s, 1),
            "p50_ms": round(serial[k].percentile_ms(50), 3),
            "p99_ms": round(serial[k].percentile_ms(99), 3),
            "loaded_p50_ms": round(loaded_latencies.percentile_ms(50), 3),
            "loaded_p99_ms": round(loaded_latencies.percentile_ms(99), 3),
            "cpu_ms_per_request": round(sum(cpu_s[k].values()) * 1000 / num_loaded, 3),
        }
        if len(cpu_s[k]) > 1:
            figure.update(
                {f"cpu_ms_{role}": round(s * 1000 / num_loaded, 3) for role, s in cpu_s[k].items()}
            )
        figures.append(figure)
    return figures


def _wait_for_port(port: int, processes: list[subprocess.Popen], what: str) -> None:
    deadline = time.monotonic() + 20
    while not is_port_open(port):
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.05)


def _floor(num_requests: int, concurrency: int, max_tokens: int) -> dict:
    """floor-1P1D: a NATS server and messaging_floor's three processes."""
    nats_port, http_port = free_port(), free_port()
    workdir = tempfile.TemporaryDirectory(prefix="crescent-bench-floor-")
    nats_server = ManagedProcess(nats_spec(nats_port), Path(workdir.name))
    roles: dict[int, str] = {}
    processes: list[subprocess.Popen] = []
    try:
        nats_server.start()
        nats_server.wait_ready(20)
        roles[nats_server.pid] = "nats"
        for role in ("prefill", "decode", "conductor"):
            argv = [sys.executable, "-m", "crescent.bench.messaging_floor", role]
            argv += ["--nats-url", f"nats://127.0.0.1:{nats_port}", "--port", str(http_port)]
            processes.append(subprocess.Popen(argv))
            roles[processes[-1].pid] = role
        _wait_for_port(http_port, processes, "the messaging floor")
        return _measure(
            [Target(f"http://127.0.0.1:{http_port}/v1/completions", roles)],
            num_requests,
            concurrency,
            max_tokens,
        )[0]
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(10)
        nats_server.stop()
        workdir.cleanup()


def _baseline(num_requests: int, concurrency: int, max_tokens: int) -> dict:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "crescent.bench.echo_server", "--port", str(port)]
    )
    try:
        _wait_for_port(port, [server], "the baseline server")
        return _measure(
            [Target(f"http://127.0.0.1:{port}/v1/completions", {server.pid: "server"})],
            num_requests,
            concurrency,
            max_tokens,
        )[0]
    finally:
        server.terminate()
        server.wait(10)


def _cluster(
    num_instances: int,
    num_requests: int,
    concurrency: int,
    max_tokens: int,
    conductor_args: list[str],
    on_decode: bool,
    compare: Path | None,
) -> list[dict]:
    """The case's figures, then, with `compare`, those of the same cluster run from that
    checkout, measured side by side. It fails unless each conductor says its decode instance
    computed every prompt when `on_decode` says so, and none otherwise."""
    env = {"CRESCENT_LOG_LEVEL": "WARNING"}
    envs = [env] if compare is None else [env, {**env, "PYTHONPATH": checkout_path(compare)}]
    with tempfile.TemporaryDirectory(prefix="crescent-bench-") as workdir:
        clusters = [
            LocalCluster(
                ClusterSpec(
                    workdir=Path(workdir) / str(k),
                    api_port=free_port(),
                    num_prefill=num_instances,
                    num_decode=num_instances,
                    engine_args=["--emulated-time-scale", "0"],
                    env=cluster_env,
                    conductor_args=conductor_args,
                )
            )
            for k, cluster_env in enumerate(envs)
        ]
        try:
            for cluster in clusters:
                cluster.start(timeout_s=120)
            targets = [
                Target(f"{cluster.api_url}/v1/completions", cluster.roles_by_pid())
                for cluster in clusters
            ]
            figures = _measure(targets, num_requests, concurrency, max_tokens)
            nums_on_decode = [num_prefilled_on_decode(cluster.api_url) for cluster in clusters]
        finally:
            for cluster in clusters:
                cluster.stop()
    num_sent = (
        WARMUP_REQUESTS + _num_serial(num_requests) + num_requests // len(clusters) * len(clusters)
    )
    for num_on_decode in nums_on_decode:
        if num_on_decode != (num_sent if on_decode else 0):
            raise RuntimeError(
                f"the decode instance computed {num_on_decode} of {num_sent} prompts; "
                f"expected {'all' if on_decode else 'none'}"
            )
    return figures


def checkout_path(checkout: Path) -> str:
    """PYTHONPATH that runs the services from `checkout`, another clone or worktree of this
    repository: its libs/*/src and services/*/src, which come before the installed packages."""
    sources = sorted(checkout.glob("libs/*/src")) + sorted(checkout.glob("services/*/src"))
    if not any((source / "crescent" / "conductor").is_dir() for source in sources):
        raise ValueError(f"{checkout} is not a checkout of this repository (no services/*/src)")
    return os.pathsep.join(str(source.resolve()) for source in sources)


def commit_of(checkout: Path) -> str:
    """The checkout's commit, "+dirty" when it has changes; "unknown" outside git."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(checkout), *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changes = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if changes else "")


def _median_ms(work, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def _token_id_body() -> dict:
    """The conductor's parse of a body with an 8,000-id prompt against json.loads alone."""
    prompt = [(i * 7919) % 32000 for i in range(NUM_PROMPT_IDS)]
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 8}).encode()
    request = parse_completion(parse_json(body))
    if request.prompt_token_ids != prompt:
        raise RuntimeError("the parsed prompt is not the one sent")
    parse_ms = _median_ms(lambda: parse_completion(parse_json(body)), NUM_PARSES)
    json_ms = _median_ms(lambda: json.loads(body), NUM_PARSES)
    return {
        "case": f"parse-{NUM_PROMPT_IDS}-token-ids",
        "parse_ms": round(parse_ms, 3),
        "json_loads_ms": round(json_ms, 3),
        "parse_over_json_loads": round(parse_ms / json_ms, 2),
    }


def run_control_plane_bench(
    num_requests: int = 400,
    concurrency: int = 16,
    max_tokens: int = 8,
    case_names: list[str] | None = None,
    compare: Path | None = None,
) -> dict:
    """`case_names`: the cases to run besides the baseline (default all); `compare`: another
    checkout, whose cluster of each cluster case runs beside this one's (its figures under
    compare_*)."""
    known = [FLOOR_CASE, *(name for name, *_ in CLUSTER_CASES)]
    unknown = sorted(set(case_names or ()) - set(known))
    if unknown:
        raise ValueError(f"no case {', '.join(unknown)}; the cases: {', '.join(known)}")
    if compare is not None:
        checkout_path(compare)  # fail before any cluster starts
    baseline = _baseline(num_requests, concurrency, max_tokens)
    cases = [{"case": "http-direct", **baseline}]
    if case_names is None or FLOOR_CASE in case_names:
        cases.append({"case": FLOOR_CASE, **_floor(num_requests, concurrency, max_tokens)})
    for name, num_instances, conductor_args, on_decode in CLUSTER_CASES:
        if case_names is not None and name not in case_names:
            continue
        figures = _cluster(
            num_instances, num_requests, concurrency, max_tokens, conductor_args, on_decode, compare
        )
        result = {"case": name, **figures[0]}
        if compare is not None:
            result.update({f"compare_{key}": value for key, value in figures[1].items()})
            result["p50_over_compare"] = round(result["p50_ms"] / figures[1]["p50_ms"], 3)
        cases.append(result)
    for result in cases[1:]:
        result["added_p50_ms"] = round(result["p50_ms"] - baseline["p50_ms"], 3)
        result["added_p99_ms"] = round(result["p99_ms"] - baseline["p99_ms"], 3)
    cases.append(_token_id_body())
    config: dict = {
        "requests": num_requests,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "commit": commit_of(REPOSITORY),
    }
    if compare is not None:
        config["compare"] = {"checkout": str(compare), "commit": commit_of(compare)}
    return {"bench": "control-plane", "cases": cases, "config": config}
