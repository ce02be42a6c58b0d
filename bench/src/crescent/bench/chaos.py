"""`crescent bench chaos`: what clients see while parts of a cluster fail, one fault at a time.

An emulated cluster (2 prefill, 2 decode, 1 store, 2 conductors, restarted as `crescent up`
restarts it) serves a steady load spread over both conductors (`chaos_load`), each answer
checked against the emulated engine's known tokens. Each case injects one fault once the
cluster is whole and serving: SIGKILL of a prefill, a decode, the store, a conductor; a restart
of nats-server, of etcd; SIGSTOP of a prefill, of a decode for PAUSE_S. A case's window runs
from its start (PRE_FAULT_S before the fault) to the start of the next, so every request
belongs to one case. Per case: requests `sent`, `ok`, `rejected_before_work` (429/503 or a
refused connection), `failed`, `wrong` (200 with other tokens), `retried` (answered only after
the client retried a refused or dropped connection on the other conductor), `max_latency_s`,
`recovery_s`: from the fault to the first success among requests sent after the last request
that did not succeed, and `moved`: how often the conductors moved a request to another
instance during the window (their crescent_request_migrations_total, every stage), each move
computing its prompt, and for a decode the tokens already streamed, again.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from crescent.bench.chaos_load import Outcome, Status, SteadyLoad
from crescent.bench.conductor_metrics import num_moved
from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

log = logging.getLogger(__name__)

PAUSE_S = 3.0
PRE_FAULT_S = 1.5  # of steady load in each case's window before its fault
WHOLE_AGAIN_OKS = 6  # successive ok answers after which the cluster counts as serving again
CASE_TIMEOUT_S = 30.0  # the longest a case waits for the cluster to be whole again
SUPERVISE_PERIOD_S = 0.2


@dataclass(frozen=True)
class Fault:
    case: str
    action: str  # "kill" (SIGKILL; the supervisor restarts it), "restart" (stop, start) or "pause"
    target: str  # the process's name in the LocalCluster


FAULTS = (
    Fault("kill-prefill", "kill", "prefill-0"),
    Fault("kill-decode", "kill", "decode-0"),
    Fault("kill-store", "kill", "store-node0"),
    Fault("kill-conductor", "kill", "conductor-1"),
    Fault("restart-nats", "restart", "nats"),
    Fault("restart-etcd", "restart", "etcd"),
    Fault("pause-prefill", "pause", "prefill-1"),
    Fault("pause-decode", "pause", "decode-1"),
)


@dataclass(frozen=True)
class CaseWindow:
    fault: Fault
    started_at: float
    fault_at: float
    ended_at: float = 0.0
    moved: int = 0  # requests the conductors moved to another instance in the window


async def _inject(cluster: LocalCluster, fault: Fault) -> None:
    process = cluster.process(fault.target)
    if fault.action == "kill":
        process.signal(signal.SIGKILL)
    elif fault.action == "restart":
        await asyncio.to_thread(process.stop)
        process.start()  # on this (the main) thread: see ManagedProcess.start
        await asyncio.to_thread(process.wait_ready, 30)
    else:
        process.signal(signal.SIGSTOP)
        await asyncio.sleep(PAUSE_S)
        process.signal(signal.SIGCONT)


async def _supervise(cluster: LocalCluster) -> None:
    while True:
        cluster.supervise()
        await asyncio.sleep(SUPERVISE_PERIOD_S)


async def _is_whole(cluster: LocalCluster, session: aiohttp.ClientSession) -> bool:
    """Every process runs and every conductor sees every instance."""
    if not all(p.is_running for p in cluster.processes):
        return False
    expected = {"prefill": cluster.spec.num_prefill, "decode": cluster.spec.num_decode, "store": 1}
    for url in cluster.conductor_urls:
        try:
            async with session.get(f"{url}/health") as response:
                health = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        if health.get("status") != "serving" or health.get("live_instances") != expected:
            return False
    return True


async def _wait_whole(cluster: LocalCluster, load: SteadyLoad, since: float) -> bool:
    """Until the cluster is whole and WHOLE_AGAIN_OKS requests started after `since` succeeded in
    a row; False if that takes more than CASE_TIMEOUT_S."""
    deadline = time.monotonic() + CASE_TIMEOUT_S
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while time.monotonic() < deadline:
            if load.ok_since(since) >= WHOLE_AGAIN_OKS and await _is_whole(cluster, session):
                return True
            await asyncio.sleep(0.1)
    return False


async def _run_cases(cluster: LocalCluster, load: SteadyLoad) -> list[CaseWindow]:
    stop = asyncio.Event()
    supervisor = asyncio.create_task(_supervise(cluster))
    clients = asyncio.create_task(load.run(stop))
    windows: list[CaseWindow] = []
    try:
        if not await _wait_whole(cluster, load, time.monotonic()):
            raise RuntimeError("the cluster did not serve steadily before the first fault")
        moves = await _moves(cluster)
        for fault in FAULTS:
            started_at = time.monotonic()
            if windows:
                moves_before, moves = moves, await _moves(cluster)
                windows[-1] = _closed(windows[-1], started_at, moves_between(moves_before, moves))
            await asyncio.sleep(PRE_FAULT_S)
            log.info("fault: %s (%s %s)", fault.case, fault.action, fault.target)
            fault_at = time.monotonic()
            await _inject(cluster, fault)
            windows.append(CaseWindow(fault, started_at, fault_at))
            if not await _wait_whole(cluster, load, time.monotonic()):
                log.warning(
                    "%s: the cluster was not whole again within %ss", fault.case, CASE_TIMEOUT_S
                )
        stop.set()
        await clients  # requests in flight finish or time out
        ended_at = time.monotonic()
        windows[-1] = _closed(windows[-1], ended_at, moves_between(moves, await _moves(cluster)))
    finally:
        stop.set()
        clients.cancel()
        supervisor.cancel()
        await asyncio.gather(clients, supervisor, return_exceptions=True)
    return windows


def _closed(window: CaseWindow, ended_at: float, moved: int) -> CaseWindow:
    return CaseWindow(window.fault, window.started_at, window.fault_at, ended_at, moved)


async def _moves(cluster: LocalCluster) -> dict[str, float]:
    """Each answering conductor's requests moved so far."""
    counts: dict[str, float] = {}
    for url in cluster.conductor_urls:
        try:
            counts[url] = await asyncio.to_thread(num_moved, url)
        except OSError:  # killed, or not serving yet
            continue
    return counts


