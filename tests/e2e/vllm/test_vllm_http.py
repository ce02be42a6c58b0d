"""The real model through the whole stack: `crescent up --engine vllm` topology (store,
conductor with the model's tokenizer, prefill and decode on vLLM), driven over HTTP."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from vllm_helpers import ENV, prompt_tokens, reference_tokens

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.hf_tokenizer import HfTokenizer
from crescent.common.ports import free_port

pytest.importorskip("vllm", reason="needs the vLLM CPU build (make install-vllm)")

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def http_cluster(tmp_path_factory, tiny_model_dir, otlp):
    env = {**ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("vllm-http"),
        api_port=free_port(),
        engine="vllm",
        model_dir=tiny_model_dir,
        env=env,
        store_dram_bytes=64 << 20,
        store_ssd_bytes=64 << 20,
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=300)
    yield cluster
    cluster.stop()


async def test_completions_over_http_equal_plain_vllm(http_cluster, tiny_model_dir, reference):
    tokenizer = HfTokenizer(tiny_model_dir)
    model = tiny_model_dir.name
    prompts = [prompt_tokens(n, seed=40 + n) for n in (60, 300, 900)]
    expected = reference_tokens(reference, prompts, 10)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{http_cluster.api_url}/v1/models") as response:
            assert [m["id"] for m in (await response.json())["data"]] == [model]
        for prompt, want in zip(prompts, expected):
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": 10,
                "ignore_eos": True,
                "temperature": 0,
            }
            async with session.post(
                f"{http_cluster.api_url}/v1/completions", json=body
            ) as response:
                assert response.status == 200, await response.text()
                result = await response.json()
            assert result["choices"][0]["text"] == tokenizer.decode(want)
            assert result["usage"]["completion_tokens"] == 10
        chat = {
            "model": model,
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 5,
            "stream": True,
        }
        async with session.post(
            f"{http_cluster.api_url}/v1/chat/completions", json=chat
        ) as response:
            assert response.status == 200
            lines = [line.decode().strip() async for line in response.content if line.strip()]
        assert lines[-1] == "data: [DONE]" and len(lines) >= 3
        too_long = {"model": model, "prompt": prompt_tokens(9000, seed=1), "max_tokens": 4}
        async with session.post(
            f"{http_cluster.api_url}/v1/completions", json=too_long
        ) as response:
            assert response.status == 400
            assert (await response.json())["error"]["code"] == "context_length_exceeded"


async def test_one_request_is_one_trace_including_the_connectors_kv_spans(
    http_cluster, tiny_model_dir, otlp
):
    body = {"model": tiny_model_dir.name, "prompt": prompt_tokens(700, seed=7), "max_tokens": 4}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{http_cluster.api_url}/v1/completions", json=body) as response:
            assert response.status == 200
            request_id = response.headers["X-Request-Id"]
    expected = {
        "conductor.request",
        "conductor.schedule",
        "prefill.queue",
        "prefill.compute",
        "kv.transfer",
        "decode.queue",
        "decode.load_kv",
        "decode.generate",
    }
    deadline = time.monotonic() + 20
    while {s["name"] for s in otlp.trace_of(request_id)} < expected:
        assert time.monotonic() < deadline, sorted({s["name"] for s in otlp.trace_of(request_id)})
        await asyncio.sleep(0.2)
    spans = {s["name"]: s for s in otlp.trace_of(request_id)}
    # The KV spans come from vLLM's engine core and still hang off the request's trace.
    assert spans["kv.transfer"]["service"] == "crescent-prefill-kv"
    assert spans["decode.load_kv"]["service"] == "crescent-decode-kv"
    assert spans["decode.load_kv"]["attributes"]["crescent.num_loaded"].int_value == 700 // 64
