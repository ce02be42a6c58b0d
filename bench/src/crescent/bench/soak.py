"""`crescent bench soak`: whether a cluster's memory, and etcd's history, stay bounded under a
steady load, or grow with every request served.

A 1P1D cluster (`crescent up`'s topology) serves a closed loop of `concurrency` clients for
`minutes`: emulated (time scale 0, so the control path, the store and etcd do all the work), or
vLLM on a real model (`engine="vllm"`; the connector's saves and loads, its threads and vLLM's
engine process too). Every prompt is computed on the prefill instance (`--local-prefill off`)
and is a few blocks long: one of 16 shared prefixes and a tail of its own, so every request
commits new blocks to the store, and the full pool evicts old ones: block metadata churns in
etcd as it does under real traffic. Every `sample_s` the bench reads each service's resident
memory and CPU time, its child processes' included (vLLM's engine core runs in one), the
requests served so far, and etcd's database size and raft index (the entries it has written).

Per process, `mb_per_min` is the slope of a least-squares line through the samples after
`warmup_s` (a minute: start-up and the pool filling are over by then); a process whose memory
is bounded reads near 0. The same slope is taken of each process's CPU (% of a core over each
interval between samples, `pct_per_min`) and of the requests served per second (`rps_per_min`):
a service whose work per request grows with what it holds slows down under the same load.
etcd compacts its history every `compaction_retention` (crescent up's COMPACTION_RETENTION;
"0" turns compaction off), so its figures level off only in a run several retentions long.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import aiohttp
import psutil

from crescent.bench.plain_vllm import bench_model
from crescent.bench.prefix_reuse import ENV as VLLM_ENV
from crescent.cluster.infra import COMPACTION_RETENTION
from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.etcd import connect_etcd
from crescent.common.ports import free_port

WARMUP_S = 60.0
NUM_PREFIXES = 16
MAX_TOKENS = 16
ENGINES = ("emulated", "vllm")


@dataclass(frozen=True)
class Workload:
    """What the clients send: `prefix_len` tokens shared by many prompts and a tail of
    `tail_len` (a range) of each prompt's own, as text (a byte a token for the emulated
    engine) or token ids."""

    model: str
    prefix_len: int
    tail_len: tuple[int, int]
    token_ids: bool

    def prefix(self, rng: random.Random) -> str | list[int]:
        return self._tokens(rng, self.prefix_len, "abcdefghij ")

    def prompt(self, rng: random.Random, prefix: str | list[int]) -> str | list[int]:
        return prefix + self._tokens(rng, rng.randrange(*self.tail_len), "klmnopqrst ")

    def _tokens(self, rng: random.Random, length: int, letters: str) -> str | list[int]:
        if self.token_ids:
            return [rng.randrange(VOCAB_FLOOR, VOCAB_CEILING) for _ in range(length)]
        return "".join(rng.choice(letters) for _ in range(length))


# Token ids clear of the tiny Llama's special tokens (the first few) and within its 1,024.
VOCAB_FLOOR, VOCAB_CEILING = 16, 1000
# Two of the emulated engine's 512-token blocks; with vLLM, eight of the store's 64-token blocks.
EMULATED = Workload("crescent-emulated", 1024, (600, 2000), token_ids=False)


def vllm_workload(model: str) -> Workload:
    return Workload(model, 512, (128, 1024), token_ids=True)


@dataclass
class Samples:
    at_s: list[float] = field(default_factory=list)
    rss_mb: dict[str, list[float]] = field(default_factory=dict)  # process → one per sample
    cpu_s: dict[str, list[float]] = field(default_factory=dict)  # process → CPU time so far
    ok: list[int] = field(default_factory=list)  # requests served so far
    etcd_db_mb: list[float] = field(default_factory=list)
    etcd_raft_index: list[int] = field(default_factory=list)  # its raft entries so far


@dataclass
class Load:
    ok: int = 0
    failed: dict[str, int] = field(default_factory=dict)  # status or error → count


def run_soak_bench(
    minutes: float = 10.0,
    concurrency: int = 8,
    sample_s: float = 30.0,
    compaction_retention: str = COMPACTION_RETENTION,
    warmup_s: float = WARMUP_S,
    engine: str = "emulated",
    model_dir: Path | None = None,
) -> dict:
    """`engine`: "emulated" or "vllm" (on `model_dir`, the tiny Llama when None)."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: one of {', '.join(ENGINES)}")
    with tempfile.TemporaryDirectory(prefix="crescent-soak-") as workdir:
        spec = ClusterSpec(
            workdir=Path(workdir),
            api_port=free_port(),
            conductor_args=["--local-prefill", "off"],
            etcd_compaction_retention=compaction_retention,
        )
        if engine == "vllm":
            spec.engine, spec.env = "vllm", VLLM_ENV
            spec.model_dir = bench_model(model_dir, Path(workdir))
            workload = vllm_workload(spec.model_dir.name)
        else:
            spec.engine_args = ["--emulated-time-scale", "0"]
            workload = EMULATED
        cluster = LocalCluster(spec)
        cluster.start(timeout_s=300)
        try:
            samples, load = asyncio.run(
                _soak(cluster, workload, minutes * 60, concurrency, sample_s)
            )
        finally:
            cluster.stop()
    duration_s = samples.at_s[-1]
    cases = [
        {
            "case": "requests",
            "ok": load.ok,
            "failed": sum(load.failed.values()),
            "rps": round(load.ok / duration_s, 1),
            "rps_per_min": _per_min(*_rates(samples.at_s, samples.ok), warmup_s),
        }
    ]
    for name, rss in samples.rss_mb.items():
        cases.append(_growth(f"rss-{name}", samples.at_s, rss, warmup_s))
    for name, cpu_s in samples.cpu_s.items():
        at_s, per_s = _rates(samples.at_s, cpu_s)
        cases.append(_growth(f"cpu-{name}", at_s, [100 * v for v in per_s], warmup_s, "pct"))
    etcd = _growth("etcd-db", samples.at_s, samples.etcd_db_mb, warmup_s)
    etcd["raft_entries_per_min"] = round(
        (samples.etcd_raft_index[-1] - samples.etcd_raft_index[0]) / duration_s * 60
    )
    cases.append(etcd)
    return {
        "bench": "soak",
        "cases": cases,
        "failures": load.failed,
        "samples": {
            "at_s": [round(t, 1) for t in samples.at_s],
            "rss_mb": {name: [round(v, 1) for v in rss] for name, rss in samples.rss_mb.items()},
            "cpu_s": {name: [round(v, 2) for v in cpu] for name, cpu in samples.cpu_s.items()},
            "ok": samples.ok,
            "etcd_db_mb": [round(v, 1) for v in samples.etcd_db_mb],
        },
        "config": {
            "engine": engine,
            "model": workload.model,
            "minutes": minutes,
            "concurrency": concurrency,
            "sample_s": sample_s,
            "etcd_compaction_retention": compaction_retention,
            "statistic": f"*_per_min: least-squares slope of the samples after {warmup_s:g} s "
            "(CPU and requests: of each interval's rate, at its end)",
        },
    }


