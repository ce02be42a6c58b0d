"""The connector's worker side fills vLLM's KV cache in place from a store segment mapped on
this host, fills nothing from a pin the engine may have outlived, and unpins every pin once,
even one that answers after its load was given up (pure logic: a tensor stands in for the
segment, a recording stub for the store)."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU build (make install-vllm)")

import torch
from opentelemetry.trace import NoOpTracer

from crescent.common.store_messages import PinnedBlocks
from crescent.engine.vllm.events import EventLog
from crescent.engine.vllm.plan import ConnectorConfig, LoadSpec
from crescent.engine.vllm.runtime import ConnectorRuntime
from crescent.engine.vllm.worker_side import WorkerSide, _LoadJob

NUM_LAYERS, VLLM_BLOCKS, PER_BLOCK = 2, 8, 2  # vLLM blocks per store block
ROW_SHAPE = (2, 4)  # one vLLM block of one layer: 8 float32 values, 32 bytes


class _Ops:
    """Pins answer once `answer` is set, from a segment mapped here; unpins are recorded."""

    pin_ttl_s = 20.0

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.block_bytes = 0
        self.segment = memoryview(bytearray(1 << 12))
        self.unpinned: list[list[bytes]] = []

    async def pin(self, node: str, hashes: list[bytes]) -> PinnedBlocks:
        await self.answer.wait()
        offsets = [i * self.block_bytes for i in range(len(hashes))]
        return PinnedBlocks(
            segment="seg", block_bytes=self.block_bytes, hashes=hashes, offsets=offsets
        )

    def mapped(self, segment: str) -> memoryview:
        return self.segment

    async def unpin(self, node: str, hashes: list[bytes]) -> None:
        self.unpinned.append(hashes)


class _Bridge:
    """Runs what the connector submits on the test's loop."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task] = []

    def submit(self, coro) -> asyncio.Task:
        self.tasks.append(asyncio.ensure_future(coro))
        return self.tasks[-1]


def _worker() -> WorkerSide:
    config = ConnectorConfig(
        nats_url="", etcd_url="", cluster="c", node="n", model="m", block_size=16 * PER_BLOCK
    )
    runtime = ConnectorRuntime(config, _Bridge(), _Ops(), EventLog(""), NoOpTracer(), 16, PER_BLOCK)
    worker = WorkerSide(runtime)
    worker.register(
        {f"model.layers.{i}.attn": torch.zeros(VLLM_BLOCKS, *ROW_SHAPE) for i in range(NUM_LAYERS)}
    )
    return worker


def _mapped_job(worker: WorkerSide, segment: torch.Tensor, pin_safe_for_s: float) -> _LoadJob:
    """A pinned load of two store blocks, at slots 3 and 1 of `segment`, into vLLM blocks
    4-5 and 6-7."""
    fills = [(0, 0, 4), (0, 1, 5), (1, 0, 6), (1, 1, 7)]
    job = _LoadJob(LoadSpec("r", [b"a", b"b"], fills, {}, False), NUM_LAYERS, 1.0)
    rows = worker._rows_of("seg", memoryview(segment.numpy()).cast("B"))
    job.segment_rows, job.num_pinned = rows, 2
    rows_per_block = worker.block_bytes // worker.vllm_block_bytes
    job.first_rows = [3 * rows_per_block, 1 * rows_per_block]
    job.pin_safe_until = time.monotonic() + pin_safe_for_s
    return job


def _segment(worker: WorkerSide) -> torch.Tensor:
    """Four store blocks; every float of a vLLM block's row is its row number."""
    num_rows = 4 * worker.block_bytes // worker.vllm_block_bytes
    return torch.arange(num_rows, dtype=torch.float32).repeat_interleave(8)


def test_a_mapped_load_fills_each_layer_from_the_segment_in_place():
    worker = _worker()
    job = _mapped_job(worker, _segment(worker), pin_safe_for_s=10)
    for layer in range(NUM_LAYERS):
        worker._fill_layer(job, layer)
    rows_per_block = NUM_LAYERS * PER_BLOCK
    for layer, kv in enumerate(worker.kv_layers):
        # store block at slot s: layer l's sub-block k is row s·4 + l·2 + k
        want = [3 * rows_per_block + layer * 2 + k for k in (0, 1)]
        want += [1 * rows_per_block + layer * 2 + k for k in (0, 1)]
        assert kv[4:, 0, 0].tolist() == want
        assert kv[:4].eq(0).all()
    assert worker.take_invalid_block_ids() == set()


def test_a_fill_after_the_pin_may_have_ended_reads_nothing_and_recomputes():
    """An engine paused past half the pin's TTL may find its slots reused by other blocks: it
    fills none of them and hands them to vLLM to compute again."""
    worker = _worker()
    job = _mapped_job(worker, _segment(worker), pin_safe_for_s=-1)
    for layer in range(NUM_LAYERS):
        worker._fill_layer(job, layer)
    assert all(kv.eq(0).all() for kv in worker.kv_layers)
    assert worker.take_invalid_block_ids() == {4, 5, 6, 7}


async def test_a_pin_is_undone_once_whether_it_answers_before_or_after_its_load_ends():
    worker = _worker()
    ops, bridge = worker.runtime.ops, worker.runtime.bridge
    ops.block_bytes = worker.block_bytes
    ops.answer.set()
    read = _LoadJob(LoadSpec("r", [b"a", b"b"], [], {}, True), NUM_LAYERS, 1.0)
    await worker._read_layers(read)
    assert read.pinned_hashes == [b"a", b"b"] and ops.unpinned == []  # the fills read it
    worker._release(read)
    worker._release(read)
    await asyncio.gather(*bridge.tasks)
    assert ops.unpinned == [[b"a", b"b"]]

    ops.answer.clear()
    given_up = _LoadJob(LoadSpec("late", [b"c"], [], {}, True), NUM_LAYERS, 1.0)
    reading = asyncio.ensure_future(worker._read_layers(given_up))
    await asyncio.sleep(0)
    worker._release(given_up)  # its deadline passed: no fill will read it
    ops.answer.set()
    await reading
    await asyncio.gather(*bridge.tasks)
    assert ops.unpinned == [[b"a", b"b"], [b"c"]] and given_up.pinned_hashes == []
