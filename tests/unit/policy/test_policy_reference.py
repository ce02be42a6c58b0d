"""The fast decision path against a straightforward reference, on random clusters.

The policy matches a request once through the block index's node bitmasks, reads the
instances as columns (policy/columns.py: filters, queue times and bounds in numpy passes),
skips prefill instances whose TTFT floor exceeds the best found, and visits decode instances
by context in segments, pricing only those whose TBT floor does not exceed the best. The
reference below does none of that: per instance it scans the node's blocks, finds the fastest
source by brute force, prices Algorithm 1, and evaluates the TBT model on every decode
instance. Both must pick the same instances, with the same predictions, ties included (queue
times and loads are drawn from small sets so that ties are common); some instances are stale,
not accepting, or without KV room, so the policy works on subsets of its columns. With
per-instance models (`costs`, as the conductor's Pricing builds them: a shared base, scaled by
the instance's corrections) the reference prices each instance with its own model; the policy
bounds them through their bases.
"""

from __future__ import annotations

import dataclasses
import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import chain, index_with

from crescent.conductor.policy import (
    BandwidthTable,
    ClusterSnapshot,
    CostPredictors,
    Decision,
    InstanceSnapshot,
    Policy,
    ScheduleRequest,
    decode_load,
    kv_centric,
    make_policy,
)
from crescent.conductor.policy.kv_centric import exceeds_threshold

BLOCK = 16
KV_BYTES_PER_TOKEN = 1000.0
THRESHOLD = 1.5


def prefill_s(n: int, p: int) -> float:
    return 1e-3 * (n - p) + 2e-8 * (n * n - p * p)


def decode_step_s(batch: int, context: int) -> float:
    return max(0.004 + 0.002 * batch, 1e-6 * context)  # non-decreasing in both, flat in places


PREDICTORS = CostPredictors(prefill_s, decode_step_s, KV_BYTES_PER_TOKEN)
SLOW_BASE = CostPredictors(
    lambda n, p: 1.5 * prefill_s(n, p), lambda b, c: 2 * decode_step_s(b, c), KV_BYTES_PER_TOKEN
)
# The same bases with their decode steps as planes, as a published profile's are.
PLANES = ((0.004, 0.002, 0.0), (0.0, 0.0, 1e-6))
PLANED_BASE = dataclasses.replace(PREDICTORS, decode_planes=PLANES)
SLOW_PLANED_BASE = dataclasses.replace(
    SLOW_BASE, decode_planes=tuple(tuple(2 * x for x in plane) for plane in PLANES)
)


def derived(
    base: CostPredictors, ratio: float, overhead_s: float, transfer: float, decode: float
) -> CostPredictors:
    """An instance's model as Pricing builds one: its published base, corrected."""
    return CostPredictors(
        lambda n, p: overhead_s + ratio * base.prefill_s(n, p),
        lambda b, c: decode * base.decode_step_s(b, c),
        base.kv_bytes_per_token * transfer,
        base=base,
        prefill_ratio=ratio,
        prefill_overhead_s=overhead_s,
        decode_ratio=decode,
    )


def model_of(instance: InstanceSnapshot) -> CostPredictors:
    return instance.costs or PREDICTORS


def reference_prefill(
    request: ScheduleRequest, snapshot: ClusterSnapshot, holdings: dict[str, set[bytes]]
) -> tuple[str, str | None, int, float]:
    """(instance, pull source, prefix tokens, TTFT) by Algorithm 1, one instance at a time."""

    def held_run(node: str) -> int:
        n = 0
        while n < len(request.block_hashes) and request.block_hashes[n] in holdings.get(node, ()):
            n += 1
        return n

    def prefill_of(blocks: int, model: CostPredictors) -> float:
        n = request.num_prompt_tokens
        return max(0.0, model.prefill_s(n, min(blocks * BLOCK, n - 1)))

    runs = {node: held_run(node) for node in holdings}
    best = max(runs.values(), default=0)
    best_nodes = sorted(node for node, run in runs.items() if run == best and best)
    priced = []
    for instance in snapshot.prefill:
        if instance.is_stale or not instance.is_accepting:
            continue
        model = model_of(instance)
        local = held_run(instance.node)
        source, transfer, blocks = None, 0.0, local
        if exceeds_threshold(best, local, THRESHOLD):
            source = min(best_nodes, key=lambda s: (-snapshot.bandwidth.get(s, instance.node), s))
            rate = snapshot.bandwidth.get(source, instance.node)
            transfer = (best - local) * BLOCK * model.kv_bytes_per_token / rate
            if transfer < prefill_of(local, model) - prefill_of(best, model):
                blocks = best
            else:
                source, transfer = None, 0.0
        ttft = transfer + instance.queue_time_s + prefill_of(blocks, model)
        priced.append((ttft, instance.instance_id, source, blocks * BLOCK))
    ttft, instance_id, source, prefix_tokens = min(priced)
    return instance_id, source, prefix_tokens, ttft


