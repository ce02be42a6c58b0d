"""Reading a service's Prometheus page in tests."""

import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families


def _sum(text: str, name: str, keep: Callable[[dict[str, str]], bool]) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and keep(sample.labels)
    )


def _page(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        return response.read().decode()


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples `name{labels}` in a Prometheus text page (labels matched
    exactly); 0 when there are none."""
    return _sum(text, name, lambda sample_labels: sample_labels == labels)


def metric(url: str, name: str, **labels: str) -> float:
    """metric_value of `url`/metrics."""
    return metric_value(_page(url), name, **labels)


def metric_total(url: str, name: str, **labels: str) -> float:
    """The sum of the samples `name` on `url`/metrics whose labels include `labels` (any value
    of the others)."""
    return _sum(_page(url), name, lambda sample_labels: labels.items() <= sample_labels.items())
