"""Reading a service's Prometheus page in e2e tests."""

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of the samples `name{labels}` on `url`/metrics (labels matched exactly); 0 when
    there are none."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.labels == labels
    )