def moves_between(before: dict[str, float], after: dict[str, float]) -> int:
    """Moves counted from `before` to `after`; a conductor restarted in between (its count fell)
    counts from zero."""
    return int(
        sum(
            count - before.get(url, 0.0) if count >= before.get(url, 0.0) else count
            for url, count in after.items()
        )
    )


def case_result(window: CaseWindow, outcomes: list[Outcome]) -> dict:
    """The case's row: counts over the requests started in its window, its worst latency, and
    its recovery: from the fault to the first success among the requests sent after the last
    one that did not succeed (None if none succeeded)."""
    mine = [o for o in outcomes if window.started_at <= o.started_at < window.ended_at]
    counts = Counter(o.status for o in mine)
    back_from = max([window.fault_at, *(o.started_at for o in mine if o.status is not Status.OK)])
    first_ok = min(
        (o.ended_at for o in mine if o.status is Status.OK and o.started_at >= back_from),
        default=None,
    )
    return {
        "case": window.fault.case,
        "sent": len(mine),
        "ok": counts[Status.OK],
        "rejected_before_work": counts[Status.REJECTED],
        "failed": counts[Status.FAILED],
        "wrong": counts[Status.WRONG],
        "retried": sum(1 for o in mine if o.num_attempts > 1),
        "max_latency_s": round(max((o.latency_s for o in mine), default=0.0), 3),
        "recovery_s": None if first_ok is None else round(first_ok - window.fault_at, 3),
        "moved": window.moved,
    }


def _causes(window: CaseWindow, outcomes: list[Outcome]) -> dict[str, int]:
    mine = [o for o in outcomes if window.started_at <= o.started_at < window.ended_at and o.cause]
    return dict(Counter(f"{o.status.value}: {o.cause}" for o in mine).most_common(8))


def run_chaos_bench(
    concurrency: int = 4,
    max_tokens: int = 48,
    time_scale: float = 0.5,
    workdir: Path | None = None,
    local_prefill: str = "off",
) -> dict:
    """Run every fault case once on a fresh cluster; the cluster's logs stay in `workdir` when
    one is given. `local_prefill`: the conductors' --local-prefill (with `auto` the decode
    instances compute this load's short prompts themselves)."""
    with tempfile.TemporaryDirectory(prefix="crescent-chaos-") as scratch:
        spec = ClusterSpec(
            workdir=workdir or Path(scratch),
            api_port=free_port(),
            num_prefill=2,
            num_decode=2,
            num_conductors=2,
            engine_args=["--emulated-time-scale", str(time_scale)],
            conductor_args=["--local-prefill", local_prefill],
        )
        cluster = LocalCluster(spec)
        cluster.start(timeout_s=120)
        load = SteadyLoad(cluster.conductor_urls, concurrency=concurrency, max_tokens=max_tokens)
        try:
            windows = asyncio.run(_run_cases(cluster, load))
        finally:
            cluster.stop()
    return {
        "bench": "chaos",
        "cases": [case_result(w, load.outcomes) for w in windows],
        "causes": {w.fault.case: _causes(w, load.outcomes) for w in windows},
        "config": {
            "concurrency": concurrency,
            "max_tokens": max_tokens,
            "emulated_time_scale": time_scale,
            "local_prefill": local_prefill,
            "pause_s": PAUSE_S,
            "prefill": 2,
            "decode": 2,
            "stores": 1,
            "conductors": 2,
        },
    }
