"""KVCache-centric prefill choice: Algorithm 1 of the paper (§4.1) with §4.2's cache balancing.

For every prefill instance, TTFT = T_transfer + T_queue + T_prefill(n, prefix). The instance's
prefix is what its own node holds, unless the best prefix anywhere is longer by more than
`kvcache_balancing_threshold` as a ratio (best_len / local_len > threshold, Algorithm 1 line 5;
a node holding nothing has an infinite ratio): then the missing blocks are pulled from a node
holding the best prefix and the request reuses all of it. §4.2 adds that the pull must beat
recomputing the same tokens; `transfer_only_if_cheaper` applies that test (off: Algorithm 1
verbatim). The instance with the least TTFT wins; equal TTFTs go to the smaller instance id.

Without transfers (`allow_transfer=False`) this is the paper's local cache-aware scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from crescent.conductor.policy.bandwidth import BandwidthTable
from crescent.conductor.policy.block_index import PrefixMatch
from crescent.conductor.policy.decision import CostPredictors, PrefillChoice, ScheduleRequest
from crescent.conductor.policy.snapshot import InstanceSnapshot

DEFAULT_BALANCING_THRESHOLD = 1.5


@dataclass(frozen=True)
class _NodePlan:
    """How an instance on one node would get its prefix; the same for every instance there."""

    prefix_blocks: int
    local_blocks: int
    source: str | None
    transfer_s: float
    prefill_s: float


class _Pricer:
    """Prices prefixes for one request, memoising T_prefill per prefix length (few distinct)."""

    def __init__(self, request: ScheduleRequest, predictors: CostPredictors) -> None:
        self.request = request
        self.predictors = predictors
        self._prefill: dict[int, float] = {}

    def prefill_s(self, prefix_blocks: int) -> float:
        cached = self._prefill.get(prefix_blocks)
        if cached is None:
            n = self.request.num_prompt_tokens
            # The last prompt token is always computed: its logits give the first token.
            reused = min(prefix_blocks * self.request.block_size, n - 1)
            cached = self._prefill[prefix_blocks] = max(0.0, self.predictors.prefill_s(n, reused))
        return cached

    def transfer_bytes(self, num_blocks: int) -> float:
        return num_blocks * self.request.block_size * self.predictors.kv_bytes_per_token


def exceeds_threshold(best_len: int, local_len: int, threshold: float) -> bool:
    """Algorithm 1, line 5: best_len / local_len > threshold, with x/0 = ∞ for x > 0."""
    if best_len <= local_len:
        return False
    return local_len == 0 or best_len / local_len > threshold


def _plan_node(node: str, match: PrefixMatch, pricer: _Pricer, bandwidth: BandwidthTable,
               threshold: float, allow_transfer: bool, transfer_only_if_cheaper: bool) -> _NodePlan:
    local = match.length(node)
    local_plan = _NodePlan(local, local, None, 0.0, pricer.prefill_s(local))
    best = match.best_len
    if not allow_transfer or not exceeds_threshold(best, local, threshold):
        return local_plan
    source = min(match.best_nodes, key=lambda src: (-bandwidth.get(src, node), src))
    transfer_s = bandwidth.transfer_s(source, node, pricer.transfer_bytes(best - local))
    prefill_s = pricer.prefill_s(best)
    if transfer_only_if_cheaper and not transfer_s < local_plan.prefill_s - prefill_s:
        return local_plan
    return _NodePlan(best, local, source, transfer_s, prefill_s)


def choose_prefill(request: ScheduleRequest, candidates: Sequence[InstanceSnapshot], match: PrefixMatch,
                   bandwidth: BandwidthTable, predictors: CostPredictors,
                   threshold: float = DEFAULT_BALANCING_THRESHOLD, *, allow_transfer: bool = True,
                   transfer_only_if_cheaper: bool = True) -> PrefillChoice | None:
    """The candidate with the least predicted TTFT; None when there is no candidate."""
    if not threshold > 0:
        raise ValueError(f"kvcache_balancing_threshold must be > 0, got {threshold}")
    pricer = _Pricer(request, predictors)
    plans: dict[str, _NodePlan] = {}
    winner: InstanceSnapshot | None = None
    winner_key: tuple[float, str] | None = None
    for instance in candidates:
        plan = plans.get(instance.node)
        if plan is None:
            plan = plans[instance.node] = _plan_node(instance.node, match, pricer, bandwidth, threshold,
                                                     allow_transfer, transfer_only_if_cheaper)
        key = (plan.transfer_s + instance.queue_time_s + plan.prefill_s, instance.instance_id)
        if winner_key is None or key < winner_key:
            winner, winner_key = instance, key
    if winner is None:
        return None
    return _choice(request, winner, plans[winner.node])


def price_local(request: ScheduleRequest, instance: InstanceSnapshot, match: PrefixMatch,
                predictors: CostPredictors) -> PrefillChoice:
    """The TTFT terms of an instance that a cache-unaware policy picked: it still reuses what
    its node holds (the engine's connector finds it), but pulls nothing."""
    pricer = _Pricer(request, predictors)
    local = match.length(instance.node)
    return _choice(request, instance, _NodePlan(local, local, None, 0.0, pricer.prefill_s(local)))


def _choice(request: ScheduleRequest, instance: InstanceSnapshot, plan: _NodePlan) -> PrefillChoice:
    size = request.block_size
    hashes = tuple(request.block_hashes[plan.local_blocks:plan.prefix_blocks]) if plan.source else ()
    return PrefillChoice(
        instance_id=instance.instance_id,
        node=instance.node,
        prefix_tokens=plan.prefix_blocks * size,
        local_prefix_tokens=plan.local_blocks * size,
        transfer_source=plan.source,
        transfer_hashes=hashes,
        transfer_s=plan.transfer_s,
        queue_s=instance.queue_time_s,
        prefill_s=plan.prefill_s,
    )
