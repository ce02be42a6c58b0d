"""Validation (c) of the simulator: a slice of the Mooncake trace replayed against a real
emulated cluster (every service a process) and simulated with the same cost model, the same
store capacities and the same conductor settings agree on mean TTFT within 20 % and on the cache
hit rate within 0.05.

The emulated engines run at twice the cost model's time and the trace's arrivals are slowed 8× (a
quarter of the trace's load at full speed), so that what each request costs the cluster beyond
compute on a small shared machine (HTTP, NATS hops, saving KV blocks into the stores), which the
simulator does not model, stays small beside compute. Both are compared over the requests the
cluster completed: the cluster's hit rate from each response's `usage.prompt_tokens_details`, the
simulator's from the prefix its prefill instances reused (both count what was stored when the job
reached its prefill instance). Workers send telemetry every 0.5 s (in both), so an instance starved
of CPU on a busy test machine is not taken for gone.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from crescent.bench.sim.config import SimConfig
from crescent.bench.sim.run import SimRun
from crescent.bench.trace import load_trace
from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port
from crescent.engine.cost_model import ModelDims

pytestmark = pytest.mark.e2e
SLICE = Path(__file__).resolve().parents[1] / "data" / "mooncake_trace_slice.jsonl"
TIME_SCALE = 2.0
SPEED = 0.125
NUM_REQUESTS = 40
MAX_INPUT, MAX_OUTPUT = 16384, 64
STORE_DRAM, STORE_SSD, BLOCK_BYTES = 256 << 20, 1 << 30, 1 << 20  # LocalCluster's stores
DECODE_KV_TOKENS = 262144  # the decode worker's default
TELEMETRY_PERIOD_S = 0.5


def capped_trace(path: Path) -> Path:
    """The slice with prompts and outputs cut, written out so replay and simulation read the
    very same requests."""
    lines = []
    for item in load_trace(SLICE, NUM_REQUESTS):
        n = min(item.input_length, MAX_INPUT)
        lines.append(
            json.dumps(
                {
                    "timestamp": round(item.arrival_s * 1000),
                    "input_length": n,
                    "output_length": min(item.output_length, MAX_OUTPUT),
                    "hash_ids": list(item.hash_ids[: math.ceil(n / 512)]),
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def simulated(trace_path: Path) -> SimRun:
    config = SimConfig(
        num_prefill=2,
        num_decode=2,
        admission="none",
        speed=SPEED,
        model_dims=ModelDims(),  # the emulated model
        tflops=100.0 / TIME_SCALE,
        memory_gbps=1500.0 / TIME_SCALE,  # the emulated device, time-scaled
        cache_tokens_per_node=STORE_DRAM // BLOCK_BYTES * 512,
        ssd_tokens_per_node=STORE_SSD // BLOCK_BYTES * 512,
        kv_bytes_per_token_stored=BLOCK_BYTES / 512,
        decode_kv_tokens=DECODE_KV_TOKENS,
        nic_gbps=100.0,
        telemetry_period_s=TELEMETRY_PERIOD_S,
    )
    return SimRun(config, load_trace(trace_path)).run()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    scale = ["--emulated-time-scale", str(TIME_SCALE)]
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("validate"),
        api_port=free_port(),
        num_prefill=2,
        num_decode=2,
        node_per_instance=True,
        engine_args=[*scale, "--telemetry-period-s", str(TELEMETRY_PERIOD_S)],
        conductor_args=[*scale, "--admission", "none"],
        store_dram_bytes=STORE_DRAM,
        store_ssd_bytes=STORE_SSD,
    )
    local = LocalCluster(spec)
    local.start(timeout_s=90)
    yield local
    local.stop()


def test_simulation_and_emulated_cluster_agree(cluster, tmp_path):
    trace_path = capped_trace(tmp_path / "slice.jsonl")
    out = tmp_path / "replay.json"
    crescent = Path(sys.executable).parent / "crescent"
    done = subprocess.run(
        [
            str(crescent),
            "replay",
            str(trace_path),
            "--url",
            cluster.api_url,
            "--vocab-size",
            "258",
            "--speed",
            str(SPEED),
            "--json",
            str(out),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    [replayed] = result["cases"]
    ok = {r["index"]: r for r in result["records"] if r["status"] == "ok"}
    run = simulated(trace_path)
    sim = run.summary("sim")
    # Compared over the requests the cluster completed (a few may fail on a starved machine);
    # each completed request's usage says how many of its prompt tokens were loaded.
    sim_done = [r for r in run.requests if r.index in ok]
    replay_done = list(ok.values())
    figures = {
        "completed": len(ok),
        "failures": replayed["failures_by_status"],
        "replay_mean_ttft_s": sum(r["ttft_s"] for r in replay_done) / len(ok),
        "sim_mean_ttft_s": sum(r.ttft_s for r in sim_done) / len(ok),
        "replay_hit_rate": sum(r["num_cached_tokens"] for r in replay_done)
        / sum(r["num_prompt_tokens"] for r in replay_done),
        "sim_hit_rate": sum(r.cached_tokens for r in sim_done)
        / sum(r.num_prompt for r in sim_done),
        "replay_mean_tbt_s": replayed["mean_tbt_s"],
        "sim_mean_tbt_s": sim["mean_tbt_s"],
        "cached_differs": {
            r.index: (ok[r.index]["num_cached_tokens"], r.cached_tokens)
            for r in sim_done
            if ok[r.index]["num_cached_tokens"] != r.cached_tokens
        },
    }
    print(json.dumps(figures))
    assert sim["completed"] == NUM_REQUESTS and len(ok) >= 0.9 * NUM_REQUESTS
    assert figures["sim_mean_ttft_s"] == pytest.approx(figures["replay_mean_ttft_s"], rel=0.2)
    assert figures["sim_hit_rate"] == pytest.approx(figures["replay_hit_rate"], abs=0.05)
