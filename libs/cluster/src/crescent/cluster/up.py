"""`crescent up`: a dev cluster on this machine until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

from crescent.cluster.autoscale import Autoscaler, WorkerBounds
from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.errors import FatalError
from crescent.common.local_prefill import parse_local_prefill


class StartInterrupted(Exception):
    """SIGTERM or SIGINT arrived while the cluster was starting."""


class StopSignals:
    """SIGTERM and SIGINT. While the cluster starts (a model can take minutes to load) the first
    one raises StartInterrupted in the main thread, which ends the start's waits at once and
    makes LocalCluster.start stop what it launched; once it serves, they set `stop`."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.is_starting = True

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        is_first = not self.stop.is_set()
        self.stop.set()
        if self.is_starting and is_first:
            raise StartInterrupted(signal.Signals(signum).name)


def local_prefill_setting(text: str) -> str:
    """--local-prefill as the conductor takes it, checked before anything starts."""
    try:
        parse_local_prefill(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--port", type=int, default=8000, help="port of the OpenAI API (default 8000)"
    )
    parser.add_argument(
        "--prefill", type=int, default=1, help="number of prefill instances (default 1)"
    )
    parser.add_argument(
        "--decode", type=int, default=1, help="number of decode instances (default 1)"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(".crescent"),
        help="where logs and etcd data go (default .crescent)",
    )
    parser.add_argument(
        "--engine",
        choices=("emulated", "vllm"),
        default="vllm",
        help="vllm (a real model, see --model; default) or emulated (a cost model, no weights)",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="vllm: a local Hugging Face Llama-family checkpoint (default: build the tiny "
        "test model into WORKDIR/models/tiny-llama)",
    )
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra flag for prefill and decode, e.g. --engine-arg=--emulated-time-scale=0.1",
    )
    parser.add_argument(
        "--local-prefill",
        default="auto",
        type=local_prefill_setting,
        metavar="off|auto|N",
        help="conditional disaggregation (the conductor's --local-prefill; default auto: the "
        "decode instance computes a prompt when its cost model prices the uncached part within "
        "the TBT SLO and no slower than the prefill instance would)",
    )
    parser.add_argument(
        "--conductor-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra flag for the conductor, e.g. --conductor-arg=--ttft-slo-s=5",
    )
    scaling = parser.add_argument_group(
        "autoscaling (the conductor's P/D ratio controller, paper §5.1)"
    )
    scaling.add_argument(
        "--autoscale",
        action="store_true",
        help="start and drain prefill and decode instances as the conductor's P/D ratio "
        "controller asks (--prefill/--decode are then the starting counts)",
    )
    scaling.add_argument(
        "--min-prefill", type=int, default=1, help="fewest prefill instances (default 1)"
    )
    scaling.add_argument(
        "--max-prefill", type=int, default=4, help="most prefill instances (default 4)"
    )
    scaling.add_argument(
        "--min-decode", type=int, default=1, help="fewest decode instances (default 1)"
    )
    scaling.add_argument(
        "--max-decode", type=int, default=4, help="most decode instances (default 4)"
    )
    scaling.add_argument(
        "--max-workers",
        type=int,
        default=0,
        help="most prefill + decode instances together; at it the ratio shifts instead "
        "(default 0: the two maximums' sum)",
    )
    scaling.add_argument(
        "--ratio-window-s",
        type=float,
        default=10.0,
        help="seconds of load samples and SLO outcomes per controller decision (default 10)",
    )


def autoscale_flags(args: argparse.Namespace) -> list[str]:
    """The conductor flags that give its controller `crescent up`'s bounds; bad bounds are an
    error before anything starts."""
    if not 1 <= args.min_prefill <= args.max_prefill or not 1 <= args.min_decode <= args.max_decode:
        raise ValueError(
            "need 1 <= --min-prefill <= --max-prefill and 1 <= --min-decode <= --max-decode"
        )
    if (
        not args.min_prefill <= args.prefill <= args.max_prefill
        or not args.min_decode <= args.decode <= args.max_decode
    ):
        raise ValueError("--prefill and --decode must lie within their --min/--max bounds")
    if args.max_workers and args.max_workers < args.prefill + args.decode:
        raise ValueError("--max-workers is below --prefill + --decode")
    if not args.ratio_window_s > 0:
        raise ValueError("--ratio-window-s must be > 0")
    return [
        "--autoscale-min-prefill",
        str(args.min_prefill),
        "--autoscale-max-prefill",
        str(args.max_prefill),
        "--autoscale-min-decode",
        str(args.min_decode),
        "--autoscale-max-decode",
        str(args.max_decode),
        "--autoscale-max-total",
        str(args.max_workers),
        "--ratio-window-s",
        str(args.ratio_window_s),
    ]


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s crescent-up %(message)s", datefmt="%H:%M:%S"
    )
    try:
        conductor_args = [
            "--local-prefill",
            args.local_prefill,
            *(autoscale_flags(args) if args.autoscale else []),
            *args.conductor_arg,
        ]
    except ValueError as exc:
        print(f"crescent up: error: {exc}")
        return 2
    workdir = args.workdir.resolve()
    model_dir = args.model
    if args.engine == "vllm" and model_dir is None:
        from crescent.engine.tiny_model import build_tiny_model

        model_dir = workdir / "models" / "tiny-llama"
        if not (model_dir / "config.json").exists():
            print(f"building the tiny test model into {model_dir}", flush=True)
            build_tiny_model(model_dir)
    spec = ClusterSpec(
        workdir=workdir,
        api_port=args.port,
        num_prefill=args.prefill,
        num_decode=args.decode,
        engine_args=args.engine_arg,
        conductor_args=conductor_args,
        engine=args.engine,
        model_dir=model_dir,
        env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        if args.engine == "vllm"
        else {},
    )
    signals = StopSignals()
    signals.install()
    cluster = LocalCluster(spec)
    try:
        cluster.start(timeout_s=300 if args.engine == "vllm" else 60)
        signals.is_starting = False
    except StartInterrupted as exc:
        cluster.stop()  # start stopped what it launched, unless the signal came as it returned
        print(f"crescent up: {exc} while starting; stopped", flush=True)
        return 0
    except FatalError as exc:
        print(f"crescent up: error: {exc}")
        return 1
    model = "crescent-emulated" if args.engine == "emulated" else model_dir.name
    autoscaler = None
    if args.autoscale:
        autoscaler = Autoscaler(
            cluster,
            model,
            WorkerBounds(args.min_prefill, args.max_prefill, args.min_decode, args.max_decode),
        )
    print(
        f"""
Crescent dev cluster is serving at {cluster.api_url}  (logs: {cluster.log_dir})
  NATS {cluster.nats_url}   etcd {cluster.etcd_url}

Try:
  curl {cluster.api_url}/v1/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "prompt": "Hello, Crescent", "max_tokens": 16}}'

Ctrl-C stops the cluster.
""",
        flush=True,
    )
    if autoscaler is not None:
        print(
            f"Autoscaling: prefill {args.min_prefill}..{args.max_prefill}, "
            f"decode {args.min_decode}..{args.max_decode}, "
            f"a decision every {args.ratio_window_s:g}s",
            flush=True,
        )
    try:
        while not signals.stop.wait(0.5):
            cluster.supervise()
            if autoscaler is not None:
                autoscaler.poll()
    finally:
        print("stopping the cluster", flush=True)
        cluster.stop()
    return 0
