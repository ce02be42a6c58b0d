"""Decode worker: reserve → start → stream tokens on tokens.<request_id> → release. A
stream's chunks are kept a while after it ends, for a conductor whose NATS connection dropped
mid-stream to ask for again (resend) instead of moving the request.

A reservation is admitted locally when the KV room is there and, once a conductor has written
the cluster config, when the predicted time between tokens with the request added stays within
the cluster's TBT SLO. The prediction uses the cost profile this worker publishes in etcd
(costs/decode/<id>: measured at start or loaded, crescent.engine.costs), which the conductor
prices this instance with too. A start that computes its prompt here (conditional
disaggregation) comes without a reservation and is admitted the same way on arrival
(DecodeStart.admit): nothing is prefilled meanwhile, so a reservation first would only add a
round trip."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from crescent.common.cluster_config import ConfigFollower
from crescent.common.codec import encode
from crescent.common.config import setting
from crescent.common.errors import ConfigError, ConnectionLostError, RecoverableError
from crescent.common.messages import (
    Ack,
    DecodeCancel,
    DecodeStart,
    InstanceInfo,
    InstanceLoad,
    ResendTokens,
    ResentTokens,
    Reservation,
    ReservationReply,
    TokenChunk,
)
from crescent.common.payload import num_fitting
from crescent.common.received import ReceivedAssignments
from crescent.common.recent import Recent
from crescent.common.service import Runtime, until_drained
from crescent.common.telemetry import Ewma
from crescent.common.tracing import tracer
from crescent.decode.admission import KvLedger, TbtCheck
from crescent.decode.chunking import ChunkLimits, SentStreams, TokenChunker
from crescent.engine.base import FINISH_ABORT, InvalidRequestError
from crescent.engine.costs import emulated_profile, resolve_profile
from crescent.engine.factory import build_engine
from crescent.engine.settings import EngineSettings
from crescent.engine.store_check import check_store_block_bytes

log = logging.getLogger(__name__)

CANCEL_MEMORY_S = 60.0
RESEND_MEMORY_S = 60.0  # how long a finished stream's chunks can be asked for again
RESEND_MEMORY_BYTES = 256 << 20  # and what they may hold together (20 logprobs a token: ~1.5 KB)
EMULATED_KV_CAPACITY_TOKENS = 262144
HAND_BACK_TIMEOUT_S = 5.0


@dataclass
class DecodeSettings(EngineSettings):
    """Settings of a decode worker: engine settings plus its KV room and drain deadline."""

    kv_capacity_tokens: int = setting(
        0,
        "KV room in tokens (prompt + output) this instance admits; "
        "0: all of the engine's paged KV (emulated: 262144)",
    )
    token_chunk_max_tokens: int = setting(
        16, "most tokens per NATS token message when steps come fast"
    )
    token_chunk_max_delay_ms: float = setting(
        5.0,
        "longest a token waits for company in one NATS message; "
        "steps further apart go one per message; 0: never wait",
    )

    def validate(self) -> None:
        super().validate()
        if self.kv_capacity_tokens < 0:
            raise ConfigError(f"kv_capacity_tokens must be >= 0, got {self.kv_capacity_tokens}")
        self.chunk_limits()

    def chunk_limits(self) -> ChunkLimits:
        return ChunkLimits(self.token_chunk_max_tokens, self.token_chunk_max_delay_ms / 1000)


class StartRejected(RecoverableError):
    """No reservation and no KV room for a start."""


class StartRefused(RecoverableError):
    """A start to be admitted (DecodeStart.admit) that a reservation would have been refused
    for: the conductor places the request again without this instance."""


class DecodeWorker:
    role = "decode"

    def __init__(self, settings: DecodeSettings) -> None:
        self.settings = settings
        self.engine = build_engine(settings, self.role)
        self.ledger = KvLedger(settings.kv_capacity_tokens or EMULATED_KV_CAPACITY_TOKENS)
        # Replaced at start by the profile this worker publishes; until then its emulated model.
        self.profile = emulated_profile(settings.cost_model(), settings.model_name)
        self.tbt = TbtCheck(self.profile.decode_step_s)
        self.chunk_limits = settings.chunk_limits()
        self.cluster_config: ConfigFollower | None = None  # its TBT SLO gates admission
        self._generations: dict[str, asyncio.Task] = {}
        self._sent = SentStreams(RESEND_MEMORY_S, RESEND_MEMORY_BYTES)
        # request id → until when a late start is refused: it was cancelled, or its reservation
        # was refused here (its prefill instance may send the start all the same)
        self._closed: Recent[str, bool] = Recent(CANCEL_MEMORY_S)
        # which of each conductor's reservations (and cancels) load() counts
        self.received = ReceivedAssignments()
        self.recent_tbt = Ewma()  # measured time between tokens of running requests
        self._runtime: Runtime | None = None
        self._is_draining = False  # shutting down: new reservations are refused
        self._handed_back: set[str] = set()  # requests cut off at the drain deadline

    async def start(self, runtime: Runtime) -> None:
        self._runtime = runtime
        subjects, instance_id = runtime.subjects, runtime.instance_id
        self.cluster_config = ConfigFollower(
            runtime.etcd,
            runtime.keys,
            f"decode {instance_id}",
            {"model": self.settings.model_name, "block_size": self.settings.block_size},
        )
        await self.cluster_config.start()
        runtime.tasks.spawn("cluster-config", self.cluster_config.run())
        if self.is_vllm:
            if self.settings.vllm_connector:
                await check_store_block_bytes(
                    runtime.bus,
                    subjects,
                    self.settings.node,
                    self.settings.model_name,
                    self.engine.store_block_bytes,
                    self.settings.kv_timeout_s,
                )
            await self.engine.start()
            self.ledger.capacity_tokens = min(
                self.settings.kv_capacity_tokens or self.engine.kv_capacity_tokens,
                self.engine.kv_capacity_tokens,
            )
        else:
            runtime.tasks.spawn("decode-batch", self.engine.run())
        self.profile = await resolve_profile(self.settings, self.engine)
        self.tbt = TbtCheck(self.profile.decode_step_s)
        await runtime.leased.put(runtime.keys.cost(self.role, instance_id), encode(self.profile))
        log.info(
            "cost profile published",
            extra={"source": self.profile.source, "decode": str(self.profile.decode)},
        )
        # Reservations are served last: once one is answered, the start and cancel that may
        # follow it have a responder too.
        await runtime.bus.serve(subjects.decode_resend(instance_id), ResendTokens, self.resend)
        await runtime.bus.serve(subjects.decode_cancel(instance_id), DecodeCancel, self.cancel)
        await runtime.bus.serve(subjects.decode_start(instance_id), DecodeStart, self.start_request)
        await runtime.bus.serve(subjects.decode_reserve(instance_id), Reservation, self.reserve)

    @property
    def is_vllm(self) -> bool:
        return self.settings.engine == "vllm"

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len if self.is_vllm else self.settings.max_model_len

    def instance_info(self) -> InstanceInfo:
        return InstanceInfo(
            role=self.role,
            instance_id=self._runtime.instance_id,
            node=self.settings.node,
            model=self.settings.model_name,
            http_url=self._runtime.http_url,
            max_model_len=self.max_model_len,
            kv_capacity_tokens=self.ledger.capacity_tokens,
            started_at=time.time(),
            engine=self.settings.engine,
        )

    def health(self) -> dict:
        details = {
            "num_running": self.engine.num_running,
            "kv_used_tokens": self.ledger.used_tokens,
            "engine": self.settings.engine,
        }
        if self.is_vllm:
            stats = self.engine.stats
            details.update(num_waiting=stats.num_waiting, kv_usage=round(stats.kv_usage, 4))
        return details

    def load(self) -> InstanceLoad:
        """Emulated: the ledger's view. vllm: vLLM's running batch, its waiting queue (plus
        reservations not yet started) and its paged KV in use."""
        self.ledger.expire(time.monotonic())
        num_queued, kv_used = len(self.ledger.reserved), self.ledger.used_tokens
        if self.is_vllm:
            stats = self.engine.stats
            num_queued += stats.num_waiting
            kv_used = max(kv_used, int(stats.kv_usage * self.engine.kv_capacity_tokens))
        return InstanceLoad(
            role=self.role,
            instance_id=self._runtime.instance_id,
            node=self.settings.node,
            sent_at=time.time(),
            period_s=self.settings.telemetry_period_s,
            num_queued=num_queued,
            num_running=self.engine.num_running,
            kv_used_tokens=kv_used,
            kv_capacity_tokens=self.ledger.capacity_tokens,
            num_context_tokens=self.engine.num_context_tokens,
            num_queued_context_tokens=self.ledger.num_reserved_prompt_tokens,
            recent_tbt_s=self.recent_tbt.value,
            is_accepting=not self.ledger.is_full,
            not_accepting_reason="full" if self.ledger.is_full else "",
            received=self.received.latest(time.monotonic()),
        )

    @property
    def tbt_slo_s(self) -> float | None:
        """The cluster's TBT SLO; None until a conductor has written the cluster config."""
        config = self.cluster_config.config if self.cluster_config is not None else None
        return config.tbt_slo_s if config is not None else None

    async def reserve(self, reservation: Reservation) -> ReservationReply:
        need = reservation.num_prompt_tokens + reservation.max_tokens
        now = time.monotonic()
        # Accepted or refused, from here on load() says it: the ledger holds it or never will.
        self.received.note(reservation.conductor, reservation.assignment, now)
        if reservation.request_id in self._generations:  # its start from prefill came first
            return ReservationReply(request_id=reservation.request_id, accepted=True)
        refusal = self._refusal(
            need, reservation.num_prompt_tokens, now, checks_tbt=not reservation.is_moved
        )
        if refusal is not None:
            self._close(reservation.request_id, now)
            return ReservationReply(
                request_id=reservation.request_id, accepted=False, reason=refusal
            )
        self.ledger.reserve(
            reservation.request_id, need, now + reservation.ttl_s, reservation.num_prompt_tokens
        )
        return ReservationReply(request_id=reservation.request_id, accepted=True)

    def _refusal(
        self, need: int, num_prompt_tokens: int, now: float, checks_tbt: bool = True
    ) -> str | None:
        """Why a request of `need` tokens of KV (`num_prompt_tokens` of them its prompt) cannot
        be admitted now; None when it can. `checks_tbt`: False for a request admitted before
        (Reservation.is_moved), which only needs room."""
        if self._is_draining:
            return f"decode {self._runtime.instance_id} is draining"
        if need > self.max_model_len:
            return f"{need} tokens exceed max_model_len {self.max_model_len}"
        if not self.ledger.can_reserve(need, now):
            return (
                f"no KV room: {self.ledger.used_tokens} of "
                f"{self.ledger.capacity_tokens} tokens in use"
            )
        slo_s = self.tbt_slo_s
        if slo_s is not None and checks_tbt:
            tbt_s = self.tbt.predicted_tbt_s(
                self.engine.num_running,
                self.engine.num_context_tokens,
                self.ledger,
                num_prompt_tokens,
            )
            if tbt_s > slo_s:
                return (
                    f"predicted TBT {tbt_s:.4g} s with this request exceeds "
                    f"the TBT SLO of {slo_s:g} s"
                )
        return None

    async def start_request(self, start: DecodeStart) -> Ack:
        need = len(start.token_ids) + start.max_tokens
        now = time.monotonic()
        if start.admit:  # as for a reservation: load() says it from here on
            self.received.note(start.conductor, start.assignment, now)
        with tracer().start_as_current_span("decode.queue") as span:
            span.set_attribute("crescent.request_id", start.request_id)
            if start.request_id in self._generations:
                raise StartRejected(f"request {start.request_id} is already running")
            if self._closed.get(start.request_id, now):
                raise StartRejected(f"request {start.request_id} was cancelled or refused here")
            # A start from prefill may overtake its reservation: then it is admitted the same way.
            if start.admit or (start.from_prefill and start.request_id not in self.ledger.reserved):
                refusal = self._refusal(need, len(start.token_ids), now)
                if refusal is not None:
                    raise StartRefused(refusal)
            if need > self.max_model_len:
                raise StartRejected(f"{need} tokens exceed max_model_len {self.max_model_len}")
            if not self.ledger.activate(start.request_id, need, now):
                raise StartRejected(f"no reservation for {start.request_id} and no KV room")
        chunker = TokenChunker(start.request_id, self._publisher(start), self.chunk_limits)
        self._sent.open(chunker)  # from its Ack on, a resend finds the stream
        task = asyncio.create_task(
            self._generate(start, chunker), name=f"decode {start.request_id}"
        )
        self._generations[start.request_id] = task
        task.add_done_callback(lambda _: self._ended(start.request_id))
        return Ack(request_id=start.request_id)

    def _ended(self, request_id: str) -> None:
        """A generation's task is done, however it ended: a cancel handled before the task
        first ran (a client gone as its first token came) ends it without running any of
        `_generate`, so the room is released here, not there."""
        self._generations.pop(request_id, None)
        self.ledger.release(request_id)
        self._sent.end(request_id, time.monotonic())

    def _publisher(self, start: DecodeStart) -> Callable[[TokenChunk], Awaitable[None]]:
        subject = self._runtime.subjects.tokens(start.request_id, start.stream_owner)
        bus = self._runtime.bus

        async def publish(chunk: TokenChunk) -> None:
            # No trace context per chunk: the conductor reads none, and headers cost both sides.
            try:
                await bus.publish(subject, chunk, with_trace=False)
            except ConnectionLostError:  # a long NATS outage: kept for the conductor's resend
                pass

        return publish

    async def _generate(self, start: DecodeStart, chunker: TokenChunker) -> None:
        try:
            with tracer().start_as_current_span("decode.generate") as span:
                prefill_here = start.first_token is None  # conditional disaggregation
                span.set_attribute("crescent.prefill_on_decode", prefill_here)
                steps = self.engine.generate(
                    start.request_id,
                    start.token_ids,
                    start.first_token,
                    start.max_tokens - (0 if prefill_here else 1),
                    start.sampling.stop_token_ids,
                    sampling=start.sampling,
                    save_to=[self.settings.node] if prefill_here else [],
                )
                num_tokens = 0
                last_step_at: float | None = (
                    None  # the wait for the first step is queueing, not TBT
                )
                async for step in steps:
                    now = time.monotonic()
                    if last_step_at is not None and step.token_ids:
                        self.recent_tbt.add((now - last_step_at) / len(step.token_ids))
                    last_step_at = now
                    if step.num_cached_tokens is not None:
                        span.set_attribute("crescent.num_cached_tokens", step.num_cached_tokens)
                        if prefill_here:
                            chunker.num_cached_tokens = step.num_cached_tokens
                    num_tokens += len(step.token_ids)
                    await chunker.add(step.token_ids, step.logprobs, step.finish_reason)
                span.set_attribute("crescent.num_generated_tokens", num_tokens)
                span.set_attribute("crescent.num_token_messages", chunker.num_chunks)
        except asyncio.CancelledError:
            if start.request_id in self._handed_back:  # drain deadline: its conductor moves it on
                await chunker.fail("decode instance draining: continue elsewhere", FINISH_ABORT)
            raise
        except InvalidRequestError as exc:
            log.info(
                "engine refused the request",
                extra={"request_id": start.request_id, "error": str(exc)},
            )
            await chunker.fail(str(exc), FINISH_ABORT, type(exc).__name__)
        except Exception as exc:
            log.exception("generation failed", extra={"request_id": start.request_id})
            await chunker.fail(repr(exc), FINISH_ABORT)
        finally:
            await chunker.close()

    async def resend(self, ask: ResendTokens) -> ResentTokens:
        """The chunks of a stream from `ask.from_seq` on, for a conductor whose NATS connection
        dropped while it read the stream: what was sent meanwhile may not have reached it."""
        chunks = self._sent.since(ask.request_id, ask.from_seq, time.monotonic())
        if chunks is None:
            return ResentTokens(request_id=ask.request_id, is_known=False)
        shell = ResentTokens(request_id=ask.request_id, is_known=True)
        num = num_fitting(shell, chunks, self._runtime.bus.max_payload)
        return ResentTokens(
            request_id=ask.request_id,
            is_known=True,
            chunks=chunks[:num],
            num_chunks_left=len(chunks) - num,
        )

    async def cancel(self, cancel: DecodeCancel) -> Ack:
        """Start and cancel arrive on different subjects and may be handled out of order, so a
        cancel is remembered: a start that comes after it is refused instead of running."""
        now = time.monotonic()
        self._close(cancel.request_id, now)
        self.engine.abort(cancel.request_id)
        generation = self._generations.get(cancel.request_id)
        if generation is not None:  # it may not have reached the engine yet: stop it either way
            generation.cancel()
        else:
            self.ledger.release(cancel.request_id)
        self.received.note(cancel.conductor, cancel.assignment, now)
        return Ack(request_id=cancel.request_id)

    def _close(self, request_id: str, now: float) -> None:
        """Refuse any start of `request_id` that comes from now on, for CANCEL_MEMORY_S."""
        self._closed.put(request_id, True, now)

    @property
    def num_inflight(self) -> int:
        """Requests this instance owes tokens: running, or reserved and yet to start."""
        self.ledger.expire(time.monotonic())
        return len(self._generations) + len(self.ledger.reserved)

    async def finish_inflight(self) -> None:
        """New reservations are refused from now on; the requests already running finish, and
        those reserved before the drain are started when their prefill ends and finish too.
        The instance is still registered, so their conductors wait for it. Whatever is left at
        drain_timeout_s is handed back: its stream ends with an error, on which its conductor
        continues it on another decode instance, so no request fails."""
        self._is_draining = True
        if self.num_inflight:
            log.info(
                "draining",
                extra={
                    "num_running": len(self._generations),
                    "num_reserved": len(self.ledger.reserved),
                },
            )
        await until_drained(lambda: self.num_inflight, self.settings.drain_timeout_s)
        left = list(self._generations.items())
        if left:
            log.warning(
                "drain deadline passed; handing requests back", extra={"num_running": len(left)}
            )
        for request_id, task in left:
            self._handed_back.add(request_id)
            task.cancel()
            self.engine.abort(request_id)
        if left:
            await asyncio.wait([task for _, task in left], timeout=HAND_BACK_TIMEOUT_S)

    async def drain(self) -> None:
        """After the instance left the registry: close the engine."""
        if self.is_vllm:
            await self.engine.close()
