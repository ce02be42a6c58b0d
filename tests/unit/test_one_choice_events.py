"""OneChoiceEvents reads a single choice's events in the caller's task, as ChoiceEvents would
deliver them: in order, then None; stopping it closes the flow (whose cleanup cancels decode)."""

from __future__ import annotations

import asyncio

import pytest

from crescent.conductor.flow_state import TokenEvent
from crescent.conductor.relay import ChoiceEvents, OneChoiceEvents


async def _events(closed: list[bool], fail: bool = False):
    try:
        yield TokenEvent([1])
        yield TokenEvent([2, 3], finish_reason="length" if not fail else None)
        if fail:
            raise RuntimeError("decode lost")
    finally:
        closed.append(True)


@pytest.mark.parametrize("kind", [OneChoiceEvents, lambda s: ChoiceEvents([s])])
async def test_events_come_in_order_then_none(kind):
    closed: list[bool] = []
    events = kind(_events(closed))
    seen = []
    while (item := await events.next()) is not None:
        seen.append((item[0], item[1].token_ids))
    await events.close()
    assert seen == [(0, [1]), (0, [2, 3])]
    assert closed == [True]


async def test_the_reading_task_is_the_callers():
    tasks = []

    async def stream():
        tasks.append(asyncio.current_task())
        yield TokenEvent([7])

    events = OneChoiceEvents(stream())
    await events.next()
    assert tasks == [asyncio.current_task()]


async def test_stop_closes_the_flow_at_once():
    closed: list[bool] = []
    events = OneChoiceEvents(_events(closed))
    await events.next()
    await events.stop(0)
    assert closed == [True]
    assert await events.next() is None


async def test_a_failure_reaches_the_reader():
    closed: list[bool] = []
    events = OneChoiceEvents(_events(closed, fail=True))
    await events.next()
    await events.next()
    with pytest.raises(RuntimeError, match="decode lost"):
        await events.next()
    await events.close()
    assert closed == [True]
