"""NATS stalled (the server paused with SIGSTOP) or down (stopped, started again later) under
streams. A stall past --token-timeout-s: the conductor hears no instance at all, so a stream's
silence is not its decode's. The streams wait for NATS instead of moving (a move would find
every instance silent too, and with one decode instance fail the stream), and finish with every
token once NATS runs again. An outage past --start-timeout-s (how long a decode asked to resend
may stay silent) and past what a worker holds for the reconnect: the conductor asks each decode
for what it lacks once NATS is back, the decode keeps generating through it, and nothing moves."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import pytest
from scrape import metric_total
from sse_client import stream
from test_faults import MAX_TOKENS, assert_all_correct, load_while_decoding, prompt

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
TOKEN_TIMEOUT_S = 2.0
STALL_S = 3.0  # past the token timeout, within twice it
START_TIMEOUT_S = 2.0
OUTAGE_S = 5.0  # past the start timeout
RECONNECT_BUFFER_BYTES = 64 << 10  # the decode's chunks fill it within the outage


@pytest.fixture
def cluster(tmp_path):
    spec = ClusterSpec(
        workdir=tmp_path,
        api_port=free_port(),
        engine_args=[
            "--emulated-time-scale",
            "1.0",
            "--nats-reconnect-buffer-bytes",
            str(RECONNECT_BUFFER_BYTES),
        ],
        conductor_args=[
            "--token-timeout-s",
            str(TOKEN_TIMEOUT_S),
            "--start-timeout-s",
            str(START_TIMEOUT_S),
        ],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


async def test_streams_wait_out_a_nats_stall_longer_than_the_token_timeout(cluster):
    prompts = [prompt(i) for i in range(4)]
    nats_server = cluster.process("nats")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks = [
            asyncio.create_task(stream(session, cluster.api_url, p, MAX_TOKENS)) for p in prompts
        ]
        await asyncio.sleep(0.6)
        nats_server.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(STALL_S)
        finally:
            nats_server.signal(signal.SIGCONT)
        results = await asyncio.gather(*tasks)
    assert_all_correct(list(zip(prompts, results)))
    assert metric_total(cluster.api_url, "crescent_request_migrations_total") == 0


async def test_streams_read_on_after_a_nats_outage_longer_than_the_start_timeout(cluster):
    num_streams, max_tokens = 4, 900  # ~9 s of decode: longer than the outage
    prompts = [prompt(i) for i in range(num_streams)]
    nats_server = cluster.process("nats")

    async def outage() -> None:
        await asyncio.to_thread(nats_server.stop)
        await asyncio.sleep(OUTAGE_S)
        nats_server.start()
        await asyncio.to_thread(nats_server.wait_ready, 30)

    results = await load_while_decoding(cluster, prompts, max_tokens, outage, logprobs=5)
    assert_all_correct(results, max_tokens)
    assert cluster.process("decode-0").is_running
    assert metric_total(cluster.api_url, "crescent_request_migrations_total") == 0
    resent = metric_total(cluster.api_url, "crescent_stream_resends_total", outcome="resent")
    assert resent >= num_streams
