"""What the replay client measured of one request, and the report over all of them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from crescent.bench.slo import SloTargets, effective_capacity, mean, percentile, tbt_of

OK = "ok"


@dataclass
class RequestRecord:
    index: int
    scheduled_s: float  # when the trace says to send it, from the replay's start
    sent_s: float = 0.0  # when it was sent
    status: str = "pending"  # ok | http-<code> | connection-error | bad-response | timeout
    detail: str = ""
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int | None = None  # usage.prompt_tokens_details, where the server gives it
    ttft_s: float | None = None
    intervals_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    retry_after_s: float | None = None

    @property
    def tbt_s(self) -> float:
        return tbt_of(self.intervals_s)

    @property
    def lag_s(self) -> float:
        return self.sent_s - self.scheduled_s

    def as_dict(self) -> dict:
        return {
            "index": self.index,
            "status": self.status,
            "detail": self.detail,
            "scheduled_s": self.scheduled_s,
            "lag_s": self.lag_s,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
            "num_cached_tokens": self.num_cached_tokens,
            "ttft_s": self.ttft_s,
            "tbt_s": self.tbt_s,
            "e2e_s": self.e2e_s,
            "retry_after_s": self.retry_after_s,
            "intervals_s": self.intervals_s,
        }


def summarize(
    records: Sequence[RequestRecord], slo: SloTargets, wall_s: float, cache_hit_rate: float | None
) -> dict:
    ok = [r for r in records if r.status == OK]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tbts = [r.tbt_s for r in ok if r.intervals_s]
    lags = [r.lag_s for r in records if r.status != "pending"]
    num_effective = sum(
        1 for r in ok if r.ttft_s is not None and r.ttft_s <= slo.ttft_s and r.tbt_s <= slo.tbt_s
    )
    span_s = max((r.scheduled_s for r in records), default=0.0)
    statuses = Counter(r.status for r in records if r.status != OK)
    return {
        "case": "replay",
        "requests": len(records),
        "completed": len(ok),
        "failed": sum(statuses.values()),
        "failures_by_status": dict(sorted(statuses.items())),
        "effective_capacity": effective_capacity(
            ((r.status == OK, r.ttft_s, r.tbt_s) for r in records), slo
        ),
        "goodput_rps": num_effective / max(span_s, wall_s) if records else 0.0,
        "mean_ttft_s": mean(ttfts),
        "p50_ttft_s": percentile(ttfts, 0.5),
        "p90_ttft_s": percentile(ttfts, 0.9),
        "p99_ttft_s": percentile(ttfts, 0.99),
        "mean_tbt_s": mean(tbts),
        "p50_tbt_s": percentile(tbts, 0.5),
        "p90_tbt_s": percentile(tbts, 0.9),
        "p99_tbt_s": percentile(tbts, 0.99),
        "cache_hit_rate": cache_hit_rate,
        "p50_lag_ms": percentile(lags, 0.5) * 1000,
        "p99_lag_ms": percentile(lags, 0.99) * 1000,
        "wall_s": wall_s,
    }
