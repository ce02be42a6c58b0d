"""`crescent bench decode-load`: what a new request's KV load costs the requests a decode
instance is already generating for, with the load inside a step (`sync`, --no-kv-load-async)
and beside the steps (`async`, the default).

Two 1P1D local clusters on the tiny model, the same but for that flag, take turns. In a turn,
`running` streams with short prompts are decoding; once each has streamed a few tokens, one
request with a `length`-token prompt arrives. Its prefill computes the prompt and saves its
blocks to the decode node's store; the decode loads them all before it generates the request's
second token. Measured per system:
  load_gap_ms        the longest gap between two tokens of a running stream that overlaps the
                     arrival's wait between its first and second token (the load and the step
                     after it), median over turns
  running_itl_*      every gap between two tokens of the running streams in the turns
  arrival_ttft_ms    the arrival's first token (its prefill), median over turns
  arrival_second_ms  from the arrival's first token to its second (what the arrival waits for
                     its load), median over turns
`kv_transports` (e.g. tcp) fixes the workers' data-plane transports, as a store on another
host would. Time between two streamed events stands for time between tokens: the conductor may
put several tokens in one event, alike for both systems.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import aiohttp

from crescent.bench.plain_vllm import bench_model
from crescent.bench.prefix_reuse import ENV, SETTLE_S, prompt
from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

SYSTEMS = {"async": [], "sync": ["--no-kv-load-async"]}  # name → the decode's extra flags
RUNNING_PROMPT_TOKENS = 64
RUNNING_MAX_TOKENS = 1500  # outlasts the arrival; cancelled when the turn ends
RUNNING_TOKENS_FIRST = 5  # tokens each running stream has before the arrival is sent
TURN_TIMEOUT_S = 120.0


async def stream(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    token_ids: list[int],
    max_tokens: int,
    arrivals: list[float],
) -> None:
    """Stream a completion, appending to `arrivals` each event's arrival (perf_counter) once
    per token it carries (counted by its logprobs: a token's text may be empty)."""
    body = {
        "model": model,
        "prompt": token_ids,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
    }
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}: {await response.text()}")
        async for line in response.content:
            if line.startswith(b"data: {"):
                choice = json.loads(line[6:])["choices"][0]
                tokens = (choice.get("logprobs") or {}).get("tokens") or []
                arrivals += [time.perf_counter()] * len(tokens)


def gaps(times: list[float]) -> list[tuple[float, float]]:
    """Consecutive pairs of distinct arrivals: tokens of one event are one arrival."""
    return list(itertools.pairwise(sorted(set(times))))


def longest_gap_over(times: list[list[float]], start: float, end: float) -> float:
    """The longest gap between two consecutive events of any stream that overlaps
    [start, end]; 0 when none does."""
    return max(
        (b - a for stream_times in times for a, b in gaps(stream_times) if b > start and a < end),
        default=0.0,
    )


async def turn(
    session: aiohttp.ClientSession, url: str, model: str, length: int, seed: int, running: int
) -> dict[str, object]:
    streams: list[list[float]] = [[] for _ in range(running)]
    tasks = [
        asyncio.create_task(
            stream(
                session,
                url,
                model,
                prompt(RUNNING_PROMPT_TOKENS, f"{seed}/running {i}"),
                RUNNING_MAX_TOKENS,
                streams[i],
            )
        )
        for i in range(running)
    ]
    try:
        deadline = time.monotonic() + TURN_TIMEOUT_S
        while min(len(times) for times in streams) < RUNNING_TOKENS_FIRST:
            for task in tasks:
                if task.done():
                    task.result()  # raises what ended it
                    raise RuntimeError(f"{url}: a running stream ended before the arrival")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url}: running streams slower than {TURN_TIMEOUT_S} s")
            await asyncio.sleep(0.005)
        arrival: list[float] = []
        sent = time.perf_counter()
        await asyncio.wait_for(
            stream(session, url, model, prompt(length, seed), 2, arrival), TURN_TIMEOUT_S
        )
        if len(arrival) < 2:
            raise RuntimeError(f"{url}: the arrival streamed {len(arrival)} of its 2 tokens")
        first, second = arrival[0], arrival[1]
        if any(task.done() for task in tasks):
            raise RuntimeError(f"{url}: a running stream ended before the arrival's second token")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "load_gap_s": longest_gap_over(streams, first, second),
        "running_gaps_s": [b - a for times in streams for a, b in gaps(times)],
        "arrival_ttft_s": first - sent,
        "arrival_second_s": second - first,
    }


