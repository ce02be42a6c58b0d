"""`crescent bench store`: put and get GB/s of Crescent's store beside Mooncake Store.

The same workload for both systems: `num_blocks` blocks of `block_bytes` (64 × 1 MiB and
4096 × 64 KiB), put in batches of `batch_bytes`, then read back into preallocated buffers in
the same batches. A round uses new keys and removes them afterwards (untimed); the first
round warms up (connections, page faults), verifies the bytes and is dropped; GB/s (1e9
bytes/s) is from the median of the `repeat` rounds after it.

In both, the memory lives in another process than the benchmark client, so the bytes cross
processes:
  Crescent  nats-server, etcd, one store process (`python -m crescent.store`, its DRAM pool a
            shared-memory segment) and a StoreClient in this process. `gbps` is its default
            road to a same-host store (the pool mapped here, one memcpy per block);
            `tcp_gbps` forces tcp on loopback: the client's data plane runs only the tcp
            transport (so nothing is mapped either), and after the rounds its per-transport
            counter must show that tcp moved every byte, or the run fails.
  Mooncake  mooncake_master, one process contributing the global segment, one client
            process contributing none; protocol tcp on loopback, registered buffers with
            batch_put_from / batch_get_into, its fastest path here (mooncake_peer.py).
Per shape, Crescent runs and then Mooncake, so that drift of a shared machine hits both alike.
Mooncake (mooncake-transfer-engine-non-cuda from PyPI) gets its own venv, made on first use
under ~/.cache: it is a baseline, not a dependency of ours.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import aetcd
import numpy as np
import uvloop

from crescent.cluster.infra import etcd_spec, nats_spec
from crescent.cluster.processes import ManagedProcess, ProcessError, ProcessSpec
from crescent.common.bus import Bus
from crescent.common.errors import FatalError
from crescent.common.etcd import connect_etcd
from crescent.common.hashing import HASH_BYTES
from crescent.common.naming import Keys
from crescent.common.ports import free_port
from crescent.storeclient.client import ClientConfig, StoreClient
from crescent.transfer import ShmEndpoint, TransferConfig, TransportKind
from crescent.transfer.segment import shm_file_identity

KiB = 1 << 10
MiB = 1 << 20
DEFAULT_SHAPES = ((64, MiB), (4096, 64 * KiB))  # (num_blocks, block_bytes)
MODEL = "bench"
STORE_NODE = "bench-store"
START_TIMEOUT_S = 60.0
CASE_TIMEOUT_S = 300.0
MOONCAKE_DIST = "mooncake-transfer-engine-non-cuda"
MOONCAKE_VERSION = "0.3.13.post1"
MOONCAKE_VENV = Path.home() / ".cache" / "crescent-bench" / "mooncake-venv"
MOONCAKE_ENV = {"MC_TCP_BIND_ADDRESS": "127.0.0.1"}
MOONCAKE_LIBS = (
    "Debian's libibverbs1, libnl-3-200 and libnl-route-3-200 (`make bench-deps` installs them)"
)
INSTALL_TIMEOUT_S = 600.0


class StoreBenchError(FatalError):
    """The run cannot give honest figures: a side did not come up, or bytes came back wrong."""


@dataclass(frozen=True)
class Shape:
    num_blocks: int
    block_bytes: int

    @property
    def num_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def label(self) -> str:
        if self.block_bytes % MiB == 0:
            return f"{self.block_bytes // MiB}MiB"
        return (
            f"{self.block_bytes // KiB}KiB"
            if self.block_bytes % KiB == 0
            else f"{self.block_bytes}B"
        )

    def batch_blocks(self, batch_bytes: int) -> int:
        return max(1, min(self.num_blocks, batch_bytes // self.block_bytes))


@dataclass
class Timings:
    """Seconds of each timed round (warm-up excluded)."""

    put_s: list[float]
    get_s: list[float]


def run_store_bench(
    repeat: int = 5,
    batch_bytes: int = 16 * MiB,
    include_mooncake: bool = True,
    shapes: tuple[tuple[int, int], ...] = DEFAULT_SHAPES,
    mooncake_venv: Path = MOONCAKE_VENV,
) -> dict:
    """Measure each shape on Crescent (mapped, then data plane), then on Mooncake Store, so
    that both systems of a case run close together in time on a shared machine; returns
    {"bench": "store", "cases": [{"case": "put-1MiB", "gbps": ..., ...}, ...], "config": ...}."""
    measured = [Shape(*shape) for shape in shapes]
    python = (
        ensure_mooncake(mooncake_venv) if include_mooncake else None
    )  # fail before starting anything
    cases = []
    with (
        tempfile.TemporaryDirectory(prefix="crescent-store-bench-") as workdir,
        ExitStack() as stack,
    ):
        crescent = _CrescentSide(stack, Path(workdir))
        mooncake = _MooncakeSide(stack, Path(workdir), python, measured) if python else None
        for shape in measured:
            batch_blocks = shape.batch_blocks(batch_bytes)
            ours = crescent.measure(shape, batch_blocks, repeat)
            theirs = mooncake.measure(shape, batch_blocks, repeat) if mooncake else None
            for op in ("put", "get"):
                case = {"case": f"{op}-{shape.label}", "gbps": _gbps(shape, ours["mapped"], op)}
                if theirs is not None:
                    case["mooncake_gbps"] = _gbps(shape, theirs, op)
                case["tcp_gbps"] = _gbps(shape, ours["tcp"], op)
                cases.append(case)
    config = {
        "repeat": repeat,
        "statistic": "median",
        "batch_bytes": batch_bytes,
        "shapes": [[shape.num_blocks, shape.block_bytes] for shape in measured],
    }
    if include_mooncake:
        config["mooncake"] = (
            f"{MOONCAKE_DIST}=={MOONCAKE_VERSION}, tcp, batch_put_from/batch_get_into"
        )
    return {"bench": "store", "cases": cases, "config": config}


def _gbps(shape: Shape, timings: Timings, op: str) -> float:
    return round(shape.num_bytes / statistics.median(getattr(timings, f"{op}_s")) / 1e9, 3)


def _start(stack: ExitStack, spec: ProcessSpec, log_dir: Path) -> ManagedProcess:
    """Start `spec` with its stop on `stack` (so it is stopped on every way out)."""
    process = ManagedProcess(spec, log_dir)
    stack.callback(process.stop)
    process.start()
    process.wait_ready(START_TIMEOUT_S)
    return process


async def _until(
    predicate: Callable[[], bool], process: ManagedProcess, timeout_s: float, what: str
) -> None:
    """Poll `predicate` until true; fail early, with its log, if `process` dies meanwhile."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if not process.is_running and not predicate():  # it may have finished since the first look
            raise ProcessError(
                process.spec.name, f"exited while waiting for {what}", process.log_tail()
            )
        if time.monotonic() > deadline:
            raise ProcessError(
                process.spec.name, f"no {what} within {timeout_s}s", process.log_tail()
            )
        await asyncio.sleep(0.05)


