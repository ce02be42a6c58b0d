"""A step's saves wait for nothing but the stores' answers to its allocations: a step ends
only once every target store knows which blocks are on their way (a decode's lookup right after
the first token waits for those, but not for blocks a store has not heard of), and a store
that does not answer holds one step for the engine's wait, no longer, and no other step until
it answers (pure logic: a recording stub for the stores, a loop thread for the bridge)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU build (make install-vllm)")

from opentelemetry.trace import NoOpTracer

from crescent.common.store_messages import BlockSlots
from crescent.engine.vllm.events import EventLog
from crescent.engine.vllm.plan import ConnectorConfig, SaveSpec
from crescent.engine.vllm.runtime import ConnectorRuntime
from crescent.engine.vllm.saver import Saver

ENGINE_WAIT_S = 0.2


class _Ops:
    """Allocations answer once `answer` is set (on the bridge's loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.answer = asyncio.Event()
        self.loop = loop

    async def alloc(self, node: str, hashes: list[bytes]) -> BlockSlots:
        await self.answer.wait()
        return BlockSlots(segment="seg", block_bytes=0, allocated=hashes, offsets=[0] * len(hashes))

    async def commit(self, node: str, hashes: list[bytes]) -> None:
        pass

    async def abort(self, node: str, hashes: list[bytes]) -> None:
        pass


class _Bridge:
    """Runs what the saver submits on a loop of its own thread, as the store bridge does."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        """Cancel what is still running (a save waiting for an allocation), then stop."""

        async def cancel_the_rest() -> None:
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

        asyncio.run_coroutine_threadsafe(cancel_the_rest(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(params=["prefill"])
def saver(request) -> Iterator[Saver]:
    bridge = _Bridge()
    config = ConnectorConfig(
        nats_url="", etcd_url="", cluster="c", node="n", model="m", block_size=64,
        engine_wait_s=ENGINE_WAIT_S, role=request.param,
    )  # fmt: skip
    runtime = ConnectorRuntime(config, bridge, _Ops(bridge.loop), EventLog(""), NoOpTracer(), 64, 1)
    saver = Saver(runtime)
    saver.configure(num_layers=2, layer_bytes=0)
    yield saver
    saver.close()
    bridge.close()


def _answer_after(ops: _Ops, delay_s: float) -> None:
    ops.loop.call_soon_threadsafe(ops.loop.call_later, delay_s, ops.answer.set)


def test_a_step_ends_only_once_every_store_has_answered_its_allocation(saver):
    ops = saver.runtime.ops
    saver.begin_step(1, [SaveSpec("r", [b"a", b"b"], [0, 1], ["A", "B"])])
    [job] = saver._jobs
    _answer_after(ops, 0.05)
    saver.end_step()
    assert all(slots.done() for slots in job.slots.values())


def test_a_store_that_does_not_answer_holds_the_step_for_the_engines_wait(saver):
    saver.begin_step(1, [SaveSpec("r", [b"a"], [0], ["A"])])
    [job] = saver._jobs
    ended = threading.Event()
    threading.Thread(target=lambda: (saver.end_step(), ended.set()), daemon=True).start()
    assert ended.wait(ENGINE_WAIT_S + 10), "the step waited past the engine's wait"
    assert not job.slots["A"].done()


def _ends_within(saver: Saver, timeout_s: float) -> bool:
    ended = threading.Event()
    threading.Thread(target=lambda: (saver.end_step(), ended.set()), daemon=True).start()
    return ended.wait(timeout_s)


def test_a_store_that_let_a_step_wait_in_vain_holds_no_step_again_until_it_answers(saver):
    """A paused store holds one step for the engine's wait, not every step: its next
    allocations are not waited for until it answers one; then steps wait for it again."""
    ops = saver.runtime.ops
    saver.begin_step(1, [SaveSpec("r1", [b"a"], [0], ["A"])])
    assert _ends_within(saver, ENGINE_WAIT_S + 10)
    saver.begin_step(2, [SaveSpec("r2", [b"b"], [1], ["A"])])
    [second] = saver._jobs
    assert _ends_within(saver, ENGINE_WAIT_S / 2), "a silent store held a second step"
    assert not second.slots["A"].done()

    ops.loop.call_soon_threadsafe(ops.answer.set)  # the store answers
    second.slots["A"].result(10)
    _on_the_bridge(ops, ops.answer.clear)  # after the answer's callbacks; slow again
    saver.begin_step(3, [SaveSpec("r3", [b"c"], [2], ["A"])])
    [third] = saver._jobs
    _answer_after(ops, 0.05)
    saver.end_step()
    assert third.slots["A"].done()


def _on_the_bridge(ops: _Ops, call) -> None:
    async def run() -> None:
        call()

    asyncio.run_coroutine_threadsafe(run(), ops.loop).result(5)


@pytest.mark.parametrize("saver", ["decode"], indirect=True)
def test_a_decode_instance_steps_on_without_waiting_for_its_own_saves(saver):
    """A prompt computed on the decode instance is decoded there: no other instance looks its
    blocks up after the first token, so the running requests' steps are not held for them."""
    saver.begin_step(1, [SaveSpec("r", [b"a"], [0], ["A"])])
    [job] = saver._jobs
    assert _ends_within(saver, ENGINE_WAIT_S / 2), "a decode step waited for an allocation"
    assert not job.slots["A"].done()
