"""Conditional disaggregation: when little of a prompt is left to compute once the decode
node's cached prefix is counted, the decode instance computes it itself.

A remote prefill costs a queue on the prefill instance, a NATS round trip and, before decoding
can start, the decode node loading every block the prefill saved. For a short uncached tail
that overhead is larger than the tail's compute, which on the decode instance only delays its
running batch by about that compute. The rule is a token threshold, or ("auto") the decode
instance's own cost model: the tail runs there when its compute is priced no higher than the
remote prefill's predicted TTFT (which carries the remote path's learned overhead) and within
one TBT SLO, since the running batch's next token waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from crescent.conductor.policy.decision import CostPredictors, ScheduleRequest

LocalPrefillMode = Literal["off", "tokens", "auto"]


@dataclass(frozen=True)
class LocalPrefill:
    """When a decode instance computes a prompt itself (see the module's docstring)."""

    mode: LocalPrefillMode = "off"
    max_uncached_tokens: int = 0  # "tokens": the threshold
    max_step_s: float = 0.0  # "auto": the longest the running batch may wait (the TBT SLO)

    @classmethod
    def parse(cls, text: str, tbt_slo_s: float) -> LocalPrefill:
        """`off` (or 0), `auto`, or a number of uncached tokens."""
        value = text.strip().lower()
        if value in ("off", "0"):
            return cls()
        if value == "auto":
            return cls("auto", max_step_s=tbt_slo_s)
        if value.isdigit():
            return cls("tokens", max_uncached_tokens=int(value))
        raise ValueError(f"expected off, auto or a number of tokens, got {text!r}")


def prefill_on_decode(
    request: ScheduleRequest,
    rule: LocalPrefill,
    decode_node_prefix_tokens: int,
    decode_costs: CostPredictors,
    remote_ttft_s: float,
) -> bool:
    """True when the decode instance should compute the prompt itself: the rule is on, the
    request allows it, and the part of the prompt not cached on the decode instance's node is
    short by the rule (`decode_costs`: the decode instance's cost model; `remote_ttft_s`: the
    TTFT predicted on the prefill instance the policy picked)."""
    if rule.mode == "off" or not request.may_prefill_on_decode:
        return False
    if rule.mode == "tokens":
        return request.num_prompt_tokens - decode_node_prefix_tokens <= rule.max_uncached_tokens
    # The compute alone: the overhead the correction learned is the remote path's messaging and
    # KV hand-off (measured TTFT less queue and compute), which computing on decode saves.
    local_s = (
        decode_costs.prefill_s(request.num_prompt_tokens, decode_node_prefix_tokens)
        - decode_costs.prefill_overhead_s
    )
    return local_s <= min(remote_ttft_s, rule.max_step_s)


OFF = LocalPrefill()
