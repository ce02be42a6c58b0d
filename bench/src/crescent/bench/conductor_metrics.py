"""Figures a bench reads off a running conductor's /metrics."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

ON_DECODE_METRIC = "crescent_prefill_on_decode_total"


def num_prefilled_on_decode(api_url: str) -> int:
    """How many prompts the conductor at `api_url` had decode instances compute themselves."""
    with urllib.request.urlopen(f"{api_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return round(
        sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == ON_DECODE_METRIC
        )
    )
