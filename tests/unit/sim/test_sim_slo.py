"""The paper's metrics: TBT is the mean of the longest 10 % of token intervals; effective
request capacity counts rejected requests in the denominator."""

import pytest

from crescent.bench.slo import SloTargets, effective_capacity, percentile, tbt_of


def test_tbt_is_the_mean_of_the_longest_tenth_of_the_intervals():
    intervals = [0.01] * 18 + [0.5, 0.3]
    assert tbt_of(intervals) == pytest.approx(0.4)  # 2 of 20
    assert tbt_of([0.02, 0.9, 0.03]) == pytest.approx(0.9)  # ceil(0.3) = 1
    assert tbt_of([0.05] * 11) == pytest.approx(0.05)  # ceil(1.1) = 2, both 0.05
    assert tbt_of([0.1] * 10 + [1.0]) == pytest.approx(0.55)  # ceil(1.1) = 2: 1.0 and 0.1
    assert tbt_of([]) == 0.0


def test_effective_capacity_counts_requests_meeting_both_slos_among_all_sent():
    slo = SloTargets(ttft_s=30, tbt_s=0.1)
    outcomes = [
        (True, 1.0, 0.05),  # effective
        (True, 31.0, 0.05),  # TTFT missed
        (True, 1.0, 0.2),  # TBT missed
        (False, None, None),  # rejected
        (True, 30.0, 0.1),
    ]  # exactly at both SLOs: effective
    assert effective_capacity(outcomes, slo) == pytest.approx(2 / 5)
    assert effective_capacity([], slo) == 0.0


def test_percentile_is_nearest_rank():
    values = list(range(1, 11))
    assert (
        percentile(values, 0.9) == 9
        and percentile(values, 1.0) == 10
        and percentile(values, 0.0) == 1
    )
    assert percentile([], 0.5) == 0.0
