"""`crescent sim --trace FILE [...]` and `crescent sim experiment NAME --trace FILE --out DIR`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from crescent.bench.sim.config import ADMISSIONS, CACHE_SCOPES, COUPLED, SimConfig, SimConfigError
from crescent.bench.trace import TraceError, load_trace
from crescent.conductor.policy import POLICIES

DEFAULTS = SimConfig()


def _cache_tokens(raw: str) -> int | None:
    if raw in ("inf", "unbounded"):
        return None
    try:
        value = int(float(raw))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a token count (or 'inf')") from exc
    if value < 0:
        raise argparse.ArgumentTypeError("cache tokens must be >= 0")
    return value


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags describing the simulated cluster (shared by a single run and the experiments)."""
    parser.add_argument(
        "--speed", type=float, default=DEFAULTS.speed, help="replay speed: arrival times × 1/speed"
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="simulate only the trace's first N requests"
    )
    parser.add_argument(
        "--output-limit", type=int, default=None, help="cap every request's output tokens at N"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="a `crescent profile` JSON: its fitted prefill and decode models replace the "
        "default LLaMA3-70B / 8×A800 cost model (paper Table 1)",
    )
    parser.add_argument(
        "--tflops", type=float, default=DEFAULTS.tflops, help="device TFLOP/s per instance"
    )
    parser.add_argument(
        "--memory-gbps",
        type=float,
        default=DEFAULTS.memory_gbps,
        help="device memory GB/s per instance (decode roofline)",
    )
    parser.add_argument(
        "--decode-kv-tokens",
        type=int,
        default=None,
        help="KV tokens one instance's HBM holds (default: 90 %% of 8×80 GB after the weights)",
    )
    parser.add_argument(
        "--nic-gbps", type=float, default=DEFAULTS.nic_gbps, help="Gb/s of one node's NICs"
    )
    parser.add_argument("--telemetry-period-s", type=float, default=DEFAULTS.telemetry_period_s)
    parser.add_argument(
        "--telemetry-delay-s",
        type=float,
        default=DEFAULTS.telemetry_delay_s,
        help="delay from a worker's load sample to the conductor using it",
    )
    parser.add_argument(
        "--hot-spot-period-s",
        type=float,
        default=DEFAULTS.hot_spot_period_s,
        help="interval of the conductor's hot-block replication pass (0: off)",
    )
    parser.add_argument(
        "--ssd-tokens-per-node", type=int, default=0, help="SSD tier under each node's DRAM cache"
    )
    parser.add_argument("--seed", type=int, default=0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", type=Path, help="Mooncake-format JSONL trace")
    parser.add_argument(
        "--prefill", type=int, default=DEFAULTS.num_prefill, help="prefill instances (one per node)"
    )
    parser.add_argument(
        "--decode", type=int, default=DEFAULTS.num_decode, help="decode instances (one per node)"
    )
    parser.add_argument("--policy", choices=list(POLICIES), default=DEFAULTS.policy)
    parser.add_argument(
        "--admission",
        choices=ADMISSIONS,
        default=DEFAULTS.admission,
        help="baseline: no conductor admission; instances reject on their own load, decode "
        "only once the prefill is done (paper §7.6)",
    )
    parser.add_argument(
        "--cache-tokens-per-node",
        type=_cache_tokens,
        default=DEFAULTS.cache_tokens_per_node,
        help="DRAM KV cache per node in tokens, or 'inf'",
    )
    parser.add_argument(
        "--cache-scope",
        choices=CACHE_SCOPES,
        default=DEFAULTS.cache_scope,
        help="local: an instance reuses only its own node's blocks; nothing moves between nodes",
    )
    parser.add_argument(
        "--coupled",
        choices=COUPLED,
        default=DEFAULTS.coupled,
        help="run prefill+decode-coupled vLLM-style instances on all prefill+decode nodes instead",
    )
    parser.add_argument(
        "--kvcache-balancing-threshold", type=float, default=DEFAULTS.kvcache_balancing_threshold
    )
    parser.add_argument("--ttft-slo-s", type=float, default=DEFAULTS.ttft_slo_s)
    parser.add_argument("--tbt-slo-s", type=float, default=DEFAULTS.tbt_slo_s)
    parser.add_argument(
        "--local-prefill",
        default=DEFAULTS.local_prefill,
        help="the conductor's conditional disaggregation: off, auto or a number of uncached "
        "tokens (decode instances compute such prompts in their own steps)",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write {'bench': 'sim', 'cases': [...]} here"
    )
    add_cluster_arguments(parser)
    commands = parser.add_subparsers(dest="sim_command")
    from crescent.bench.sim.experiments import EXPERIMENTS

    experiment = commands.add_parser(
        "experiment", help="reproduce one of the paper's figures or tables"
    )
    experiment.add_argument("name", choices=sorted(EXPERIMENTS))
    experiment.add_argument(
        "--trace",
        dest="experiment_trace",
        type=Path,
        required=True,
        metavar="FILE",
        help="Mooncake-format JSONL trace",
    )
    experiment.add_argument(
        "--out", type=Path, required=True, help="directory for NAME.json and NAME.png"
    )
    add_cluster_arguments(experiment)


def config_from(args: argparse.Namespace, **overrides) -> SimConfig:
    names = (
        "speed",
        "output_limit",
        "profile",
        "tflops",
        "memory_gbps",
        "decode_kv_tokens",
        "nic_gbps",
        "telemetry_period_s",
        "telemetry_delay_s",
        "hot_spot_period_s",
        "ssd_tokens_per_node",
        "seed",
    )
    fields = {name: getattr(args, name) for name in names}
    fields.update(overrides)
    return SimConfig(**fields)


def run(args: argparse.Namespace) -> int:
    from crescent.bench.cli import format_table
    from crescent.bench.sim.run import simulate

    try:
        if args.sim_command == "experiment":
            from crescent.bench.sim.experiments import run_experiment

            trace = load_trace(args.experiment_trace, args.limit)
            result = run_experiment(args.name, trace, args.experiment_trace.name, args, args.out)
        else:
            if args.trace is None:
                print("crescent sim: --trace FILE is required", file=sys.stderr)
                return 2
            trace = load_trace(args.trace, args.limit)
            config = config_from(
                args,
                num_prefill=args.prefill,
                num_decode=args.decode,
                policy=args.policy,
                admission=args.admission,
                cache_tokens_per_node=args.cache_tokens_per_node,
                cache_scope=args.cache_scope,
                coupled=args.coupled,
                kvcache_balancing_threshold=args.kvcache_balancing_threshold,
                ttft_slo_s=args.ttft_slo_s,
                tbt_slo_s=args.tbt_slo_s,
                local_prefill=args.local_prefill,
            )
            name = (
                config.coupled
                if config.coupled != "none"
                else f"{config.policy}/{config.admission}"
            )
            result = {"bench": "sim", "cases": [simulate(config, trace, name)]}
    except (TraceError, SimConfigError) as exc:
        print(f"crescent sim: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "json", None):
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(
        format_table(
            {
                "bench": result["bench"],
                "cases": [
                    {k: v for k, v in case.items() if not isinstance(v, (dict, list))}
                    for case in result["cases"]
                ],
            }
        )
    )
    return 0
