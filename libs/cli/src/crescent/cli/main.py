"""`crescent <command>`: one entry point that hands each subcommand to the package owning it."""

from __future__ import annotations

import argparse
import sys

from crescent.bench import cli as bench_cli
from crescent.bench.replay import cli as replay_cli
from crescent.bench.sim import cli as sim_cli
from crescent.cluster import up
from crescent.engine import model_cli
from crescent.engine.vllm import profile as profile_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crescent", description="Crescent: KVCache-centric LLM serving"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up_parser = commands.add_parser("up", help="run a dev cluster on this machine")
    up.add_arguments(up_parser)
    up_parser.set_defaults(run=up.run)
    bench_parser = commands.add_parser("bench", help="run a benchmark and write its JSON")
    bench_cli.add_arguments(bench_parser)
    bench_parser.set_defaults(run=bench_cli.run)
    sim_parser = commands.add_parser(
        "sim", help="simulate a cluster on a trace with the conductor's own policy"
    )
    sim_cli.add_arguments(sim_parser)
    sim_parser.set_defaults(run=sim_cli.run)
    replay_parser = commands.add_parser(
        "replay", help="replay a trace against an OpenAI-compatible endpoint"
    )
    replay_cli.add_arguments(replay_parser)
    replay_parser.set_defaults(run=replay_cli.run)
    model_parser = commands.add_parser("model", help="build or check a model checkpoint")
    model_cli.add_arguments(model_parser)
    model_parser.set_defaults(run=model_cli.run)
    profile_parser = commands.add_parser(
        "profile", help="profile the vllm engine and write its fitted time models"
    )
    profile_cli.add_arguments(profile_parser)
    profile_parser.set_defaults(run=profile_cli.run)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sys.exit(args.run(args))


if __name__ == "__main__":
    main()
