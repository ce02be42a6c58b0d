"""Figures a bench reads off the /metrics of a running cluster's stores, found through a
conductor's /v1/cluster."""

from __future__ import annotations

import json
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

LOOKUP_WAIT_METRIC = "crescent_store_lookup_wait_seconds"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def store_urls(api_url: str) -> list[str]:
    """The HTTP addresses of the stores registered in the cluster that `api_url` serves."""
    cluster = json.loads(_get(f"{api_url}/v1/cluster"))
    return [item["http_url"] for item in cluster["instances"] if item["role"] == "store"]


def lookup_waits(api_url: str) -> dict[str, float]:
    """lookup_waits_of the stores of the cluster that `api_url` serves."""
    return lookup_waits_of([_get(f"{url}/metrics") for url in store_urls(api_url)])


def lookup_waits_of(pages: list[str]) -> dict[str, float]:
    """Over the stores' metrics pages: the lookups allowed to wait for blocks still being
    written (a decode's, asked right after its prefill's first token), how many of them did
    wait, and the seconds waited in all."""
    allowed = not_waited = seconds = 0.0
    for page in pages:
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.name == f"{LOOKUP_WAIT_METRIC}_count":
                    allowed += sample.value
                elif sample.name == f"{LOOKUP_WAIT_METRIC}_sum":
                    seconds += sample.value
                elif sample.name == f"{LOOKUP_WAIT_METRIC}_bucket" and (
                    float(sample.labels["le"]) == 0.0
                ):
                    not_waited += sample.value
    return {
        "lookups_allowed_to_wait": round(allowed),
        "lookups_waited": round(allowed - not_waited),
        "lookup_wait_s": round(seconds, 3),
    }