async def measure(
    urls: dict[str, str], model: str, length: int, turns: int, running: int
) -> dict[str, list[dict[str, object]]]:
    """Each turn runs on every system, in an order that rotates, SETTLE_S apart."""
    results: dict[str, list[dict[str, object]]] = {name: [] for name in urls}
    timeout = aiohttp.ClientTimeout(total=TURN_TIMEOUT_S * 2)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for name, url in urls.items():  # warm-up: a load and a step of each kind
            await turn(session, url, model, length, 0, running)
        names = list(urls)
        for t in range(turns):
            for name in names[t % len(names) :] + names[: t % len(names)]:
                await asyncio.sleep(SETTLE_S)
                results[name].append(await turn(session, urls[name], model, length, t + 1, running))
    return results


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def summarise(turns: list[dict[str, object]]) -> dict[str, float]:
    running_gaps = sorted(gap for t in turns for gap in t["running_gaps_s"])
    p99 = running_gaps[min(len(running_gaps) - 1, len(running_gaps) * 99 // 100)]
    return {
        "load_gap_ms": _ms(statistics.median(t["load_gap_s"] for t in turns)),
        "running_itl_p50_ms": _ms(statistics.median(running_gaps)),
        "running_itl_p99_ms": _ms(p99),
        "arrival_ttft_ms": _ms(statistics.median(t["arrival_ttft_s"] for t in turns)),
        "arrival_second_ms": _ms(statistics.median(t["arrival_second_s"] for t in turns)),
    }


def run_decode_load_bench(
    model_dir: Path | None = None,
    length: int = 8000,
    turns: int = 5,
    running: int = 2,
    kv_transports: str = "",
) -> dict:
    with tempfile.TemporaryDirectory(prefix="crescent-decode-load-") as tmp, ExitStack() as up:
        workdir = Path(tmp)
        model_dir = bench_model(model_dir, workdir)
        urls = {}
        for name, decode_args in SYSTEMS.items():
            cluster = LocalCluster(
                ClusterSpec(
                    workdir=workdir / name,
                    api_port=free_port(),
                    engine="vllm",
                    model_dir=model_dir,
                    env=ENV,
                    decode_args=decode_args,
                    engine_args=["--kv-transports", kv_transports] if kv_transports else [],
                )
            )
            cluster.start(timeout_s=300)
            up.callback(cluster.stop)
            urls[name] = cluster.api_url
        results = asyncio.run(measure(urls, model_dir.name, length, turns, running))
    summaries = {name: summarise(by_turn) for name, by_turn in results.items()}
    return {
        "bench": "decode-load",
        "cases": [{"case": f"{name}-{length}", **summary} for name, summary in summaries.items()],
        "ratios": [
            {
                "case": f"async/sync-{length}-{measure}",
                "ratio": round(summaries["async"][measure] / summaries["sync"][measure], 2),
            }
            for measure in ("load_gap_ms", "running_itl_p99_ms", "arrival_second_ms")
        ],
        "config": {
            "model": str(model_dir),
            "length": length,
            "turns": turns,
            "running": running,
            "kv_transports": kv_transports or "every one that runs here",
            "order": "interleaved: each turn on every system, rotating",
            "cpu_threads": os.cpu_count(),
        },
    }
