"""The decode-load benchmark runs both systems and writes every case (figures:
bench/README.md)."""

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU build (make install-vllm)")

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(900)]


def test_decode_load_bench_measures_both_systems(tiny_model_dir):
    from crescent.bench.decode_load import run_decode_load_bench

    result = run_decode_load_bench(tiny_model_dir, length=1024, turns=1, running=1)
    cases = {case["case"]: case for case in result["cases"]}
    assert set(cases) == {"async-1024", "sync-1024"}
    assert all(case["load_gap_ms"] > 0 and case["arrival_second_ms"] > 0 for case in cases.values())
    assert {ratio["case"] for ratio in result["ratios"]} == {
        "async/sync-1024-load_gap_ms",
        "async/sync-1024-running_itl_p99_ms",
        "async/sync-1024-arrival_second_ms",
    }
