"""The NATS bus on a real nats-server."""

import asyncio
import signal
import time

import nats
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from crescent.common import tracing
from crescent.common.bus import MAX_OUTSTANDING_PINGS, PING_INTERVAL_S, Bus, within
from crescent.common.codec import decode, encode
from crescent.common.errors import (
    ConnectionLostError,
    NoRespondersError,
    RemoteError,
    RequestTimeoutError,
    UnreachableError,
)
from crescent.common.messages import Ack, DecodeCancel, ErrorReply, TokenChunk


async def test_request_reply_and_remote_errors(infra):
    server, client = (
        await Bus.connect(infra.nats_url, "server"),
        await Bus.connect(infra.nats_url, "client"),
    )
    try:
        await server.serve("x.cancel", DecodeCancel, _ack_unless_boom)
        reply = await client.request("x.cancel", DecodeCancel(request_id="r1"), Ack, timeout_s=2)
        assert reply == Ack(request_id="r1")
        with pytest.raises(RemoteError, match="exploded") as info:
            await client.request("x.cancel", DecodeCancel(request_id="boom"), Ack, timeout_s=2)
        assert info.value.code == "internal"
        # The handler's failure did not stop the service.
        assert await client.request("x.cancel", DecodeCancel(request_id="r2"), Ack, timeout_s=2)
    finally:
        await client.drain()
        await server.drain()


async def test_malformed_message_gets_error_reply_and_service_keeps_serving(infra, caplog):
    server = await Bus.connect(infra.nats_url, "server")
    raw = await nats.connect(infra.nats_url)
    try:
        await server.serve("x.cancel", DecodeCancel, lambda m: _ack(m))
        reply = await raw.request("x.cancel", b"\x93garbage", timeout=2)
        error = decode(reply.data, ErrorReply)
        assert error.code == "bad_message"
        assert "malformed message" in caplog.text
        good = await raw.request("x.cancel", b"", timeout=2)
        assert decode(good.data, ErrorReply).code == "bad_message"
        client = await Bus.connect(infra.nats_url, "client")
        assert await client.request("x.cancel", DecodeCancel(request_id="ok"), Ack, timeout_s=2)
        await client.drain()
    finally:
        await raw.close()
        await server.drain()


async def _ack(message: DecodeCancel) -> Ack:
    return Ack(request_id=message.request_id)


async def _ack_unless_boom(message: DecodeCancel) -> Ack:
    """An Ack, except for request "boom", whose handler fails."""
    if message.request_id == "boom":
        raise ValueError("exploded")
    return await _ack(message)


async def test_a_peer_may_send_as_soon_as_serve_returns(infra):
    """serve() returns only once the server holds the subscription: a request from another
    connection right after it finds a responder every time (one flush lost ~1 in 20 here)."""
    server, client = (
        await Bus.connect(infra.nats_url, "server"),
        await Bus.connect(infra.nats_url, "client"),
    )
    try:
        for i in range(300):
            await server.serve(f"race.{i}", DecodeCancel, _ack)
            reply = await client.request(
                f"race.{i}", DecodeCancel(request_id=str(i)), Ack, timeout_s=2
            )
            assert reply == Ack(request_id=str(i))
    finally:
        await client.drain()
        await server.drain()


async def test_request_deadline_fires(infra):
    server, client = (
        await Bus.connect(infra.nats_url, "server"),
        await Bus.connect(infra.nats_url, "client"),
    )
    try:

        async def slow(message: DecodeCancel) -> Ack:
            await asyncio.sleep(5)
            return Ack(request_id=message.request_id)

        await server.serve("x.slow", DecodeCancel, slow)
        started = time.monotonic()
        with pytest.raises(RequestTimeoutError) as info:
            await client.request("x.slow", DecodeCancel(request_id="r"), Ack, timeout_s=0.3)
        assert time.monotonic() - started < 4  # gave up before the 5 s handler could answer
        assert isinstance(info.value, asyncio.TimeoutError)
        with pytest.raises(NoRespondersError):
            await client.request("x.nobody", DecodeCancel(request_id="r"), Ack, timeout_s=2)
    finally:
        await client.drain()
        await server.drain(timeout_s=0.5)


