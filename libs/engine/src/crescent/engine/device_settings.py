"""The emulated device's settings: what the emulated engine runs at, and what the conductor
prices work with when no profiled model is given, so both use one cost model."""

from __future__ import annotations

from dataclasses import dataclass

from crescent.common.config import setting
from crescent.common.errors import ConfigError
from crescent.engine.cost_model import CostModel, ModelDims


@dataclass
class EmulatedDevice:
    emulated_layers: int = setting(32, "emulated model: number of layers l")
    emulated_hidden_size: int = setting(4096, "emulated model: model dimension d")
    emulated_gqa: int = setting(1, "emulated model: query heads per KV head")
    emulated_tflops: float = setting(100.0, "emulated device: sustained TFLOP/s")
    emulated_memory_gbps: float = setting(1500.0, "emulated device: memory bandwidth in GB/s")
    emulated_time_scale: float = setting(
        1.0, "multiplies emulated compute time; 0 = instant (control-plane benchmarks)"
    )

    def validate_device(self) -> None:
        if (
            self.emulated_time_scale < 0
            or self.emulated_tflops <= 0
            or self.emulated_memory_gbps <= 0
        ):
            raise ConfigError("emulated_time_scale must be >= 0 and device speeds > 0")

    def cost_model(self) -> CostModel:
        dims = ModelDims(
            num_layers=self.emulated_layers,
            hidden_size=self.emulated_hidden_size,
            gqa=self.emulated_gqa,
        )
        return CostModel(
            dims=dims,
            flops_per_s=self.emulated_tflops * 1e12,
            memory_bytes_per_s=self.emulated_memory_gbps * 1e9,
            time_scale=self.emulated_time_scale,
        )
