"""`crescent bench predict` wiring, and the prediction-error figures read from a histogram."""

import argparse
import importlib
import json

import pytest

from crescent.bench import cli
from crescent.bench.replay.prediction_errors import bucket_quantile, prediction_error_report


def test_quantiles_interpolate_inside_buckets():
    cumulative = [(0.1, 50.0), (0.2, 90.0), (0.4, 100.0), (float("inf"), 100.0)]
    assert bucket_quantile(cumulative, 0.5) == pytest.approx(0.1)
    assert bucket_quantile(cumulative, 0.7) == pytest.approx(0.15)
    assert bucket_quantile(cumulative, 0.95) == pytest.approx(0.3)
    assert bucket_quantile([(0.1, 0.0), (float("inf"), 0.0)], 0.5) is None


def test_report_covers_only_the_requests_between_the_scrapes():
    before = {("ttft", "corrected"): {0.1: 10.0, 0.2: 10.0, float("inf"): 10.0}}
    after = {("ttft", "corrected"): {0.1: 10.0, 0.2: 20.0, float("inf"): 20.0}}
    row = prediction_error_report(before, after)["ttft"]["corrected"]
    assert row["count"] == 10 and 0.1 < row["median_abs_err"] < row["p90_abs_err"] <= 0.2
    assert prediction_error_report(None, None) is None


def test_predict_bench_is_registered_and_writes_its_cases(tmp_path, monkeypatch):
    from crescent.bench import predict_bench

    calls = []

    def fake_run(trace, limit, speed, max_input_tokens, max_output_tokens, warmup, workdir=None):
        calls.append((trace, limit, speed, max_input_tokens, max_output_tokens, warmup, workdir))
        return {
            "bench": "predict",
            "cases": [
                {"case": name, "median_abs_err": 0.1, "p90_abs_err": 0.3}
                for name, _, _ in predict_bench.CASES
            ],
        }

    monkeypatch.setattr(predict_bench, "run_predict_bench", fake_run)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    out = tmp_path / "predict.json"
    args = parser.parse_args(["predict", "--trace", "t.jsonl", "--json", str(out), "--limit", "5"])
    assert cli.run(args) == 0
    assert calls[0][1:6] == (5, 0.25, 2048, 16, 16)
    cases = [case["case"] for case in json.loads(out.read_text())["cases"]]
    assert cases[:4] == ["ttft-before", "ttft-after", "tbt-before", "tbt-after"]
    assert cases[4:] == ["ttft-queue-after", "ttft-compute-after", "ttft-overhead-after"]


def test_predict_bench_replays_the_bundled_slice_when_no_trace_is_given(tmp_path, monkeypatch):
    from crescent.bench import predict_bench
    from crescent.bench.trace import MOONCAKE_TRACE_SLICE

    traces = []

    def fake_run(trace, *args, **kwargs):
        traces.append(trace)
        return {"bench": "predict", "cases": []}

    monkeypatch.setattr(predict_bench, "run_predict_bench", fake_run)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(["predict", "--json", str(tmp_path / "p.json")])) == 0
    assert traces == [MOONCAKE_TRACE_SLICE] and MOONCAKE_TRACE_SLICE.is_file()


def test_predict_bench_without_its_default_trace_says_what_to_pass(tmp_path, monkeypatch, capsys):
    from crescent.bench import trace

    monkeypatch.setattr(trace, "MOONCAKE_TRACE_SLICE", tmp_path / "absent.jsonl")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(["predict", "--json", str(tmp_path / "p.json")])) == 2
    assert "pass --trace PATH" in capsys.readouterr().err


@pytest.mark.parametrize(
    "bench, module, function",
    [
        ("aiperf", "crescent.bench.aiperf_replay", "run_aiperf_bench"),
        ("replay-lag", "crescent.bench.replay.lag_bench", "run_replay_lag_bench"),
    ],
)
def test_trace_benches_replay_the_bundled_slice_when_no_trace_is_given(
    bench, module, function, tmp_path, monkeypatch
):
    from crescent.bench.trace import MOONCAKE_TRACE_SLICE

    traces = []

    def fake_run(trace, *args, **kwargs):
        traces.append(trace)
        return {"bench": bench, "cases": []}

    monkeypatch.setattr(importlib.import_module(module), function, fake_run)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args([bench, "--json", str(tmp_path / "out.json")])) == 0
    assert traces == [MOONCAKE_TRACE_SLICE]
