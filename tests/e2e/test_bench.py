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
    run = subprocess.run(
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
        timeout=300,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]  # the bench's own reason, when it fails
    result = json.loads(out.read_text())
    assert result["bench"] == "control-plane"
    cases = {case["case"]: case for case in result["cases"]}
    clusters = ("1P1D", "4P4D", "1P1D-on-decode")
    assert set(cases) == {"http-direct", "floor-1P1D", *clusters, "parse-8000-token-ids"}
    for name in ("http-direct", "floor-1P1D", *clusters):
        assert cases[name]["rps"] > 0 and 0 < cases[name]["p50_ms"] <= cases[name]["p99_ms"]
    parse = cases["parse-8000-token-ids"]
    assert parse["parse_ms"] > 0 and parse["json_loads_ms"] > 0
    assert cases["1P1D"]["added_p50_ms"] == pytest.approx(
        cases["1P1D"]["p50_ms"] - cases["http-direct"]["p50_ms"], abs=1e-3
    )
    roles = ("conductor", "prefill", "decode", "store", "nats", "etcd")
    for name in clusters:
        by_role = {key[len("cpu_ms_") :]: value for key, value in cases[name].items()}
        by_role = {role: by_role[role] for role in roles}  # each role is there
        assert by_role["conductor"] > 0 and by_role["decode"] > 0
        assert sum(by_role.values()) == pytest.approx(cases[name]["cpu_ms_per_request"], abs=0.01)
    assert {key for key in cases["http-direct"] if key.startswith("cpu_ms_")} == {
        "cpu_ms_per_request"
    }
    floor = {key for key in cases["floor-1P1D"] if key.startswith("cpu_ms_")}
    assert floor == {
        f"cpu_ms_{role}" for role in ("per_request", "conductor", "prefill", "decode", "nats")
    }


def test_control_plane_bench_compares_another_checkout_side_by_side(tmp_path):
    """--compare runs each chosen cluster case twice at once, here from this same checkout,
    and says which commits it compared; a directory that is no checkout is a CLI error."""
    out = tmp_path / "cp.json"
    crescent = str(Path(sys.executable).parent / "crescent")
    repository = Path(__file__).resolve().parents[2]
    argv = [crescent, "bench", "control-plane", "--json", str(out), "--requests", "40"]
    run = subprocess.run(
        [*argv, "--concurrency", "4", "--cases", "1P1D", "--compare", str(repository)],
        timeout=300,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    cases = {case["case"]: case for case in result["cases"]}
    assert set(cases) == {"http-direct", "1P1D", "parse-8000-token-ids"}
    compared = cases["1P1D"]
    assert compared["compare_rps"] > 0 and compared["compare_p50_ms"] > 0
    assert compared["p50_over_compare"] == pytest.approx(
        compared["p50_ms"] / compared["compare_p50_ms"], abs=1e-3
    )
    assert result["config"]["compare"]["commit"] == result["config"]["commit"] != "unknown"

    for bad in (["--compare", str(tmp_path)], ["--cases", "1P1D,9P9D"]):
        refused = subprocess.run([*argv, *bad], timeout=60, capture_output=True, text=True)
        assert refused.returncode == 2, refused.stderr
        assert "crescent bench control-plane: error:" in refused.stderr
