"""Run one simulated case over a trace and summarise it in the bench JSON's case form."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from crescent.bench.sim.cluster import DisaggregatedCluster
from crescent.bench.sim.config import SimConfig
from crescent.bench.sim.coupled import CoupledCluster
from crescent.bench.sim.events import EventLoop
from crescent.bench.sim.request import SimRequest, Status
from crescent.bench.slo import SloTargets, effective_capacity, mean, percentile
from crescent.bench.trace import TraceRequest


def block_key(hash_id: int) -> bytes:
    """A trace hash id as a block hash: ids already name whole prefixes, like chained hashes."""
    return hash_id.to_bytes(8, "big")


def sim_requests(trace: Sequence[TraceRequest], config: SimConfig) -> list[SimRequest]:
    keys: dict[int, bytes] = {}
    requests = []
    for item in trace:
        blocks = tuple(
            keys.get(h) or keys.setdefault(h, block_key(h))
            for h in item.hash_ids[: item.num_full_blocks]
        )
        num_output = (
            item.output_length
            if config.output_limit is None
            else min(item.output_length, config.output_limit)
        )
        requests.append(
            SimRequest(
                item.index, item.arrival_s / config.speed, item.input_length, num_output, blocks
            )
        )
    return requests


class SimRun:
    """One case: the cluster, its requests after the run, and how long the run took."""

    def __init__(self, config: SimConfig, trace: Sequence[TraceRequest]) -> None:
        config.validate()
        self.config = config
        self.loop = EventLoop()
        self.cluster = (
            DisaggregatedCluster(config, self.loop)
            if config.coupled == "none"
            else CoupledCluster(config, self.loop)
        )
        self.requests = sim_requests(trace, config)
        self.wall_s = 0.0

    def run(self) -> SimRun:
        started = time.perf_counter()
        for request in self.requests:
            self.cluster.submit(request)
        self.cluster.start()
        self.loop.run()
        self.wall_s = time.perf_counter() - started
        return self

    def summary(self, case: str, slo: SloTargets | None = None) -> dict:
        """The case's figures; `slo` judges effectiveness (default: the run's own SLOs)."""
        slo = slo or SloTargets(self.config.ttft_slo_s, self.config.tbt_slo_s)
        requests = self.requests
        done = [r for r in requests if r.status is Status.OK]
        prefilled = [r for r in requests if r.is_prefilled]
        ttfts = [r.ttft_s for r in done]
        tbts = [r.tbt_s for r in done if r.num_output > 1]
        num_prompt = sum(r.num_prompt for r in prefilled)
        statuses = Counter(r.status for r in requests)
        reasons = Counter(r.reject_reason for r in requests if r.reject_reason)
        span_s = max((r.arrival_s for r in requests), default=0.0)
        result = {
            "case": case,
            "requests": len(requests),
            "completed": len(done),
            "rejected": statuses[Status.REJECTED] + statuses[Status.REJECTED_AFTER_PREFILL],
            "hit_rate": sum(r.cached_tokens for r in prefilled) / num_prompt if num_prompt else 0.0,
            "mean_ttft_s": mean(ttfts),
            "p90_ttft_s": percentile(ttfts, 0.9),
            "mean_tbt_s": mean(tbts),
            "p90_tbt_s": percentile(tbts, 0.9),
            "effective_capacity": effective_capacity(
                ((r.status is Status.OK, r.ttft_s, r.tbt_s) for r in requests), slo
            ),
            "prefill_compute_s": mean([r.compute_s for r in prefilled]),
            "prefilled_on_decode": sum(
                1 for r in prefilled if r.decision is not None and r.decision.prefill_on_decode
            ),
            "max_replicas": self.cluster.max_replicas,
            "wall_s": self.wall_s,
            "rejected_after_prefill": statuses[Status.REJECTED_AFTER_PREFILL],
            "rejected_by_reason": dict(sorted(reasons.items())),
            "goodput_rps": sum(1 for r in done if r.ttft_s <= slo.ttft_s and r.tbt_s <= slo.tbt_s)
            / span_s
            if span_s
            else 0.0,
            "simulated_s": self.loop.now,
            "requests_per_wall_s": len(requests) / self.wall_s if self.wall_s else 0.0,
            "events": self.loop.num_events,
        }
        imbalance = getattr(self.cluster, "imbalance_samples", None)
        if imbalance:
            result["mean_pd_imbalance"] = mean(imbalance)
        return result


def simulate(config: SimConfig, trace: Sequence[TraceRequest], case: str = "sim") -> dict:
    return SimRun(config, trace).run().summary(case)
