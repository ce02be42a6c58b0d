"""One request's trip through the cluster: place → reserve decode and prefill (sent together)
→ the prefill instance starts the decode as its first token is out → relay tokens; or, when the
decode instance computes the prompt itself, place → start decode (admitted on arrival, no
reservation first) → relay tokens. Every step has a deadline; whatever happens, the decode side
is released. The decode answers a start the prefill instance sent here, as it answers one
sent from here; a start that got no answer within its deadline (one lost on the way, which a
NATS restart can do) moves the request, as a start of the conductor's own would.

No admitted request is lost to an instance that dies (DESIGN §10). A prefill instance that is
gone (its registry lease ended, or nobody answers on its subject) or that fails the job before
the first token → the request is placed again without it. A decode instance that is gone or
breaks the stream mid-way → the request goes on, on another decode instance, from its prompt
plus the tokens already streamed, so the client sees one uninterrupted stream. An instance
that left the registry may only be paused past its lease: when no other can take its request,
it is waited for and, back in the same process, read on from (a decode's stream, a prefill's
job result), as after a NATS reconnect. A reply that may
have been lost across a NATS reconnect is treated the same way; token chunks that may have been
lost (across a reconnect, or missing from the numbering) are asked of the decode again
(resend.py), and the request moves only when it cannot answer. A slow instance (stale
telemetry) is waited for: slow is not dead.

A request whose sampling depends on its own earlier output is replayed instead (progress.py):
its decode generates from the prompt, and one that takes over regenerates the tokens already
streamed, which are checked and skipped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import aclosing
from dataclasses import dataclass

import msgspec

from crescent.common.bus import Bus, Replies, StreamGroup
from crescent.common.errors import (
    ConnectionLostError,
    CrescentError,
    NoRespondersError,
    RecoverableError,
    RemoteError,
    RequestTimeoutError,
)
from crescent.common.messages import (
    Ack,
    DecodeCancel,
    PrefillCancel,
    PrefillJob,
    PrefillResult,
    Reservation,
    ReservationReply,
    SamplingParams,
)
from crescent.common.naming import Subjects
from crescent.common.tracing import tracer
from crescent.conductor import metrics
from crescent.conductor.flow_errors import (
    INVALID_REQUEST,
    MOVABLE_ERRORS,
    START_REFUSED,
    InstanceLostError,
    RejectedError,
    RequestRefusedError,
    StreamBrokenError,
    not_to_move,
)
from crescent.conductor.flow_state import (
    Attempt,
    DecodeSide,
    FlowTimeouts,
    Gone,
    HandedStart,
    Prefilled,
    Refusal,
    Silence,
    TokenEvent,
)
from crescent.conductor.policy import (
    Decision,
    DecodeChoice,
    Rejection,
    RejectReason,
    ScheduleRequest,
)
from crescent.conductor.presence import Presence
from crescent.conductor.progress import Progress, Replay, replayable
from crescent.conductor.resend import ChunkOrder, prefill_result_after_drop, resent_chunks
from crescent.conductor.result_parts import whole_result
from crescent.conductor.scheduler import Scheduler
from crescent.conductor.tbt_sample import SteadyGaps

log = logging.getLogger(__name__)

PLACEMENT_RETRY_S = 0.1
MAX_MIGRATIONS = 4  # per stage: more means the request itself is the problem


@dataclass
class StreamReading:
    """Where reading one decode attempt's token stream stands: which chunk is due, and for a
    replayed request what of the output already streamed is still to be regenerated. Kept
    when the attempt's stream is read again from its decode (a rejoin)."""

    order: ChunkOrder
    replay: Replay

    @classmethod
    def of(cls, decode: DecodeSide, progress: Progress, attempt: Attempt) -> StreamReading:
        # A replayed request's new decode first regenerates what the client already has.
        return cls(
            ChunkOrder(decode.attempt_id, attempt.sent_to.epoch),
            Replay(progress.generated if progress.is_replayed else []),
        )


