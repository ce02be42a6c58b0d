"""A token stream read on across a NATS reconnect. Chunks the decode sent while this
conductor's connection was down, or that were on the way when it dropped, may never arrive.
The decode instance keeps every chunk of its streams for a while (decode/chunking.SentStreams),
so the conductor asks it for those from the first one it lacks and reads on: the request keeps
its decode instance and nothing is computed again. Only when the decode cannot answer (gone,
restarted, or unreachable past the deadline) is the request moved to another one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from crescent.common.bus import Bus
from crescent.common.errors import (
    ConnectionLostError,
    NoRespondersError,
    RemoteError,
    RequestTimeoutError,
)
from crescent.common.messages import ResendTokens, ResentTokens, TokenChunk
from crescent.common.naming import Subjects
from crescent.common.tracing import tracer
from crescent.conductor import metrics
from crescent.conductor.flow_state import FIRST_ASK_AGAIN_S
from crescent.conductor.presence import Presence


async def resent_chunks(
    bus: Bus,
    subjects: Subjects,
    presence: Presence,
    decode_id: str,
    stream_id: str,
    from_seq: int,
    deadline_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int, list[TokenChunk]]:
    """The connection epoch the ask went out on and the chunks of `stream_id` from `from_seq`
    on. Asked again, at doubling intervals, while the decode does not answer (it may reconnect
    after this conductor, or resubscribe late); ConnectionLostError when it cannot resend
    within `deadline_s`; InstanceLostError when it left the cluster meanwhile."""
    ask = ResendTokens(request_id=stream_id, from_seq=from_seq)
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
                wait_s *= 2
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
            return sent.epoch, reply.chunks