def reference_decode(request: ScheduleRequest, snapshot: ClusterSnapshot) -> tuple[str, float]:
    priced = [
        (
            model_of(d).decode_step_s(
                d.num_running + 1, d.num_context_tokens + request.num_prompt_tokens
            ),
            d.instance_id,
        )
        for d in snapshot.decode
        if d.kv_free_tokens >= request.num_kv_tokens and not d.is_stale and d.is_accepting
    ]
    tbt, instance_id = min(priced)
    return instance_id, tbt


def instance_model(rng: random.Random, per_instance: bool, planes: bool) -> CostPredictors | None:
    """None (the policy's model) or a corrected model of one of two bases; few distinct values,
    so that ties between instances of different models are common too. With `planes`, every
    instance has a model, of a base with decode planes."""
    if not per_instance or (not planes and rng.random() < 0.2):
        return None
    return derived(
        rng.choice([PLANED_BASE, SLOW_PLANED_BASE] if planes else [PREDICTORS, SLOW_BASE]),
        rng.choice([0.5, 1.0, 1.5]),
        rng.choice([0.0, 0.0, 0.05]),
        rng.choice([1.0, 2.0]),
        rng.choice([0.5, 1.0, 1.25]),
    )


@st.composite
def clusters(draw, per_instance: bool = False, planes: bool = False):
    rng = random.Random(draw(st.integers(0, 2**32)))
    num_nodes = draw(st.integers(1, 80))
    nodes = [f"n{i:02d}" for i in range(num_nodes)]
    families = [chain(f"f{f}", 24) for f in range(3)]
    holdings: dict[str, set[bytes]] = {}
    for node in nodes:
        for family in rng.sample(families, rng.randint(0, 2)):
            start = (
                0 if rng.random() < 0.8 else rng.randint(1, 5)
            )  # some hold a run without its start
            holdings.setdefault(node, set()).update(family[start : rng.randint(start, 24)])
    bandwidth = BandwidthTable(1e6)
    for _ in range(rng.randint(0, 3 * num_nodes)):
        bandwidth.set(rng.choice(nodes), rng.choice(nodes), rng.choice([5e5, 1e6, 2e6]))
    prefills = [
        InstanceSnapshot(
            f"p{i:02d}",
            rng.choice(nodes),
            0,
            0,
            rng.choice([0.0, 0.05, 0.1, 0.5]),
            0,
            0,
            is_stale=i > 0 and rng.random() < 0.1,
            is_accepting=i == 0 or rng.random() > 0.1,
            costs=instance_model(rng, per_instance, planes),
        )
        for i in range(rng.randint(1, 2 * num_nodes))
    ]
    decodes = [
        InstanceSnapshot(
            f"d{i:02d}",
            f"dn{i}",
            0,
            rng.choice([0, 1, 4, 16]),
            0.0,
            used,
            60_000,
            is_stale=i > 0 and rng.random() < 0.1,
            is_accepting=i == 0 or rng.random() > 0.1,
            context_tokens=rng.choice([None, 0, 2000, 9000, 30000]),
            costs=instance_model(rng, per_instance, planes),
        )
        for i in range(rng.randint(1, 80))
        # some without room for the request (the first always has room)
        for used in [rng.choice([0, 1000, 30_000] if i == 0 else [0, 1000, 30_000, 59_900])]
    ]
    family = rng.choice(families)
    num_blocks = rng.randint(0, 24)
    hashes = family[:num_blocks]
    request = ScheduleRequest(
        "r", tuple(hashes), num_blocks * BLOCK + rng.randint(1, BLOCK), BLOCK, 64
    )
    return (
        holdings,
        ClusterSnapshot(
            prefills, decodes, index_with({n: sorted(h) for n, h in holdings.items()}), bandwidth
        ),
        request,
    )


@settings(max_examples=300, deadline=None)
@given(case=clusters())
def test_kv_centric_decisions_equal_the_per_instance_reference(case):
    check_against_reference(case)


@settings(max_examples=300, deadline=None)
@given(case=clusters(per_instance=True))
def test_decisions_with_per_instance_models_equal_the_reference(case):
    """Instances priced by their own corrected models, as the conductor prices them; one policy
    decides every case, once more with the models moved between instances, as corrections move
    from one decision to the next."""
    check_against_reference(case, KEPT_POLICY)
    holdings, snapshot, request = case
    moved = dataclasses.replace(
        snapshot, prefill=models_moved(snapshot.prefill), decode=models_moved(snapshot.decode)
    )
    check_against_reference((holdings, moved, request), KEPT_POLICY)


