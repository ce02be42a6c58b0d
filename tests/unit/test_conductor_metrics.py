"""The conductor's metrics helpers."""

from prometheus_client import REGISTRY

from crescent.conductor import metrics


def test_a_kept_series_counts_in_the_metric_it_came_from():
    before = REGISTRY.get_sample_value(
        "crescent_requests_total", {"endpoint": "test", "outcome": "kept"}
    )
    kept = metrics.labelled(metrics.REQUESTS, "test", "kept")
    assert metrics.labelled(metrics.REQUESTS, "test", "kept") is kept
    kept.inc()
    metrics.labelled(metrics.REQUESTS, "test", "kept").inc(2)
    assert (
        REGISTRY.get_sample_value(
            "crescent_requests_total", {"endpoint": "test", "outcome": "kept"}
        )
        == (before or 0) + 3
    )
