"""`crescent replay` against a real emulated cluster (every service a process): a 50-request
slice of the Mooncake trace, prompts capped so the emulated model's context holds them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
SLICE = Path(__file__).resolve().parents[1] / "data" / "mooncake_trace_slice.jsonl"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("replay"),
        api_port=free_port(),
        num_prefill=2,
        num_decode=2,
        node_per_instance=True,
        engine_args=["--emulated-time-scale", "0.05"],
        conductor_args=["--admission", "none"],
    )
    local = LocalCluster(spec)
    local.start(timeout_s=90)
    yield local
    local.stop()


def test_replay_of_a_trace_slice_reports_every_request(cluster, tmp_path):
    out, plots = tmp_path / "replay.json", tmp_path / "plots"
    crescent = Path(sys.executable).parent / "crescent"
    done = subprocess.run(
        [
            str(crescent),
            "replay",
            str(SLICE),
            "--url",
            cluster.api_url,
            "--limit",
            "50",
            "--speed",
            "2",
            "--max-input-tokens",
            "8192",
            "--max-output-tokens",
            "32",
            "--vocab-size",
            "258",  # the emulated engine's byte tokenizer
            "--json",
            str(out),
            "--plot",
            str(plots),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    [report] = result["cases"]
    assert report["requests"] == 50 and report["completed"] == 50 and report["failed"] == 0
    assert 0 < report["mean_ttft_s"] <= report["p99_ttft_s"]
    assert report["mean_tbt_s"] > 0 and report["effective_capacity"] > 0
    # requests of the slice share prefixes, and the conductor reports the share it reused
    assert report["cache_hit_rate"] is not None and report["cache_hit_rate"] > 0.1
    records = result["records"]
    assert all(
        r["status"] == "ok" and r["num_output_tokens"] == min(32, r["num_output_tokens"])
        for r in records
    )
    # one interval per streamed event after the first; decode may deliver fast tokens together
    assert all(
        0 < len(r["intervals_s"]) <= r["num_output_tokens"] - 1
        for r in records
        if r["num_output_tokens"] > 1
    )
    assert (plots / "ttft_cdf.png").stat().st_size > 0 and (
        plots / "tbt_cdf.png"
    ).stat().st_size > 0
    assert "effective request capacity" in done.stdout
    # the conductor's own prediction errors over these 50 requests, before and after correction
    errors = report["prediction_error"]
    assert {p: row["count"] for p, row in errors["ttft"].items()} == {
        "published": 50,
        "corrected": 50,
    }
    assert errors["tbt"]["corrected"]["count"] > 0
    assert (
        0
        <= errors["ttft"]["corrected"]["median_abs_err"]
        <= errors["ttft"]["corrected"]["p90_abs_err"]
    )
    assert "TTFT prediction error: corrected median" in done.stdout
