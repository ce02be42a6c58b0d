"""Work read on across a NATS reconnect, not done again: a token stream, and a prefill job's
result.

A token stream: chunks the decode sent while this conductor's connection was down, or that
were on the way when it dropped, may never arrive. The decode instance keeps every chunk of its
streams for a while (decode/chunking.SentStreams), so the conductor asks it for those from the
first one it lacks and reads on: the request keeps its decode instance and nothing is computed
again. Only when the decode cannot answer (gone, restarted, or unreachable past the deadline)
is the request moved to another one.

A prefill job: its reply may be lost in the drop while the job goes on, so the conductor asks
the prefill instance for the job's result (prefill/outcomes.py), waiting while it computes,
and moves the request only when the instance does not know the job or does not answer."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from crescent.common.bus import Bus
from crescent.common.errors import (
    ConnectionLostError,
    NoRespondersError,
    RemoteError,
    RequestTimeoutError,
)
from crescent.common.messages import (
    PrefillResult,
    PrefillResultAsk,
    ResendTokens,
    ResentTokens,
    TokenChunk,
)
from crescent.common.naming import Subjects
from crescent.common.tracing import tracer
from crescent.conductor import metrics
from crescent.conductor.flow_errors import JOB_RUNNING, JOB_UNKNOWN, StreamBrokenError
from crescent.conductor.flow_state import FIRST_ASK_AGAIN_S
from crescent.conductor.presence import Presence

log = logging.getLogger(__name__)

RESULT_ASK_WAIT_S = 1.0  # how long the prefill instance holds an ask for a job not yet done
MOST_ASK_AGAIN_S = 1.0  # the longest pause between asks of a silent instance


class ChunkOrder:
    """Which chunk of one stream comes next: in order, each once, across resends. The stream
    is known whole on connection `read_epoch`; a chunk past a gap, or a drop since, calls for
    a resend from `expected_seq` before reading on."""

    def __init__(self, stream_id: str, read_epoch: int) -> None:
        self.stream_id = stream_id
        self.expected_seq = 0
        self.read_epoch = read_epoch
        self._skipped_to: int | None = None  # a chunk seen past a gap
        self._resent: deque[TokenChunk] = deque()  # chunks sent again, read before the stream
        # chunks still to ask for: more followed those resent than one message held, or the
        # stream went unread a while
        self._asks_on = False

    def lost_since_read(self) -> None:
        """The stream was not read for a while (its decode left the cluster and came back):
        what it sent meanwhile is to be asked for."""
        self._asks_on = True

    def needs_resend(self, epoch: int) -> bool:
        """Whether chunks may have been lost, now that the connection is `epoch` or after the
        stream went unread (`lost_since_read`), or the last resend's rest is still to ask for."""
        return not self._resent and (
            self._asks_on or self._skipped_to is not None or epoch != self.read_epoch
        )

    def on_resent(self, epoch: int, chunks: list[TokenChunk], num_left: int = 0) -> None:
        """The decode's answer, asked on connection `epoch`: the chunks from `expected_seq`,
        every one, or the first of them and `num_left` more to ask for once these are read."""
        if self._skipped_to is not None and not chunks:
            raise StreamBrokenError(
                f"token stream of {self.stream_id} skipped from {self.expected_seq} to "
                f"{self._skipped_to}, and its decode resent nothing"
            )
        self.read_epoch = epoch
        self._skipped_to = None
        self._asks_on = num_left > 0
        self._resent.extend(chunks)

    def resent_chunk(self) -> TokenChunk | None:
        return self._resent.popleft() if self._resent else None

    def is_next(self, chunk: TokenChunk) -> bool:
        """True for the chunk due next (then the one after it is due); False for one read
        already (it came both on the stream and in a resend) or one past a gap."""
        if chunk.seq == self.expected_seq:
            self.expected_seq += 1
            return True
        if chunk.seq > self.expected_seq:  # those before it were lost on the way
            self._skipped_to = chunk.seq
        return False


