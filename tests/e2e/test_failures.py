"""A worker that dies mid-request fails that request fast and clearly; nothing hangs."""

import asyncio
import json
import signal
import time

import aiohttp
import pytest

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.cluster.processes import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"


@pytest.fixture
def cluster(tmp_path):
    # At half the emulated device's speed a 30k-token prompt prefills for about 4 s.
    spec = ClusterSpec(workdir=tmp_path, api_port=free_port(), engine_args=["--emulated-time-scale", "0.5"],
                       decode_args=["--kv-capacity-tokens", "31000"])
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


def process(cluster, name):
    return next(p for p in cluster.processes if p.spec.name == name)


async def test_decode_killed_mid_stream_ends_the_stream_with_an_error(cluster):
    body = {"model": MODEL, "prompt": "a long answer", "max_tokens": 30000, "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{cluster.api_url}/v1/completions", json=body) as response:
            assert response.status == 200
            await response.content.readline()
            process(cluster, "decode-0").signal(signal.SIGKILL)
            killed_at = time.monotonic()
            events = []
            async for line in response.content:
                if line.strip():
                    events.append(line.decode().strip())
        ended_after = time.monotonic() - killed_at
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2][len("data: "):])
        assert "decode-0" in error["error"]["message"]
        assert ended_after < 5, f"the stream took {ended_after:.1f}s to end"

        # With no decode left, new requests are refused at once with Retry-After, not queued.
        async with session.post(f"{cluster.api_url}/v1/completions",
                                json={"model": MODEL, "prompt": "x", "max_tokens": 4}) as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "1"
            assert (await response.json())["error"]["code"] == "no_capacity"


async def test_prefill_killed_mid_job_fails_the_request_fast(cluster):
    body = {"model": MODEL, "prompt": "x" * 30000, "max_tokens": 4}
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(session.post(f"{cluster.api_url}/v1/completions", json=body))
        await asyncio.sleep(0.5)
        process(cluster, "prefill-0").signal(signal.SIGKILL)
        killed_at = time.monotonic()
        response = await asyncio.wait_for(request, 10)
        assert response.status == 502
        assert "prefill-0" in (await response.json())["error"]["message"]
        assert time.monotonic() - killed_at < 5
        response.release()


async def test_request_larger_than_any_decode_instance_gets_400_not_429(cluster):
    # 31,504 tokens fit the model's context (32,768) but not the decode instance's KV room (31,000).
    body = {"model": MODEL, "prompt": "y" * 31500, "max_tokens": 4}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{cluster.api_url}/v1/completions", json=body) as response:
            assert response.status == 400
            error = (await response.json())["error"]
    assert error["code"] == "exceeds_kv_capacity" and "31000" in error["message"]
