"""The worker side of CrescentConnector, inside the forward pass: loads from this node's store
pinned once, then copied straight from the store's segment when it is mapped on this host, or
read layer by layer ahead of the model through the data plane; each finished layer of new full
blocks handed to the Saver (saver.py), which stores and commits it beside the model. A block
that fails to load becomes an invalid block, which vLLM recomputes.

An asynchronous load (LoadSpec.is_async) is read the same way but waited for by no step: its
request waits in vLLM's WAITING_FOR_REMOTE_KVS while the running requests go on stepping, and
once it is read its blocks are filled between two steps (`finished_loads`)."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from crescent.common.tracing import extract_headers
from crescent.engine.kv_store import KvStoreError
from crescent.engine.vllm.plan import CrescentMetadata, LoadSpec
from crescent.engine.vllm.runtime import ConnectorRuntime
from crescent.engine.vllm.saver import Saver
from crescent.storeclient.metrics import KV_TRANSFER_BYTES

log = logging.getLogger(__name__)


_LAYER_NUMBER = re.compile(r"\.(\d+)\.")
SLOW_LOAD_DELAY_S = 2.0  # kv_fault slow_load (tests)


def _layer_order(names: list[str]) -> list[str]:
    def number(name: str) -> int:
        match = _LAYER_NUMBER.search(name)
        return int(match.group(1)) if match else 0

    return sorted(names, key=number)


class _LoadJob:
    """One request's load: pinned once, then either mapped (its blocks are read in place from
    the store's segment by the fills, and unpinned after the last fill) or read layer by layer
    into `buffers` on the bridge (and unpinned once read)."""

    def __init__(self, spec: LoadSpec, num_layers: int, timeout_s: float) -> None:
        self.spec = spec
        self.deadline = time.monotonic() + timeout_s  # for the whole load
        self.buffers: list[torch.Tensor] = []  # one per layer, read through the data plane
        self.segment_rows: torch.Tensor | None = None  # the mapped segment, one row per sub-block
        self.first_rows: list[int] = []  # each pinned block's first row in segment_rows
        self.pinned_hashes: list[bytes] = []  # unpinned by the last fill when mapped
        self.is_released = False  # no fill reads the job any more (filled, or given up)
        self.pins_lock = threading.Lock()  # pinned_hashes and is_released: bridge vs engine
        self.pin_safe_until = 0.0  # monotonic: a mapped fill after it reads nothing
        self.layer_done = [threading.Event() for _ in range(num_layers)]
        self.done = threading.Event()
        self.num_pinned = 0
        self.error: BaseException | None = None


class WorkerSide:
    def __init__(self, runtime: ConnectorRuntime) -> None:
        self.runtime = runtime
        self.kv_layers: list[torch.Tensor] = []  # vLLM's KV cache of each layer, in order
        self.layer_index: dict[str, int] = {}
        self.layer_bytes = 0
        self._step = 0
        self._loads: list[_LoadJob] = []  # this step's synchronous loads
        self._async_loads: dict[str, _LoadJob] = {}  # request id → its load, until filled
        self.saver = Saver(runtime)
        self._save_s = 0.0  # this step's time in save_layer and finish_saves
        self._invalid: set[int] = set()
        self._failed_requests: set[str] = (
            set()
        )  # requests whose load failed this step: saves skipped
        # mapped segment → (the mapping's view, that view as rows of one vLLM block's bytes)
        self._segment_rows: dict[str, tuple[memoryview, torch.Tensor]] = {}

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = _layer_order(list(kv_caches))
        self.kv_layers = [kv_caches[name] for name in names]
        self.layer_index = {name: i for i, name in enumerate(names)}
        per_block = {kv[0].numel() * kv.element_size() for kv in self.kv_layers}
        if len(per_block) != 1:
            raise ValueError(f"layers have different KV block sizes {sorted(per_block)}")
        self.vllm_block_bytes = per_block.pop()
        self.layer_bytes = self.runtime.vllm_blocks_per_block * self.vllm_block_bytes
        self.saver.configure(len(names), self.layer_bytes)
        log.info(
            "CrescentConnector registered KV caches",
            extra={"num_layers": len(names), "store_block_bytes": self.layer_bytes * len(names)},
        )

    @property
    def block_bytes(self) -> int:
        return self.layer_bytes * len(self.kv_layers)

    @staticmethod
    def _fill(kv: torch.Tensor, rows: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
        """kv[vLLM block] = rows[row], for each (row, vLLM block id); a row holds one vLLM
        block's bytes of one layer."""
        src = rows[torch.tensor([r for r, _ in pairs])].view(kv.dtype).view(-1, *kv.shape[1:])
        kv[torch.tensor([d for _, d in pairs], device=kv.device)] = src.to(kv.device)

    def _rows_of(self, segment: str, view: memoryview) -> torch.Tensor:
        """The mapped segment as rows of one vLLM block's bytes of one layer (made once per
        segment): a stored block's layers, and their sub-blocks, are rows in order, as blocks
        start at multiples of the block size. A segment mapped anew (its store restarted)
        replaces the rows of the old mapping, which is unmapped once no fill reads it."""
        cached = self._segment_rows.get(segment)
        if cached is not None and cached[0] is view:
            return cached[1]
        whole = torch.frombuffer(view, dtype=torch.uint8)
        num_rows = len(whole) // self.vllm_block_bytes
        rows = whole[: num_rows * self.vllm_block_bytes].view(num_rows, self.vllm_block_bytes)
        self._segment_rows[segment] = (view, rows)
        return rows

    # the step's plan --------------------------------------------------------------------------
    def begin_step(self, meta: KVConnectorMetadata) -> None:
        self._step += 1
        for job in self._loads:  # a step that ended without wait_for_save
            self._release(job)
        self._loads = []
        self._failed_requests = set()
        if not isinstance(meta, CrescentMetadata):
            self.saver.begin_step(self._step, [])
            return
        self.saver.begin_step(self._step, meta.saves)
        config, num_layers = self.runtime.config, len(self.kv_layers)
        for spec in meta.loads:
            # a load inside a step holds the engine: it gets the engine's wait, not the store's
            timeout_s = config.timeout_s if spec.is_async else config.engine_wait_s
            job = _LoadJob(spec, num_layers, timeout_s)
            self.runtime.bridge.submit(self._read_layers(job))
            if spec.is_async:
                self._async_loads[spec.request_id] = job
            else:
                self._loads.append(job)

    def start_loads(self) -> None:
        """Loads already started in begin_step (as soon as the plan was bound)."""

    # loads ---------------------------------------------------------------------------------
    async def _read_layers(self, job: _LoadJob) -> None:
        """Pin the job's blocks; when the store's segment is mapped here, that is all (the
        fills read it in place and unpin); otherwise read each layer through the data plane."""
        node, hashes = self.runtime.config.node, job.spec.hashes
        pinned = None
        span = self.span(
            f"{self.runtime.config.role}.load_kv", job.spec.trace, num_blocks=len(hashes)
        )
        try:
            if self.runtime.config.fault == "slow_load":
                await asyncio.sleep(SLOW_LOAD_DELAY_S)
            pin_sent = time.monotonic()
            pinned = await self.runtime.ops.pin(node, hashes)
            job.pin_safe_until = pin_sent + self.runtime.ops.pin_ttl_s / 2
            self._check_block_bytes(pinned.block_bytes)
            job.num_pinned = len(pinned.hashes)
            view = self.runtime.ops.mapped(pinned.segment)
            span.set_attribute("crescent.route", "data-plane" if view is None else "mapped")
            if view is not None:
                job.segment_rows = self._rows_of(pinned.segment, view)
                job.first_rows = [offset // self.vllm_block_bytes for offset in pinned.offsets]
                with job.pins_lock:  # a job given up before its pin answered unpins now
                    if not job.is_released:
                        job.pinned_hashes, pinned = list(pinned.hashes), None
                return
            for layer in range(len(job.layer_done)):
                buffer = torch.empty((job.num_pinned, self.layer_bytes), dtype=torch.uint8)
                offsets = [offset + layer * self.layer_bytes for offset in pinned.offsets]
                views = [memoryview(buffer[i].numpy()) for i in range(job.num_pinned)]
                await self.runtime.ops.read(pinned.segment, offsets, views)
                job.buffers.append(buffer)
                job.layer_done[layer].set()
        except Exception as exc:
            job.error = exc
        finally:
            for event in job.layer_done:
                event.set()
            job.done.set()
            span.set_attribute("crescent.num_loaded", job.num_pinned)
            if job.error is not None:
                span.set_attribute("crescent.error", repr(job.error))
            span.end()
            if pinned is not None:
                await self._unpin(pinned.hashes)

    async def _unpin(self, hashes: list[bytes]) -> None:
        try:
            await self.runtime.ops.unpin(self.runtime.config.node, hashes)
        except Exception as exc:
            log.warning("unpin failed", extra={"error": repr(exc)})

    def _release(self, job: _LoadJob) -> None:
        """A mapped job's blocks are no longer read: unpin them (once). A job released before
        its pin answered (past its deadline) is unpinned by its reader when the answer comes."""
        with job.pins_lock:
            job.is_released = True
            hashes, job.pinned_hashes = job.pinned_hashes, []
        if hashes:
            self.runtime.bridge.submit(self._unpin(hashes))

    def _check_block_bytes(self, store_bytes: int) -> None:
        if store_bytes != self.block_bytes:
            raise KvStoreError(
                f"the store's blocks are {store_bytes} bytes, this model's are {self.block_bytes}: "
                f"start the store with --block-bytes {self.block_bytes}"
            )

    def wait_layer(self, layer_name: str) -> None:
        layer = self.layer_index.get(layer_name)
        if layer is None:
            return
        for job in self._loads:
            wait_s = max(0.0, job.deadline - time.monotonic())
            if not job.layer_done[layer].wait(wait_s) and job.error is None:
                job.error = KvStoreError(
                    f"layer {layer} of {job.spec.request_id} not read within the deadline"
                )
            self._fill_layer(job, layer)
            if layer == len(self.kv_layers) - 1:
                self._release(job)

    def finished_loads(self) -> set[str]:
        """Requests whose asynchronous load ended (read, failed, or past its deadline), their
        blocks filled now: vLLM calls this after a step's forward pass, on the thread that runs
        the model, so no forward pass reads a block while it is written. vLLM schedules them
        from the next step on; blocks that could not be read are reported as invalid in this
        same call's step, which vLLM requires."""
        finished = set()
        now = time.monotonic()
        for request_id, job in list(self._async_loads.items()):
            if not job.done.is_set():
                if now < job.deadline:
                    continue
                job.error = KvStoreError(f"the load of {request_id} missed its deadline")
            del self._async_loads[request_id]
            for layer in range(len(self.kv_layers)):
                self._fill_layer(job, layer)
            self._release(job)
            finished.add(request_id)
        return finished

    def _fill_layer(self, job: _LoadJob, layer: int) -> None:
        """Fill the job's vLLM blocks of `layer` from what was read; blocks not read become
        invalid blocks, which vLLM computes again."""
        spec, per_block = job.spec, self.runtime.vllm_blocks_per_block
        is_mapped = job.segment_rows is not None
        if is_mapped and job.error is None and time.monotonic() > job.pin_safe_until:
            # the engine stalled since the pin (a paused process): the store may have let it go
            job.error = KvStoreError(f"the pin of {spec.request_id}'s blocks may have ended")
        usable = 0 if job.error is not None else job.num_pinned
        if is_mapped:
            rows = job.segment_rows
            first = [row + layer * per_block for row in job.first_rows]
        else:
            rows = job.buffers[layer].view(-1, self.vllm_block_bytes) if usable else None
            first = [i * per_block for i in range(usable)]
        good = [(first[i] + sub, dst) for i, sub, dst in spec.fills if i < usable]
        if good:
            self._fill(self.kv_layers[layer], rows, good)
            if is_mapped:
                KV_TRANSFER_BYTES.labels("read", "mapped").inc(len(good) * self.vllm_block_bytes)
        bad = [dst for i, _, dst in spec.fills if i >= usable]
        if bad:
            self._invalid.update(bad)
            self._failed_requests.add(spec.request_id)
        if layer == 0:
            self.runtime.events.write(
                "load",
                request=spec.request_id,
                step=self._step,
                is_async=spec.is_async,
                num_blocks=len(spec.hashes),
                num_loaded=min(usable, len(spec.hashes)),
                num_vllm_blocks=len(good),
                route="mapped" if is_mapped else "data-plane",
                error=repr(job.error) if job.error else None,
            )

    def take_invalid_block_ids(self) -> set[int]:
        invalid, self._invalid = self._invalid, set()
        return invalid

    # saves ---------------------------------------------------------------------------------
    def save_layer(self, layer_name: str, kv_layer: torch.Tensor) -> None:
        layer = self.layer_index.get(layer_name)
        if layer is not None:
            started = time.perf_counter()
            self.saver.save_layer(layer, kv_layer, self._failed_requests)
            self._save_s += time.perf_counter() - started

    def finish_saves(self) -> None:
        """End of the step: see Saver.end_step for the one wait left here. The event log
        gets how long this step's forward pass spent on saves (snapshots and that wait)."""
        started = time.perf_counter()
        num_saves = self.saver.end_step()
        self._save_s += time.perf_counter() - started
        if num_saves:
            self.runtime.events.write(
                "step", step=self._step, num_saves=num_saves, save_s=self._save_s
            )
        self._save_s = 0.0
        for job in self._loads:
            self._release(job)
        self._loads = []

    def span(
        self, name: str, trace: dict[str, str], start_ns: int | None = None, **attributes: Any
    ):
        """A span of the request whose trace context the plan carries, started now or at
        `start_ns`."""
        span = self.runtime.tracer.start_span(
            name, context=extract_headers(trace), start_time=start_ns
        )
        for key, value in attributes.items():
            span.set_attribute(f"crescent.{key}", value)
        return span
