"""What a simulated cluster is made of, and the cost model that times its work.

The default device is the paper's Table 1: LLaMA3-70B (80 layers, d = 8192, GQA 8, BF16: 320 KB
of KV per token) on one 8×A800 node per instance, G = 8 × 312 TFLOPS; decode is priced by the
same roofline as the emulated engine with the A800's HBM bandwidth (8 × 2,039 GB/s), which
Table 1 does not list. A `crescent profile` file replaces prefill (its fitted polynomial) and
decode (its fitted line) with measured figures.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from crescent.common.local_prefill import parse_local_prefill
from crescent.conductor.policy import POLICIES, PrefillTimeModel
from crescent.conductor.ratio import RatioConfig, RatioConfigError
from crescent.engine.cost_model import CostModel, ModelDims

ADMISSIONS = ("none", "baseline", "early", "predictive")
CACHE_SCOPES = ("global", "local")
COUPLED = ("none", "vllm", "vllm-prefix-cache", "vllm-chunked")
LLAMA3_70B = ModelDims(num_layers=80, hidden_size=8192, gqa=8, dtype_bytes=2)
A800_X8_TFLOPS = 8 * 312.0
A800_X8_MEMORY_GBPS = 8 * 2039.0
A800_X8_HBM_BYTES = 8 * 80e9
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of HBM it may use


class SimConfigError(ValueError):
    """A configuration the simulator cannot run, with what to change."""


@dataclass(frozen=True)
class SimCosts:
    """The truth the simulated engines run at (and, without a profile, what the conductor
    predicts with: the same cost model, as a real emulated cluster)."""

    prefill_s: Callable[[int, int], float]  # (num_tokens, num_cached_tokens) -> seconds
    decode_step_s: Callable[[int, int], float]  # (batch_size, total_context_tokens) -> seconds
    kv_bytes_per_token: float


@dataclass(frozen=True)
class SimConfig:
    num_prefill: int = 8
    num_decode: int = 8
    policy: str = "kv-centric"
    admission: str = "none"
    speed: float = 1.0
    cache_tokens_per_node: int | None = 3_000_000  # None: unbounded
    ssd_tokens_per_node: int = 0  # blocks pushed out of DRAM go here first (0: dropped)
    cache_scope: str = "global"
    coupled: str = "none"
    ttft_slo_s: float = 30.0
    tbt_slo_s: float = 0.1
    output_limit: int | None = None
    telemetry_period_s: float = 0.2  # the workers' default
    telemetry_delay_s: float = 0.0  # from a worker's sample to the conductor applying it
    hot_spot_period_s: float = 2.0  # the conductor's default; 0: off
    nic_gbps: float = 800.0  # 4 × 200 Gb/s per node (paper §7.1)
    h2d_gbps: float = 128.0  # host → device, bytes (Table 1), for decode loading the prompt's KV
    ssd_gbps: float = 8.0  # GB/s of one node's SSDs
    tflops: float = A800_X8_TFLOPS
    memory_gbps: float = A800_X8_MEMORY_GBPS
    decode_kv_tokens: int | None = None  # None: what the HBM holds after the weights
    profile: Path | None = None
    kv_bytes_per_token_stored: float | None = (
        None  # KV bytes per token a store holds and moves (default: the model's)
    )
    kvcache_balancing_threshold: float = 1.5
    local_prefill: str = "off"  # the conductor's --local-prefill (conditional disaggregation)
    chunk_tokens: int = 512  # vllm-chunked: tokens per step (vLLM 0.5's default budget)
    max_num_seqs: int = 256  # coupled instances: most requests in one batch (vLLM's default)
    seed: int = 0
    model_dims: ModelDims = field(default=LLAMA3_70B)
    ratio: RatioConfig | None = None  # the P/D ratio controller's bounds and hysteresis (None: off)
    ratio_window_s: float = 30.0  # one controller window
    instance_start_s: float = 30.0  # from the controller asking for an instance to it serving

    def validate(self) -> None:
        if self.policy not in POLICIES:
            raise SimConfigError(
                f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}"
            )
        for name, value, allowed in (
            ("admission", self.admission, ADMISSIONS),
            ("cache scope", self.cache_scope, CACHE_SCOPES),
            ("coupled", self.coupled, COUPLED),
        ):
            if value not in allowed:
                raise SimConfigError(
                    f"unknown {name} {value!r}; choose one of {', '.join(allowed)}"
                )
        if self.num_prefill < 1 or self.num_decode < 1:
            raise SimConfigError("a cluster needs at least one prefill and one decode instance")
        if not self.speed > 0 or not self.telemetry_period_s > 0 or self.telemetry_delay_s < 0:
            raise SimConfigError("speed and telemetry period must be > 0, telemetry delay >= 0")
        if self.cache_tokens_per_node is not None and self.cache_tokens_per_node < 0:
            raise SimConfigError("cache tokens per node must be >= 0")
        if self.output_limit is not None and self.output_limit < 1:
            raise SimConfigError("output limit must be >= 1")
        if min(self.nic_gbps, self.h2d_gbps, self.ssd_gbps, self.tflops, self.memory_gbps) <= 0:
            raise SimConfigError("bandwidths and device speeds must be > 0")
        if self.cache_scope == "local" and self.policy == "kv-centric" and self.coupled == "none":
            raise SimConfigError(
                "kv-centric pulls prefixes across nodes, which a local cache scope forbids: "
                "use --cache-scope global or --policy local-cache-aware"
            )
        if not (self.ttft_slo_s > 0 and self.tbt_slo_s > 0):
            raise SimConfigError(
                f"SLOs must be > 0, got TTFT {self.ttft_slo_s} s, TBT {self.tbt_slo_s} s"
            )
        if not self.kvcache_balancing_threshold > 0:
            raise SimConfigError("the KV-cache balancing threshold must be > 0")
        try:
            local_prefill_mode, _ = parse_local_prefill(self.local_prefill)
        except ValueError as exc:
            raise SimConfigError(f"local prefill: {exc}") from exc
        if local_prefill_mode != "off" and (self.admission == "baseline" or self.coupled != "none"):
            raise SimConfigError(
                "local prefill needs the conductor's admission and disaggregated instances: "
                "not --admission baseline or --coupled"
            )
        if self.chunk_tokens < 1 or self.max_num_seqs < 1:
            raise SimConfigError("chunk tokens and max_num_seqs must be >= 1")
        if self.ratio is not None:
            if self.coupled != "none":
                raise SimConfigError(
                    "the P/D ratio controller sizes a disaggregated cluster, not a coupled one"
                )
            if not self.ratio_window_s > 0 or self.instance_start_s < 0:
                raise SimConfigError(
                    "the ratio window must be > 0 s and the instance start time >= 0 s"
                )
            try:
                self.ratio.validate()
            except RatioConfigError as exc:
                raise SimConfigError(f"P/D ratio controller: {exc}") from exc

    @property
    def num_nodes(self) -> int:
        return self.num_prefill + self.num_decode

    def cost_model(self) -> CostModel:
        return CostModel(
            dims=self.model_dims,
            flops_per_s=self.tflops * 1e12,
            memory_bytes_per_s=self.memory_gbps * 1e9,
        )

    def kv_bytes_per_token(self) -> float:
        """What a block's bytes in the stores and on the wire are counted as. An emulated cluster
        stores blocks of its store's --block-bytes whatever model it emulates, so validating
        against one sets this apart from the model's own KV size."""
        if self.kv_bytes_per_token_stored is not None:
            return self.kv_bytes_per_token_stored
        return self.model_dims.kv_bytes_per_token

    def kv_capacity_tokens(self) -> int:
        """KV tokens one instance's HBM holds: decode instances and coupled ones alike."""
        if self.decode_kv_tokens is not None:
            return self.decode_kv_tokens
        free = A800_X8_HBM_BYTES * GPU_MEMORY_UTILIZATION - self.model_dims.weight_bytes
        return int(free / self.model_dims.kv_bytes_per_token)

    def costs(self) -> SimCosts:
        cost = self.cost_model()
        if self.profile is None:
            return SimCosts(cost.prefill_s, roofline_decode(cost), self.kv_bytes_per_token())
        return SimCosts(*load_profile(self.profile), self.kv_bytes_per_token())


