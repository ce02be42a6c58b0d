"""Settings of an engine-hosting worker (prefill or decode)."""

from __future__ import annotations

from dataclasses import dataclass

from crescent.common.config import CommonSettings, setting
from crescent.common.errors import ConfigError
from crescent.engine.cost_model import CostModel, ModelDims

ENGINES = ("emulated",)


@dataclass
class EngineSettings(CommonSettings):
    """Settings of a worker that hosts an engine: which engine, which model, emulated device."""

    engine: str = setting("emulated", "engine backend: emulated (cost model, no weights)")
    model: str = setting("crescent-emulated", "model name this instance serves (the API's `model`)")
    max_model_len: int = setting(32768, "longest prompt + output in tokens")
    emulated_layers: int = setting(32, "emulated model: number of layers l")
    emulated_hidden_size: int = setting(4096, "emulated model: model dimension d")
    emulated_gqa: int = setting(1, "emulated model: query heads per KV head")
    emulated_tflops: float = setting(100.0, "emulated device: sustained TFLOP/s")
    emulated_memory_gbps: float = setting(1500.0, "emulated device: memory bandwidth in GB/s")
    emulated_time_scale: float = setting(1.0, "multiplies emulated compute time; 0 = instant (control-plane benchmarks)")

    def validate(self) -> None:
        super().validate()
        if self.engine not in ENGINES:
            raise ConfigError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.emulated_time_scale < 0 or self.emulated_tflops <= 0 or self.emulated_memory_gbps <= 0:
            raise ConfigError("emulated_time_scale must be >= 0 and device speeds > 0")

    def cost_model(self) -> CostModel:
        dims = ModelDims(num_layers=self.emulated_layers, hidden_size=self.emulated_hidden_size,
                         gqa=self.emulated_gqa)
        return CostModel(dims=dims, flops_per_s=self.emulated_tflops * 1e12,
                         memory_bytes_per_s=self.emulated_memory_gbps * 1e9, time_scale=self.emulated_time_scale)
