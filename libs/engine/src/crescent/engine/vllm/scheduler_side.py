"""The scheduler side of CrescentConnector: per request, how many prompt tokens this node's store
supplies; per step, which loads to run and which newly completed full blocks to save where.

The store is asked beside the steps, not inside one: the first time vLLM asks about a request,
the lookup goes to the bridge and vLLM is told "not known yet" (None), so it steps the running
requests and asks again at its next step. A lookup that has no answer within the engine's wait
(`engine_wait_s`: a store paused or gone) counts as nothing held, and the prompt is computed.

It never looks at another node's store: where a prefix comes from is the conductor's plan
(DESIGN §7), and a planned pull has already copied the prefix into this node's store before the
request reaches vLLM (the prefill worker's `_pull_prefix`). So what this node's store holds is
exactly what the request reuses; everything else is computed."""

from __future__ import annotations

import concurrent.futures
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from crescent.common.hashing import block_hashes
from crescent.engine.vllm.plan import (
    PARAM_LOAD,
    PARAM_PLANNED,
    PARAM_SAVE_TO,
    PARAM_TRACE,
    CrescentMetadata,
    LoadSpec,
    SaveSpec,
)
from crescent.engine.vllm.runtime import ConnectorRuntime

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)


@dataclass
class _Lookup:
    """One request's question to the store: its answer in tokens once `asking` is done."""

    num_computed: int
    limit: int  # the prompt tokens a load may supply (the last one is always computed)
    asking: concurrent.futures.Future[int] | None  # leading blocks held; None: nothing to ask
    deadline: float  # monotonic: past it, an unanswered lookup counts as nothing held
    num_tokens: int = 0


@dataclass
class _Tracked:
    hashes: list[bytes]
    block_ids: list[int]
    save_to: list[str]
    trace: dict[str, str]
    num_planned: int = 0  # store blocks below this are already in some SaveSpec


@dataclass
class _Load:
    """A request's load from the store, kept until the request ends: the store's blocks fill
    the request's vLLM blocks from index `first_block` on, `block_ids` in order."""

    request: Request
    first_block: int
    block_ids: list[int]


def _trace(request: Request) -> dict[str, str]:
    return dict((request.kv_transfer_params or {}).get(PARAM_TRACE) or {})


