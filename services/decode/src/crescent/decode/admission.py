"""Local admission of a decode instance: KV room in tokens, held from reserve to finish, and
the predicted time between tokens once a request has joined the batch, against the TBT SLO.

A reservation that is never started (its conductor died between reserve and start) expires,
so a crashed caller cannot leak this instance's capacity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple


class _Reserved(NamedTuple):
    num_tokens: int  # prompt + max output: the KV room held
    expires_at: float
    num_prompt_tokens: int  # the context it brings to the batch when it starts


@dataclass
class KvLedger:
    capacity_tokens: int
    reserved: dict[str, _Reserved] = field(default_factory=dict)
    active: dict[str, int] = field(default_factory=dict)  # id → tokens
    # Kept as entries come and go: every reservation reads both, and a sum would visit the
    # whole running batch each time.
    used_tokens: int = field(default=0, init=False)  # held by reservations and running requests
    num_reserved_prompt_tokens: int = field(default=0, init=False)

    @property
    def is_full(self) -> bool:
        """No room left for even a one-token request."""
        return self.used_tokens >= self.capacity_tokens

    def expire(self, now: float) -> list[str]:
        expired = [rid for rid, held in self.reserved.items() if held.expires_at <= now]
        for rid in expired:
            self._unreserve(rid)
        return expired

    def can_reserve(self, num_tokens: int, now: float) -> bool:
        self.expire(now)
        return self.used_tokens + num_tokens <= self.capacity_tokens

    def reserve(
        self, request_id: str, num_tokens: int, expires_at: float, num_prompt_tokens: int = 0
    ) -> None:
        self._unreserve(request_id)
        self.reserved[request_id] = _Reserved(num_tokens, expires_at, num_prompt_tokens)
        self.used_tokens += num_tokens
        self.num_reserved_prompt_tokens += num_prompt_tokens

    def activate(self, request_id: str, num_tokens: int, now: float) -> bool:
        """Turn a reservation into a running request; without one (it expired), admit only if
        there is room. A start that needs more than its reservation holds is refused."""
        held = self.reserved.get(request_id)
        if held is not None and held[0] < num_tokens:
            return False
        self._unreserve(request_id)
        if held is None and not self.can_reserve(num_tokens, now):
            return False
        self.used_tokens += num_tokens - self.active.get(request_id, 0)
        self.active[request_id] = num_tokens
        return True

    def release(self, request_id: str) -> None:
        self._unreserve(request_id)
        self.used_tokens -= self.active.pop(request_id, 0)

    def _unreserve(self, request_id: str) -> None:
        held = self.reserved.pop(request_id, None)
        if held is not None:
            self.used_tokens -= held.num_tokens
            self.num_reserved_prompt_tokens -= held.num_prompt_tokens


@dataclass(frozen=True)
class TbtCheck:
    """Would one more request push this instance's step time past the TBT SLO? The batch it
    joins is the running one plus every reservation not yet started (they join first)."""

    step_s: Callable[[int, int], float]  # (batch size, total context tokens) → seconds per step

    def predicted_tbt_s(
        self, num_running: int, num_context_tokens: int, ledger: KvLedger, num_prompt_tokens: int
    ) -> float:
        return self.step_s(
            num_running + len(ledger.reserved) + 1,
            num_context_tokens + ledger.num_reserved_prompt_tokens + num_prompt_tokens,
        )
