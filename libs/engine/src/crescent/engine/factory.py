"""Which engine a worker runs, from its settings (`--engine emulated|vllm`)."""

from __future__ import annotations

from crescent.engine.emulated import EmulatedDecodeEngine, EmulatedPrefillEngine
from crescent.engine.settings import EngineSettings


def build_engine(settings: EngineSettings, role: str):
    """An engine for a `role` ("prefill" or "decode") worker. The vllm engine is imported only
    when asked for, so emulated workers never need vLLM installed."""
    if settings.engine == "vllm":
        from crescent.engine.vllm.engine import StoreEndpoints, VllmEngine

        endpoints = None
        if settings.vllm_connector:
            endpoints = StoreEndpoints(
                nats_url=settings.nats_url,
                etcd_url=settings.etcd_url,
                cluster=settings.cluster,
                node=settings.node,
            )
        return VllmEngine(settings, role, endpoints)
    if role == "prefill":
        return EmulatedPrefillEngine(settings.cost_model())
    return EmulatedDecodeEngine(settings.cost_model())
