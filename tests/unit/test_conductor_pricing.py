"""The conductor prices each instance with the profile it published, corrected online, and the
policy compares instances priced by different models."""

import pytest

from crescent.common.codec import encode
from crescent.common.cost_profile import CostProfile, DecodePlane, PrefillCost
from crescent.common.etcd import MirrorEvent
from crescent.common.messages import PrefillResult
from crescent.conductor.feedback import Feedback
from crescent.conductor.policy import (
    BlockIndex,
    ClusterSnapshot,
    CostPredictors,
    Decision,
    DecodeChoice,
    InstanceSnapshot,
    PrefillChoice,
    ScheduleRequest,
    make_policy,
)
from crescent.conductor.policy.correction import KINDS, CostCorrection
from crescent.conductor.pricing import Pricing

DEFAULT = CostPredictors(
    prefill_s=lambda n, p: 1.0, decode_step_s=lambda b, c: 0.5, kv_bytes_per_token=100.0
)


def profile(per_token_s: float, model: str = "m", decode_s: float = 0.01) -> bytes:
    return encode(
        CostProfile(
            model=model,
            prefill=PrefillCost(per_token_s=per_token_s),
            decode=[DecodePlane(base_s=decode_s)],
        )
    )


def test_each_instance_is_priced_with_its_own_published_profile():
    pricing = Pricing(DEFAULT)
    pricing.apply_cost_event(MirrorEvent("/crescent/c/costs/prefill/p0", profile(1e-3)))
    pricing.apply_cost_event(MirrorEvent("/crescent/c/costs/prefill/p1", profile(2e-3)))
    assert pricing.predictors("prefill", "p0", "m").prefill_s(1000, 0) == pytest.approx(1.0)
    assert pricing.predictors("prefill", "p1", "m").prefill_s(1000, 0) == pytest.approx(2.0)
    assert (
        pricing.predictors("prefill", "p2", "m").prefill_s(1000, 0) == 1.0
    )  # nothing published: the default
    pricing.apply_cost_event(MirrorEvent("/crescent/c/costs/prefill/p1", None))
    assert pricing.predictors("prefill", "p1", "m").prefill_s(1000, 0) == 1.0


def test_a_profile_of_another_model_or_malformed_is_ignored_and_logged_once(caplog):
    pricing = Pricing(DEFAULT)
    pricing.apply_cost_event(
        MirrorEvent("/crescent/c/costs/prefill/p0", profile(1e-3, model="other"))
    )
    pricing.apply_cost_event(MirrorEvent("/crescent/c/costs/decode/d0", b"\x00garbage"))
    for _ in range(3):
        assert pricing.predictors("prefill", "p0", "m").prefill_s(1000, 0) == 1.0
    assert pricing.predictors("decode", "d0", "m").decode_step_s(1, 0) == 0.5
    warnings = [
        r for r in caplog.records if "ignoring an instance's cost profile" in r.getMessage()
    ]
    assert len(warnings) == 2


def test_correction_is_the_median_of_recent_samples_within_bounds():
    correction = CostCorrection(window=5, max_ratio=4.0)
    correction.observe("p0", "prefill", published_s=0.1, measured_s=0.3)
    assert correction.ratio("p0", "prefill") == pytest.approx(
        3.0
    )  # the first sample counts in full
    correction.observe(
        "p0", "prefill", published_s=0.1, measured_s=2.0
    )  # an engine's slow first request
    for _ in range(3):  # many requests in flight, all placed before any correction: no overshoot
        correction.observe("p0", "prefill", published_s=0.1, measured_s=0.2)
    assert correction.ratio("p0", "prefill") == pytest.approx(2.0)  # the outlier does not count
    for _ in range(5):
        correction.observe("p0", "prefill", published_s=1.0, measured_s=1000.0)
    assert correction.ratio("p0", "prefill") == pytest.approx(4.0)  # clipped
    correction.observe("p0", "decode", published_s=0.0, measured_s=1.0)  # nothing to learn from
    assert correction.ratio("p0", "decode") == 1.0
    assert correction.of("p0").num_samples == {"prefill": 5}
    off = CostCorrection(is_enabled=False)
    off.observe("p0", "prefill", 0.1, 0.3)
    assert off.ratio("p0", "prefill") == 1.0


