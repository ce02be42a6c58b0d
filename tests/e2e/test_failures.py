"""The only worker of a role dies mid-request: the request waits for it to come back (as the
supervisor of `crescent up` brings it back) and completes; with no instance of a role left
registered, new requests are refused at once; nothing hangs."""

import asyncio
import json
import signal
import time

import aiohttp
import pytest
from expected import expected_text
from scrape import metric, metric_total

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"


def start_cluster(tmp_path, *conductor_args: str) -> LocalCluster:
    # At half the emulated device's speed a 30k-token prompt prefills for about 4 s.
    spec = ClusterSpec(
        workdir=tmp_path,
        api_port=free_port(),
        engine_args=["--emulated-time-scale", "0.5"],
        decode_args=["--kv-capacity-tokens", "31000"],
        conductor_args=["--placement-wait-s", "60", *conductor_args],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    return cluster


@pytest.fixture
def cluster(tmp_path):
    cluster = start_cluster(tmp_path)
    yield cluster
    cluster.stop()


@pytest.fixture
def local_prefill_cluster(tmp_path):
    """Conditional disaggregation on for every prompt of the tests: the decode computes it."""
    cluster = start_cluster(tmp_path, "--local-prefill", "40000")
    yield cluster
    cluster.stop()


def process(cluster, name):
    return next(p for p in cluster.processes if p.spec.name == name)


async def read_stream(response) -> str:
    pieces = []
    async for line in response.content:
        line = line.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            event = json.loads(line[6:])
            assert "error" not in event, event
            pieces.append(event["choices"][0]["text"])
    return "".join(pieces)


async def test_only_decode_killed_mid_stream_and_restarted_the_stream_goes_on(cluster):
    body = {"model": MODEL, "prompt": "a long answer", "max_tokens": 400, "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{cluster.api_url}/v1/completions", json=body) as response:
            assert response.status == 200
            first = await response.content.readline()
            process(cluster, "decode-0").signal(signal.SIGKILL)
            await asyncio.sleep(1.0)
            process(cluster, "decode-0").start()
            rest = await read_stream(response)
    text = json.loads(first.decode()[len("data: ") :])["choices"][0]["text"] + rest
    assert text == expected_text("a long answer", 400)


async def complete_across_a_kill(cluster, name: str, prompt: str) -> None:
    """A 4-token completion of `prompt` (30k tokens: about 4 s of prefill) while the worker
    `name` is killed 0.5 s in and restarted 1 s later: it answers what an undisturbed cluster
    would."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(session.post(f"{cluster.api_url}/v1/completions", json=body))
        await asyncio.sleep(0.5)
        process(cluster, name).signal(signal.SIGKILL)
        await asyncio.sleep(1.0)
        process(cluster, name).start()
        response = await asyncio.wait_for(request, 40)
        assert response.status == 200, await response.text()
        assert (await response.json())["choices"][0]["text"] == expected_text(prompt, 4)


async def test_only_prefill_killed_mid_job_and_restarted_the_request_completes(cluster):
    await complete_across_a_kill(cluster, "prefill-0", "x" * 30000)


async def test_only_decode_killed_while_computing_a_prompt_and_restarted_the_request_completes(
    local_prefill_cluster,
):
    cluster = local_prefill_cluster
    await complete_across_a_kill(cluster, "decode-0", "y" * 30000)
    # placed once, on decode (no prefill job), then moved to the restarted decode
    assert metric(cluster.api_url, "crescent_prefill_on_decode_total") == 1
    migrations = metric_total(cluster.api_url, "crescent_request_migrations_total", stage="decode")
    assert migrations >= 1


async def test_with_no_decode_registered_new_requests_get_503_at_once(cluster):
    process(cluster, "decode-0").signal(signal.SIGKILL)
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # until its lease has ended
            async with session.get(f"{cluster.api_url}/v1/cluster") as response:
                roles = [i["role"] for i in (await response.json())["instances"]]
            if "decode" not in roles:
                break
            await asyncio.sleep(0.2)
        asked_at = time.monotonic()
        async with session.post(
            f"{cluster.api_url}/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 4},
        ) as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "1"
            assert (await response.json())["error"]["code"] == "no_capacity"
        assert time.monotonic() - asked_at < 2


async def test_request_larger_than_any_decode_instance_gets_400_not_429(cluster):
    # 31,504 tokens fit the model's context (32,768) but not the decode instance's KV room (31,000).
    body = {"model": MODEL, "prompt": "y" * 31500, "max_tokens": 4}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{cluster.api_url}/v1/completions", json=body) as response:
            assert response.status == 400
            error = (await response.json())["error"]
    assert error["code"] == "exceeds_kv_capacity" and "31000" in error["message"]
