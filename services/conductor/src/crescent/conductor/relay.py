"""A request's token events (one stream per choice) into one HTTP response: JSON, or SSE as the
events arrive, timing TTFT and TBT per choice.

The n choices of a request are n requests through the cluster, each placed, admitted and
moved on failure on its own; their events are merged in arrival order by tasks this relay owns
and awaits. A choice that ends early (a stop string) is cancelled at once, so its decode stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any, Protocol

import msgspec
from aiohttp import web

from crescent.common.errors import RecoverableError
from crescent.conductor import metrics
from crescent.conductor.choice import Choice, ChoiceDelta
from crescent.conductor.flow_state import TokenEvent
from crescent.conductor.openai_fields import ApiError
from crescent.conductor.openai_shapes import Collected, TokenUsage

log = logging.getLogger(__name__)

Event = tuple[str | None, Any]  # (SSE event name or None, JSON body or the literal data)


class Renderer(Protocol):
    """An endpoint's response shapes."""

    def stream_start(self) -> list[Event]: ...

    def stream_delta(self, choice: Choice, delta: ChoiceDelta, is_first: bool) -> list[Event]: ...

    def stream_end(self, choices: Sequence[Collected], counts: TokenUsage) -> list[Event]: ...

    def stream_error(self, message: str) -> list[Event]: ...

    def body(self, choices: Sequence[Collected], counts: TokenUsage) -> dict[str, Any]: ...


class ChoiceEvents:
    """The events of every choice, merged; `stop(i)` cancels one choice, `close` all."""

    def __init__(self, streams: Sequence[AsyncIterator[TokenEvent]]) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()
        self._tasks = [
            asyncio.create_task(self._pump(i, s), name=f"choice {i}") for i, s in enumerate(streams)
        ]
        self._num_open = len(streams)

    async def _pump(self, index: int, events: AsyncIterator[TokenEvent]) -> None:
        try:
            async for event in events:
                await self._queue.put((index, event, None))
        except Exception as exc:  # the handler raises it as its own
            await self._queue.put((index, None, exc))
            return
        finally:
            await events.aclose()
        await self._queue.put((index, None, None))

    async def next(self) -> tuple[int, TokenEvent] | None:
        """The next event of any open choice; None once every choice has ended."""
        while self._num_open:
            index, event, error = await self._queue.get()
            if error is not None:
                raise error
            if event is not None:
                return index, event
            self._num_open -= 1
        return None

    async def stop(self, index: int) -> None:
        task = self._tasks[index]
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self._num_open -= 1

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class OneChoiceEvents:
    """The events of a request's only choice, read in the handler's own task: ChoiceEvents'
    task and queue would add two event-loop hops to every event of the common n=1 request."""

    def __init__(self, stream: AsyncIterator[TokenEvent]) -> None:
        self._stream = stream
        self._is_open = True

    async def next(self) -> tuple[int, TokenEvent] | None:
        if not self._is_open:
            return None
        try:
            return 0, await anext(self._stream)
        except StopAsyncIteration:
            self._is_open = False
            return None

    async def stop(self, index: int) -> None:
        await self.close()

    async def close(self) -> None:
        self._is_open = False
        await self._stream.aclose()


class SloRecorder(Protocol):
    """Where each measured TTFT and TBT also goes (the P/D ratio controller's window)."""

    def add_ttft(self, ttft_s: float) -> None: ...

    def add_tbt(self, tbt_s: float) -> None: ...


class _Timing:
    """TTFT and TBT of one choice."""

    def __init__(self, arrived: float, slo: SloRecorder | None) -> None:
        self._arrived = arrived
        self._slo = slo
        self._last_token_at: float | None = None

    def on_tokens(self, num_tokens: int) -> None:
        if not num_tokens:
            return
        now = time.monotonic()
        if self._last_token_at is None:
            metrics.TTFT.observe(now - self._arrived)
            if self._slo is not None:
                self._slo.add_ttft(now - self._arrived)
        else:
            metrics.TBT.observe((now - self._last_token_at) / num_tokens)
            if self._slo is not None:
                self._slo.add_tbt((now - self._last_token_at) / num_tokens)
        self._last_token_at = now
        metrics.GENERATED_TOKENS.inc(num_tokens)


