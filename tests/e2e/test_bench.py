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
    clusters = ("1P1D", "4P4D", "1P1D-on-decode")
    assert set(cases) == {"http-direct", *clusters, "parse-8000-token-ids"}
    for name in ("http-direct", *clusters):
        assert cases[name]["rps"] > 0 and 0 < cases[name]["p50_ms"] <= cases[name]["p99_ms"]
    parse = cases["parse-8000-token-ids"]
    assert parse["parse_ms"] > 0 and parse["json_loads_ms"] > 0
    assert cases["1P1D"]["added_p50_ms"] == pytest.approx(
        cases["1P1D"]["p50_ms"] - cases["http-direct"]["p50_ms"], abs=1e-3
    )
