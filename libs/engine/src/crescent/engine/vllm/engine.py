"""The `vllm` engine: one AsyncLLM in the worker process (its EngineCore runs in a child
process), driven with token ids only. Prefill runs a request with max_tokens=1 and saves the
prompt's full blocks to the stores it is told; decode starts from prompt + first token, loads
every full block from its node's store through CrescentConnector and recomputes the tail.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from vllm.exceptions import VLLMValidationError

from crescent.common import tracing
from crescent.common.checkpoint import Checkpoint, inspect_checkpoint
from crescent.common.errors import ConfigError, RecoverableError
from crescent.common.messages import SamplingParams as CrescentSampling
from crescent.engine.base import FINISH_ABORT, DecodeStep, InvalidRequestError, PrefillOutput
from crescent.engine.settings import EngineSettings
from crescent.engine.vllm.connector import PARAM_LOAD, PARAM_PLANNED, PARAM_SAVE_TO, PARAM_TRACE
from crescent.engine.vllm.sampling import output_logprobs, prompt_logprobs, vllm_params

log = logging.getLogger(__name__)

# What vLLM raises for a request it refuses: its input checks (ValueError) and its checks of the
# sampling parameters and structured output (VLLMValidationError, which is not a ValueError).
# Either is the client's to fix, never a failed instance.
VLLM_REFUSALS = (ValueError, VLLMValidationError)


class EngineRequestError(RecoverableError):
    """vLLM refused or failed one request (too long, bad sampling); the engine is fine."""


@dataclass
class EngineStats:
    """The scheduler's view after its latest step (from vLLM's stat logger hook)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    updated_at: float = 0.0


