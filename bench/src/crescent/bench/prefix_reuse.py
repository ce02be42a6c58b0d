"""`crescent bench prefix-reuse`: what a cached prefix saves on TTFT, Crescent against vLLM.

For prompts of 1k–8k tokens (the tiny model's context is 8k), TTFT with nothing cached and with
90 % of the prompt cached, measured side by side in one run on:
  crescent           1P1D local cluster (conductor, store, vLLM prefill + decode with CrescentConnector)
  crescent-store     the same with vLLM's own prefix cache off in the workers, so every cached
                     token is loaded from the store through the connector
  vllm               one plain vLLM OpenAI server, its prefix cache off
  vllm-prefix-cache  the same server with its prefix cache on
"90 % cached" means a request sharing that prefix ran just before; TTFT is from sending the
request to the first streamed token, the median of `repeat` fresh prompts.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from crescent.bench.plain_vllm import vllm_server_argv
from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.cluster.processes import ManagedProcess, ProcessSpec, free_port

LENGTHS = (1024, 2048, 4096, 8000)
CACHED_SHARES = (0, 90)
ENV = {
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VLLM_CPU_KVCACHE_SPACE": "2",
}


def prompt(length: int, seed: int) -> list[int]:
    """Token ids inside the tiny vocabulary, away from its special tokens."""
    return [3 + (i * 7919 + seed * 104729) % 1000 for i in range(length)]


async def ttft_s(
    session: aiohttp.ClientSession, url: str, model: str, token_ids: list[int]
) -> float:
    body = {"model": model, "prompt": token_ids, "max_tokens": 2, "stream": True, "temperature": 0}
    started = time.perf_counter()
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}: {await response.text()}")
        async for line in response.content:
            if line.startswith(b"data: {"):
                first = time.perf_counter() - started
                break
        await response.read()
    return first


async def measure(
    url: str, model: str, lengths: tuple[int, ...], repeat: int, seed_base: int
) -> dict[tuple[int, int], float]:
    results = {}
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await ttft_s(session, url, model, prompt(64, seed_base))  # warm-up
        for length in lengths:
            for share in CACHED_SHARES:
                samples = []
                for r in range(repeat):
                    seed = seed_base + length * 10 + share * 1000 + r
                    tokens = prompt(length, seed)
                    if share:
                        cut = length * share // 100
                        await ttft_s(
                            session, url, model, tokens[:cut] + prompt(length - cut, seed + 7)
                        )
                    samples.append(await ttft_s(session, url, model, tokens))
                results[(length, share)] = statistics.median(samples)
    return results


def _crescent(
    model_dir: Path, workdir: Path, lengths: tuple[int, ...], repeat: int, engine_args: list[str]
) -> dict:
    spec = ClusterSpec(
        workdir=workdir,
        api_port=free_port(),
        engine="vllm",
        model_dir=model_dir,
        env=ENV,
        store_dram_bytes=256 << 20,
        store_ssd_bytes=256 << 20,
        engine_args=engine_args,
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=300)
    try:
        return asyncio.run(measure(cluster.api_url, model_dir.name, lengths, repeat, 1))
    finally:
        cluster.stop()


def _plain_vllm(
    model_dir: Path, workdir: Path, lengths: tuple[int, ...], repeat: int, prefix_cache: bool
) -> dict:
    port = free_port()
    argv = vllm_server_argv(
        model_dir, port, "--enable-prefix-caching" if prefix_cache else "--no-enable-prefix-caching"
    )
    server = ManagedProcess(
        ProcessSpec(
            name=f"vllm-{'pc' if prefix_cache else 'plain'}", argv=argv, env=ENV, port=port
        ),
        workdir / "logs",
    )
    server.start()
    try:
        server.wait_ready(300)
        return asyncio.run(measure(f"http://127.0.0.1:{port}", model_dir.name, lengths, repeat, 2))
    finally:
        server.stop()


def run_prefix_reuse_bench(
    model_dir: Path | None = None, repeat: int = 3, lengths: tuple[int, ...] = LENGTHS
) -> dict:
    with tempfile.TemporaryDirectory(prefix="crescent-prefix-") as tmp:
        workdir = Path(tmp)
        if model_dir is None:
            from crescent.engine.tiny_model import build_tiny_model

            model_dir = build_tiny_model(workdir / "tiny-llama")
        systems = {
            "crescent": _crescent(model_dir, workdir / "crescent", lengths, repeat, []),
            "crescent-store": _crescent(
                model_dir, workdir / "crescent-store", lengths, repeat, ["--no-vllm-prefix-caching"]
            ),
            "vllm": _plain_vllm(model_dir, workdir, lengths, repeat, prefix_cache=False),
            "vllm-prefix-cache": _plain_vllm(
                model_dir, workdir, lengths, repeat, prefix_cache=True
            ),
        }
    cases = [
        {"case": f"{system}-{length}-{share}", "ttft_ms": round(results[(length, share)] * 1000, 2)}
        for system, results in systems.items()
        for length in lengths
        for share in CACHED_SHARES
    ]
    return {
        "bench": "prefix-reuse",
        "cases": cases,
        "config": {
            "model": str(model_dir),
            "repeat": repeat,
            "statistic": "median",
            "cpu_threads": os.cpu_count(),
        },
    }
