"""ChunkOrder: a conductor reads a token stream in order and each chunk once, asking the decode
for the chunks a NATS drop or a gap in the numbering may have lost."""

from __future__ import annotations

import pytest

from crescent.common.messages import TokenChunk
from crescent.conductor.flow_errors import StreamBrokenError
from crescent.conductor.resend import ChunkOrder


def chunk(seq: int) -> TokenChunk:
    return TokenChunk(request_id="r", seq=seq, token_ids=[seq], step_at=0.0)


def read(order: ChunkOrder, arrived: list[TokenChunk]) -> list[int]:
    """The seqs taken as next, resent chunks first, from `arrived` on the stream."""
    taken = []
    for incoming in arrived:
        while (resent := order.resent_chunk()) is not None:
            if order.is_next(resent):
                taken.append(resent.seq)
        if order.is_next(incoming):
            taken.append(incoming.seq)
    return taken


def test_a_whole_stream_is_read_in_order_without_a_resend():
    order = ChunkOrder("r", read_epoch=0)
    assert read(order, [chunk(0), chunk(1), chunk(2)]) == [0, 1, 2]
    assert not order.needs_resend(epoch=0)


def test_a_drop_asks_from_the_first_chunk_missing_and_skips_those_read_twice():
    order = ChunkOrder("r", read_epoch=0)
    assert read(order, [chunk(0), chunk(1)]) == [0, 1]
    assert order.needs_resend(epoch=1) and order.expected_seq == 2
    order.on_resent(1, [chunk(2), chunk(3)])
    assert not order.needs_resend(epoch=1)
    # 3 also came on the stream after the reconnect, then 4
    assert read(order, [chunk(3), chunk(4)]) == [2, 3, 4]


def test_a_gap_asks_for_the_chunks_lost_in_it():
    order = ChunkOrder("r", read_epoch=0)
    assert read(order, [chunk(0), chunk(3)]) == [0]
    assert order.needs_resend(epoch=0) and order.expected_seq == 1
    order.on_resent(0, [chunk(1), chunk(2), chunk(3)])
    assert read(order, [chunk(4)]) == [1, 2, 3, 4]


def test_a_gap_the_decode_cannot_fill_breaks_the_stream():
    order = ChunkOrder("r", read_epoch=0)
    read(order, [chunk(0), chunk(5)])
    with pytest.raises(StreamBrokenError, match="skipped from 1 to 5"):
        order.on_resent(0, [])


def test_a_drop_with_nothing_lost_reads_on():
    order = ChunkOrder("r", read_epoch=0)
    read(order, [chunk(0)])
    order.on_resent(1, [])  # nothing was sent meanwhile
    assert not order.needs_resend(epoch=1)
    assert read(order, [chunk(1)]) == [1]


def test_a_resend_cut_to_fit_one_message_is_asked_on_from_where_it_stopped():
    order = ChunkOrder("r", read_epoch=0)
    assert read(order, [chunk(0)]) == [0]
    assert order.needs_resend(epoch=1)
    order.on_resent(1, [chunk(1), chunk(2)], num_left=3)
    assert not order.needs_resend(epoch=1)  # the part is read first
    for _ in range(2):
        assert order.is_next(order.resent_chunk())
    assert order.needs_resend(epoch=1) and order.expected_seq == 3
    order.on_resent(1, [chunk(3), chunk(4), chunk(5)])
    for _ in range(3):
        assert order.is_next(order.resent_chunk())
    assert not order.needs_resend(epoch=1) and order.expected_seq == 6


def test_a_stream_read_again_after_its_decode_came_back_asks_from_the_first_chunk_missing():
    order = ChunkOrder("r", read_epoch=0)
    assert read(order, [chunk(0), chunk(1)]) == [0, 1]
    order.lost_since_read()
    assert order.needs_resend(epoch=0) and order.expected_seq == 2
    order.on_resent(0, [chunk(2), chunk(3)])
    assert read(order, [chunk(4)]) == [2, 3, 4]
    assert not order.needs_resend(epoch=0)
