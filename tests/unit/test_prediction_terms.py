"""The corrected TTFT's error split into its terms: which of queue, compute and messaging the
conductor got wrong, each as a share of the measured TTFT."""

import pytest
from prometheus_client import REGISTRY

from crescent.common.messages import PrefillResult
from crescent.conductor.feedback import Feedback
from crescent.conductor.policy import (
    CostPredictors,
    Decision,
    DecodeChoice,
    PrefillChoice,
    ScheduleRequest,
)
from crescent.conductor.pricing import Pricing

DEFAULT = CostPredictors(
    prefill_s=lambda n, p: 1.0, decode_step_s=lambda b, c: 0.5, kv_bytes_per_token=100.0
)
METRIC = "crescent_prediction_abs_error_ratio"


def count_at_most(kind: str, bound: float) -> float:
    labels = {"kind": kind, "prediction": "corrected", "le": str(bound)}
    return REGISTRY.get_sample_value(f"{METRIC}_bucket", labels) or 0.0


def total(kind: str) -> float:
    labels = {"kind": kind, "prediction": "corrected"}
    return REGISTRY.get_sample_value(f"{METRIC}_count", labels) or 0.0


def test_each_term_of_the_ttft_is_checked_against_what_the_worker_measured():
    pricing = Pricing(DEFAULT)
    pricing.correction.observe_overhead("p0", 0.1)  # learned messaging: inside the T_prefill
    feedback = Feedback(pricing)
    prefill = PrefillChoice(
        instance_id="p0",
        node="n0",
        prefix_tokens=0,
        local_prefix_tokens=0,
        source_node=None,
        pull_hashes=(),
        transfer_s=0.0,
        queue_s=2.0,
        prefill_s=1.1,  # 0.1 s of overhead + 1.0 s of compute
    )
    request = ScheduleRequest("r-terms", [], num_prompt_tokens=100, block_size=16)
    feedback.on_placed(request, Decision(prefill, DecodeChoice("d0", 0.5)), "m")
    placed = feedback.placed["r-terms"]
    assert (placed.wait_s, placed.compute_s, placed.overhead_s) == pytest.approx((2.0, 1.0, 0.1))
    before = {k: total(k) for k in ("ttft_queue", "ttft_compute", "ttft_overhead")}
    below = {
        "ttft_queue": count_at_most("ttft_queue", 0.02),
        "ttft_compute": count_at_most("ttft_compute", 0.3),
        "ttft_overhead": count_at_most("ttft_overhead", 0.02),
    }
    # The queue was right, the compute took 2 s more, the messaging as learned: TTFT 5.1 s.
    result = PrefillResult(
        request_id="r-terms", first_token=1, num_computed_tokens=100, queue_s=2.0, compute_s=3.0
    )
    feedback.on_prefilled("r-terms", result, measured_ttft_s=5.1)
    assert all(total(k) == before[k] + 1 for k in before)
    assert count_at_most("ttft_queue", 0.02) == below["ttft_queue"] + 1  # 0
    assert count_at_most("ttft_overhead", 0.02) == below["ttft_overhead"] + 1  # 0
    assert count_at_most("ttft_compute", 0.3) == below["ttft_compute"]  # 2 / 5.1 ≈ 0.39
    assert count_at_most("ttft_compute", 0.4) > below["ttft_compute"]
