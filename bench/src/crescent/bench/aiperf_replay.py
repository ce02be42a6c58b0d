"""`crescent bench aiperf`: aiperf's Mooncake trace replay against Crescent and plain vLLM, side
by side in one run, on the same model, trace and load.

  crescent-1p1d        `crescent up` topology: store, conductor, one prefill, one decode, vLLM
                       engine, every prompt computed by the prefill instance (--local-prefill off)
  crescent-1p1d-cond   the same with conditional disaggregation by a token threshold
                       (--local-prefill 512)
  crescent-1p1d-auto   the same with conditional disaggregation priced by the decode
                       instance's cost model (--local-prefill auto, `crescent up`'s default)
  vllm                 one plain vLLM OpenAI server (prefix cache on, its default)
  vllm-2x-rr           two plain vLLM servers behind a round-robin proxy (rr_proxy.py): what a user
                       of two engines would otherwise run
  crescent-2p2d-faults two prefill and two decode instances (--local-prefill auto) while, during
                       the replay, a decode instance is stopped (SIGSTOP) for 10 s, then a
                       prefill and the other decode instance are killed (SIGKILL) and restarted
                       as `crescent up` restarts them (CRESCENT_FAULTS)
  crescent-2p2d-infra-faults  the same cluster while the store, then the NATS server, then etcd
                       are killed and restarted (INFRA_FAULTS)
  crescent-2p2d-infra-pauses  the same cluster while the store (5 s, the lease's TTL), then the
                       NATS server (4 s), then etcd (6 s, past every lease) are stopped (SIGSTOP)
                       and resumed: slow, not dead (INFRA_PAUSES)
  vllm-2x-rr-faults    vllm-2x-rr while one server is stopped for 10 s and the other killed and
                       restarted (VLLM_FAULTS)

aiperf (`pip install aiperf`, in an environment of its own: it is not a Crescent dependency)
replays the trace's requests at their timestamps (`--fixed-schedule`), prompts built from the
hash ids, streaming completions that ignore the end-of-sequence token (every answer is as
long as its trace row says); its tokenizer is the model's, which this module places in a
private Hugging Face cache under a hub-style name, as aiperf's loader expects. Prompts are cut
to `max_input_tokens` (keeping the leading hash ids) so the trace fits a small model.

`speed` replays the trace faster (arrivals at its times × 1/speed), to see each system past
its capacity. `slo` (TTFT and TBT, the latter as aiperf's inter-token latency: each request's
mean gap, not the paper's mean of its longest tenth) makes aiperf count the requests that met
both (`good_requests`, its goodput: an error or a 429 is not good) and gives Crescent's
conductor the same SLOs to schedule and admit by (`--ttft-slo-s`, `--tbt-slo-s`), as its user
would; plain vLLM has no such setting.

With `rounds` > 1 every case runs that many times, the order of the cases reversed every
round, so that a slow minute of the machine falls on each of them alike. A case's latency
percentiles are then the medians of its rounds' and its counts (requests, errors, ...) their
sums. `ratios` holds each Crescent case ÷ each plain vLLM case run beside it (faulted with
faulted, unfaulted with unfaulted): TTFT and ITL p50, round by round, their median, and the
ratio of the two cases' medians. One replay's ratio moves with how far the single plain vLLM
engine fell behind the trace in that replay; the median of several rounds is the figure to
read.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from crescent.bench.conductor_metrics import replay_figures
from crescent.bench.plain_vllm import bench_model, vllm_server_argv
from crescent.bench.replay_faults import Fault, run_with_faults
from crescent.bench.slo import SloTargets
from crescent.bench.store_metrics import lookup_waits
from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.cluster.processes import ManagedProcess, ProcessSpec, restart_exited
from crescent.cluster.restarts import Backoff, RestartSchedule
from crescent.common.ports import free_port

ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_LOGGING_LEVEL": "WARNING"}
HUB_NAME = "local/tiny-llama"
HASH_BLOCK_TOKENS = 512  # the Mooncake traces' block size
# Of each kind of error aiperf saw, in the row: enough for a 429's message, which names every
# decode instance that refused the request and why.
ERROR_MESSAGE_CHARS = 600
METRICS = {
    "ttft_ms": "time_to_first_token",
    "itl_ms": "inter_token_latency",
    "latency_ms": "request_latency",
}


class AiperfError(RuntimeError):
    """aiperf is missing or did not finish."""


def aiperf_goodput(slo: SloTargets) -> str:
    """aiperf's --goodput for `slo`: its TTFT and its inter-token latency (the request's mean
    gap, aiperf's per-request ITL), in ms."""
    return f"time_to_first_token:{slo.ttft_s * 1000:g} inter_token_latency:{slo.tbt_s * 1000:g}"


