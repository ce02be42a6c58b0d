"""What a policy sees of an instance: a frozen copy of the conductor's view at decision time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceSnapshot:
    instance_id: str
    node: str
    num_queued: int
    num_running: int
    queue_time_s: float
    kv_used_tokens: int
    kv_capacity_tokens: int

    @property
    def kv_free_tokens(self) -> int:
        return self.kv_capacity_tokens - self.kv_used_tokens
