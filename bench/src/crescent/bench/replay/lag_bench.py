"""`crescent bench replay-lag`: how late `crescent replay` sends requests when it must send 50 a
second. The Mooncake slice, sped up to a mean of 50 requests/s, is replayed against the
stand-in stream server in its own process, so the lag is the client's own."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from crescent.bench.replay.client import ReplayOptions, replay
from crescent.bench.replay.prompts import PromptShape
from crescent.bench.slo import mean, percentile
from crescent.bench.trace import load_trace
from crescent.common.ports import free_port

RATE_PER_S = 50.0


def _wait_ready(url: str, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def run_replay_lag_bench(trace_path: Path, limit: int, max_output_tokens: int) -> dict:
    trace = load_trace(trace_path, limit)
    span_s = trace[-1].arrival_s or 1.0
    speed = RATE_PER_S * span_s / len(trace)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "crescent.bench.replay.stream_server", "--port", str(port)]
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, 30)
        shape = PromptShape(max_input_tokens=2048, max_output_tokens=max_output_tokens)
        records, wall_s, _ = asyncio.run(
            replay(trace, ReplayOptions(url, model="stand-in", speed=speed, shape=shape))
        )
    finally:
        server.terminate()
        server.wait(10)
    lags_ms = [r.lag_s * 1000 for r in records]
    return {
        "bench": "replay-lag",
        "cases": [
            {
                "case": f"{RATE_PER_S:g}-rps",
                "requests": len(records),
                "ok": sum(r.status == "ok" for r in records),
                "speed": speed,
                "mean_rps": len(records) / wall_s,
                "mean_lag_ms": mean(lags_ms),
                "p50_lag_ms": percentile(lags_ms, 0.5),
                "p99_lag_ms": percentile(lags_ms, 0.99),
                "max_lag_ms": max(lags_ms),
                "wall_s": wall_s,
            }
        ],
    }
