"""The scheduling benchmark runs and reports what its callers read (a tiny case, not a timing)."""

from __future__ import annotations

from crescent.bench.schedule_bench import build_case, format_table, run_schedule_bench


def test_bench_reports_kv_centric_and_least_loaded_cases():
    result = run_schedule_bench(repeat=5, instances=(8,), blocks=(16,))
    assert result["bench"] == "schedule"
    assert [c["case"] for c in result["cases"]] == ["8x16", "least-loaded-8x16"]
    assert all(c["p99_us"] >= c["p50_us"] > 0 for c in result["cases"])
    assert "least-loaded-8x16" in format_table(result)


def test_bench_cluster_has_a_replicated_system_prompt_and_partial_prefixes():
    snapshot, requests = build_case(8, 16)
    lengths = [snapshot.index.match(r.block_hashes).best_len for r in requests]
    assert len(snapshot.prefill) == len({s.node for s in snapshot.prefill}) == 8
    assert min(lengths) >= 4 and max(lengths) <= 16
