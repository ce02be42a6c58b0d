"""The policy factory, the baselines, and properties every policy must keep."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import chain, cluster, decode, index_with, linear_predictors, prefill, request

from crescent.conductor.policy import (
    POLICIES,
    Decision,
    Rejection,
    RejectReason,
    ReplicationReason,
    Slo,
    make_policy,
)
from crescent.conductor.policy.baselines import RoundRobinCursor

P = linear_predictors()
H = chain("req", 6)
REQ = request(H)


def make(name, **kw):
    return make_policy(name, predictors=P, rng=random.Random(7), **kw)


def test_factory_builds_every_named_policy_and_refuses_unknown_ones():
    assert set(POLICIES) == {
        "kv-centric",
        "random",
        "round-robin",
        "least-loaded",
        "local-cache-aware",
        "dynamo-kv",
        "llmd-score",
    }
    for name in POLICIES:
        policy = make(name, admission="early", slo=Slo(30.0, 0.1))
        assert policy.name == name and policy.admission.name == "early"
    with pytest.raises(ValueError, match="unknown policy"):
        make("fastest")
    with pytest.raises(ValueError, match="rng"):
        make_policy("random", predictors=P)
    with pytest.raises(TypeError):
        make_policy("kv-centric", predictors=P, colour="blue")


def test_kv_centric_decision_carries_the_pull_as_a_replication_order():
    index = index_with({"na": H})
    snapshot = cluster([prefill("a", "na", queue_s=1.0), prefill("b", "nb")], [decode("d")], index)
    decision = make("kv-centric").choose(REQ, snapshot, 0.0)
    assert decision.prefill.instance_id == "b"
    [order] = decision.replication
    assert (order.source_node, order.target_node, order.hashes) == ("na", "nb", tuple(H))
    assert order.reason is ReplicationReason.ON_DEMAND
    local = make("local-cache-aware").choose(REQ, snapshot, 0.0)
    assert local.prefill.pull_hashes == () and local.replication == ()


def test_least_loaded_picks_the_shortest_queue_and_still_reuses_its_local_prefix():
    index = index_with({"na": H[:2]})
    snapshot = cluster(
        [prefill("a", "na", queue_s=0.2), prefill("b", "nb", queue_s=0.3)],
        [decode("d0", num_running=3), decode("d1", num_running=1)],
        index,
    )
    decision = make("least-loaded").choose(REQ, snapshot, 0.0)
    assert decision.prefill.instance_id == "a" and decision.prefill.prefix_tokens == 32
    assert decision.prefill.predicted_ttft_s == pytest.approx(0.2 + (97 - 32) * 0.001)
    assert decision.decode.instance_id == "d1"
    assert decision.decode.predicted_tbt_s == pytest.approx(P.decode_step_s(2, 97))


def test_round_robin_rotates_by_id_and_survives_membership_changes():
    policy = make("round-robin")
    prefills = [prefill("c"), prefill("a"), prefill("b")]
    decodes = [decode("y"), decode("x")]
    picks = [policy.choose(REQ, cluster(prefills, decodes), 0.0) for _ in range(4)]
    assert [(d.prefill.instance_id, d.decode.instance_id) for d in picks] == [
        ("a", "x"),
        ("b", "y"),
        ("c", "x"),
        ("a", "y"),
    ]
    after = policy.choose(REQ, cluster([prefill("a"), prefill("c")], decodes), 0.0)  # b left
    assert after.prefill.instance_id == "c"


def test_round_robin_does_not_advance_on_a_rejection():
    cursor = RoundRobinCursor()
    policy = make("round-robin", admission="early", slo=Slo(1.0, 1.0), cursor=cursor)
    slow = cluster([prefill("a", queue_s=5.0), prefill("b", queue_s=5.0)], [decode("x")])
    assert isinstance(policy.choose(REQ, slow, 0.0), Rejection)
    assert cursor == RoundRobinCursor()
    assert (
        policy.choose(
            REQ, cluster([prefill("a"), prefill("b")], [decode("x")]), 0.0
        ).prefill.instance_id
        == "a"
    )


def test_random_is_reproducible_from_its_seed_and_independent_of_input_order():
    prefills = [prefill(f"p{i}") for i in range(8)]
    runs = []
    for order in (prefills, prefills[::-1]):
        policy = make_policy("random", predictors=P, rng=random.Random(42))
        runs.append(
            [
                policy.choose(REQ, cluster(order, [decode("d")]), 0.0).prefill.instance_id
                for _ in range(20)
            ]
        )
    assert runs[0] == runs[1] and len(set(runs[0])) > 1


def test_no_usable_prefill_is_a_rejection_not_an_exception():
    for name in POLICIES:
        outcome = make(name).choose(REQ, cluster([prefill("a", is_stale=True)], [decode("d")]), 0.0)
        assert isinstance(outcome, Rejection) and outcome.reason is RejectReason.NO_PREFILL


instance_flags = st.tuples(st.booleans(), st.booleans(), st.floats(0, 10), st.integers(0, 6))


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(POLICIES)),
    admission=st.sampled_from(["none", "early", "predictive"]),
    prefills=st.lists(instance_flags, min_size=1, max_size=6),
    decodes=st.lists(
        st.tuples(st.booleans(), st.booleans(), st.integers(0, 300), st.integers(0, 20)),
        min_size=1,
        max_size=6,
    ),
    ttft_slo=st.floats(0.05, 12),
    seed=st.integers(0, 2**16),
)
def test_no_policy_picks_a_stale_or_full_instance_and_a_rejection_has_no_prefill(
    name, admission, prefills, decodes, ttft_slo, seed
):
    holdings = {}
    prefill_snaps = []
    for i, (stale, accepting, queue, held) in enumerate(prefills):
        node = f"n{i % 3}"  # some instances share a node
        holdings.setdefault(node, H[:held])
        prefill_snaps.append(prefill(f"p{i}", node, queue, is_stale=stale, is_accepting=accepting))
    decode_snaps = [
        decode(
            f"d{i}",
            running,
            0,
            used=1000 - free,
            capacity=1000,
            is_stale=stale,
            is_accepting=accepting,
        )
        for i, (stale, accepting, free, running) in enumerate(decodes)
    ]
    snapshot = cluster(prefill_snaps, decode_snaps, index_with(holdings))
    cursor = RoundRobinCursor()
    policy = make_policy(
        name,
        predictors=P,
        admission=admission,
        slo=Slo(ttft_slo, 0.05),
        rng=random.Random(seed),
        cursor=cursor,
    )
    outcome = policy.choose(REQ, snapshot, 0.0)
    usable_prefill = {s.instance_id for s in prefill_snaps if not s.is_stale and s.is_accepting}
    usable_decode = {
        s.instance_id
        for s in decode_snaps
        if not s.is_stale and s.is_accepting and s.kv_free_tokens >= REQ.num_kv_tokens
    }
    if isinstance(outcome, Decision):
        assert outcome.prefill.instance_id in usable_prefill
        assert outcome.decode.instance_id in usable_decode
    else:
        assert isinstance(outcome, Rejection) and not hasattr(outcome, "prefill")
        assert cursor == RoundRobinCursor()  # nothing was committed
        if not usable_prefill:
            assert outcome.reason is RejectReason.NO_PREFILL
        elif not usable_decode:
            assert outcome.reason is RejectReason.NO_DECODE
        else:
            assert admission != "none"
