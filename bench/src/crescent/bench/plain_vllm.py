"""What the benchmarks on a real model share: the checkpoint they run (the tiny Llama unless one
is given), and the command line of the plain vLLM OpenAI server they run as their baseline, so
every bench compares against the same server settings as the tiny model's Crescent workers."""

from __future__ import annotations

import sys
from pathlib import Path


def bench_model(model_dir: Path | None, workdir: Path) -> Path:
    """`model_dir`, or the tiny Llama built under `workdir`."""
    if model_dir is not None:
        return model_dir
    from crescent.engine.tiny_model import build_tiny_model

    return build_tiny_model(workdir / "tiny-llama")


def vllm_server_argv(model_dir: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        model_dir.name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--block-size",
        "32",
        "--enforce-eager",
        "--max-model-len",
        "8192",
        *extra,
    ]
