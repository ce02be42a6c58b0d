"""Reading a service's Prometheus page in e2e tests."""

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples `name{labels}` in a Prometheus text page (labels matched
    exactly); 0 when there are none."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.labels == labels
    )


def metric(url: str, name: str, **labels: str) -> float:
    """metric_value of `url`/metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        return metric_value(response.read().decode(), name, **labels)


def metric_total(url: str, name: str, **labels: str) -> float:
    """The sum of the samples `name` on `url`/metrics whose labels include `labels` (any value
    of the others)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )
