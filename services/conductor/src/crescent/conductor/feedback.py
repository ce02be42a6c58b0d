"""The closed loop: every placed request's predictions, checked against what it took, and fed
back into the online correction of the instances that served it.

At placement the conductor keeps two predictions per request: the one it placed by (the
instance's published model, corrected) and the published model alone, so the histograms
show what the correction buys (`crescent_prediction_abs_error_ratio{prediction=published|
corrected}`). When the first token arrives, the worker's PrefillResult says how long the
request queued, pulled and computed; when the stream ends, its mean time between tokens is
known. The corrected TTFT's error is also split into its terms (`kind=ttft_queue|ttft_compute|
ttft_overhead`), each term's |predicted − measured| as a share of the measured TTFT, so a
benchmark shows which term the error comes from: the queue (T_queue + T_transfer against the
worker's wait), the request's own compute, or the messaging around them. Timings that
contradict each other (a worker reporting more time than the conductor waited, more cached
tokens than the prompt has) are not learned from, and logged once per instance.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from crescent.common.messages import PrefillResult
from crescent.conductor import metrics
from crescent.conductor.policy import Decision, ScheduleRequest
from crescent.conductor.pricing import Pricing

log = logging.getLogger(__name__)

CLOCK_SLACK_S = 0.005  # worker and conductor time the same interval on two clocks


@dataclass(frozen=True)
class Placed:
    """What was predicted for one request when it was placed."""

    model: str
    prefill_id: str
    decode_id: str
    num_prompt_tokens: int
    ttft_s: float
    ttft_published_s: float
    tbt_s: float
    tbt_published_s: float
    transfer_published_s: float
    # The corrected terms of ttft_s: the wait before the compute (T_transfer + T_queue), the
    # compute, and the messaging overhead (inside the corrected T_prefill).
    wait_s: float
    compute_s: float
    overhead_s: float


class Feedback:
    def __init__(self, pricing: Pricing) -> None:
        self.pricing = pricing
        self.placed: dict[str, Placed] = {}
        self._contradicting: set[str] = set()  # instances whose contradiction was logged

    def on_placed(self, request: ScheduleRequest, decision: Decision, model: str) -> None:
        prefill, decode = decision.prefill, decision.decode
        correction = self.pricing.correction
        prefill_ratio = correction.ratio(prefill.instance_id, "prefill")
        overhead_s = correction.of(prefill.instance_id).overhead_s
        published_ttft_s = (
            prefill.transfer_s / correction.ratio(prefill.instance_id, "transfer")
            + (prefill.queue_s + max(0.0, prefill.prefill_s - overhead_s)) / prefill_ratio
        )
        self.placed[request.request_id] = Placed(
            model,
            prefill.instance_id,
            decode.instance_id,
            request.num_prompt_tokens,
            prefill.predicted_ttft_s,
            published_ttft_s,
            decode.predicted_tbt_s,
            decode.predicted_tbt_s / correction.ratio(decode.instance_id, "decode"),
            prefill.transfer_s / correction.ratio(prefill.instance_id, "transfer"),
            prefill.transfer_s + prefill.queue_s,
            max(0.0, prefill.prefill_s - overhead_s),
            min(overhead_s, prefill.prefill_s),
        )

    def forget(self, request_id: str) -> None:
        self.placed.pop(request_id, None)

    def on_prefilled(
        self,
        request_id: str,
        result: PrefillResult,
        measured_ttft_s: float,
        reserve_wait_s: float = 0.0,
    ) -> None:
        """The first token came `measured_ttft_s` after the job was sent, the last
        `reserve_wait_s` of it waiting for the decode's reservation reply after the result."""
        placed = self.placed.get(request_id)
        if placed is None:
            return
        observe_error("ttft", "corrected", placed.ttft_s, measured_ttft_s)
        observe_error("ttft", "published", placed.ttft_published_s, measured_ttft_s)
        instance_id = placed.prefill_id
        if log.isEnabledFor(logging.DEBUG):  # its fields cost every request, logged or not
            log.debug(
                "ttft prediction checked",
                extra={
                    "request_id": request_id,
                    "instance_id": instance_id,
                    "num_prompt_tokens": placed.num_prompt_tokens,
                    "num_cached_tokens": result.num_cached_tokens,
                    "predicted_s": round(placed.ttft_s, 6),
                    "published_s": round(placed.ttft_published_s, 6),
                    "measured_s": round(measured_ttft_s, 6),
                    "predicted_wait_s": round(placed.wait_s, 6),
                    "predicted_compute_s": round(placed.compute_s, 6),
                    "queue_s": round(result.queue_s, 6),
                    "compute_s": round(result.compute_s, 6),
                    "transfer_s": round(result.transfer_s, 6),
                    "reserve_wait_s": round(reserve_wait_s, 6),
                },
            )
        contradiction = _contradiction(result, placed, measured_ttft_s)
        if contradiction:
            if instance_id not in self._contradicting:
                self._contradicting.add(instance_id)
                log.warning(
                    "ignoring contradictory timings from a prefill instance",
                    extra={"instance_id": instance_id, "contradiction": contradiction},
                )
            return
        _observe_terms(placed, result, measured_ttft_s)
        correction = self.pricing.correction
        published_compute_s = self.pricing.published_prefill_s(
            "prefill", instance_id, placed.model, placed.num_prompt_tokens, result.num_cached_tokens
        )
        correction.observe(instance_id, "prefill", published_compute_s, result.compute_s)
        if placed.transfer_published_s > 0 and result.transfer_s > 0:
            correction.observe(
                instance_id, "transfer", placed.transfer_published_s, result.transfer_s
            )
        correction.observe_overhead(
            instance_id, measured_ttft_s - result.queue_s - result.compute_s
        )

    def on_decoded(self, request_id: str, measured_tbt_s: float) -> None:
        """The stream ended on the decode instance it was placed on, `measured_tbt_s` apart."""
        placed = self.placed.get(request_id)
        if placed is None:
            return
        observe_error("tbt", "corrected", placed.tbt_s, measured_tbt_s)
        observe_error("tbt", "published", placed.tbt_published_s, measured_tbt_s)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "tbt prediction checked",
                extra={
                    "request_id": request_id,
                    "instance_id": placed.decode_id,
                    "predicted_s": round(placed.tbt_s, 6),
                    "published_s": round(placed.tbt_published_s, 6),
                    "measured_s": round(measured_tbt_s, 6),
                },
            )
        self.pricing.correction.observe(
            placed.decode_id, "decode", placed.tbt_published_s, measured_tbt_s
        )


