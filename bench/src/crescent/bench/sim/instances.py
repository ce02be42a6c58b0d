"""Simulated prefill and decode instances of a disaggregated cluster: their queues, their KV
room, and the telemetry they publish (the fields the real workers put in InstanceLoad)."""

from __future__ import annotations

from collections import deque

from crescent.bench.sim.batch import Batch
from crescent.bench.sim.request import SimRequest
from crescent.common.messages import InstanceLoad


class PrefillInstance:
    """One prompt at a time, first come first served, like the prefill worker's turn lock."""

    def __init__(self, instance_id: str, node: str) -> None:
        self.instance_id = instance_id
        self.node = node
        self.queue: deque[SimRequest] = deque()
        self.running: SimRequest | None = None
        self.running_ends_s = 0.0
        self.num_queued_tokens = 0
        self.is_draining = False  # takes no new work; leaves once what it holds is done
        self.drain_announced_s: float | None = None  # when its telemetry first said so
        self.received: dict[str, int] = {}  # conductor → highest assignment number taken in

    @property
    def is_idle(self) -> bool:
        return self.running is None

    @property
    def holds_work(self) -> bool:
        return self.running is not None or bool(self.queue)

    def queue_time_s(self, now: float) -> float:
        """What is left of the running job plus the predicted time of every queued one."""
        left = max(0.0, self.running_ends_s - now) if self.running is not None else 0.0
        return left + sum(r.predicted_prefill_s for r in self.queue)

    def load(self, now: float, period_s: float) -> InstanceLoad:
        # kv_used_tokens: the prompt tokens of the jobs it holds (queued prompt work).
        return InstanceLoad(
            role="prefill",
            instance_id=self.instance_id,
            node=self.node,
            sent_at=now,
            period_s=period_s,
            num_queued=len(self.queue) + (self.running is not None),
            queue_time_s=self.queue_time_s(now),
            kv_used_tokens=self.num_queued_tokens,
            received=dict(self.received),
            **_accepting(self.is_draining),
        )


class DecodeInstance:
    """Continuous batching over a KV ledger: room is reserved for prompt + max output tokens
    when the conductor places a request and held until it finishes (the decode worker's
    local admission)."""

    def __init__(self, instance_id: str, node: str, kv_capacity_tokens: int) -> None:
        self.instance_id = instance_id
        self.node = node
        self.kv_capacity_tokens = kv_capacity_tokens
        self.kv_used_tokens = 0
        self.reserved: dict[str, int] = {}  # request id → tokens, until the request leaves
        self.waiting: dict[str, int] = {}  # reserved, not yet in the batch: id → prompt tokens
        self.batch = Batch()
        self.joining: list[SimRequest] = []
        # Prompts it computes itself in its next step, and those of the step under way (both
        # reserved here, so `holds_work` counts them).
        self.to_compute: list[SimRequest] = []
        self.computing: list[SimRequest] = []
        self.is_stepping = False
        self.is_draining = False  # takes no new work; leaves once what it holds is done
        self.drain_announced_s: float | None = None  # when its telemetry first said so
        self.received: dict[str, int] = {}  # conductor → highest assignment number taken in

    @property
    def holds_work(self) -> bool:
        return bool(self.reserved) or self.batch.num_running > 0 or bool(self.joining)

    def can_reserve(self, num_tokens: int) -> bool:
        return self.kv_used_tokens + num_tokens <= self.kv_capacity_tokens

    def reserve(self, request_id: str, num_tokens: int, num_prompt_tokens: int) -> None:
        self.reserved[request_id] = num_tokens
        self.kv_used_tokens += num_tokens
        self.waiting[request_id] = num_prompt_tokens

    def release(self, request_id: str) -> None:
        num_tokens = self.reserved.pop(request_id, None)
        if num_tokens is None:
            return
        self.kv_used_tokens -= num_tokens
        self.waiting.pop(request_id, None)

    def join(self, request_id: str) -> None:
        """A reserved request joins the batch at a step boundary."""
        self.waiting.pop(request_id, None)

    def load(self, now: float, period_s: float) -> InstanceLoad:
        return InstanceLoad(
            role="decode",
            instance_id=self.instance_id,
            node=self.node,
            sent_at=now,
            period_s=period_s,
            num_queued=len(self.waiting),
            num_running=self.batch.num_running,
            kv_used_tokens=self.kv_used_tokens,
            kv_capacity_tokens=self.kv_capacity_tokens,
            num_context_tokens=self.batch.context_tokens,
            num_queued_context_tokens=sum(self.waiting.values()),
            received=dict(self.received),
            **_accepting(self.is_draining),
        )


def take_in(received: dict[str, int], conductor: str, number: int) -> None:
    """An instance takes in an assignment: its telemetry acknowledges the number from now on."""
    received[conductor] = max(received.get(conductor, 0), number)


def _accepting(is_draining: bool) -> dict:
    """The telemetry fields of a draining instance (as the real workers send them)."""
    return {"is_accepting": False, "not_accepting_reason": "draining"} if is_draining else {}
