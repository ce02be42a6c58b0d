"""The replay client's handling of what an endpoint answers, against a stand-in OpenAI server
(this tests the client's parsing and timing, not a cluster): streamed tokens are timed,
rejections keep their Retry-After, and a server that is down or answers something that is not
an OpenAI stream is counted as a failure, never a crash."""

import asyncio
import json

import pytest
from aiohttp import web

from crescent.bench.replay.client import ReplayOptions, replay
from crescent.bench.replay.prompts import PromptShape
from crescent.bench.replay.records import summarize
from crescent.bench.slo import SloTargets
from crescent.bench.trace import TraceRequest

TRACE = [TraceRequest(i, i * 0.01, 600, 4, (1, 2 + i)) for i in range(6)]


MODE = {"value": "ok"}  # what the stand-in server does; each test sets it


async def stream(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    mode = MODE["value"]
    if mode == "reject":
        return web.json_response(
            {"error": {"message": "too busy", "type": "x"}},
            status=429,
            headers={"Retry-After": "3"},
        )
    if mode == "html":
        return web.Response(text="<html>hello</html>", content_type="text/html")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if mode == "garbage":
        await response.write(b"data: {not json\n\n")
        return response
    for i in range(body["max_tokens"]):
        await asyncio.sleep(0.05 if i == 2 else 0.005)
        chunk = {"choices": [{"index": 0, "text": "a", "finish_reason": None}]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    usage = {
        "choices": [],
        "usage": {
            "completion_tokens": body["max_tokens"],
            "prompt_tokens_details": {"cached_tokens": 512},
        },
    }
    await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
    return response


async def models(request: web.Request) -> web.Response:
    return web.json_response({"data": [{"id": "m1"}]})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(text="# HELP x\ncrescent_cache_hit_rate 0.25\n")


@pytest.fixture
async def server():
    MODE["value"] = "ok"
    app = web.Application()
    app.router.add_post("/v1/completions", stream)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_streamed_tokens_are_timed_and_the_report_adds_up(server):
    url = server
    records, wall_s, hit_rate = await replay(
        TRACE, ReplayOptions(url, speed=1.0, shape=PromptShape())
    )
    assert hit_rate == 0.25 and wall_s > 0
    for record in records:
        assert (
            record.status == "ok"
            and record.num_output_tokens == 4
            and record.num_prompt_tokens == 600
            and record.num_cached_tokens == 512
        )
        assert len(record.intervals_s) == 3 and record.ttft_s > 0
        assert record.tbt_s == max(record.intervals_s) >= 0.04  # the slow third token
    report = summarize(records, SloTargets(30, 0.1), wall_s, hit_rate)
    assert report["completed"] == 6 and report["effective_capacity"] == 1.0
    assert summarize(records, SloTargets(30, 0.01), wall_s, hit_rate)["effective_capacity"] == 0.0


@pytest.mark.parametrize(
    ("mode", "status", "detail"),
    [
        ("reject", "http-429", "too busy"),
        ("html", "bad-response", "text/html"),
        ("garbage", "bad-response", "not JSON"),
    ],
)
async def test_failures_are_counted_with_what_the_server_said(server, mode, status, detail):
    url = server
    MODE["value"] = mode
    records, wall_s, _ = await replay(TRACE, ReplayOptions(url, model="m1"))
    assert {r.status for r in records} == {status}
    assert all(detail in r.detail for r in records)
    if mode == "reject":
        assert {r.retry_after_s for r in records} == {3.0}
    report = summarize(records, SloTargets(30, 0.1), wall_s, None)
    assert report["failed"] == 6 and report["failures_by_status"] == {status: 6}


async def test_an_endpoint_that_is_down_is_counted_not_fatal(unused_tcp_port):
    records, _, hit_rate = await replay(
        TRACE, ReplayOptions(f"http://127.0.0.1:{unused_tcp_port}", model="m")
    )
    assert {r.status for r in records} == {"connection-error"} and hit_rate is None
