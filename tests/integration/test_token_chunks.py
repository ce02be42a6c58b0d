"""Token chunks on a real decode process and a real NATS: steps that come fast share a message
(at most --token-chunk-max-tokens each), steps that come slowly go one per message, and the
tokens are the same either way. Messages are counted on the tokens subject itself."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from crescent.cluster.processes import ManagedProcess, ProcessSpec
from crescent.common.bus import Bus
from crescent.common.codec import decode
from crescent.common.errors import NoRespondersError, RequestTimeoutError
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

NUM_TOKENS = 64  # the first comes from prefill, so decode makes 63 steps of one token


@pytest.fixture
async def decode_worker(infra, cluster_name, tmp_path):
    """Start decode-a with the given flags; yields (bus, start)."""
    bus = await Bus.connect(infra.nats_url, "test-chunks")
    processes = []

    async def start(*flags: str) -> None:
        for earlier in processes:  # one decode-a at a time
            earlier.stop()
        argv = [
            sys.executable,
            "-m",
            "crescent.decode",
            "--cluster",
            cluster_name,
            "--nats-url",
            infra.nats_url,
            "--etcd-url",
            infra.etcd_url,
            "--instance-id",
            "decode-a",
            "--log-format",
            "text",
            # The warm-up reservation is never started: a stop waiting for it would take the
            # whole stop deadline.
            "--drain-timeout-s",
            "0",
            *flags,
        ]
        process = ManagedProcess(
            ProcessSpec(name="decode-a", argv=argv), tmp_path / f"logs{len(processes)}"
        )
        process.start()
        processes.append(process)
        deadline = time.monotonic() + 30
        while True:
            try:
                await bus.request(
                    Subjects(cluster_name).decode_reserve("decode-a"),
                    Reservation(request_id="warm-up", num_prompt_tokens=1, max_tokens=1),
                    ReservationReply,
                    5,
                )
                return
            except (NoRespondersError, RequestTimeoutError):
                assert time.monotonic() < deadline, process.log_tail()
                await asyncio.sleep(0.1)

    yield bus, start
    for process in processes:
        process.stop()
    await bus.drain()


async def generate(
    bus: Bus,
    cluster: str,
    request_id: str,
    max_tokens: int = NUM_TOKENS,
    sampling: SamplingParams | None = None,
) -> list[TokenChunk]:
    """Every message on tokens.<request_id> for one request, as it was sent."""
    subjects = Subjects(cluster)
    reply = await bus.request(
        subjects.decode_reserve("decode-a"),
        Reservation(request_id=request_id, num_prompt_tokens=16, max_tokens=max_tokens),
        ReservationReply,
        5,
    )
    assert reply.accepted, reply.reason
    chunks: list[TokenChunk] = []
    done = asyncio.Event()

    async def on_message(msg) -> None:
        chunks.append(decode(msg.data, TokenChunk))
        if chunks[-1].is_final:
            done.set()

    subscription = await bus._client.subscribe(subjects.tokens(request_id), cb=on_message)
    try:
        await bus.request(
            subjects.decode_start("decode-a"),
            DecodeStart(
                request_id=request_id,
                token_ids=list(range(1, 17)),
                first_token=5,
                max_tokens=max_tokens,
                sampling=sampling or SamplingParams(),
            ),
            Ack,
            5,
        )
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await subscription.unsubscribe()
    return chunks


def tokens_of(chunks: list[TokenChunk]) -> list[int]:
    return [token for chunk in chunks for token in chunk.token_ids]


async def test_fast_steps_share_messages_and_the_tokens_are_unchanged(
    infra, cluster_name, decode_worker
):
    bus, start = decode_worker
    await start("--emulated-time-scale", "0")  # steps back to back: only the control path
    chunks = await generate(bus, cluster_name, "fast")
    assert [chunk.seq for chunk in chunks] == list(range(len(chunks)))
    assert len(tokens_of(chunks)) == NUM_TOKENS - 1 and chunks[-1].finish_reason == "length"
    assert all(len(chunk.token_ids) <= 16 for chunk in chunks)
    assert len(chunks) <= 8, (
        f"{len(chunks)} messages for {NUM_TOKENS - 1} tokens: steps were not coalesced"
    )

    await start(
        "--emulated-time-scale", "0", "--token-chunk-max-delay-ms", "0"
    )  # one message per step
    uncoalesced = await generate(bus, cluster_name, "fast-off")
    assert len(uncoalesced) == NUM_TOKENS - 1
    assert tokens_of(uncoalesced) == tokens_of(chunks)


async def test_slow_steps_go_one_per_message(infra, cluster_name, decode_worker):
    """An emulated LLaMA2-7B step takes ~9 ms, more than the 5 ms a token may wait: holding one
    back would only delay it, so every step is sent as it comes."""
    bus, start = decode_worker
    await start()
    chunks = await generate(bus, cluster_name, "slow")
    assert [len(chunk.token_ids) for chunk in chunks] == [1] * (NUM_TOKENS - 1)


async def test_a_finished_stream_is_sent_again_from_any_chunk(infra, cluster_name, decode_worker):
    """What a conductor asks after its NATS connection dropped mid-stream: the chunks from the
    first it lacks, as they went out; a stream the instance never ran is unknown."""
    bus, start = decode_worker
    await start("--emulated-time-scale", "0")
    chunks = await generate(bus, cluster_name, "again")
    subject = Subjects(cluster_name).decode_resend("decode-a")
    for from_seq in (0, len(chunks) - 1, len(chunks)):
        reply = await bus.request(
            subject, ResendTokens(request_id="again", from_seq=from_seq), ResentTokens, 5
        )
        assert reply.is_known and reply.chunks == chunks[from_seq:]
    never = await bus.request(
        subject, ResendTokens(request_id="never-ran", from_seq=0), ResentTokens, 5
    )
    assert not never.is_known and never.chunks == []
