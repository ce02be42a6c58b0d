"""A whole cluster on this machine: NATS, etcd, a store, a conductor, prefill and decode workers.

Used by `crescent up`, by the end-to-end tests and by the benchmarks, so all three run the same
topology the same way. Services are real processes (`python -m crescent.<service>`).
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from crescent.cluster.infra import COMPACTION_RETENTION, etcd_spec, nats_spec
from crescent.cluster.processes import ManagedProcess, ProcessError, ProcessSpec, restart_exited
from crescent.cluster.restarts import Backoff, RestartSchedule
from crescent.common.ports import free_port
from crescent.transfer import sweep_orphans

log = logging.getLogger(__name__)


@dataclass
class ClusterSpec:
    workdir: Path
    api_port: int = 8000  # of the first conductor; any others listen on free ports
    num_conductors: int = 1
    num_prefill: int = 1
    num_decode: int = 1
    cluster: str = "dev"
    engine_args: list[str] = field(default_factory=list)  # extra flags for prefill and decode
    env: dict[str, str] = field(default_factory=dict)  # extra environment for every service
    log_format: str = "json"
    store_dram_bytes: int = 256 << 20
    store_ssd_bytes: int = 1 << 30
    store_args: list[str] = field(default_factory=list)  # extra flags for every store
    conductor_args: list[str] = field(default_factory=list)  # extra flags for the conductor
    decode_args: list[str] = field(default_factory=list)  # extra flags for decode instances only
    node_per_instance: bool = False  # each prefill/decode on a node of its own, with its own store
    engine: str = "emulated"  # or "vllm": a real model from model_dir
    model_dir: Path | None = None
    block_size: int = 64  # tokens per stored KV block (vllm; a multiple of vLLM's 32)
    nats_max_payload: int | None = None  # the NATS server's largest message; None: 1 MiB
    restart_backoff: Backoff = field(default_factory=Backoff)
    etcd_compaction_retention: str = COMPACTION_RETENTION  # "0": etcd keeps every revision

    def nodes(self) -> dict[str, str]:
        """instance id → node of every prefill and decode instance."""
        ids = [f"prefill-{i}" for i in range(self.num_prefill)] + [
            f"decode-{i}" for i in range(self.num_decode)
        ]
        return {i: (f"node-{i}" if self.node_per_instance else "node0") for i in ids}


class LocalCluster:
    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.nats_port = free_port()
        self.etcd_port = free_port()
        self.log_dir = spec.workdir / "logs"
        self.processes: list[ManagedProcess] = []
        self.conductor_ports = [
            spec.api_port,
            *(free_port() for _ in range(spec.num_conductors - 1)),
        ]
        self._restarts = RestartSchedule(spec.restart_backoff)

    @property
    def api_url(self) -> str:
        return self.conductor_urls[0]

    @property
    def conductor_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.conductor_ports]

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def _service(self, role: str, instance_id: str, extra: list[str]) -> ProcessSpec:
        argv = [
            sys.executable,
            "-m",
            f"crescent.{role}",
            "--cluster",
            self.spec.cluster,
            "--nats-url",
            self.nats_url,
            "--etcd-url",
            self.etcd_url,
            "--instance-id",
            instance_id,
            "--log-format",
            self.spec.log_format,
            *extra,
        ]
        return ProcessSpec(name=instance_id, argv=argv, env=self.spec.env, stop_timeout_s=35.0)

    def _model_flags(self) -> dict[str, list[str]]:
        """Per role, the flags that make every service agree on the model: its checkpoint,
        tokenizer, block size and the bytes of one stored block."""
        if self.spec.engine != "vllm":
            return {"store": [], "worker": list(self.spec.engine_args), "conductor": []}
        from crescent.common.checkpoint import inspect_checkpoint

        model_dir, block_size = str(self.spec.model_dir), str(self.spec.block_size)
        block_bytes = str(inspect_checkpoint(model_dir).kv.block_bytes(self.spec.block_size))
        return {
            "store": ["--block-bytes", block_bytes],
            "worker": [
                "--engine",
                "vllm",
                "--model",
                model_dir,
                "--block-size",
                block_size,
                "--vllm-kv-cache-gib",
                "1",
                *self.spec.engine_args,
            ],
            "conductor": [
                "--tokenizer",
                model_dir,
                "--block-size",
                block_size,
                "--kv-bytes-per-block",
                block_bytes,
            ],
        }

    def _store(self, node: str) -> ProcessSpec:
        return self._service(
            "store",
            f"store-{node}",
            [
                "--node",
                node,
                "--dram-bytes",
                str(self.spec.store_dram_bytes),
                "--ssd-path",
                str(self.spec.workdir / f"store-{node}.ssd"),
                "--ssd-bytes",
                str(self.spec.store_ssd_bytes),
                *self._model_flags()["store"],
                *self.spec.store_args,
            ],
        )

    def conductor_spec(self, instance_id: str, port: int) -> ProcessSpec:
        """A conductor of this cluster; more than one may run at once (they share no state)."""
        spec = self._service(
            "conductor",
            instance_id,
            [
                "--http-port",
                str(port),
                *self._model_flags()["conductor"],
                *self.spec.conductor_args,
            ],
        )
        spec.port = port
        return spec

    def worker_spec(self, role: str, instance_id: str, node: str = "node0") -> ProcessSpec:
        """A prefill or decode instance of this cluster on `node`."""
        extra = self.spec.decode_args if role == "decode" else []
        return self._service(
            role, instance_id, ["--node", node, *self._model_flags()["worker"], *extra]
        )

    def _specs(self) -> list[ProcessSpec]:
        nodes = self.spec.nodes()
        specs = [self._store(node) for node in sorted(set(nodes.values()))]
        for instance_id, node in nodes.items():
            specs.append(self.worker_spec(instance_id.split("-")[0], instance_id, node))
        conductors = [
            self.conductor_spec(f"conductor-{i}", port)
            for i, port in enumerate(self.conductor_ports)
        ]
        return specs + conductors

    def process(self, name: str) -> ManagedProcess:
        """The process named `name`: "nats", "etcd", "store-node0", "prefill-1", "conductor-0"..."""
        return next(p for p in self.processes if p.spec.name == name)

    def workers(self, role: str) -> list[ManagedProcess]:
        """The prefill or decode processes of this cluster, oldest first."""
        return [p for p in self.processes if p.spec.name.startswith(f"{role}-")]

    def remove_process(self, process: ManagedProcess) -> None:
        """Forget a process that has exited for good (a drained surplus worker)."""
        self.processes.remove(process)

    def add_process(self, spec: ProcessSpec) -> ManagedProcess:
        """Start one more process under this cluster's supervision and stop."""
        return self._launch(spec)

    def start(self, timeout_s: float = 60.0) -> None:
        """Start everything and wait until every conductor sees every worker; stop all on failure.

        Starts clean: shared memory left by processes killed in an earlier run is swept, and
        etcd starts empty (every key is leased to a process of the earlier run, so nothing in it
        outlives that run by design; stale keys would point at blocks no store holds)."""
        self._sweep_shared_memory()
        shutil.rmtree(self.spec.workdir / "etcd-data", ignore_errors=True)
        try:
            for spec in (
                nats_spec(self.nats_port, config=self._nats_config()),
                etcd_spec(
                    self.etcd_port,
                    self.spec.workdir / "etcd-data",
                    compaction_retention=self.spec.etcd_compaction_retention,
                ),
            ):
                self._launch(spec).wait_ready(timeout_s)
            for spec in self._specs():
                self._launch(spec)
            self.wait_serving(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _nats_config(self) -> Path | None:
        if self.spec.nats_max_payload is None:
            return None
        config = self.spec.workdir / "nats.conf"
        config.write_text(f"max_payload: {self.spec.nats_max_payload}\n")
        return config

    def _launch(self, spec: ProcessSpec) -> ManagedProcess:
        process = ManagedProcess(spec, self.log_dir)
        process.start()
        self.processes.append(process)
        return process

    def health(self, url: str | None = None) -> dict | None:
        """The /health body of the conductor at `url` (default: the first), None if unreachable."""
        try:
            with urllib.request.urlopen(f"{url or self.api_url}/health", timeout=2) as response:
                return json.load(response)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def wait_serving(self, timeout_s: float) -> None:
        expected = {
            "prefill": self.spec.num_prefill,
            "decode": self.spec.num_decode,
            "store": len(set(self.spec.nodes().values())),
        }
        deadline = time.monotonic() + timeout_s
        progress = ""
        while True:
            healths = [self.health(url) for url in self.conductor_urls]
            if all(
                h and h.get("status") == "serving" and h.get("live_instances") == expected
                for h in healths
            ):
                return
            now_live = _progress(healths[0], expected)
            if now_live != progress:  # a model takes minutes to load: say who is up so far
                log.info("starting: %s", now_live)
                progress = now_live
            for process in self.processes:
                if not process.is_running:
                    raise ProcessError(
                        process.spec.name,
                        f"exited with code {process.popen.returncode}",
                        process.log_tail(),
                    )
            if time.monotonic() > deadline:
                raise ProcessError(
                    "cluster", f"not serving after {timeout_s}s; conductor health: {healths}"
                )
            time.sleep(0.1)

    def supervise(self) -> None:
        """Restart every process that exited without being stopped, after a backoff that grows
        with each crash in a row, and sweep the shared memory it left. Call this periodically,
        from the main thread (see ManagedProcess.start)."""
        restart_exited(self.processes, self._restarts, self._crashed)

    def _crashed(self, process: ManagedProcess, delay_s: float) -> None:
        log.warning(
            "%s exited with code %s; restarting in %.1fs (crash %d in a row)",
            process.spec.name,
            process.popen.returncode,
            delay_s,
            self._restarts.num_crashes(process.spec.name),
        )
        self._sweep_shared_memory()

    def stop(self) -> None:
        """Services first (conductors before workers), then etcd, then NATS; then sweep the shared
        memory of any process that was killed rather than stopped."""
        for process in reversed(self.processes):
            code = process.stop()
            if code not in (0, None, -15):
                log.warning("%s stopped with code %s", process.spec.name, code)
        self._sweep_shared_memory()

    def _sweep_shared_memory(self) -> None:
        removed = sweep_orphans()
        if removed:
            log.warning("removed shared memory left by dead processes: %s", " ".join(removed))

    def roles_by_pid(self) -> dict[int, str]:
        """Each running process's role: "conductor", "prefill", "decode", "store", "nats",
        "etcd" (a process's name up to its first "-")."""
        return {p.pid: p.spec.name.split("-", 1)[0] for p in self.processes if p.pid is not None}


def _progress(health: dict | None, expected: dict[str, int]) -> str:
    """Who a conductor sees live, against who is expected, as a log line shows it."""
    if not health or health.get("status") != "serving":
        return "waiting for the conductor"
    live = health.get("live_instances", {})
    return ", ".join(f"{role} {live.get(role, 0)}/{count} live" for role, count in expected.items())
