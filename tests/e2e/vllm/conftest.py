"""Fixtures of the `vllm` e2e tests (helpers in vllm_helpers.py). Each test module skips
itself, with the reason, where vLLM is not installed (`make install-vllm`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from vllm_helpers import Conductor, VllmCluster, env_for_in_process_engines

from crescent.common.bus import Bus
from crescent.engine.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """One plain vLLM instance (no connector, no Crescent), in this process."""
    env_for_in_process_engines()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    llm = LLM(
        model=str(tiny_model_dir),
        dtype="float32",
        block_size=32,
        enforce_eager=True,
        compilation_config={"mode": 0},
        distributed_executor_backend="uni",
        seed=0,
    )
    yield llm
    llm.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="module")
def vllm_cluster(tmp_path_factory, tiny_model_dir):
    cluster = VllmCluster(tmp_path_factory.mktemp("vllm-cluster"), tiny_model_dir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def conductor(vllm_cluster):
    bus = await Bus.connect(vllm_cluster.nats_url, "test-conductor")
    yield Conductor(bus)
    await bus.drain()