def _contradiction(result: PrefillResult, placed: Placed, measured_ttft_s: float) -> str:
    """What makes the worker's timings impossible; "" if nothing."""
    if result.num_cached_tokens > placed.num_prompt_tokens:
        return (
            f"{result.num_cached_tokens} cached tokens of a {placed.num_prompt_tokens}-token prompt"
        )
    if result.queue_s + result.compute_s > measured_ttft_s + CLOCK_SLACK_S:
        return (
            f"queue {result.queue_s:.4f} s + compute {result.compute_s:.4f} s exceed the "
            f"{measured_ttft_s:.4f} s the conductor waited"
        )
    if result.transfer_s > result.queue_s + CLOCK_SLACK_S:
        return (
            f"transfer {result.transfer_s:.4f} s exceeds queue {result.queue_s:.4f} s, "
            "which includes it"
        )
    return ""


def _observe_terms(placed: Placed, result: PrefillResult, measured_ttft_s: float) -> None:
    """Each term of the corrected TTFT against what the worker measured for it, as a share of
    the measured TTFT (the terms' errors bound the TTFT's: it is their sum)."""
    if measured_ttft_s <= 0:
        return
    overhead_s = measured_ttft_s - result.queue_s - result.compute_s
    for kind, predicted_s, measured_s in (
        ("ttft_queue", placed.wait_s, result.queue_s),
        ("ttft_compute", placed.compute_s, result.compute_s),
        ("ttft_overhead", placed.overhead_s, overhead_s),
    ):
        metrics.labelled(metrics.PREDICTION_ERROR, kind, "corrected").observe(
            abs(predicted_s - measured_s) / measured_ttft_s
        )


def observe_error(kind: str, prediction: str, predicted_s: float, measured_s: float) -> None:
    """Record |predicted − measured| / measured (nothing for an instant measurement)."""
    if measured_s > 0:
        metrics.labelled(metrics.PREDICTION_ERROR, kind, prediction).observe(
            abs(predicted_s - measured_s) / measured_s
        )
