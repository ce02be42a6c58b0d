"""Conditional disaggregation: when little of a prompt is left to compute once the decode
node's cached prefix is counted, the decode instance computes it itself.

A remote prefill costs a queue on the prefill instance, a NATS round trip and, before decoding
can start, the decode node loading every block the prefill saved. For a short uncached tail
that overhead is larger than the tail's compute, which on the decode instance only delays its
running batch by about that compute. The rule is a token threshold, or ("auto") the decode
instance's own cost model: the tail runs there when its compute is priced no higher than the
remote prefill's predicted TTFT (which carries the remote path's learned overhead) and within
one TBT SLO, since the running batch's next token waits for it. Under "auto" the prompts this
conductor already sent that decode instance to compute, and whose first token has not come
back, come first on the TTFT side: the engine batches them with this one into a step that this
prompt's first token waits for. Each counts for what it adds to that step, its compute less
the fixed cost of a step (the cost model's price of nothing), which they share. The TBT bound
stays per prompt: such a step lengthens one interval of each running request, which the
paper's TBT (the mean of a request's longest 10 % of intervals) mostly absorbs, and bounding
the whole step as well cost the simulator a ninth of its effective capacity on the Mooncake
trace slice for a p90 TBT already five times under the SLO (bench/README.md, sim).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from crescent.conductor.policy.decision import CostPredictors, ScheduleRequest
from crescent.conductor.policy.snapshot import InflightRequest

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


def queued_local_prefill_s(inflight: Sequence[InflightRequest], decode_instance_id: str) -> float:
    """What the prompts `decode_instance_id` was sent to compute itself, and has not yet
    answered with a first token, add to its next step."""
    return sum(
        r.local_prefill_added_s for r in inflight if r.decode_instance_id == decode_instance_id
    )


def prefill_on_decode(
    request: ScheduleRequest,
    rule: LocalPrefill,
    decode_node_prefix_tokens: int,
    decode_costs: CostPredictors,
    remote_ttft_s: float,
    queued_local_s: float = 0.0,
) -> float | None:
    """When the decode instance should compute the prompt itself (the rule is on, the request
    allows it, and the part of the prompt not cached on the decode instance's node is short by
    the rule), what the prompt adds to that instance's step; None otherwise. `decode_costs`:
    the decode instance's cost model; `remote_ttft_s`: the TTFT predicted on the prefill
    instance the policy picked; `queued_local_s`: `queued_local_prefill_s` of that decode
    instance."""
    if rule.mode == "off" or not request.may_prefill_on_decode:
        return None
    # The compute alone: the overhead the correction learned is the remote path's messaging and
    # KV hand-off (measured TTFT less queue and compute), which computing on decode saves.
    overhead_s = decode_costs.prefill_overhead_s
    local_s = (
        decode_costs.prefill_s(request.num_prompt_tokens, decode_node_prefix_tokens) - overhead_s
    )
    added_s = max(0.0, local_s - (decode_costs.prefill_s(0, 0) - overhead_s))
    if rule.mode == "tokens":
        is_short = request.num_prompt_tokens - decode_node_prefix_tokens <= rule.max_uncached_tokens
    else:
        is_short = queued_local_s + local_s <= remote_ttft_s and local_s <= rule.max_step_s
    return added_s if is_short else None


OFF = LocalPrefill()
