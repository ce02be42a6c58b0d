"""`crescent bench store` runs end to end on small shapes and writes the project's JSON form
(figures are in bench/README.md)."""

import json

import pytest

from crescent.bench.store_bench import MOONCAKE_VENV, run_store_bench

pytestmark = pytest.mark.e2e

SHAPES = ((4, 1 << 20), (64, 64 << 10))
CASES = ["put-1MiB", "get-1MiB", "put-64KiB", "get-64KiB"]


def test_crescent_side_writes_every_case():
    result = json.loads(
        json.dumps(
            run_store_bench(repeat=1, batch_bytes=1 << 20, include_mooncake=False, shapes=SHAPES)
        )
    )
    assert result["bench"] == "store"
    assert [case["case"] for case in result["cases"]] == CASES
    for case in result["cases"]:
        assert set(case) == {"case", "gbps", "tcp_gbps"}
        assert case["gbps"] > 0 and case["tcp_gbps"] > 0


@pytest.mark.skipif(
    not (MOONCAKE_VENV / "bin" / "python").exists(),
    reason="Mooncake's venv is not made yet (a first `crescent bench store` makes it)",
)
def test_mooncake_side_runs_the_same_cases():
    result = run_store_bench(repeat=1, batch_bytes=1 << 20, shapes=SHAPES)
    assert [case["case"] for case in result["cases"]] == CASES
    assert all(case["mooncake_gbps"] > 0 for case in result["cases"])
