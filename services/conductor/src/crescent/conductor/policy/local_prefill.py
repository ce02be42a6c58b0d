"""Conditional disaggregation: when little of a prompt is left to compute once the decode
node's cached prefix is counted, the decode instance computes it itself.

A remote prefill costs a queue on the prefill instance, a NATS round trip and, before decoding
can start, the decode node loading every block the prefill saved. For a short uncached tail
that overhead is larger than the tail's compute, which on the decode instance only delays its
running batch by about that compute. The rule is a token threshold, or ("auto") the decode
instance's own cost model: the tail runs there when its compute is priced no higher than the
remote prefill's predicted TTFT (which carries the remote path's learned overhead) and within
one TBT SLO, since the running batch's next token waits for it.

Under "auto" the engine batches the prompts an instance computes into one step, so the prompts
this conductor already sent it, whose first token has not come back, count too: each for what
it adds to that step (its compute less the fixed cost of a step, which they share). With them
the step must still fit one TBT SLO, unless the prefill instance would answer this prompt later
than a tenth of the TTFT SLO. Below that, sending the prompt there costs its TTFT little and
spares the running requests an interval over their SLO; above it, as when prefill is the
bottleneck, the prompt's TTFT is the larger risk. In the simulator this kept the per-prompt
rule's gain where prefill is short (the Mooncake slice on 2P2D) and raised effective capacity
where it is not (3P3D 0.996 to 0.999, 4P4D 0.988 to 1.000): bench/README.md, sim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from crescent.conductor.policy.decision import CostPredictors, DecodeChoice, ScheduleRequest
from crescent.conductor.policy.inflight import InflightRequest, InflightTable

LocalPrefillMode = Literal["off", "tokens", "auto"]  # as crescent.common.local_prefill parses them


# The share of the TTFT SLO past which a prompt's remote TTFT lets it stretch a decode
# instance's step beyond one TBT SLO (the module's docstring).
OVERRUN_TTFT_SHARE = 0.1


@dataclass(frozen=True)
class LocalPrefill:
    """When a decode instance computes a prompt itself (see the module's docstring)."""

    mode: LocalPrefillMode = "off"
    max_uncached_tokens: int = 0  # "tokens": the threshold
    max_step_s: float = 0.0  # "auto": the longest the running batch may wait (the TBT SLO)
    overrun_after_s: float = 0.0  # "auto": the remote TTFT past which the step may run over

    @classmethod
    def of(
        cls, mode: LocalPrefillMode, threshold: int, tbt_slo_s: float, ttft_slo_s: float
    ) -> LocalPrefill:
        """The rule of a parsed setting (crescent.common.local_prefill) under these SLOs."""
        if mode == "auto":
            return cls(
                "auto", max_step_s=tbt_slo_s, overrun_after_s=OVERRUN_TTFT_SHARE * ttft_slo_s
            )
        if mode == "tokens":
            return cls("tokens", max_uncached_tokens=threshold)
        return cls()


def prefill_on_decode(
    request: ScheduleRequest,
    rule: LocalPrefill,
    decode_node_prefix_tokens: int,
    decode_costs: CostPredictors,
    remote_ttft_s: float,
    decode: DecodeChoice,
    inflight: InflightTable | Sequence[InflightRequest],
) -> float | None:
    """When the decode instance should compute the prompt itself (the rule is on, the request
    allows it, and the part of the prompt not cached on the decode instance's node is short by
    the rule), what the prompt adds to that instance's step; None otherwise. `decode_costs`:
    the decode instance's cost model; `remote_ttft_s`: the TTFT predicted on the prefill
    instance the policy picked; `decode`: the decode choice; `inflight`: this conductor's
    requests not yet finished."""
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
        # The queue is summed over this conductor's requests in flight: only when it decides.
        is_short = (
            local_s <= remote_ttft_s
            and local_s <= rule.max_step_s
            and (
                remote_ttft_s > rule.overrun_after_s
                or InflightTable.of(inflight).local_prefill_s(decode.instance_id) + local_s
                <= rule.max_step_s
            )
        )
    return added_s if is_short else None


OFF = LocalPrefill()
