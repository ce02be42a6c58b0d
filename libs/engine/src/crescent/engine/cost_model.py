"""How long prefill and decode take on a given model and device, from first principles.

Prefill follows the paper's Eq. 1, flops(n) = l·(a·n²·d + b·n·d²); a cached prefix of p tokens
saves l·(a·p²·d + b·p·d²). Decode is a roofline: one step costs the larger of its FLOPs
(b·d² per token plus a·ctx·d of attention) over device FLOP/s and its bytes (all weights once
plus every token's KV) over memory bandwidth. `time_scale` multiplies everything, so 0 gives
an instant engine for control-plane benchmarks and 1 the predicted speed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelDims:
    """Defaults are LLaMA2-7B: 32 layers, d=4096, no GQA, 16-bit weights."""

    num_layers: int = 32
    hidden_size: int = 4096
    gqa: int = 1
    dtype_bytes: int = 2
    a: float = 4.0
    b: float = 22.0

    @property
    def weight_bytes(self) -> float:
        return 12 * self.num_layers * self.hidden_size**2 * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        return self.num_layers * 2 * (self.hidden_size / self.gqa) * self.dtype_bytes


@dataclass(frozen=True)
class CostModel:
    dims: ModelDims = ModelDims()
    flops_per_s: float = 100e12
    memory_bytes_per_s: float = 1.5e12
    time_scale: float = 1.0

    def prefill_flops(self, num_tokens: int, num_cached: int = 0) -> float:
        d, layers = self.dims.hidden_size, self.dims.num_layers
        n, p = num_tokens, min(num_cached, num_tokens)
        return layers * (self.dims.a * (n * n - p * p) * d + self.dims.b * (n - p) * d * d)

    def prefill_s(self, num_tokens: int, num_cached: int = 0) -> float:
        return self.time_scale * self.prefill_flops(num_tokens, num_cached) / self.flops_per_s

    def decode_step_s(self, batch_size: int, total_context: int) -> float:
        if batch_size == 0:
            return 0.0
        d, layers = self.dims.hidden_size, self.dims.num_layers
        flops = layers * (self.dims.b * batch_size * d * d + self.dims.a * total_context * d)
        memory = self.dims.weight_bytes + total_context * self.dims.kv_bytes_per_token
        return self.time_scale * max(flops / self.flops_per_s, memory / self.memory_bytes_per_s)
