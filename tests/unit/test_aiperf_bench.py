"""`crescent bench aiperf`: the trace it replays and the row it reports."""

import json

from crescent.bench.aiperf_replay import cut_trace, hub_cache, summarize
from crescent.bench.cli import format_table


def test_cut_trace_caps_prompts_and_keeps_their_leading_hash_ids(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {
                    "timestamp": 0,
                    "input_length": 3000,
                    "output_length": 5,
                    "hash_ids": [1, 2, 3, 4, 5, 6],
                },
                {"timestamp": 5, "input_length": 700, "output_length": 9, "hash_ids": [1, 7]},
                {"timestamp": 9, "input_length": 10, "output_length": 1, "hash_ids": [8]},
            ]
        )
        + "\n"
    )
    out = tmp_path / "cut.jsonl"
    assert cut_trace(trace, out, limit=2, max_input_tokens=2048) == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["input_length"], r["hash_ids"]) for r in rows] == [
        (2048, [1, 2, 3, 4]),
        (700, [1, 7]),
    ]


def test_summary_counts_errors_and_reports_percentiles():
    stats = {"p50": 1.23, "p90": 4.5, "p99": 9.0}
    export = {
        "request_count": {"avg": 198.0},
        "error_summary": [
            {"count": 2, "error_details": {}},
            {"count": 1, "error_details": {"code": 500, "type": "Internal", "message": "boom"}},
        ],
        "time_to_first_token": stats,
        "inter_token_latency": stats,
        "request_latency": stats,
    }
    row = summarize(export)
    assert row["requests"] == 198 and row["errors"] == 3
    assert row["error_kinds"] == ["2 x error: ", "1 x 500 Internal: boom"]
    table = format_table({"bench": "aiperf", "cases": [{"case": "vllm", **row}]})
    assert "error_kinds" not in table.splitlines()[1]  # not a column
    assert table.splitlines()[-1] == "vllm error_kinds: 1 x 500 Internal: boom"
    assert row["ttft_ms_p50"] == 1.2 and row["itl_ms_p99"] == 9.0


def test_tokenizer_is_placed_under_a_hub_name(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    hub_cache(model, tmp_path / "hf")
    repo = tmp_path / "hf" / "hub" / "models--local--tiny-llama"
    revision = (repo / "refs" / "main").read_text()
    assert (repo / "snapshots" / revision / "tokenizer.json").exists()


def test_an_unknown_case_is_refused_before_anything_starts(tmp_path):
    import pytest

    from crescent.bench.aiperf_replay import AiperfError, run_aiperf_bench

    with pytest.raises(AiperfError, match="unknown cases vllm-3x"):
        run_aiperf_bench(tmp_path / "t.jsonl", cases=("vllm-3x",), workdir=tmp_path)


def test_conductor_outcomes_are_summed_over_endpoints():
    from crescent.bench.conductor_metrics import outcomes_of

    page = """# TYPE crescent_requests counter
crescent_requests_total{endpoint="completions",outcome="ok"} 7.0
crescent_requests_total{endpoint="chat",outcome="ok"} 2.0
crescent_requests_total{endpoint="completions",outcome="error"} 1.0
crescent_requests_created{endpoint="completions",outcome="ok"} 1.7e9
"""
    assert outcomes_of(page) == {"ok": 9, "rejected": 0, "error": 1}


def test_store_lookup_waits_are_summed_over_stores():
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from crescent.bench.store_metrics import LOOKUP_WAIT_METRIC, lookup_waits_of

    pages = []
    for waits in ([0.0, 0.0, 0.004], [0.0, 0.25]):
        registry = CollectorRegistry()
        histogram = Histogram(
            LOOKUP_WAIT_METRIC, "waits", buckets=(0.0, 0.001, 0.5), registry=registry
        )
        for wait in waits:
            histogram.observe(wait)
        pages.append(generate_latest(registry).decode())
    assert lookup_waits_of(pages) == {
        "lookups_allowed_to_wait": 5,
        "lookups_waited": 2,
        "lookup_wait_s": 0.254,
    }
