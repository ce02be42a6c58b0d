"""The paper's coupled baselines (§7.1): vLLM-style instances that run prefill and decode in one
engine on every node, behind a round-robin load balancer (the baseline's own, not Crescent's
conductor).

- `vllm`: a waiting prompt is prefilled in a step of its own while the running batch waits
  (vLLM 0.5 without chunked prefill): every running request's next token interval grows by the
  whole prefill.
- `vllm-prefix-cache`: the same, and a prompt reuses the prefix that this instance's HBM still
  holds; cached blocks live in the KV space that running requests do not use, LRU.
- `vllm-chunked`: each step carries one token of every running request plus a chunk of the
  waiting prompt, within a token budget; the step takes the decode time plus the chunk's
  prefill time (summed: a mixed step is priced as if its two parts ran back to back).

A request is admitted into the engine when its prompt + max output fit in the KV room and the
batch has fewer than max_num_seqs requests; until then it waits in the instance's queue.
"""

from __future__ import annotations

from collections import deque

from crescent.bench.sim.batch import Batch
from crescent.bench.sim.config import SimConfig
from crescent.bench.sim.events import EventLoop
from crescent.bench.sim.request import SimRequest, Status
from crescent.bench.sim.store import NodeStore
from crescent.bench.trace import TRACE_BLOCK_TOKENS


class CoupledInstance:
    def __init__(
        self, instance_id: str, kv_capacity_tokens: int, with_prefix_cache: bool, max_num_seqs: int
    ) -> None:
        self.instance_id = instance_id
        self.max_num_seqs = max_num_seqs
        self.kv_capacity_tokens = kv_capacity_tokens
        self.kv_used_tokens = 0
        self.waiting: deque[SimRequest] = deque()
        self.batch = Batch()
        self.prefilling: SimRequest | None = None  # chunked: the prompt being computed
        self.num_prefilled = 0  # chunked: its tokens done so far (cached ones included)
        self.is_stepping = False
        self.cache = (
            NodeStore(instance_id, kv_capacity_tokens // TRACE_BLOCK_TOKENS)
            if with_prefix_cache
            else None
        )

    def can_admit(self, request: SimRequest) -> bool:
        return (
            self.batch.num_running + (self.prefilling is not None) < self.max_num_seqs
            and self.kv_used_tokens + request.num_prompt + request.num_output
            <= self.kv_capacity_tokens
        )

    def admit(self, request: SimRequest) -> None:
        self.kv_used_tokens += request.num_prompt + request.num_output
        self._resize_cache()

    def leave(self, request: SimRequest) -> None:
        self.kv_used_tokens -= request.num_prompt + request.num_output
        self._resize_cache()

    def _resize_cache(self) -> None:
        if self.cache is not None:
            self.cache.set_capacity(
                max(0, self.kv_capacity_tokens - self.kv_used_tokens) // TRACE_BLOCK_TOKENS
            )


class CoupledCluster:
    def __init__(self, config: SimConfig, loop: EventLoop) -> None:
        self.config = config
        self.loop = loop
        self.costs = config.costs()
        self.is_chunked = config.coupled == "vllm-chunked"
        with_cache = config.coupled == "vllm-prefix-cache"
        self.instances = [
            CoupledInstance(
                f"vllm-{i}", config.kv_capacity_tokens(), with_cache, config.max_num_seqs
            )
            for i in range(config.num_nodes)
        ]
        self._next = 0
        self.num_open = 0
        self.max_replicas = 1 if with_cache else 0

    def start(self) -> None:
        """Nothing runs on a timer in a coupled cluster."""

    def submit(self, request: SimRequest) -> None:
        self.num_open += 1
        self.loop.at(request.arrival_s, self._arrive, request)

    def _arrive(self, request: SimRequest) -> None:
        instance = self.instances[self._next]
        self._next = (self._next + 1) % len(self.instances)
        instance.waiting.append(request)
        if not instance.is_stepping:
            self._step(instance)

    def _step(self, instance: CoupledInstance) -> None:
        """Pick and time the next step; idle when there is nothing to do."""
        batch = instance.batch
        if self.is_chunked:
            self._step_chunked(instance)
            return
        if instance.waiting and instance.can_admit(instance.waiting[0]):
            request = instance.waiting.popleft()
            instance.admit(request)
            cached = 0
            if instance.cache is not None:
                run = instance.cache.prefix_run(request.blocks)
                instance.cache.read(request.blocks[:run])
                cached = min(run * TRACE_BLOCK_TOKENS, request.num_prompt - 1)
            request.cached_tokens = cached
            request.compute_s = self.costs.prefill_s(request.num_prompt, cached)
            instance.is_stepping = True
            self.loop.after(request.compute_s, self._prefill_done, (instance, request))
        elif batch.num_running:
            instance.is_stepping = True
            self.loop.after(
                self.costs.decode_step_s(batch.num_running, batch.context_tokens),
                self._decode_done,
                instance,
            )
        else:
            instance.is_stepping = False

    def _step_chunked(self, instance: CoupledInstance) -> None:
        batch = instance.batch
        if (
            instance.prefilling is None
            and instance.waiting
            and instance.can_admit(instance.waiting[0])
        ):
            instance.prefilling = instance.waiting.popleft()
            instance.admit(instance.prefilling)
            instance.num_prefilled = 0
        chunk = 0
        if instance.prefilling is not None:
            budget = max(0, self.config.chunk_tokens - batch.num_running)
            chunk = min(budget, instance.prefilling.num_prompt - instance.num_prefilled)
        if not batch.num_running and not chunk:
            instance.is_stepping = False
            return
        duration = (
            self.costs.decode_step_s(batch.num_running, batch.context_tokens)
            if batch.num_running
            else 0.0
        )
        if chunk:
            done = instance.num_prefilled
            chunk_s = self.costs.prefill_s(done + chunk, done)
            instance.prefilling.compute_s += chunk_s
            duration += chunk_s
        instance.is_stepping = True
        self.loop.after(duration, self._chunked_done, (instance, chunk))

    def _chunked_done(self, step: tuple[CoupledInstance, int]) -> None:
        instance, chunk = step
        had_running = instance.batch.num_running > 0
        if had_running:
            self._emit(instance)
        if chunk:
            instance.num_prefilled += chunk
            request = instance.prefilling
            if instance.num_prefilled >= request.num_prompt:
                instance.prefilling = None
                self._first_token(instance, request)
        self._step(instance)

    def _prefill_done(self, step: tuple[CoupledInstance, SimRequest]) -> None:
        instance, request = step
        if instance.cache is not None:
            instance.cache.write(request.blocks)
        self._first_token(instance, request)
        self._step(instance)

    def _first_token(self, instance: CoupledInstance, request: SimRequest) -> None:
        request.first_token_s = self.loop.now
        if request.num_output <= 1:
            instance.leave(request)
            self._finish(request)
        else:
            instance.batch.add(request)

    def _decode_done(self, instance: CoupledInstance) -> None:
        self._emit(instance)
        self._step(instance)

    def _emit(self, instance: CoupledInstance) -> None:
        for request in instance.batch.emit(self.loop.now):
            instance.leave(request)
            self._finish(request)

    def _finish(self, request: SimRequest) -> None:
        request.status = Status.OK
        self.num_open -= 1
