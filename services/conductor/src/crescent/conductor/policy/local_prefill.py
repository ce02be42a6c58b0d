"""Conditional disaggregation: when little of a prompt is left to compute once the decode
node's cached prefix is counted, the decode instance computes it itself.

A remote prefill costs a queue on the prefill instance, a NATS round trip and, before decoding
can start, the decode node loading every block the prefill saved. For a short uncached tail
that overhead is larger than the tail's compute, which on the decode instance only delays its
running batch by about that compute. The threshold is in uncached tokens.
"""

from __future__ import annotations

from crescent.conductor.policy.decision import ScheduleRequest


def prefill_on_decode(
    request: ScheduleRequest, decode_node_prefix_tokens: int, max_uncached_tokens: int
) -> bool:
    """True when the decode instance should compute the prompt itself: the feature is on
    (`max_uncached_tokens` > 0), the request allows it, and the prompt's part not cached on the
    decode instance's node is at most `max_uncached_tokens`."""
    if max_uncached_tokens <= 0 or not request.may_prefill_on_decode:
        return False
    return request.num_prompt_tokens - decode_node_prefix_tokens <= max_uncached_tokens
