"""One request's trip through the cluster: place → reserve decode → prefill → start decode →
relay tokens. Every step has a deadline; whatever happens, the decode side is released."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from crescent.common.bus import Bus
from crescent.common.errors import CrescentError, RecoverableError
from crescent.common.messages import (
    Ack,
    DecodeCancel,
    DecodeStart,
    PrefillJob,
    PrefillResult,
    Reservation,
    ReservationReply,
    SamplingParams,
    TokenChunk,
)
from crescent.common.naming import Subjects
from crescent.common.tracing import tracer
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.policy import least_loaded

log = logging.getLogger(__name__)

LIVENESS_CHECK_S = 0.25
T = TypeVar("T")


class NoCapacityError(RecoverableError):
    """No live instance can take the request now."""


class InstanceLostError(RecoverableError):
    """The instance serving a request died or went stale while the request waited on it."""


class StreamBrokenError(RecoverableError):
    """The decode token stream lost a chunk or reported an error."""


@dataclass(frozen=True)
class FlowTimeouts:
    reserve_s: float = 2.0
    prefill_s: float = 120.0
    start_s: float = 5.0
    token_gap_s: float = 30.0


@dataclass
class TokenEvent:
    token_ids: list[int]
    finish_reason: str | None = None
    prefill: PrefillResult | None = None


@dataclass
class Placement:
    prefill_id: str
    decode_id: str


class RequestFlow:
    def __init__(self, bus: Bus, subjects: Subjects, view: ClusterView, clock: Callable[[], float],
                 timeouts: FlowTimeouts, eos_token_id: int) -> None:
        self._bus = bus
        self._subjects = subjects
        self._view = view
        self._clock = clock
        self._timeouts = timeouts
        self._eos_token_id = eos_token_id

    async def place(self, request_id: str, model: str, num_prompt_tokens: int, max_tokens: int) -> Placement:
        """Pick a prefill instance and reserve KV room on a decode instance."""
        with tracer().start_as_current_span("conductor.schedule") as span:
            now = self._clock()
            prefill = least_loaded.choose_prefill(self._view.snapshot("prefill", model, now))
            if prefill is None:
                raise NoCapacityError(f"no live prefill instance serves {model!r}")
            need = num_prompt_tokens + max_tokens
            decodes = self._view.snapshot("decode", model, now)
            while True:
                decode = least_loaded.choose_decode(decodes, need)
                if decode is None:
                    raise NoCapacityError(f"no live decode instance for {model!r} has room for {need} tokens")
                if await self._reserve(decode.instance_id, request_id, num_prompt_tokens, max_tokens):
                    break
                decodes = [d for d in decodes if d.instance_id != decode.instance_id]
            self._view.note_assignment("prefill", prefill.instance_id, num_prompt_tokens)
            self._view.note_assignment("decode", decode.instance_id, need)
            span.set_attribute("crescent.prefill", prefill.instance_id)
            span.set_attribute("crescent.decode", decode.instance_id)
            return Placement(prefill.instance_id, decode.instance_id)

    async def _reserve(self, decode_id: str, request_id: str, num_prompt_tokens: int, max_tokens: int) -> bool:
        reservation = Reservation(request_id=request_id, num_prompt_tokens=num_prompt_tokens, max_tokens=max_tokens)
        try:
            reply = await self._bus.request(self._subjects.decode_reserve(decode_id), reservation,
                                            ReservationReply, self._timeouts.reserve_s)
        except RecoverableError as exc:
            log.warning("reserve failed", extra={"decode": decode_id, "error": str(exc)})
            return False
        if not reply.accepted:
            log.info("reserve refused", extra={"decode": decode_id, "reason": reply.reason})
        return reply.accepted

    async def generate(self, request_id: str, model: str, token_ids: list[int], max_tokens: int,
                       sampling: SamplingParams) -> AsyncIterator[TokenEvent]:
        """Tokens as they come; closing the iterator early cancels the request downstream."""
        placement = await self.place(request_id, model, len(token_ids), max_tokens)
        stream = await self._bus.stream(self._subjects.tokens(request_id), TokenChunk)
        decode_finished = False  # until decode says it is done, it holds KV for us
        try:
            job = PrefillJob(request_id=request_id, model=model, token_ids=token_ids, sampling=sampling,
                             decode_instance=placement.decode_id)
            result = await self._while_live("prefill", placement.prefill_id, self._bus.request(
                self._subjects.prefill_job(placement.prefill_id), job, PrefillResult, self._timeouts.prefill_s))
            finish = self._finish_on_first(result.first_token, max_tokens, sampling)
            yield TokenEvent([result.first_token], finish, prefill=result)
            if finish is not None:
                return
            start = DecodeStart(request_id=request_id, token_ids=token_ids, first_token=result.first_token,
                                max_tokens=max_tokens, sampling=sampling)
            await self._while_live("decode", placement.decode_id, self._bus.request(
                self._subjects.decode_start(placement.decode_id), start, Ack, self._timeouts.start_s))
            expected_seq = 0
            while True:
                chunk = await self._while_live("decode", placement.decode_id,
                                               stream.next(self._timeouts.token_gap_s))
                if chunk.seq != expected_seq:
                    raise StreamBrokenError(f"token stream of {request_id} skipped from {expected_seq} to {chunk.seq}")
                if chunk.error:
                    raise StreamBrokenError(f"decode {placement.decode_id} failed: {chunk.error}")
                expected_seq += 1
                yield TokenEvent(chunk.token_ids, chunk.finish_reason if chunk.is_final else None)
                if chunk.is_final:
                    decode_finished = True
                    return
        finally:
            await stream.close()
            if not decode_finished:
                await self._cancel(placement.decode_id, request_id)

    async def _while_live(self, role: str, instance_id: str, step: Awaitable[T]) -> T:
        """Await `step`, but give up as soon as the instance serving it leaves the cluster
        (its lease expired or its telemetry went stale) instead of waiting out the deadline."""
        task = asyncio.ensure_future(step)
        try:
            while True:
                done, _ = await asyncio.wait([task], timeout=LIVENESS_CHECK_S)
                if done:
                    return task.result()
                if not self._view.is_instance_live(role, instance_id, self._clock()):
                    raise InstanceLostError(f"{role} instance {instance_id} left the cluster mid-request")
        finally:
            task.cancel()

    def _finish_on_first(self, token: int, max_tokens: int, sampling: SamplingParams) -> str | None:
        if token in sampling.stop_token_ids or (token == self._eos_token_id and not sampling.ignore_eos):
            return "stop"
        if max_tokens <= 1:
            return "length"
        return None

    async def _cancel(self, decode_id: str, request_id: str) -> None:
        try:
            await self._bus.publish(self._subjects.decode_cancel(decode_id), DecodeCancel(request_id=request_id))
        except CrescentError as exc:
            log.warning("cancel not sent", extra={"request_id": request_id, "error": str(exc)})
        except Exception as exc:  # the connection may be closing during shutdown
            log.warning("cancel not sent", extra={"request_id": request_id, "error": repr(exc)})
