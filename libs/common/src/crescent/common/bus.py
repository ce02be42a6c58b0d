"""The NATS control bus: typed request/reply with deadlines, supervised handlers, streams.

Every request and publish carries the caller's W3C trace context in NATS headers, and every
handler runs inside the context it received, so one client request is one trace across
services. A handler that raises answers with an ErrorReply and the service keeps serving.

A request whose connection drops before its reply came fails at once (ConnectionLostError):
the request or its reply may be gone, and waiting out the deadline would hold the caller (a
vLLM engine thread waiting on its store, say) for nothing. nats-py itself waits it out.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from opentelemetry import context as otel_context

from crescent.common import tracing
from crescent.common.codec import Message, decode, encode
from crescent.common.errors import (
    ConnectionLostError,
    CrescentError,
    MessageError,
    NoRespondersError,
    RemoteError,
    RequestTimeoutError,
    UnreachableError,
)
from crescent.common.messages import REPLY_TOO_LARGE, ErrorReply

log = logging.getLogger(__name__)

R = TypeVar("R")
FLUSH_TIMEOUT_S = 5.0
# A connection whose server answers no PING for about (1 + MAX_OUTSTANDING_PINGS) intervals is
# dropped and opened again. Without it, a connection whose writes stopped (NATS stalled until
# the socket's send queue filled) can stay stuck after the server resumes: the kernel probes
# the closed window with a backoff that reached 26 s after a 35 s stall, and holds every
# message until then while the rest of the cluster has moved on.
PING_INTERVAL_S = 2.0
MAX_OUTSTANDING_PINGS = 2
DEFAULT_RECONNECT_BUFFER_BYTES = 2 << 20  # nats-py's own default

Handler = Callable[[Any], Awaitable[Message | None]]


class Stream:
    """An ordered subscription read with a deadline per message.

    Messages are kept as they arrive (nats.py calls `deliver` in order) and `next` takes
    one that is there without waiting; only an empty stream waits, on a future with a timer.
    (nats.py's own next_msg starts two tasks and draws a UUID per message.)
    """

    def __init__(
        self, subject: str, message_type: Any, on_close: Callable[[], None] | None = None
    ) -> None:
        self.subject = subject
        self._message_type = message_type
        self._arrived: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._on_close = on_close  # a stream of a StreamGroup leaves it; others unsubscribe
        self.subscription: Subscription | None = None  # set once subscribed

    async def deliver(self, msg: Msg) -> None:
        self.push(msg.data)

    def push(self, data: bytes) -> None:
        self._arrived.append(data)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next(self, timeout_s: float) -> Any:
        if not self._arrived:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._waiter
            except TimeoutError as exc:
                raise RequestTimeoutError(self.subject, timeout_s) from exc
            finally:
                self._waiter = None
        return decode(self._arrived.popleft(), self._message_type)

    async def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
        if self.subscription is None:
            return
        try:
            await self.subscription.unsubscribe()
        except nats.errors.ConnectionClosedError:
            pass


class StreamGroup:
    """Many streams through one wildcard subscription, each a subject it matches: a stream
    costs no SUB and UNSUB of its own (two NATS writes and a server round of work per request
    on the conductor). Messages for a subject no stream is open on are dropped."""

    def __init__(self, message_type: Any) -> None:
        self._message_type = message_type
        self._streams: dict[str, Stream] = {}

    async def deliver(self, msg: Msg) -> None:
        stream = self._streams.get(msg.subject)
        if stream is not None:
            stream.push(msg.data)

    def open(self, subject: str) -> Stream:
        """A stream of `subject`, which must match the group's subscription."""
        if subject in self._streams:
            raise ValueError(f"a stream of {subject} is already open")
        stream = Stream(
            subject, self._message_type, on_close=lambda: self._streams.pop(subject, None)
        )
        self._streams[subject] = stream
        return stream


class Replies:
    """Replies to requests that another service sends on this one's behalf, through one
    wildcard subscription: a prefill instance sends the decode its start, and the decode's
    answer comes here. Each expected reply is a future; replies nobody expects are dropped.
    The server's "no responders" status goes only to the sender's own subscriptions, so a
    request nobody received is known by its deadline (`within`)."""

    def __init__(self, reply_type: Any) -> None:
        self._reply_type = reply_type
        self._due: dict[str, tuple[asyncio.Future, str]] = {}

    def expect(self, reply_subject: str, request_subject: str) -> asyncio.Future:
        """A future for the reply that comes on `reply_subject` (which must match the
        subscription) to a request sent on `request_subject`: it raises as Bus.request would.
        Cancelling it stops the wait."""
        if reply_subject in self._due:
            raise ValueError(f"a reply on {reply_subject} is already expected")
        due: asyncio.Future = asyncio.get_running_loop().create_future()
        self._due[reply_subject] = (due, request_subject)
        due.add_done_callback(lambda _: self._due.pop(reply_subject, None))
        return due

    async def deliver(self, msg: Msg) -> None:
        expected = self._due.get(msg.subject)
        if expected is None or expected[0].done():
            return
        due, request_subject = expected
        try:
            due.set_result(_reply_of(msg.data, self._reply_type, request_subject))
        except (MessageError, RemoteError) as exc:
            due.set_exception(exc)


def _not_sent(subject: str) -> ConnectionLostError:
    """What a send while disconnected raises once nats-py's buffer for the reconnect is full."""
    return ConnectionLostError(
        f"not sent on {subject}: NATS is disconnected and the messages held for the reconnect "
        "fill their buffer"
    )


def _reply_of(data: bytes, reply_type: Any, request_subject: str) -> Any:
    """A reply decoded as `reply_type`; an ErrorReply raises RemoteError."""
    reply = decode(data, reply_type | ErrorReply)
    if isinstance(reply, ErrorReply):
        raise RemoteError(request_subject, reply.code, reply.message)
    return reply


async def within(reply: asyncio.Future, subject: str, timeout_s: float) -> Any:
    """`reply` (Replies.expect) within `timeout_s`, or RequestTimeoutError."""
    try:
        async with asyncio.timeout(timeout_s):
            return await reply
    except TimeoutError as exc:
        raise RequestTimeoutError(subject, timeout_s) from exc


class Bus:
    def __init__(self, client: NatsClient) -> None:
        self._client = client
        self._handler_tasks: set[asyncio.Task] = set()
        self._is_draining = False
        # The connection a message sent now goes out on: 0 is the first, and a drop moves on to
        # the next at once (nats-py holds what is sent until it reconnects). A reply or chunk
        # due on an earlier connection may be lost.
        self.epoch = 0
        self._lost = asyncio.get_running_loop().create_future()  # done when this connection drops

    @classmethod
    async def connect(
        cls,
        url: str,
        name: str,
        timeout_s: float = 10.0,
        reconnect_buffer_bytes: int = DEFAULT_RECONNECT_BUFFER_BYTES,
    ) -> Bus:
        """Connect within `timeout_s` or raise UnreachableError; once connected, nats-py
        reconnects forever (it would also retry the first connection forever, hence the
        outer deadline), holding up to `reconnect_buffer_bytes` of what is sent meanwhile."""
        attempts = 0
        bus: Bus | None = None

        async def on_disconnected() -> None:
            if bus is not None:
                bus._on_connection_lost()
            if bus is not None and bus._is_draining:
                log.info("NATS connection closed")
            else:
                log.warning("NATS disconnected")

        async def on_reconnected() -> None:
            log.info("NATS reconnected")

        async def on_error(exc: Exception) -> None:
            nonlocal attempts
            attempts += 1
            log.warning("NATS error", extra={"error": repr(exc)})

        try:
            async with asyncio.timeout(timeout_s):
                client = await nats.connect(
                    servers=url.split(","),
                    name=name,
                    connect_timeout=min(2.0, timeout_s),
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    ping_interval=PING_INTERVAL_S,
                    max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                    pending_size=reconnect_buffer_bytes,
                    error_cb=on_error,
                    disconnected_cb=on_disconnected,
                    reconnected_cb=on_reconnected,
                )
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            raise UnreachableError("NATS", url, max(attempts, 1), repr(exc)) from exc
        bus = cls(client)
        return bus

    @property
    def is_connected(self) -> bool:
        return self._client.is_connected

    @property
    def max_payload(self) -> int:
        """The largest message the server takes, in bytes (its `max_payload`)."""
        return self._client.max_payload

    def _on_connection_lost(self) -> None:
        """End the waits of the requests sent on the connection that dropped; requests sent
        from now on go out on the next one (nats-py holds them until it reconnects)."""
        self.epoch += 1
        lost, self._lost = self._lost, asyncio.get_running_loop().create_future()
        lost.set_result(None)

    async def request(
        self, subject: str, message: Message, reply_type: Any, timeout_s: float
    ) -> Any:
        """Send `message` and decode the reply as `reply_type`; an ErrorReply raises RemoteError,
        a connection that drops before the reply raises ConnectionLostError."""
        headers = tracing.inject_headers()
        reply = asyncio.ensure_future(
            self._client.request(subject, encode(message), timeout=timeout_s, headers=headers)
        )
        lost = self._lost

        def cut_off(_: asyncio.Future) -> None:
            reply.cancel()

        lost.add_done_callback(cut_off)
        try:
            msg = await reply
        except nats.errors.NoRespondersError as exc:
            raise NoRespondersError(subject) from exc
        except nats.errors.TimeoutError as exc:
            raise RequestTimeoutError(subject, timeout_s) from exc
        except nats.errors.OutboundBufferLimitError as exc:
            raise _not_sent(subject) from exc
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if lost.done() and (current is None or not current.cancelling()):
                raise ConnectionLostError(
                    f"the NATS connection dropped while waiting for a reply on {subject}"
                ) from exc
            raise
        finally:
            lost.remove_done_callback(cut_off)
        return _reply_of(msg.data, reply_type, subject)

    async def publish(
        self, subject: str, message: Message, *, with_trace: bool = True, reply: str = ""
    ) -> None:
        """`with_trace=False` leaves the trace context out, for streams whose reader starts no
        span from them (token chunks): headers cost a build here and a parse at every reader.
        `reply`: where the handler's answer goes (another service's Replies)."""
        headers = tracing.inject_headers() if with_trace else None
        try:
            await self._client.publish(subject, encode(message), reply=reply, headers=headers)
        except nats.errors.OutboundBufferLimitError as exc:
            raise _not_sent(subject) from exc

    async def serve(
        self, subject: str, request_type: Any, handler: Handler, queue: str = ""
    ) -> None:
        """Run `handler` for every message on `subject`, each in its own task.

        The reply is the handler's return value, or an ErrorReply when the body is malformed or
        the handler raises. Messages without a reply subject (publishes) get no answer.
        """

        async def on_message(msg: Msg) -> None:
            task = asyncio.create_task(
                self._handle(msg, request_type, handler), name=f"serve {subject}"
            )
            self._handler_tasks.add(task)
            task.add_done_callback(self._handler_tasks.discard)

        await self._client.subscribe(subject, queue=queue, cb=on_message)
        await self._flush()

    async def _handle(self, msg: Msg, request_type: Any, handler: Handler) -> None:
        token = otel_context.attach(tracing.extract_headers(msg.headers))
        try:
            try:
                reply = await handler(decode(msg.data, request_type))
            except MessageError as exc:
                log.warning(
                    "rejected malformed message", extra={"subject": msg.subject, "error": str(exc)}
                )
                reply = ErrorReply(code="bad_message", message=str(exc))
            except CrescentError as exc:
                reply = ErrorReply(code=type(exc).__name__, message=str(exc))
            except Exception as exc:
                log.exception("handler failed", extra={"subject": msg.subject})
                reply = ErrorReply(code="internal", message=repr(exc))
            if msg.reply and reply is not None:
                # Not msg.respond: it sends the request's headers (its trace context) back
                # with the reply, for both sides and the server to handle, and nobody reads them.
                await self._client.publish(msg.reply, self._sendable(encode(reply), msg.subject))
        except nats.errors.ConnectionClosedError:
            log.info("reply dropped: connection closed", extra={"subject": msg.subject})
        except nats.errors.OutboundBufferLimitError:
            log.warning(
                "reply dropped: NATS disconnected, its send buffer full",
                extra={"subject": msg.subject},
            )
        finally:
            otel_context.detach(token)

    def _sendable(self, data: bytes, subject: str) -> bytes:
        """`data`, or an error reply in its place when the server would refuse it for its
        size: the requester learns why at once instead of waiting out its deadline. Replies
        that grow with a request are sent in parts (crescent.common.payload); this one was not."""
        if len(data) <= self.max_payload:
            return data
        message = (
            f"the reply on {subject} is {len(data)} bytes, over the NATS server's max_payload "
            f"of {self.max_payload}"
        )
        log.error("reply too large to send", extra={"subject": subject, "error": message})
        return encode(ErrorReply(code=REPLY_TOO_LARGE, message=message))

    async def subscribe(
        self, subject: str, message_type: Any, handler: Callable[[Any], None]
    ) -> None:
        """Deliver decoded pub/sub messages to a synchronous `handler`; bad ones are logged and
        dropped."""

        async def on_message(msg: Msg) -> None:
            try:
                handler(decode(msg.data, message_type))
            except MessageError as exc:
                log.warning(
                    "dropped malformed message", extra={"subject": msg.subject, "error": str(exc)}
                )
            except Exception:
                log.exception("subscriber failed", extra={"subject": msg.subject})

        await self._client.subscribe(subject, cb=on_message)
        await self._flush()

    async def stream(self, subject: str, message_type: Any) -> Stream:
        """A subscription to `subject`, read in order, confirmed by the server."""
        stream = Stream(subject, message_type)
        stream.subscription = await self._client.subscribe(subject, cb=stream.deliver)
        await self._flush()
        return stream

    async def stream_group(self, wildcard_subject: str, message_type: Any) -> StreamGroup:
        """A StreamGroup subscribed to `wildcard_subject`, confirmed by the server."""
        group = StreamGroup(message_type)
        await self._client.subscribe(wildcard_subject, cb=group.deliver)
        await self._flush()
        return group

    async def replies(self, wildcard_subject: str, reply_type: Any) -> Replies:
        """A Replies subscribed to `wildcard_subject`, confirmed by the server."""
        replies = Replies(reply_type)
        await self._client.subscribe(wildcard_subject, cb=replies.deliver)
        await self._flush()
        return replies

    async def _flush(self) -> None:
        """Wait until the server has our subscriptions: only then may peers be told to send.

        Twice, because nats-py 2.16 writes a flush's PING straight to the socket while the SUB
        still waits in its pending buffer: the first PONG can come back before the server has
        seen the SUB (a peer's request then got "no responders" about 1 time in 20). By the
        second PING the flusher task has written the SUB, and the socket keeps their order.
        """
        try:
            await self._client.flush(timeout=FLUSH_TIMEOUT_S)
            await self._client.flush(timeout=FLUSH_TIMEOUT_S)
        except nats.errors.TimeoutError as exc:
            raise RequestTimeoutError("flush", FLUSH_TIMEOUT_S) from exc

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Stop taking messages, finish the handlers in flight, close. Safe to call twice."""
        if self._is_draining:
            return
        self._is_draining = True
        if not self._client.is_closed:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._client.drain()
            except (TimeoutError, nats.errors.Error) as exc:
                log.warning("NATS drain incomplete", extra={"error": repr(exc)})
        pending = list(self._handler_tasks)
        if pending:
            _, still_running = await asyncio.wait(pending, timeout=timeout_s)
            for task in still_running:
                task.cancel()
        if not self._client.is_closed:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._client.close()
            except (TimeoutError, OSError, RuntimeError) as exc:
                # The server went away first (a whole cluster stopping at once) or stopped
                # reading; or it is down: nats-py 2.x then writes what it held for the reconnect
                # to the closed socket, which uvloop refuses with a RuntimeError.
                log.warning("NATS close incomplete", extra={"error": repr(exc)})