def roofline_decode(cost: CostModel) -> Callable[[int, int], float]:
    """CostModel.decode_step_s with its constants folded: the simulator calls it once per decode
    step of every instance, hundreds of thousands of times a run."""
    dims = cost.dims
    per_request_s = (
        cost.time_scale * dims.num_layers * dims.b * dims.hidden_size**2 / cost.flops_per_s
    )
    per_context_flops_s = (
        cost.time_scale * dims.num_layers * dims.a * dims.hidden_size / cost.flops_per_s
    )
    weights_s = cost.time_scale * dims.weight_bytes / cost.memory_bytes_per_s
    per_context_bytes_s = cost.time_scale * dims.kv_bytes_per_token / cost.memory_bytes_per_s

    def decode_step_s(batch_size: int, total_context: int) -> float:
        if batch_size == 0:
            return 0.0
        return max(
            per_request_s * batch_size + per_context_flops_s * total_context,
            weights_s + per_context_bytes_s * total_context,
        )

    return decode_step_s


def load_profile(path: Path) -> tuple[PrefillTimeModel, Callable[[int, int], float]]:
    """(prefill model, decode step function) from a `crescent profile` JSON file."""
    try:
        data = json.loads(Path(path).read_text())
        prefill = PrefillTimeModel.from_dict(data)
        decode = data["decode"]
        base, per_request, per_token = (
            float(decode[k]) for k in ("base_s", "per_request_s", "per_context_token_s")
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SimConfigError(f"cannot use profile {path}: {exc}") from exc

    def decode_step_s(batch_size: int, total_context: int) -> float:
        return (
            0.0
            if batch_size == 0
            else max(0.0, base + per_request * batch_size + per_token * total_context)
        )

    return prefill, decode_step_s