def conductor_slo_args(slo: SloTargets) -> tuple[str, ...]:
    """The conductor's arguments that set `slo` as the one it schedules and admits by."""
    return ("--ttft-slo-s", f"{slo.ttft_s:g}", "--tbt-slo-s", f"{slo.tbt_s:g}")


def cut_trace(trace: Path, out: Path, limit: int, max_input_tokens: int, speed: float = 1.0) -> int:
    """The first `limit` requests with prompts of at most `max_input_tokens`, arriving at the
    trace's times × 1/speed; returns the count."""
    count = 0
    with trace.open() as source, out.open("w") as sink:
        for line in source:
            if count == limit:
                break
            request = json.loads(line)
            request["input_length"] = min(request["input_length"], max_input_tokens)
            request["timestamp"] = round(request["timestamp"] / speed)
            request["hash_ids"] = request["hash_ids"][
                : math.ceil(request["input_length"] / HASH_BLOCK_TOKENS)
            ]
            sink.write(json.dumps(request) + "\n")
            count += 1
    return count


def hub_cache(model_dir: Path, hf_home: Path) -> None:
    """The model's tokenizer under HUB_NAME in a Hugging Face cache at `hf_home`."""
    repo = hf_home / "hub" / f"models--{HUB_NAME.replace('/', '--')}"
    revision = "0" * 40
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, snapshot / name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)


def run_aiperf(
    aiperf: str,
    url: str,
    model: str,
    trace: Path,
    out_dir: Path,
    hf_home: Path,
    slo: SloTargets | None = None,
) -> dict:
    argv = [
        aiperf,
        "profile",
        "--model",
        model,
        "--tokenizer",
        HUB_NAME,
        "--url",
        url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--custom-dataset-type",
        "mooncake_trace",
        "--input-file",
        str(trace),
        "--fixed-schedule",
        # Each answer as long as its trace row says, on every system alike: the same decode work
        # everywhere, and no empty answer (which aiperf counts as an error) when the tiny model's
        # first sampled token is its end of sequence.
        "--extra-inputs",
        "ignore_eos:true",
        "--artifact-dir",
        str(out_dir),
    ]
    if slo is not None:
        argv += ["--goodput", aiperf_goodput(slo)]
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with (out_dir.parent / f"{out_dir.name}.log").open("w") as log:
        done = subprocess.run(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=1800, check=False
        )
    export = out_dir / "profile_export_aiperf.json"
    if done.returncode != 0 or not export.exists():
        raise AiperfError(
            f"aiperf exited with {done.returncode}; see {out_dir.parent / out_dir.name}.log"
        )
    return summarize(json.loads(export.read_text()), slo)


def summarize(export: dict, slo: SloTargets | None = None) -> dict:
    """Requests, errors and latency percentiles from aiperf's profile_export_aiperf.json; with
    `slo`, the requests that met it."""
    summary = export.get("error_summary") or []
    errors = sum(int(entry.get("count", 1)) for entry in summary)
    row: dict = {"requests": int(export["request_count"]["avg"]), "errors": errors}
    if slo is not None:
        if "good_request_count" not in export:
            raise AiperfError("aiperf was given SLOs but reported no good_request_count")
        row["good_requests"] = int(export["good_request_count"]["avg"])
    if summary:  # what went wrong, as aiperf saw it: the count is not the whole story
        row["error_kinds"] = [_error_kind(entry) for entry in summary]
    for name, key in METRICS.items():
        stats = export[key]
        for stat in ("p50", "p90", "p99"):
            row[f"{name}_{stat}"] = round(stats[stat], 1)
    return row