class SchedulerSide:
    """Finds per request how much of its prompt this node's store holds and, per step, what to
    load and what to save."""

    def __init__(self, runtime: ConnectorRuntime) -> None:
        self.runtime = runtime
        self._lookups: dict[str, _Lookup] = {}
        self._tracked: dict[str, _Tracked] = {}
        self._pending_loads: list[LoadSpec] = []
        self._loads: dict[str, _Load] = {}
        self._prompt_hashes: dict[str, list[bytes]] = {}  # request id → its prompt's hashes

    def _hashes(self, request: Request) -> list[bytes]:
        """The prompt's block hashes, computed once per request: its lookup, load and saves all
        need them, on the scheduler's thread (an 8,000-token prompt takes ~0.3 ms)."""
        hashes = self._prompt_hashes.get(request.request_id)
        if hashes is None:
            hashes = block_hashes(
                list(request.prompt_token_ids or []),
                self.runtime.config.block_size,
                self.runtime.config.model,
            )
            self._prompt_hashes[request.request_id] = hashes
        return hashes

    def num_new_matched_tokens(
        self, request: Request, num_computed: int
    ) -> tuple[int | None, bool]:
        """Prompt tokens past `num_computed` that this node's store holds, and whether vLLM
        is to load them asynchronously (ConnectorConfig.load_async, when there are any); None
        while the store's answer is on its way."""
        params = request.kv_transfer_params or {}
        if not params.get(PARAM_LOAD, True):
            return 0, False
        planned = params.get(PARAM_PLANNED)
        if planned is not None and planned <= num_computed:
            return 0, False  # the conductor's plan has the store add nothing to vLLM's cache
        lookup = self._lookups.get(request.request_id)
        if lookup is None or lookup.num_computed != num_computed:
            if lookup is not None and lookup.asking is not None:
                lookup.asking.cancel()
            lookup = self._ask(request, num_computed)
            self._lookups[request.request_id] = lookup
        if lookup.asking is not None:
            if not lookup.asking.done() and time.monotonic() < lookup.deadline:
                return None, False
            lookup.num_tokens = self._answer(request, lookup)
            lookup.asking = None
        return lookup.num_tokens, self._is_async(lookup.num_tokens)

    def _ask(self, request: Request, num_computed: int) -> _Lookup:
        """Send the request's lookup to the bridge (none when no full block is left to load)."""
        prompt = list(request.prompt_token_ids or [])
        vbs, bs = self.runtime.vllm_block_size, self.runtime.config.block_size
        limit = (len(prompt) - 1) // vbs * vbs  # the last prompt token is always computed
        hashes = self._hashes(request)[: (limit + bs - 1) // bs]
        asking = None
        config = self.runtime.config
        if hashes and limit > num_computed:
            # A decode asks right after its prefill's first token, which does not wait for the
            # save's commit: the store waits for blocks still being written, within our deadline.
            wait_s = config.engine_wait_s / 2 if config.role == "decode" else 0.0
            asking = self.runtime.bridge.submit(
                self.runtime.ops.lookup(config.node, hashes, wait_s)
            )
        deadline = time.monotonic() + config.engine_wait_s
        return _Lookup(num_computed, limit, asking, deadline)

    def _answer(self, request: Request, lookup: _Lookup) -> int:
        """The tokens a done (or overdue) lookup found; 0 when it failed or had no answer."""
        asking = lookup.asking
        if not asking.done():
            asking.cancel()
            log.warning(
                "store lookup missed its deadline; computing the whole prompt",
                extra={"request_id": request.request_id},
            )
            return 0
        try:
            local = asking.result()
            if self.runtime.config.fault == "evict_after_lookup" and local >= 2:
                evicted = self._hashes(request)[1:2]
                self.runtime.bridge.call(self.runtime.ops.evict(self.runtime.config.node, evicted))
        except Exception as exc:
            log.warning(
                "store lookup failed; computing the whole prompt",
                extra={"request_id": request.request_id, "error": repr(exc)},
            )
            return 0
        bs = self.runtime.config.block_size
        return max(0, min(local * bs, lookup.limit) - lookup.num_computed)

    def _is_async(self, num_tokens: int) -> bool:
        return self.runtime.config.load_async and num_tokens > 0

    def after_alloc(self, request: Request, block_ids: list[int], num_external: int) -> None:
        request_id = request.request_id
        lookup = self._lookups.pop(request_id, None)
        if num_external > 0 and lookup is not None:
            start, end = lookup.num_computed, lookup.num_computed + num_external
            self._pending_loads.append(self._load_spec(request, block_ids, start, end))
            vbs = self.runtime.vllm_block_size
            self._loads[request_id] = _Load(
                request, start // vbs, block_ids[start // vbs : end // vbs]
            )
        tracked = self._tracked.get(request_id)
        if tracked is not None:
            tracked.block_ids = block_ids
            return
        save_to = list((request.kv_transfer_params or {}).get(PARAM_SAVE_TO) or [])
        if save_to:
            self._tracked[request_id] = _Tracked(
                self._hashes(request),
                block_ids,
                save_to,
                _trace(request),
            )

    def _load_spec(self, request: Request, block_ids: list[int], start: int, end: int) -> LoadSpec:
        vbs, per_block = self.runtime.vllm_block_size, self.runtime.vllm_blocks_per_block
        first_block, last_block = start // (vbs * per_block), (end - 1) // (vbs * per_block)
        hashes = self._hashes(request)[first_block : last_block + 1]
        fills = [
            ((v // per_block) - first_block, v % per_block, block_ids[v])
            for v in range(start // vbs, end // vbs)
        ]
        return LoadSpec(
            request.request_id, hashes, fills, _trace(request), self.runtime.config.load_async
        )

    def build_meta(self, output: SchedulerOutput) -> CrescentMetadata:
        meta = CrescentMetadata(loads=self._pending_loads)
        self._pending_loads = []
        scheduled = output.num_scheduled_tokens
        for new in output.scheduled_new_reqs:
            tracked = self._tracked.get(new.req_id)
            if tracked is not None:
                tracked.block_ids = list(new.block_ids[0])
                self._plan_save(
                    meta,
                    new.req_id,
                    tracked,
                    new.num_computed_tokens + scheduled.get(new.req_id, 0),
                )
        cached = output.scheduled_cached_reqs
        for i, request_id in enumerate(cached.req_ids):
            tracked = self._tracked.get(request_id)
            if tracked is None:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                if request_id in cached.resumed_req_ids:
                    tracked.block_ids = list(new_ids[0])
                else:
                    tracked.block_ids.extend(new_ids[0])
            self._plan_save(
                meta,
                request_id,
                tracked,
                cached.num_computed_tokens[i] + scheduled.get(request_id, 0),
            )
        return meta

    def _plan_save(
        self, meta: CrescentMetadata, request_id: str, tracked: _Tracked, end_tokens: int
    ) -> None:
        """Save the prompt's blocks completed up to `end_tokens` and not yet planned."""
        last = min(end_tokens // self.runtime.config.block_size, len(tracked.hashes))
        if last <= tracked.num_planned:
            return
        per_block = self.runtime.vllm_blocks_per_block
        ids = tracked.block_ids[tracked.num_planned * per_block : last * per_block]
        meta.saves.append(
            SaveSpec(
                request_id,
                tracked.hashes[tracked.num_planned : last],
                ids,
                tracked.save_to,
                tracked.trace,
            )
        )
        tracked.num_planned = last

    def on_load_errors(self, invalid_block_ids: set[int]) -> None:
        """Blocks the worker side could not load: vLLM computes them again, from the first
        failed block of each request on, but the prefill stats it fixed when it scheduled the
        request still count them as cached. Those stats are what the request's output reports
        as `num_cached_tokens` (the prompt tokens the worker reports as loaded, the cluster's
        hit rate, the usage's cached tokens), so they are set to what was really reused; the
        output is emitted only after the recomputation, so no stale count has gone out."""
        if not invalid_block_ids:
            return
        vbs = self.runtime.vllm_block_size
        for load in self._loads.values():
            failed = next(
                (i for i, block_id in enumerate(load.block_ids) if block_id in invalid_block_ids),
                None,
            )
            stats = getattr(load.request, "prefill_stats", None)
            if failed is None or stats is None:
                continue
            reused = (load.first_block + failed) * vbs
            local = min(stats.num_local_cached_tokens, reused)
            external = min(stats.num_external_cached_tokens, reused - local)
            stats.set(stats.num_prompt_tokens, local, external)

    def forget(self, request_id: str) -> None:
        """Drop a finished request: its loads end, and its saves are snapshotted, inside the
        step that ran them."""
        lookup = self._lookups.pop(request_id, None)
        if lookup is not None and lookup.asking is not None:
            lookup.asking.cancel()
        self._tracked.pop(request_id, None)
        self._loads.pop(request_id, None)
        self._prompt_hashes.pop(request_id, None)
