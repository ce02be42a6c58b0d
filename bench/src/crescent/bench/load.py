"""A closed-loop HTTP load generator: `concurrency` clients each send their next request as
soon as the previous one is answered, until `num_requests` are done."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import aiohttp
import numpy as np


@dataclass
class LoadResult:
    num_requests: int
    num_errors: int
    seconds: float
    latencies_s: list[float]

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.seconds

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1000)


async def run_load(
    url: str, body: dict, num_requests: int, concurrency: int, timeout_s: float = 30
) -> LoadResult:
    latencies: list[float] = []
    errors = 0
    remaining = num_requests

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal remaining, errors
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            async with session.post(url, json=body) as response:
                await response.read()
                if response.status != 200:
                    errors += 1
            latencies.append(time.perf_counter() - started)

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)
    ) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return LoadResult(num_requests, errors, seconds, latencies)


async def run_turns(
    urls: list[str], body: dict, num_each: int, timeout_s: float = 30
) -> list[LoadResult]:
    """One request at a time, the targets taking turns (the order reversed every round), so
    that a change in the machine's load falls on each of them alike; one result per url."""
    latencies: list[list[float]] = [[] for _ in urls]
    errors = [0] * len(urls)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with contextlib.AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(
                aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=1))
            )
            for _ in urls
        ]
        for round_number in range(num_each):
            order = list(range(len(urls)))
            for k in order if round_number % 2 == 0 else order[::-1]:
                started = time.perf_counter()
                async with sessions[k].post(urls[k], json=body) as response:
                    await response.read()
                    if response.status != 200:
                        errors[k] += 1
                latencies[k].append(time.perf_counter() - started)
    return [
        LoadResult(num_each, errors[k], sum(latencies[k]), latencies[k]) for k in range(len(urls))
    ]
