"""The prefix-reuse benchmark runs all four systems and writes every case (figures:
bench/README.md)."""

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU build (make install-vllm)")

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(900)]


def test_prefix_reuse_bench_measures_every_system(tiny_model_dir):
    from crescent.bench.prefix_reuse import run_prefix_reuse_bench

    result = run_prefix_reuse_bench(tiny_model_dir, repeat=1, lengths=(512,))
    cases = {case["case"]: case["ttft_ms"] for case in result["cases"]}
    assert set(cases) == {
        f"{system}-512-{share}"
        for system in ("crescent", "crescent-store", "vllm", "vllm-prefix-cache")
        for share in (0, 90)
    }
    assert all(ttft > 0 for ttft in cases.values())
    ratios = {ratio["case"]: ratio for ratio in result["ratios"]}
    assert set(ratios) == {
        "crescent-0/vllm-0-512",
        "crescent-store-90/vllm-prefix-cache-90-512",
        "crescent-90/vllm-prefix-cache-90-512",
        "vllm-prefix-cache-0/vllm-0-512",
    }
    assert all(ratio["paired_ratio"] > 0 for ratio in ratios.values())
    assert ratios["vllm-prefix-cache-0/vllm-0-512"]["same_work"]
