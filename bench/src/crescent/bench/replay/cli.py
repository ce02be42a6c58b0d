"""`crescent replay TRACE --url URL [...]`: replay a Mooncake-format trace against any
OpenAI-compatible endpoint and report what the paper measures (§7.1)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from crescent.bench.replay.records import OK, RequestRecord, summarize
from crescent.bench.slo import SloTargets
from crescent.bench.trace import TRACE_BLOCK_TOKENS, TraceError, load_trace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", type=Path, help="Mooncake-format JSONL trace")
    parser.add_argument(
        "--url", required=True, help="the endpoint's base URL, e.g. http://127.0.0.1:8000"
    )
    parser.add_argument(
        "--model", default=None, help="model name to request (default: the first /v1/models lists)"
    )
    parser.add_argument(
        "--speed", type=float, default=1.0, help="send at the trace's arrival times × 1/speed"
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="replay only the trace's first N requests"
    )
    parser.add_argument(
        "--max-input-tokens", type=int, default=None, help="cut every prompt to at most T tokens"
    )
    parser.add_argument(
        "--max-output-tokens", type=int, default=None, help="ask for at most T output tokens"
    )
    parser.add_argument(
        "--block-tokens",
        type=int,
        default=TRACE_BLOCK_TOKENS,
        help="tokens per trace block (hash id); a multiple of the server's cache block size "
        "(default 512, the trace's own)",
    )
    parser.add_argument(
        "--vocab-size", type=int, default=32000, help="token ids are drawn below this"
    )
    parser.add_argument("--ttft-slo-s", type=float, default=30.0)
    parser.add_argument("--tbt-slo-s", type=float, default=0.1)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="deadline of one request")
    parser.add_argument(
        "--json", type=Path, default=None, help="write the report and every request's record here"
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="write ttft_cdf.png and tbt_cdf.png into this directory",
    )


class ProgressBar:
    """One line on stderr, redrawn in place on a terminal, every 10 s otherwise."""

    def __init__(self, total: int, stream=sys.stderr) -> None:
        self.total = total
        self.stream = stream
        self.is_tty = stream.isatty()
        self._count = 0

    def __call__(self, records: Sequence[RequestRecord], num_sent: int) -> None:
        self._count += 1
        done = sum(1 for r in records if r.status != "pending")
        ok = sum(1 for r in records if r.status == OK)
        filled = int(30 * done / self.total) if self.total else 30
        line = (
            f"replay [{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total} done, "
            f"{num_sent} sent, "
            f"{ok} ok, {done - ok} failed"
        )
        if self.is_tty:
            self.stream.write("\r" + line + ("\n" if done == self.total else ""))
            self.stream.flush()
        elif self._count % 20 == 1 or done == self.total:
            self.stream.write(line + "\n")


def run(args: argparse.Namespace) -> int:
    # Imported here: aiohttp and numpy are not needed by the other `crescent` commands.
    from crescent.bench.replay.client import ReplayError, ReplayOptions, replay
    from crescent.bench.replay.prediction_errors import prediction_error_report, scrape_once
    from crescent.bench.replay.prompts import PromptShape

    try:
        trace = load_trace(args.trace, args.limit)
        slo = SloTargets(args.ttft_slo_s, args.tbt_slo_s)
        shape = PromptShape(
            args.block_tokens, args.max_input_tokens, args.max_output_tokens, args.vocab_size
        )
        options = ReplayOptions(args.url, args.model, args.speed, shape, args.timeout_s)
    except (TraceError, ReplayError, ValueError) as exc:
        print(f"crescent replay: {exc}", file=sys.stderr)
        return 2
    errors_before = asyncio.run(scrape_once(options.base_url))
    records, wall_s, hit_rate = asyncio.run(replay(trace, options, ProgressBar(len(trace))))
    report = summarize(records, slo, wall_s, hit_rate)
    # A Crescent conductor's own TTFT/TBT prediction errors over these requests (None elsewhere).
    report["prediction_error"] = prediction_error_report(
        errors_before, asyncio.run(scrape_once(options.base_url))
    )
    result = {
        "bench": "replay",
        "url": args.url,
        "trace": str(args.trace),
        "speed": args.speed,
        "ttft_slo_s": slo.ttft_s,
        "tbt_slo_s": slo.tbt_s,
        "cases": [report],
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({**result, "records": [r.as_dict() for r in records]}, indent=1) + "\n"
        )
    if args.plot:
        from crescent.bench.replay.plot import plot_cdfs

        plot_cdfs(records, args.plot, slo.ttft_s, slo.tbt_s)
    print(format_report(report))
    return 0


def _quantiles(report: dict, metric: str, digits: int) -> str:
    return "  ".join(
        f"{name} {report[f'{name}_{metric}']:.{digits}f}" for name in ("mean", "p50", "p90", "p99")
    )


def format_report(report: dict) -> str:
    from crescent.bench.replay.prediction_errors import format_prediction_errors

    hit = "n/a" if report["cache_hit_rate"] is None else f"{report['cache_hit_rate']:.3f}"
    lines = [
        f"requests {report['requests']}: {report['completed']} ok, {report['failed']} failed "
        f"{report['failures_by_status'] or ''}".rstrip(),
        (
            f"effective request capacity {report['effective_capacity']:.3f}, "
            f"goodput {report['goodput_rps']:.2f} req/s"
        ),
        "TTFT s  " + _quantiles(report, "ttft_s", 3),
        "TBT s   " + _quantiles(report, "tbt_s", 4),
        (
            f"cache hit rate {hit}; scheduling lag p50 {report['p50_lag_ms']:.2f} ms, "
            f"p99 {report['p99_lag_ms']:.2f} ms; wall {report['wall_s']:.1f} s"
        ),
        *format_prediction_errors(report.get("prediction_error")),
    ]
    return "\n".join(lines)
