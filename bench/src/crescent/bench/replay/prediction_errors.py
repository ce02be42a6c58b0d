"""How far off a Crescent conductor's TTFT and TBT predictions were during a replay, from its
/metrics: the histogram crescent_prediction_abs_error_ratio (|predicted − measured| / measured
per request) read before and after, so the figures cover the replayed requests only.

Quantiles are interpolated linearly inside the histogram's buckets (as Prometheus'
histogram_quantile does), so they are as fine as the buckets around them (0.02 apart below
0.1, 0.025–0.05 up to 0.3). Any other endpoint has no such histogram: the report says None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import aiohttp

METRIC = "crescent_prediction_abs_error_ratio"
Buckets = dict[
    tuple[str, str], dict[float, float]
]  # (kind, prediction) → upper bound → cumulative count


async def scrape_prediction_buckets(
    session: aiohttp.ClientSession, base_url: str
) -> Buckets | None:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        async with session.get(f"{base_url}/metrics") as response:
            if response.status != 200:
                return None
            text = await response.text()
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
    buckets: Buckets = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == f"{METRIC}_bucket" and "prediction" in sample.labels:
                    key = (sample.labels["kind"], sample.labels["prediction"])
                    buckets.setdefault(key, {})[float(sample.labels["le"])] = sample.value
    except ValueError:  # not a Prometheus page
        return None
    return buckets if buckets else None


def bucket_quantile(cumulative: Sequence[tuple[float, float]], q: float) -> float | None:
    """The q-quantile of a histogram given as (upper bound, cumulative count), bounds rising."""
    total = cumulative[-1][1] if cumulative else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for upper_bound, count in cumulative:
        if count >= rank:
            if math.isinf(upper_bound):
                return lower_bound  # beyond the last finite bucket: its bound is all we know
            share = (rank - lower_count) / (count - lower_count) if count > lower_count else 1.0
            return lower_bound + (upper_bound - lower_bound) * share
        lower_bound, lower_count = upper_bound, count
    return lower_bound


def prediction_error_report(before: Buckets | None, after: Buckets | None) -> dict | None:
    """{"ttft"|"tbt": {"published"|"corrected": {"count", "median_abs_err", "p90_abs_err"}}} of
    the requests between the two scrapes; None without a conductor's histogram."""
    if after is None:
        return None
    report: dict = {}
    for (kind, prediction), counts in sorted(after.items()):
        earlier: Mapping[float, float] = (before or {}).get((kind, prediction), {})
        cumulative = sorted(
            (bound, count - earlier.get(bound, 0.0)) for bound, count in counts.items()
        )
        report.setdefault(kind, {})[prediction] = {
            "count": int(cumulative[-1][1]) if cumulative else 0,
            "median_abs_err": bucket_quantile(cumulative, 0.5),
            "p90_abs_err": bucket_quantile(cumulative, 0.9),
        }
    return report


def format_prediction_errors(report: dict | None) -> list[str]:
    if not report:
        return []
    lines = []
    for kind, predictions in report.items():
        cells = [
            f"{prediction} median {_pct(row['median_abs_err'])} p90 {_pct(row['p90_abs_err'])} "
            f"({row['count']} requests)"
            for prediction, row in predictions.items()
        ]
        lines.append(f"{kind.upper()} prediction error: " + "; ".join(cells))
    return lines


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f} %"


async def scrape_once(base_url: str, timeout_s: float = 10.0) -> Buckets | None:
    """One scrape in its own session (before and after a replay)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        return await scrape_prediction_buckets(session, base_url)
