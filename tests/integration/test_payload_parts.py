"""Replies larger than one NATS message, on a real nats-server whose max_payload is small
(32 KiB): one that nothing cuts is answered at once with an error instead of never arriving,
and a stream asked for again comes in parts that add up to the chunks sent."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from pathlib import Path

import pytest

from crescent.cluster.infra import etcd_spec, nats_spec
from crescent.cluster.processes import ManagedProcess
from crescent.common.bus import Bus
from crescent.common.codec import decode
from crescent.common.errors import NoRespondersError, RemoteError, RequestTimeoutError
from crescent.common.messages import (
    Ack,
    DecodeStart,
    ResendTokens,
    ResentTokens,
    Reservation,
    ReservationReply,
    SamplingParams,
    TokenChunk,
)
from crescent.common.naming import Subjects
from crescent.common.ports import free_port

MAX_PAYLOAD = 32 << 10
NUM_TOKENS = 600  # with 20 alternatives each, ~175 KB of chunks


@pytest.fixture
def small_nats(tmp_path: Path):
    """(nats_url, etcd_url): a NATS that takes messages of at most MAX_PAYLOAD bytes."""
    config = tmp_path / "nats.conf"
    config.write_text(f"max_payload: {MAX_PAYLOAD}\n")
    nats_port, etcd_port = free_port(), free_port()
    nats = ManagedProcess(nats_spec(nats_port, config=config), tmp_path / "logs")
    etcd = ManagedProcess(etcd_spec(etcd_port, tmp_path / "etcd-data"), tmp_path / "logs")
    for process in (nats, etcd):
        process.start()
        process.wait_ready(30)
    try:
        yield f"nats://127.0.0.1:{nats_port}", f"http://127.0.0.1:{etcd_port}"
    finally:
        etcd.stop()
        nats.stop()


async def test_a_reply_over_the_servers_limit_is_an_error_at_once(small_nats):
    nats_url, _ = small_nats
    server = await Bus.connect(nats_url, "test-server")
    client = await Bus.connect(nats_url, "test-client")
    assert server.max_payload == MAX_PAYLOAD
    chunks = [
        TokenChunk(request_id="r", seq=i, token_ids=[i] * 16, step_at=0.0) for i in range(999)
    ]

    async def too_large(ask: ResendTokens) -> ResentTokens:
        return ResentTokens(request_id=ask.request_id, is_known=True, chunks=chunks)

    try:
        await server.serve("big", ResendTokens, too_large)
        with pytest.raises(RemoteError) as refused:
            await client.request("big", ResendTokens(request_id="r", from_seq=0), ResentTokens, 30)
        assert refused.value.code == "reply_too_large"
        assert f"over the NATS server's max_payload of {MAX_PAYLOAD}" in refused.value.message
    finally:
        await client.drain()
        await server.drain()


async def test_a_stream_larger_than_one_message_is_resent_in_parts(
    small_nats, tmp_path, cluster_name
):
    nats_url, etcd_url = small_nats
    argv = [sys.executable, "-m", "crescent.decode", "--cluster", cluster_name]
    argv += ["--nats-url", nats_url, "--etcd-url", etcd_url, "--instance-id", "decode-a"]
    argv += ["--emulated-time-scale", "0", "--log-format", "text"]
    process = ManagedProcess(
        dataclasses.replace(nats_spec(0), name="decode-a", argv=argv, port=None), tmp_path / "d"
    )
    process.start()
    bus = await Bus.connect(nats_url, "test-parts")
    subjects = Subjects(cluster_name)
    try:
        await reserve(bus, subjects, process)
        sent = await generate_with_logprobs(bus, subjects)
        assert sum(len(chunk.token_ids) for chunk in sent) == NUM_TOKENS - 1

        resent: list[TokenChunk] = []
        num_parts = 0
        while True:
            part = await bus.request(
                subjects.decode_resend("decode-a"),
                ResendTokens(request_id="long", from_seq=len(resent)),
                ResentTokens,
                5,
            )
            assert part.is_known and part.chunks
            resent += part.chunks
            num_parts += 1
            if not part.num_chunks_left:
                break
            assert part.num_chunks_left == len(sent) - len(resent)
        assert resent == sent
        assert num_parts >= 3
    finally:
        process.stop()
        await bus.drain()


async def reserve(bus: Bus, subjects: Subjects, process: ManagedProcess) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            reply = await bus.request(
                subjects.decode_reserve("decode-a"),
                Reservation(request_id="long", num_prompt_tokens=16, max_tokens=NUM_TOKENS),
                ReservationReply,
                5,
            )
            assert reply.accepted, reply.reason
            return
        except (NoRespondersError, RequestTimeoutError):
            assert time.monotonic() < deadline, process.log_tail()
            await asyncio.sleep(0.1)


async def generate_with_logprobs(bus: Bus, subjects: Subjects) -> list[TokenChunk]:
    """Every chunk of one stream with 20 alternatives a token, as it was sent."""
    chunks: list[TokenChunk] = []
    done = asyncio.Event()

    async def on_message(msg) -> None:
        chunks.append(decode(msg.data, TokenChunk))
        if chunks[-1].is_final:
            done.set()

    subscription = await bus._client.subscribe(subjects.tokens("long"), cb=on_message)
    try:
        start = DecodeStart(
            request_id="long",
            token_ids=list(range(1, 17)),
            first_token=5,
            max_tokens=NUM_TOKENS,
            sampling=SamplingParams(logprobs=20, ignore_eos=True),
        )
        await bus.request(subjects.decode_start("decode-a"), start, Ack, 5)
        await asyncio.wait_for(done.wait(), 60)
    finally:
        await subscription.unsubscribe()
    return chunks
