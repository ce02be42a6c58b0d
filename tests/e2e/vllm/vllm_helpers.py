"""Helpers of the `vllm` e2e tests. A real-model cluster: NATS, etcd, a store on each of
two nodes, on node A a prefill worker, a decode worker and a decode worker whose connector
injects a lost block, on node B a prefill worker whose commits to its own store come late.
Node B stands for another host: its store and its prefill's connector run the tcp transport
alone, so whatever crosses between A and B crosses over tcp. All serve the tiny Llama built by
the test. The tests act as the conductor (they send the NATS messages themselves), so what they
check is the workers and CrescentConnector, not the conductor's policy."""

from __future__ import annotations

import json
import os
import random
import secrets
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from scrape import metric

from crescent.cluster.infra import etcd_spec, nats_spec
from crescent.cluster.processes import ManagedProcess, ProcessSpec
from crescent.common.bus import Bus
from crescent.common.checkpoint import inspect_checkpoint
from crescent.common.messages import (
    Ack,
    DecodeStart,
    PrefillJob,
    PrefillResult,
    Reservation,
    ReservationReply,
    SamplingParams,
    TokenChunk,
)
from crescent.common.naming import Subjects
from crescent.common.ports import free_port

MODEL = "tiny"
BLOCK_SIZE = 64
CLUSTER = "vllmtest"
ENV = {"OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}


def engine_flags(model_dir: Path, node: str, event_log: Path, *extra: str) -> list[str]:
    return [
        "--engine",
        "vllm",
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL,
        "--node",
        node,
        "--block-size",
        str(BLOCK_SIZE),
        "--vllm-kv-cache-gib",
        "1",
        "--kv-event-log",
        str(event_log),
        "--log-format",
        "text",
        *extra,
    ]


@dataclass
class VllmCluster:
    workdir: Path
    model_dir: Path
    nats_url: str = ""
    etcd_url: str = ""
    nats_monitor_port: int = 0
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    http_ports: dict[str, int] = field(default_factory=dict)

    @property
    def block_bytes(self) -> int:
        return inspect_checkpoint(self.model_dir).kv.block_bytes(BLOCK_SIZE)

    def event_log(self, instance_id: str) -> Path:
        return self.workdir / f"{instance_id}.events.jsonl"

    def events(self, instance_id: str) -> list[dict]:
        path = self.event_log(instance_id)
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def _launch(self, spec: ProcessSpec) -> ManagedProcess:
        process = ManagedProcess(spec, self.workdir / "logs")
        process.start()
        self.processes[spec.name] = process
        return process

    def _service(self, role: str, instance_id: str, *extra: str) -> ProcessSpec:
        port = free_port()
        self.http_ports[instance_id] = port
        argv = [
            sys.executable,
            "-m",
            f"crescent.{role}",
            "--cluster",
            CLUSTER,
            "--nats-url",
            self.nats_url,
            "--etcd-url",
            self.etcd_url,
            "--instance-id",
            instance_id,
            "--http-port",
            str(port),
            *extra,
        ]
        return ProcessSpec(name=instance_id, argv=argv, env=ENV, stop_timeout_s=30.0)

    def start(self, timeout_s: float = 240.0) -> None:
        nats_port, etcd_port, self.nats_monitor_port = free_port(), free_port(), free_port()
        self.nats_url, self.etcd_url = (
            f"nats://127.0.0.1:{nats_port}",
            f"http://127.0.0.1:{etcd_port}",
        )
        self._launch(nats_spec(nats_port, monitor_port=self.nats_monitor_port)).wait_ready(30)
        self._launch(etcd_spec(etcd_port, self.workdir / "etcd-data")).wait_ready(30)
        for node, transports in (
            ("A", ""),
            ("B", "tcp"),
        ):  # B, "another host", pulls from A over tcp
            self._launch(
                self._service(
                    "store",
                    f"store-{node}",
                    "--node",
                    node,
                    "--block-bytes",
                    str(self.block_bytes),
                    "--dram-bytes",
                    str(64 << 20),
                    "--log-format",
                    "text",
                    "--transports",
                    transports,
                )
            )
        self.wait_serving(["store-A", "store-B"], 60)
        no_cache = "--no-vllm-prefix-caching"  # prefill: every reuse must come from the store
        self._launch(
            self._service(
                "prefill",
                "prefill-A",
                *engine_flags(self.model_dir, "A", self.event_log("prefill-A"), no_cache),
            )
        )
        self._launch(
            self._service(
                "decode",
                "decode-A",
                *engine_flags(  # its own prompts' commits 0.5 s late
                    self.model_dir,
                    "A",
                    self.event_log("decode-A"),
                    "--telemetry-period-s",
                    "0.05",
                    "--kv-fault",
                    "delay_commits",
                ),
            )
        )
        self._launch(
            self._service(
                "prefill",
                "prefill-B",
                *engine_flags(  # as if on another host: tcp only;
                    self.model_dir,
                    "B",
                    self.event_log("prefill-B"),
                    no_cache,
                    "--kv-transports",
                    "tcp",  # its own
                    "--kv-fault",
                    "delay_commits",  # every commit 0.5 s late
                ),
            )
        )
        self._launch(
            self._service(
                "decode",
                "decode-F",
                *engine_flags(  # its store "loses" blocks
                    self.model_dir,
                    "A",
                    self.event_log("decode-F"),
                    "--kv-fault",
                    "evict_after_lookup",
                ),
            )
        )
        self._launch(
            self._service(
                "decode",
                "decode-S",
                *engine_flags(  # every load starts 2 s late
                    self.model_dir,
                    "A",
                    self.event_log("decode-S"),
                    "--kv-fault",
                    "slow_load",
                ),
            )
        )
        self.wait_serving(["prefill-A", "decode-A", "prefill-B", "decode-F", "decode-S"], timeout_s)

    def transfer_bytes(self, instance_id: str) -> dict[tuple[str, str], float]:
        """(transport, side) → bytes, from the service's /metrics
        (crescent_transfer_bytes_total)."""
        url = f"http://127.0.0.1:{self.http_ports[instance_id]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        return {
            (s.labels["transport"], s.labels["side"]): s.value
            for family in text_string_to_metric_families(text)
            if family.name == "crescent_transfer_bytes"
            for s in family.samples
            if s.name == "crescent_transfer_bytes_total"
        }

    def nats_connection_names(self) -> list[str]:
        """The name of every client connection the NATS server holds (its /connz endpoint)."""
        url = f"http://127.0.0.1:{self.nats_monitor_port}/connz?limit=4096"
        with urllib.request.urlopen(url, timeout=5) as response:
            return [connection.get("name", "") for connection in json.load(response)["connections"]]

    def health(self, instance_id: str) -> dict | None:
        url = f"http://127.0.0.1:{self.http_ports[instance_id]}/health"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return json.load(response)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def metric(self, instance_id: str, name: str, **labels: str) -> float:
        """One sample of the instance's /metrics (0 when it has none yet)."""
        return metric(f"http://127.0.0.1:{self.http_ports[instance_id]}", name, **labels)

    def wait_serving(self, instance_ids: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        waiting = list(instance_ids)
        while waiting:
            for instance_id in list(waiting):
                process = self.processes[instance_id]
                if not process.is_running:
                    raise AssertionError(f"{instance_id} exited: {process.log_tail()}")
                health = self.health(instance_id)
                if health and health.get("status") == "serving":
                    waiting.remove(instance_id)
            if time.monotonic() > deadline:
                raise AssertionError(f"{waiting} not serving within {timeout_s}s")
            time.sleep(0.2)

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            process.stop()


def reference_tokens(llm, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from vllm import SamplingParams, TokensPrompt

    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
        use_tqdm=False,
    )
    return [list(o.outputs[0].token_ids) for o in outputs]


class Conductor:
    """Plays the conductor's part of the request path over NATS: reserve on decode, prefill
    job, decode start, collect the token stream."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.subjects = Subjects(CLUSTER)
        self._count = 0
        self._run = secrets.token_hex(3)  # request ids stay unique across the tests of one cluster
        # request id → the first token chunk's num_cached_tokens (a prompt the decode computed)
        self.num_cached_tokens: dict[str, int | None] = {}
        self.prefilled_at = 0.0  # wall clock when the latest generate's prefill answered

    async def prefill(
        self,
        prefill_id: str,
        token_ids: list[int],
        decode_id: str = "decode-A",
        request_id: str | None = None,
        pull: tuple[str, list[bytes]] = ("", []),
        planned: int | None = None,
    ) -> PrefillResult:
        """Run a prefill job; `pull` is the transfer plan (source node, blocks to pull) and
        `planned` the prefix the plan counts on the node's store for (None: no plan)."""
        self._count += 1
        request_id = request_id or f"req-{self._run}-{self._count}"
        job = PrefillJob(
            request_id=request_id,
            model=MODEL,
            token_ids=token_ids,
            sampling=SamplingParams(ignore_eos=True),
            decode_instance=decode_id,
            source_node=pull[0],
            pull_hashes=pull[1],
            planned_prefix_tokens=planned,
        )
        return await self.bus.request(
            self.subjects.prefill_job(prefill_id), job, PrefillResult, 120
        )

    async def generate(
        self,
        token_ids: list[int],
        max_tokens: int,
        prefill_id: str = "prefill-A",
        decode_id: str = "decode-A",
        pull: tuple[str, list[bytes]] = ("", []),
        planned: int | None = None,
    ) -> tuple[list[int], PrefillResult]:
        """Prompt → all generated tokens (first from prefill, the rest from decode)."""
        request_id = await self._reserve(token_ids, max_tokens, decode_id)
        result = await self.prefill(prefill_id, token_ids, decode_id, request_id, pull, planned)
        self.prefilled_at = time.time()
        return await self._decode(
            request_id, token_ids, result.first_token, max_tokens, decode_id
        ), result

    async def generate_on_decode(
        self,
        token_ids: list[int],
        max_tokens: int,
        decode_id: str = "decode-A",
        arrivals: list[float] | None = None,
    ) -> tuple[list[int], str]:
        """Conditional disaggregation: no prefill job, the decode instance computes the prompt.
        Returns the tokens and the request id; `arrivals` gets each token's wall-clock arrival."""
        request_id = await self._reserve(token_ids, max_tokens, decode_id)
        tokens = await self._decode(request_id, token_ids, None, max_tokens, decode_id, arrivals)
        return tokens, request_id

    async def _reserve(self, token_ids: list[int], max_tokens: int, decode_id: str) -> str:
        self._count += 1
        request_id = f"req-{self._run}-{self._count}"
        reply = await self.bus.request(
            self.subjects.decode_reserve(decode_id),
            Reservation(
                request_id=request_id, num_prompt_tokens=len(token_ids), max_tokens=max_tokens
            ),
            ReservationReply,
            10,
        )
        assert reply.accepted, reply.reason
        return request_id

    async def _decode(
        self,
        request_id: str,
        token_ids: list[int],
        first_token: int | None,
        max_tokens: int,
        decode_id: str,
        arrivals: list[float] | None = None,
    ) -> list[int]:
        stream = await self.bus.stream(self.subjects.tokens(request_id), TokenChunk)
        try:
            await self.bus.request(
                self.subjects.decode_start(decode_id),
                DecodeStart(
                    request_id=request_id,
                    token_ids=token_ids,
                    first_token=first_token,
                    max_tokens=max_tokens,
                    sampling=SamplingParams(ignore_eos=True),
                ),
                Ack,
                30,
            )
            tokens = [] if first_token is None else [first_token]
            while True:
                chunk = await stream.next(60)
                assert chunk.error is None, chunk.error
                if chunk.seq == 0:
                    self.num_cached_tokens[request_id] = chunk.num_cached_tokens
                tokens += chunk.token_ids
                if arrivals is not None:
                    arrivals += [time.time()] * len(chunk.token_ids)
                if chunk.is_final:
                    return tokens
        finally:
            await stream.close()


def prompt_tokens(length: int, seed: int) -> list[int]:
    """Deterministic token ids inside the tiny vocabulary, away from the special tokens.

    Drawn from a generator seeded per prompt, so two seeds never share a prefix (an
    arithmetic sequence here once made seeds 1,000 apart the same prompt, and cache hits
    where a test meant none)."""
    draw = random.Random(seed)
    return [draw.randrange(3, 1003) for _ in range(length)]


def env_for_in_process_engines() -> None:
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
