"""Decode choice by predicted TBT, early rejection, prediction-based early rejection and t_d."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import chain, cluster, decode, linear_predictors, prefill, request

from crescent.conductor.policy import (
    Decision,
    DecodeTimeEstimator,
    InflightRequest,
    Rejection,
    RejectReason,
    Slo,
    make_admission,
    make_policy,
)
from crescent.conductor.policy.decode_load import choose_by_tbt, current_loads, projected_loads

P = linear_predictors()  # TBT = 10 ms + 2 ms per request + 1 µs per context token
REQ = request(chain("q", 6))  # 97 prompt tokens, 16 output: needs 113 tokens of KV room


def tbt(batch, ctx):
    return 0.01 + batch * 0.002 + ctx * 1e-6


def test_decode_choice_is_lowest_tbt_after_adding_the_request():
    loads = current_loads([decode("d0", 10, 10_000), decode("d1", 5, 50_000)])
    choice = choose_by_tbt(REQ, loads, P.decode_step_s)
    assert choice.instance_id == "d0" and choice.predicted_tbt_s == pytest.approx(tbt(11, 10_097))
    assert choose_by_tbt(REQ, [], P.decode_step_s) is None
    tied = current_loads([decode("d9", 1, 0), decode("d3", 1, 0)])
    assert choose_by_tbt(REQ, tied, P.decode_step_s).instance_id == "d3"


def queued(snapshot, num_queued: int, context: int):
    return msgspec.structs.replace(snapshot, num_queued=num_queued, queued_context_tokens=context)


@pytest.mark.parametrize("num_others", [1, 20])  # 20: past PRICE_ALL_UP_TO, the bounded search
def test_decode_choice_counts_the_requests_queued_to_join_each_batch(num_others):
    """Reserved requests join the batch before this one: a burst placed before the next
    telemetry spreads over the decode instances instead of piling onto the first."""
    others = [queued(decode(f"d{i:02}", 0, 0), 3, 3_000) for i in range(num_others)]
    idle = decode("d99", 0, 0)
    choice = choose_by_tbt(REQ, current_loads([*others, idle]), P.decode_step_s)
    assert choice.instance_id == "d99"
    alone = choose_by_tbt(REQ, current_loads(others[:1]), P.decode_step_s)
    assert alone.predicted_tbt_s == pytest.approx(tbt(4, 3_000 + REQ.num_prompt_tokens))


def test_decode_without_kv_room_is_never_chosen():
    full = decode("d0", 0, 0, used=100_000 - 112)
    policy = make_policy("kv-centric", predictors=P)
    outcome = policy.choose(REQ, cluster([prefill("p")], [full, decode("d1", 50, 90_000)]), 0.0)
    assert isinstance(outcome, Decision) and outcome.decode.instance_id == "d1"
    outcome = policy.choose(REQ, cluster([prefill("p")], [full]), 0.0)
    assert isinstance(outcome, Rejection) and outcome.reason is RejectReason.NO_DECODE
    assert outcome.predicted_ttft_s == pytest.approx(0.097)


def early(ttft_slo, tbt_slo):
    return make_policy("kv-centric", predictors=P, admission="early", slo=Slo(ttft_slo, tbt_slo))


@pytest.mark.parametrize(
    ("ttft_factor", "tbt_factor", "reason"),
    [
        (1.0, 1.0, None),  # exactly at both SLOs: accepted (rejection needs a strict >)
        (0.999, 2.0, RejectReason.TTFT_SLO),
        (2.0, 0.999, RejectReason.TBT_SLO),
    ],
)
def test_early_rejection_compares_predictions_with_slos_before_prefill(
    ttft_factor, tbt_factor, reason
):
    # The SLOs are the policy's own predictions, computed by the same arithmetic, times a factor.
    ttft, predicted_tbt = (97 - 0) * 0.001, P.decode_step_s(1, 97)
    policy = early(ttft * ttft_factor, predicted_tbt * tbt_factor)
    outcome = policy.choose(REQ, cluster([prefill("p")], [decode("d")]), 0.0)
    if reason is None:
        assert isinstance(outcome, Decision)
    else:
        assert (
            isinstance(outcome, Rejection)
            and outcome.reason is reason
            and outcome.retry_after_s >= 1.0
        )


def test_ttft_rejection_asks_to_retry_after_the_excess_queue():
    outcome = early(1.0, 1.0).choose(REQ, cluster([prefill("p", queue_s=5.0)], [decode("d")]), 0.0)
    assert outcome.reason is RejectReason.TTFT_SLO
    assert outcome.retry_after_s == pytest.approx(5.097 - 1.0)


def test_none_admission_accepts_what_early_rejects():
    snapshot = cluster([prefill("p", queue_s=100.0)], [decode("d", 1000, 10**6, capacity=10**7)])
    assert isinstance(make_policy("kv-centric", predictors=P).choose(REQ, snapshot, 0.0), Decision)
    assert isinstance(early(30.0, 0.1).choose(REQ, snapshot, 0.0), Rejection)


def test_projection_drops_finished_decodes_and_adds_finished_prefills():
    d0, d1 = decode("d0", 3, 3000), decode("d1", 0, 0)
    inflight = [
        InflightRequest("d0", 1000, decode_start_s=0.0, is_decoding=True),  # ends at 10
        InflightRequest("d0", 1000, decode_start_s=5.0, is_decoding=True),  # ends at 15
        InflightRequest("d1", 700, decode_start_s=11.0, is_decoding=False),  # joins at 11
        InflightRequest("d1", 700, decode_start_s=13.0, is_decoding=False),  # joins after 12
        InflightRequest("d1", 700, decode_start_s=0.5, is_decoding=False),  # joined and left
    ]
    loads = projected_loads([d0, d1], inflight, at_s=12.0, decode_time_s=10.0)
    assert [(load.num_running, load.num_context_tokens) for load in loads] == [(2, 2000), (1, 700)]
    later = projected_loads([d0, d1], [], 12.0, 10.0)
    assert [(load.num_running, load.num_context_tokens) for load in later] == [(3, 3000), (0, 0)]


def test_predictive_accepts_what_will_have_drained_and_rejects_what_will_have_filled():
    slo = Slo(30.0, tbt(4, 97))  # room for 3 running requests of no context, plus this one
    td = DecodeTimeEstimator(prior_s=10.0, prior_weight=1.0)
    predictive = make_policy(
        "kv-centric", predictors=P, admission="predictive", slo=slo, decode_time=td
    )
    busy = [InflightRequest("d", 0, decode_start_s=-9.99, is_decoding=True) for _ in range(4)]
    snapshot = cluster([prefill("p")], [decode("d", 4, 0)], inflight=busy)
    assert isinstance(early(30.0, slo.tbt_s).choose(REQ, snapshot, 0.0), Rejection)
    accepted = predictive.choose(REQ, snapshot, 0.0)  # those 4 finish before this prefill does
    assert isinstance(accepted, Decision) and accepted.decode.predicted_tbt_s == pytest.approx(
        tbt(1, 97)
    )
    coming = [InflightRequest("d", 0, decode_start_s=0.05, is_decoding=False) for _ in range(4)]
    snapshot = cluster([prefill("p")], [decode("d", 0, 0)], inflight=coming)
    assert isinstance(early(30.0, slo.tbt_s).choose(REQ, snapshot, 0.0), Decision)
    rejected = predictive.choose(REQ, snapshot, 0.0)
    assert isinstance(rejected, Rejection) and rejected.reason is RejectReason.TBT_SLO


def test_predictive_retry_after_waits_for_the_next_expected_departure():
    td = DecodeTimeEstimator(prior_s=10.0)
    predictive = make_policy(
        "kv-centric", predictors=P, admission="predictive", slo=Slo(30.0, 0.001), decode_time=td
    )
    inflight = [
        InflightRequest("d", 0, decode_start_s=-2.0, is_decoding=True),
        InflightRequest("d", 0, decode_start_s=-4.0, is_decoding=True),
    ]
    outcome = predictive.choose(
        REQ, cluster([prefill("p")], [decode("d", 2, 0)], inflight=inflight), 0.0
    )
    assert outcome.reason is RejectReason.TBT_SLO and outcome.retry_after_s == pytest.approx(6.0)


def test_decode_time_estimator_learns_and_forgets():
    td = DecodeTimeEstimator(prior_s=10.0, prior_weight=1.0, half_life_s=100.0)
    assert td.estimate(0.0) == 10.0
    for _ in range(3):
        td.observe(2.0, now=0.0)
    assert td.estimate(0.0) == pytest.approx((6 + 10) / 4)
    assert td.estimate(100.0) == pytest.approx((3 + 10) / 2.5)  # the 3 samples weigh half now
    td.observe(4.0, now=100.0)
    assert td.estimate(100.0) == pytest.approx((3 + 4 + 10) / 3.5)
    with pytest.raises(ValueError):
        td.observe(-1.0, 0.0)


def test_admission_factory_validates():
    with pytest.raises(ValueError):
        make_admission("sometimes")
    with pytest.raises(ValueError):
        make_admission("early")
    assert make_admission("none").name == "none"


decodes = st.lists(st.tuples(st.integers(0, 64), st.integers(0, 200_000)), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(
    loads=decodes,
    queue=st.floats(0, 5),
    ttft_slo=st.floats(0.01, 6),
    tbt_slo=st.floats(0.01, 0.4),
    t_d=st.floats(0.5, 100),
    data=st.data(),
)
def test_predictive_never_accepts_what_early_rejects_when_prediction_equals_current_load(
    loads, queue, ttft_slo, tbt_slo, t_d, data
):
    now = 1000.0
    snapshots = [
        decode(f"d{i}", running, ctx, capacity=10**6) for i, (running, ctx) in enumerate(loads)
    ]
    # In-flight requests that neither leave nor join before any prefill could end.
    inflight = []
    for i in range(len(loads)):
        for _ in range(data.draw(st.integers(0, 3))):
            if t_d > queue + 1 and data.draw(st.booleans()):
                # Started recently enough to outlast the slowest prefill here (queue + 0.1 s).
                started = now - data.draw(st.floats(0, 1)) * (t_d - queue - 1)
                inflight.append(InflightRequest(f"d{i}", 100, started, True))
            else:
                inflight.append(InflightRequest(f"d{i}", 100, now + 10 + t_d * 0.6 + queue, False))
    snapshot = cluster([prefill("p", queue_s=queue)], snapshots, inflight=inflight)
    slo = Slo(ttft_slo, tbt_slo)
    early_outcome = make_policy("kv-centric", predictors=P, admission="early", slo=slo).choose(
        REQ, snapshot, now
    )
    predictive = make_policy(
        "kv-centric",
        predictors=P,
        admission="predictive",
        slo=slo,
        decode_time=DecodeTimeEstimator(prior_s=t_d, prior_weight=1.0),
    )
    predictive_outcome = predictive.choose(REQ, snapshot, now)
    if isinstance(early_outcome, Rejection):
        assert isinstance(predictive_outcome, Rejection)
        assert predictive_outcome.reason is early_outcome.reason
    else:
        assert predictive_outcome == early_outcome
