"""A decode instance paused mid-stream (SIGSTOP, then SIGCONT) finishes the stream, and what
the conductor learns of its step time leaves the pause out: learnt as steps, the pause would
price the instance several times too slow for the requests after it."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import pytest

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
MAX_TOKENS = 200
TELEMETRY_PERIOD_S = 0.2  # stale after 0.6 s without telemetry
PAUSE_S = 4.0


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
    decode = cluster.process("decode-0")

    async def pause() -> None:
        decode.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(PAUSE_S)
        finally:
            decode.signal(signal.SIGCONT)

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