def _error_kind(entry: dict) -> str:
    details = entry.get("error_details") or {}
    code = details.get("code")
    label = " ".join(str(part) for part in (code, details.get("type")) if part)
    message = str(details.get("message", ""))[:ERROR_MESSAGE_CHARS]
    return f"{int(entry.get('count', 1))} x {label or 'error'}: {message}"


LOCAL_PREFILL_MAX_TOKENS = (
    512  # crescent-1p1d-cond: prompts with this few uncached tokens stay on decode
)
CASES = (
    "crescent-1p1d",
    "crescent-1p1d-cond",
    "crescent-1p1d-auto",
    "vllm",
    "vllm-2x-rr",
    "crescent-2p2d-faults",
    "crescent-2p2d-infra-faults",
    "crescent-2p2d-infra-pauses",
    "vllm-2x-rr-faults",
)
# Cases with faults injected: their ratios pair them with each other, not with calm replays.
FAULTED = frozenset(
    {
        "crescent-2p2d-faults",
        "crescent-2p2d-infra-faults",
        "crescent-2p2d-infra-pauses",
        "vllm-2x-rr-faults",
    }
)
# Within the first 30 s of the replay, which the default trace's 200 requests span.
CRESCENT_FAULTS = (
    Fault(10.0, "pause", "decode-0", pause_s=10.0),
    Fault(23.0, "kill", "prefill-1"),
    Fault(28.0, "kill", "decode-1"),
)
INFRA_FAULTS = (
    Fault(8.0, "kill", "store-node0"),  # the one node's store: every worker's KV pool
    Fault(16.0, "kill", "nats"),
    Fault(24.0, "kill", "etcd"),
)
INFRA_PAUSES = (
    Fault(6.0, "pause", "store-node0", pause_s=5.0),
    Fault(14.0, "pause", "nats", pause_s=4.0),
    Fault(22.0, "pause", "etcd", pause_s=6.0),  # every lease ends as it resumes
)
VLLM_FAULTS = (Fault(10.0, "pause", "vllm-0", pause_s=10.0), Fault(23.0, "kill", "vllm-1"))


def _crescent(
    model_dir: Path,
    workdir: Path,
    run: callable,
    conductor_args: tuple[str, ...] = (),
    num_workers: int = 1,
    faults: tuple[Fault, ...] = (),
) -> dict:
    """`num_workers` prefill and as many decode instances; `faults` injected while `run` runs."""
    spec = ClusterSpec(
        workdir=workdir,
        api_port=free_port(),
        num_prefill=num_workers,
        num_decode=num_workers,
        engine="vllm",
        model_dir=model_dir,
        env=ENV,
        store_dram_bytes=256 << 20,
        store_ssd_bytes=256 << 20,
        conductor_args=list(conductor_args),
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=300)
    try:
        row = run_with_faults(
            lambda: run(cluster.api_url), faults, cluster.process, cluster.supervise
        )
        # aiperf counts a stream that ended with an error event as served; the conductor does not
        row.update(replay_figures(cluster.api_url))
        waits = lookup_waits(cluster.api_url)
        row.update({f"store_{name}": value for name, value in waits.items()})
        return row
    finally:
        cluster.stop()


def _vllm_server(model_dir: Path, workdir: Path, name: str) -> tuple[ManagedProcess, str]:
    port = free_port()
    argv = vllm_server_argv(model_dir, port)
    server = ManagedProcess(
        ProcessSpec(name=name, argv=argv, env={**ENV, "VLLM_CPU_KVCACHE_SPACE": "1"}, port=port),
        workdir / "logs",
    )
    return server, f"http://127.0.0.1:{port}"


