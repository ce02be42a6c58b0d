"""What goes into and comes out of a scheduling decision. Every policy, KV-centric or baseline,
returns these same types, so experiments compare like with like."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PrefillTimeFn = Callable[[int, int], float]
"""(num_tokens, num_cached_tokens) → seconds of prefill compute."""

DecodeStepFn = Callable[[int, int], float]
"""(batch_size, total_context_tokens) → seconds of one decode step, i.e. the TBT. Never less
with a larger batch or more context: the decode choice skips instances on that assumption."""


@dataclass(frozen=True)
class ScheduleRequest:
    request_id: str
    block_hashes: Sequence[bytes]  # chained hashes of the prompt's full blocks, in order
    num_prompt_tokens: int
    block_size: int
    max_tokens: int = 1
    may_prefill_on_decode: bool = True  # False: the first token must come from a prefill instance

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 1 or self.block_size < 1 or self.max_tokens < 0:
            raise ValueError(
                f"request {self.request_id}: bad sizes (prompt {self.num_prompt_tokens}, "
                f"block {self.block_size}, max_tokens {self.max_tokens})"
            )
        if len(self.block_hashes) * self.block_size > self.num_prompt_tokens:
            raise ValueError(
                f"request {self.request_id}: {len(self.block_hashes)} blocks of "
                f"{self.block_size} exceed {self.num_prompt_tokens} prompt tokens"
            )

    @property
    def num_kv_tokens(self) -> int:
        """KV room a decode instance must hold for the whole request."""
        return self.num_prompt_tokens + self.max_tokens


@dataclass(frozen=True)
class CostPredictors:
    """The models a policy prices work with: the conductor builds them from its settings (the
    emulated engine's cost model, or a profile's fitted prefill model), and so does the
    simulator, which runs the conductor's own Scheduler."""

    prefill_s: PrefillTimeFn
    decode_step_s: DecodeStepFn
    kv_bytes_per_token: float
    # How this model derives from a shared one, when it does (the conductor prices an instance
    # with its published profile, corrected): prefill_s(n, p) = prefill_overhead_s +
    # prefill_ratio · base.prefill_s(n, p) and decode_step_s(b, c) = decode_ratio ·
    # base.decode_step_s(b, c). Policies bound hundreds of instances' costs with one evaluation
    # per base, then price the few left in the running with their own functions. None: the
    # model is its own base (ratios 1, no overhead).
    base: CostPredictors | None = None
    prefill_ratio: float = 1.0
    prefill_overhead_s: float = 0.0
    decode_ratio: float = 1.0
    # On a model that is its own base, when decode_step_s is planes (a published CostProfile's):
    # (base_s, per_request_s, per_context_token_s) each, a step being the slowest plane's
    # base_s + per_request_s·b + per_context_token_s·c. A policy then estimates every instance's
    # step in one numpy pass and calls decode_step_s only for the few at the least. Empty: the
    # function alone.
    decode_planes: tuple[tuple[float, float, float], ...] = ()

    def __post_init__(self) -> None:
        terms = (self.prefill_ratio, self.prefill_overhead_s, self.decode_ratio)
        if (self.base is None and terms != (1.0, 0.0, 1.0)) or not min(terms) >= 0:
            raise ValueError(
                f"cost model: ratios and overhead must be >= 0, and 1, 0, 1 without a base; got "
                f"prefill ratio {self.prefill_ratio}, overhead {self.prefill_overhead_s} s, "
                f"decode ratio {self.decode_ratio}"
            )
        if self.base is not None and self.decode_planes:
            raise ValueError("cost model: decode planes belong to a base model, not a derived one")

    @property
    def root(self) -> CostPredictors:
        """The shared model this one derives from (itself when it derives from none)."""
        return self if self.base is None else self.base


@dataclass(frozen=True)
class PrefillChoice:
    """Algorithm 1's pick: where to prefill, which prefix to reuse, and the predicted TTFT terms."""

    instance_id: str
    node: str
    prefix_tokens: int  # reused prefix: local blocks plus any transferred ones
    local_prefix_tokens: int  # what the instance's own node already holds
    source_node: str | None  # node to pull the extra blocks from; None: no transfer
    pull_hashes: tuple[bytes, ...]  # blocks to pull, in prefix order
    transfer_s: float
    queue_s: float
    prefill_s: float

    @property
    def predicted_ttft_s(self) -> float:
        return self.transfer_s + self.queue_s + self.prefill_s


@dataclass(frozen=True)
class DecodeChoice:
    instance_id: str
    predicted_tbt_s: float  # one decode step once this request has joined the batch


class ReplicationReason(enum.Enum):
    ON_DEMAND = "on-demand"  # a request pulls a prefix it lacks; keep it as a replica
    HOT_SPOT = "hot-spot"  # a hot block has too few replicas


@dataclass(frozen=True)
class ReplicationOrder:
    """Pull `hashes` from `source_node`'s store into `target_node`'s and keep them."""

    source_node: str
    target_node: str
    hashes: tuple[bytes, ...]
    reason: ReplicationReason


@dataclass(frozen=True)
class Decision:
    prefill: PrefillChoice
    decode: DecodeChoice
    replication: tuple[ReplicationOrder, ...] = ()
    # conditional disaggregation: the decode instance computes the prompt, predicted to add this
    # much to its step, and `prefill` is unused; None: the prefill instance computes it
    local_prefill_added_s: float | None = None

    @property
    def prefill_on_decode(self) -> bool:
        return self.local_prefill_added_s is not None


class RejectReason(enum.Enum):
    NO_PREFILL = "no-prefill"  # no live prefill instance takes work
    NO_DECODE = "no-decode"  # no live decode instance has KV room
    TTFT_SLO = "ttft-slo"
    TBT_SLO = "tbt-slo"


@dataclass(frozen=True)
class Rejection:
    """Decided before any prefill runs (HTTP 429 with Retry-After; 503 when unavailable)."""

    reason: RejectReason
    detail: str
    retry_after_s: float
    predicted_ttft_s: float | None = None
    predicted_tbt_s: float | None = None
    # Every decode instance that could take the request failed it or gave no answer: the
    # cause is their failure, not the cluster's load.
    is_unavailable: bool = False