async def test_stream_keeps_order_and_times_out(infra):
    bus = await Bus.connect(infra.nats_url, "both")
    try:
        stream = await bus.stream("x.tokens", TokenChunk)
        for seq in range(50):
            await bus.publish(
                "x.tokens", TokenChunk(request_id="r", seq=seq, token_ids=[seq], step_at=0.0)
            )
        assert [(await stream.next(2)).seq for _ in range(50)] == list(range(50))
        with pytest.raises(RequestTimeoutError):
            await stream.next(0.2)
        await stream.close()
    finally:
        await bus.drain()


async def test_a_stream_group_routes_each_subject_to_its_stream(infra):
    bus = await Bus.connect(infra.nats_url, "group")
    try:
        group = await bus.stream_group("x.tokens.c1.*", TokenChunk)
        first, second = group.open("x.tokens.c1.a"), group.open("x.tokens.c1.b")
        for seq in range(20):
            await bus.publish(
                "x.tokens.c1.a", TokenChunk(request_id="a", seq=seq, token_ids=[seq], step_at=0.0)
            )
            await bus.publish(
                "x.tokens.c1.b", TokenChunk(request_id="b", seq=seq, token_ids=[seq], step_at=0.0)
            )
            await bus.publish(
                "x.tokens.c1.nobody",
                TokenChunk(request_id="n", seq=seq, token_ids=[seq], step_at=0.0),
            )
        assert [(await first.next(2)).seq for _ in range(20)] == list(range(20))
        assert {(await second.next(2)).request_id for _ in range(20)} == {"b"}
        await first.close()
        with pytest.raises(ValueError):
            group.open("x.tokens.c1.b")  # still open
        again = group.open("x.tokens.c1.a")  # a closed stream's subject can be opened anew
        await bus.publish(
            "x.tokens.c1.a", TokenChunk(request_id="a", seq=0, token_ids=[], step_at=0.0)
        )
        assert (await again.next(2)).seq == 0
        with pytest.raises(RequestTimeoutError):
            await second.next(0.2)
    finally:
        await bus.drain()


async def test_replies_to_a_request_another_service_sent_come_back_to_who_expects_them(infra):
    """A third service publishes a request with our reply subject: the handler's answer or its
    error comes back through our one subscription; a request nobody serves gets no answer
    (the server tells only the sender), so its wait ends at its deadline."""
    server, sender, waiter = (
        await Bus.connect(infra.nats_url, "server"),
        await Bus.connect(infra.nats_url, "sender"),
        await Bus.connect(infra.nats_url, "waiter"),
    )
    try:
        await server.serve("x.cancel", DecodeCancel, _ack_unless_boom)
        replies = await waiter.replies("x.started.c1.*", Ack)
        answered = replies.expect("x.started.c1.a", "x.cancel")
        failed = replies.expect("x.started.c1.b", "x.cancel")
        unserved = replies.expect("x.started.c1.c", "x.nobody")
        unanswered = replies.expect("x.started.c1.d", "x.cancel")
        with pytest.raises(ValueError):
            replies.expect("x.started.c1.a", "x.cancel")  # already expected
        await sender.publish("x.cancel", DecodeCancel(request_id="a"), reply="x.started.c1.a")
        await sender.publish("x.cancel", DecodeCancel(request_id="boom"), reply="x.started.c1.b")
        await sender.publish("x.nobody", DecodeCancel(request_id="c"), reply="x.started.c1.c")
        assert await within(answered, "x.cancel", 2) == Ack(request_id="a")
        with pytest.raises(RemoteError, match="exploded"):
            await within(failed, "x.cancel", 2)
        with pytest.raises(RequestTimeoutError, match="x.nobody"):
            await within(unserved, "x.nobody", 0.3)
        with pytest.raises(RequestTimeoutError):
            await within(unanswered, "x.cancel", 0.2)
        # A settled or abandoned reply is no longer expected: its subject can be expected anew.
        again = replies.expect("x.started.c1.d", "x.cancel")
        await sender.publish("x.cancel", DecodeCancel(request_id="d"), reply="x.started.c1.d")
        assert await within(again, "x.cancel", 2) == Ack(request_id="d")
    finally:
        for bus in (sender, waiter, server):
            await bus.drain()


