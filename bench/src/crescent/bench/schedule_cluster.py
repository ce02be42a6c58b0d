"""The conductor state the scheduling benchmark decides on: a real Scheduler (ClusterView, block
index, bandwidth table, Pricing), fed the way a running conductor is fed.

Every instance registers (InstanceInfo), publishes its own cost profile (two kinds of hardware,
one slower than the other) and sends telemetry (InstanceLoad); the online correction has learned
from earlier requests on every instance (prefill, overhead and decode samples; transfer samples
on a quarter of the prefill instances). The block index holds a shared system prompt replicated
on a quarter of the prefill nodes, 64 sessions extending it (each node holds random-length
prefixes of two), and unrelated blocks everywhere.

Between two timed decisions, `ConductorLoad.between_decisions` does what a busy conductor does
in that time (untimed): it records the last decision, sees an earlier request's prefill end and
its decode start, sees an earlier one finish (its timings correct that instance's pricing),
receives four telemetry messages (1,024 instances every 250 ms at 1,000 decisions a second) and
lets 1 ms pass. So a timed decision pays for whatever the conductor recomputes after such
changes, as it would in production. Of the `num_inflight` requests it keeps in flight (8 by
default), half are prefilling and half decoding: predictive admission projects every one.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field

from crescent.common.codec import encode
from crescent.common.cost_profile import CostProfile, DecodePlane, PrefillCost
from crescent.common.etcd import MirrorEvent
from crescent.common.messages import InstanceInfo, InstanceLoad, PrefillResult
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.policy import Decision, ScheduleRequest
from crescent.conductor.scheduler import Scheduler
from crescent.conductor.settings import ConductorSettings

MODEL = "bench-model"
BLOCK_SIZE = 512
NUM_SESSIONS = 64
SESSIONS_PER_NODE = 2
UNRELATED_BLOCKS_PER_NODE = 64
NUM_REQUESTS = 64
TELEMETRY_PER_DECISION = 4
DECISION_INTERVAL_S = 0.001
TELEMETRY_PERIOD_S = 0.25
DECODE_KV_CAPACITY = 2**22

# LLaMA2-7B-like costs (paper Eq. 1 on a 100 TFLOP/s device; 512 KiB of KV per token).
_LAYERS, _HIDDEN, _FLOPS, _MEMORY_BPS = 32, 4096, 100e12, 1.5e12
KV_BYTES_PER_TOKEN = 32 * 2 * 4096 * 2


def hardware_profile(slowdown: float) -> CostProfile:
    """A published profile of a device `slowdown` times slower than the reference one."""
    return CostProfile(
        model=MODEL,
        prefill=PrefillCost(
            base_s=0.002 * slowdown,
            per_token_s=slowdown * _LAYERS * 22 * _HIDDEN**2 / _FLOPS,
            per_token_pair_s=slowdown * _LAYERS * 4 * _HIDDEN / _FLOPS,
            per_cached_token_s=slowdown * 2e-8,
        ),
        decode=[
            DecodePlane(  # compute-bound
                per_request_s=slowdown * _LAYERS * 22 * _HIDDEN**2 / _FLOPS,
                per_context_token_s=slowdown * _LAYERS * 4 * _HIDDEN / _FLOPS,
            ),
            DecodePlane(  # memory-bound: weights once per step, then every context token's KV
                base_s=slowdown * 12 * _LAYERS * _HIDDEN**2 * 2 / _MEMORY_BPS,
                per_context_token_s=slowdown * KV_BYTES_PER_TOKEN / _MEMORY_BPS,
            ),
        ],
        hardware="fast" if slowdown == 1.0 else "slow",
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class ConductorLoad:
    """A scheduler at `num_instances` prefill + as many decode instances, and the requests."""

    scheduler: Scheduler
    clock: Clock
    requests: list[ScheduleRequest]
    rng: random.Random
    loads: list[InstanceLoad] = field(default_factory=list)
    num_inflight: int = 8
    placed: deque[tuple[ScheduleRequest, Decision]] = field(default_factory=deque)
    decoding: deque[str] = field(default_factory=deque)
    next_load: int = 0
    num_recorded: int = 0

    def between_decisions(self, outcome: Decision | object) -> int:
        """What the conductor does between two decisions: record the last one, learn from a
        finished request, read telemetry, and let time pass. Returns how long the recording
        took, in ns (0: nothing was admitted to record)."""
        scheduler = self.scheduler
        recorded_ns = 0
        if isinstance(outcome, Decision):
            request = self.requests[self.num_recorded % len(self.requests)]
            placed = ScheduleRequest(
                f"{request.request_id}-{self.num_recorded}",
                request.block_hashes,
                request.num_prompt_tokens,
                request.block_size,
                request.max_tokens,
            )
            self.num_recorded += 1
            start = time.perf_counter_ns()
            scheduler.record(placed, outcome, MODEL)
            recorded_ns = time.perf_counter_ns() - start
            self.placed.append((placed, outcome))
        if len(self.placed) > self.num_inflight // 2:
            self._prefilled(*self.placed.popleft())
        if len(self.decoding) > self.num_inflight - self.num_inflight // 2:
            self._finish(self.decoding.popleft())
        for _ in range(TELEMETRY_PER_DECISION):
            load = self.loads[self.next_load % len(self.loads)]
            self.next_load += 1
            scheduler.view.apply_load(_resent(load, self.clock.now))
        self.clock.now += DECISION_INTERVAL_S
        return recorded_ns

    def _prefilled(self, request: ScheduleRequest, decision: Decision) -> None:
        scheduler, rng = self.scheduler, self.rng
        prefill = decision.prefill
        compute_s = prefill.prefill_s * rng.uniform(0.7, 1.3)
        result = PrefillResult(
            request_id=request.request_id,
            first_token=1,
            num_computed_tokens=request.num_prompt_tokens - prefill.prefix_tokens,
            num_cached_tokens=prefill.prefix_tokens,
            queue_s=prefill.queue_s + prefill.transfer_s,
            compute_s=compute_s,
            transfer_s=prefill.transfer_s,
        )
        measured_s = result.queue_s + compute_s + rng.uniform(0.001, 0.01)
        scheduler.on_prefilled(request, decision, result, measured_s)
        scheduler.on_decode_started(request.request_id)
        scheduler.on_decoded(
            request.request_id, decision.decode.predicted_tbt_s * rng.uniform(0.8, 1.4)
        )
        self.decoding.append(request.request_id)

    def _finish(self, request_id: str) -> None:
        self.scheduler.on_finished(request_id, is_ok=True)


def _resent(load: InstanceLoad, now: float) -> InstanceLoad:
    return InstanceLoad(
        role=load.role,
        instance_id=load.instance_id,
        node=load.node,
        sent_at=now,
        period_s=load.period_s,
        num_queued=load.num_queued,
        num_running=load.num_running,
        queue_time_s=load.queue_time_s,
        running_s=load.running_s,
        running_predicted_s=load.running_predicted_s,
        kv_used_tokens=load.kv_used_tokens,
        kv_capacity_tokens=load.kv_capacity_tokens,
        num_context_tokens=load.num_context_tokens,
    )


def _hashes(rng: random.Random, count: int) -> list[bytes]:
    return [rng.randbytes(16) for _ in range(count)]


def _register(scheduler: Scheduler, info: InstanceInfo, profile: CostProfile) -> None:
    key = f"{info.role}/{info.instance_id}"
    scheduler.apply_registry_event(MirrorEvent(f"/crescent/bench/instances/{key}", encode(info)))
    scheduler.pricing.apply_cost_event(MirrorEvent(f"/crescent/bench/costs/{key}", encode(profile)))


def build_conductor(
    num_instances: int,
    num_blocks: int,
    seed: int = 0,
    policy: str = "kv-centric",
    admission: str = "early",
    num_inflight: int = 8,
) -> ConductorLoad:
    rng = random.Random(seed)
    clock = Clock()
    settings = ConductorSettings(
        block_size=BLOCK_SIZE,
        kv_bytes_per_block=BLOCK_SIZE * KV_BYTES_PER_TOKEN,
        # Admission runs (early by default), with SLOs loose enough for half-million-token
        # prompts that every request is admitted, recorded and later learned from.
        ttft_slo_s=1e6,
        tbt_slo_s=1e3,
        admission=admission,
        policy=policy,
    )
    scheduler = Scheduler(settings, ClusterView(clock=clock), clock)
    profiles = (hardware_profile(1.0), hardware_profile(1.6))
    nodes = [f"node-{i:03d}" for i in range(num_instances)]
    loads = []
    for i, node in enumerate(nodes):
        info = InstanceInfo(
            role="prefill",
            instance_id=f"prefill-{i:03d}",
            node=node,
            model=MODEL,
            max_model_len=2**20,
        )
        _register(scheduler, info, profiles[i % 2])
        loads.append(
            InstanceLoad(
                role="prefill",
                instance_id=info.instance_id,
                node=node,
                sent_at=clock.now,
                period_s=TELEMETRY_PERIOD_S,
                num_queued=rng.randint(0, 8),
                num_running=1,
                queue_time_s=rng.uniform(0.0, 3.0),
                running_s=rng.uniform(0.0, 0.1),
            )
        )
    for i in range(num_instances):
        info = InstanceInfo(
            role="decode",
            instance_id=f"decode-{i:03d}",
            node=f"dnode-{i:03d}",
            model=MODEL,
            max_model_len=2**20,
            kv_capacity_tokens=DECODE_KV_CAPACITY,
        )
        _register(scheduler, info, profiles[i % 2])
        used = rng.randint(0, DECODE_KV_CAPACITY // 2)
        loads.append(
            InstanceLoad(
                role="decode",
                instance_id=info.instance_id,
                node=info.node,
                sent_at=clock.now,
                period_s=TELEMETRY_PERIOD_S,
                num_running=rng.randint(0, 64),
                kv_used_tokens=used,
                kv_capacity_tokens=DECODE_KV_CAPACITY,
                num_context_tokens=used,
            )
        )
    for load in loads:
        scheduler.view.apply_load(load)
    _learn(scheduler, num_instances, rng)
    system = _hashes(rng, max(4, num_blocks // 8))
    sessions = [system + _hashes(rng, num_blocks - len(system)) for _ in range(NUM_SESSIONS)]
    index = scheduler.index
    for node in rng.sample(nodes, max(2, num_instances // 4)):
        index.add_many(system, node)
    for node in nodes:
        for session in rng.sample(sessions, SESSIONS_PER_NODE):
            index.add_many(session[: rng.randint(len(system), num_blocks)], node)
        index.add_many(_hashes(rng, UNRELATED_BLOCKS_PER_NODE), node)
    for _ in range(num_instances * 4):  # some links measured slower or faster than the default
        scheduler.bandwidth.set(rng.choice(nodes), rng.choice(nodes), rng.uniform(3e9, 25e9))
    requests = []
    for r in range(NUM_REQUESTS):
        chain = rng.choice(sessions) if r % 5 else system + _hashes(rng, num_blocks - len(system))
        requests.append(
            ScheduleRequest(
                f"r{r}",
                tuple(chain),
                num_blocks * BLOCK_SIZE + rng.randint(1, 511),
                BLOCK_SIZE,
                max_tokens=256,
            )
        )
    return ConductorLoad(scheduler, clock, requests, rng, loads, num_inflight)


def _learn(scheduler: Scheduler, num_instances: int, rng: random.Random) -> None:
    """Earlier requests' errors, as the feedback loop records them: each instance's own."""
    correction = scheduler.pricing.correction
    for i in range(num_instances):
        prefill_id, decode_id = f"prefill-{i:03d}", f"decode-{i:03d}"
        slow = rng.uniform(0.8, 1.6)
        for _ in range(8):
            correction.observe(prefill_id, "prefill", 1.0, slow * rng.uniform(0.9, 1.1))
            correction.observe_overhead(prefill_id, rng.uniform(0.002, 0.01))
            correction.observe(decode_id, "decode", 0.02, 0.02 * rng.uniform(0.8, 1.4))
            if i % 4 == 0:
                correction.observe(prefill_id, "transfer", 0.1, 0.1 * rng.uniform(1.0, 2.0))
