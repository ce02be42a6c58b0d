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

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from crescent.common.block_index import PrefixMatch
from crescent.conductor.policy.bandwidth import BandwidthTable
from crescent.conductor.policy.columns import InstanceColumns
from crescent.conductor.policy.decision import CostPredictors, PrefillChoice, ScheduleRequest
from crescent.conductor.policy.snapshot import InstanceSnapshot

DEFAULT_BALANCING_THRESHOLD = 1.5
# Up to this many candidates each is priced in full: a handful of numpy calls cost more than
# that. Above it, they are bounded in numpy and only the few that can win are priced.
PRICE_ALL_UP_TO = 16
_min = np.minimum.reduce  # ndarray.min() adds a Python-level wrapper per call


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

    def prefill_s(self, prefix_blocks: int) -> float:
        return max(0.0, self.model_prefill_s(prefix_blocks))

    def model_prefill_s(self, prefix_blocks: int) -> float:
        """The model's T_prefill as it says it, before the clamp at 0."""
        seconds = self._prefill.get(prefix_blocks)
        if seconds is None:
            n = self.request.num_prompt_tokens
            # The last prompt token is always computed: its logits give the first token.
            reused = min(prefix_blocks * self.request.block_size, n - 1)
            seconds = self._prefill[prefix_blocks] = self.predictors.prefill_s(n, reused)
        return seconds

    def local_plan(self, local: int) -> _NodePlan:
        plan = self._local.get(local)
        if plan is None:
            plan = self._local[local] = _NodePlan(local, local, None, 0.0, self.prefill_s(local))
        return plan

    def plan(self, node: str) -> _NodePlan:
        match = self.match
        local = match.length(node)
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
    """The candidate with the least predicted TTFT, each priced by its own cost model
    (`predictors` for those without one); None when there is no candidate."""
    if not threshold > 0:
        raise ValueError(f"kvcache_balancing_threshold must be > 0, got {threshold}")
    if not candidates:
        return None
    planners: dict[int, _Planner] = {}

    def planner_for(model: CostPredictors) -> _Planner:
        planner = planners.get(id(model))
        if planner is None:
            planner = planners[id(model)] = _Planner(
                request,
                model,
                match,
                bandwidth,
                threshold,
                allow_transfer,
                transfer_only_if_cheaper,
            )
        return planner

    if len(candidates) <= PRICE_ALL_UP_TO:
        # A few candidates: pricing each costs less than bounding them (numpy calls).
        priced_all = (_priced(s, planner_for(s.costs or predictors)) for s in candidates)
        instance, plan, _ = min(priced_all, key=_ttft_then_id)
        return _choice(request, instance, plan)
    columns = InstanceColumns.of(candidates)
    # Branch and bound: queue time plus a floor under the plans of its node priced by its model
    # (its shared base's prices, scaled by its own correction terms) bounds an instance's TTFT
    # from below, and an instance whose bound exceeds a TTFT already found cannot win or tie,
    # so it is never planned. The bounds are a few passes over the columns; Python runs once
    # per distinct (base, prefix length) and per instance left in the running: at 512
    # instances, a handful.
    bounds = _bounds(request, columns, match, bandwidth, predictors, planner_for)

    def priced(position: int) -> tuple[InstanceSnapshot, _NodePlan, float]:
        return _priced(columns[position], planner_for(columns.costs(position, predictors)))

    first = int(bounds.argmin())
    winner, winner_plan, winner_ttft = priced(first)
    limit = winner_ttft + _rounding_slack(winner_ttft)
    in_running = (bounds <= limit).nonzero()[0]
    in_running = in_running[bounds[in_running].argsort(kind="stable")]
    for position, bound in zip(in_running.tolist(), bounds[in_running].tolist()):
        if bound > limit:
            break
        if position == first:
            continue
        instance, plan, ttft = priced(position)
        if ttft < winner_ttft or (
            ttft == winner_ttft and instance.instance_id < winner.instance_id
        ):
            winner, winner_plan, winner_ttft = instance, plan, ttft
            limit = ttft + _rounding_slack(ttft)
    return _choice(request, winner, winner_plan)


