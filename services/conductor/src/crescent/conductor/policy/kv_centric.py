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
from itertools import compress, repeat
from operator import add, attrgetter, le
from typing import NamedTuple

from crescent.common.block_index import PrefixMatch
from crescent.conductor.policy.bandwidth import BandwidthTable
from crescent.conductor.policy.decision import CostPredictors, PrefillChoice, ScheduleRequest
from crescent.conductor.policy.snapshot import InstanceSnapshot

DEFAULT_BALANCING_THRESHOLD = 1.5
_queue_time = attrgetter("queue_time_s")
_node = attrgetter("node")


class _NodePlan(NamedTuple):
    """How an instance on one node would get its prefix; the same for every instance there."""

    prefix_blocks: int
    local_blocks: int
    source: str | None
    transfer_s: float
    prefill_s: float


class _Planner:
    """Plans one request's prefix per node. Plans are memoised by prefix length (and, for pulls,
    by source and link speed): a cluster has many nodes but a request sees few distinct ones."""

    def __init__(
        self,
        request: ScheduleRequest,
        predictors: CostPredictors,
        match: PrefixMatch,
        bandwidth: BandwidthTable | None,
        threshold: float,
        allow_transfer: bool,
        transfer_only_if_cheaper: bool,
    ) -> None:
        self.request = request
        self.predictors = predictors
        self.match = match
        self.bandwidth = bandwidth
        self.threshold = threshold
        self.allow_transfer = allow_transfer
        self.transfer_only_if_cheaper = transfer_only_if_cheaper
        self._prefill: dict[int, float] = {}
        self._local: dict[int, _NodePlan] = {}
        self._pull: dict[tuple[int, str, float], _NodePlan] = {}
        self._floor: dict[int, float] = {}

    def prefill_s(self, prefix_blocks: int) -> float:
        seconds = self._prefill.get(prefix_blocks)
        if seconds is None:
            n = self.request.num_prompt_tokens
            # The last prompt token is always computed: its logits give the first token.
            reused = min(prefix_blocks * self.request.block_size, n - 1)
            seconds = self._prefill[prefix_blocks] = max(0.0, self.predictors.prefill_s(n, reused))
        return seconds

    def local_plan(self, local: int) -> _NodePlan:
        plan = self._local.get(local)
        if plan is None:
            plan = self._local[local] = _NodePlan(local, local, None, 0.0, self.prefill_s(local))
        return plan

    def least_ttft_s(self, local: int) -> float:
        """A floor under T_transfer + T_prefill of any plan for a node holding `local` blocks:
        its local plan, or a pull over the fastest link in the cluster."""
        floor = self._floor.get(local)
        if floor is None:  # a few distinct lengths per request: computed once each
            floor = self.prefill_s(local)
            best = self.match.best_len
            if (
                self.bandwidth is not None
                and self.allow_transfer
                and exceeds_threshold(best, local, self.threshold)
            ):
                bytes_missing = (
                    (best - local) * self.request.block_size * self.predictors.kv_bytes_per_token
                )
                floor = min(floor, bytes_missing / self.bandwidth.max_rate() + self.prefill_s(best))
            self._floor[local] = floor
        return floor

    def plan(self, node: str) -> _NodePlan:
        match = self.match
        local = match.lengths.get(node, 0)
        best = match.best_len
        bandwidth = self.bandwidth
        if (
            bandwidth is None
            or not self.allow_transfer
            or not exceeds_threshold(best, local, self.threshold)
        ):
            return self.local_plan(local)
        source, rate = bandwidth.fastest_source(match.best_nodes, node)
        key = (local, source, rate)
        plan = self._pull.get(key)
        if plan is None:
            transfer_s = (
                (best - local) * self.request.block_size * self.predictors.kv_bytes_per_token / rate
            )
            prefill_s = self.prefill_s(best)
            if self.transfer_only_if_cheaper and not transfer_s < self.prefill_s(local) - prefill_s:
                plan = self.local_plan(local)
            else:
                plan = _NodePlan(best, local, source, transfer_s, prefill_s)
            self._pull[key] = plan
        return plan


