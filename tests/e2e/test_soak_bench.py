"""The soak bench serves its load with nothing failed and reports every process of the cluster
and etcd, memory and CPU (figures: bench/README.md, soak)."""

import pytest

from crescent.bench.soak import run_soak_bench

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_soak_bench_reports_the_memory_of_every_process_and_etcd_history():
    result = run_soak_bench(minutes=0.3, concurrency=4, sample_s=3, warmup_s=3)

    cases = {case["case"]: case for case in result["cases"]}
    assert cases["requests"]["ok"] > 0 and cases["requests"]["failed"] == 0
    assert {name for name in cases if name.startswith("rss-")} == {
        "rss-nats",
        "rss-etcd",
        "rss-store-node0",
        "rss-prefill-0",
        "rss-decode-0",
        "rss-conductor-0",
    }
    assert all(case["end_mb"] > 0 for name, case in cases.items() if name.startswith("rss-"))
    assert {name[4:] for name in cases if name.startswith("cpu-")} == {
        name[4:] for name in cases if name.startswith("rss-")
    }
    assert cases["cpu-store-node0"]["end_pct"] > 0  # the store worked through the load
    etcd = cases["etcd-db"]
    assert etcd["raft_entries_per_min"] > 0  # etcd took writes while the load ran
    assert result["config"]["etcd_compaction_retention"] == "1m"
