"""Scheduling policies behind one small ABC, and the factory that builds them by name.

Every policy decides the same way, differing only in its two picks:
    usable instances → prefill pick → decode load (per admission) → decode pick → admission.
So a rejection always comes before any prefill is committed, and stateful baselines (round
robin) only advance on an accepted request.

    policy = make_policy("kv-centric", predictors=predictors, admission="early", slo=Slo(30, 0.1))
    outcome = policy.choose(request, snapshot, now)   # Decision | Rejection
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from crescent.common.block_index import PrefixMatch
from crescent.conductor.policy import baselines, kv_centric, least_loaded, peer_scores
from crescent.conductor.policy.admission import (
    DEFAULT_RETRY_AFTER_S,
    Admission,
    Slo,
    make_admission,
)
from crescent.conductor.policy.decision import (
    CostPredictors,
    Decision,
    DecodeChoice,
    PrefillChoice,
    Rejection,
    RejectReason,
    ReplicationOrder,
    ScheduleRequest,
)
from crescent.conductor.policy.decode_load import (
    DecodeLoad,
    DecodeLoads,
    choice_for,
    choose_by_tbt,
    current_loads,
)
from crescent.conductor.policy.decode_time import DecodeTimeEstimator
from crescent.conductor.policy.eligibility import eligible_decode, eligible_prefill
from crescent.conductor.policy.local_prefill import OFF, LocalPrefill, prefill_on_decode
from crescent.conductor.policy.replication import on_demand_order
from crescent.conductor.policy.snapshot import ClusterSnapshot, InstanceSnapshot


class Policy(ABC):
    name: str
    local_prefill = OFF  # conditional disaggregation (off: always disaggregate)

    def __init__(self, predictors: CostPredictors, admission: Admission) -> None:
        self.predictors = predictors
        self.admission = admission

    def choose(
        self, request: ScheduleRequest, snapshot: ClusterSnapshot, now: float
    ) -> Decision | Rejection:
        prefills = eligible_prefill(snapshot.prefill)
        if not prefills:
            return Rejection(
                RejectReason.NO_PREFILL,
                "no live prefill instance takes work",
                self.admission.retry_after_s,
            )
        match = snapshot.index.match(request.block_hashes)
        prefill = self.choose_prefill(request, prefills, match, snapshot)
        decodes = eligible_decode(snapshot.decode, request.num_kv_tokens)
        if not decodes:
            return Rejection(
                RejectReason.NO_DECODE,
                f"no live decode instance has room for {request.num_kv_tokens} tokens",
                self.admission.retry_after_s,
                prefill.predicted_ttft_s,
            )
        loads = self.admission.decode_loads(decodes, snapshot, prefill, now)
        decode = self.choose_decode(request, loads)
        rejection = self.admission.judge(prefill, decode, snapshot, now)
        if rejection is not None:
            return rejection
        self.accepted(prefill, decode)
        local_prefill_added_s = prefill_on_decode(
            request,
            self.local_prefill,
            match.length(decodes.node_of(decode.instance_id)) * request.block_size,
            decodes.costs_for(decode.instance_id) or self.predictors,
            prefill.predicted_ttft_s,
            decode,
            snapshot.inflight,
        )
        if local_prefill_added_s is not None:
            return Decision(prefill, decode, local_prefill_added_s=local_prefill_added_s)
        return Decision(prefill, decode, self.replication(prefill))

    def choose_new_decode(
        self, request: ScheduleRequest, snapshot: ClusterSnapshot
    ) -> DecodeChoice | Rejection:
        """Where an admitted request goes on decoding when its decode instance is gone: the same
        decode pick among instances with room, without admission (the request was admitted)."""
        decodes = eligible_decode(snapshot.decode, request.num_kv_tokens)
        if not decodes:
            return Rejection(
                RejectReason.NO_DECODE,
                f"no live decode instance has room for {request.num_kv_tokens} tokens",
                self.admission.retry_after_s,
            )
        return self.choose_decode(request, current_loads(decodes))

    @abstractmethod
    def choose_prefill(
        self,
        request: ScheduleRequest,
        candidates: Sequence[InstanceSnapshot],
        match: PrefixMatch,
        snapshot: ClusterSnapshot,
    ) -> PrefillChoice:
        """Pick among usable prefill instances (never empty)."""

    @abstractmethod
    def choose_decode(self, request: ScheduleRequest, loads: Sequence[DecodeLoad]) -> DecodeChoice:
        """Pick among decode instances with KV room (never empty)."""

    def accepted(self, prefill: PrefillChoice, decode: DecodeChoice) -> None:
        """Advance any state a policy keeps; called only for accepted requests."""

    def replication(self, prefill: PrefillChoice) -> tuple[ReplicationOrder, ...]:
        return ()

    def _price_local(
        self, request: ScheduleRequest, instance: InstanceSnapshot, match: PrefixMatch
    ) -> PrefillChoice:
        return kv_centric.price_local(request, instance, match, instance.costs or self.predictors)

    def _choice_of(
        self, request: ScheduleRequest, loads: Sequence[DecodeLoad], chosen: InstanceSnapshot
    ) -> DecodeChoice:
        """The decode choice for the instance a baseline picked among `loads`' instances, found
        by id: the view's columns hand out a new snapshot at every read."""
        load = next(load for load in loads if load.instance.instance_id == chosen.instance_id)
        return choice_for(request, load, self.predictors.decode_step_s)

    def _by_tbt(self, request: ScheduleRequest, loads: Sequence[DecodeLoad]) -> DecodeChoice:
        return choose_by_tbt(request, loads, self.predictors.decode_step_s)


