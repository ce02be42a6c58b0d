"""ComputeGate: jobs enter the engine in arrival order, up to a step's tokens (vLLM) or one at a
time (emulated), and a cancelled waiter never keeps the line blocked."""

import asyncio

import pytest

from crescent.prefill.compute_gate import ComputeGate


async def _entered(gate: ComputeGate, tokens: int, log: list[int], name: int) -> None:
    await gate.enter(tokens)
    log.append(name)


async def test_zero_capacity_admits_one_job_at_a_time():
    gate = ComputeGate(0)
    await gate.enter(10)
    log: list[int] = []
    waiter = asyncio.create_task(_entered(gate, 10, log, 2))
    await asyncio.sleep(0)
    assert log == [] and gate.jobs_inside == 1
    gate.leave(10)
    await waiter
    assert log == [2] and gate.jobs_inside == 1


async def test_jobs_share_the_engine_while_under_a_step_of_tokens():
    gate = ComputeGate(2048)
    await gate.enter(1000)
    await gate.enter(1000)  # 1000 < 2048 inside: admitted at once
    log: list[int] = []
    third = asyncio.create_task(_entered(gate, 500, log, 3))
    await asyncio.sleep(0)
    assert log == [3] and gate.tokens_inside == 2500  # 2000 < 2048: still room
    fourth = asyncio.create_task(_entered(gate, 10, log, 4))
    await asyncio.sleep(0)
    assert log == [3]  # 2500 ≥ 2048: waits
    gate.leave(1000)
    await fourth
    assert log == [3, 4] and gate.jobs_inside == 3 and gate.tokens_inside == 1510
    await third


async def test_a_long_prompt_enters_an_empty_engine_and_nobody_overtakes_a_waiter():
    gate = ComputeGate(100)
    await gate.enter(5000)  # larger than a step, alone: admitted
    log: list[int] = []
    tasks = [asyncio.create_task(_entered(gate, t, log, i)) for i, t in enumerate([300, 1, 1])]
    await asyncio.sleep(0)
    assert log == []
    gate.leave(5000)
    await tasks[0]
    await asyncio.sleep(0)
    assert log == [0]  # 300 ≥ 100 inside: the short ones wait their turn behind it
    gate.leave(300)
    await asyncio.gather(*tasks)
    assert log == [0, 1, 2]


async def test_a_cancelled_waiter_hands_its_turn_on():
    gate = ComputeGate(0)
    await gate.enter(1)
    log: list[int] = []
    leaving = asyncio.create_task(_entered(gate, 1, log, 1))
    staying = asyncio.create_task(_entered(gate, 1, log, 2))
    await asyncio.sleep(0)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    gate.leave(1)
    await asyncio.wait_for(staying, 1)
    assert log == [2] and gate.jobs_inside == 1


async def test_a_waiter_cancelled_as_it_is_admitted_gives_the_room_back():
    gate = ComputeGate(0)
    await gate.enter(1)
    log: list[int] = []
    admitted_then_cancelled = asyncio.create_task(_entered(gate, 1, log, 1))
    behind = asyncio.create_task(_entered(gate, 1, log, 2))
    await asyncio.sleep(0)
    gate.leave(1)  # admits the first waiter (its future resolves) …
    admitted_then_cancelled.cancel()  # … and it is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await admitted_then_cancelled
    await asyncio.wait_for(behind, 1)
    assert log == [2] and gate.jobs_inside == 1 and gate.tokens_inside == 1