def _plain_vllm(
    model_dir: Path,
    workdir: Path,
    run: callable,
    num_servers: int = 1,
    faults: tuple[Fault, ...] = (),
) -> dict:
    """One plain vLLM server, or `num_servers` behind the round-robin proxy; `faults` injected
    while `run` runs, a killed server restarted as a supervisor (systemd, Kubernetes) would."""
    servers = [_vllm_server(model_dir, workdir, f"vllm-{i}") for i in range(num_servers)]
    processes = [server for server, _ in servers]
    url = servers[0][1]
    if num_servers > 1:
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "crescent.bench.rr_proxy",
            "--port",
            str(port),
            *(arg for _, backend in servers for arg in ("--backend", backend)),
        ]
        processes.append(
            ManagedProcess(
                ProcessSpec(name="rr-proxy", argv=argv, env={}, port=port), workdir / "logs"
            )
        )
        url = f"http://127.0.0.1:{port}"
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.wait_ready(300)
        by_name = {process.spec.name: process for process in processes}
        restarts = RestartSchedule(Backoff())
        return run_with_faults(
            lambda: run(url),
            faults,
            by_name.__getitem__,
            lambda: restart_exited(processes, restarts),
        )
    finally:
        for process in reversed(processes):
            process.stop()


def run_aiperf_bench(
    trace: Path,
    limit: int = 200,
    max_input_tokens: int = 2048,
    aiperf: str = "aiperf",
    model_dir: Path | None = None,
    workdir: Path | None = None,
    cases: tuple[str, ...] = CASES,
    rounds: int = 1,
    speed: float = 1.0,
    slo: SloTargets | None = None,
) -> dict:
    """The cases in turn, `rounds` times (the module's docstring); aiperf's artifacts and the
    servers' logs stay in `workdir` when given."""
    unknown = set(cases) - set(CASES)
    if unknown:
        raise AiperfError(
            f"unknown cases {', '.join(sorted(unknown))}; choose from {', '.join(CASES)}"
        )
    if rounds < 1:
        raise AiperfError(f"rounds must be at least 1, got {rounds}")
    if not speed > 0:
        raise AiperfError(f"speed must be positive, got {speed}")
    if shutil.which(aiperf) is None:
        raise AiperfError(
            f"{aiperf!r} not found: pip install aiperf (in a virtual environment of its own) "
            "and pass --aiperf PATH"
        )
    with tempfile.TemporaryDirectory(prefix="crescent-aiperf-") as tmp:
        workdir = workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        model_dir = bench_model(model_dir, workdir)
        hf_home = workdir / "hf"
        hub_cache(model_dir, hf_home)
        cut = workdir / "trace.jsonl"
        num_requests = cut_trace(trace, cut, limit, max_input_tokens, speed)
        slo_args = conductor_slo_args(slo) if slo is not None else ()

        def crescent(where, run, local_prefill, num_workers=1, faults=()):
            return _crescent(
                model_dir,
                where,
                run,
                ("--local-prefill", local_prefill, *slo_args),
                num_workers,
                faults,
            )

        # Each runner starts its system in `where` (this round's directory of that case) and
        # replays the trace against it with `run`.
        runners = {
            "crescent-1p1d": lambda where, run: crescent(where, run, "off"),
            "crescent-1p1d-cond": lambda where, run: crescent(
                where, run, str(LOCAL_PREFILL_MAX_TOKENS)
            ),
            "crescent-1p1d-auto": lambda where, run: crescent(where, run, "auto"),
            "vllm": lambda where, run: _plain_vllm(model_dir, where, run),
            "vllm-2x-rr": lambda where, run: _plain_vllm(model_dir, where, run, num_servers=2),
            "crescent-2p2d-faults": lambda where, run: crescent(
                where, run, "auto", num_workers=2, faults=CRESCENT_FAULTS
            ),
            "crescent-2p2d-infra-faults": lambda where, run: crescent(
                where, run, "auto", num_workers=2, faults=INFRA_FAULTS
            ),
            "crescent-2p2d-infra-pauses": lambda where, run: crescent(
                where, run, "auto", num_workers=2, faults=INFRA_PAUSES
            ),
            "vllm-2x-rr-faults": lambda where, run: _plain_vllm(
                model_dir, where, run, num_servers=2, faults=VLLM_FAULTS
            ),
        }

        def replay(out_dir: Path):
            return lambda url: run_aiperf(aiperf, url, model_dir.name, cut, out_dir, hf_home, slo)

        rows: dict[str, list[dict]] = {name: [] for name in cases}
        for round_number, order in enumerate(round_orders(cases, rounds)):
            for name in order:
                where = workdir / name / f"round-{round_number}"
                rows[name].append(runners[name](where, replay(where / "aiperf")))
    return {
        "bench": "aiperf",
        "cases": [{"case": name, **combine_rounds(case_rows)} for name, case_rows in rows.items()],
        "ratios": ratios(rows),
        "config": {
            "rounds": rounds,
            "speed": speed,
            "slo_ttft_ms": slo.ttft_s * 1000 if slo is not None else None,
            "slo_itl_ms": slo.tbt_s * 1000 if slo is not None else None,
            "trace": str(trace),
            "requests": num_requests,
            "max_input_tokens": max_input_tokens,
            "local_prefill_cond_tokens": LOCAL_PREFILL_MAX_TOKENS,
            "model": model_dir.name,
            "cpu_threads": os.cpu_count(),
        },
    }


