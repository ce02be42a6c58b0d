"""A stream that stays silent past --token-timeout-s while its decode instance still counts as
live (here paused with SIGSTOP for longer than that) goes on on another decode instance: the
client gets the whole answer, the same tokens, not an error."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import pytest
from sse_client import stream
from test_faults import MAX_TOKENS, assert_all_correct, prompt, watch_decode_starts

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path):
    spec = ClusterSpec(
        workdir=tmp_path,
        api_port=free_port(),
        num_decode=2,
        engine_args=["--emulated-time-scale", "1.0"],
        conductor_args=["--token-timeout-s", "1.0"],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


async def test_a_stream_silent_past_the_token_timeout_goes_on_elsewhere(cluster):
    watcher, starts = await watch_decode_starts(cluster)
    prompts = [prompt(i) for i in range(6)]
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            tasks = [
                asyncio.create_task(stream(session, cluster.api_url, p, MAX_TOKENS))
                for p in prompts
            ]
            await asyncio.sleep(0.6)
            paused = cluster.process(max(starts, key=starts.__getitem__))
            paused.signal(signal.SIGSTOP)
            await asyncio.sleep(3.0)
            paused.signal(signal.SIGCONT)
            results = await asyncio.gather(*tasks)
    finally:
        await watcher.close()
    assert_all_correct(list(zip(prompts, results)))