class KvCentricPolicy(Policy):
    """Algorithm 1 with cache load balancing: the paper's global cache-aware scheduler."""

    name = "kv-centric"
    allow_transfer = True

    def __init__(
        self,
        predictors: CostPredictors,
        admission: Admission,
        kvcache_balancing_threshold: float = kv_centric.DEFAULT_BALANCING_THRESHOLD,
        transfer_only_if_cheaper: bool = True,
    ) -> None:
        super().__init__(predictors, admission)
        if not kvcache_balancing_threshold > 0:
            raise ValueError(
                f"kvcache_balancing_threshold must be > 0, got {kvcache_balancing_threshold}"
            )
        self.threshold = kvcache_balancing_threshold
        self.transfer_only_if_cheaper = transfer_only_if_cheaper

    def choose_prefill(
        self,
        request: ScheduleRequest,
        candidates: Sequence[InstanceSnapshot],
        match: PrefixMatch,
        snapshot: ClusterSnapshot,
    ) -> PrefillChoice:
        """Algorithm 1, each instance priced by its own cost model (the policy's without one)."""
        return kv_centric.choose_prefill(
            request,
            candidates,
            match,
            snapshot.bandwidth,
            self.predictors,
            self.threshold,
            allow_transfer=self.allow_transfer,
            transfer_only_if_cheaper=self.transfer_only_if_cheaper,
        )

    def choose_decode(self, request: ScheduleRequest, loads: Sequence[DecodeLoad]) -> DecodeChoice:
        return self._by_tbt(request, loads)

    def replication(self, prefill: PrefillChoice) -> tuple[ReplicationOrder, ...]:
        order = on_demand_order(prefill)
        return (order,) if order else ()


class LocalCacheAwarePolicy(KvCentricPolicy):
    """Each instance reuses only its own node's prefix; nothing is pulled or replicated."""

    name = "local-cache-aware"
    allow_transfer = False


class LeastLoadedPolicy(Policy):
    name = "least-loaded"

    def choose_prefill(
        self,
        request: ScheduleRequest,
        candidates: Sequence[InstanceSnapshot],
        match: PrefixMatch,
        snapshot: ClusterSnapshot,
    ) -> PrefillChoice:
        return self._price_local(request, least_loaded.choose_prefill(candidates), match)

    def choose_decode(self, request: ScheduleRequest, loads: Sequence[DecodeLoad]) -> DecodeChoice:
        if isinstance(loads, DecodeLoads) and len(loads) > least_loaded.COMPARE_SNAPSHOTS_UP_TO:
            position = least_loaded.decode_position(loads.instances, request.num_kv_tokens)
            if position is None:
                raise ValueError("no decode instance has room: loads must be filtered for it")
            return choice_for(request, loads[position], self.predictors.decode_step_s)
        loads = list(loads)  # read once: the view hands out columns
        chosen = least_loaded.choose_decode(
            [load.instance for load in loads], request.num_kv_tokens
        )
        return self._choice_of(request, loads, chosen)


class RandomPolicy(Policy):
    name = "random"

    def __init__(
        self, predictors: CostPredictors, admission: Admission, rng: random.Random
    ) -> None:
        super().__init__(predictors, admission)
        self.rng = rng

    def choose_prefill(
        self,
        request: ScheduleRequest,
        candidates: Sequence[InstanceSnapshot],
        match: PrefixMatch,
        snapshot: ClusterSnapshot,
    ) -> PrefillChoice:
        instance = baselines.random_pick(candidates, [c.instance_id for c in candidates], self.rng)
        return self._price_local(request, instance, match)

    def choose_decode(self, request: ScheduleRequest, loads: Sequence[DecodeLoad]) -> DecodeChoice:
        loads = list(loads)  # read once: the view hands out columns
        load = baselines.random_pick(loads, [load.instance.instance_id for load in loads], self.rng)
        return choice_for(request, load, self.predictors.decode_step_s)


