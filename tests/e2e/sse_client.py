"""A streamed completion read the way a client reads it, for the e2e tests of faults."""

from __future__ import annotations

import json

import aiohttp

EMULATED_MODEL = "crescent-emulated"


async def stream(
    session: aiohttp.ClientSession,
    url: str,
    text: str,
    max_tokens: int,
    on_token=None,
    logprobs: int | None = None,
) -> tuple[int, str, str | None]:
    """(HTTP status, streamed text, finish reason) of one streaming completion of the emulated
    model; `on_token` is called at each event with a token. An error event fails the test."""
    body = {"model": EMULATED_MODEL, "prompt": text, "max_tokens": max_tokens, "stream": True}
    if logprobs is not None:
        body["logprobs"] = logprobs
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            return response.status, await response.text(), None
        pieces, finish = [], None
        async for line in response.content:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            pieces.append(event["choices"][0]["text"])
            finish = event["choices"][0]["finish_reason"] or finish
            if on_token is not None:
                on_token()
        return 200, "".join(pieces), finish
