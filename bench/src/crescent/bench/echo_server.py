"""The control-plane benchmark's baseline: an HTTP server that answers /v1/completions with
the same JSON shape but no cluster behind it, so `crescent bench control-plane` can subtract
what HTTP and JSON cost and report what the control path adds."""

from __future__ import annotations

import argparse
import time

import uvloop
from aiohttp import web


async def completions(request: web.Request) -> web.Response:
    body = await request.json()
    num_tokens = int(body.get("max_tokens", 16))
    return web.json_response(
        {
            "id": "cmpl-echo",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {"index": 0, "text": "a" * num_tokens, "logprobs": None, "finish_reason": "length"}
            ],
            "usage": {
                "prompt_tokens": 1,
                "completion_tokens": num_tokens,
                "total_tokens": num_tokens + 1,
            },
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    # the services' event loop (crescent.common.service), so that the baseline differs from
    # them by the control path alone
    web.run_app(
        app,
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
