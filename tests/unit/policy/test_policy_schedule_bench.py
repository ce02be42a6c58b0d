"""The scheduling benchmark runs and reports what its callers read (a tiny case, not a timing),
on a cluster priced the way the conductor prices one."""

from __future__ import annotations

import dataclasses

from crescent.bench.schedule_bench import format_table, run_schedule_bench
from crescent.bench.schedule_cluster import MODEL, build_conductor


def test_bench_reports_kv_centric_and_least_loaded_cases():
    result = run_schedule_bench(repeat=5, instances=(8,), blocks=(16,))
    assert result["bench"] == "schedule"
    assert [c["case"] for c in result["cases"]] == ["8x16", "least-loaded-8x16"]
    assert all(c["p99_us"] >= c["p50_us"] > 0 for c in result["cases"])
    assert all(c["record_p99_us"] >= c["record_p50_us"] > 0 for c in result["cases"])
    assert "least-loaded-8x16" in format_table(result)


def test_bench_cluster_is_priced_per_instance_with_prefixes_to_reuse():
    load = build_conductor(8, 16)
    scheduler = load.scheduler
    prefill = scheduler.view.snapshot("prefill", MODEL, load.clock.now, scheduler.pricing)
    assert len(prefill) == len({s.node for s in prefill}) == 8
    assert len({id(s.costs) for s in prefill}) == 8  # each its own corrected model
    assert len({id(s.costs.base) for s in prefill}) == 2  # two kinds of hardware
    lengths = [scheduler.index.match(r.block_hashes).best_len for r in load.requests]
    assert min(lengths) >= 4 and max(lengths) <= 16
    for request in load.requests[:4]:
        load.between_decisions(scheduler.schedule(request, MODEL))
    assert scheduler.inflight  # decisions are admitted and recorded


def test_a_retry_leaves_out_the_excluded_instances():
    """A retry (exclude) takes rows out of the view's columns before the usable-instance filter:
    the decision is the one the policy makes on the remaining instances' snapshots."""
    load = build_conductor(8, 16)
    scheduler, request = load.scheduler, load.requests[1]
    first = scheduler.schedule(request, MODEL)
    excluded = {first.prefill.instance_id, first.decode.instance_id}
    retry = scheduler.schedule(request, MODEL, excluded)
    assert retry.prefill.instance_id not in excluded and retry.decode.instance_id not in excluded
    now = load.clock.now
    snapshot = scheduler._snapshot(MODEL, now, ())
    remaining = dataclasses.replace(
        snapshot,
        prefill=[s for s in snapshot.prefill if s.instance_id not in excluded],
        decode=[s for s in snapshot.decode if s.instance_id not in excluded],
    )
    assert scheduler.policy.choose(request, remaining, now) == retry
    others = {s.instance_id for s in snapshot.prefill} - {"prefill-003"}
    only = scheduler.schedule(request, MODEL, others)
    assert only.prefill.instance_id == "prefill-003"


def test_predictive_admission_decides_with_the_requests_kept_in_flight():
    load = build_conductor(8, 16, admission="predictive", num_inflight=32)
    scheduler = load.scheduler
    assert scheduler.policy.admission.name == "predictive"
    for i in range(48):
        load.between_decisions(scheduler.schedule(load.requests[i % len(load.requests)], MODEL))
    decoding = [r.is_decoding for r in scheduler.inflight.values()]
    assert len(decoding) == 32 and sum(decoding) == 16
    result = run_schedule_bench(
        repeat=5, instances=(8,), blocks=(16,), admission="predictive", num_inflight=32
    )
    assert result["admission"] == "predictive" and result["inflight"] == 32