@settings(max_examples=300, deadline=None)
@given(case=clusters(per_instance=True, planes=True))
def test_decisions_estimated_from_decode_planes_equal_the_reference(case):
    """Every instance's base is decode planes, as published profiles are: the decode choice
    estimates every instance's step in one pass, and is the reference's all the same."""
    check_against_reference(case, KEPT_POLICY)


def models_moved(instances: list[InstanceSnapshot]) -> list[InstanceSnapshot]:
    """Each instance with the model of the one before it."""
    return [
        msgspec.structs.replace(s, costs=instances[i - 1].costs) for i, s in enumerate(instances)
    ]


KEPT_POLICY = make_policy(
    "kv-centric", predictors=PREDICTORS, kvcache_balancing_threshold=THRESHOLD
)


def check_against_reference(case, policy: Policy | None = None) -> None:
    """The decision equals the reference's, with the policy's own choice of pricing every
    instance or bounding them, and with bounds however few the instances are."""
    check_one(case, policy)
    bounded_from = (kv_centric.PRICE_ALL_UP_TO, decode_load.PRICE_ALL_UP_TO)
    kv_centric.PRICE_ALL_UP_TO = decode_load.PRICE_ALL_UP_TO = 0
    try:
        check_one(case, policy)
    finally:
        kv_centric.PRICE_ALL_UP_TO, decode_load.PRICE_ALL_UP_TO = bounded_from


def check_one(case, policy: Policy | None = None) -> None:
    holdings, snapshot, request = case
    if policy is None:
        policy = make_policy(
            "kv-centric", predictors=PREDICTORS, kvcache_balancing_threshold=THRESHOLD
        )
    outcome = policy.choose(request, snapshot, 0.0)
    assert isinstance(outcome, Decision)
    instance_id, source, prefix_tokens, ttft = reference_prefill(request, snapshot, holdings)
    chosen = outcome.prefill
    assert (chosen.instance_id, chosen.source_node, chosen.prefix_tokens) == (
        instance_id,
        source,
        prefix_tokens,
    )
    assert chosen.predicted_ttft_s == ttft
    assert (outcome.decode.instance_id, outcome.decode.predicted_tbt_s) == reference_decode(
        request, snapshot
    )


class CountingDecodeStep:
    def __init__(self) -> None:
        self.num_calls = 0

    def __call__(self, batch: int, context: int) -> float:
        self.num_calls += 1
        return decode_step_s(batch, context)


class CountingBandwidth(BandwidthTable):
    def __init__(self) -> None:
        super().__init__(1e6)
        self.num_plans = 0

    def fastest_source(self, sources, dst):
        self.num_plans += 1
        return super().fastest_source(sources, dst)


def busy_decodes(rng: random.Random, num: int) -> list[InstanceSnapshot]:
    """`num` decode instances, each with a random batch and context, and room for any request."""
    return [
        InstanceSnapshot(
            f"d{i:03d}",
            f"dn{i}",
            0,
            rng.randint(0, 32),
            0.0,
            0,
            10**7,
            context_tokens=rng.randint(0, 10**6),
        )
        for i in range(num)
    ]


@pytest.mark.parametrize("per_instance", [False, True])
def test_at_512_instances_few_are_priced_in_full(per_instance):
    """The bounds are what keeps a decision under a millisecond at 512 instances: without them
    every prefill instance's node is planned and the TBT model runs for every decode instance,
    also when each instance has its own corrected model (the conductor's case)."""
    rng = random.Random(7)
    nodes = [f"n{i:03d}" for i in range(512)]
    family = chain("sys", 64)
    holdings = {node: set(family[: rng.randint(1, 8)]) for node in nodes}
    holdings["n100"] = set(family)
    bandwidth = CountingBandwidth()
    prefills = [
        InstanceSnapshot(f"p{i:03d}", node, 0, 0, rng.uniform(0, 0.5), 0, 0)
        for i, node in enumerate(nodes)
    ]
    decodes = busy_decodes(rng, 512)
    step = CountingDecodeStep()
    predictors = CostPredictors(prefill_s, step, KV_BYTES_PER_TOKEN)
    if per_instance:
        prefills = [
            msgspec.structs.replace(
                p, costs=derived(predictors, rng.uniform(0.8, 1.6), rng.uniform(0, 0.01), 1.0, 1.0)
            )
            for p in prefills
        ]
        decodes = [
            msgspec.structs.replace(
                d, costs=derived(predictors, 1.0, 0.0, 1.0, rng.uniform(0.8, 1.4))
            )
            for d in decodes
        ]
    snapshot = ClusterSnapshot(
        prefills, decodes, index_with({n: sorted(h) for n, h in holdings.items()}), bandwidth
    )
    request = ScheduleRequest("r", tuple(family), 64 * BLOCK + 1, BLOCK, 16)
    outcome = make_policy("kv-centric", predictors=predictors).choose(request, snapshot, 0.0)
    assert isinstance(outcome, Decision)
    assert bandwidth.num_plans < 64 and step.num_calls < 64


