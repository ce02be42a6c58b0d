"""A request's decode steps as TokenChunks on NATS, several steps to a message when they come
fast.

Every NATS message costs a publish here, a socket write, and on the conductor a parse, a
wake-up and a relay step. When the engine turns out steps faster than `max_delay_s` apart (a
small model, a short context, an emulated engine), the steps are held and sent together: a
chunk leaves when it holds `max_tokens` tokens or its first token has waited `max_delay_s`,
whichever comes first. When steps come slower than that, there is nothing to gain by holding
one back, so each step leaves as it comes. The final step is never held, and the hold never
exceeds `max_delay_s`, so a streaming client sees every token within that bound.

Chunks are numbered and published in order under one lock, whether a step or the delay timer
sends them, because the conductor reads a gap in the numbering as chunks lost on the way. Each
stream's chunks are kept (SentStreams) until a while after it ends: a conductor whose NATS
connection dropped mid-stream asks for those it may have missed instead of moving the request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from crescent.common.errors import ConfigError
from crescent.common.held_bytes import chunks_bytes
from crescent.common.messages import TokenChunk, TokenLogprobs
from crescent.common.recent import Recent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChunkLimits:
    """When held tokens must leave: at `max_tokens` tokens, or after `max_delay_s`.
    `max_delay_s` = 0 sends every step as its own chunk."""

    max_tokens: int = 16
    max_delay_s: float = 0.005

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or not self.max_delay_s >= 0:
            raise ConfigError(
                f"token chunks need max_tokens >= 1 and max_delay >= 0, got "
                f"{self.max_tokens} and {self.max_delay_s} s"
            )


class TokenChunker:
    """Turns one request's decode steps into TokenChunks handed to `publish`, in order."""

    def __init__(
        self, request_id: str, publish: Callable[[TokenChunk], Awaitable[None]], limits: ChunkLimits
    ) -> None:
        self.request_id = request_id
        self.limits = limits
        self.sent: list[TokenChunk] = []  # every chunk so far, in order: sent[i].seq == i
        self._publish = publish
        self._token_ids: list[int] = []
        self._logprobs: list[TokenLogprobs] = []
        self._last_step_at: float | None = None
        # prompt tokens loaded, not computed, of a prompt computed here: the first chunk says it
        self.num_cached_tokens: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timed_flush: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    @property
    def num_chunks(self) -> int:
        """Chunks sent so far: the next chunk's seq."""
        return len(self.sent)

    async def add(
        self, token_ids: list[int], logprobs: list[TokenLogprobs], finish_reason: str | None
    ) -> None:
        """One decode step; the last one has a finish reason."""
        now = time.monotonic()
        # Steps this far apart would wait the whole delay for company that comes too late.
        is_slow = (
            self._last_step_at is not None and now - self._last_step_at >= self.limits.max_delay_s
        )
        self._last_step_at = now
        self._token_ids.extend(token_ids)
        self._logprobs.extend(logprobs)
        if finish_reason is not None:
            await self.flush(is_final=True, finish_reason=finish_reason)
        elif (
            is_slow
            or len(self._token_ids) >= self.limits.max_tokens
            or self.limits.max_delay_s == 0
        ):
            await self.flush()
        elif self._timer is None and self._token_ids:
            self._timer = asyncio.get_running_loop().call_later(
                self.limits.max_delay_s, self._on_delay
            )

    async def fail(self, error: str, finish_reason: str, error_code: str | None = None) -> None:
        """The generation broke: what is held goes out, then a final chunk carrying the error."""
        await self.flush()
        await self.flush(
            is_final=True, finish_reason=finish_reason, error=error, error_code=error_code
        )

    async def flush(
        self,
        is_final: bool = False,
        finish_reason: str | None = None,
        error: str | None = None,
        error_code: str | None = None,
    ) -> None:
        """Send what is held (a final chunk even when nothing is)."""
        self._cancel_timer()
        async with self._lock:
            if not (self._token_ids or is_final):
                return
            chunk = TokenChunk(
                request_id=self.request_id,
                seq=self.num_chunks,
                token_ids=self._token_ids,
                step_at=self._last_step_at or time.monotonic(),
                logprobs=self._logprobs,
                is_final=is_final,
                finish_reason=finish_reason,
                error=error,
                error_code=error_code,
                num_cached_tokens=self.num_cached_tokens if self.num_chunks == 0 else None,
            )
            self._token_ids, self._logprobs = [], []
            self.sent.append(chunk)
            await self._publish(chunk)

    async def close(self) -> None:
        """Stop the delay timer and wait for a timed flush in flight."""
        self._cancel_timer()
        if self._timed_flush is not None:
            [outcome] = await asyncio.gather(self._timed_flush, return_exceptions=True)
            if isinstance(outcome, Exception):
                log.warning(
                    "a held token chunk was not sent",
                    extra={"request_id": self.request_id, "error": repr(outcome)},
                )

    def _on_delay(self) -> None:
        self._timer = None
        self._timed_flush = asyncio.ensure_future(self.flush())

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class SentStreams:
    """The chunks of each stream this instance sends, kept `memory_s` past the stream's end
    (ResendTokens): a drop can lose the last chunks, the final one among them. Ended streams
    hold at most about `max_bytes`, the oldest forgotten first."""

    def __init__(self, memory_s: float, max_bytes: int) -> None:
        self._open: dict[str, TokenChunker] = {}
        self._ended: Recent[str, list[TokenChunk]] = Recent(memory_s, max_bytes)

    def open(self, chunker: TokenChunker) -> None:
        self._open[chunker.request_id] = chunker

    def end(self, request_id: str, now: float) -> None:
        """The stream sends no more: keep its chunks until `now` + memory_s."""
        chunker = self._open.pop(request_id, None)
        if chunker is not None:
            self._ended.put(request_id, chunker.sent, now, chunks_bytes(chunker.sent))

    def since(self, request_id: str, from_seq: int, now: float) -> list[TokenChunk] | None:
        """The stream's chunks from `from_seq` on; None when there is no such stream here."""
        chunker = self._open.get(request_id)
        chunks = chunker.sent if chunker is not None else self._ended.get(request_id, now)
        return chunks[from_seq:] if chunks is not None else None