class RoundRobinPolicy(Policy):
    name = "round-robin"

    def __init__(
        self,
        predictors: CostPredictors,
        admission: Admission,
        cursor: baselines.RoundRobinCursor | None = None,
    ) -> None:
        super().__init__(predictors, admission)
        self.cursor = cursor if cursor is not None else baselines.RoundRobinCursor()

    def choose_prefill(
        self,
        request: ScheduleRequest,
        candidates: Sequence[InstanceSnapshot],
        match: PrefixMatch,
        snapshot: ClusterSnapshot,
    ) -> PrefillChoice:
        instance = baselines.next_in_turn(
            candidates, [c.instance_id for c in candidates], self.cursor.last_prefill
        )
        return self._price_local(request, instance, match)

    def choose_decode(self, request: ScheduleRequest, loads: Sequence[DecodeLoad]) -> DecodeChoice:
        loads = list(loads)  # read once: the view hands out columns
        load = baselines.next_in_turn(
            loads, [load.instance.instance_id for load in loads], self.cursor.last_decode
        )
        return choice_for(request, load, self.predictors.decode_step_s)

    def accepted(self, prefill: PrefillChoice, decode: DecodeChoice) -> None:
        self.cursor.last_prefill = prefill.instance_id
        self.cursor.last_decode = decode.instance_id


class DynamoKvPolicy(Policy):
    """Dynamo's KV router cost (peer_scores): overlap-weighted prefill blocks, then decode
    blocks."""

    name = "dynamo-kv"

    def choose_prefill(
        self,
        request: ScheduleRequest,
        candidates: Sequence[InstanceSnapshot],
        match: PrefixMatch,
        snapshot: ClusterSnapshot,
    ) -> PrefillChoice:
        return self._price_local(
            request, peer_scores.dynamo_prefill_pick(request, candidates, match), match
        )

    def choose_decode(self, request: ScheduleRequest, loads: Sequence[DecodeLoad]) -> DecodeChoice:
        loads = list(loads)  # read once: the view hands out columns
        chosen = peer_scores.dynamo_decode_pick(request, [load.instance for load in loads])
        return self._choice_of(request, loads, chosen)


class LlmdScorePolicy(Policy):
    """llm-d's default scorers (peer_scores): weighted prefix match, queue and KV utilisation."""

    name = "llmd-score"

    def choose_prefill(
        self,
        request: ScheduleRequest,
        candidates: Sequence[InstanceSnapshot],
        match: PrefixMatch,
        snapshot: ClusterSnapshot,
    ) -> PrefillChoice:
        return self._price_local(
            request, peer_scores.llmd_prefill_pick(request, candidates, match), match
        )

    def choose_decode(self, request: ScheduleRequest, loads: Sequence[DecodeLoad]) -> DecodeChoice:
        loads = list(loads)  # read once: the view hands out columns
        chosen = peer_scores.llmd_decode_pick([load.instance for load in loads])
        return self._choice_of(request, loads, chosen)


POLICIES: dict[str, Callable[..., Policy]] = {
    KvCentricPolicy.name: KvCentricPolicy,
    LocalCacheAwarePolicy.name: LocalCacheAwarePolicy,
    LeastLoadedPolicy.name: LeastLoadedPolicy,
    RandomPolicy.name: RandomPolicy,
    RoundRobinPolicy.name: RoundRobinPolicy,
    DynamoKvPolicy.name: DynamoKvPolicy,
    LlmdScorePolicy.name: LlmdScorePolicy,
}


def make_policy(
    name: str,
    *,
    predictors: CostPredictors,
    admission: str = "none",
    slo: Slo | None = None,
    decode_time: DecodeTimeEstimator | None = None,
    retry_after_s: float = DEFAULT_RETRY_AFTER_S,
    kvcache_balancing_threshold: float = kv_centric.DEFAULT_BALANCING_THRESHOLD,
    transfer_only_if_cheaper: bool = True,
    rng: random.Random | None = None,
    cursor: baselines.RoundRobinCursor | None = None,
    local_prefill: LocalPrefill = OFF,
) -> Policy:
    """A policy by name, with an admission by name ("none", "early", "predictive").

    Parameters a policy does not use are ignored, so one parameter set can sweep all policies;
    "random" needs `rng` (a seeded random.Random), since policy code has no randomness of its own.
    `local_prefill` turns on conditional disaggregation (local_prefill.py).
    """
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    policy = _build(
        name,
        predictors,
        make_admission(admission, slo, decode_time, retry_after_s),
        kvcache_balancing_threshold,
        transfer_only_if_cheaper,
        rng,
        cursor,
    )
    policy.local_prefill = local_prefill
    return policy


def _build(
    name: str,
    predictors: CostPredictors,
    gate: Admission,
    kvcache_balancing_threshold: float,
    transfer_only_if_cheaper: bool,
    rng: random.Random | None,
    cursor: baselines.RoundRobinCursor | None,
) -> Policy:
    if name in (KvCentricPolicy.name, LocalCacheAwarePolicy.name):
        return POLICIES[name](
            predictors, gate, kvcache_balancing_threshold, transfer_only_if_cheaper
        )
    if name == RandomPolicy.name:
        if rng is None:
            raise ValueError("policy 'random' needs rng=random.Random(seed)")
        return RandomPolicy(predictors, gate, rng)
    if name == RoundRobinPolicy.name:
        return RoundRobinPolicy(predictors, gate, cursor)
    return POLICIES[name](predictors, gate)
