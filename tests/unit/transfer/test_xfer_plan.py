"""Slicing, striping and bounds rules (crescent.transfer.plan)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crescent.transfer import Op, OutOfBounds, TransferEntry
from crescent.transfer.plan import Slice, SliceQueue, check_range, plan_slices


def entry(op: Op, local: int, remote: int, length: int) -> TransferEntry:
    return TransferEntry(op, "l", local, "r", remote, length)


@pytest.mark.parametrize(
    ("offset", "length", "size"),
    [(0, 10, 10), (9, 1, 10), (10, 0, 10), (0, 0, 1)],
)
def test_check_range_accepts_ranges_inside(offset: int, length: int, size: int) -> None:
    check_range("s", offset, length, size)


@pytest.mark.parametrize(
    ("offset", "length", "size"),
    [(0, 11, 10), (10, 1, 10), (-1, 1, 10), (0, -1, 10), (2**62, 2**62, 10)],
)
def test_check_range_rejects_ranges_outside(offset: int, length: int, size: int) -> None:
    with pytest.raises(OutOfBounds) as info:
        check_range("seg", offset, length, size)
    assert (info.value.segment, info.value.offset, info.value.length, info.value.size) == (
        "seg",
        offset,
        length,
        size,
    )


def test_plan_slices_cuts_each_entry_at_slice_bytes() -> None:
    slices = plan_slices([entry(Op.WRITE, 100, 1000, 10), entry(Op.READ, 0, 0, 4)], 4)
    assert slices == [
        Slice(0, Op.WRITE, 100, 1000, 4),
        Slice(0, Op.WRITE, 104, 1004, 4),
        Slice(0, Op.WRITE, 108, 1008, 2),
        Slice(1, Op.READ, 0, 0, 4),
    ]


def test_zero_length_entries_have_no_slices() -> None:
    assert plan_slices([entry(Op.READ, 0, 0, 0)], 4) == []


def test_plan_slices_rejects_non_positive_slice_size() -> None:
    with pytest.raises(ValueError):
        plan_slices([], 0)


@given(
    lengths=st.lists(st.integers(0, 10_000), max_size=8),
    slice_bytes=st.integers(1, 4096),
)
def test_slices_cover_every_entry_exactly_once(lengths: list[int], slice_bytes: int) -> None:
    entries = [entry(Op.WRITE, 7 * i, 13 * i, n) for i, n in enumerate(lengths)]
    slices = plan_slices(entries, slice_bytes)
    for index, e in enumerate(entries):
        mine = [s for s in slices if s.item == index]
        assert sum(s.length for s in mine) == e.length
        assert all(0 < s.length <= slice_bytes for s in mine)
        position = 0
        for s in mine:  # contiguous, in order, same shift between local and remote
            assert s.local_offset == e.local_offset + position
            assert s.remote_offset == e.remote_offset + position
            position += s.length


def slices_of(ops: list[Op], length: int = 10) -> list[Slice]:
    return [Slice(i, op, 0, 0, length) for i, op in enumerate(ops)]


def test_take_groups_consecutive_slices_of_one_op() -> None:
    queue = SliceQueue(slices_of([Op.WRITE, Op.WRITE, Op.READ, Op.WRITE]))
    assert [s.item for s in queue.take(10, 1000)] == [0, 1]
    assert [s.item for s in queue.take(10, 1000)] == [2]
    assert [s.item for s in queue.take(10, 1000)] == [3]
    assert queue.take(10, 1000) == []


def test_take_respects_item_and_byte_limits() -> None:
    queue = SliceQueue(slices_of([Op.READ] * 10))
    assert len(queue.take(3, 1000)) == 3
    assert len(queue.take(10, 25)) == 2
    big = SliceQueue([Slice(0, Op.READ, 0, 0, 100)])
    assert len(big.take(10, 25)) == 1  # the first slice is always taken


def test_put_back_returns_slices_to_the_front_in_order() -> None:
    queue = SliceQueue(slices_of([Op.READ] * 4))
    group = queue.take(3, 1000)
    queue.put_back(group[1:])
    assert [s.item for s in queue.take(10, 1000)] == [1, 2, 3]
    assert len(queue) == 0


def test_drain_empties_the_queue() -> None:
    queue = SliceQueue(slices_of([Op.READ] * 3))
    assert len(queue.drain()) == 3
    assert queue.take(1, 1) == []


def test_lanes_stripe_slices_without_loss_or_duplicates() -> None:
    queue = SliceQueue(slices_of([Op.WRITE] * 10_000, length=1))
    taken: list[list[int]] = [[] for _ in range(4)]

    def lane(number: int) -> None:
        while group := queue.take(3, 1000):
            taken[number].extend(s.item for s in group)

    threads = [threading.Thread(target=lane, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(i for lane_items in taken for i in lane_items) == list(range(10_000))