async def test_trace_context_crosses_the_bus(infra, monkeypatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "tracer", lambda: provider.get_tracer("test"))
    server, client = (
        await Bus.connect(infra.nats_url, "server"),
        await Bus.connect(infra.nats_url, "client"),
    )
    try:

        async def handle(message: DecodeCancel) -> Ack:
            with tracing.tracer().start_as_current_span("server.work"):
                return Ack(request_id=message.request_id)

        await server.serve("x.traced", DecodeCancel, handle)
        with tracing.tracer().start_as_current_span("client.call"):
            await client.request("x.traced", DecodeCancel(request_id="r"), Ack, timeout_s=2)
    finally:
        await client.drain()
        await server.drain()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["server.work"].context.trace_id == spans["client.call"].context.trace_id
    assert spans["server.work"].parent.span_id == spans["client.call"].context.span_id


async def test_a_reply_does_not_carry_the_requests_trace_context_back(infra):
    """The trace context goes with the request only: nobody reads it on the reply, where it
    would cost the handler, the server and the requester a header block each."""
    server = await Bus.connect(infra.nats_url, "server")
    raw = await nats.connect(infra.nats_url)
    try:
        await server.serve("x.cancel", DecodeCancel, _ack)
        traceparent = f"00-{'1' * 32}-{'2' * 16}-01"
        reply = await raw.request(
            "x.cancel",
            encode(DecodeCancel(request_id="r")),
            timeout=2,
            headers={tracing.TRACEPARENT: traceparent},
        )
        assert decode(reply.data, Ack) == Ack(request_id="r")
        assert not reply.headers
    finally:
        await raw.close()
        await server.drain()


async def test_unreachable_nats_fails_fast_with_a_clear_error():
    started = time.monotonic()
    with pytest.raises(UnreachableError, match="NATS"):
        await Bus.connect("nats://127.0.0.1:1", "nobody", timeout_s=1.5)
    assert time.monotonic() - started < 10


async def test_bus_reconnects_and_serves_again_after_nats_restarts(infra):
    server, client = (
        await Bus.connect(infra.nats_url, "server"),
        await Bus.connect(infra.nats_url, "client"),
    )
    try:
        await server.serve("x.cancel", DecodeCancel, _ack)
        assert await client.request("x.cancel", DecodeCancel(request_id="before"), Ack, timeout_s=2)
        infra.nats.stop()
        infra.nats.start()
        infra.nats.wait_ready(30)
        reply = await _answered_once_nats_is_back(client, "after")
        assert reply.request_id == "after" and server.is_connected
    finally:
        await client.drain()
        await server.drain()


