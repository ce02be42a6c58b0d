"""The command line of the plain vLLM OpenAI server that benchmarks run as their baseline, so
every bench compares against the same server settings as the tiny model's Crescent workers."""

from __future__ import annotations

import sys
from pathlib import Path


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
