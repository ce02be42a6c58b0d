"""SIGTERM to a prefill and a decode instance that hold requests: both finish what they hold
before they leave (nothing is moved to another instance, nothing fails), take no new work
meanwhile, and exit 0."""

import asyncio
import json
import re
import urllib.request

import aiohttp
import pytest
from expected import expected_text

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"


@pytest.fixture
def cluster(tmp_path):
    # A 12k-token prompt prefills for over a second and a 400-token answer decodes for a few
    # seconds on the emulated device: long enough to SIGTERM instances mid-request.
    spec = ClusterSpec(
        workdir=tmp_path,
        api_port=free_port(),
        num_prefill=2,
        num_decode=2,
        engine_args=["--emulated-time-scale", "1"],
        log_format="text",
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


def cluster_view(cluster) -> dict:
    with urllib.request.urlopen(f"{cluster.api_url}/v1/cluster", timeout=5) as response:
        return json.load(response)


def migrations(cluster) -> float:
    with urllib.request.urlopen(f"{cluster.api_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(v)
        for v in re.findall(r"^crescent_request_migrations_total\{.*\} (\S+)$", text, re.MULTILINE)
    )


async def busy(cluster, role: str, field: str, at_least: int = 1, timeout_s: float = 20) -> str:
    """The first instance of `role` the conductor sees holding work, once the instances of
    that role report `at_least` of it together."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        view = await asyncio.to_thread(cluster_view, cluster)
        loads = {
            instance["instance_id"]: instance["load"][field]
            for instance in view["instances"]
            if instance["role"] == role and instance["load"]
        }
        if sum(loads.values()) >= at_least:
            return next(instance_id for instance_id, held in loads.items() if held > 0)
        assert asyncio.get_running_loop().time() < deadline, f"no {role} instance got work: {view}"
        await asyncio.sleep(0.05)


async def complete(session, api_url: str, prompt: str, max_tokens: int) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
    async with session.post(f"{api_url}/v1/completions", json=body) as response:
        answer = await response.json()
        assert response.status == 200, answer
        return answer["choices"][0]["text"]


async def test_draining_instances_finish_their_requests_in_place(cluster):
    long_prompts = [f"{i} " + "x" * 12000 for i in range(4)]
    long_answers = [f"answer {i}" for i in range(6)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        tasks = [
            asyncio.create_task(complete(session, cluster.api_url, p, 400)) for p in long_answers
        ]
        decode = cluster.process(await busy(cluster, "decode", "num_running"))
        tasks += [
            asyncio.create_task(complete(session, cluster.api_url, p, 1)) for p in long_prompts
        ]
        # Every long prompt placed before the SIGTERM: one placed after it could go to the
        # draining instance before its telemetry says so, and be moved.
        prefill = cluster.process(
            await busy(cluster, "prefill", "num_queued", at_least=len(long_prompts))
        )
        codes = asyncio.gather(asyncio.to_thread(prefill.stop), asyncio.to_thread(decode.stop))
        texts = await asyncio.gather(*tasks)
        assert await codes == [0, 0]
    assert texts[: len(long_answers)] == [expected_text(p, 400) for p in long_answers]
    assert all(len(text) == 1 for text in texts[len(long_answers) :])
    assert migrations(cluster) == 0, "a draining instance's request was moved instead of finished"
    assert "draining" in prefill.log_tail(200) and "draining" in decode.log_tail(200)


@pytest.fixture
def short_drain_cluster(tmp_path):
    spec = ClusterSpec(
        workdir=tmp_path,
        api_port=free_port(),
        num_decode=2,
        log_format="text",
        engine_args=["--emulated-time-scale", "1"],
        decode_args=["--drain-timeout-s", "1"],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


async def test_a_request_left_at_the_drain_deadline_goes_on_elsewhere(short_drain_cluster):
    cluster = short_drain_cluster
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        task = asyncio.create_task(complete(session, cluster.api_url, "a long answer", 1500))
        decode = cluster.process(await busy(cluster, "decode", "num_running"))
        assert await asyncio.to_thread(decode.stop) == 0
        assert await task == expected_text("a long answer", 1500)
    assert migrations(cluster) == 1
    assert "handing requests back" in decode.log_tail(200)


async def test_a_draining_conductor_finishes_its_streams_and_refuses_new_requests(cluster):
    answers = [f"stream {i}" for i in range(4)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        tasks = [asyncio.create_task(complete(session, cluster.api_url, p, 400)) for p in answers]
        await busy(cluster, "decode", "num_running", at_least=len(answers))
        conductor = cluster.process("conductor-0")
        code = asyncio.create_task(asyncio.to_thread(conductor.stop))
        await asyncio.sleep(0.3)  # the signal is handled: the conductor drains
        body = {"model": MODEL, "prompt": "late", "max_tokens": 4}
        async with session.post(f"{cluster.api_url}/v1/completions", json=body) as late:
            assert late.status == 503, await late.text()
            assert (await late.json())["error"]["code"] == "draining"
        async with session.get(f"{cluster.api_url}/ready") as ready:
            assert ready.status == 503
        assert await asyncio.gather(*tasks) == [expected_text(p, 400) for p in answers]
        assert await code == 0
    assert "draining" in conductor.log_tail(200)