# Crescent


class _CrescentSide:
    """nats-server and etcd for the whole run; per shape, a store process whose slot size is
    the block size."""

    def __init__(self, stack: ExitStack, workdir: Path) -> None:
        self._logs = workdir / "logs"
        nats_port, etcd_port = free_port(), free_port()
        _start(stack, nats_spec(nats_port), self._logs)
        _start(stack, etcd_spec(etcd_port, workdir / "etcd"), self._logs)
        self._urls = (f"nats://127.0.0.1:{nats_port}", f"http://127.0.0.1:{etcd_port}")
        self._cluster = "bench" + secrets.token_hex(4)

    def measure(self, shape: Shape, batch_blocks: int, repeat: int) -> dict[str, Timings]:
        """Timings of the mapped road ("mapped") and of the data plane forced onto tcp ("tcp")."""
        with ExitStack() as stack:
            store = _start(stack, _store_spec(shape, self._urls, self._cluster), self._logs)
            # on the loop the connector's store bridge runs its client on (engine.kv_store)
            return {
                mode: uvloop.run(
                    asyncio.wait_for(
                        _crescent_rounds(
                            self._urls, self._cluster, store, shape, batch_blocks, repeat, mode
                        ),
                        CASE_TIMEOUT_S,
                    )
                )
                for mode in ("mapped", "tcp")
            }


def _store_spec(shape: Shape, urls: tuple[str, str], cluster: str) -> ProcessSpec:
    """A store whose DRAM pool holds exactly one round (each round's blocks are evicted after it).
    Ready once its HTTP port is open: the store publishes its segment before it serves its
    control subject, and only opens HTTP after both."""
    http_port = free_port()
    argv = [
        sys.executable,
        "-m",
        "crescent.store",
        "--cluster",
        cluster,
        "--nats-url",
        urls[0],
        "--etcd-url",
        urls[1],
        "--node",
        STORE_NODE,
        "--instance-id",
        f"store-{shape.label}",
        "--http-port",
        str(http_port),
        "--block-bytes",
        str(shape.block_bytes),
        "--dram-bytes",
        str(shape.num_bytes),
    ]
    return ProcessSpec(
        name=f"store-{shape.label}",
        argv=argv,
        env={"CRESCENT_LOG_LEVEL": "WARNING"},
        port=http_port,
    )


