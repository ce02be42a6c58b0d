"""Figures a bench reads off a running conductor's /metrics."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

ON_DECODE_METRIC = "crescent_prefill_on_decode_total"
REQUESTS_METRIC = "crescent_requests_total"
MIGRATIONS_METRIC = "crescent_request_migrations_total"
PREDICTION_ERROR_METRIC = "crescent_prediction_abs_error_ratio"
OUTCOMES = ("ok", "rejected", "error")
PREDICTION_BOUND = "0.5"  # a bucket of the conductor's prediction-error histogram


def _page(api_url: str) -> str:
    with urllib.request.urlopen(f"{api_url}/metrics", timeout=10) as response:
        return response.read().decode()


def _samples(text: str, name: str) -> list:
    return [
        sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def _total(text: str, name: str) -> int:
    return round(sum(sample.value for sample in _samples(text, name)))


def num_prefilled_on_decode(api_url: str) -> int:
    """How many prompts the conductor at `api_url` had decode instances compute themselves."""
    return _total(_page(api_url), ON_DECODE_METRIC)


def num_moved(api_url: str) -> int:
    """How often the conductor at `api_url` moved a request to another instance (every stage
    and cause): each move computes the prompt again, and a decode move the tokens streamed."""
    return _total(_page(api_url), MIGRATIONS_METRIC)


def replay_figures(api_url: str) -> dict[str, int]:
    """What a replay's row reports of the conductor at `api_url`, from one read of its page:
    prompts computed on decode, requests by outcome (`conductor_*`), moves, and predictions."""
    text = _page(api_url)
    return {
        "prefilled_on_decode": _total(text, ON_DECODE_METRIC),
        **{f"conductor_{outcome}": count for outcome, count in outcomes_of(text).items()},
        "conductor_moved": _total(text, MIGRATIONS_METRIC),
        **predictions_of(text),
    }


def outcomes_of(text: str) -> dict[str, int]:
    """The requests a conductor's metrics page says it finished, by outcome (every endpoint):
    `ok`, `rejected` (429/503 before any work) and `error`, which counts a stream that ended
    with an error event after its 200, a success to clients that only read the status."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for sample in _samples(text, REQUESTS_METRIC):
        outcome = sample.labels["outcome"]
        counts[outcome] = counts.get(outcome, 0) + round(sample.value)
    return counts


def predictions_of(text: str) -> dict[str, int]:
    """How many TTFT and TBT predictions, as admission used them (corrected online), the
    conductor checked against what the request took, and how many of those were within half
    of it (|predicted − measured| ≤ 0.5 × measured): counts, not shares, so that rounds add."""
    counts = {}
    for kind in ("ttft", "tbt"):
        labels = {"kind": kind, "prediction": "corrected"}
        total = [
            s for s in _samples(text, f"{PREDICTION_ERROR_METRIC}_count") if s.labels == labels
        ]
        within = [
            s
            for s in _samples(text, f"{PREDICTION_ERROR_METRIC}_bucket")
            if s.labels == {**labels, "le": PREDICTION_BOUND}
        ]
        counts[f"{kind}_predictions"] = round(sum(s.value for s in total))
        counts[f"{kind}_predictions_within_half"] = round(sum(s.value for s in within))
    return counts