def exceeds_threshold(best_len: int, local_len: int, threshold: float) -> bool:
    """Algorithm 1, line 5: best_len / local_len > threshold, with x/0 = ∞ for x > 0."""
    if best_len <= local_len:
        return False
    return local_len == 0 or best_len / local_len > threshold


def choose_prefill(
    request: ScheduleRequest,
    candidates: Sequence[InstanceSnapshot],
    match: PrefixMatch,
    bandwidth: BandwidthTable,
    predictors: CostPredictors,
    threshold: float = DEFAULT_BALANCING_THRESHOLD,
    *,
    allow_transfer: bool = True,
    transfer_only_if_cheaper: bool = True,
) -> PrefillChoice | None:
    """The candidate with the least predicted TTFT; None when there is no candidate."""
    if not threshold > 0:
        raise ValueError(f"kvcache_balancing_threshold must be > 0, got {threshold}")
    if not candidates:
        return None
    planner = _Planner(
        request, predictors, match, bandwidth, threshold, allow_transfer, transfer_only_if_cheaper
    )
    # Branch and bound: queue time plus the floor of its node's plans bounds an instance's TTFT
    # from below, and an instance whose bound exceeds a TTFT already found cannot win or tie,
    # so it is never planned. The bounds are computed in C (map, min, compress); Python runs
    # once per distinct prefix length and per instance left in the running: at 512 instances,
    # a handful.
    local_lengths = list(map(match.lengths.get, map(_node, candidates), repeat(0)))
    floor_of = {length: planner.least_ttft_s(length) for length in set(local_lengths)}
    bounds = list(map(add, map(_queue_time, candidates), map(floor_of.__getitem__, local_lengths)))
    first = min(range(len(candidates)), key=bounds.__getitem__)
    winner, winner_plan, winner_ttft = _priced(candidates[first], planner)
    limit = winner_ttft + _rounding_slack(winner_ttft)
    in_running = compress(range(len(candidates)), map(le, bounds, repeat(limit)))
    for position in sorted(in_running, key=bounds.__getitem__):
        if bounds[position] > limit:
            break
        if position == first:
            continue
        instance, plan, ttft = _priced(candidates[position], planner)
        if ttft < winner_ttft or (
            ttft == winner_ttft and instance.instance_id < winner.instance_id
        ):
            winner, winner_plan, winner_ttft = instance, plan, ttft
            limit = ttft + _rounding_slack(ttft)
    return _choice(request, winner, winner_plan)


def _priced(
    instance: InstanceSnapshot, planner: _Planner
) -> tuple[InstanceSnapshot, _NodePlan, float]:
    """An instance, its node's plan and its TTFT, summed in PrefillChoice.predicted_ttft_s's
    order so that reported and compared TTFTs agree."""
    plan = planner.plan(instance.node)
    return instance, plan, plan.transfer_s + instance.queue_time_s + plan.prefill_s


def _rounding_slack(seconds: float) -> float:
    """Room for float rounding when comparing a bound with a TTFT summed in another order."""
    return abs(seconds) * 1e-9 + 1e-12


def price_local(
    request: ScheduleRequest,
    instance: InstanceSnapshot,
    match: PrefixMatch,
    predictors: CostPredictors,
) -> PrefillChoice:
    """The TTFT terms of an instance that a cache-unaware policy picked: it still reuses what
    its node holds (the engine's connector finds it), but pulls nothing."""
    planner = _Planner(
        request,
        predictors,
        match,
        None,
        DEFAULT_BALANCING_THRESHOLD,
        allow_transfer=False,
        transfer_only_if_cheaper=True,
    )
    return _choice(request, instance, planner.local_plan(match.length(instance.node)))


def _choice(request: ScheduleRequest, instance: InstanceSnapshot, plan: _NodePlan) -> PrefillChoice:
    size = request.block_size
    hashes = (
        tuple(request.block_hashes[plan.local_blocks : plan.prefix_blocks]) if plan.source else ()
    )
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
