"""`crescent bench <name> --json FILE`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crescent.bench.slo import SloTargets


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from crescent.bench.aiperf_replay import CASES
    from crescent.cluster.infra import COMPACTION_RETENTION

    benches = parser.add_subparsers(dest="bench", required=True)
    control = benches.add_parser(
        "control-plane",
        help="requests/s and latency the control path adds (emulated, zero compute), and the "
        "conductor's parse of an 8,000-token-id body",
    )
    control.add_argument(
        "--requests", type=int, default=400, help="requests per case (default 400)"
    )
    control.add_argument(
        "--concurrency", type=int, default=16, help="requests in flight (default 16)"
    )
    control.add_argument("--max-tokens", type=int, default=8, help="tokens per request (default 8)")
    control.add_argument(
        "--cases",
        type=lambda text: text.split(","),
        help="cases to run besides http-direct, comma-separated "
        "(default all: floor-1P1D,1P1D,4P4D,1P1D-on-decode)",
    )
    control.add_argument(
        "--compare",
        type=Path,
        metavar="CHECKOUT",
        help="another checkout of this repository (a git worktree of an older commit): each "
        "cluster case also runs from its code, beside this one's, the one-at-a-time requests "
        "taking turns (figures under compare_*, and p50_over_compare)",
    )
    transfer = benches.add_parser(
        "transfer", help="shm and tcp GB/s against memcpy and loopback limits"
    )
    store = benches.add_parser(
        "store",
        help="store put/get GB/s against Mooncake Store, client and store in separate processes",
    )
    store.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="timed rounds per case; the median is reported (default 5)",
    )
    store.add_argument(
        "--batch-mib", type=int, default=16, help="MiB per put/get batch (default 16)"
    )
    store.add_argument("--skip-mooncake", action="store_true", help="measure Crescent only")
    prefix = benches.add_parser(
        "prefix-reuse", help="TTFT with 0 %% and 90 %% of the prompt cached: Crescent vs plain vLLM"
    )
    prefix.add_argument(
        "--repeat", type=int, default=3, help="prompts per case; the median is reported (default 3)"
    )
    prefix.add_argument(
        "--lengths",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=None,
        help="prompt lengths in tokens, comma-separated (default 1024,2048,4096,8000)",
    )
    decode_load = benches.add_parser(
        "decode-load",
        help="the gap a new request's KV load leaves in running streams: "
        "decode loading inside a step vs beside the steps",
    )
    decode_load.add_argument(
        "--length", type=int, default=8000, help="the arriving prompt's tokens (default 8000)"
    )
    decode_load.add_argument(
        "--turns", type=int, default=5, help="turns per system; medians reported (default 5)"
    )
    decode_load.add_argument(
        "--running", type=int, default=2, help="streams decoding when it arrives (default 2)"
    )
    decode_load.add_argument(
        "--kv-transports",
        default="",
        help="the workers' data-plane transports, e.g. tcp (default: every one that runs here)",
    )
    schedule = benches.add_parser(
        "schedule", help="scheduling decision time per request (kv-centric vs least-loaded)"
    )
    schedule.add_argument("--repeat", type=int, default=200, help="requests per case (default 200)")
    add_admission_arguments(schedule)
    chaos = benches.add_parser(
        "chaos",
        help="what clients see while processes of an emulated cluster are "
        "killed, restarted and paused, one fault at a time",
    )
    chaos.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    chaos.add_argument("--max-tokens", type=int, default=48, help="tokens per answer (default 48)")
    chaos.add_argument(
        "--local-prefill",
        default="off",
        metavar="off|auto|N",
        help="the conductors' conditional disaggregation (default off: every prompt goes to a "
        "prefill instance; auto: the decode instances compute this load's short prompts)",
    )
    chaos.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep the cluster's logs here (default: a temporary directory)",
    )
    aiperf = benches.add_parser(
        "aiperf",
        help="aiperf's Mooncake trace replay: Crescent vs plain vLLM, also under faults",
    )
    aiperf.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="Mooncake-format trace (JSONL; default: the repository's "
        "tests/data/mooncake_trace_slice.jsonl)",
    )
    aiperf.add_argument("--limit", type=int, default=200, help="requests replayed (default 200)")
    aiperf.add_argument(
        "--max-input-tokens", type=int, default=2048, help="prompts cut to this (default 2048)"
    )
    aiperf.add_argument(
        "--aiperf", default="aiperf", help="the aiperf command (default: aiperf on PATH)"
    )
    aiperf.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep aiperf's artifacts and the servers' logs here (default: a temporary directory)",
    )
    aiperf.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"comma-separated cases to run (default: all of {','.join(CASES)})",
    )
    aiperf.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every case this many times, the order reversed each round; figures are the "
        "rounds' medians and ratios are taken round by round (default 1)",
    )
    aiperf.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="arrivals at the trace's times × 1/speed (default 1; 4: four times its rate)",
    )
    aiperf.add_argument(
        "--slo",
        type=_slo,
        default=None,
        metavar="TTFT_MS,ITL_MS",
        help="count the requests that met both (good_requests, aiperf's goodput) and give "
        "Crescent's conductor the same SLOs (default: none)",
    )
    lag = benches.add_parser(
        "replay-lag", help="crescent replay's own scheduling lag at 50 requests/s"
    )
    lag.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="Mooncake-format trace, sped up to 50 req/s (default: the repository's "
        "tests/data/mooncake_trace_slice.jsonl)",
    )
    lag.add_argument("--limit", type=int, default=1000, help="requests to replay (default 1000)")
    lag.add_argument(
        "--max-output-tokens", type=int, default=64, help="tokens streamed per request (default 64)"
    )
    predict = benches.add_parser(
        "predict",
        help="TTFT and TBT prediction error before and after the online "
        "correction: trace replay on a 2P1D tiny-model vLLM cluster",
    )
    predict.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="Mooncake-format trace (JSONL; default: the repository's "
        "tests/data/mooncake_trace_slice.jsonl)",
    )
    predict.add_argument(
        "--limit", type=int, default=80, help="requests replayed and counted (default 80)"
    )
    predict.add_argument(
        "--warmup",
        type=int,
        default=16,
        help="the trace's first requests, replayed first and not counted (default 16)",
    )
    predict.add_argument(
        "--speed",
        type=float,
        default=0.25,
        help="arrivals at the trace's times × 1/speed (default 0.25: a quarter of its rate)",
    )
    predict.add_argument(
        "--max-input-tokens", type=int, default=2048, help="prompts cut to this (default 2048)"
    )
    predict.add_argument(
        "--max-output-tokens", type=int, default=16, help="answers cut to this (default 16)"
    )
    predict.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep the cluster's logs and measured profiles here (default: a temporary directory)",
    )
    soak = benches.add_parser(
        "soak",
        help="whether memory and etcd's history stay bounded under steady load (a 1P1D "
        "cluster, emulated or vLLM)",
    )
    soak.add_argument(
        "--engine",
        choices=("emulated", "vllm"),
        default="emulated",
        help="the cluster's engine (default emulated, at time scale 0; vllm runs --model)",
    )
    soak.add_argument("--minutes", type=float, default=10.0, help="load duration (default 10)")
    soak.add_argument("--concurrency", type=int, default=8, help="clients (default 8)")
    soak.add_argument(
        "--sample-s", type=float, default=30.0, help="seconds between samples (default 30)"
    )
    soak.add_argument(
        "--etcd-compaction-retention",
        default=COMPACTION_RETENTION,
        help=f"etcd's periodic compaction retention (default: crescent up's, "
        f"{COMPACTION_RETENTION}; 0: off)",
    )
    for sub in (prefix, decode_load, soak):
        sub.add_argument(
            "--model",
            type=Path,
            default=None,
            help="checkpoint directory (default: the tiny test model)",
        )
    for sub in (
        control,
        transfer,
        store,
        prefix,
        decode_load,
        schedule,
        chaos,
        aiperf,
        lag,
        predict,
        soak,
    ):
        sub.add_argument("--json", type=Path, required=True, help="where to write the results")


def add_admission_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--admission",
        choices=("early", "predictive"),
        default="early",
        help="the admission the decisions run (default early)",
    )
    parser.add_argument(
        "--inflight",
        type=_at_least_two,
        default=8,
        help="requests kept in flight, half prefilling and half decoding (default 8)",
    )


def _at_least_two(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2, got {value}")
    return value


def _slo(text: str) -> SloTargets:
    """TTFT_MS,ITL_MS as SloTargets, which checks both are positive."""
    from crescent.bench.slo import SloTargets

    try:
        ttft_ms, itl_ms = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected TTFT_MS,ITL_MS (e.g. 2000,100), got {text!r}"
        ) from None
    try:
        return SloTargets(ttft_ms / 1000, itl_ms / 1000)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _trace(args: argparse.Namespace) -> Path | None:
    """--trace, or the repository's slice where it was not given; None (after saying why) when
    neither is there."""
    from crescent.bench.trace import MOONCAKE_TRACE_SLICE

    if args.trace is not None or MOONCAKE_TRACE_SLICE.is_file():
        return args.trace or MOONCAKE_TRACE_SLICE
    print(
        f"crescent bench {args.bench}: error: no --trace given, and the default "
        f"{MOONCAKE_TRACE_SLICE} is not there (crescent-bench installed outside its "
        "repository): pass --trace PATH, a Mooncake-format JSONL trace such as the "
        "repository's tests/data/mooncake_trace_slice.jsonl",
        file=sys.stderr,
    )
    return None


def run(args: argparse.Namespace) -> int:
    if args.bench in ("aiperf", "replay-lag", "predict"):
        args.trace = _trace(args)
        if args.trace is None:
            return 2
    if args.bench == "control-plane":
        from crescent.bench.control_plane import run_control_plane_bench

        try:
            result = run_control_plane_bench(
                args.requests, args.concurrency, args.max_tokens, args.cases, args.compare
            )
        except ValueError as exc:  # an unknown case, or --compare is no checkout of this repository
            print(f"crescent bench control-plane: error: {exc}", file=sys.stderr)
            return 2
    elif args.bench == "store":
        from crescent.bench.store_bench import run_store_bench

        result = run_store_bench(
            repeat=args.repeat,
            batch_bytes=args.batch_mib << 20,
            include_mooncake=not args.skip_mooncake,
        )
    elif args.bench == "prefix-reuse":
        from crescent.bench.prefix_reuse import LENGTHS, run_prefix_reuse_bench

        result = run_prefix_reuse_bench(args.model, args.repeat, args.lengths or LENGTHS)
    elif args.bench == "decode-load":
        from crescent.bench.decode_load import run_decode_load_bench

        result = run_decode_load_bench(
            args.model, args.length, args.turns, args.running, args.kv_transports
        )
    elif args.bench == "replay-lag":
        from crescent.bench.replay.lag_bench import run_replay_lag_bench

        result = run_replay_lag_bench(args.trace, args.limit, args.max_output_tokens)
    elif args.bench == "schedule":
        from crescent.bench.schedule_bench import run_schedule_bench

        result = run_schedule_bench(
            repeat=args.repeat, admission=args.admission, num_inflight=args.inflight
        )
    elif args.bench == "aiperf":
        from crescent.bench.aiperf_replay import AiperfError, run_aiperf_bench

        try:
            result = run_aiperf_bench(
                args.trace,
                args.limit,
                args.max_input_tokens,
                args.aiperf,
                workdir=args.workdir,
                cases=tuple(args.cases.split(",")),
                rounds=args.rounds,
                speed=args.speed,
                slo=args.slo,
            )
        except AiperfError as exc:
            print(f"crescent bench aiperf: error: {exc}", file=sys.stderr)
            return 2
    elif args.bench == "predict":
        from crescent.bench.predict_bench import run_predict_bench
        from crescent.bench.trace import TraceError

        try:
            result = run_predict_bench(
                args.trace,
                args.limit,
                args.speed,
                args.max_input_tokens,
                args.max_output_tokens,
                args.warmup,
                workdir=args.workdir,
            )
        except (TraceError, ValueError) as exc:
            print(f"crescent bench predict: error: {exc}", file=sys.stderr)
            return 2
    elif args.bench == "chaos":
        from crescent.bench.chaos import run_chaos_bench

        result = run_chaos_bench(
            concurrency=args.concurrency,
            max_tokens=args.max_tokens,
            workdir=args.workdir,
            local_prefill=args.local_prefill,
        )
    elif args.bench == "soak":
        from crescent.bench.soak import run_soak_bench

        result = run_soak_bench(
            args.minutes,
            args.concurrency,
            args.sample_s,
            args.etcd_compaction_retention,
            engine=args.engine,
            model_dir=args.model,
        )
    else:
        from crescent.bench.transfer_bench import run_transfer_bench

        result = run_transfer_bench()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))
    return 0


def format_table(result: dict) -> str:
    """One row per case, a column per scalar figure; lists (such as the kinds of a case's
    errors) follow the table, a line per item. A bench's ratios, where it has them, follow as
    a table of their own."""
    lines = [f"{result['bench']}", *_rows(result["cases"])]
    if result.get("ratios"):
        lines += ["ratios", *_rows(result["ratios"])]
    return "\n".join(lines)


def _rows(rows: list[dict]) -> list[str]:
    metrics = list(
        dict.fromkeys(
            k for row in rows for k, v in row.items() if k != "case" and not isinstance(v, list)
        )
    )
    width = max([16] + [len(row["case"]) for row in rows])
    lines = ["  ".join(["case".ljust(width)] + [m.rjust(13) for m in metrics])]
    for row in rows:
        cells = [
            f"{row[m]:13.3f}" if isinstance(row.get(m), float) else str(row.get(m, "")).rjust(13)
            for m in metrics
        ]
        lines.append("  ".join([row["case"].ljust(width)] + cells))
    for row in rows:
        for key, value in row.items():
            if isinstance(value, list):
                lines.extend(f"{row['case']} {key}: {item}" for item in value)
    return lines
