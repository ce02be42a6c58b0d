"""How the conductor prices each instance: the cost profile the instance published in etcd
(costs/<role>/<id>), corrected online by what its requests really took (policy.correction).

An instance that has published nothing yet (or whose profile is of another model) is priced
with the conductor's default model (its emulated cost model, or --prefill-model), corrected
the same way. `--prefill-model`, when given, overrides every instance's prefill model.
The CostPredictors handed to the policy are cached per instance and rebuilt only when its
profile or correction changes, so instances with one model share one object between changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from crescent.common.codec import decode
from crescent.common.cost_profile import CostProfile, ProfileError, check_profile
from crescent.common.errors import MessageError
from crescent.common.etcd import MirrorEvent
from crescent.conductor.policy import CostPredictors
from crescent.conductor.policy.correction import CostCorrection, InstanceCorrection

log = logging.getLogger(__name__)


@dataclass
class Pricing:
    default: CostPredictors
    correction: CostCorrection = field(default_factory=CostCorrection)
    prefill_override: Callable[[int, int], float] | None = None
    profiles: dict[tuple[str, str], CostProfile] = field(default_factory=dict)
    _refused: set[tuple[str, str]] = field(default_factory=set)  # logged once per instance
    _cache: dict[tuple[str, str], tuple[tuple, CostPredictors]] = field(default_factory=dict)

    def apply_cost_event(self, event: MirrorEvent) -> None:
        """A change under costs/<role>/<id> in etcd."""
        parts = event.key.rstrip("/").split("/")
        if len(parts) < 2:
            return
        key = (parts[-2], parts[-1])
        self._refused.discard(key)
        self._cache.pop(key, None)
        if event.value is None:
            self.profiles.pop(key, None)
            self.correction.forget(key[1])
            return
        try:
            profile = decode(event.value, CostProfile)
        except MessageError as exc:
            self._refuse(key, f"malformed: {exc}")
            return
        self.profiles[key] = profile
        if key[1] in self.correction.instances:
            self.correction.forget(
                key[1]
            )  # a new model: the old corrections were against the old one
        log.info(
            "instance cost profile",
            extra={
                "role": key[0],
                "instance_id": key[1],
                "source": profile.source,
                "hardware": profile.hardware,
            },
        )

    def _refuse(self, key: tuple[str, str], reason: str) -> None:
        self.profiles.pop(key, None)
        if key not in self._refused:
            self._refused.add(key)
            log.warning(
                "ignoring an instance's cost profile; pricing it with the default model",
                extra={"role": key[0], "instance_id": key[1], "reason": reason},
            )

    def profile_of(self, role: str, instance_id: str, model: str) -> CostProfile | None:
        """The instance's usable published profile, if any (one that does not fit `model` is
        ignored and logged once)."""
        key = (role, instance_id)
        profile = self.profiles.get(key)
        if profile is None:
            return None
        try:
            return check_profile(profile, model)
        except ProfileError as exc:
            self._refuse(key, str(exc))
            return None

    def predictors(self, role: str, instance_id: str, model: str) -> CostPredictors:
        profile = self.profile_of(role, instance_id, model)
        correction = self.correction.of(instance_id)
        version = (id(profile), tuple(correction.ratios.values()), correction.overhead_s)
        cached = self._cache.get((role, instance_id))
        if cached is not None and cached[0] == version:
            return cached[1]
        predictors = self._build(profile, correction)
        self._cache[(role, instance_id)] = (version, predictors)
        return predictors

    def _build(self, profile: CostProfile | None, correction: InstanceCorrection) -> CostPredictors:
        prefill_s = self.prefill_override or (
            profile.prefill_s if profile else self.default.prefill_s
        )
        decode_step_s = profile.decode_step_s if profile else self.default.decode_step_s
        prefill_ratio, decode_ratio = correction.ratios["prefill"], correction.ratios["decode"]
        overhead_s = correction.overhead_s

        def corrected_prefill_s(num_tokens: int, num_cached_tokens: int) -> float:
            return overhead_s + prefill_ratio * prefill_s(num_tokens, num_cached_tokens)

        def corrected_decode_step_s(batch_size: int, total_context: int) -> float:
            return decode_ratio * decode_step_s(batch_size, total_context)

        # T_transfer = bytes / bandwidth: a slower pull than measured shows as more bytes per token.
        return CostPredictors(
            prefill_s=corrected_prefill_s,
            decode_step_s=corrected_decode_step_s,
            kv_bytes_per_token=self.default.kv_bytes_per_token * correction.ratios["transfer"],
        )

    def published_prefill_s(
        self, role: str, instance_id: str, model: str, num_tokens: int, num_cached_tokens: int
    ) -> float:
        """T_prefill by the instance's published model alone (no correction)."""
        profile = self.profile_of(role, instance_id, model)
        prefill_s = self.prefill_override or (
            profile.prefill_s if profile else self.default.prefill_s
        )
        return prefill_s(num_tokens, num_cached_tokens)

    def queue_ratio(self, instance_id: str) -> float:
        """A prefill worker predicts its queue with its own profile: the same ratio corrects it."""
        return self.correction.ratio(instance_id, "prefill")

    def describe(self, role: str, instance_id: str, model: str) -> dict:
        """For /v1/cluster: where the instance's model comes from and how it is corrected."""
        profile = self.profile_of(role, instance_id, model)
        correction = self.correction.of(instance_id)
        return {
            "source": profile.source if profile else "default",
            "hardware": profile.hardware if profile else "",
            "ratios": {k: round(v, 4) for k, v in correction.ratios.items()},
            "overhead_s": round(correction.overhead_s, 6),
            "num_samples": dict(correction.num_samples),
        }
