"""Decode killed mid-stream on the real model: the stream moves to the other decode instance,
which recomputes the prompt and the tokens already streamed, and goes on; under greedy
sampling the client gets exactly plain vLLM's tokens. The worker process alone is killed, as
the OOM killer does: vLLM's engine core, its child, must not outlive it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import aiohttp
import pytest
from vllm_helpers import ENV, prompt_tokens, reference_tokens

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytest.importorskip("vllm", reason="needs the vLLM CPU build (make install-vllm)")

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(900)]
MAX_TOKENS = 300


@pytest.fixture(scope="module")
def two_decode_cluster(tmp_path_factory, tiny_model_dir):
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("vllm-migration"),
        api_port=free_port(),
        engine="vllm",
        model_dir=tiny_model_dir,
        env=ENV,
        num_decode=2,
        store_dram_bytes=64 << 20,
        store_ssd_bytes=64 << 20,
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=300)
    yield cluster
    cluster.stop()


async def busy_decode(session: aiohttp.ClientSession, url: str) -> str:
    for _ in range(50):
        async with session.get(f"{url}/v1/cluster") as response:
            instances = (await response.json())["instances"]
        running = [
            i["instance_id"]
            for i in instances
            if i["role"] == "decode" and i["load"] and i["load"]["num_running"] > 0
        ]
        if running:
            return running[0]
        await asyncio.sleep(0.05)
    raise AssertionError("no decode instance reports the request running")


async def test_decode_killed_mid_stream_goes_on_elsewhere_with_plain_vllms_tokens(
    two_decode_cluster, tiny_model_dir, reference
):
    prompt = prompt_tokens(700, seed=77)
    [want] = reference_tokens(reference, [prompt], MAX_TOKENS)
    body = {
        "model": tiny_model_dir.name,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    url = two_decode_cluster.api_url
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/completions", json=body) as response:
            assert response.status == 200, await response.text()
            pieces = []
            killed = ""
            async for line in response.content:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                assert "error" not in event, event
                pieces.append(event["choices"][0]["text"])
                if len(pieces) == 5 and not killed:
                    killed = await busy_decode(session, url)
                    worker = two_decode_cluster.process(killed)
                    os.kill(worker.popen.pid, signal.SIGKILL)
        async with session.get(f"{url}/metrics") as response:
            metrics = await response.text()
    from crescent.common.hf_tokenizer import HfTokenizer

    assert "".join(pieces) == HfTokenizer(tiny_model_dir).decode(want)
    assert (
        'crescent_request_migrations_total{cause="InstanceLostError",stage="decode"} 1.0' in metrics
    )
    worker.popen.wait(5)  # reaped: a zombie still counts in its group
    await process_group_gone(worker.popen.pid, 30)


async def process_group_gone(group: int, timeout_s: float) -> None:
    """Every process of `group` (a worker's session: it, its engine core and vLLM's resource
    tracker) has exited."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"a process of group {group} outlived its worker"
        await asyncio.sleep(0.2)
