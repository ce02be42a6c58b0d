"""What every engine returns to its worker, whatever runs underneath."""

from __future__ import annotations

from dataclasses import dataclass

FINISH_LENGTH = "length"
FINISH_STOP = "stop"
FINISH_ABORT = "abort"


@dataclass
class PrefillOutput:
    first_token: int
    num_computed_tokens: int
    num_cached_tokens: int
    compute_s: float


@dataclass
class DecodeStep:
    token_ids: list[int]
    finish_reason: str | None = None
    num_cached_tokens: int | None = None  # on the first step: prompt tokens that were not computed