async def test_a_request_whose_connection_drops_fails_at_once_and_later_ones_go_out_on_the_next(
    infra,
):
    """A reply due on a dropped connection may never come: the request ends with
    ConnectionLostError when the connection drops, not at its deadline. One sent while NATS is
    down goes out once it is back, and is answered: the epoch it was sent in is the new
    connection's, so a reconnect does not count it as lost."""
    server, client = (
        await Bus.connect(infra.nats_url, "server"),
        await Bus.connect(infra.nats_url, "client"),
    )
    received = asyncio.Event()
    try:

        async def never(message: DecodeCancel) -> Ack:
            received.set()
            await asyncio.sleep(3600)
            return Ack(request_id=message.request_id)

        await server.serve("x.never", DecodeCancel, never)
        await server.serve("x.cancel", DecodeCancel, _ack)
        epoch_sent = client.epoch
        waiting = asyncio.ensure_future(
            client.request("x.never", DecodeCancel(request_id="r"), Ack, timeout_s=120)
        )
        await asyncio.wait_for(received.wait(), 10)
        infra.nats.stop()
        with pytest.raises(ConnectionLostError, match="x.never"):
            await asyncio.wait_for(waiting, 60)  # not its 120 s deadline
        epoch_while_down = client.epoch  # the connection what is sent now goes out on
        assert epoch_while_down == epoch_sent + 1
        sent_while_down = asyncio.ensure_future(
            client.request("x.cancel", DecodeCancel(request_id="while-down"), Ack, timeout_s=60)
        )
        infra.nats.start()
        infra.nats.wait_ready(30)
        try:
            reply = await asyncio.wait_for(sent_while_down, 60)
        except NoRespondersError:  # it reached the server before the server's handler was back
            reply = None
        assert reply is None or reply.request_id == "while-down"
        assert client.epoch == epoch_while_down  # it went out on the connection made since
        reply = await _answered_once_nats_is_back(client, "after")
        assert reply.request_id == "after"
    finally:
        await client.drain()
        await server.drain(timeout_s=0.5)


async def _answered_once_nats_is_back(client: Bus, request_id: str) -> Ack:
    """x.cancel's answer, asked until the server's handler is back (within 15 s)."""
    deadline = time.monotonic() + 15
    while True:
        try:
            return await client.request(
                "x.cancel", DecodeCancel(request_id=request_id), Ack, timeout_s=1
            )
        except (RequestTimeoutError, NoRespondersError, ConnectionLostError):
            assert time.monotonic() < deadline, "no reply after NATS came back"
            await asyncio.sleep(0.2)


async def test_a_connection_whose_server_stops_answering_is_opened_again(infra):
    """NATS stalled (SIGSTOP) past MAX_OUTSTANDING_PINGS unanswered pings: the bus drops the
    connection and opens another once the server answers, rather than keep one whose writes
    may sit in the kernel long after the server resumed. Its epoch tells readers that what
    was due on the old one may be lost."""
    server, client = (
        await Bus.connect(infra.nats_url, "server"),
        await Bus.connect(infra.nats_url, "client"),
    )
    try:
        await server.serve("x.cancel", DecodeCancel, _ack)
        epoch_before = client.epoch
        infra.nats.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep((MAX_OUTSTANDING_PINGS + 2) * PING_INTERVAL_S)
        finally:
            infra.nats.signal(signal.SIGCONT)
        assert client.epoch > epoch_before
        reply = await _answered_once_nats_is_back(client, "after")
        assert reply.request_id == "after"
    finally:
        await client.drain()
        await server.drain()


async def test_a_send_while_nats_is_down_past_the_reconnect_buffer_is_a_lost_connection(infra):
    """nats-py holds what is sent while disconnected, up to a buffer; past it, a publish or a
    request is ConnectionLostError (a recoverable error every caller handles), not nats-py's
    own error, which a telemetry loop would die of."""
    client = await Bus.connect(infra.nats_url, "client")
    try:
        infra.nats.stop()
        deadline = time.monotonic() + 10
        while client.is_connected:
            assert time.monotonic() < deadline, "the bus did not notice NATS stopped"
            await asyncio.sleep(0.05)
        chunk = TokenChunk(request_id="r", seq=0, token_ids=list(range(50_000)), step_at=0.0)
        with pytest.raises(ConnectionLostError, match="buffer"):
            for _ in range(100):  # ~250 KB each: past nats-py's 2 MiB
                await client.publish("x.tokens", chunk)
        with pytest.raises(ConnectionLostError, match="buffer"):
            big = DecodeCancel(request_id="r" * 300_000)  # more than the buffer has left
            await client.request("x.cancel", big, Ack, timeout_s=1)
    finally:
        await client.drain(timeout_s=0.5)