def test_a_ratio_is_that_of_the_instances_whole_correction():
    """`ratio` reads one kind without building the correction: the instance's own where it has
    samples of the kind, its peers' typical one where not, the identity for an unknown
    instance with no peers, and for all when the correction is off."""
    correction = CostCorrection(window=3)
    assert correction.ratio("p0", "prefill") == 1.0
    correction.observe("p0", "prefill", published_s=0.1, measured_s=0.3)
    correction.observe("p1", "prefill", published_s=0.1, measured_s=0.2)
    correction.observe("p1", "decode", published_s=0.1, measured_s=0.5)
    correction.observe_overhead("p2", 0.01)
    for instance_id in ("p0", "p1", "p2", "unseen"):
        whole = correction.of(instance_id)
        for kind in KINDS:
            assert correction.ratio(instance_id, kind) == whole.ratios[kind]
    assert correction.ratio("p0", "decode") == pytest.approx(5.0)  # p1's, its only peer's
    assert correction.ratio("p1", "prefill") == pytest.approx(2.0)  # its own
    assert CostCorrection(is_enabled=False).ratio("p0", "transfer") == 1.0


def test_corrected_predictors_carry_ratio_and_overhead():
    pricing = Pricing(DEFAULT)
    pricing.apply_cost_event(
        MirrorEvent("/crescent/c/costs/prefill/p0", profile(1e-3, decode_s=0.01))
    )
    first = pricing.predictors("prefill", "p0", "m")
    assert pricing.predictors("prefill", "p0", "m") is first  # cached while nothing changes
    pricing.correction.observe("p0", "prefill", 1.0, 2.0)
    pricing.correction.observe_overhead("p0", 0.05)
    ratio = pricing.correction.ratio("p0", "prefill")
    overhead = pricing.correction.of("p0").overhead_s
    corrected = pricing.predictors("prefill", "p0", "m")
    assert corrected is not first
    assert corrected.prefill_s(1000, 0) == pytest.approx(overhead + ratio * 1.0)
    assert pricing.queue_ratio("p0") == ratio


def test_policy_compares_instances_priced_by_different_models():
    slow = CostPredictors(
        prefill_s=lambda n, p: n * 1e-3, decode_step_s=lambda b, c: 0.01, kv_bytes_per_token=1.0
    )
    fast = CostPredictors(
        prefill_s=lambda n, p: n * 1e-4, decode_step_s=lambda b, c: 0.02, kv_bytes_per_token=1.0
    )
    snapshot = ClusterSnapshot(
        prefill=[
            InstanceSnapshot("p0", "n0", 0, 0, 0.0, 0, 0, costs=slow),
            InstanceSnapshot("p1", "n1", 0, 0, 0.5, 0, 0, costs=fast),
        ],
        decode=[
            InstanceSnapshot("d0", "n2", 0, 0, 0.0, 0, 10_000, costs=slow),
            InstanceSnapshot("d1", "n3", 0, 0, 0.0, 0, 10_000, costs=fast),
        ],
        index=BlockIndex(),
    )
    request = ScheduleRequest("r", [], num_prompt_tokens=1000, block_size=512, max_tokens=8)
    decision = make_policy("kv-centric", predictors=DEFAULT).choose(request, snapshot, now=0.0)
    assert decision.prefill.instance_id == "p1"  # 0.5 s queue + 0.1 s beats 1.0 s of the slow model
    assert decision.prefill.predicted_ttft_s == pytest.approx(0.6)
    assert decision.decode.instance_id == "d0" and decision.decode.predicted_tbt_s == 0.01
    least = make_policy("least-loaded", predictors=DEFAULT).choose(request, snapshot, now=0.0)
    assert least.prefill.instance_id == "p0" and least.prefill.prefill_s == pytest.approx(1.0)


