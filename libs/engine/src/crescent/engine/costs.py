"""Which CostProfile a worker publishes and prices its own work with, decided once at start.

In order: a profile file given with --cost-profile (checked, and refused with a clear message
if it does not fit the model); the emulated engine's own cost model, exactly (prefill is Eq. 1,
decode a two-plane roofline); for vLLM, the profile stored in --cost-profile-dir for this
model, dtype and hardware, or else a short measurement of this engine, stored there for the
next start. Engines sharing that directory measure one at a time (profile_lock): the first
measures on a machine no other engine is profiling on, the others then load what it stored.
"""

from __future__ import annotations

import logging
from pathlib import Path

from crescent.common.cost_profile import (
    CostProfile,
    DecodePlane,
    PrefillCost,
    check_profile,
    load_profile,
    profile_file_name,
    save_profile,
)
from crescent.engine.cost_model import CostModel
from crescent.engine.profile_lock import profile_lock
from crescent.engine.settings import EngineSettings

log = logging.getLogger(__name__)

PROFILE_LOCK_TIMEOUT_S = 300.0  # a few engines measuring one after the other


def emulated_profile(cost: CostModel, model: str) -> CostProfile:
    """The emulated engine's cost model as a profile: the same numbers it sleeps for."""
    dims, scale = cost.dims, cost.time_scale
    d, layers = dims.hidden_size, dims.num_layers
    per_token_s = scale * layers * dims.b * d * d / cost.flops_per_s
    per_pair_s = scale * layers * dims.a * d / cost.flops_per_s
    compute = DecodePlane(per_request_s=per_token_s, per_context_token_s=per_pair_s)
    memory = DecodePlane(
        base_s=scale * dims.weight_bytes / cost.memory_bytes_per_s,
        per_context_token_s=scale * dims.kv_bytes_per_token / cost.memory_bytes_per_s,
    )
    hardware = (
        f"emulated-{cost.flops_per_s / 1e12:g}TFLOPs"
        f"-{cost.memory_bytes_per_s / 1e9:g}GBps-x{scale:g}"
    )
    return CostProfile(
        model=model,
        prefill=PrefillCost(per_token_s=per_token_s, per_token_pair_s=per_pair_s),
        decode=[compute, memory],
        dtype=f"{dims.dtype_bytes * 8}bit",
        hardware=hardware,
        source="emulated",
    )


async def resolve_profile(settings: EngineSettings, engine) -> CostProfile:
    """The profile this worker publishes; raises ProfileError (the worker does not start) for a
    given file that does not fit."""
    model = settings.model_name
    if settings.cost_profile:
        # measured on a like engine elsewhere, maybe: any hardware name, but a real engine's dtype
        dtype = engine.checkpoint.dtype if settings.engine == "vllm" else ""
        profile = load_profile(Path(settings.cost_profile), model, dtype)
        log.info("cost profile from a file", extra={"path": settings.cost_profile})
        return CostProfile(**{**_fields(profile), "source": "file"})
    if settings.engine != "vllm":
        return check_profile(emulated_profile(settings.cost_model(), model), model)
    from crescent.engine.vllm.self_profile import hardware_name, measure_profile

    dtype, hardware = engine.checkpoint.dtype, hardware_name()
    path = (
        Path(settings.cost_profile_dir) / profile_file_name(model, dtype, hardware)
        if settings.cost_profile_dir
        else None
    )
    if path is None:
        return check_profile(await measure_profile(engine, settings, dtype, hardware), model)
    async with profile_lock(path.parent, PROFILE_LOCK_TIMEOUT_S):
        if path.exists():
            profile = load_profile(path, model, dtype, hardware)
            log.info("cost profile from the store of measured profiles", extra={"path": str(path)})
            return CostProfile(**{**_fields(profile), "source": "stored"})
        profile = check_profile(await measure_profile(engine, settings, dtype, hardware), model)
        save_profile(path, profile)
    return profile


def _fields(profile: CostProfile) -> dict:
    return {name: getattr(profile, name) for name in profile.__struct_fields__ if name != "v"}
