"""Local admission of a decode instance: KV room in tokens, held from reserve to finish.

A reservation that is never started (its conductor died between reserve and start) expires,
so a crashed caller cannot leak this instance's capacity.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class KvLedger:
    capacity_tokens: int
    reserved: dict[str, tuple[int, float]] = field(default_factory=dict)  # id → (tokens, expires_at)
    active: dict[str, int] = field(default_factory=dict)  # id → tokens

    @property
    def used_tokens(self) -> int:
        return sum(t for t, _ in self.reserved.values()) + sum(self.active.values())

    def expire(self, now: float) -> list[str]:
        expired = [rid for rid, (_, expires_at) in self.reserved.items() if expires_at <= now]
        for rid in expired:
            del self.reserved[rid]
        return expired

    def can_reserve(self, num_tokens: int, now: float) -> bool:
        self.expire(now)
        return self.used_tokens + num_tokens <= self.capacity_tokens

    def reserve(self, request_id: str, num_tokens: int, expires_at: float) -> None:
        self.reserved[request_id] = (num_tokens, expires_at)

    def activate(self, request_id: str, num_tokens: int, now: float) -> bool:
        """Turn a reservation into a running request; without one (it expired), admit only if
        there is room. A start that needs more than its reservation holds is refused."""
        held = self.reserved.get(request_id)
        if held is not None and held[0] < num_tokens:
            return False
        self.reserved.pop(request_id, None)
        if held is None and not self.can_reserve(num_tokens, now):
            return False
        self.active[request_id] = num_tokens
        return True

    def release(self, request_id: str) -> None:
        self.reserved.pop(request_id, None)
        self.active.pop(request_id, None)