async def _crescent_rounds(
    urls: tuple[str, str],
    cluster: str,
    store: ManagedProcess,
    shape: Shape,
    batch_blocks: int,
    repeat: int,
    mode: str,
) -> Timings:
    bus = await Bus.connect(urls[0], "store-bench")
    etcd = await connect_etcd(urls[1])
    if mode == "mapped":
        config = ClientConfig(node="bench-client")
    else:
        config = ClientConfig(
            node="bench-client",
            transfer=TransferConfig(node="bench-client", transports=(TransportKind.TCP,)),
        )
    try:
        async with StoreClient(bus, etcd, cluster, config) as client:
            await _until(
                lambda: STORE_NODE in client.directory.nodes(),
                store,
                START_TIMEOUT_S,
                "segment in etcd",
            )
            timings = await _rounds(
                client, shape, batch_blocks, repeat, lambda: _settle(etcd, cluster)
            )
            if mode == "mapped":
                _check_mappable(client)
            else:
                _check_moved_by_tcp(client, 2 * (repeat + 1) * shape.num_bytes)
            return timings
    finally:
        await bus.drain()
        await etcd.close()


async def _rounds(
    client: StoreClient,
    shape: Shape,
    batch_blocks: int,
    repeat: int,
    settle: Callable[[], Awaitable[None]],
) -> Timings:
    src = np.frombuffer(np.random.default_rng(0).bytes(shape.num_bytes), dtype=np.uint8)
    dst = np.zeros(shape.num_bytes, dtype=np.uint8)
    size = shape.block_bytes
    blocks = [src[i * size : (i + 1) * size] for i in range(shape.num_blocks)]
    outs = [dst[i * size : (i + 1) * size] for i in range(shape.num_blocks)]
    batches = [
        slice(start, start + batch_blocks) for start in range(0, shape.num_blocks, batch_blocks)
    ]
    timings = Timings([], [])
    for round_ in range(repeat + 1):
        hashes = [_hash(round_, i) for i in range(shape.num_blocks)]
        started = time.perf_counter()
        for batch in batches:
            _check(
                "put_blocks",
                await client.put_blocks(MODEL, STORE_NODE, hashes[batch], blocks[batch]),
                len(hashes[batch]),
            )
        put_s = time.perf_counter() - started
        started = time.perf_counter()
        for batch in batches:
            _check(
                "get_blocks",
                await client.get_blocks(MODEL, STORE_NODE, hashes[batch], outs[batch]),
                len(hashes[batch]),
            )
        get_s = time.perf_counter() - started
        if round_ == 0:
            if not np.array_equal(src, dst):
                raise StoreBenchError("Crescent's store read back other bytes than were put")
        else:
            timings.put_s.append(put_s)
            timings.get_s.append(get_s)
        evicted = await client.evict(MODEL, STORE_NODE, hashes)
        _check("evict", len(evicted.evicted), len(hashes))
        await settle()
    return timings


async def _settle(etcd: aetcd.Client, cluster: str) -> None:
    """Eviction answers before the store has deleted the blocks' metadata in etcd; wait for
    that, so that the next round's put does not pay for this round's eviction (Mooncake's
    remove is done when it returns)."""
    prefix = Keys(cluster).blocks(MODEL).encode()
    deadline = time.monotonic() + START_TIMEOUT_S
    while (await etcd.get_prefix(prefix, keys_only=True)).count:
        if time.monotonic() > deadline:
            raise StoreBenchError(
                f"the store left block metadata in etcd for {START_TIMEOUT_S}s after eviction"
            )
        await asyncio.sleep(0.01)


def _check_mappable(client: StoreClient) -> None:
    """The client takes the data plane without a word when it cannot map the store (as when
    something removed the store's /dev/shm file); `gbps` would then be mislabelled."""
    descriptor = client.directory(f"{STORE_NODE}.store")
    endpoint = descriptor.endpoint(ShmEndpoint) if descriptor else None
    if endpoint is None or shm_file_identity(endpoint.shm_name) != (
        endpoint.device,
        endpoint.inode,
    ):
        raise StoreBenchError(
            "the store's shared-memory file is gone, so the mapped road was not measured"
        )


def _check_moved_by_tcp(client: StoreClient, num_bytes: int) -> None:
    """`tcp_gbps` is only tcp's if the tcp transport moved every byte put and got."""
    counters = client.transfer_counters()
    moved = {kind.value: c.num_bytes for kind, c in counters.items()}
    if set(moved) != {"tcp"} or moved["tcp"] != num_bytes:
        raise StoreBenchError(
            f"the tcp case moved {moved} bytes by transport, not {num_bytes} over tcp alone"
        )


