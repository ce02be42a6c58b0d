"""`crescent bench control-plane`: what the control path costs, with compute taken out.

The emulated engine runs at time scale 0, so every millisecond measured is HTTP, tokenizing,
scheduling, NATS hops, the decode batch loop and SSE/JSON relaying. Side by side in one run:
  http-direct  an aiohttp server answering the same JSON without a cluster (the baseline);
  1P1D, 4P4D   a real local cluster (all services as processes);
  1P1D-on-decode  1P1D whose conductor has the decode instance compute prompts of up to 512
               uncached tokens itself (`--local-prefill 512`): the bench's prompt never visits
               the prefill instance, the path a short prompt takes under `--local-prefill auto`.
Latency is measured one request at a time (no queueing); requests/s with `concurrency` in flight.
One more case, in this process, times what the conductor does with a body whose prompt is
8,000 token ids (strict JSON, then the OpenAI fields checked into a request) against the
standard library's json.loads of the same bytes.
`cpu_ms_per_request` is the CPU time the serving processes (for a cluster: every one of them,
NATS and etcd included) spent during the loaded run, per request: unlike latency and requests/s,
it barely moves when other work shares the machine's cores.
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
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from crescent.bench.load import run_load
from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.cluster.processes import is_port_open
from crescent.common.ports import free_port
from crescent.conductor.http_body import parse_json
from crescent.conductor.openai_api import parse_completion

MODEL = "crescent-emulated"
WARMUP_REQUESTS = 20
NUM_PROMPT_IDS = 8000
NUM_PARSES = 200
ON_DECODE_METRIC = "crescent_prefill_on_decode_total"
# name, prefill and decode instances each, conductor flags, whether decode computes the prompts
CLUSTER_CASES = (
    ("1P1D", 1, [], False),
    ("4P4D", 4, [], False),
    ("1P1D-on-decode", 1, ["--local-prefill", "512"], True),
)


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of the processes `pids` so far (Linux /proc)."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
    return ticks / os.sysconf("SC_CLK_TCK")


def _num_serial(num_requests: int) -> int:
    """Requests sent one at a time for the latency figures."""
    return max(num_requests // 4, 50)


def _measure(
    url: str, num_requests: int, concurrency: int, max_tokens: int, pids: list[int]
) -> dict:
    body = {
        "model": MODEL,
        "prompt": "Benchmark the control path of Crescent. " * 4,
        "max_tokens": max_tokens,
    }
    asyncio.run(run_load(url, body, WARMUP_REQUESTS, 1))
    serial = asyncio.run(run_load(url, body, _num_serial(num_requests), 1))
    cpu_before = _cpu_seconds(pids)
    loaded = asyncio.run(run_load(url, body, num_requests, concurrency))
    cpu_s = _cpu_seconds(pids) - cpu_before
    if serial.num_errors or loaded.num_errors:
        raise RuntimeError(f"{url}: {serial.num_errors + loaded.num_errors} requests failed")
    return {
        "rps": round(loaded.requests_per_s, 1),
        "p50_ms": round(serial.percentile_ms(50), 3),
        "p99_ms": round(serial.percentile_ms(99), 3),
        "loaded_p50_ms": round(loaded.percentile_ms(50), 3),
        "loaded_p99_ms": round(loaded.percentile_ms(99), 3),
        "cpu_ms_per_request": round(cpu_s * 1000 / num_requests, 3),
    }


def _num_prefilled_on_decode(api_url: str) -> int:
    with urllib.request.urlopen(f"{api_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return round(
        sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == ON_DECODE_METRIC
        )
    )


def _baseline(num_requests: int, concurrency: int, max_tokens: int) -> dict:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "crescent.bench.echo_server", "--port", str(port)]
    )
    try:
        deadline = time.monotonic() + 20
        while not is_port_open(port):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the baseline server did not start")
            time.sleep(0.05)
        return _measure(
            f"http://127.0.0.1:{port}/v1/completions",
            num_requests,
            concurrency,
            max_tokens,
            [server.pid],
        )
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
) -> dict:
    """The case's figures; it fails unless the decode instance computed every prompt when
    `on_decode` says so and none otherwise (the conductor's own count)."""
    with tempfile.TemporaryDirectory(prefix="crescent-bench-") as workdir:
        spec = ClusterSpec(
            workdir=Path(workdir),
            api_port=free_port(),
            num_prefill=num_instances,
            num_decode=num_instances,
            engine_args=["--emulated-time-scale", "0"],
            env={"CRESCENT_LOG_LEVEL": "WARNING"},
            conductor_args=conductor_args,
        )
        cluster = LocalCluster(spec)
        cluster.start(timeout_s=120)
        try:
            result = _measure(
                f"{cluster.api_url}/v1/completions",
                num_requests,
                concurrency,
                max_tokens,
                cluster.pids(),
            )
            num_on_decode = _num_prefilled_on_decode(cluster.api_url)
        finally:
            cluster.stop()
    num_sent = WARMUP_REQUESTS + _num_serial(num_requests) + num_requests
    if num_on_decode != (num_sent if on_decode else 0):
        raise RuntimeError(
            f"the decode instance computed {num_on_decode} of {num_sent} prompts; "
            f"expected {'all' if on_decode else 'none'}"
        )
    return result


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
    num_requests: int = 400, concurrency: int = 16, max_tokens: int = 8
) -> dict:
    baseline = _baseline(num_requests, concurrency, max_tokens)
    cases = [{"case": "http-direct", **baseline}]
    for name, num_instances, conductor_args, on_decode in CLUSTER_CASES:
        result = _cluster(
            num_instances, num_requests, concurrency, max_tokens, conductor_args, on_decode
        )
        result["added_p50_ms"] = round(result["p50_ms"] - baseline["p50_ms"], 3)
        result["added_p99_ms"] = round(result["p99_ms"] - baseline["p99_ms"], 3)
        cases.append({"case": name, **result})
    cases.append(_token_id_body())
    return {
        "bench": "control-plane",
        "cases": cases,
        "config": {"requests": num_requests, "concurrency": concurrency, "max_tokens": max_tokens},
    }
