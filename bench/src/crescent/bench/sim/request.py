"""One simulated request from arrival to its last token, and what became of it."""

from __future__ import annotations

import enum

from crescent.bench.trace import TRACE_BLOCK_TOKENS
from crescent.conductor.policy import Decision


class Status(enum.Enum):
    PENDING = "pending"
    OK = "ok"
    REJECTED = "rejected"  # by admission, before any prefill ran
    REJECTED_AFTER_PREFILL = "rejected-after-prefill"  # baseline admission: its prefill was wasted


class SimRequest:
    __slots__ = (
        "arrival_s",
        "blocks",
        "cached_tokens",
        "compute_s",
        "decision",
        "decode_id",
        "first_emission",
        "first_token_s",
        "index",
        "last_emission",
        "num_cached_blocks",
        "num_output",
        "num_prompt",
        "predicted_prefill_s",
        "pull_done_s",
        "reject_reason",
        "request_id",
        "status",
        "tbt_s",
    )

    def __init__(
        self,
        index: int,
        arrival_s: float,
        num_prompt: int,
        num_output: int,
        blocks: tuple[bytes, ...],
    ) -> None:
        self.index = index
        self.request_id = f"r{index}"
        self.arrival_s = arrival_s
        self.num_prompt = num_prompt
        self.num_output = num_output
        self.blocks = blocks  # full prompt blocks, as chained-hash stand-ins
        self.status = Status.PENDING
        self.reject_reason = ""
        self.decision: Decision | None = None
        self.decode_id = ""
        self.predicted_prefill_s = 0.0
        self.cached_tokens = 0
        self.num_cached_blocks = 0  # leading blocks its prefill found stored when the job came
        self.pull_done_s = 0.0  # when its planned prefix pull has landed
        self.compute_s = 0.0
        self.first_token_s: float | None = None
        self.first_emission = 0
        self.last_emission = 0
        self.tbt_s = 0.0

    def reuse_blocks(self, num_blocks: int) -> None:
        """Its prefill loads its first `num_blocks` blocks; the last prompt token is always
        computed."""
        self.num_cached_blocks = num_blocks
        self.cached_tokens = min(num_blocks * TRACE_BLOCK_TOKENS, self.num_prompt - 1)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def is_prefilled(self) -> bool:
        return self.first_token_s is not None