def round_orders(cases: tuple[str, ...], rounds: int) -> list[tuple[str, ...]]:
    """The order of the cases in each round: as given, then reversed, and so on."""
    return [cases if number % 2 == 0 else cases[::-1] for number in range(rounds)]


def combine_rounds(rows: list[dict]) -> dict:
    """One case's row over its rounds: each latency percentile the median of the rounds', each
    count their sum, and each listed item (an error kind, a fault injected) with its round."""
    if len(rows) == 1:
        return rows[0]
    combined: dict = {"rounds": len(rows)}
    for key, value in rows[0].items():
        if isinstance(value, list):  # error kinds, faults injected: each with its round
            continue
        values = [row[key] for row in rows]
        if key.split("_")[-1] in ("p50", "p90", "p99"):
            combined[key] = round(statistics.median(values), 1)
        else:
            combined[key] = round(sum(values), 3)
    for key in dict.fromkeys(k for row in rows for k, v in row.items() if isinstance(v, list)):
        combined[key] = [
            f"round {number}: {item}"
            for number, row in enumerate(rows)
            for item in row.get(key, [])
        ]
    return combined


RATIO_METRICS = ("ttft_ms_p50", "itl_ms_p50", "good_requests")


def ratios(rows: dict[str, list[dict]]) -> list[dict]:
    """Each Crescent case ÷ each plain vLLM case of the run, faulted with faulted: per metric,
    round by round (`*_ratios`), their median (the paired reading: each round's two replays ran
    minutes apart, so a slow stretch of the machine divides out), and the ratio of the two
    cases' medians (`*_of_medians`). The metrics: TTFT and ITL p50 (lower is better) and, with
    SLOs, the good requests (higher is better)."""
    pairs = [
        (ours, theirs)
        for ours in rows
        if ours.startswith("crescent")
        for theirs in rows
        if theirs.startswith("vllm") and (ours in FAULTED) == (theirs in FAULTED)
    ]
    result = []
    for ours, theirs in pairs:
        ratio: dict = {"case": f"{ours}/{theirs}"}
        for metric in RATIO_METRICS:
            by_round = [
                round(a[metric] / b[metric], 3)
                for a, b in zip(rows[ours], rows[theirs], strict=True)
                if metric in a and b.get(metric, 0) > 0
            ]
            if by_round:
                ratio[metric] = round(statistics.median(by_round), 3)
                ratio[f"{metric}_of_medians"] = round(
                    statistics.median(a[metric] for a in rows[ours])
                    / statistics.median(b[metric] for b in rows[theirs]),
                    3,
                )
                ratio[f"{metric}_ratios"] = by_round
        result.append(ratio)
    return result
