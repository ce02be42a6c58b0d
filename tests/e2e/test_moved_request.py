"""A request whose decode instance dies mid-answer moves to another one, which takes it on KV
room alone: the predicted TBT, over the SLO there, must not fail an answer already under way."""

import asyncio
import json
import signal
import time

import aiohttp
import pytest
from expected import expected_text
from test_failures import read_stream

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.bus import Bus
from crescent.common.codec import encode
from crescent.common.errors import NoRespondersError, RequestTimeoutError
from crescent.common.etcd import connect_etcd
from crescent.common.messages import ClusterConfig, InstanceLoad, Reservation, ReservationReply
from crescent.common.naming import Keys, Subjects
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
PROMPT = "a long answer"


@pytest.fixture
def cluster(tmp_path):
    spec = ClusterSpec(
        workdir=tmp_path,
        api_port=free_port(),
        num_decode=2,
        engine_args=["--emulated-time-scale", "0.5"],
        conductor_args=["--placement-wait-s", "10"],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


async def decode_running_a_request(bus: Bus, cluster: str, timeout_s: float) -> str:
    found: asyncio.Queue[InstanceLoad] = asyncio.Queue()
    for instance_id in ("decode-0", "decode-1"):
        await bus.subscribe(
            Subjects(cluster).telemetry("decode", instance_id), InstanceLoad, found.put_nowait
        )
    deadline = time.monotonic() + timeout_s
    while True:
        load = await asyncio.wait_for(found.get(), max(0.01, deadline - time.monotonic()))
        if load.num_running:
            return load.instance_id


async def tighten_tbt_slo(cluster: LocalCluster, decode_id: str, timeout_s: float) -> None:
    """A TBT SLO no step meets, in the cluster config; returns once `decode_id` refuses a new
    one-token request for it."""
    etcd = await connect_etcd(cluster.etcd_url)
    try:
        config = ClusterConfig(block_size=512, ttft_slo_s=30.0, tbt_slo_s=1e-6)
        await etcd.put(Keys(cluster.spec.cluster).config().encode(), encode(config))
    finally:
        await etcd.close()
    bus = await Bus.connect(cluster.nats_url, "test-probe")
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            probe = Reservation(
                request_id=f"probe-{time.monotonic_ns()}",
                num_prompt_tokens=1,
                max_tokens=1,
                ttl_s=1.0,
            )
            try:
                reply = await bus.request(
                    Subjects(cluster.spec.cluster).decode_reserve(decode_id),
                    probe,
                    ReservationReply,
                    2,
                )
                if not reply.accepted and "TBT" in reply.reason:
                    return
            except (NoRespondersError, RequestTimeoutError):
                pass
            assert time.monotonic() < deadline, f"{decode_id} never applied the TBT SLO"
            await asyncio.sleep(0.05)
    finally:
        await bus.drain()


async def test_a_stream_moved_off_a_killed_decode_goes_on_past_a_tbt_it_would_refuse(cluster):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 400, "stream": True}
    bus = await Bus.connect(cluster.nats_url, "test-telemetry")
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{cluster.api_url}/v1/completions", json=body) as response:
                assert response.status == 200
                first = await response.content.readline()
                running = await decode_running_a_request(bus, cluster.spec.cluster, 10)
                other = "decode-1" if running == "decode-0" else "decode-0"
                await tighten_tbt_slo(cluster, other, 10)
                cluster.process(running).signal(signal.SIGKILL)
                rest = await read_stream(response)
    finally:
        await bus.drain()
    text = json.loads(first.decode()[len("data: ") :])["choices"][0]["text"] + rest
    assert text == expected_text(PROMPT, 400)
