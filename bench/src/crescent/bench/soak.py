"""`crescent bench soak`: whether a cluster's memory, and etcd's history, stay bounded under a
steady load, or grow with every request served.

An emulated 1P1D cluster (`crescent up`'s topology; time scale 0, so the control path, the
store and etcd do all the work) serves a closed loop of `concurrency` clients for `minutes`.
Every prompt is computed on the prefill instance (`--local-prefill off`) and is a few blocks
long: one of 16 shared prefixes and a tail of its own, so every request commits new blocks to
the store, and the full pool evicts old ones: block metadata churns in etcd as it does under
real traffic. Every `sample_s` the bench reads each process's resident memory and etcd's
database size and raft index (the entries it has written).

Per process, `mb_per_min` is the slope of a least-squares line through the samples after
`warmup_s` (a minute: start-up and the pool filling are over by then); a process whose memory
is bounded reads near 0. etcd compacts its history every `compaction_retention` (crescent up's
COMPACTION_RETENTION; "0" turns compaction off), so its figures level off only in a run
several retentions long.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

from crescent.cluster.infra import COMPACTION_RETENTION
from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.etcd import connect_etcd
from crescent.common.ports import free_port

MODEL = "crescent-emulated"
WARMUP_S = 60.0
NUM_PREFIXES = 16
PREFIX_BYTES = 1024  # two of the emulated engine's 512-token blocks (a byte a token)
TAIL_BYTES = (600, 2000)
MAX_TOKENS = 16


@dataclass
class Samples:
    at_s: list[float] = field(default_factory=list)
    rss_mb: dict[str, list[float]] = field(default_factory=dict)  # process → one per sample
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
) -> dict:
    with tempfile.TemporaryDirectory(prefix="crescent-soak-") as workdir:
        cluster = LocalCluster(
            ClusterSpec(
                workdir=Path(workdir),
                api_port=free_port(),
                engine_args=["--emulated-time-scale", "0"],
                conductor_args=["--local-prefill", "off"],
                etcd_compaction_retention=compaction_retention,
            )
        )
        cluster.start(timeout_s=120)
        try:
            samples, load = asyncio.run(_soak(cluster, minutes * 60, concurrency, sample_s))
        finally:
            cluster.stop()
    duration_s = samples.at_s[-1]
    cases = [
        {
            "case": "requests",
            "ok": load.ok,
            "failed": sum(load.failed.values()),
            "rps": round(load.ok / duration_s, 1),
        }
    ]
    for name, rss in samples.rss_mb.items():
        cases.append(_growth(f"rss-{name}", samples.at_s, rss, warmup_s))
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
            "etcd_db_mb": [round(v, 1) for v in samples.etcd_db_mb],
        },
        "config": {
            "minutes": minutes,
            "concurrency": concurrency,
            "sample_s": sample_s,
            "etcd_compaction_retention": compaction_retention,
            "statistic": f"mb_per_min: least-squares slope of the samples after {warmup_s:g} s",
        },
    }


def _growth(case: str, at_s: list[float], values: list[float], warmup_s: float) -> dict:
    settled = [(t, v) for t, v in zip(at_s, values, strict=True) if t >= warmup_s]
    slope = (
        statistics.linear_regression([t for t, _ in settled], [v for _, v in settled]).slope
        if len(settled) >= 2
        else 0.0
    )
    return {
        "case": case,
        "start_mb": round(settled[0][1] if settled else values[0], 1),
        "end_mb": round(values[-1], 1),
        "mb_per_min": round(slope * 60, 2),
    }


async def _soak(
    cluster: LocalCluster, duration_s: float, concurrency: int, sample_s: float
) -> tuple[Samples, Load]:
    rng = random.Random(0)
    prefixes = [
        "".join(rng.choice("abcdefghij ") for _ in range(PREFIX_BYTES)) for _ in range(NUM_PREFIXES)
    ]
    load, samples = Load(), Samples()
    started = time.monotonic()
    deadline = started + duration_s
    etcd = await connect_etcd(f"http://127.0.0.1:{cluster.etcd_port}")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            clients = [
                asyncio.create_task(_client(session, cluster.api_url, prefixes, deadline, load, i))
                for i in range(concurrency)
            ]
            while True:
                await _sample(cluster, etcd, samples, time.monotonic() - started)
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
    prefixes: list[str],
    deadline: float,
    load: Load,
    seed: int,
) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        tail = "".join(rng.choice("klmnopqrst ") for _ in range(rng.randrange(*TAIL_BYTES)))
        body = {"model": MODEL, "prompt": rng.choice(prefixes) + tail, "max_tokens": MAX_TOKENS}
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


async def _sample(cluster: LocalCluster, etcd, samples: Samples, at_s: float) -> None:
    samples.at_s.append(at_s)
    for process in cluster.processes:
        try:
            rss = psutil.Process(process.pid).memory_info().rss / 2**20 if process.pid else 0.0
        except psutil.NoSuchProcess:
            rss = 0.0
        samples.rss_mb.setdefault(process.spec.name, []).append(rss)
    status = await etcd.status()
    samples.etcd_db_mb.append(status.db_size / 2**20)
    samples.etcd_raft_index.append(status.raft_index)
