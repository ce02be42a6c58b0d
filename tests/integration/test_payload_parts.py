"""Replies larger than one NATS message, on a real nats-server whose max_payload is small
(32 KiB): one that nothing cuts is answered at once with an error instead of never arriving,
and a stream asked for again comes in parts that add up to the chunks sent."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from test_token_chunks import decode_worker, generate  # noqa: F401  (decode_worker is a fixture)

from crescent.cluster.infra import etcd_spec, nats_spec
from crescent.cluster.processes import ManagedProcess
from crescent.common.bus import Bus
from crescent.common.errors import RemoteError
from crescent.common.messages import (
    REPLY_TOO_LARGE,
    ResendTokens,
    ResentTokens,
    SamplingParams,
    TokenChunk,
)
from crescent.common.naming import Subjects
from crescent.common.ports import free_port

MAX_PAYLOAD = 32 << 10
NUM_TOKENS = 600  # with 20 alternatives each, ~175 KB of chunks


@dataclass
class SmallNats:
    nats_url: str
    etcd_url: str


@pytest.fixture
def infra(tmp_path: Path):
    """This module's NATS (also decode_worker's) takes messages of at most MAX_PAYLOAD bytes."""
    config = tmp_path / "nats.conf"
    config.write_text(f"max_payload: {MAX_PAYLOAD}\n")
    nats_port, etcd_port = free_port(), free_port()
    nats = ManagedProcess(nats_spec(nats_port, config=config), tmp_path / "logs")
    etcd = ManagedProcess(etcd_spec(etcd_port, tmp_path / "etcd-data"), tmp_path / "logs")
    for process in (nats, etcd):
        process.start()
        process.wait_ready(30)
    try:
        yield SmallNats(f"nats://127.0.0.1:{nats_port}", f"http://127.0.0.1:{etcd_port}")
    finally:
        etcd.stop()
        nats.stop()


async def test_a_reply_over_the_servers_limit_is_an_error_at_once(infra):
    server = await Bus.connect(infra.nats_url, "test-server")
    client = await Bus.connect(infra.nats_url, "test-client")
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
        assert refused.value.code == REPLY_TOO_LARGE
        assert f"over the NATS server's max_payload of {MAX_PAYLOAD}" in refused.value.message
    finally:
        await client.drain()
        await server.drain()


async def test_a_stream_larger_than_one_message_is_resent_in_parts(
    cluster_name,
    decode_worker,  # noqa: F811  the fixture imported above, on this module's infra
):
    bus, start = decode_worker
    await start("--emulated-time-scale", "0")
    sampling = SamplingParams(logprobs=20, ignore_eos=True)
    sent = await generate(bus, cluster_name, "long", NUM_TOKENS, sampling)
    assert sum(len(chunk.token_ids) for chunk in sent) == NUM_TOKENS - 1

    resent: list[TokenChunk] = []
    num_parts = 0
    while True:
        part = await bus.request(
            Subjects(cluster_name).decode_resend("decode-a"),
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
