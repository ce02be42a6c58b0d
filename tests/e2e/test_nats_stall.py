"""NATS stalled (the server paused with SIGSTOP) for longer than --token-timeout-s: the conductor
hears no instance at all, so a stream's silence is not its decode's. The streams wait for NATS
instead of moving (a move would find every instance silent too, and with one decode instance
fail the stream), and finish with every token once NATS runs again."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import pytest
from scrape import metric_total
from test_faults import assert_all_correct, prompt, stream

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
TOKEN_TIMEOUT_S = 2.0
STALL_S = 3.0  # past the token timeout, within twice it


@pytest.fixture
def cluster(tmp_path):
    spec = ClusterSpec(
        workdir=tmp_path,
        api_port=free_port(),
        engine_args=["--emulated-time-scale", "1.0"],
        conductor_args=["--token-timeout-s", str(TOKEN_TIMEOUT_S)],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


async def test_streams_wait_out_a_nats_stall_longer_than_the_token_timeout(cluster):
    prompts = [prompt(i) for i in range(4)]
    nats_server = cluster.process("nats")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks = [asyncio.create_task(stream(session, cluster.api_url, p)) for p in prompts]
        await asyncio.sleep(0.6)
        nats_server.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(STALL_S)
        finally:
            nats_server.signal(signal.SIGCONT)
        results = await asyncio.gather(*tasks)
    assert_all_correct(list(zip(prompts, results)))
    assert metric_total(cluster.api_url, "crescent_request_migrations_total") == 0
