"""The save path of CrescentConnector's worker side, kept off the forward pass.

Inside the forward pass `save_layer` only snapshots layer i of the step's new full blocks (one
gather into a private tensor, so vLLM may free or reuse its blocks at once), and of those only
the blocks some target store still lacks once every target has answered its allocation: a
prefix that vLLM's own cache or a load supplied is planned again, since this request's decode
node may lack it, but where every store holds it a gather of it is wasted. Everything else
runs beside the model on the bridge loop: waiting for the allocation, copying the layer into
each target store (in place on a copier thread when the store is on this host, over the data
plane otherwise), then, after the step, committing or aborting each target's blocks.

No step waits for a save, not even the one that ends a prompt: its first token goes out while
the last blocks are still being written and committed. A prefill step waits only, at its end,
for the stores to have answered its allocations (sent before its forward pass), so that they
know which blocks are on their way. The decode instance that reads them next asks its
node's store to wait for blocks still being written (LookupBlocks.wait_writing_s), which is
where the paper's decode waits too: it joins the batch once all of the request's KV has
arrived (§3.1, step 4). The commit does not wait for etcd (the store serves committed blocks
at once; the cluster index follows). A target whose write or commit fails or misses its
deadline simply does not hold those blocks: decode then recomputes what it does not find.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time

import torch

from crescent.common.store_messages import BlockSlots
from crescent.common.tracing import extract_headers
from crescent.engine.kv_store import KvStoreError
from crescent.engine.vllm.plan import SaveSpec
from crescent.engine.vllm.runtime import ConnectorRuntime
from crescent.storeclient.metrics import KV_TRANSFER_BYTES

log = logging.getLogger(__name__)

COMMIT_DELAY_S = 0.5  # kv_fault delay_commits (tests)


class _SaveJob:
    """One request's new blocks of one step, on their way to every target store."""

    def __init__(self, spec: SaveSpec, step: int) -> None:
        self.spec = spec
        self.step = step
        self.started_ns = time.time_ns()
        self.slots: dict[str, concurrent.futures.Future[BlockSlots]] = {}
        self.writes: dict[str, list[concurrent.futures.Future[None]]] = {
            t: [] for t in spec.targets
        }
        self.num_layers = 0  # layers handed to every target so far
        self.is_failed = False
        self.is_committing = False  # its commits (or aborts) are on their way

    def rows_to_copy(self) -> list[int]:
        """Which of the job's blocks a layer must be snapshotted for: those some target
        allocated, once every target's allocation has answered; all of them until then. A
        prefix vLLM had cached is planned again (this request's decode node may lack it), but
        a store that already holds a block wants none of its bytes."""
        if not all(slots.done() for slots in self.slots.values()):
            return list(range(len(self.spec.hashes)))
        wanted = {
            h
            for slots in self.slots.values()
            if not slots.cancelled() and slots.exception() is None
            for h in slots.result().allocated
        }
        return [i for i, h in enumerate(self.spec.hashes) if h in wanted]


