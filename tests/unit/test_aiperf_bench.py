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


def test_predictions_within_half_are_counted_as_admission_used_them():
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from crescent.bench.conductor_metrics import PREDICTION_ERROR_METRIC, predictions_of
    from crescent.conductor.metrics import PREDICTION_ERROR_BUCKETS

    registry = CollectorRegistry()
    errors = Histogram(
        PREDICTION_ERROR_METRIC,
        "errors",
        ["kind", "prediction"],
        buckets=PREDICTION_ERROR_BUCKETS,
        registry=registry,
    )
    for error in (0.1, 0.5, 0.7, 3.0):
        errors.labels("tbt", "corrected").observe(error)
    errors.labels("tbt", "published").observe(0.1)  # not what admission used
    errors.labels("ttft", "corrected").observe(0.2)
    errors.labels("ttft_queue", "corrected").observe(0.2)  # one term of the TTFT
    assert predictions_of(generate_latest(registry).decode()) == {
        "ttft_predictions": 1,
        "ttft_predictions_within_half": 1,
        "tbt_predictions": 4,
        "tbt_predictions_within_half": 2,
    }


def test_rounds_reverse_the_order_of_the_cases_each_time():
    from crescent.bench.aiperf_replay import round_orders

    assert round_orders(("a", "b", "c"), 3) == [("a", "b", "c"), ("c", "b", "a"), ("a", "b", "c")]


def _row(ttft: float, itl: float, errors: int = 0, **extra) -> dict:
    return {
        "requests": 200,
        "errors": errors,
        "ttft_ms_p50": ttft,
        "ttft_ms_p99": 3 * ttft,
        "itl_ms_p50": itl,
        "store_lookup_wait_s": 0.1,
        **extra,
    }


def test_a_case_over_rounds_takes_the_median_percentile_and_sums_its_counts():
    from crescent.bench.aiperf_replay import combine_rounds

    rows = [
        _row(300.0, 4.0),
        _row(500.0, 9.0, errors=2, error_kinds=["2 x error: cut"]),
        _row(400.0, 5.0, faults=["kill decode-1 at 28 s"]),
    ]
    combined = combine_rounds(rows)
    assert combined["rounds"] == 3
    assert combined["ttft_ms_p50"] == 400.0 and combined["ttft_ms_p99"] == 1200.0
    assert combined["itl_ms_p50"] == 5.0
    assert combined["requests"] == 600 and combined["errors"] == 2
    assert combined["store_lookup_wait_s"] == 0.3
    assert combined["error_kinds"] == ["round 1: 2 x error: cut"]
    assert combined["faults"] == ["round 2: kill decode-1 at 28 s"]
    assert combine_rounds(rows[:1]) == rows[0]  # one round: its row as it is


def test_ratios_are_taken_round_by_round_against_each_plain_vllm_case_alike():
    from crescent.bench.aiperf_replay import ratios

    rows = {
        "crescent-1p1d-auto": [_row(300.0, 4.0), _row(500.0, 5.0), _row(280.0, 4.5)],
        "vllm": [_row(200.0, 8.0), _row(600.0, 10.0), _row(400.0, 9.0)],
        "crescent-2p2d-faults": [_row(900.0, 6.0)] * 3,
        "crescent-2p2d-infra-pauses": [_row(900.0, 6.0)] * 3,
        "vllm-2x-rr-faults": [_row(1800.0, 12.0)] * 3,
    }
    by_case = {ratio["case"]: ratio for ratio in ratios(rows)}
    assert set(by_case) == {
        "crescent-1p1d-auto/vllm",
        "crescent-2p2d-faults/vllm-2x-rr-faults",
        "crescent-2p2d-infra-pauses/vllm-2x-rr-faults",
    }
    auto = by_case["crescent-1p1d-auto/vllm"]
    # per round 1.5, 0.833, 0.7: the median of the ratios, not the ratio of the medians
    assert auto["ttft_ms_p50_ratios"] == [1.5, 0.833, 0.7]
    assert auto["ttft_ms_p50"] == 0.833
    assert auto["ttft_ms_p50_of_medians"] == 0.75  # 300 ÷ 400
    assert auto["itl_ms_p50"] == 0.5
    assert by_case["crescent-2p2d-faults/vllm-2x-rr-faults"]["ttft_ms_p50"] == 0.5


