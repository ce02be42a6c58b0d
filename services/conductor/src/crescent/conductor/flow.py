"""One request's trip through the cluster: place → reserve decode → prefill → start decode →
relay tokens. Every step has a deadline; whatever happens, the decode side is released."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
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
from crescent.conductor.policy import Decision, Rejection, ScheduleRequest
from crescent.conductor.scheduler import Scheduler

log = logging.getLogger(__name__)

LIVENESS_CHECK_S = 0.25
T = TypeVar("T")


class RejectedError(RecoverableError):
    """Admission turned the request away before any prefill ran."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.detail)
        self.rejection = rejection


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


class RequestFlow:
    def __init__(self, bus: Bus, subjects: Subjects, scheduler: Scheduler, timeouts: FlowTimeouts,
                 eos_token_id: int) -> None:
        self._bus = bus
        self._subjects = subjects
        self._scheduler = scheduler
        self._view = scheduler.view
        self._clock = scheduler.clock
        self._timeouts = timeouts
        self._eos_token_id = eos_token_id

    async def place(self, request: ScheduleRequest, model: str) -> Decision:
        """Ask the policy, then reserve KV room on the decode instance it chose; a decode that
        refuses (its room went to another conductor's request) is left out and the policy asked
        again."""
        with tracer().start_as_current_span("conductor.schedule") as span:
            refused: list[str] = []
            while True:
                outcome = self._scheduler.schedule(request, model, refused)
                if isinstance(outcome, Rejection):
                    span.set_attribute("crescent.rejected", outcome.reason.value)
                    raise RejectedError(outcome)
                decode_id = outcome.decode.instance_id
                self._scheduler.record(request, outcome)
                if await self._reserve(decode_id, request.request_id, request.num_prompt_tokens, request.max_tokens):
                    break
                self._scheduler.forget(request, outcome)
                refused.append(decode_id)
            span.set_attribute("crescent.prefill", outcome.prefill.instance_id)
            span.set_attribute("crescent.decode", decode_id)
            span.set_attribute("crescent.prefix_tokens", outcome.prefill.prefix_tokens)
            span.set_attribute("crescent.predicted_ttft_s", outcome.prefill.predicted_ttft_s)
            span.set_attribute("crescent.predicted_tbt_s", outcome.decode.predicted_tbt_s)
            return outcome

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
        request = self._scheduler.request_for(request_id, model, token_ids, max_tokens)
        decision = await self.place(request, model)
        prefill, decode_id = decision.prefill, decision.decode.instance_id
        stream = await self._bus.stream(self._subjects.tokens(request_id), TokenChunk)
        decode_finished = False  # until decode says it is done, it holds KV for us
        try:
            job = PrefillJob(request_id=request_id, model=model, token_ids=token_ids, sampling=sampling,
                             decode_instance=decode_id, decode_node=self._view.node_of("decode", decode_id),
                             block_size=request.block_size, pull_from_node=prefill.transfer_source or "",
                             pull_hashes=list(prefill.transfer_hashes))
            result = await self._while_live("prefill", prefill.instance_id, self._bus.request(
                self._subjects.prefill_job(prefill.instance_id), job, PrefillResult, self._timeouts.prefill_s))
            finish = self._finish_on_first(result.first_token, max_tokens, sampling)
            yield TokenEvent([result.first_token], finish, prefill=result)
            if finish is not None:
                return
            start = DecodeStart(request_id=request_id, token_ids=token_ids, first_token=result.first_token,
                                max_tokens=max_tokens, sampling=sampling)
            await self._while_live("decode", decode_id, self._bus.request(
                self._subjects.decode_start(decode_id), start, Ack, self._timeouts.start_s))
            self._scheduler.on_decode_started(request_id)
            expected_seq = 0
            while True:
                chunk = await self._while_live("decode", decode_id, stream.next(self._timeouts.token_gap_s))
                if chunk.seq != expected_seq:
                    raise StreamBrokenError(f"token stream of {request_id} skipped from {expected_seq} to {chunk.seq}")
                if chunk.error:
                    raise StreamBrokenError(f"decode {decode_id} failed: {chunk.error}")
                expected_seq += 1
                yield TokenEvent(chunk.token_ids, chunk.finish_reason if chunk.is_final else None)
                if chunk.is_final:
                    decode_finished = True
                    return
        finally:
            self._scheduler.on_finished(request_id, decode_finished)
            await stream.close()
            if not decode_finished:
                await self._cancel(decode_id, request_id)

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
