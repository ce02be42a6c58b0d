"""The peers' published routing scores, so experiments compare Crescent's policy with theirs on
the same cluster. Written from their public descriptions, not their code:

- Dynamo's KV router: per worker, cost = overlap_weight · prefill_blocks + decode_blocks, the
  lowest cost wins. prefill_blocks is the prompt work already queued on the worker plus this
  request's blocks that the worker does not hold; decode_blocks the KV blocks it already
  decodes plus this request's. A prefill instance of a disaggregated cluster decodes nothing,
  so for it the cost is the prefill term alone; a decode instance holds no prefix, so for it
  the cost is the decode term alone.
- llm-d's inference scheduler: per endpoint, score = Σ weight · scorer, the highest score wins,
  with its default profile's scorers: prefix (share of the prompt's blocks the endpoint holds,
  weight 3), queue ((max − own) / (max − min) waiting requests over the candidates, 1 when all
  are equal, weight 2) and KV-cache utilisation (1 − used / capacity, weight 2).

Both see only what each instance's own node holds (neither pulls prefixes across nodes), and
ties go to the smaller instance id. Queued prompt work of a prefill instance is read from its
`kv_used_tokens`: the tokens of the jobs it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from crescent.common.block_index import PrefixMatch
from crescent.conductor.policy.decision import ScheduleRequest
from crescent.conductor.policy.snapshot import InstanceSnapshot


@dataclass(frozen=True)
class DynamoWeights:
    overlap_weight: float = 1.0  # Dynamo's default kv-overlap score weight


@dataclass(frozen=True)
class LlmdWeights:
    prefix: float = 3.0
    queue: float = 2.0
    kv_utilization: float = 2.0


def _blocks(tokens: int, block_size: int) -> float:
    return tokens / block_size


def dynamo_prefill_pick(
    request: ScheduleRequest,
    candidates: Sequence[InstanceSnapshot],
    match: PrefixMatch,
    weights: DynamoWeights = DynamoWeights(),
) -> InstanceSnapshot:
    """The prefill instance with the least overlap-weighted prefill blocks (never empty input)."""
    size = request.block_size

    def cost(instance: InstanceSnapshot) -> tuple[float, str]:
        cached = min(match.length(instance.node) * size, request.num_prompt_tokens)
        new_blocks = _blocks(request.num_prompt_tokens - cached, size)
        return weights.overlap_weight * (
            _blocks(instance.kv_used_tokens, size) + new_blocks
        ), instance.instance_id

    return min(candidates, key=cost)


def dynamo_decode_pick(
    request: ScheduleRequest, candidates: Sequence[InstanceSnapshot]
) -> InstanceSnapshot:
    """The decode instance with the fewest KV blocks once this request has joined."""
    size = request.block_size
    return min(
        candidates,
        key=lambda s: (_blocks(s.kv_used_tokens + request.num_kv_tokens, size), s.instance_id),
    )


def _queue_scores(candidates: Sequence[InstanceSnapshot]) -> list[float]:
    queued = [s.num_queued for s in candidates]
    low, high = min(queued), max(queued)
    if high == low:
        return [1.0] * len(candidates)
    return [(high - q) / (high - low) for q in queued]


def _kv_utilization_score(instance: InstanceSnapshot) -> float:
    if instance.kv_capacity_tokens <= 0:
        return 1.0  # reports no KV capacity (a prefill instance): nothing to balance
    return 1.0 - min(1.0, max(0, instance.kv_used_tokens) / instance.kv_capacity_tokens)


def _best(candidates: Sequence[InstanceSnapshot], scores: Sequence[float]) -> InstanceSnapshot:
    ranked = sorted(zip(candidates, scores), key=lambda pair: (-pair[1], pair[0].instance_id))
    return ranked[0][0]


def llmd_prefill_pick(
    request: ScheduleRequest,
    candidates: Sequence[InstanceSnapshot],
    match: PrefixMatch,
    weights: LlmdWeights = LlmdWeights(),
) -> InstanceSnapshot:
    """The prefill instance with the highest weighted prefix + queue + KV-utilisation score."""
    num_blocks = len(request.block_hashes)
    queue = _queue_scores(candidates)
    scores = []
    for instance, queue_score in zip(candidates, queue):
        prefix = match.length(instance.node) / num_blocks if num_blocks else 0.0
        scores.append(
            weights.prefix * prefix
            + weights.queue * queue_score
            + weights.kv_utilization * _kv_utilization_score(instance)
        )
    return _best(candidates, scores)


def llmd_decode_pick(
    candidates: Sequence[InstanceSnapshot], weights: LlmdWeights = LlmdWeights()
) -> InstanceSnapshot:
    """The decode instance with the highest weighted queue + KV-utilisation score."""
    queue = _queue_scores(candidates)
    scores = [
        weights.queue * q + weights.kv_utilization * _kv_utilization_score(s)
        for s, q in zip(candidates, queue)
    ]
    return _best(candidates, scores)
