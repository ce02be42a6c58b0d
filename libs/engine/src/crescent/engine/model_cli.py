"""`crescent model …`: build the tiny test model, and check a checkpoint before serving it
(Llama family? tokenizer matches? how many bytes is one store block?).

    crescent model tiny DIR                    writes the deterministic tiny Llama to DIR
    crescent model check DIR [--block-size N]  prints what the engine and the store need, as JSON
"""

from __future__ import annotations

import argparse
import json
import sys

from crescent.common.checkpoint import CheckpointError, inspect_checkpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="model_command", required=True)
    tiny = commands.add_parser(
        "tiny", help="write a tiny random Llama (fixed seed) and its tokenizer to DIR"
    )
    tiny.add_argument("directory", metavar="DIR")
    check = commands.add_parser(
        "check", help="inspect a checkpoint; print its KV geometry and store block bytes"
    )
    check.add_argument("directory", metavar="DIR")
    check.add_argument(
        "--block-size", type=int, default=512, help="store block size in tokens (default 512)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        if args.model_command == "tiny":
            from crescent.engine.tiny_model import build_tiny_model

            path = build_tiny_model(args.directory)
            checkpoint = inspect_checkpoint(path)
            print(
                json.dumps({"model": str(path), "kv_bytes_per_token": checkpoint.kv.block_bytes(1)})
            )
            return 0
        checkpoint = inspect_checkpoint(args.directory)
    except CheckpointError as exc:
        print(f"crescent model: error: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(
            f"crescent model: error: {exc.name} is not installed (make install-vllm)",
            file=sys.stderr,
        )
        return 1
    kv = checkpoint.kv
    print(
        json.dumps(
            {
                "model": str(checkpoint.path),
                "model_type": checkpoint.model_type,
                "dtype": checkpoint.dtype,
                "max_position_embeddings": checkpoint.max_position_embeddings,
                "num_layers": kv.num_layers,
                "num_kv_heads": kv.num_kv_heads,
                "head_dim": kv.head_dim,
                "block_size": args.block_size,
                "store_block_bytes": kv.block_bytes(args.block_size),
            }
        )
    )
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="crescent model", description=__doc__.splitlines()[0])
    add_arguments(parser)
    sys.exit(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
