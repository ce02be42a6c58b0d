"""Conductor settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from crescent.common.config import CommonSettings, setting
from crescent.common.errors import ConfigError
from crescent.common.local_prefill import parse_local_prefill
from crescent.conductor.policy import POLICIES
from crescent.conductor.policy.admission import ADMISSIONS
from crescent.conductor.policy.local_prefill import LocalPrefill
from crescent.conductor.ratio import Bounds, RatioConfig, RatioConfigError
from crescent.engine.device_settings import EmulatedDevice


@dataclass
class ConductorSettings(EmulatedDevice, CommonSettings):
    """Settings of the conductor: its API port, deadlines of each request step, defaults."""

    http_port: int = setting(8000, "port of the OpenAI-compatible API, /health and /metrics")
    body_timeout_s: float = setting(
        30.0, "deadline for a request's body to arrive (later gets 408)"
    )
    default_max_tokens: int = setting(256, "max_tokens of a chat request that gives none")
    reserve_timeout_s: float = setting(2.0, "deadline of a decode reservation")
    prefill_timeout_s: float = setting(120.0, "deadline of a prefill job, queueing included")
    start_timeout_s: float = setting(
        5.0,
        "deadline of a decode start; after a NATS drop, also how long a decode asked to resend "
        "a stream, or a prefill asked for a job's result, may stay silent",
    )
    token_timeout_s: float = setting(30.0, "longest wait between two token chunks of a request")
    drain_timeout_s: float = setting(
        30.0,
        "on SIGTERM, how long the requests in flight may finish (new ones get a 503 meanwhile) "
        "before the conductor closes their connections",
    )
    placement_wait_s: float = setting(
        10.0,
        "how long a request waits for a live instance when the "
        "model's instances are all briefly silent or restarting",
    )
    rejoin_wait_s: float = setting(
        30.0,
        "how long requests wait for their instance to come back after it left the registry "
        "(a process paused past its lease) when no other instance can take them; "
        "0: never wait for it",
    )
    nats_outage_s: float = setting(
        45.0,
        "how much of one outage of NATS (no instance heard at all) the requests in flight wait "
        "out before it counts against their instances' token and resend deadlines (keep it under "
        "the 60 s a decode instance keeps an ended stream's chunks for a resend)",
    )
    policy: str = setting("kv-centric", f"scheduling policy: {', '.join(POLICIES)}")
    admission: str = setting("early", f"admission control: {', '.join(ADMISSIONS)}")
    ttft_slo_s: float = setting(30.0, "TTFT SLO that admission predicts against")
    tbt_slo_s: float = setting(0.1, "TBT SLO that admission predicts against")
    block_size: int = setting(512, "tokens per KV block (the unit of prefix caching)")
    kv_bytes_per_block: int = setting(
        1 << 20, "bytes of one stored KV block (the store's --block-bytes)"
    )
    kvcache_balancing_threshold: float = setting(
        1.5, "pull a better prefix only if best/local exceeds this"
    )
    local_prefill: str = setting(
        "off",
        "conditional disaggregation: when the decode instance computes a prompt itself. off "
        "(every prompt goes to a prefill instance), a number N (when at most N of its tokens "
        "are not cached on the decode node), or auto (when the decode instance's published "
        "cost model prices that part's compute no higher than the prefill's predicted TTFT and "
        "within the TBT SLO, which the prompts it is already computing share unless the "
        "prefill would answer later than a tenth of the TTFT SLO)",
    )
    prefill_model: str = setting(
        "",
        "override: price every instance's prefill with this fitted model (JSON of "
        "crescent profile) instead of the cost profile each publishes in etcd",
    )
    cost_correction: bool = setting(
        True,
        "correct each instance's published cost model online from the measured "
        "times of its requests (off: price with the published models as they are)",
    )
    hot_spot_period_s: float = setting(2.0, "interval of the hot-block replication pass (0: off)")
    seed: int = setting(0, "seed of the random baseline policy")
    tokenizer: str = setting(
        "",
        "checkpoint directory whose tokenizer.json the served model uses "
        "(empty: the emulated engine's byte tokenizer)",
    )
    served_model_name: str = setting(
        "",
        "the model this cluster serves, recorded in the cluster config "
        "(empty: the --tokenizer directory's name; no tokenizer: any model)",
    )

    ratio_window_s: float = setting(
        10.0,
        "P/D ratio controller: length of one window of load samples and "
        "SLO outcomes (0: the controller is off)",
    )
    ratio_persist_windows: int = setting(
        3,
        "P/D ratio controller: windows in a row a proposal must persist "
        "before the desired counts change",
    )
    ratio_urgent_persist_windows: int = setting(
        2,
        "P/D ratio controller: windows in a row a proposal to grow a "
        "side that misses its SLO must persist",
    )
    ratio_cooldown_windows: int = setting(
        2, "P/D ratio controller: windows after a change before the next"
    )
    autoscale_min_prefill: int = setting(
        1, "P/D ratio controller: fewest prefill instances it asks for"
    )
    autoscale_max_prefill: int = setting(
        8, "P/D ratio controller: most prefill instances it asks for"
    )
    autoscale_min_decode: int = setting(
        1, "P/D ratio controller: fewest decode instances it asks for"
    )
    autoscale_max_decode: int = setting(
        8, "P/D ratio controller: most decode instances it asks for"
    )
    autoscale_max_total: int = setting(
        0,
        "P/D ratio controller: most prefill + decode instances together "
        "(0: the two maximums' sum); at it, the ratio shifts instead",
    )

    def ratio_config(self) -> RatioConfig:
        bounds = Bounds(
            self.autoscale_min_prefill,
            self.autoscale_max_prefill,
            self.autoscale_min_decode,
            self.autoscale_max_decode,
            self.autoscale_max_total,
        )
        return RatioConfig(
            bounds=bounds,
            persist_windows=self.ratio_persist_windows,
            urgent_persist_windows=self.ratio_urgent_persist_windows,
            cooldown_windows=self.ratio_cooldown_windows,
        )

    def local_prefill_rule(self) -> LocalPrefill:
        return LocalPrefill.of(
            *parse_local_prefill(self.local_prefill), self.tbt_slo_s, self.ttft_slo_s
        )

    @property
    def model_name(self) -> str:
        if self.served_model_name or not self.tokenizer:
            return self.served_model_name
        return Path(self.tokenizer).name

    def validate(self) -> None:
        super().validate()
        if self.default_max_tokens < 1:
            raise ConfigError(f"default_max_tokens must be >= 1, got {self.default_max_tokens}")
        if not 0 <= self.drain_timeout_s < self.stop_timeout_s:
            raise ConfigError(
                f"drain_timeout_s ({self.drain_timeout_s}) must be in [0, stop_timeout_s "
                f"({self.stop_timeout_s})): the requests finish inside the stop's deadline"
            )
        self.validate_device()
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.admission not in ADMISSIONS:
            raise ConfigError(
                f"admission must be one of {', '.join(ADMISSIONS)}, got {self.admission!r}"
            )
        try:
            self.local_prefill_rule()
        except ValueError as exc:
            raise ConfigError(f"local_prefill: {exc}") from exc
        if self.block_size < 1 or self.kv_bytes_per_block < 1:
            raise ConfigError("block_size and kv_bytes_per_block must be >= 1")
        if self.nats_outage_s < 0:
            raise ConfigError(f"nats_outage_s must be >= 0, got {self.nats_outage_s}")
        if self.ratio_window_s < 0:
            raise ConfigError(f"ratio_window_s must be >= 0, got {self.ratio_window_s}")
        try:
            self.ratio_config().validate()
        except RatioConfigError as exc:
            raise ConfigError(f"autoscale bounds: {exc}") from exc
        if self.rejoin_wait_s < 0:
            raise ConfigError(f"rejoin_wait_s must be >= 0, got {self.rejoin_wait_s}")
        for name in (
            "ttft_slo_s",
            "tbt_slo_s",
            "reserve_timeout_s",
            "prefill_timeout_s",
            "start_timeout_s",
            "token_timeout_s",
            "placement_wait_s",
            "body_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
