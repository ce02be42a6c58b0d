"""Conductor settings."""

from __future__ import annotations

from dataclasses import dataclass

from crescent.common.config import CommonSettings, setting
from crescent.common.errors import ConfigError


@dataclass
class ConductorSettings(CommonSettings):
    """Settings of the conductor: its API port, deadlines of each request step, defaults."""

    http_port: int = setting(8000, "port of the OpenAI-compatible API, /health and /metrics")
    default_max_tokens: int = setting(256, "max_tokens of a chat request that gives none")
    reserve_timeout_s: float = setting(2.0, "deadline of a decode reservation")
    prefill_timeout_s: float = setting(120.0, "deadline of a prefill job, queueing included")
    start_timeout_s: float = setting(5.0, "deadline of a decode start")
    token_timeout_s: float = setting(30.0, "longest wait between two token chunks of a request")

    def validate(self) -> None:
        super().validate()
        if self.default_max_tokens < 1:
            raise ConfigError(f"default_max_tokens must be >= 1, got {self.default_max_tokens}")
        for name in ("reserve_timeout_s", "prefill_timeout_s", "start_timeout_s", "token_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
