"""`crescent up`: a dev cluster on this machine until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.errors import FatalError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8000, help="port of the OpenAI API (default 8000)")
    parser.add_argument("--prefill", type=int, default=1, help="number of prefill instances (default 1)")
    parser.add_argument("--decode", type=int, default=1, help="number of decode instances (default 1)")
    parser.add_argument("--workdir", type=Path, default=Path(".crescent"),
                        help="where logs and etcd data go (default .crescent)")
    parser.add_argument("--engine", choices=("emulated", "vllm"), default="vllm",
                        help="vllm (a real model, see --model; default) or emulated (a cost model, no weights)")
    parser.add_argument("--model", type=Path, default=None,
                        help="vllm: a local Hugging Face Llama-family checkpoint (default: build the tiny "
                             "test model into WORKDIR/models/tiny-llama)")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="FLAG",
                        help="extra flag for prefill and decode, e.g. --engine-arg=--emulated-time-scale=0.1")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s crescent-up %(message)s", datefmt="%H:%M:%S")
    workdir = args.workdir.resolve()
    model_dir = args.model
    if args.engine == "vllm" and model_dir is None:
        from crescent.engine.tiny_model import build_tiny_model

        model_dir = workdir / "models" / "tiny-llama"
        if not (model_dir / "config.json").exists():
            print(f"building the tiny test model into {model_dir}", flush=True)
            build_tiny_model(model_dir)
    spec = ClusterSpec(workdir=workdir, api_port=args.port, num_prefill=args.prefill, num_decode=args.decode,
                       engine_args=args.engine_arg, engine=args.engine, model_dir=model_dir,
                       env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"} if args.engine == "vllm" else {})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster = LocalCluster(spec)
    try:
        cluster.start(timeout_s=300 if args.engine == "vllm" else 60)
    except FatalError as exc:
        print(f"crescent up: error: {exc}")
        return 1
    model = "crescent-emulated" if args.engine == "emulated" else model_dir.name
    print(f"""
Crescent dev cluster is serving at {cluster.api_url}  (logs: {cluster.log_dir})
  NATS {cluster.nats_url}   etcd {cluster.etcd_url}

Try:
  curl {cluster.api_url}/v1/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "prompt": "Hello, Crescent", "max_tokens": 16}}'

Ctrl-C stops the cluster.
""", flush=True)
    try:
        while not stop.wait(0.5):
            cluster.supervise()
    finally:
        print("stopping the cluster", flush=True)
        cluster.stop()
    return 0
