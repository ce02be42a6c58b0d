"""Settings of an engine-hosting worker (prefill or decode)."""

from __future__ import annotations

from dataclasses import dataclass

from crescent.common.config import CommonSettings, setting
from crescent.common.errors import ConfigError
from crescent.engine.device_settings import EmulatedDevice
from crescent.storeclient.transport_choice import transport_choice
from crescent.transfer import TransportKind, parse_transports

ENGINES = ("emulated", "vllm")
KV_FAULTS = ("delay_commits", "evict_after_lookup", "slow_load")


@dataclass
class EngineSettings(EmulatedDevice, CommonSettings):
    """Settings of a worker that hosts an engine: which engine, which model, emulated device."""

    engine: str = setting(
        "emulated", "engine backend: emulated (cost model, no weights) or vllm (a real model)"
    )
    model: str = setting(
        "crescent-emulated",
        "emulated: the model name served; vllm: a local Hugging Face "
        "checkpoint directory (Llama family)",
    )
    served_model_name: str = setting(
        "",
        "the API's `model` name (empty: --model for emulated, the "
        "checkpoint directory's name for vllm)",
    )
    max_model_len: int = setting(
        32768, "longest prompt + output in tokens (vllm: at most the model's context)"
    )
    block_size: int = setting(
        512,
        "tokens per KV block in the store (cluster config: the conductor's "
        "--block-size; a multiple of --vllm-block-size)",
    )
    vllm_block_size: int = setting(
        32, "vllm: tokens per paged KV block inside vLLM (CPU build: a multiple of 32)"
    )
    vllm_kv_cache_gib: int = setting(
        1, "vllm: GiB of paged KV cache (CPU build: VLLM_CPU_KVCACHE_SPACE)"
    )
    vllm_max_num_seqs: int = setting(64, "vllm: most requests in one running batch")
    vllm_max_num_batched_tokens: int = setting(
        2048, "vllm: most tokens in one step (chunked prefill above)"
    )
    prefill_batch_tokens: int = setting(
        0,
        "vllm prefill: let queued jobs share the engine while the tokens it still has to compute "
        "are under this many "
        "(0: one job at a time, which the conductor's queue-time prediction assumes)",
    )
    vllm_prefix_caching: bool = setting(
        True, "vllm: keep vLLM's own prefix cache in front of the store"
    )
    vllm_connector: bool = setting(
        True,
        "vllm: load prefixes from and save new KV to the store "
        "(CrescentConnector); off: every prompt is recomputed",
    )
    vllm_enforce_eager: bool = setting(
        True, "vllm: no torch.compile / CUDA graphs (fast start; on GPUs turn off for speed)"
    )
    vllm_seed: int = setting(0, "vllm: sampling seed")
    kv_timeout_s: float = setting(
        10.0,
        "vllm: deadline of one store operation of the connector; a load that "
        "misses it is recomputed",
    )
    kv_engine_wait_s: float = setting(
        2.0,
        "vllm: the longest the engine's own thread waits on the store in a step (a lookup, "
        "of which a decode's store may spend half waiting for blocks still being written; a "
        "load inside a step; the stores' answers to a prefill step's allocations), so that a "
        "store that died holding a request stalls no step for longer: past it the prompt is "
        "computed, or the decode recomputes what it lacks",
    )
    cost_profile: str = setting(
        "",
        "a CostProfile JSON file to publish and price this worker's work with, "
        "instead of measuring the engine (refused unless it fits the model)",
    )
    cost_profile_dir: str = setting(
        "",
        "vllm: where measured cost profiles are kept, one per model, dtype and "
        "hardware; a stored one is used instead of measuring at start",
    )
    drain_timeout_s: float = setting(
        30.0, "on SIGTERM, how long running requests may finish before they are aborted"
    )
    kv_load_async: bool = setting(
        True,
        "vllm decode: read a request's prompt KV from the store while the engine goes on "
        "stepping its running requests, and schedule the request once its KV is in (off: the "
        "load runs inside a step, which every running request waits for)",
    )
    kv_use_mapping: bool = setting(
        True,
        "map stores on this host and copy KV in place; off: every "
        "store is reached over the data plane, as a remote one (a same-host "
        "store still over shm unless --kv-transports leaves it out)",
    )
    kv_event_log: str = setting(
        "",
        "vllm: append the connector's per-layer load/save timestamps to this "
        "JSONL file (tests, debugging)",
    )
    kv_transports: str = setting(
        "",
        "the data-plane transports KV moves over (vllm: the connector's; emulated: "
        "its store client's), in order of preference (shm, tcp, rdma; e.g. tcp); "
        "without shm no store is mapped either, so every byte takes the named "
        "transports; empty: every transport that runs here",
    )
    kv_fault: str = setting(
        "",
        "vllm, testing only: inject a store fault (delay_commits: every commit starts 0.5 s "
        "late; evict_after_lookup: the store "
        "loses block 1 of a prefix between the connector's lookup and its load; slow_load: "
        "every load starts 2 s late)",
    )

    def validate(self) -> None:
        super().validate()
        if self.engine not in ENGINES:
            raise ConfigError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if not 0 <= self.drain_timeout_s < self.stop_timeout_s:
            raise ConfigError(
                f"drain_timeout_s ({self.drain_timeout_s}) must be in [0, stop_timeout_s "
                f"({self.stop_timeout_s})): the accepted work finishes inside the stop's deadline"
            )
        self.validate_device()
        transport_choice("kv_transports", self.kv_transports)
        if self.block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {self.block_size}")
        if self.engine == "vllm":
            if self.vllm_block_size < 1 or self.block_size % self.vllm_block_size:
                raise ConfigError(
                    f"block_size ({self.block_size}) must be a multiple of vllm_block_size "
                    f"({self.vllm_block_size})"
                )
            if self.vllm_kv_cache_gib <= 0 or self.kv_timeout_s <= 0 or self.kv_engine_wait_s <= 0:
                raise ConfigError(
                    "vllm_kv_cache_gib, kv_timeout_s and kv_engine_wait_s must be > 0"
                )
            if self.kv_fault not in ("", *KV_FAULTS):
                raise ConfigError(
                    f"kv_fault must be empty or one of {', '.join(KV_FAULTS)}, "
                    f"got {self.kv_fault!r}"
                )

    @property
    def kv_transport_kinds(self) -> tuple[TransportKind, ...] | None:
        """--kv-transports as transports (None: every one that runs here); checked in validate."""
        return parse_transports(self.kv_transports)

    @property
    def model_name(self) -> str:
        """The name clients ask for, and the model id in block hashes."""
        if self.served_model_name:
            return self.served_model_name
        if self.engine == "vllm":
            return self.model.rstrip("/").rsplit("/", 1)[-1]
        return self.model
