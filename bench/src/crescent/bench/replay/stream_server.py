"""A stand-in OpenAI endpoint for measuring the replay client itself: it streams `max_tokens`
one-character chunks `--token-gap-ms` apart, with no model or cluster behind it, so whatever lag
the replay shows is its own."""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web

_CHUNK = (
    b"data: "
    + json.dumps({"choices": [{"index": 0, "text": "a", "finish_reason": None}]}).encode()
    + b"\n\n"
)


def make_app(token_gap_s: float) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(int(body.get("max_tokens", 16))):
            await asyncio.sleep(token_gap_s)
            await response.write(_CHUNK)
        await response.write(b"data: [DONE]\n\n")
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "stand-in", "object": "model"}]}
        )

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-gap-ms", type=float, default=20.0)
    args = parser.parse_args()
    web.run_app(
        make_app(args.token_gap_ms / 1000),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
    )


if __name__ == "__main__":
    main()