def _bounds(
    request: ScheduleRequest,
    columns: InstanceColumns,
    match: PrefixMatch,
    bandwidth: BandwidthTable | None,
    predictors: CostPredictors,
    planner_for: Callable[[CostPredictors], _Planner],
) -> np.ndarray:
    """Per candidate, a TTFT no candidate's own model prices below: its queue + overhead +
    min(ratio · local T_prefill, the pull's tokens · bytes per token / the rate of its node's
    fastest link from a best node + ratio · T_prefill after the pull), both T_prefill by its
    base, evaluated once per distinct (base, local prefix length)."""
    roots, root, kv_bytes = columns.models(predictors)
    ratios, overheads = columns.prefill_ratio, columns.prefill_overhead_s
    floor = _Floor(float(_min(ratios)), float(_min(overheads)), float(_min(kv_bytes)))
    local = columns.prefix_lengths(match)
    # (base, local length) pairs as codes; the distinct ones found through a table of them all.
    width = len(request.block_hashes) + 1  # a local prefix holds 0..all the request's blocks
    codes = root * width + local
    is_present = np.zeros(len(roots) * width, dtype=bool)
    is_present[codes] = True
    keys = is_present.nonzero()[0]
    pairs = [divmod(key, width) for key in keys.tolist()]
    planners = list(map(planner_for, roots))
    terms = [floor.terms(planners[base], length) for base, length in pairs]
    inverse = keys.searchsorted(codes)
    if all(local_s >= 0 and pulled_s >= 0 for local_s, _, pulled_s in terms):
        # take: a third of fancy indexing's time for rows of three
        local_s, tokens, pulled_s = np.array(terms).take(inverse, 0).T
        rates = (
            columns.link_rates(bandwidth, match.best_nodes)
            if bandwidth is not None and match.best_nodes
            else 1.0
        )
        if floor.kv_bytes_per_token > 0:
            pull_s = kv_bytes * tokens / rates + ratios * pulled_s
        else:  # 0 bytes a token times no pull (inf) is NaN: fmin takes the local plan, as min does
            with np.errstate(invalid="ignore"):
                pull_s = kv_bytes * tokens / rates + ratios * pulled_s
        return columns.queue_s + overheads + np.fmin(ratios * local_s, pull_s)
    # A model prices some prefill below 0: the smallest terms of all, clamped at 0.
    floors = np.array([floor.ttft_s(planners[base], length) for base, length in pairs], np.float64)
    return columns.queue_s + floors[inverse]


class _Floor(NamedTuple):
    """The smallest correction terms of any candidate: with a shared base's prices they bound
    from below the prices of every model derived from it."""

    prefill_ratio: float
    prefill_overhead_s: float
    kv_bytes_per_token: float

    def terms(self, base: _Planner, local: int) -> tuple[float, float, float]:
        """By `base`'s model, on a node holding `local` blocks: T_prefill of the local plan, the
        tokens a pull would move (inf: no pull), and T_prefill after the pull."""
        best = base.match.best_len
        if (
            base.bandwidth is not None
            and base.allow_transfer
            and exceeds_threshold(best, local, base.threshold)
        ):
            tokens = (best - local) * base.request.block_size
            return base.model_prefill_s(local), tokens, base.model_prefill_s(best)
        return base.model_prefill_s(local), math.inf, 0.0

    def prefill_s(self, base_s: float) -> float:
        # A derived model prices max(0, overhead + ratio · base) (ratio, overhead >= 0): at
        # least the smallest overhead + ratio · base when base >= 0, and at least 0 always.
        return self.prefill_overhead_s + self.prefill_ratio * base_s if base_s >= 0 else 0.0

    def ttft_s(self, base: _Planner, local: int) -> float:
        """A floor under T_transfer + T_prefill of any plan, for any model derived from
        `base`'s, on a node holding `local` blocks: its local plan, or a pull over the fastest
        link in the cluster."""
        floor = self.prefill_s(base.model_prefill_s(local))
        best = base.match.best_len
        if (
            base.bandwidth is not None
            and base.allow_transfer
            and exceeds_threshold(best, local, base.threshold)
        ):
            bytes_missing = (best - local) * base.request.block_size * self.kv_bytes_per_token
            floor = min(
                floor,
                bytes_missing / base.bandwidth.max_rate()
                + self.prefill_s(base.model_prefill_s(best)),
            )
        return floor


def _priced(
    instance: InstanceSnapshot, planner: _Planner
) -> tuple[InstanceSnapshot, _NodePlan, float]:
    """An instance, its node's plan and its TTFT, summed in PrefillChoice.predicted_ttft_s's
    order so that reported and compared TTFTs agree."""
    plan = planner.plan(instance.node)
    return instance, plan, plan.transfer_s + instance.queue_time_s + plan.prefill_s


def _ttft_then_id(priced: tuple[InstanceSnapshot, _NodePlan, float]) -> tuple[float, str]:
    return priced[2], priced[0].instance_id


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
        source_node=plan.source,
        pull_hashes=hashes,
        transfer_s=plan.transfer_s,
        queue_s=instance.queue_time_s,
        prefill_s=plan.prefill_s,
    )
