"""The P/D ratio controller's decisions: which side grows or shrinks, and the hysteresis that
keeps a skewed, noisy signal from making it oscillate."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crescent.conductor.ratio import (
    Action,
    Bounds,
    InstanceCounts,
    RatioConfig,
    RatioConfigError,
    RatioController,
    RatioSignal,
    RatioWindow,
    propose,
)

CONFIG = RatioConfig(bounds=Bounds(1, 4, 1, 4), persist_windows=3, cooldown_windows=2)
PREFILL_HEAVY = RatioSignal(
    prefill_load=2.0, decode_load=0.1, ttft_attainment=0.5, tbt_attainment=1.0
)
DECODE_HEAVY = RatioSignal(
    prefill_load=0.05, decode_load=1.5, ttft_attainment=1.0, tbt_attainment=0.4
)
IDLE = RatioSignal(prefill_load=0.05, decode_load=0.1, ttft_attainment=1.0, tbt_attainment=1.0)


def test_the_side_that_misses_its_slo_grows():
    counts = InstanceCounts(2, 2)
    assert propose(PREFILL_HEAVY, counts, CONFIG).action is Action.ADD_PREFILL
    assert propose(DECODE_HEAVY, counts, CONFIG).action is Action.ADD_DECODE


def test_missed_attainment_alone_counts_as_short():
    signal = RatioSignal(prefill_load=0.5, decode_load=0.5, ttft_attainment=1.0, tbt_attainment=0.5)
    assert propose(signal, InstanceCounts(2, 2), CONFIG).action is Action.ADD_DECODE


def test_when_both_sides_are_short_the_heavier_by_f_im_grows():
    signal = RatioSignal(prefill_load=0.9, decode_load=3.0, ttft_attainment=0.5, tbt_attainment=0.5)
    assert signal.imbalance > 1
    assert propose(signal, InstanceCounts(2, 2), CONFIG).action is Action.ADD_DECODE


def test_a_spent_budget_shifts_the_ratio_instead():
    config = RatioConfig(bounds=Bounds(1, 4, 1, 4, max_total=4))
    assert propose(DECODE_HEAVY, InstanceCounts(3, 1), config).action is Action.REMOVE_PREFILL
    assert propose(DECODE_HEAVY, InstanceCounts(1, 3), config).action is Action.HOLD


def test_a_side_at_its_maximum_holds():
    proposal = propose(PREFILL_HEAVY, InstanceCounts(4, 1), CONFIG)
    assert proposal.action is Action.HOLD and "maximum" in proposal.reason


def test_an_off_ratio_without_slo_trouble_sheds_the_idle_lighter_side():
    signal = RatioSignal(prefill_load=0.1, decode_load=0.7, ttft_attainment=1.0, tbt_attainment=1.0)
    assert signal.imbalance > CONFIG.imbalance_band
    assert propose(signal, InstanceCounts(3, 2), CONFIG).action is Action.REMOVE_PREFILL
    assert propose(signal, InstanceCounts(1, 2), CONFIG).action is Action.ADD_DECODE


def test_an_idle_cluster_scales_in_the_lighter_side_down_to_the_minimums():
    assert propose(IDLE, InstanceCounts(2, 2), CONFIG).action is Action.REMOVE_PREFILL
    assert propose(IDLE, InstanceCounts(1, 2), CONFIG).action is Action.REMOVE_DECODE
    assert propose(IDLE, InstanceCounts(1, 1), CONFIG).action is Action.HOLD


def test_no_samples_from_one_side_holds():
    assert propose(RatioSignal(None, 3.0), InstanceCounts(1, 1), CONFIG).action is Action.HOLD


def test_a_change_waits_for_the_signal_to_persist():
    off_ratio = RatioSignal(
        prefill_load=0.1, decode_load=0.7, ttft_attainment=1.0, tbt_attainment=1.0
    )
    controller = RatioController(CONFIG, InstanceCounts(3, 2))
    decisions = [controller.step(off_ratio, controller.desired) for _ in range(3)]
    assert [d.is_change for d in decisions] == [False, False, True]
    assert controller.desired == InstanceCounts(2, 2)


def test_a_side_missing_its_slo_grows_sooner_than_capacity_is_removed():
    controller = RatioController(CONFIG, InstanceCounts(1, 1))
    decisions = [controller.step(PREFILL_HEAVY, controller.desired) for _ in range(2)]
    assert CONFIG.urgent_persist_windows == 2 < CONFIG.persist_windows
    assert [d.is_change for d in decisions] == [False, True] and decisions[1].proposal.is_urgent
    assert controller.desired == InstanceCounts(2, 1)


def test_a_flapping_signal_changes_nothing():
    controller = RatioController(CONFIG, InstanceCounts(2, 2))
    for i in range(30):
        decision = controller.step(PREFILL_HEAVY if i % 2 else DECODE_HEAVY, controller.desired)
        assert not decision.is_change
    assert controller.desired == InstanceCounts(2, 2)


def test_a_cooldown_follows_each_change():
    config = RatioConfig(
        bounds=Bounds(1, 8, 1, 8), persist_windows=1, urgent_persist_windows=1, cooldown_windows=3
    )
    controller = RatioController(config, InstanceCounts(1, 1))
    changes = [controller.step(PREFILL_HEAVY, controller.desired).is_change for _ in range(9)]
    assert changes == [True, False, False, False, True, False, False, False, True]


def test_no_change_while_the_last_one_has_not_taken_effect():
    config = RatioConfig(
        bounds=Bounds(1, 8, 1, 8),
        persist_windows=1,
        urgent_persist_windows=1,
        cooldown_windows=0,
        settle_windows=4,
    )
    controller = RatioController(config, InstanceCounts(1, 1))
    assert controller.step(PREFILL_HEAVY, InstanceCounts(1, 1)).is_change
    stuck = [controller.step(PREFILL_HEAVY, InstanceCounts(1, 1)).is_change for _ in range(5)]
    assert stuck == [False, False, False, False, True]  # gives up waiting after settle_windows
    assert controller.desired == InstanceCounts(3, 1)


def test_bad_bounds_are_refused():
    with pytest.raises(RatioConfigError):
        RatioController(
            RatioConfig(bounds=Bounds(min_prefill=3, max_prefill=2)), InstanceCounts(1, 1)
        )
    with pytest.raises(RatioConfigError):
        RatioConfig(bounds=Bounds(max_total=1)).validate()
    assert Bounds(1, 4, 1, 4, max_total=5).clamp(InstanceCounts(9, 9)).total == 5


def test_a_window_reduces_samples_to_trimmed_means_and_attainment():
    window = RatioWindow(ttft_slo_s=2.0, tbt_slo_s=0.1)
    window.add_loads([0.5] * 9 + [50.0], [1.0] * 10)
    for ttft_s in (1.0, 1.5, 3.0, 0.5):
        window.add_ttft(ttft_s)
    window.add_tbt(0.05)
    signal = window.close()
    assert signal.prefill_load == pytest.approx(0.5) and signal.decode_load == pytest.approx(1.0)
    assert signal.imbalance == pytest.approx(2.0 / 1.5)
    assert signal.ttft_attainment == 0.75 and signal.tbt_attainment == 1.0
    assert window.close() == RatioSignal(None, None)


def run_mix(
    phases: list[tuple[int, float, float]],
    config: RatioConfig,
    start: InstanceCounts,
    controller_on: bool = True,
) -> list[InstanceCounts]:
    """A toy cluster under the controller: each side's load is its demand (in instances' worth
    of work) spread over its instances, and the cluster runs what the controller asks for."""
    controller = RatioController(config, start)
    counts, history = start, []
    for num_windows, prefill_demand, decode_demand in phases:
        for _ in range(num_windows):
            prefill_load, decode_load = (
                prefill_demand / counts.prefill,
                decode_demand / counts.decode,
            )
            signal = RatioSignal(
                prefill_load,
                decode_load,
                ttft_attainment=1.0 if prefill_load <= 1 else 0.5,
                tbt_attainment=1.0 if decode_load <= 1 else 0.5,
            )
            decision = controller.step(signal, counts)
            if controller_on:
                counts = decision.desired
            history.append(counts)
    return history


def test_counts_follow_a_mix_that_shifts_from_prefill_heavy_to_decode_heavy():
    config = RatioConfig(
        bounds=Bounds(1, 4, 1, 4, max_total=5), persist_windows=2, cooldown_windows=1
    )
    history = run_mix([(30, 2.4, 0.2), (40, 0.2, 2.4)], config, InstanceCounts(1, 1))
    prefill_phase, decode_phase = history[29], history[-1]
    assert prefill_phase.prefill >= 3 and prefill_phase.decode == 1
    assert decode_phase.decode >= 3 and decode_phase.prefill < prefill_phase.prefill
    assert all(c.total <= 5 for c in history)
    assert run_mix(
        [(30, 2.4, 0.2), (40, 0.2, 2.4)], config, InstanceCounts(1, 1), controller_on=False
    )[-1] == InstanceCounts(1, 1)


signals = st.builds(
    RatioSignal,
    st.floats(0, 5),
    st.floats(0, 5),
    st.none() | st.floats(0, 1),
    st.none() | st.floats(0, 1),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(signals, min_size=1, max_size=60), st.integers(1, 4), st.integers(0, 3))
def test_any_signal_sequence_keeps_counts_in_bounds_and_moves_one_step_at_a_time(
    sequence, persist, cooldown
):
    bounds = Bounds(1, 5, 1, 4, max_total=7)
    controller = RatioController(
        RatioConfig(
            bounds=bounds,
            persist_windows=persist,
            urgent_persist_windows=min(persist, 2),
            cooldown_windows=cooldown,
        ),
        InstanceCounts(2, 2),
    )
    previous, last_change = controller.desired, -cooldown - 1
    for i, signal in enumerate(sequence):
        desired = controller.step(signal, previous).desired
        assert bounds.min_prefill <= desired.prefill <= bounds.max_prefill
        assert bounds.min_decode <= desired.decode <= bounds.max_decode and desired.total <= 7
        step = abs(desired.prefill - previous.prefill) + abs(desired.decode - previous.decode)
        assert step <= 1
        if step:
            assert i - last_change > cooldown and i + 1 >= min(persist, 2)
            last_change = i
        previous = desired