class Saver:
    """Snapshots finished layers in the forward pass; writes and commits them beside it."""

    def __init__(self, runtime: ConnectorRuntime) -> None:
        self.runtime = runtime
        self.num_layers = 0
        self.layer_bytes = 0
        self._step = 0
        self._jobs: list[_SaveJob] = []
        # target stores an allocation of which outlived a step's wait: no step waits for them
        # again until they answer one (a paused store holds one step, not every step)
        self._silent: set[str] = set()
        self._copier = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="crescent-kv-copy"
        )

    def configure(self, num_layers: int, layer_bytes: int) -> None:
        self.num_layers, self.layer_bytes = num_layers, layer_bytes

    def close(self) -> None:
        self._copier.shutdown(wait=True, cancel_futures=True)

    @property
    def block_bytes(self) -> int:
        return self.num_layers * self.layer_bytes

    def begin_step(self, step: int, saves: list[SaveSpec]) -> None:
        """Allocate every target's slots now, so they are ready by the time layer 0 is."""
        self._step = step
        self._jobs = []
        for spec in saves:
            job = _SaveJob(spec, step)
            if spec.hashes:
                for target in spec.targets:
                    job.slots[target] = self.runtime.bridge.submit(
                        self.runtime.ops.alloc(target, spec.hashes)
                    )
            self._jobs.append(job)

    def save_layer(self, layer: int, kv_layer: torch.Tensor, failed_requests: set[str]) -> None:
        """Layer `layer` of every job's blocks → a private tensor, then to the bridge."""
        computed_at = time.time()
        for job in self._jobs:
            if not job.spec.hashes:
                continue
            if job.is_failed or job.spec.request_id in failed_requests:
                job.is_failed = True
                continue
            rows = job.rows_to_copy()
            per_block = self.runtime.vllm_blocks_per_block
            ids = torch.tensor(
                [
                    job.spec.vllm_block_ids[r * per_block + k]
                    for r in rows
                    for k in range(per_block)
                ],
                dtype=torch.long,
                device=kv_layer.device,
            )
            data = (
                kv_layer[ids].cpu().contiguous().view(torch.uint8).view(len(rows), self.layer_bytes)
            )
            row_of = {job.spec.hashes[r]: i for i, r in enumerate(rows)}
            self.runtime.events.write(
                "computed",
                request=job.spec.request_id,
                step=self._step,
                layer=layer,
                num_snapshotted=len(rows),
                t=computed_at,
            )
            for target in job.spec.targets:
                job.writes[target].append(
                    self.runtime.bridge.submit(self._store_layer(job, target, layer, data, row_of))
                )
            job.num_layers += 1
            if job.num_layers == self.num_layers:
                self._start_commits(job)  # while the model finishes the step

    async def _store_layer(
        self,
        job: _SaveJob,
        target: str,
        layer: int,
        data: torch.Tensor,
        row_of: dict[bytes, int],
    ) -> None:
        """Layer `layer` of the blocks `target` allocated → its store; `data[row_of[h]]` holds
        block h's bytes."""
        slots = await asyncio.wrap_future(job.slots[target])
        if slots.block_bytes != self.block_bytes:
            raise KvStoreError(
                f"the store's blocks are {slots.block_bytes} bytes, this model's are "
                f"{self.block_bytes}: start the store with --block-bytes {self.block_bytes}"
            )
        if not slots.allocated:
            return
        offsets = [offset + layer * self.layer_bytes for offset in slots.offsets]
        rows = [row_of[h] for h in slots.allocated]
        view = self.runtime.ops.mapped(slots.segment)
        if view is None:
            await self.runtime.ops.write(
                slots.segment, offsets, [memoryview(data[r].numpy()) for r in rows]
            )
        else:
            await asyncio.get_running_loop().run_in_executor(
                self._copier, _copy_rows, view, offsets, data, rows, self.layer_bytes
            )
            KV_TRANSFER_BYTES.labels("write", "mapped").inc(len(rows) * self.layer_bytes)
        self.runtime.events.write(
            "stored",
            request=job.spec.request_id,
            step=job.step,
            layer=layer,
            node=target,
            num_blocks=len(slots.allocated),
            t=time.time(),
        )

    def end_step(self) -> int:
        """Wait until every target store has answered this step's allocations (up to
        `engine_wait_s`), then hand each job's commits to the bridge (none is waited for).
        Returns the number of this step's save jobs.

        The allocations were sent before the forward pass, so they have almost always been
        answered by now. The wait is for the rare step that outruns one: a block the store
        has allocated is one a lookup waits for, but one it has not heard of yet is simply
        missing. Under CPU load, a decode's lookup sent right after this step's first token
        found the blocks of an unanswered allocation missing, and the decode computed them
        again. A store that let one step's wait pass is not waited for again until it
        answers. A decode instance's saves are of prompts it computed and decodes itself: no
        lookup follows its first token, so its steps (and the requests decoding in them) wait
        for none."""
        is_prefill = self.runtime.config.role == "prefill"
        waiting = {
            slots: target
            for job in self._jobs
            for target, slots in job.slots.items()
            if is_prefill and target not in self._silent
        }
        _, unanswered = concurrent.futures.wait(waiting, timeout=self.runtime.config.engine_wait_s)
        for slots in unanswered:
            target = waiting[slots]
            self._silent.add(target)
            slots.add_done_callback(lambda _, target=target: self._silent.discard(target))
        num_jobs = len(self._jobs)
        for job in self._jobs:
            if not job.is_committing:
                job.is_failed = job.is_failed or job.num_layers != self.num_layers
                self._start_commits(job)
        self._jobs = []
        return num_jobs

    def _start_commits(self, job: _SaveJob) -> None:
        job.is_committing = True
        for target in job.spec.targets:
            if target in job.slots:
                self.runtime.bridge.submit(self._finish(job, target))

    async def _finish(self, job: _SaveJob, target: str) -> None:
        """After every layer reached `target`: commit there, or abort if any part failed."""
        span = self.runtime.tracer.start_span(
            "kv.transfer", context=extract_headers(job.spec.trace), start_time=job.started_ns
        )
        span.set_attribute("crescent.num_blocks", len(job.spec.hashes))
        span.set_attribute("crescent.target", target)
        try:
            slots = await asyncio.wrap_future(job.slots[target])
        except Exception as exc:
            log.warning(
                "KV allocation failed; not saving", extra={"node": target, "error": repr(exc)}
            )
            span.set_attribute("crescent.failed", True)
            span.end()
            return
        is_failed = job.is_failed or not await self._writes_done(job, target)
        if self.runtime.config.fault == "delay_commits":
            await asyncio.sleep(COMMIT_DELAY_S)
        span.set_attribute("crescent.failed", is_failed)
        try:
            if is_failed:
                await self.runtime.ops.abort(target, slots.allocated)
            else:
                await self.runtime.ops.commit(target, slots.allocated)
        except Exception as exc:
            log.warning("KV commit failed", extra={"node": target, "error": repr(exc)})
            return
        finally:
            span.end()
        self.runtime.events.write(
            "aborted" if is_failed else "committed",
            request=job.spec.request_id,
            step=job.step,
            node=target,
            num_blocks=len(slots.allocated),
            num_existing=len(slots.existing),
            moved=self._moved(),
            t=time.time(),
        )

    def _moved(self) -> dict[str, int]:
        """Bytes the connector's data plane moved so far, per transport (mapped copies are not
        in it): which road the KV really took."""
        counters = self.runtime.ops.client.transfer_counters()
        return {kind.value: moved.num_bytes for kind, moved in counters.items()}

    async def _writes_done(self, job: _SaveJob, target: str) -> bool:
        try:
            async with asyncio.timeout(self.runtime.config.timeout_s):
                for write in job.writes[target]:
                    await asyncio.wrap_future(write)
        except Exception as exc:
            log.warning(
                "KV save failed; those blocks are not stored",
                extra={"request_id": job.spec.request_id, "node": target, "error": repr(exc)},
            )
            return False
        return True


def _copy_rows(
    view: memoryview, offsets: list[int], data: torch.Tensor, rows: list[int], num_bytes: int
) -> None:
    """data[row] → view[offset:offset + num_bytes] for each pair (torch copies without the GIL)."""
    for offset, row in zip(offsets, rows):
        torch.frombuffer(view[offset : offset + num_bytes], dtype=torch.uint8).copy_(data[row])
