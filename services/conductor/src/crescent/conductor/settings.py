"""Conductor settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from crescent.common.config import CommonSettings, setting
from crescent.common.errors import ConfigError
from crescent.conductor.policy import POLICIES
from crescent.conductor.policy.admission import ADMISSIONS
from crescent.engine.device_settings import EmulatedDevice


@dataclass
class ConductorSettings(EmulatedDevice, CommonSettings):
    """Settings of the conductor: its API port, deadlines of each request step, defaults."""

    http_port: int = setting(8000, "port of the OpenAI-compatible API, /health and /metrics")
    body_timeout_s: float = setting(30.0, "deadline for a request's body to arrive (later gets 408)")
    default_max_tokens: int = setting(256, "max_tokens of a chat request that gives none")
    reserve_timeout_s: float = setting(2.0, "deadline of a decode reservation")
    prefill_timeout_s: float = setting(120.0, "deadline of a prefill job, queueing included")
    start_timeout_s: float = setting(5.0, "deadline of a decode start")
    token_timeout_s: float = setting(30.0, "longest wait between two token chunks of a request")
    placement_wait_s: float = setting(10.0, "how long a request waits for a live instance when the "
                                            "model's instances are all briefly silent or restarting")
    policy: str = setting("kv-centric", f"scheduling policy: {', '.join(POLICIES)}")
    admission: str = setting("early", f"admission control: {', '.join(ADMISSIONS)}")
    ttft_slo_s: float = setting(30.0, "TTFT SLO that admission predicts against")
    tbt_slo_s: float = setting(0.1, "TBT SLO that admission predicts against")
    block_size: int = setting(512, "tokens per KV block (the unit of prefix caching)")
    kv_bytes_per_block: int = setting(1 << 20, "bytes of one stored KV block (the store's --block-bytes)")
    kvcache_balancing_threshold: float = setting(1.5, "pull a better prefix only if best/local exceeds this")
    prefill_model: str = setting("", "override: price every instance's prefill with this fitted model (JSON of "
                                     "crescent profile) instead of the cost profile each publishes in etcd")
    cost_correction: bool = setting(True, "correct each instance's published cost model online from the measured "
                                          "times of its requests (off: price with the published models as they are)")
    hot_spot_period_s: float = setting(2.0, "interval of the hot-block replication pass (0: off)")
    seed: int = setting(0, "seed of the random baseline policy")
    tokenizer: str = setting("", "checkpoint directory whose tokenizer.json the served model uses "
                                 "(empty: the emulated engine's byte tokenizer)")
    served_model_name: str = setting("", "the model this cluster serves, recorded in the cluster config "
                                         "(empty: the --tokenizer directory's name; no tokenizer: any model)")

    @property
    def model_name(self) -> str:
        if self.served_model_name or not self.tokenizer:
            return self.served_model_name
        return Path(self.tokenizer).name

    def validate(self) -> None:
        super().validate()
        if self.default_max_tokens < 1:
            raise ConfigError(f"default_max_tokens must be >= 1, got {self.default_max_tokens}")
        self.validate_device()
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.admission not in ADMISSIONS:
            raise ConfigError(f"admission must be one of {', '.join(ADMISSIONS)}, got {self.admission!r}")
        if self.block_size < 1 or self.kv_bytes_per_block < 1:
            raise ConfigError("block_size and kv_bytes_per_block must be >= 1")
        for name in ("ttft_slo_s", "tbt_slo_s", "reserve_timeout_s", "prefill_timeout_s", "start_timeout_s", "token_timeout_s",
                     "placement_wait_s", "body_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