async def resent_chunks(
    bus: Bus,
    subjects: Subjects,
    presence: Presence,
    decode_id: str,
    stream_id: str,
    from_seq: int,
    deadline_s: float,
) -> tuple[int, list[TokenChunk], int]:
    """The connection epoch the ask went out on, the chunks of `stream_id` from `from_seq` on
    (as many as one message holds) and how many more follow them. Asked again, at doubling
    intervals, while the decode does not answer (it may reconnect after this conductor, or
    resubscribe late); ConnectionLostError when it cannot resend within `deadline_s` on the
    heard clock (a NATS outage is not the decode's silence); InstanceLostError when it left
    the cluster meanwhile."""
    ask = ResendTokens(request_id=stream_id, from_seq=from_seq)
    clock = presence.heard_clock
    deadline = clock() + deadline_s
    wait_s = FIRST_ASK_AGAIN_S
    with tracer().start_as_current_span("conductor.resend") as span:
        span.set_attribute("crescent.decode_instance", decode_id)
        span.set_attribute("crescent.from_seq", from_seq)
        while True:
            sent = presence.sent_to("decode", decode_id)
            asking = bus.request(
                subjects.decode_resend(decode_id), ask, ResentTokens, max(deadline - clock(), 0.01)
            )
            try:
                reply = await presence.wait("decode", decode_id, asking, sent)
            except (NoRespondersError, RequestTimeoutError, ConnectionLostError) as exc:
                if clock() + wait_s >= deadline:
                    metrics.STREAM_RESENDS.labels("unanswered").inc()
                    raise ConnectionLostError(
                        f"decode {decode_id} did not resend the chunks of {stream_id} after the "
                        f"NATS connection dropped: {exc}"
                    ) from exc
                await asyncio.sleep(wait_s)
                wait_s = min(wait_s * 2, MOST_ASK_AGAIN_S)
                continue
            except RemoteError:
                metrics.STREAM_RESENDS.labels("refused").inc()
                raise
            if not reply.is_known:
                metrics.STREAM_RESENDS.labels("unknown").inc()
                raise ConnectionLostError(
                    f"decode {decode_id} has no stream {stream_id} to resend after the NATS "
                    "connection dropped"
                )
            metrics.STREAM_RESENDS.labels("resent").inc()
            span.set_attribute("crescent.num_chunks", len(reply.chunks))
            log.info(
                "token stream read on after chunks may have been lost",
                extra={
                    "request_id": stream_id,
                    "decode": decode_id,
                    "from_seq": from_seq,
                    "num_resent": len(reply.chunks),
                    "num_left": reply.num_chunks_left,
                },
            )
            return sent.epoch, reply.chunks, reply.num_chunks_left


async def prefill_result_after_drop(
    bus: Bus,
    subjects: Subjects,
    presence: Presence,
    prefill_id: str,
    job_id: str,
    sent_at: float,
    timeout_s: float,
    unanswered_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> PrefillResult:
    """The result of job `job_id`, asked of its prefill instance after this conductor's NATS
    connection dropped while it waited for the reply. Waits while the job is queued or
    computing, until the job's own deadline (sent at `sent_at` on `clock`, with `timeout_s`:
    RequestTimeoutError past it, as the job's request would have); ConnectionLostError when
    the instance does not know the job or gives no answer for `unanswered_s` on the heard
    clock (a NATS outage is not the instance's silence); the job's own error (RemoteError) if
    it failed."""
    subject = subjects.prefill_result(prefill_id)
    deadline = sent_at + timeout_s
    silent_since: float | None = None
    again_s = FIRST_ASK_AGAIN_S
    with tracer().start_as_current_span("conductor.prefill_result") as span:
        span.set_attribute("crescent.prefill_instance", prefill_id)
        span.set_attribute("crescent.job_id", job_id)
        while True:
            remaining_s = deadline - clock()
            if remaining_s <= 0:
                raise RequestTimeoutError(subjects.prefill_job(prefill_id), timeout_s)
            wait_s = min(RESULT_ASK_WAIT_S, remaining_s)
            ask = PrefillResultAsk(request_id=job_id, wait_s=wait_s)
            sent = presence.sent_to("prefill", prefill_id)
            asking = bus.request(subject, ask, PrefillResult, wait_s + RESULT_ASK_WAIT_S)
            try:
                result = await presence.wait("prefill", prefill_id, asking, sent)
            except RemoteError as exc:
                if exc.code == JOB_RUNNING:
                    silent_since = None
                    continue
                outcome = "unknown" if exc.code == JOB_UNKNOWN else "failed"
                metrics.PREFILL_RESULT_ASKS.labels(outcome).inc()
                if exc.code == JOB_UNKNOWN:
                    raise ConnectionLostError(str(exc)) from exc
                raise
            except (NoRespondersError, RequestTimeoutError, ConnectionLostError) as exc:
                heard_now = presence.heard_clock()
                silent_since = silent_since if silent_since is not None else heard_now
                if heard_now + again_s >= silent_since + unanswered_s:
                    metrics.PREFILL_RESULT_ASKS.labels("unanswered").inc()
                    raise ConnectionLostError(
                        f"prefill {prefill_id} gave no result of job {job_id} after the NATS "
                        f"connection dropped: {exc}"
                    ) from exc
                await asyncio.sleep(again_s)
                again_s = min(again_s * 2, MOST_ASK_AGAIN_S)
                continue
            metrics.PREFILL_RESULT_ASKS.labels("answered").inc()
            log.info(
                "prefill result read after the NATS connection dropped",
                extra={"request_id": job_id, "prefill": prefill_id},
            )
            return result
