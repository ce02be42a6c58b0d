"""A round-robin HTTP proxy: what a user of several plain engines would put in front of them.

Each request goes to the next backend in turn, body and headers passed through, a streamed
response relayed chunk by chunk; `/health` answers once every backend does. A backend that
cannot be reached gets its request a 502 with an OpenAI-style error body, as a gateway answers;
one that fails mid-stream cuts the client's stream. No retries and no health-based routing:
a plain proxy. Used by `crescent bench aiperf` as the two-engine baseline.

  python -m crescent.bench.rr_proxy --port 8000 --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002
"""

from __future__ import annotations

import argparse
import itertools

import aiohttp
from aiohttp import web

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}
SESSION = web.AppKey("session", aiohttp.ClientSession)


def build_app(backends: list[str]) -> web.Application:
    turns = itertools.cycle(backends)
    app = web.Application(client_max_size=64 << 20)

    async def start_session(app: web.Application):
        app[SESSION] = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
        )
        yield
        await app[SESSION].close()

    async def health(_: web.Request) -> web.Response:
        for backend in backends:
            try:
                async with app[SESSION].get(
                    f"{backend}/health", timeout=aiohttp.ClientTimeout(total=5)
                ) as r:
                    if r.status != 200:
                        return web.Response(status=503, text=f"{backend}: {r.status}")
            except aiohttp.ClientError as exc:
                return web.Response(status=503, text=f"{backend}: {exc}")
        return web.Response(text="ok")

    async def forward(request: web.Request) -> web.StreamResponse:
        backend = next(turns)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()
        try:
            upstream = await app[SESSION].request(
                request.method, f"{backend}{request.rel_url}", headers=headers, data=body
            )
        except aiohttp.ClientError as exc:
            return web.json_response(
                {"error": {"message": f"{backend}: {exc}", "type": "bad_gateway", "code": 502}},
                status=502,
            )
        async with upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP},
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.cleanup_ctx.append(start_session)
    app.router.add_get("/health", health)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--backend", action="append", required=True, help="a backend's base URL (repeat)"
    )
    args = parser.parse_args()
    web.run_app(build_app(args.backend), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