def test_contradictory_timings_are_not_learned_from_and_logged_once(caplog):

    pricing = Pricing(DEFAULT)
    feedback = Feedback(pricing)
    prefill = PrefillChoice(
        instance_id="p0",
        node="n0",
        prefix_tokens=0,
        local_prefix_tokens=0,
        source_node=None,
        pull_hashes=(),
        transfer_s=0.0,
        queue_s=0.0,
        prefill_s=1.0,
    )
    decision = Decision(prefill, DecodeChoice("d0", 0.5))
    for request_id in ("r1", "r2"):
        request = ScheduleRequest(request_id, [], num_prompt_tokens=100, block_size=16)
        feedback.on_placed(request, decision, "m")
        impossible = PrefillResult(
            request_id=request_id,
            first_token=1,
            num_computed_tokens=100,
            queue_s=0.5,
            compute_s=3.0,
        )  # more than the 2 s the conductor waited
        feedback.on_prefilled(request_id, impossible, measured_ttft_s=2.0)
    assert pricing.correction.ratio("p0", "prefill") == 1.0
    assert len([r for r in caplog.records if "contradictory timings" in r.getMessage()]) == 1
    request = ScheduleRequest("r3", [], num_prompt_tokens=100, block_size=16)
    feedback.on_placed(request, decision, "m")
    fine = PrefillResult(
        request_id="r3", first_token=1, num_computed_tokens=100, queue_s=0.1, compute_s=2.0
    )
    feedback.on_prefilled("r3", fine, measured_ttft_s=2.2)
    assert pricing.correction.ratio("p0", "prefill") == pytest.approx(2.0)


def test_an_unobserved_instance_is_priced_like_its_observed_peers():
    """Every instance pays the control path's overhead: one with no samples yet must not look
    cheaper than the instance that holds a request's prefix just because it was never measured."""
    correction = CostCorrection()
    for _ in range(3):
        correction.observe("p0", "prefill", published_s=0.1, measured_s=0.2)
        correction.observe_overhead("p0", 0.05)
    fresh = correction.of("p1")
    assert fresh.ratios["prefill"] == pytest.approx(2.0) and fresh.overhead_s == pytest.approx(0.05)
    assert fresh.ratios["decode"] == 1.0  # nobody measured decode yet
    correction.observe("p1", "prefill", published_s=0.1, measured_s=0.1)
    own = correction.of("p1")
    assert own.ratios["prefill"] == pytest.approx(1.0) and own.overhead_s == pytest.approx(0.05)
    assert CostCorrection(is_enabled=False).of("p1").overhead_s == 0.0


def test_equal_profiles_share_a_base_and_changed_prices_are_reported():
    """Instances publishing the same profile are bounded through one base model, and the view
    learns whose price moved: the instance itself, or those relying on a typical correction."""
    pricing = Pricing(DEFAULT)
    for instance_id in ("p0", "p1"):
        pricing.apply_cost_event(MirrorEvent(f"/c/costs/prefill/{instance_id}", profile(1e-3)))
    pricing.apply_cost_event(MirrorEvent("/c/costs/decode/d0", profile(1e-3)))
    p0, p1 = (pricing.predictors("prefill", i, "m") for i in ("p0", "p1"))
    assert p0.base is p1.base and p0.base.prefill_s(1000, 0) == pytest.approx(1.0)
    pricing.predictors("decode", "d0", "m")
    pricing.take_changed()
    pricing.correction.observe("p0", "prefill", 1.0, 2.0)  # p1 has no samples: typical moves
    assert pricing.take_changed() == {("prefill", "p0"), ("decode", "p0"), ("prefill", "p1")}
    repriced = pricing.predictors("prefill", "p1", "m")
    assert (repriced.prefill_ratio, repriced.base) == (pytest.approx(2.0), p0.base)
    assert pricing.take_changed() == set()
    pricing.correction.observe("d0", "decode", 0.01, 0.01)  # its own: nobody else's price
    assert pricing.take_changed() == {("prefill", "d0"), ("decode", "d0")}