def _rates(at_s: list[float], totals: list[float]) -> tuple[list[float], list[float]]:
    """Each interval's rate of a running total, at the interval's end."""
    pairs = list(zip(at_s, totals, strict=True))
    return [t for t, _ in pairs[1:]], [
        (v - v0) / max(t - t0, 1e-9) for (t0, v0), (t, v) in pairwise(pairs)
    ]


def _growth(
    case: str, at_s: list[float], values: list[float], warmup_s: float, unit: str = "mb"
) -> dict:
    settled = [v for t, v in zip(at_s, values, strict=True) if t >= warmup_s] or values or [0.0]
    return {
        "case": case,
        f"start_{unit}": round(settled[0], 1),
        f"end_{unit}": round(settled[-1], 1),
        f"{unit}_per_min": _per_min(at_s, values, warmup_s),
    }


def _per_min(at_s: list[float], values: list[float], warmup_s: float) -> float:
    """The least-squares slope of the values sampled after `warmup_s`, per minute."""
    settled = [(t, v) for t, v in zip(at_s, values, strict=True) if t >= warmup_s]
    if len(settled) < 2:
        return 0.0
    slope = statistics.linear_regression([t for t, _ in settled], [v for _, v in settled]).slope
    return round(slope * 60, 2)


async def _soak(
    cluster: LocalCluster, workload: Workload, duration_s: float, concurrency: int, sample_s: float
) -> tuple[Samples, Load]:
    rng = random.Random(0)
    prefixes = [workload.prefix(rng) for _ in range(NUM_PREFIXES)]
    load, samples = Load(), Samples()
    started = time.monotonic()
    deadline = started + duration_s
    etcd = await connect_etcd(f"http://127.0.0.1:{cluster.etcd_port}")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            clients = [
                asyncio.create_task(
                    _client(session, cluster.api_url, workload, prefixes, deadline, load, i)
                )
                for i in range(concurrency)
            ]
            while True:
                await _sample(cluster, etcd, samples, load, time.monotonic() - started)
                if time.monotonic() >= deadline:
                    break
                await asyncio.sleep(min(sample_s, max(0.0, deadline - time.monotonic())))
            await asyncio.gather(*clients)
    finally:
        await etcd.close()
    return samples, load


async def _client(
    session: aiohttp.ClientSession,
    url: str,
    workload: Workload,
    prefixes: list[str | list[int]],
    deadline: float,
    load: Load,
    seed: int,
) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        prompt = workload.prompt(rng, rng.choice(prefixes))
        body = {"model": workload.model, "prompt": prompt, "max_tokens": MAX_TOKENS}
        try:
            async with session.post(f"{url}/v1/completions", json=body) as response:
                await response.read()
                outcome = "ok" if response.status == 200 else f"http-{response.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            outcome = type(exc).__name__
        if outcome == "ok":
            load.ok += 1
        else:
            load.failed[outcome] = load.failed.get(outcome, 0) + 1


async def _sample(cluster: LocalCluster, etcd, samples: Samples, load: Load, at_s: float) -> None:
    samples.at_s.append(at_s)
    samples.ok.append(load.ok)
    for process in cluster.processes:
        rss, cpu_s = _tree_usage(process.pid) if process.pid else (0, 0.0)
        samples.rss_mb.setdefault(process.spec.name, []).append(rss / 2**20)
        samples.cpu_s.setdefault(process.spec.name, []).append(cpu_s)
    status = await etcd.status()
    samples.etcd_db_mb.append(status.db_size / 2**20)
    samples.etcd_raft_index.append(status.raft_index)


def _tree_usage(pid: int) -> tuple[int, float]:
    """Resident bytes and CPU seconds (user and system) of a process and its descendants; 0
    once it is gone."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0.0
    rss, cpu_s = 0, 0.0
    for process in tree:
        try:
            with process.oneshot():
                rss += process.memory_info().rss
                times = process.cpu_times()
                cpu_s += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return rss, cpu_s
