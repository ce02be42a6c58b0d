"""TokenChunker's rules with a recording publisher: fast steps share a chunk up to max_tokens,
a held token leaves after max_delay, slow steps and the final one leave at once, seq has no gap."""

from __future__ import annotations

import asyncio

import pytest

from crescent.common.errors import ConfigError
from crescent.common.messages import TokenChunk
from crescent.decode.chunking import ChunkLimits, SentStreams, TokenChunker


def recorder() -> tuple[list[TokenChunk], TokenChunker]:
    sent: list[TokenChunk] = []

    async def publish(chunk: TokenChunk) -> None:
        sent.append(chunk)

    return sent, TokenChunker("r", publish, ChunkLimits(max_tokens=4, max_delay_s=0.05))


async def test_fast_steps_share_chunks_of_at_most_max_tokens_and_the_final_goes_at_once():
    sent, chunker = recorder()
    for token in range(9):
        await chunker.add([token], [], None)
    await chunker.add([9], [], "length")
    await chunker.close()
    assert [c.token_ids for c in sent] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert (
        [c.seq for c in sent] == [0, 1, 2]
        and sent[-1].is_final
        and sent[-1].finish_reason == "length"
    )


async def test_a_held_token_leaves_after_the_delay():
    sent, chunker = recorder()
    await chunker.add([1], [], None)
    assert sent == []
    await asyncio.sleep(0.2)
    assert [c.token_ids for c in sent] == [[1]] and not sent[0].is_final
    await chunker.add([2], [], "stop")  # more than the delay after the last step: at once
    await chunker.close()
    assert [c.token_ids for c in sent] == [[1], [2]] and [c.seq for c in sent] == [0, 1]


async def test_a_failure_sends_what_is_held_then_a_final_error_chunk():
    sent, chunker = recorder()
    await chunker.add([1], [], None)
    await chunker.fail("boom", "abort")
    await chunker.close()
    assert [(c.token_ids, c.is_final, c.error) for c in sent] == [
        ([1], False, None),
        ([], True, "boom"),
    ]


def test_limits_are_checked():
    for max_tokens, max_delay_s in ((0, 0.005), (16, -1.0)):
        with pytest.raises(ConfigError):
            ChunkLimits(max_tokens, max_delay_s)


async def test_sent_streams_hold_every_chunk_until_memory_runs_out_after_the_end():
    sent, chunker = recorder()
    streams = SentStreams(memory_s=10.0, max_bytes=1 << 20)
    streams.open(chunker)
    for token in range(6):
        await chunker.add([token], [], None)
    assert streams.since("r", 0, now=0.0) == sent and len(sent) == 1  # two tokens held
    await chunker.add([6], [], "length")
    await chunker.close()
    streams.end("r", now=100.0)
    assert streams.since("r", 0, now=105.0) == sent and sent[-1].is_final
    assert streams.since("r", len(sent), now=105.0) == []  # known, nothing after
    assert streams.since("r", 0, now=110.5) is None  # forgotten
    assert streams.since("other", 0, now=105.0) is None


async def test_sent_streams_forget_the_oldest_ended_stream_past_their_bytes():
    async def publish(chunk: TokenChunk) -> None:
        pass

    streams = SentStreams(memory_s=60.0, max_bytes=3000)
    for request_id in ("first", "second"):
        chunker = TokenChunker(request_id, publish, ChunkLimits(max_tokens=4, max_delay_s=0.05))
        streams.open(chunker)
        for token in range(20):  # five chunks, ~1,700 bytes held
            await chunker.add([token], [], None)
        await chunker.add([20], [], "length")
        await chunker.close()
        streams.end(request_id, now=1.0)
    assert streams.since("first", 0, now=2.0) is None
    assert len(streams.since("second", 0, now=2.0)) == 6