class Relay:
    def __init__(
        self,
        choices: list[Choice],
        renderer: Renderer,
        request_id: str,
        num_prompt_tokens: int,
        arrived: float,
        slo: SloRecorder | None = None,
    ) -> None:
        self.choices = choices
        self.renderer = renderer
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self._timings = [_Timing(arrived, slo) for _ in choices]
        self._collected = [Collected(c.index) for c in choices]
        self._has_sent = [False] * len(choices)
        self._num_cached: dict[int, int] = {}  # prompt index → its cached tokens
        # Why a stream already under way ended with an error event (its status was sent: 200)
        self.failed_midway: str | None = None

    @property
    def counts(self) -> TokenUsage:
        num_generated = sum(c.num_tokens for c in self.choices)
        return TokenUsage(self.num_prompt_tokens, num_generated, sum(self._num_cached.values()))

    async def _deltas(
        self, streams: Sequence[AsyncIterator[TokenEvent]]
    ) -> AsyncIterator[tuple[Choice, ChoiceDelta]]:
        events = OneChoiceEvents(streams[0]) if len(streams) == 1 else ChoiceEvents(streams)
        try:
            while (item := await events.next()) is not None:
                index, event = item
                choice = self.choices[index]
                self._timings[index].on_tokens(len(event.token_ids))
                if event.num_cached_tokens is not None:  # the most any choice of its prompt had
                    prompt = choice.prompt_index
                    cached = max(self._num_cached.get(prompt, 0), event.num_cached_tokens)
                    self._num_cached[prompt] = cached
                delta = choice.push(event)
                self._collected[index].add(delta)
                self._collected[index].tool_calls = choice.tool_calls
                yield choice, delta
                if choice.is_finished:
                    await events.stop(index)
        finally:
            await events.close()

    async def collect(self, streams: Sequence[AsyncIterator[TokenEvent]]) -> web.Response:
        async with aclosing(self._deltas(streams)) as deltas:
            async for _ in deltas:
                pass
        body = self.renderer.body(self._collected, self.counts)
        return web.Response(
            body=msgspec.json.encode(body),
            content_type="application/json",
            headers={"X-Request-Id": self.request_id},
        )

    async def stream(
        self,
        http_request: web.Request,
        streams: Sequence[AsyncIterator[TokenEvent]],
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Request-Id": self.request_id,
            }
        )
        is_prepared = False
        try:
            async with aclosing(self._deltas(streams)) as deltas:
                async for choice, delta in deltas:
                    if delta.is_empty and self._has_sent[choice.index]:
                        continue
                    if not is_prepared:
                        await response.prepare(http_request)
                        is_prepared = True
                        await _send(response, self.renderer.stream_start())
                    await _send(
                        response,
                        self.renderer.stream_delta(choice, delta, not self._has_sent[choice.index]),
                    )
                    self._has_sent[choice.index] = True
            if not is_prepared:
                await response.prepare(http_request)
                is_prepared = True
                await _send(response, self.renderer.stream_start())
            await _send(response, self.renderer.stream_end(self._collected, self.counts))
        except (RecoverableError, ApiError) as exc:
            if not is_prepared:
                raise
            log.warning(
                "stream failed midway", extra={"request_id": self.request_id, "error": str(exc)}
            )
            self.failed_midway = str(exc)
            await _send(response, self.renderer.stream_error(str(exc)))
        await response.write_eof()
        return response


async def _send(response: web.StreamResponse, events: list[Event]) -> None:
    """The events as SSE, in one write (msgspec encodes the JSON several times faster)."""
    parts = []
    for name, body in events:
        if name:
            parts.append(b"event: " + name.encode() + b"\n")
        data = body.encode() if isinstance(body, str) else msgspec.json.encode(body)
        parts.append(b"data: " + data + b"\n\n")
    await response.write(b"".join(parts))