def _hash(round_: int, index: int) -> bytes:
    return (round_ << 32 | index).to_bytes(HASH_BYTES, "little")


def _check(op: str, num_done: int, num_asked: int) -> None:
    if num_done != num_asked:
        raise StoreBenchError(f"{op}: {num_done} of {num_asked} blocks")


# Mooncake Store


def ensure_mooncake(venv: Path = MOONCAKE_VENV) -> Path:
    """The python of a venv holding Mooncake Store, installed from PyPI on first use."""
    python = venv / "bin" / "python"
    if _mooncake_version(python) != MOONCAKE_VERSION:
        try:
            if not python.exists():
                subprocess.run(
                    [sys.executable, "-m", "venv", str(venv)],
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=INSTALL_TIMEOUT_S,
                )
            subprocess.run(
                [
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    f"{MOONCAKE_DIST}=={MOONCAKE_VERSION}",
                ],
                check=True,
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT_S,
            )
        except subprocess.CalledProcessError as exc:
            raise StoreBenchError(
                f"cannot install {MOONCAKE_DIST}=={MOONCAKE_VERSION} into {venv}: "
                f"{_last_line(exc.stderr)} (include_mooncake=False measures Crescent alone)"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise StoreBenchError(
                f"installing {MOONCAKE_DIST} into {venv} took over {INSTALL_TIMEOUT_S}s"
            ) from exc
    probe = subprocess.run(
        [str(python), "-c", "import mooncake.store"],
        check=False,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        env={**os.environ, **MOONCAKE_ENV},
    )
    if probe.returncode != 0:
        raise StoreBenchError(
            f"Mooncake Store does not load ({_last_line(probe.stderr)}); it needs {MOONCAKE_LIBS}"
        )
    return python


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "no message"


def _mooncake_version(python: Path) -> str | None:
    if not python.exists():
        return None
    script = f"import importlib.metadata as m; print(m.version({MOONCAKE_DIST!r}))"
    probe = subprocess.run(
        [str(python), "-c", script],
        check=False,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


class _MooncakeSide:
    """mooncake_master and the segment-contributing process for the whole run; per shape, a
    client process that contributes no segment."""

    def __init__(self, stack: ExitStack, workdir: Path, python: Path, shapes: list[Shape]) -> None:
        self._stack = stack
        self._work = workdir / "mooncake"
        self._peer = [str(python), str(Path(__file__).with_name("mooncake_peer.py"))]
        port = free_port()
        self._master = f"127.0.0.1:{port}"
        _start(
            stack,
            ProcessSpec(
                "mooncake-master",
                env=MOONCAKE_ENV,
                port=port,
                argv=[
                    str(python.parent / "mooncake_master"),
                    f"--rpc_port={port}",
                    "--rpc_address=127.0.0.1",
                    f"--metrics_port={free_port()}",
                    "--metrics_host=127.0.0.1",
                ],
            ),
            self._work,
        )
        # Twice the largest round, so that no round comes near Mooncake's eviction mark
        # (90% full); Mooncake refuses segments under 16 MiB.
        segment_bytes = max(2 * max(shape.num_bytes for shape in shapes), 16 * MiB)
        ready = self._work / "segment.ready"
        segment = _start(
            stack,
            ProcessSpec(
                "mooncake-segment",
                env=MOONCAKE_ENV,
                argv=self._peer
                + [
                    "--master",
                    self._master,
                    "segment",
                    "--segment-bytes",
                    str(segment_bytes),
                    "--ready",
                    str(ready),
                ],
            ),
            self._work,
        )
        asyncio.run(_until(ready.exists, segment, START_TIMEOUT_S, "mounted segment"))

    def measure(self, shape: Shape, batch_blocks: int, repeat: int) -> Timings:
        out = self._work / f"client-{shape.label}.json"
        argv = self._peer + [
            "--master",
            self._master,
            "client",
            "--num-blocks",
            str(shape.num_blocks),
            "--block-bytes",
            str(shape.block_bytes),
            "--batch-blocks",
            str(batch_blocks),
            "--repeat",
            str(repeat),
            "--out",
            str(out),
        ]
        client = _start(
            self._stack,
            ProcessSpec(f"mooncake-client-{shape.label}", argv, MOONCAKE_ENV),
            self._work,
        )
        asyncio.run(_until(out.exists, client, CASE_TIMEOUT_S, "timings"))
        return Timings(**json.loads(out.read_text()))
