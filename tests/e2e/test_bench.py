"""The benchmarks run and write the project's JSON form (figures are in bench/README.md)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_control_plane_bench_writes_every_case(tmp_path):
    out = tmp_path / "cp.json"
    crescent = Path(sys.executable).parent / "crescent"
    subprocess.run(
        [
            str(crescent),
            "bench",
            "control-plane",
            "--json",
            str(out),
            "--requests",
            "40",
            "--concurrency",
            "4",
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    result = json.loads(out.read_text())
    assert result["bench"] == "control-plane"
    cases = {case["case"]: case for case in result["cases"]}
    assert set(cases) == {"http-direct", "1P1D", "4P4D"}
    for case in cases.values():
        assert case["rps"] > 0 and 0 < case["p50_ms"] <= case["p99_ms"]
    assert cases["1P1D"]["added_p50_ms"] == pytest.approx(
        cases["1P1D"]["p50_ms"] - cases["http-direct"]["p50_ms"], abs=1e-3
    )