def test_a_bench_with_ratios_prints_them_after_its_cases():
    table = format_table(
        {
            "bench": "aiperf",
            "cases": [{"case": "vllm", "ttft_ms_p50": 200.0}],
            "ratios": [{"case": "crescent-1p1d-auto/vllm", "ttft_ms_p50": 0.833}],
        }
    ).splitlines()
    assert table[3] == "ratios"
    assert table[5].split() == ["crescent-1p1d-auto/vllm", "0.833"]


def test_fewer_than_one_round_is_refused(tmp_path):
    import pytest

    from crescent.bench.aiperf_replay import AiperfError, run_aiperf_bench

    with pytest.raises(AiperfError, match="rounds must be at least 1, got 0"):
        run_aiperf_bench(tmp_path / "t.jsonl", cases=("vllm",), workdir=tmp_path, rounds=0)


def test_a_faster_replay_divides_the_arrival_times(tmp_path):
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": t, "input_length": 10, "output_length": 1, "hash_ids": [1]}
        for t in (0, 5, 1001)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cut.jsonl"
    cut_trace(trace, out, limit=3, max_input_tokens=2048, speed=4.0)
    assert [json.loads(line)["timestamp"] for line in out.read_text().splitlines()] == [0, 1, 250]


def _export(**extra) -> dict:
    """A profile_export_aiperf.json of 200 requests, every latency alike."""
    stats = {"p50": 1.0, "p90": 2.0, "p99": 3.0}
    return {
        "request_count": {"avg": 200.0},
        "time_to_first_token": stats,
        "inter_token_latency": stats,
        "request_latency": stats,
        **extra,
    }


def test_with_slos_aiperf_is_asked_for_goodput_and_the_row_counts_the_good_requests():
    from crescent.bench.aiperf_replay import aiperf_goodput, conductor_slo_args
    from crescent.bench.slo import SloTargets

    slo = SloTargets(2.0, 0.1)
    assert aiperf_goodput(slo) == "time_to_first_token:2000 inter_token_latency:100"
    assert conductor_slo_args(slo) == ("--ttft-slo-s", "2", "--tbt-slo-s", "0.1")
    export = _export(good_request_count={"avg": 150.0})
    assert summarize(export, slo)["good_requests"] == 150
    assert "good_requests" not in summarize(export)


def test_slos_without_aiperf_counting_good_requests_is_an_error():
    import pytest

    from crescent.bench.aiperf_replay import AiperfError
    from crescent.bench.slo import SloTargets

    with pytest.raises(AiperfError, match="good_request_count"):
        summarize(_export(), SloTargets(2.0, 0.1))


def test_good_requests_are_a_ratio_like_the_latencies():
    from crescent.bench.aiperf_replay import ratios

    rows = {
        "crescent-1p1d-auto": [
            _row(300.0, 4.0, good_requests=180),
            _row(300.0, 4.0, good_requests=150),
        ],
        "vllm": [_row(200.0, 8.0, good_requests=120), _row(200.0, 8.0, good_requests=100)],
    }
    (ratio,) = ratios(rows)
    assert ratio["good_requests_ratios"] == [1.5, 1.5]
    assert ratio["good_requests"] == 1.5


def test_bad_speed_or_slos_are_refused_with_a_message(tmp_path, capsys):
    import pytest

    from crescent.bench.aiperf_replay import AiperfError, run_aiperf_bench
    from crescent.cli.main import main

    with pytest.raises(AiperfError, match="speed must be positive, got 0"):
        run_aiperf_bench(tmp_path / "t.jsonl", cases=("vllm",), workdir=tmp_path, speed=0)
    for bad in ("2000", "2000,x", "0,100"):
        with pytest.raises(SystemExit) as stop:
            main(["bench", "aiperf", "--slo", bad, "--json", str(tmp_path / "out.json")])
        assert stop.value.code == 2
        assert "--slo" in capsys.readouterr().err