def test_with_decode_planes_the_step_model_runs_only_for_the_least_estimate():
    """512 decode instances, each with its own correction of a base that is decode planes (a
    published profile): one numpy pass estimates every TBT, and the step model runs for the
    instance at the least estimate alone (the bounded search in context order prices more)."""
    rng = random.Random(11)
    step = CountingDecodeStep()
    base = CostPredictors(prefill_s, step, KV_BYTES_PER_TOKEN, decode_planes=PLANES)
    decodes = [
        msgspec.structs.replace(d, costs=derived(base, 1.0, 0.0, 1.0, rng.uniform(0.8, 1.4)))
        for d in busy_decodes(rng, 512)
    ]
    request = ScheduleRequest("r", (), 64 * BLOCK + 1, BLOCK, 16)
    snapshot = ClusterSnapshot([InstanceSnapshot("p0", "n0", 0, 0, 0.0, 0, 0)], decodes)
    outcome = make_policy("kv-centric", predictors=PREDICTORS).choose(request, snapshot, 0.0)
    assert isinstance(outcome, Decision)
    assert step.num_calls == 1
    assert (outcome.decode.instance_id, outcome.decode.predicted_tbt_s) == reference_decode(
        request, snapshot
    )


def test_an_estimate_a_rounding_off_does_not_decide():
    """The one-pass estimate sums each plane in the profile's order; a model may sum its own
    another way and round the other way. Here d01's own TBT is the least, yet its estimate is
    a rounding above d00's: both are priced, and d01 wins."""

    def own_order(batch: int, context: int) -> float:
        return (1e-7 * context + 0.003 * batch) + 0.1

    base = CostPredictors(
        prefill_s, own_order, KV_BYTES_PER_TOKEN, decode_planes=((0.1, 0.003, 1e-7),)
    )
    request = ScheduleRequest("r", (), 1025, BLOCK, 16)
    # (running, context) with the request's 1,025 prompt tokens: (27, 473,363) and (36, 203,363)
    loads = [(26, 472_338), (35, 202_338)] + [(60, 900_000)] * 20
    decodes = [
        InstanceSnapshot(
            f"d{i:02d}",
            f"dn{i}",
            0,
            running,
            0.0,
            0,
            10**7,
            context_tokens=context,
            costs=derived(base, 1.0, 0.0, 1.0, 1.0),
        )
        for i, (running, context) in enumerate(loads)
    ]
    assert own_order(36, 203_363) < own_order(27, 473_363)
    assert 0.1 + 0.003 * 36 + 1e-7 * 203_363 > 0.1 + 0.003 * 27 + 1e-7 * 473_363
    snapshot = ClusterSnapshot([InstanceSnapshot("p0", "n0", 0, 0, 0.0, 0, 0)], decodes)
    outcome = make_policy("kv-centric", predictors=PREDICTORS).choose(request, snapshot, 0.0)
    assert outcome.decode.instance_id == "d01"
    assert outcome.decode.predicted_tbt_s == own_order(36, 203_363)


def test_a_policy_bounds_decode_with_the_models_of_this_decision():
    """The decode bound takes the smallest correction of this decision's models: an instance
    that became cheaper since the last decision still wins from far down the context order."""
    policy = make_policy("kv-centric", predictors=PREDICTORS)
    prefills = [InstanceSnapshot("p0", "n0", 0, 0, 0.0, 0, 0)]

    def decodes(last_ratio: float) -> list[InstanceSnapshot]:
        return [
            InstanceSnapshot(
                f"d{i:02d}",
                f"dn{i}",
                0,
                0,
                0.0,
                0,
                10**7,
                context_tokens=10_000 * i,
                costs=derived(PREDICTORS, 1.0, 0.0, 1.0, last_ratio if i == 19 else 1.0),
            )
            for i in range(20)
        ]

    request = ScheduleRequest("r", (), 100, BLOCK, 8)
    first = policy.choose(request, ClusterSnapshot(prefills, decodes(1.0)), 0.0)
    assert first.decode.instance_id == "d00"
    second = policy.choose(request, ClusterSnapshot(prefills, decodes(0.01)), 0.0)
    assert second.decode.instance_id == "d19"
