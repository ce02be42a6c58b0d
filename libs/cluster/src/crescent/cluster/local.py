"""A whole cluster on this machine: NATS, etcd, a store, a conductor, prefill and decode workers.

Used by `crescent up`, by the end-to-end tests and by the benchmarks, so all three run the same
topology the same way. Services are real processes (`python -m crescent.<service>`).
"""

from __future__ import annotations

import json
import logging
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from crescent.cluster.infra import etcd_spec, nats_spec
from crescent.cluster.processes import ManagedProcess, ProcessError, ProcessSpec, free_port

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = (0.5, 1, 2, 5, 10)


@dataclass
class ClusterSpec:
    workdir: Path
    api_port: int = 8000
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

    def nodes(self) -> dict[str, str]:
        """instance id → node of every prefill and decode instance."""
        ids = [f"prefill-{i}" for i in range(self.num_prefill)] + [f"decode-{i}" for i in range(self.num_decode)]
        return {i: (f"node-{i}" if self.node_per_instance else "node0") for i in ids}


class LocalCluster:
    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.nats_port = free_port()
        self.etcd_port = free_port()
        self.log_dir = spec.workdir / "logs"
        self.processes: list[ManagedProcess] = []
        self._restart_at: dict[str, float] = {}

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.spec.api_port}"

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def _service(self, role: str, instance_id: str, extra: list[str]) -> ProcessSpec:
        argv = [sys.executable, "-m", f"crescent.{role}", "--cluster", self.spec.cluster,
                "--nats-url", self.nats_url, "--etcd-url", self.etcd_url, "--instance-id", instance_id,
                "--log-format", self.spec.log_format, *extra]
        return ProcessSpec(name=instance_id, argv=argv, env=self.spec.env, stop_timeout_s=35.0)

    def _model_flags(self) -> dict[str, list[str]]:
        """Per role, the flags that make every service agree on the model: its checkpoint,
        tokenizer, block size and the bytes of one stored block."""
        if self.spec.engine != "vllm":
            return {"store": [], "worker": list(self.spec.engine_args), "conductor": []}
        from crescent.engine.checkpoint import inspect_checkpoint

        model_dir, block_size = str(self.spec.model_dir), str(self.spec.block_size)
        block_bytes = str(inspect_checkpoint(model_dir).kv.block_bytes(self.spec.block_size))
        return {"store": ["--block-bytes", block_bytes],
                "worker": ["--engine", "vllm", "--model", model_dir, "--block-size", block_size,
                           "--vllm-kv-cache-gib", "1", *self.spec.engine_args],
                "conductor": ["--tokenizer", model_dir, "--block-size", block_size,
                              "--kv-bytes-per-block", block_bytes]}

    def _store(self, node: str) -> ProcessSpec:
        return self._service("store", f"store-{node}", [
            "--node", node, "--dram-bytes", str(self.spec.store_dram_bytes),
            "--ssd-path", str(self.spec.workdir / f"store-{node}.ssd"), "--ssd-bytes", str(self.spec.store_ssd_bytes),
            *self._model_flags()["store"], *self.spec.store_args])

    def conductor_spec(self, instance_id: str, port: int) -> ProcessSpec:
        """A conductor of this cluster; more than one may run at once (they share no state)."""
        spec = self._service("conductor", instance_id, ["--http-port", str(port), *self._model_flags()["conductor"],
                                                        *self.spec.conductor_args])
        spec.port = port
        return spec

    def _specs(self) -> list[ProcessSpec]:
        nodes = self.spec.nodes()
        specs = [self._store(node) for node in sorted(set(nodes.values()))]
        worker = self._model_flags()["worker"]
        for instance_id, node in nodes.items():
            role = instance_id.split("-")[0]
            extra = self.spec.decode_args if role == "decode" else []
            specs.append(self._service(role, instance_id, ["--node", node, *worker, *extra]))
        return specs + [self.conductor_spec("conductor-0", self.spec.api_port)]

    def add_process(self, spec: ProcessSpec) -> ManagedProcess:
        """Start one more process under this cluster's supervision and stop."""
        return self._launch(spec)

    def start(self, timeout_s: float = 60.0) -> None:
        """Start everything and wait until the conductor sees every worker; stop all on failure."""
        try:
            for spec in (nats_spec(self.nats_port), etcd_spec(self.etcd_port, self.spec.workdir / "etcd-data")):
                self._launch(spec).wait_ready(timeout_s)
            for spec in self._specs():
                self._launch(spec)
            self.wait_serving(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _launch(self, spec: ProcessSpec) -> ManagedProcess:
        process = ManagedProcess(spec, self.log_dir)
        process.start()
        self.processes.append(process)
        return process

    def health(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                return json.load(response)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def wait_serving(self, timeout_s: float) -> None:
        expected = {"prefill": self.spec.num_prefill, "decode": self.spec.num_decode,
                    "store": len(set(self.spec.nodes().values()))}
        deadline = time.monotonic() + timeout_s
        while True:
            health = self.health()
            if health and health.get("status") == "serving" and health.get("live_instances") == expected:
                return
            for process in self.processes:
                if not process.is_running:
                    raise ProcessError(process.spec.name, f"exited with code {process.popen.returncode}",
                                       process.log_tail())
            if time.monotonic() > deadline:
                raise ProcessError("cluster", f"not serving after {timeout_s}s; conductor health: {health}")
            time.sleep(0.1)

    def supervise(self) -> None:
        """Restart crashed processes with growing backoff; call this periodically."""
        now = time.monotonic()
        for process in self.processes:
            if process.is_running:
                continue
            name = process.spec.name
            if name not in self._restart_at:
                delay = RESTART_BACKOFF_S[min(process.num_starts - 1, len(RESTART_BACKOFF_S) - 1)]
                self._restart_at[name] = now + delay
                log.warning("%s exited with code %s; restarting in %ss", name, process.popen.returncode, delay)
            elif now >= self._restart_at.pop(name):
                process.start()

    def stop(self) -> None:
        """Services first (conductor before workers), then etcd, then NATS."""
        for process in reversed(self.processes):
            code = process.stop()
            if code not in (0, None, -15):
                log.warning("%s stopped with code %s", process.spec.name, code)

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]
