"""A decode instance paused mid-stream (SIGSTOP, then SIGCONT) finishes the stream, and what
the conductor learns of its step time leaves the pause out: learnt as steps, the pause would
price the instance several times too slow for the requests after it.

Paused past its lease, a decode or prefill instance leaves the registry and the conductor
takes it for gone. With no other instance of its role to move its requests to, they wait for
it (--rejoin-wait-s) and read on from it when the same process comes back: a decode's streams
ask for the chunks it sent meanwhile, a prefill's jobs for their results. Nothing fails,
nothing is computed again."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import pytest
from scrape import metric_total
from test_faults import assert_all_correct, load_while_decoding, load_with_fault, prompt

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
MAX_TOKENS = 200
TELEMETRY_PERIOD_S = 0.2  # stale after 0.6 s without telemetry
PAUSE_S = 4.0
LEASE_TTL_S = 2
PAUSE_PAST_LEASE_S = 6.0  # three lease TTLs: the registry drops the instance


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("pause"),
        api_port=free_port(),
        engine_args=["--telemetry-period-s", str(TELEMETRY_PERIOD_S)],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def short_lease_cluster(tmp_path_factory):
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("pause-past-lease"),
        api_port=free_port(),
        engine_args=["--emulated-time-scale", "1.0"],
        env={"CRESCENT_LEASE_TTL_S": str(LEASE_TTL_S)},
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


def paused(process, pause_s: float):
    """A fault that pauses `process` (SIGSTOP) for `pause_s`, then lets it run on."""

    async def pause() -> None:
        process.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(pause_s)
        finally:
            process.signal(signal.SIGCONT)

    return pause


async def _decode_ratio(session: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    """The decode instance's learned step-time ratio and how many samples it rests on."""
    async with session.get(f"{url}/v1/cluster") as answer:
        state = await answer.json()
    [decode] = [i for i in state["instances"] if i["role"] == "decode"]
    pricing = decode["pricing"]
    return pricing["ratios"]["decode"], pricing["num_samples"].get("decode", 0)


async def _stream(session: aiohttp.ClientSession, url: str, pause=None) -> int:
    """Stream one completion; `pause` is called once, after the tenth chunk."""
    body = {"model": MODEL, "prompt": "pause me", "max_tokens": MAX_TOKENS, "stream": True}
    num_chunks = 0
    async with session.post(f"{url}/v1/completions", json=body) as answer:
        assert answer.status == 200
        async for line in answer.content:
            if line.startswith(b"data: {"):
                num_chunks += 1
                if num_chunks == 10 and pause is not None:
                    await pause()
    return num_chunks


async def test_a_paused_decode_is_not_learnt_as_slow(cluster):
    pause = paused(cluster.process("decode-0"), PAUSE_S)
    url = cluster.api_url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        assert await _stream(session, url) > 10
        before, num_before = await _decode_ratio(session, url)
        assert num_before == 1
        assert await _stream(session, url, pause) > 10
        after, num_after = await _decode_ratio(session, url)
    assert num_after == 2  # the paused stream was sampled: its steps around the pause
    # The median of two samples is their mean: a pause of 4 s over ~2 s of steps would make it
    # about three times the first.
    assert after < 1.5 * before, (before, after)


async def test_streams_read_on_from_a_decode_paused_past_its_lease(short_lease_cluster):
    cluster = short_lease_cluster
    num_streams, max_tokens = 4, 900  # ~9 s of decode: longer than the pause
    pause = paused(cluster.process("decode-0"), PAUSE_PAST_LEASE_S)
    prompts = [prompt(i) for i in range(num_streams)]
    results = await load_while_decoding(cluster, prompts, max_tokens, pause)
    assert_all_correct(results, max_tokens)
    assert "instance gone" in cluster.process("conductor-0").log_tail(400)
    assert metric_total(cluster.api_url, "crescent_rejoins_total", role="decode") == num_streams


async def test_prompts_wait_for_a_prefill_paused_past_its_lease(short_lease_cluster):
    cluster = short_lease_cluster
    max_tokens = 20
    # ~0.8 s of emulated prefill each: the pause finds one computing and the others queued
    prompts = [f"prefill paused {i} at {time.monotonic_ns()}: " + "x" * 6000 for i in range(4)]
    pause = paused(cluster.process("prefill-0"), PAUSE_PAST_LEASE_S)
    results = await load_with_fault(cluster, pause, prompts, max_tokens)
    assert_all_correct(results, max_tokens)
    assert metric_total(cluster.api_url, "crescent_rejoins_total", role="prefill") >= 1
