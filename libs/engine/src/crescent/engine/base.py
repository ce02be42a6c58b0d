"""What every engine returns to its worker, whatever runs underneath."""

from __future__ import annotations

from dataclasses import dataclass, field

from crescent.common.errors import RecoverableError
from crescent.common.messages import TokenLogprobs

FINISH_LENGTH = "length"
FINISH_STOP = "stop"
FINISH_ABORT = "abort"


class InvalidRequestError(RecoverableError):
    """The engine refuses the request's parameters (a JSON schema its grammar backend cannot
    compile, a penalty the emulated engine cannot apply): no instance would take it, so the
    client gets a 400 instead of a retry elsewhere. Replies carry this class name as their code."""


@dataclass
class PrefillOutput:
    first_token: int
    num_computed_tokens: int
    num_cached_tokens: int
    compute_s: float
    first_logprobs: TokenLogprobs | None = None
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)


@dataclass
class DecodeStep:
    token_ids: list[int]
    finish_reason: str | None = None
    num_cached_tokens: int | None = None  # on the first step: prompt tokens that were not computed
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per token, when asked for
