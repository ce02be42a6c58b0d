"""Replays a trace against an OpenAI-compatible endpoint: each request is sent at its arrival
time × 1/speed as a streaming /v1/completions call with a token-id prompt, and every streamed
chunk's arrival is timed. A request that fails (endpoint down, HTTP error, a body that is not
an OpenAI stream) is recorded with its status; the replay itself never stops for one.

Request bodies are encoded before the clock starts, so sending one costs the event loop only
the write; what is left of the loop's delay is reported as scheduling lag.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from crescent.bench.replay.prompts import PromptShape, output_tokens, prompt_tokens
from crescent.bench.replay.records import OK, RequestRecord
from crescent.bench.trace import TraceRequest


class ReplayError(Exception):
    """The replay cannot start (bad URL, no model); the message says what to fix."""


@dataclass(frozen=True)
class ReplayOptions:
    url: str
    model: str | None = None
    speed: float = 1.0
    shape: PromptShape = field(default_factory=PromptShape)
    timeout_s: float = 600.0  # one request, first byte to last token
    connect_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ReplayError(f"--url must be an http(s) URL, got {self.url!r}")
        if not (self.speed > 0 and self.timeout_s > 0):
            raise ReplayError("--speed and the timeout must be > 0")

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/").removesuffix("/v1")


async def discover_model(session: aiohttp.ClientSession, base_url: str) -> str:
    """The first model the endpoint lists; ReplayError when it lists none or cannot be asked."""
    try:
        async with session.get(f"{base_url}/v1/models") as response:
            body = await response.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError) as exc:
        raise ReplayError(
            f"cannot list models at {base_url}/v1/models: {exc or type(exc).__name__}"
        ) from exc
    models = body.get("data") if isinstance(body, dict) else None
    if (
        not models
        or not isinstance(models, list)
        or not isinstance(models[0], dict)
        or "id" not in models[0]
    ):
        raise ReplayError(
            f"{base_url}/v1/models lists no model (answered {str(body)[:200]!r}); pass --model"
        )
    return str(models[0]["id"])


async def scrape_cache_hit_rate(session: aiohttp.ClientSession, base_url: str) -> float | None:
    """Crescent's crescent_cache_hit_rate gauge from /metrics; None on any other endpoint."""
    try:
        async with session.get(f"{base_url}/metrics") as response:
            if response.status != 200:
                return None
            text = await response.text()
    except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        if line.startswith("crescent_cache_hit_rate "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def _error_detail(raw: bytes) -> str:
    try:
        body = json.loads(raw)
        return str(body["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return raw[:200].decode("utf-8", "replace")


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class BadResponse(Exception):
    """The endpoint answered 200 with something that is not an OpenAI completion stream."""


async def _read_stream(
    response: aiohttp.ClientResponse, record: RequestRecord, started: float
) -> None:
    content_type = response.headers.get("Content-Type", "")
    if "text/event-stream" not in content_type:
        raise BadResponse(f"expected an SSE stream, got Content-Type {content_type!r}")
    last = started
    async for raw in response.content:
        line = raw.strip()
        if not line or line.startswith(b":"):
            continue
        if not line.startswith(b"data:"):
            raise BadResponse(f"not an SSE data line: {line[:80]!r}")
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        try:
            chunk = json.loads(payload)
        except json.JSONDecodeError as exc:
            raise BadResponse(f"a chunk is not JSON: {payload[:80]!r}") from exc
        if not isinstance(chunk, dict):
            raise BadResponse(f"a chunk is not an object: {payload[:80]!r}")
        if "error" in chunk:
            raise BadResponse(f"stream error: {str(chunk['error'])[:200]}")
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            record.num_output_tokens = usage["completion_tokens"]
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                record.num_cached_tokens = details["cached_tokens"]
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise BadResponse(f"a chunk has no 'choices': {payload[:80]!r}")
        if choices:
            now = time.perf_counter()
            if record.ttft_s is None:
                record.ttft_s = now - started
            else:
                record.intervals_s.append(now - last)
            last = now
    if record.ttft_s is None:
        raise BadResponse("the stream ended without a token")


async def send(
    session: aiohttp.ClientSession, url: str, body: bytes, record: RequestRecord
) -> None:
    started = time.perf_counter()
    try:
        async with session.post(
            url, data=body, headers={"Content-Type": "application/json"}
        ) as response:
            if response.status != 200:
                record.status = f"http-{response.status}"
                record.retry_after_s = _retry_after(response.headers.get("Retry-After"))
                record.detail = _error_detail(await response.read())
                return
            await _read_stream(response, record, started)
            record.status = OK
    except BadResponse as exc:
        record.status, record.detail = "bad-response", str(exc)
    except TimeoutError:
        record.status, record.detail = "timeout", "no answer within the request timeout"
    except aiohttp.ClientConnectionError as exc:
        record.status, record.detail = "connection-error", str(exc) or type(exc).__name__
    except aiohttp.ClientError as exc:
        record.status, record.detail = "bad-response", str(exc) or type(exc).__name__
    finally:
        record.e2e_s = time.perf_counter() - started


def build_requests(
    trace: Sequence[TraceRequest], options: ReplayOptions, model: str
) -> list[tuple[RequestRecord, bytes]]:
    requests = []
    for item in trace:
        tokens = prompt_tokens(item, options.shape)
        body = {
            "model": model,
            "prompt": tokens,
            "max_tokens": output_tokens(item, options.shape),
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "temperature": 0.0,
        }
        record = RequestRecord(
            item.index, item.arrival_s / options.speed, num_prompt_tokens=len(tokens)
        )
        requests.append((record, json.dumps(body).encode()))
    return requests


Progress = Callable[[Sequence[RequestRecord], int], None]


async def replay(
    trace: Sequence[TraceRequest], options: ReplayOptions, progress: Progress | None = None
) -> tuple[list[RequestRecord], float, float | None]:
    """(records, wall seconds, the endpoint's cache hit rate if it reports one)."""
    timeout = aiohttp.ClientTimeout(total=options.timeout_s, sock_connect=options.connect_timeout_s)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        model = options.model
        if model is None:
            try:
                model = await discover_model(session, options.base_url)
            except ReplayError as exc:
                print(
                    f"crescent replay: {exc}; sending with model 'default', failures are counted",
                    file=sys.stderr,
                )
                model = "default"
        requests = build_requests(trace, options, model)
        records = [record for record, _ in requests]
        url = f"{options.base_url}/v1/completions"
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task] = []
        ticker = asyncio.create_task(_tick(progress, records, tasks)) if progress else None
        started = loop.time()
        for record, body in requests:
            delay = started + record.scheduled_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            record.sent_s = loop.time() - started
            tasks.append(asyncio.create_task(send(session, url, body, record)))
        await asyncio.gather(*tasks)
        wall_s = loop.time() - started
        if ticker is not None:
            ticker.cancel()
            progress(records, len(tasks))
        hit_rate = await scrape_cache_hit_rate(session, options.base_url)
    return records, wall_s, hit_rate


async def _tick(progress: Progress, records: Sequence[RequestRecord], tasks: list) -> None:
    while True:
        progress(records, len(tasks))
        await asyncio.sleep(0.5)
