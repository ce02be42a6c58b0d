"""Waits that give up as soon as the instance they wait on is gone: a request is moved the
moment its instance leaves the registry, is replaced by a restarted process under the same id,
or the NATS connection it was sent on drops (what was due may be lost), instead of waiting out
its deadline. A slow instance, one with stale telemetry, is waited for: slow is not dead."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from crescent.common.bus import Bus, Stream
from crescent.common.errors import ConnectionLostError, RequestTimeoutError
from crescent.common.messages import TokenChunk
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.flow_errors import InstanceLostError
from crescent.conductor.flow_state import SentTo

PRESENCE_CHECK_S = 0.25
T = TypeVar("T")


class Presence:
    def __init__(self, bus: Bus, view: ClusterView) -> None:
        self._bus = bus
        self._view = view

    def sent_to(self, role: str, instance_id: str) -> SentTo:
        """The connection and the instance's incarnation now, as a message sent now finds them."""
        return SentTo(self._bus.epoch, self._view.started_at(role, instance_id))

    async def wait(
        self, role: str, instance_id: str, step: Awaitable[T], sent: SentTo | None = None
    ) -> T:
        """Await `step` while its instance is present. `sent`: the instance and connection as
        they were when the step's message went out, for a step started earlier."""
        sent = sent or self.sent_to(role, instance_id)
        task = asyncio.ensure_future(step)
        try:
            while True:
                done, _ = await asyncio.wait([task], timeout=PRESENCE_CHECK_S)
                if done:
                    return task.result()
                self._check(role, instance_id, sent)
        finally:
            task.cancel()

    async def next_chunk(self, decode_id: str, stream: Stream, deadline_s: float) -> TokenChunk:
        """The stream's next chunk within `deadline_s` of silence the decode answers for. It
        checks between short waits on the stream instead of running the wait as a task: chunks
        are frequent.

        The deadline runs on the view's heard clock: while this conductor hears no instance at
        all (NATS stalled or down; chunks wait in the server or are kept by the decode for a
        resend), the silence is not the decode's. A move then would only find every instance
        silent too, and fail a stream that goes on once NATS does."""
        sent = self.sent_to("decode", decode_id)
        started = self.heard_clock()
        left_s = deadline_s
        while True:
            try:
                return await stream.next(min(PRESENCE_CHECK_S, left_s))
            except RequestTimeoutError:
                left_s = deadline_s - (self.heard_clock() - started)
                if left_s <= 0:
                    raise
            self._check("decode", decode_id, sent)

    def heard_clock(self) -> float:
        """The view's clock that stops while no instance at all is heard (ClusterView)."""
        return self._view.heard_clock()

    def _check(self, role: str, instance_id: str, sent: SentTo) -> None:
        if self._view.started_at(role, instance_id) != sent.started_at:  # gone, or a new process
            raise InstanceLostError(f"{role} instance {instance_id} left the cluster mid-request")
        if self._bus.epoch != sent.epoch:
            raise ConnectionLostError(
                f"the NATS connection dropped while waiting on {role} {instance_id}"
            )