def _stats_recorder(stats: EngineStats):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StatsRecorder(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            pass

        def record(
            self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0
        ) -> None:
            if scheduler_stats is not None:
                stats.num_running = scheduler_stats.num_running_reqs
                stats.num_waiting = (
                    scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                )
                stats.kv_usage = scheduler_stats.kv_cache_usage
                stats.updated_at = time.monotonic()

        def log_engine_initialized(self) -> None:
            pass

    return StatsRecorder


@dataclass(frozen=True)
class StoreEndpoints:
    """Where the connector finds the control plane (the worker's own settings)."""

    nats_url: str
    etcd_url: str
    cluster: str
    node: str


def connector_extra_config(settings: EngineSettings, role: str, endpoints: StoreEndpoints) -> dict:
    return {
        "nats_url": endpoints.nats_url,
        "etcd_url": endpoints.etcd_url,
        "cluster": endpoints.cluster,
        "node": endpoints.node,
        "model": settings.model_name,
        "block_size": settings.block_size,
        "role": role,
        "timeout_s": settings.kv_timeout_s,
        "engine_wait_s": settings.kv_engine_wait_s,
        "event_log": settings.kv_event_log,
        "fault": settings.kv_fault,
        "use_mapping": settings.kv_use_mapping,
        "transports": settings.kv_transports,
        "load_async": settings.kv_load_async and role == "decode",
        "instance_id": settings.instance_id,
        "log_level": settings.log_level,
        "log_format": settings.log_format,
    }


def engine_args(
    settings: EngineSettings, checkpoint: Checkpoint, role: str, endpoints: StoreEndpoints | None
):
    """AsyncEngineArgs for this worker; `endpoints` None runs plain vLLM (no connector)."""
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    kv_transfer = None
    if endpoints is not None:
        kv_transfer = KVTransferConfig(
            kv_connector="CrescentConnector",
            kv_connector_module_path="crescent.engine.vllm.connector",
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config=connector_extra_config(settings, role, endpoints),
        )
    eager = (
        {"enforce_eager": True, "compilation_config": {"mode": 0}}
        if settings.vllm_enforce_eager
        else {}
    )
    return AsyncEngineArgs(
        model=str(checkpoint.path),
        served_model_name=[settings.model_name],
        dtype=checkpoint.dtype,
        max_model_len=max_model_len(settings, checkpoint),
        block_size=settings.vllm_block_size,
        max_num_seqs=settings.vllm_max_num_seqs,
        max_num_batched_tokens=settings.vllm_max_num_batched_tokens,
        enable_prefix_caching=settings.vllm_prefix_caching,
        seed=settings.vllm_seed,
        distributed_executor_backend="uni",
        kv_transfer_config=kv_transfer,
        disable_log_stats=True,
        **eager,
    )


def max_model_len(settings: EngineSettings, checkpoint: Checkpoint) -> int:
    if checkpoint.max_position_embeddings:
        return min(settings.max_model_len, checkpoint.max_position_embeddings)
    return settings.max_model_len


def set_cpu_environment(settings: EngineSettings) -> None:
    """Environment the EngineCore child inherits (vLLM reads these at start)."""
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(settings.vllm_kv_cache_gib)
    os.environ.setdefault(
        "VLLM_CPU_OMP_THREADS_BIND", "nobind"
    )  # several engines share this host's cores
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # The model runs inside the EngineCore process (vLLM's uni executor). Otherwise vLLM's CPU
    # platform adds a worker process, and both busy-wait on each other (sched_yield) during
    # every step and for a second after it: with a prefill and a decode engine on one host's
    # cores, each engine's spinning takes compute from the other. (AsyncLLM keeps its
    # EngineCore process either way; this setting chooses only the executor on CPU.)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


class VllmEngine:
    """An AsyncLLM behind the interface the prefill and decode workers drive."""

    def __init__(
        self, settings: EngineSettings, role: str, endpoints: StoreEndpoints | None
    ) -> None:
        self.checkpoint = inspect_checkpoint(settings.model)
        try:
            import vllm  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                "--engine vllm needs vLLM in this environment (`make install-vllm`)"
            ) from exc
        self.settings = settings
        self.role = role
        self.endpoints = endpoints
        self.max_model_len = max_model_len(settings, self.checkpoint)
        self.stats = EngineStats()
        self.kv_capacity_tokens = 0
        self._llm = None

    @property
    def store_block_bytes(self) -> int:
        return self.checkpoint.kv.block_bytes(self.settings.block_size)

    async def start(self) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        set_cpu_environment(self.settings)
        args = engine_args(self.settings, self.checkpoint, self.role, self.endpoints)
        started = time.monotonic()
        recorder = _stats_recorder(self.stats)
        # The EngineCore child takes seconds to start and AsyncLLM waits for it synchronously:
        # build it off the event loop (it starts its output handler on the first request).
        self._llm = await asyncio.to_thread(
            AsyncLLM.from_engine_args, args, stat_loggers=[recorder]
        )
        cache = self._llm.vllm_config.cache_config
        self.kv_capacity_tokens = (cache.num_gpu_blocks or 0) * cache.block_size
        log.info(
            "vLLM engine started",
            extra={
                "role": self.role,
                "model": str(self.checkpoint.path),
                "seconds": round(time.monotonic() - started, 2),
                "kv_capacity_tokens": self.kv_capacity_tokens,
            },
        )

    async def close(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    def _params(self, sampling: CrescentSampling, max_tokens: int, kv: dict):
        extra = (
            {"kv_transfer_params": {**kv, PARAM_TRACE: tracing.inject_headers() or {}}}
            if kv and self.endpoints
            else None
        )
        try:
            return vllm_params(sampling, max_tokens, extra)
        except VLLM_REFUSALS as exc:
            raise InvalidRequestError(str(exc)) from exc

    def _check_length(self, num_tokens: int) -> None:
        if not 0 < num_tokens <= self.max_model_len:
            raise EngineRequestError(
                f"{num_tokens} tokens are outside 1..{self.max_model_len} (the model's context)"
            )

    async def prefill(
        self,
        token_ids: Sequence[int],
        request_id: str,
        sampling: CrescentSampling | None = None,
        save_to: Sequence[str] = (),
        planned_prefix_tokens: int | None = None,
    ) -> PrefillOutput:
        """Compute the prompt (loading what the store has), return its first token. With
        `planned_prefix_tokens` (the conductor's plan), the store is asked only when vLLM's own
        cache holds less of the prompt than that."""
        from vllm.inputs import TokensPrompt

        self._check_length(len(token_ids))
        sampling = sampling or CrescentSampling()
        # Prompt logprobs need every prompt token computed: nothing is loaded from the store.
        kv = {
            PARAM_SAVE_TO: list(save_to),
            **({PARAM_LOAD: False} if sampling.prompt_logprobs is not None else {}),
            **({PARAM_PLANNED: planned_prefix_tokens} if planned_prefix_tokens is not None else {}),
        }
        params = self._params(sampling, 1, kv)
        started = time.monotonic()
        first, num_cached, first_logprobs, prompt = None, 0, [], []
        try:
            async for output in self._llm.generate(
                TokensPrompt(prompt_token_ids=list(token_ids)), params, request_id
            ):
                completion = output.outputs[0] if output.outputs else None
                if completion is not None and completion.token_ids and first is None:
                    first = completion.token_ids[0]
                    first_logprobs = output_logprobs(
                        completion.token_ids[:1], completion.logprobs, sampling.logprobs
                    )
                prompt = prompt or prompt_logprobs(
                    token_ids, output.prompt_logprobs, sampling.prompt_logprobs
                )
                num_cached = output.num_cached_tokens or num_cached
        except VLLM_REFUSALS as exc:
            raise InvalidRequestError(str(exc)) from exc
        if first is None:
            raise EngineRequestError(f"prefill of {request_id} produced no token")
        return PrefillOutput(
            first_token=first,
            num_computed_tokens=len(token_ids) - num_cached,
            num_cached_tokens=num_cached,
            compute_s=time.monotonic() - started,
            first_logprobs=first_logprobs[0] if first_logprobs else None,
            prompt_logprobs=prompt,
        )

    async def generate(
        self,
        request_id: str,
        token_ids: Sequence[int],
        first_token: int | None,
        max_new_tokens: int,
        stop_token_ids: Sequence[int] = (),
        sampling: CrescentSampling | None = None,
        save_to: Sequence[str] = (),
    ) -> AsyncIterator[DecodeStep]:
        """Tokens after `first_token`; the prompt's full blocks come from this node's store.
        Without a first token the prompt's uncached part is computed here (conditional
        disaggregation), its new full blocks saved to the `save_to` nodes' stores, and the
        first token yielded is the prompt's first output token."""
        from vllm.inputs import TokensPrompt

        sampling = sampling or CrescentSampling(stop_token_ids=list(stop_token_ids))
        if max_new_tokens < 1:
            yield DecodeStep([], "length")
            return
        prompt = [*token_ids] if first_token is None else [*token_ids, first_token]
        self._check_length(len(prompt) + max_new_tokens - 1)
        params = self._params(
            sampling, max_new_tokens, {PARAM_LOAD: True, PARAM_SAVE_TO: list(save_to)}
        )
        finished, is_first = False, True
        try:
            async for output in self._llm.generate(
                TokensPrompt(prompt_token_ids=prompt), params, request_id
            ):
                completion = output.outputs[0]
                finished = output.finished
                new_tokens = list(completion.token_ids)
                yield DecodeStep(
                    new_tokens,
                    completion.finish_reason if finished else None,
                    num_cached_tokens=(output.num_cached_tokens or 0) if is_first else None,
                    logprobs=output_logprobs(new_tokens, completion.logprobs, sampling.logprobs),
                )
                is_first = False
        except VLLM_REFUSALS as exc:
            raise InvalidRequestError(str(exc)) from exc
        if not finished:
            yield DecodeStep([], FINISH_ABORT)

    def abort(self, request_id: str) -> None:
        if self._llm is not None:
            asyncio.get_running_loop().create_task(self._llm.abort(request_id))

    @property
    def num_running(self) -> int:
        return self.stats.num_running

    @property
    def num_context_tokens(self) -> int:
        """Tokens held in paged KV (the batch's context, plus prefix-cache residue)."""
        return int(self.stats.kv_usage * self.kv_capacity_tokens)
