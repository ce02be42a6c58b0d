"""Figures a bench reads off a running conductor's /metrics."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

ON_DECODE_METRIC = "crescent_prefill_on_decode_total"
REQUESTS_METRIC = "crescent_requests_total"
MIGRATIONS_METRIC = "crescent_request_migrations_total"
OUTCOMES = ("ok", "rejected", "error")


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


def num_prefilled_on_decode(api_url: str) -> int:
    """How many prompts the conductor at `api_url` had decode instances compute themselves."""
    return round(sum(sample.value for sample in _samples(_page(api_url), ON_DECODE_METRIC)))


def num_moved(api_url: str) -> int:
    """How often the conductor at `api_url` moved a request to another instance (every stage
    and cause): each move computes the prompt again, and a decode move the tokens streamed."""
    return round(sum(sample.value for sample in _samples(_page(api_url), MIGRATIONS_METRIC)))


def request_outcomes(api_url: str) -> dict[str, int]:
    """outcomes_of the conductor at `api_url`."""
    return outcomes_of(_page(api_url))


def outcomes_of(text: str) -> dict[str, int]:
    """The requests a conductor's metrics page says it finished, by outcome (every endpoint):
    `ok`, `rejected` (429/503 before any work) and `error`, which counts a stream that ended
    with an error event after its 200, a success to clients that only read the status."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for sample in _samples(text, REQUESTS_METRIC):
        outcome = sample.labels["outcome"]
        counts[outcome] = counts.get(outcome, 0) + round(sample.value)
    return counts
