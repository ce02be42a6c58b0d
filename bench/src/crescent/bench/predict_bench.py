"""`crescent bench predict`: how far off the conductor's TTFT and TBT predictions are on a real
engine, before and after the online correction.

A 2-prefill 1-decode cluster of the tiny model on the vLLM CPU build; every worker measures its
engine at start and publishes the fitted profile (the measurements are kept in the run's work
directory, so a second run of the same model on the same machine reuses them). A slice of a
Mooncake trace is replayed through it. For every request the conductor holds two predictions,
both checked against what happened: the instance's published model alone (`-before`) and that
model corrected online by the requests before it (`-after`, what it places requests by). So the
cases compare the correction off and on over the same requests. The trace's first `warmup`
requests run first and are not counted: the engines' first requests are slow, and the requests
of the first burst are all placed before any has finished, when there is nothing to correct
with yet.

Each case reports the median and p90 of |predicted − measured| / measured, as fractions: TTFT
from sending the prefill job to its first token against T_transfer + T_queue + T_prefill, TBT
the request's mean time between tokens against the step time predicted at placement. Three more
cases split the corrected TTFT's error by term, each |predicted − measured| over the measured
TTFT: `ttft-queue-after` (the wait before the compute), `ttft-compute-after` (the request's
own compute) and `ttft-overhead-after` (messaging). Figures
come from the conductor's histogram (bucket-interpolated: prediction_errors.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import tempfile
from pathlib import Path

from crescent.bench.plain_vllm import bench_model
from crescent.bench.replay.client import ReplayOptions, replay
from crescent.bench.replay.prediction_errors import prediction_error_report, scrape_once
from crescent.bench.replay.prompts import PromptShape
from crescent.bench.replay.records import OK
from crescent.bench.trace import load_trace
from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

BLOCK_SIZE = 64
ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_LOGGING_LEVEL": "WARNING",
}
CASES = (
    ("ttft-before", "ttft", "published"),
    ("ttft-after", "ttft", "corrected"),
    ("tbt-before", "tbt", "published"),
    ("tbt-after", "tbt", "corrected"),
    # Where the corrected TTFT's error comes from: each term's error over the measured TTFT.
    ("ttft-queue-after", "ttft_queue", "corrected"),
    ("ttft-compute-after", "ttft_compute", "corrected"),
    ("ttft-overhead-after", "ttft_overhead", "corrected"),
)


def run_predict_bench(
    trace: Path,
    limit: int = 80,
    speed: float = 0.25,
    max_input_tokens: int = 2048,
    max_output_tokens: int = 16,
    warmup: int = 16,
    model_dir: Path | None = None,
    workdir: Path | None = None,
) -> dict:
    with tempfile.TemporaryDirectory(prefix="crescent-predict-") as tmp:
        workdir = workdir or Path(tmp)
        model_dir = bench_model(model_dir, workdir)
        loaded = load_trace(trace, warmup + limit)
        if len(loaded) <= warmup:
            raise ValueError(
                f"the trace has {len(loaded)} requests: none left after {warmup} of warm-up"
            )
        start_s = loaded[warmup].arrival_s
        counted = [dataclasses.replace(r, arrival_s=r.arrival_s - start_s) for r in loaded[warmup:]]
        # Trace blocks are 512 tokens; one cluster block each keeps the trace's prefix sharing
        # at the tiny model's scale.
        shape = PromptShape(
            block_tokens=BLOCK_SIZE,
            max_input_tokens=max_input_tokens,
            max_output_tokens=max_output_tokens,
            vocab_size=1000,
        )
        spec = ClusterSpec(
            workdir=workdir / "cluster",
            api_port=free_port(),
            num_prefill=2,
            num_decode=1,
            engine="vllm",
            model_dir=model_dir,
            block_size=BLOCK_SIZE,
            env=ENV,
            store_dram_bytes=512 << 20,
            store_ssd_bytes=256 << 20,
            engine_args=["--cost-profile-dir", str(workdir / "profiles")],
            conductor_args=["--ttft-slo-s", "600", "--tbt-slo-s", "10"],
        )
        cluster = LocalCluster(spec)
        cluster.start(timeout_s=420)
        try:
            options = ReplayOptions(cluster.api_url, model_dir.name, speed, shape)
            if warmup:
                asyncio.run(replay(loaded[:warmup], options))
            before = asyncio.run(scrape_once(cluster.api_url))
            records, wall_s, _ = asyncio.run(replay(counted, options))
            errors = prediction_error_report(before, asyncio.run(scrape_once(cluster.api_url)))
        finally:
            cluster.stop()
    cases = []
    for name, kind, prediction in CASES:
        row = ((errors or {}).get(kind) or {}).get(prediction) or {}
        cases.append(
            {
                "case": name,
                "median_abs_err": row.get("median_abs_err"),
                "p90_abs_err": row.get("p90_abs_err"),
                "requests": row.get("count", 0),
            }
        )
    return {
        "bench": "predict",
        "cases": cases,
        "config": {
            "trace": str(trace),
            "limit": limit,
            "warmup": warmup,
            "speed": speed,
            "max_input_tokens": max_input_tokens,
            "max_output_tokens": max_output_tokens,
            "cluster": "2 prefill + 1 decode, tiny model, vLLM CPU",
            "completed": sum(1 for r in records if r.status == OK),
            "wall_s": round(wall_s, 1),
            "cpu_threads": os.cpu_count(),
            "statistic": "|predicted - measured| / measured per request, bucket-interpolated",
        },
    }
