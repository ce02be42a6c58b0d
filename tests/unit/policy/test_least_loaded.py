"""Least-loaded on the view's columns picks what it picks comparing snapshots one by one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from crescent.conductor.policy import (
    ClusterSnapshot,
    CostPredictors,
    Decision,
    InstanceSnapshot,
    Rejection,
    ScheduleRequest,
    least_loaded,
    make_policy,
)
from crescent.conductor.policy.columns import InstanceColumns
from crescent.conductor.policy.decode_load import DecodeLoad

PREDICTORS = CostPredictors(
    lambda n, p: 1e-3 * (n - p), lambda b, c: 0.01 + 1e-3 * b + 1e-6 * c, 1.0
)

# Few distinct values, so that ties on every key but the id are common.
instances = st.lists(
    st.builds(
        lambda i, queue_s, num_queued, num_running, used, is_stale: InstanceSnapshot(
            f"i{i:03d}", f"n{i}", num_queued, num_running, queue_s, used, 100, is_stale=is_stale
        ),
        st.integers(0, 999),
        st.sampled_from([0.0, 0.5, 2.0]),
        st.integers(0, 2),
        st.integers(0, 2),
        st.sampled_from([0, 40, 90, 100]),
        st.booleans(),
    ),
    max_size=60,
    unique_by=lambda s: s.instance_id,
)


@settings(max_examples=300, deadline=None)
@given(snapshots=instances, num_tokens=st.sampled_from([0, 10, 60]))
def test_columns_pick_what_snapshots_pick(snapshots, num_tokens):
    """Every size, subsets of the columns included (as eligibility hands them over), with the
    columns' path taken above its size threshold and, once more, at every size."""
    compare_up_to = least_loaded.COMPARE_SNAPSHOTS_UP_TO
    try:
        for least_loaded.COMPARE_SNAPSHOTS_UP_TO in (compare_up_to, 0):
            check_columns_against_snapshots(snapshots, num_tokens)
    finally:
        least_loaded.COMPARE_SNAPSHOTS_UP_TO = compare_up_to


def check_columns_against_snapshots(snapshots: list[InstanceSnapshot], num_tokens: int) -> None:
    columns = InstanceColumns.of(snapshots)
    usable = columns.where(columns.is_usable)
    plain = [s for s in snapshots if s.is_usable]
    assert least_loaded.choose_prefill(columns) == least_loaded.choose_prefill(list(snapshots))
    assert least_loaded.choose_prefill(usable) == least_loaded.choose_prefill(plain)
    assert least_loaded.choose_decode(usable, num_tokens) == least_loaded.choose_decode(
        plain, num_tokens
    )
    assert least_loaded.choose_decode(columns, num_tokens) == least_loaded.choose_decode(
        list(snapshots), num_tokens
    )


@settings(max_examples=100, deadline=None)
@given(prefills=instances, decodes=instances)
def test_the_policy_decides_what_the_snapshots_say(prefills, decodes):
    """The least-loaded policy's picks and their predictions, at any size, are those of the
    plain comparison among the instances eligibility leaves."""
    request = ScheduleRequest("r", (), 30, 16, 20)
    policy = make_policy("least-loaded", predictors=PREDICTORS)
    outcome = policy.choose(request, ClusterSnapshot(prefills, decodes), 0.0)
    prefill = least_loaded.choose_prefill([s for s in prefills if s.is_usable])
    room = [s for s in decodes if s.is_usable and s.kv_free_tokens >= request.num_kv_tokens]
    decode = least_loaded.choose_decode(room, request.num_kv_tokens)
    if prefill is None or decode is None:
        assert isinstance(outcome, Rejection)
        return
    assert isinstance(outcome, Decision)
    assert (outcome.prefill.instance_id, outcome.decode.instance_id) == (
        prefill.instance_id,
        decode.instance_id,
    )
    # the batch it joins: the running requests and those queued for it
    load = DecodeLoad(
        decode,
        decode.num_running + decode.num_queued,
        decode.num_context_tokens + decode.queued_context_tokens,
    )
    assert outcome.decode.predicted_tbt_s == load.tbt_with(request, PREDICTORS.decode_step_s)
