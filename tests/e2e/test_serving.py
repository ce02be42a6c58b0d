"""The dev cluster serves the OpenAI API end to end, with one trace per request."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from expected import expected_text

from crescent.common.codec import decode
from crescent.common.etcd import connect_etcd
from crescent.common.messages import InstanceInfo
from crescent.common.naming import Keys

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"


async def stream_completion(session, url, prompt, max_tokens):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/event-stream")
        pieces, finish, done = [], None, False
        async for line in response.content:
            line = line.decode().strip()
            if not line:
                continue
            assert line.startswith("data: ")
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            pieces.append(event["choices"][0]["text"])
            finish = event["choices"][0]["finish_reason"] or finish
        assert done
        return "".join(pieces), finish


async def test_twenty_concurrent_streaming_completions(dev_cluster):
    prompts = [f"request {i}: " + "tell me about KV caches " * (i + 1) for i in range(20)]
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(
            *(
                stream_completion(session, dev_cluster.api_url, p, 8 + i)
                for i, p in enumerate(prompts)
            )
        )
    for i, (prompt, (text, finish)) in enumerate(zip(prompts, results)):
        assert text == expected_text(prompt, 8 + i)
        assert finish == "length"


async def test_non_streaming_completion_and_chat(dev_cluster):
    async with aiohttp.ClientSession() as session:
        body = {"model": MODEL, "prompt": [72, 105, 33], "max_tokens": 5}
        async with session.post(f"{dev_cluster.api_url}/v1/completions", json=body) as response:
            assert response.status == 200
            result = await response.json()
        assert result["choices"][0]["text"] == expected_text("Hi!", 5)
        assert result["usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 5,
            "total_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 0},
        }

        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        async with session.post(
            f"{dev_cluster.api_url}/v1/chat/completions", json=chat
        ) as response:
            assert response.status == 200
            result = await response.json()
        assert result["object"] == "chat.completion"
        assert result["choices"][0]["message"]["role"] == "assistant"
        assert len(result["choices"][0]["message"]["content"]) == 4

        async with session.get(f"{dev_cluster.api_url}/v1/models") as response:
            models = await response.json()
        assert [m["id"] for m in models["data"]] == [MODEL]


async def test_stop_string_ends_the_stream_early(dev_cluster):
    full = expected_text("stop test", 30)
    stop = full[10:13]
    async with aiohttp.ClientSession() as session:
        body = {"model": MODEL, "prompt": "stop test", "max_tokens": 30, "stop": stop}
        async with session.post(f"{dev_cluster.api_url}/v1/completions", json=body) as response:
            result = await response.json()
    assert result["choices"][0]["text"] == full[: full.index(stop)]
    assert result["choices"][0]["finish_reason"] == "stop"


async def test_one_request_is_one_trace_with_a_span_per_hop(dev_cluster, otlp):
    async with aiohttp.ClientSession() as session:
        body = {"model": MODEL, "prompt": "trace me", "max_tokens": 4}
        async with session.post(f"{dev_cluster.api_url}/v1/completions", json=body) as response:
            request_id = (await response.json())["id"]
    expected = {
        "conductor.request",
        "conductor.schedule",
        "prefill.queue",
        "prefill.compute",
        "decode.queue",
        "decode.generate",
    }
    deadline = time.monotonic() + 10
    while {s["name"] for s in otlp.trace_of(request_id)} < expected:
        assert time.monotonic() < deadline, (
            f"spans so far: {[s['name'] for s in otlp.trace_of(request_id)]}"
        )
        await asyncio.sleep(0.1)
    spans = {s["name"]: s for s in otlp.trace_of(request_id)}
    root = spans["conductor.request"]
    assert root["parent_id"] == ""
    for name in expected - {"conductor.request"}:
        assert spans[name]["parent_id"] == root["span_id"], (
            f"{name} is not a child of conductor.request"
        )
    assert spans["prefill.compute"]["service"] == "crescent-prefill"
    assert spans["decode.generate"]["service"] == "crescent-decode"
    assert spans["prefill.queue"]["end"] <= spans["prefill.compute"]["start"]
    assert spans["prefill.compute"]["end"] <= spans["decode.generate"]["start"]


async def test_cluster_view_reports_instances_and_measured_latencies(dev_cluster):
    async with aiohttp.ClientSession() as session:
        body = {"model": MODEL, "prompt": "measure me", "max_tokens": 8}
        async with session.post(f"{dev_cluster.api_url}/v1/completions", json=body) as response:
            assert response.status == 200
        deadline = time.monotonic() + 5
        while True:
            async with session.get(f"{dev_cluster.api_url}/v1/cluster") as response:
                view = await response.json()
            loads = {i["role"]: i["load"] for i in view["instances"] if i["load"]}
            if loads["prefill"]["recent_ttft_s"] > 0 and loads["decode"]["recent_tbt_s"] > 0:
                break
            assert time.monotonic() < deadline, loads
            await asyncio.sleep(0.1)
    assert {i["role"] for i in view["instances"]} == {"conductor", "prefill", "decode", "store"}
    assert all(i["is_live"] for i in view["instances"])
    assert view["policy"] == "kv-centric" and view["models"][MODEL]["pd_imbalance_factor"] > 0


async def test_metrics_and_health(dev_cluster):
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{dev_cluster.api_url}/metrics") as response:
            text = await response.text()
        async with session.get(f"{dev_cluster.api_url}/health") as response:
            health = await response.json()
    assert (
        "crescent_ttft_seconds_bucket" in text
        and 'crescent_live_instances{role="prefill"} 1.0' in text
    )
    assert health["status"] == "serving"


async def test_every_served_request_checks_its_ttft_and_tbt_predictions(dev_cluster):
    from prometheus_client.parser import text_string_to_metric_families

    async def error_counts(session) -> dict[str, float]:
        async with session.get(f"{dev_cluster.api_url}/metrics") as response:
            text = await response.text()
        return {
            sample.labels["kind"]: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "crescent_prediction_abs_error_ratio_count"
            and sample.labels["prediction"] == "corrected"
        }

    async with aiohttp.ClientSession() as session:
        before = await error_counts(session)
        # More tokens than one chunk holds (16): decode's steps at this time scale may come
        # faster than the chunker's delay, and a TBT is measured after the first chunk only.
        body = {"model": MODEL, "prompt": "check my predictions " * 40, "max_tokens": 40}
        async with session.post(f"{dev_cluster.api_url}/v1/completions", json=body) as response:
            assert response.status == 200, await response.text()
        after = await error_counts(session)
    assert after["ttft"] == before.get("ttft", 0) + 1
    assert after["tbt"] == before.get("tbt", 0) + 1


@pytest.mark.parametrize(
    "path, body, status, param",
    [
        ("/v1/completions", b"{not json", 400, None),
        ("/v1/completions", b'{"prompt": "x"}', 400, "model"),
        (
            "/v1/completions",
            b'{"model": "crescent-emulated", "prompt": "x", "max_tokens": 0}',
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            b'{"model": "crescent-emulated", "prompt": "x", "max_tokens": "3"}',
            400,
            "max_tokens",
        ),
        ("/v1/completions", b'{"model": "no-such-model", "prompt": "x"}', 404, "model"),
        (
            "/v1/completions",
            b'{"model": "crescent-emulated", "prompt": [1, 999999]}',
            400,
            "prompt",
        ),
        (
            "/v1/chat/completions",
            b'{"model": "crescent-emulated", "messages": "hi"}',
            400,
            "messages",
        ),
        ("/v1/nothing", b"{}", 404, None),
    ],
)
async def test_bad_input_gets_an_openai_error(dev_cluster, path, body, status, param):
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{dev_cluster.api_url}{path}", data=body, headers={"Content-Type": "application/json"}
        ) as response,
    ):
        assert response.status == status
        error = (await response.json())["error"]
    assert error["message"] and error["type"]
    assert error["param"] == param


async def test_prompt_longer_than_the_context_is_rejected(dev_cluster):
    body = {"model": MODEL, "prompt": "x" * 40000, "max_tokens": 10}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{dev_cluster.api_url}/v1/completions", json=body) as response:
            assert response.status == 400
            error = (await response.json())["error"]
    assert error["code"] == "context_length_exceeded" and "32768" in error["message"]


async def test_client_disconnect_releases_decode_room(dev_cluster):
    # 30,000 tokens take the emulated decode at least 13 s; a cancelled request frees its room at
    # once (the deadline leaves room for a loaded machine).
    body = {"model": MODEL, "prompt": "long", "max_tokens": 30000, "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{dev_cluster.api_url}/v1/completions", json=body) as response:
            await response.content.readline()
        decode_url = await _instance_url(dev_cluster, "decode", "decode-0")
        deadline = time.monotonic() + 8
        while True:
            async with session.get(f"{decode_url}/health") as response:
                health = await response.json()
            if health["num_running"] == 0 and health["kv_used_tokens"] == 0:
                break
            assert time.monotonic() < deadline, f"decode still holds the request: {health!r}"
            await asyncio.sleep(0.1)


async def _instance_url(cluster, role: str, instance_id: str) -> str:
    etcd = await connect_etcd(cluster.etcd_url)
    try:
        entry = await etcd.get(Keys(cluster.spec.cluster).instance(role, instance_id).encode())
    finally:
        await etcd.close()
    return decode(entry.value, InstanceInfo).http_url
