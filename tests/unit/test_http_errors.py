"""The HTTP error paths of a real aiohttp server on a loopback port: the conductor's middleware
(every error an OpenAI body, logged once) and the protocol-level answers of every service."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest
from aiohttp import web

from crescent.common.http_server import JsonErrorRunner
from crescent.common.ports import free_port
from crescent.conductor.http_errors import REQUEST_ID as REQUEST_ID_KEY
from crescent.conductor.http_errors import openai_errors
from crescent.conductor.openai_api import ApiError

REQUEST_ID = "cmpl-test"


async def _fails_after_assigning_an_id(request: web.Request) -> web.Response:
    request[REQUEST_ID_KEY] = REQUEST_ID
    raise RuntimeError("a bug")


async def _refuses(request: web.Request) -> web.Response:
    raise ApiError(429, "too busy", type_="rate_limit_error", headers={"X-Request-Id": REQUEST_ID})


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _breaks_mid_stream(request: web.Request) -> web.StreamResponse:
    request[REQUEST_ID_KEY] = REQUEST_ID
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"data: {}\n\n")
    raise RuntimeError("a bug after the headers")


async def _serve(app: web.Application):
    runner = JsonErrorRunner(app, idle_timeout_s=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


@pytest.fixture
async def server():
    """The conductor's middleware behind JsonErrorRunner."""
    app = web.Application(middlewares=[openai_errors])
    app.router.add_post("/v1/bug", _fails_after_assigning_an_id)
    app.router.add_post("/v1/busy", _refuses)
    app.router.add_post("/v1/ok", _ok)
    app.router.add_post("/v1/stream", _breaks_mid_stream)
    runner, port = await _serve(app)
    yield f"http://127.0.0.1:{port}", port
    await runner.cleanup()


@pytest.fixture
async def bare_server():
    """JsonErrorRunner with no middleware, as the services other than the conductor run it."""
    app = web.Application()
    app.router.add_post("/bug", _fails_after_assigning_an_id)
    app.router.add_post("/ok", _ok)
    runner, port = await _serve(app)
    yield f"http://127.0.0.1:{port}", port
    await runner.cleanup()


def records(caplog, message: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == message]


async def test_an_unexpected_exception_is_a_logged_500_with_an_openai_body(server, caplog):
    url, _ = server
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/bug", json={}) as response,
    ):
        assert response.status == 500
        error = (await response.json())["error"]
    assert error["type"] == "server_error" and "a bug" not in error["message"]
    logged = records(caplog, "request failed")
    assert len(logged) == 1
    assert logged[0].request_id == REQUEST_ID and logged[0].status == 500 and logged[0].exc_info


async def test_an_error_answer_is_logged_once_with_request_id_status_and_cause(server, caplog):
    url, _ = server
    caplog.set_level(logging.INFO)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/busy", json={}) as response:
            assert response.status == 429
        async with session.post(f"{url}/v1/ok", json={}) as response:
            assert response.status == 200
        async with session.get(f"{url}/v1/ok") as response:
            assert response.status == 405 and response.headers["Allow"] == "POST"
            assert (await response.json())["error"]["message"]
    logged = records(caplog, "request answered with an error")
    assert [(r.status, getattr(r, "request_id", None)) for r in logged] == [
        (429, REQUEST_ID),
        (405, None),
    ]
    assert logged[0].cause == "too busy" and logged[0].path == "/v1/busy"


async def test_a_failure_after_the_response_began_cuts_the_connection_and_is_logged_once(
    server, caplog
):
    url, _ = server
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/stream", json={}) as response,
    ):
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
    assert len(records(caplog, "request failed mid-response")) == 1
    assert not records(caplog, "request failed")


async def test_protocol_level_errors_are_json_and_logged(bare_server, caplog):
    url, port = bare_server
    caplog.set_level(logging.INFO)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/bug", json={}) as response:
            assert response.status == 500
            error = (await response.json())["error"]
            assert error["type"] == "server_error" and "a bug" not in error["message"]
        async with session.post(f"{url}/ok", json={}, headers={"Expect": "nonsense"}) as response:
            assert response.status == 417
            assert "nonsense" in (await response.json())["error"]["message"]
        async with session.get(f"{url}/nowhere") as response:
            assert response.status == 404
            assert (await response.json())["error"]["message"]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /ok HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n")
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b" 400 " in head.split(b"\r\n")[0] and b"application/json" in head
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    statuses = sorted(r.status for r in caplog.records if r.name == "crescent.common.http_server")
    assert statuses == [400, 404, 417, 500]


async def test_an_idle_connection_is_closed(server):
    _, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