class RequestFlow:
    def __init__(
        self,
        bus: Bus,
        subjects: Subjects,
        scheduler: Scheduler,
        timeouts: FlowTimeouts,
        eos_token_id: int,
        streams: StreamGroup,
        started: Replies,
        owner: str,
    ) -> None:
        """`streams` is subscribed to `subjects.tokens_of(owner)`: every decode this flow starts
        streams its tokens there, on tokens.<owner>.<attempt id>. `started` is subscribed to
        `subjects.start_replies_of(owner)`: the decodes' answers to starts sent by prefill."""
        self._bus = bus
        self._subjects = subjects
        self._streams = streams
        self._started = started
        self._owner = owner
        self._scheduler = scheduler
        self._view = scheduler.view
        self._clock = scheduler.clock
        self._timeouts = timeouts
        self._eos_token_id = eos_token_id
        self._presence = Presence(bus, self._view)

    @property
    def max_payload(self) -> int:
        """The largest message the NATS server takes: a request's jobs and starts must fit."""
        return self._bus.max_payload

    async def generate(
        self,
        request_id: str,
        model: str,
        token_ids: list[int],
        max_tokens: int,
        sampling: SamplingParams,
    ) -> AsyncIterator[TokenEvent]:
        """Tokens as they come; closing the iterator early cancels the request downstream."""
        # prompt logprobs come from a prefill instance's full compute: never prefilled on decode
        request = self._scheduler.request_for(
            request_id,
            model,
            token_ids,
            max_tokens,
            may_prefill_on_decode=sampling.prompt_logprobs is None,
        )
        progress = Progress(list(token_ids), max_tokens, replayable(sampling))
        decode = DecodeSide(request_id)
        attempt: Attempt | None = None
        try:
            prefilled = await self._prefill(request, model, progress, decode)
            attempt = prefilled.attempt
            if prefilled.result is not None:
                first_event = self._first_event(prefilled.result, progress, sampling)
                if first_event is not None and first_event.finish_reason is not None:
                    yield first_event
                    return
                # Not started by the prefill instance: the decode starts before the first token
                # goes to the client, so the start's trip overlaps the relay's work on it.
                attempt = attempt or self._begin(decode, progress)
                if first_event is not None:
                    yield first_event
            async with aclosing(self._decode(request, model, progress, decode, attempt)) as events:
                async for event in events:
                    yield event
        finally:
            if attempt is not None:
                await attempt.close()
            self._scheduler.on_finished(request_id, decode.is_finished)
            if decode.instance_id and not decode.is_finished:
                log.info(
                    "request ended before its decode; cancelling it",
                    extra={"request_id": request_id, "decode": decode.instance_id},
                )
                await self._cancel_decode(decode)

    def _first_event(
        self, result: PrefillResult, progress: Progress, sampling: SamplingParams
    ) -> TokenEvent | None:
        """What the client gets from the prefill: its first token (kept in `progress`) and the
        prompt logprobs asked for; a replayed request gets only the logprobs, its decode
        regenerates the first token."""
        prompt_logprobs = result.prompt_logprobs if sampling.prompt_logprobs is not None else None
        if progress.is_replayed:
            return (
                TokenEvent([], prompt_logprobs=prompt_logprobs)
                if prompt_logprobs is not None
                else None
            )
        first_token = result.first_token
        progress.generated.append(first_token)
        finish = self._finish_on_first(first_token, progress.max_tokens, sampling)
        logprobs = [result.first_logprobs] if result.first_logprobs is not None else []
        return TokenEvent(
            [first_token], finish, logprobs, prompt_logprobs, result.num_cached_tokens
        )

    async def place(
        self,
        request: ScheduleRequest,
        model: str,
        exclude: Collection[str] = (),
        refusals: Mapping[str, str] | None = None,
        unanswered: Mapping[str, Silence] | None = None,
    ) -> Decision:
        """Ask the policy and account for its choice; the decode reservation is the caller's.
        While the model has registered instances but none live (a NATS outage, a restart), the
        request waits up to placement_wait_s instead of failing. `refusals`: the decode
        instances that refused this request, and why (they are among `exclude`);
        `unanswered`: those of them that gave no answer. When no other decode instance would
        take the request, it waits for them, asking each again when its Silence says, until
        placement_wait_s after its first silence."""
        with tracer().start_as_current_span("conductor.schedule") as span:
            deadline = self._clock() + self._timeouts.placement_wait_s
            skipped = set(exclude)
            while True:
                outcome = self._scheduler.schedule(request, model, skipped)
                if not isinstance(outcome, Rejection):
                    break
                silent = self._silent(outcome, unanswered or {}) & skipped
                if (silent or self._may_wait(outcome, model)) and self._clock() < deadline:
                    await asyncio.sleep(PLACEMENT_RETRY_S)
                    now = self._clock()
                    skipped -= {i for i in silent if unanswered[i].ask_at <= now}
                    continue
                span.set_attribute("crescent.rejected", outcome.reason.value)
                raise RejectedError(
                    with_refusals(outcome, refusals or {}, (unanswered or {}).keys())
                )
            self._scheduler.record(request, outcome, model)
            span.set_attribute("crescent.prefill", outcome.prefill.instance_id)
            span.set_attribute("crescent.decode", outcome.decode.instance_id)
            span.set_attribute("crescent.prefix_tokens", outcome.prefill.prefix_tokens)
            span.set_attribute("crescent.predicted_ttft_s", outcome.prefill.predicted_ttft_s)
            span.set_attribute("crescent.predicted_tbt_s", outcome.decode.predicted_tbt_s)
            span.set_attribute("crescent.prefill_on_decode", outcome.prefill_on_decode)
            return outcome

    def _silent(self, rejection: Rejection, unanswered: Mapping[str, Silence]) -> set[str]:
        """The decode instances worth waiting for when the policy found none to take the
        request: those silent for less than placement_wait_s. Silence is what a restarting
        instance, or one whose subscriptions a restarted NATS server has not got back yet,
        looks like for a moment while its telemetry still says it is live; an instance that
        answered with a refusal is not asked again."""
        if rejection.reason is not RejectReason.NO_DECODE:
            return set()
        now = self._clock()
        return {
            instance_id
            for instance_id, silence in unanswered.items()
            if now < silence.since + self._timeouts.placement_wait_s
        }

    def _may_wait(self, rejection: Rejection, model: str) -> bool:
        """No live instance of a role the model has registered instances of: one is slow or
        restarting, so wait for it. A decode side that is live but full is a 429 at once."""
        if rejection.reason is RejectReason.NO_PREFILL:
            return self._view.has_registered("prefill", model)
        if rejection.reason is RejectReason.NO_DECODE:
            return self._view.has_registered("decode", model) and not self._view.has_live(
                "decode", self._clock(), model
            )
        return False

    async def _reserve(
        self,
        decode_id: str,
        attempt_id: str,
        num_prompt_tokens: int,
        max_tokens: int,
        assignment: int,
        is_moved: bool = False,
    ) -> Refusal | None:
        """None once `decode_id` holds room for the attempt; otherwise why it does not."""
        reservation = Reservation(
            request_id=attempt_id,
            num_prompt_tokens=num_prompt_tokens,
            max_tokens=max_tokens,
            conductor=self._owner,
            assignment=assignment,
            is_moved=is_moved,
        )
        try:
            reply = await self._bus.request(
                self._subjects.decode_reserve(decode_id),
                reservation,
                ReservationReply,
                self._timeouts.reserve_s,
            )
        except RecoverableError as exc:
            log.warning("reserve failed", extra={"decode": decode_id, "error": str(exc)})
            return Refusal.of_error(exc)
        if reply.accepted:
            return None
        log.info("reserve refused", extra={"decode": decode_id, "reason": reply.reason})
        return Refusal(reply.reason or "refused")

    async def _prefill(
        self, request: ScheduleRequest, model: str, progress: Progress, decode: DecodeSide
    ) -> Prefilled:
        """The result (first token) of the first prefill instance that survives the job, with
        the decode attempt that instance started; or, when the policy has the decode instance
        compute the prompt (conditional disaggregation), that decode's attempt, started and
        acknowledged.

        The decode reservation and the prefill job go out together, so one round trip, not
        two, comes before the first token. A decode that refuses (its room went to another
        conductor's request) is left out, the job it raced is cancelled, and the policy is
        asked again: a refusal costs one wasted prefill, a rare event, where waiting for every
        reservation first cost every request a round trip."""
        gone = Gone(self._view, "prefill")
        refused: dict[str, str] = {}  # decode instance → why it refused this request
        unanswered: dict[str, Silence] = {}  # those of them that did not answer
        num_moves = 0
        num_jobs = 0  # each job its own id: a late cancel of one never stops the next
        while True:
            decision = await self.place(
                request, model, gone.ids() | refused.keys(), refused, unanswered
            )
            refused.pop(decision.decode.instance_id, None)  # asked again: it answers anew
            decode.instance_id = decision.decode.instance_id
            if decision.prefill_on_decode:
                started = await self._start_on_decode(request, progress, decode)
                if isinstance(started, Refusal):
                    self._refused(request, decision, decode, refused, unanswered, started)
                    continue
                metrics.PREFILL_ON_DECODE.inc()
                return Prefilled(None, started)
            prefill = decision.prefill
            # The stream and the start's answer are awaited before the job goes out: the
            # prefill instance sends the start, and the decode's first chunk may come before
            # the result.
            handed = self._hand_over(progress, decode)
            job_id = request.request_id if num_jobs == 0 else f"{request.request_id}-j{num_jobs}"
            num_jobs += 1
            job = PrefillJob(
                request_id=job_id,
                model=model,
                token_ids=progress.prompt,
                sampling=progress.sampling,
                decode_instance=decode.instance_id,
                decode_node=self._view.node_of("decode", decode.instance_id),
                block_size=request.block_size,
                source_node=prefill.source_node or "",
                pull_hashes=list(prefill.pull_hashes),
                planned_prefix_tokens=prefill.prefix_tokens,
                timeout_s=self._timeouts.prefill_s,
                conductor=self._owner,
                assignment=self._scheduler.assignment_number(
                    "prefill", prefill.instance_id, request.request_id
                ),
                decode_start=handed.start if handed is not None else None,
                ends_on_first=self._stop_tokens(progress.sampling) if handed is not None else [],
            )
            sent_at = self._clock()
            sent_to = self._presence.sent_to(
                "prefill", prefill.instance_id
            )  # the incarnation it goes to
            # A task, not a coroutine awaited later: it sends the job in the event loop's next
            # turn, while this task waits for the reservation, and one socket write carries both.
            prefilling = asyncio.ensure_future(
                self._bus.request(
                    self._subjects.prefill_job(prefill.instance_id),
                    job,
                    PrefillResult,
                    self._timeouts.prefill_s,
                )
            )
            prefilled_at: list[float] = []  # when the result came: the reservation may be later
            prefilling.add_done_callback(lambda _, at=prefilled_at: at.append(self._clock()))
            is_handed_over = False  # the attempt the prefill instance started is returned
            try:
                why_not = await self._reserve_for(request, decode)
                if why_not is not None:
                    await self._drop_job(prefilling, prefill.instance_id, request, job_id)
                    if handed is not None:  # its start may be on its way: a new attempt id
                        await self._cancel_decode(decode)
                        decode.attempt += 1
                    self._refused(request, decision, decode, refused, unanswered, why_not)
                    continue
                try:
                    result = await self._presence.wait(
                        "prefill", prefill.instance_id, prefilling, sent_to
                    )
                except (ConnectionLostError, InstanceLostError) as exc:
                    # The reply may be lost, the job may go on: ask. An instance that left the
                    # cluster is asked once it is back, if no other could take the job.
                    if isinstance(exc, InstanceLostError) and not await self._is_back(
                        request.request_id,
                        "prefill",
                        prefill.instance_id,
                        sent_to.started_at,
                        model,
                    ):
                        raise
                    prefilled_at.clear()  # the wait was cut off: no result came then
                    result = await prefill_result_after_drop(
                        self._bus,
                        self._subjects,
                        self._presence,
                        prefill.instance_id,
                        job_id,
                        sent_at,
                        self._timeouts.prefill_s,
                        self._timeouts.start_s,
                        self._clock,
                    )
                now = self._clock()
                reserve_wait_s = now - prefilled_at[0] if prefilled_at else 0.0
                if result.num_prompt_logprobs_left:
                    result = await whole_result(
                        self._bus,
                        self._subjects,
                        prefill.instance_id,
                        job_id,
                        result,
                        self._timeouts.start_s,
                    )
                self._scheduler.on_prefilled(
                    request, decision, result, now - sent_at, reserve_wait_s
                )
                started = handed.started(self._timeouts.start_s) if handed else None
                is_handed_over = True
                return Prefilled(result, started)
            except MOVABLE_ERRORS as exc:
                failure = not_to_move(exc)
                if failure is not None:
                    raise failure from exc
                if num_moves >= MAX_MIGRATIONS:
                    raise
                num_moves += 1
                self._migrated("prefill", request.request_id, prefill.instance_id, exc, 0)
                if not isinstance(exc, ConnectionLostError):
                    gone.add(prefill.instance_id, sent_to.started_at)
                if not isinstance(exc, NoRespondersError):
                    await self._cancel_prefill(prefill.instance_id, request.request_id, job_id)
                await self._cancel_decode(decode)  # before forget: it releases what was held
                self._scheduler.forget(request, decision)
                decode.instance_id = ""
                decode.attempt += 1
            except asyncio.CancelledError:
                prefilling.cancel()
                await self._cancel_prefill(prefill.instance_id, request.request_id, job_id)
                raise
            finally:
                if handed is not None and not is_handed_over:  # refused, moved or failed
                    await handed.drop()

    async def _is_back(
        self, request_id: str, role: str, instance_id: str, started_at: float | None, model: str
    ) -> bool:
        """Whether the instance that left the cluster while it held a request comes back in
        the same process (`started_at`: paused or cut off past its lease, not dead) within
        rejoin_wait_s, while no other live instance of its role could take the request over;
        False as soon as one could."""
        deadline = self._clock() + self._timeouts.rejoin_wait_s
        while True:
            if started_at is not None and self._view.started_at(role, instance_id) == started_at:
                self._rejoined(request_id, role, instance_id)
                return True
            if self._view.has_live(role, self._clock(), model) or self._clock() >= deadline:
                return False
            await asyncio.sleep(PLACEMENT_RETRY_S)

    def _rejoined(self, request_id: str, role: str, instance_id: str) -> None:
        log.info(
            "instance back; reading on from it",
            extra={"request_id": request_id, "role": role, "instance_id": instance_id},
        )
        metrics.REJOINS.labels(role).inc()

    def _hand_over(self, progress: Progress, decode: DecodeSide) -> HandedStart | None:
        """The decode's start for the prefill instance to send, with its token stream and its
        answer awaited from now on; None where the conductor starts the decode itself."""
        start = progress.start_after_prefill(decode.attempt_id, self._owner)
        if start is None:
            return None
        subject = self._subjects.decode_start(decode.instance_id)
        stream = self._streams.open(self._subjects.tokens(decode.attempt_id, self._owner))
        answer = self._started.expect(
            self._subjects.start_reply(decode.attempt_id, self._owner), subject
        )
        return HandedStart(
            start, subject, stream, answer, self._presence.sent_to("decode", decode.instance_id)
        )

    async def _start_on_decode(
        self, request: ScheduleRequest, progress: Progress, decode: DecodeSide
    ) -> Attempt | Refusal:
        """Start the decode on a prompt it computes itself, admitted on arrival as a
        reservation would be; why not, when it refused or did not answer. One that did not
        answer may have started: it is cancelled, and the request's next attempt streams
        under a new id."""
        number = self._scheduler.assignment_number("decode", decode.instance_id, request.request_id)
        attempt = self._begin(decode, progress, admit_as=number)
        try:
            await self._presence.wait(
                "decode", decode.instance_id, attempt.starting, attempt.sent_to
            )
        except RecoverableError as exc:
            await attempt.close()
            if isinstance(exc, RemoteError) and exc.code == START_REFUSED:
                log.info("start refused", extra={"decode": decode.instance_id, "reason": str(exc)})
            else:
                log.warning("start failed", extra={"decode": decode.instance_id, "error": str(exc)})
                await self._cancel_decode(decode)
                decode.attempt += 1
            return Refusal.of_error(exc)
        except asyncio.CancelledError:
            await attempt.close()
            raise
        return attempt

    async def _reserve_for(self, request: ScheduleRequest, decode: DecodeSide) -> Refusal | None:
        return await self._reserve(
            decode.instance_id,
            decode.attempt_id,
            request.num_prompt_tokens,
            request.max_tokens,
            self._scheduler.assignment_number("decode", decode.instance_id, request.request_id),
        )

    def _refused(
        self,
        request: ScheduleRequest,
        decision: Decision,
        decode: DecodeSide,
        refused: dict[str, str],
        unanswered: dict[str, Silence],
        refusal: Refusal,
    ) -> None:
        """The decode instance of `decision` did not take the request: place it again without
        that instance (asking it again later only if it gave no answer)."""
        metrics.DECODE_REFUSALS.inc()
        self._scheduler.forget(request, decision)
        refused[decode.instance_id] = refusal.reason
        if refusal.is_unanswered:
            silence = unanswered.get(decode.instance_id)
            now = self._clock()
            unanswered[decode.instance_id] = silence.again(now) if silence else Silence.first(now)
        else:
            unanswered.pop(decode.instance_id, None)
        decode.instance_id = ""

    async def _drop_job(
        self, prefilling: asyncio.Future, instance_id: str, request: ScheduleRequest, job_id: str
    ) -> None:
        """Stop waiting for a prefill job whose decode refused the request, and tell the
        prefill instance to stop it; what it computed (if it finished) is not used."""
        if not prefilling.done():
            prefilling.cancel()
            await self._cancel_prefill(instance_id, request.request_id, job_id)
        await asyncio.gather(prefilling, return_exceptions=True)

    async def _decode(
        self,
        request: ScheduleRequest,
        model: str,
        progress: Progress,
        decode: DecodeSide,
        attempt: Attempt | None = None,
    ) -> AsyncIterator[TokenEvent]:
        """Stream from the decode instance (`attempt`: its start already sent); when it is
        lost, go on from where it stopped on another one, within MAX_MIGRATIONS moves, or read
        on from the same one when it comes back (`_move_decode`)."""
        lost = Gone(self._view, "decode")
        num_moves = 0
        reading: StreamReading | None = None
        while True:
            attempt = attempt or self._begin(decode, progress)
            reading = reading or StreamReading.of(decode, progress, attempt)
            try:
                stream = self._stream_from(decode, progress, attempt, reading)
                async with aclosing(stream) as events:
                    async for event in events:
                        yield event
                return
            except MOVABLE_ERRORS as exc:
                if num_moves >= MAX_MIGRATIONS:
                    raise
                num_moves += 1
                self._migrated(
                    "decode", request.request_id, decode.instance_id, exc, len(progress.generated)
                )
                if not isinstance(exc, ConnectionLostError):
                    lost.add(decode.instance_id, attempt.sent_to.started_at)
                may_rejoin = isinstance(exc, InstanceLostError) and self._timeouts.rejoin_wait_s > 0
            finally:
                await attempt.close()
            if await self._move_decode(request, model, progress, decode, lost, may_rejoin):
                attempt, reading = None, None
            else:
                attempt = self._rejoin(decode, reading)

    def _rejoin(self, decode: DecodeSide, reading: StreamReading) -> Attempt:
        """Read the attempt's stream again, from the decode that left the cluster and came
        back: the chunks it sent meanwhile are asked for again (it keeps them), so the stream
        goes on where it stopped and nothing is computed again."""
        self._rejoined(decode.request_id, "decode", decode.instance_id)
        stream = self._streams.open(self._subjects.tokens(decode.attempt_id, self._owner))
        reading.order.lost_since_read()
        started = asyncio.get_running_loop().create_future()
        started.set_result(None)
        return Attempt(stream, self._presence.sent_to("decode", decode.instance_id), started)

    def _begin(
        self, decode: DecodeSide, progress: Progress, admit_as: int | None = None
    ) -> Attempt:
        """Open the token stream of decode's current attempt, then send its start; with
        `admit_as` (an assignment number), a start to be admitted without a reservation."""
        stream = self._streams.open(self._subjects.tokens(decode.attempt_id, self._owner))
        start = progress.decode_start(decode.attempt_id, self._owner)
        if admit_as is not None:
            start = msgspec.structs.replace(
                start, admit=True, conductor=self._owner, assignment=admit_as
            )
        starting = asyncio.ensure_future(
            self._bus.request(
                self._subjects.decode_start(decode.instance_id),
                start,
                Ack,
                self._timeouts.start_s,
            )
        )
        return Attempt(stream, self._presence.sent_to("decode", decode.instance_id), starting)

    async def _stream_from(
        self, decode: DecodeSide, progress: Progress, attempt: Attempt, reading: StreamReading
    ) -> AsyncIterator[TokenEvent]:
        decode_id = decode.instance_id
        stream = attempt.stream
        try:
            await self._presence.wait("decode", decode_id, attempt.starting, attempt.sent_to)
        except RequestTimeoutError as exc:  # nothing was generated on it: as good as gone
            raise StreamBrokenError(
                f"decode {decode_id} did not acknowledge the start: {exc}"
            ) from exc
        except ConnectionLostError:
            pass  # the answer may be lost: the stream's first resend tells if the start came
        self._scheduler.on_decode_started(decode.request_id)
        steady = SteadyGaps(self._view.stale_window_s("decode", decode_id))
        order, replay = reading.order, reading.replay
        while True:
            if order.needs_resend(self._bus.epoch):
                order.on_resent(
                    *await resent_chunks(
                        self._bus,
                        self._subjects,
                        self._presence,
                        decode_id,
                        decode.attempt_id,
                        order.expected_seq,
                        self._timeouts.start_s,
                    )
                )
            try:
                chunk = order.resent_chunk() or await self._presence.next_chunk(
                    decode_id, stream, self._timeouts.token_gap_s
                )
            except RequestTimeoutError as exc:  # live, yet its stream is lost: go on elsewhere
                raise StreamBrokenError(
                    f"no token from decode {decode_id} within {self._timeouts.token_gap_s}s"
                ) from exc
            except ConnectionLostError:  # ask for what the drop may have lost, then read on
                continue
            if not order.is_next(chunk):
                continue
            if chunk.error:
                if chunk.error_code == INVALID_REQUEST:  # any other instance would refuse it too
                    raise RequestRefusedError(chunk.error)
                raise StreamBrokenError(f"decode {decode_id} failed: {chunk.error}")
            if chunk.num_cached_tokens is not None:  # the decode computed the prompt
                self._scheduler.on_computed_on_decode(
                    decode.request_id, len(progress.prompt), chunk.num_cached_tokens
                )
            steady.on_chunk(len(chunk.token_ids), chunk.step_at)
            token_ids, logprobs = replay.new_part(chunk.token_ids, chunk.logprobs, chunk.is_final)
            progress.generated.extend(token_ids)
            if chunk.is_final:
                decode.is_finished = True
                measured_tbt_s = steady.mean_gap_s()
                if measured_tbt_s is not None and not decode.is_moved:
                    self._scheduler.on_decoded(decode.request_id, measured_tbt_s)
            if token_ids or chunk.is_final:
                yield TokenEvent(
                    token_ids,
                    chunk.finish_reason if chunk.is_final else None,
                    logprobs,
                    num_cached_tokens=chunk.num_cached_tokens,
                )
            if chunk.is_final:
                return

    async def _move_decode(
        self,
        request: ScheduleRequest,
        model: str,
        progress: Progress,
        decode: DecodeSide,
        lost: Gone,
        may_rejoin: bool,
    ) -> bool:
        """Reserve room for the next attempt on another live decode instance, then release the
        old one; True once moved. `may_rejoin`: the old one left the cluster, which a process
        paused or cut off past its lease does too; while no other instance takes the request,
        it is waited for (rejoin_wait_s), and False is returned if it comes back in the same
        process: its stream reads on there."""
        old_id = decode.instance_id
        start = progress.decode_start(decode.next_attempt_id)
        excluded = lost.ids()
        refused: dict[str, str] = {}  # since the last retry
        now = self._clock()
        deadline = now + self._timeouts.placement_wait_s
        if may_rejoin:
            deadline = max(deadline, now + self._timeouts.rejoin_wait_s)
        while True:
            choice = self._scheduler.schedule_decode(request, model, excluded)
            if isinstance(choice, DecodeChoice):
                number = self._view.next_number()
                why_not = await self._reserve(
                    choice.instance_id,
                    decode.next_attempt_id,
                    len(start.token_ids) + 1,
                    start.max_tokens - 1,
                    number,
                    is_moved=True,
                )
                if why_not is None:
                    break
                excluded.add(choice.instance_id)
                refused[choice.instance_id] = why_not.reason
            elif may_rejoin and lost.is_back(old_id):
                return False
            elif self._clock() >= deadline:
                await self._cancel_decode(decode)
                decode.instance_id = ""
                raise RejectedError(with_refusals(choice, refused, failed=lost.ids()))
            else:
                await asyncio.sleep(PLACEMENT_RETRY_S)
                excluded = lost.ids()
                refused = {}
        await self._cancel_decode(decode)
        decode.attempt += 1
        decode.instance_id = choice.instance_id
        decode.is_moved = True
        self._scheduler.move_decode(request, old_id, choice.instance_id, number)
        return True

    def _migrated(
        self, stage: str, request_id: str, instance_id: str, cause: Exception, num_generated: int
    ) -> None:
        metrics.MIGRATIONS.labels(stage, type(cause).__name__).inc()
        with tracer().start_as_current_span("conductor.migrate") as span:
            span.set_attribute("crescent.stage", stage)
            span.set_attribute("crescent.from_instance", instance_id)
            span.set_attribute("crescent.cause", str(cause))
            span.set_attribute("crescent.num_generated_tokens", num_generated)
        log.warning(
            "moving request to another instance",
            extra={
                "request_id": request_id,
                "stage": stage,
                "instance_id": instance_id,
                "cause": str(cause),
                "num_generated_tokens": num_generated,
            },
        )

    def _finish_on_first(self, token: int, max_tokens: int, sampling: SamplingParams) -> str | None:
        if token in self._stop_tokens(sampling):
            return "stop"
        if max_tokens <= 1:
            return "length"
        return None

    def _stop_tokens(self, sampling: SamplingParams) -> list[int]:
        """The tokens that end the answer when generated: its stop tokens and, unless it
        ignores it, the model's end of sequence."""
        eos = self._eos_token_id
        if sampling.ignore_eos or not isinstance(eos, int) or eos < 0:
            return list(sampling.stop_token_ids)
        return [*sampling.stop_token_ids, eos]

    async def _cancel_decode(self, decode: DecodeSide) -> None:
        """The cancel is numbered: until a report acknowledges it, the view takes the room off
        what the instance reports (ClusterView.release)."""
        number = self._view.release("decode", decode.instance_id, decode.request_id)
        await self._publish(
            self._subjects.decode_cancel(decode.instance_id),
            DecodeCancel(request_id=decode.attempt_id, conductor=self._owner, assignment=number),
        )

    async def _cancel_prefill(self, instance_id: str, request_id: str, job_id: str) -> None:
        """Release the request's place on the instance and stop its job `job_id` there."""
        number = self._view.release("prefill", instance_id, request_id)
        await self._publish(
            self._subjects.prefill_cancel(instance_id),
            PrefillCancel(request_id=job_id, conductor=self._owner, assignment=number),
        )

    async def _publish(self, subject: str, message: DecodeCancel | PrefillCancel) -> None:
        try:
            await self._bus.publish(subject, message)
        except CrescentError as exc:
            log.warning("cancel not sent", extra={"subject": subject, "error": str(exc)})
        except Exception as exc:  # the connection may be closing during shutdown
            log.warning("cancel not sent", extra={"subject": subject, "error": repr(exc)})


def with_refusals(
    rejection: Rejection,
    refusals: Mapping[str, str],
    unanswered: Collection[str] = (),
    failed: Collection[str] = (),
) -> Rejection:
    """A rejection for want of a decode instance, saying which instances failed the request
    (`failed`, mid-stream) and why those that were asked did not take it: the policy saw only
    the others, and "no room" alone would misname a refusal for TBT, or a failure. When none of
    them answered (`unanswered`: silent, gone or failed), the cause is the instances' failure,
    not load: unavailable (503), not a 429."""
    if rejection.reason is not RejectReason.NO_DECODE or not (refusals or failed):
        return rejection
    why = [f"{instance} failed it mid-stream" for instance in sorted(failed)]
    why += [
        f"{instance} {'did not answer' if instance in unanswered else 'refused it'}: {reason}"
        for instance, reason in refusals.items()
    ]
    is_unavailable = all(instance in unanswered for instance in refusals)
    detail = rejection.detail.replace("no live decode instance", "no other live decode instance")
    return dataclasses.replace(
        rejection, detail="; ".join([*why, detail]), is_unavailable=is_unavailable
    )
