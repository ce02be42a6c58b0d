"""The aiperf bench's two-engine baseline: the round-robin proxy alternates backends and relays
streamed bodies unchanged."""

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from crescent.bench.rr_proxy import build_app


def backend(name: str) -> web.Application:
    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for part in (f"data: {name}-{body['n']}-a\n\n", f"data: {name}-{body['n']}-b\n\n"):
            await response.write(part.encode())
        return response

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_get("/health", health)
    return app


async def test_requests_alternate_between_backends_and_streams_pass_through():
    one, two = TestServer(backend("one")), TestServer(backend("two"))
    await one.start_server()
    await two.start_server()
    proxy = TestServer(
        build_app([str(one.make_url("")).rstrip("/"), str(two.make_url("")).rstrip("/")])
    )
    await proxy.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(proxy.make_url("/health")) as response:
                assert response.status == 200
            bodies = []
            for n in range(4):
                async with session.post(
                    proxy.make_url("/v1/completions"), json={"n": n}
                ) as response:
                    assert response.headers["content-type"] == "text/event-stream"
                    bodies.append(await response.text())
        assert bodies == [
            f"data: {b}-{n}-a\n\ndata: {b}-{n}-b\n\n"
            for n, b in enumerate(["one", "two", "one", "two"])
        ]
    finally:
        await proxy.close()
        await one.close()
        await two.close()


async def test_a_backend_that_cannot_be_reached_is_a_502_with_an_error_body():
    one = TestServer(backend("one"))
    await one.start_server()
    gone = TestServer(backend("gone"))
    await gone.start_server()
    gone_url = str(gone.make_url("")).rstrip("/")
    await gone.close()  # its port now refuses connections
    proxy = TestServer(build_app([gone_url, str(one.make_url("")).rstrip("/")]))
    await proxy.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(proxy.make_url("/v1/completions"), json={"n": 0}) as response:
                assert response.status == 502
                error = (await response.json())["error"]
                assert error["code"] == 502 and gone_url in error["message"]
            async with session.post(proxy.make_url("/v1/completions"), json={"n": 1}) as response:
                assert response.status == 200 and "one-1-a" in await response.text()
    finally:
        await proxy.close()
        await one.close()
