"""How the conductor prices each instance: the cost profile the instance published in etcd
(costs/<role>/<id>), corrected online by what its requests really took (policy.correction).

An instance that has published nothing yet (or whose profile is of another model) is priced
with the conductor's default model (its emulated cost model, or --prefill-model), corrected
the same way. `--prefill-model`, when given, overrides every instance's prefill model.
The CostPredictors handed to the policy are cached per instance and rebuilt only when its
profile or the part of its correction its role uses changes (a prefill instance is priced for
prefill and pulls, a decode instance for decode steps); each names the shared model of its
profile as its `base`, so a policy can bound hundreds of instances with one evaluation of it.
`take_changed` tells the conductor's view which instances' prices moved since it last asked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from crescent.common.codec import decode
from crescent.common.cost_profile import CostProfile, ProfileError, check_profile
from crescent.common.errors import MessageError
from crescent.common.etcd import MirrorEvent
from crescent.common.messages import InstanceLoad
from crescent.conductor.policy import CostPredictors
from crescent.conductor.policy.correction import OVERHEAD, CostCorrection, InstanceCorrection

log = logging.getLogger(__name__)

# The corrections each role's price depends on.
ROLE_KINDS = {"prefill": ("prefill", "transfer", OVERHEAD), "decode": ("decode",)}


@dataclass
class Pricing:
    default: CostPredictors
    correction: CostCorrection = field(default_factory=CostCorrection)
    prefill_override: Callable[[int, int], float] | None = None
    profiles: dict[tuple[str, str], CostProfile] = field(default_factory=dict)
    _refused: set[tuple[str, str]] = field(default_factory=set)  # logged once per instance
    _cache: dict[tuple[str, str], tuple[tuple, CostPredictors]] = field(default_factory=dict)
    _checked: dict[tuple[str, str], tuple[str, CostProfile | None]] = field(default_factory=dict)
    # Equal published profiles share one object (hence one base model): bytes → profile.
    _interned: dict[bytes, CostProfile] = field(default_factory=dict)
    _bases: dict[int, tuple[CostProfile | None, CostPredictors]] = field(default_factory=dict)
    _changed: set[tuple[str, str]] = field(default_factory=set)

    def apply_cost_event(self, event: MirrorEvent) -> None:
        """A change under costs/<role>/<id> in etcd."""
        parts = event.key.rstrip("/").split("/")
        if len(parts) < 2:
            return
        key = (parts[-2], parts[-1])
        self._refused.discard(key)
        self._cache.pop(key, None)
        self._checked.pop(key, None)
        self._changed.add(key)
        if event.value is None:
            if self.profiles.pop(key, None) is not None:
                self._prune()
            self.correction.forget(key[1])
            return
        profile = self._interned.get(event.value)
        if profile is None:
            try:
                profile = decode(event.value, CostProfile)
            except MessageError as exc:
                self._refuse(key, f"malformed: {exc}")
                return
            self._interned[event.value] = profile
        replaced = self.profiles.get(key)
        self.profiles[key] = profile
        if replaced is not None and replaced is not profile:
            self._prune()
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

    def _prune(self) -> None:
        """Forget shared profiles (and their base models) that no instance publishes any more:
        a long-lived conductor sees every restarted worker publish a new one."""
        live = {id(profile) for profile in self.profiles.values()}
        self._interned = {k: p for k, p in self._interned.items() if id(p) in live}
        self._bases = {k: e for k, e in self._bases.items() if e[0] is None or id(e[0]) in live}

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
        checked = self._checked.get(key)
        if checked is not None and checked[0] == model:
            return checked[1]
        profile = self.profiles.get(key)
        if profile is not None:
            try:
                check_profile(profile, model)
            except ProfileError as exc:
                self._refuse(key, str(exc))
                profile = None
        self._checked[key] = (model, profile)
        return profile

    def predictors(self, role: str, instance_id: str, model: str) -> CostPredictors:
        """The instance's model, priced for its role's work."""
        profile = self.profile_of(role, instance_id, model)
        correction = self.correction.of(instance_id)
        if role == "decode":
            version: tuple = (id(profile), correction.ratios["decode"])
        else:
            ratios = correction.ratios
            version = (id(profile), ratios["prefill"], ratios["transfer"], correction.overhead_s)
        cached = self._cache.get((role, instance_id))
        if cached is not None and cached[0] == version:
            return cached[1]
        predictors = self._build(profile, correction)
        self._cache[(role, instance_id)] = (version, predictors)
        return predictors

    def take_changed(self) -> set[tuple[str, str]]:
        """(role, id) of the instances whose price may have moved since the last call: a new
        profile, a change of their own correction, or of a typical one they rely on."""
        correction = self.correction
        changed = self._changed
        if correction.changed:
            for instance_id in correction.changed:
                changed.update((role, instance_id) for role in ROLE_KINDS)
            correction.changed.clear()
        if correction.typical_changed:
            kinds = correction.typical_changed
            changed.update(
                (role, instance_id)
                for role, instance_id in self._cache
                if any(
                    kind in kinds and not correction.has_samples(instance_id, kind)
                    for kind in ROLE_KINDS.get(role, ())
                )
            )
            kinds.clear()
        self._changed = set()
        return changed

    def _base(self, profile: CostProfile | None) -> CostPredictors:
        """The uncorrected model of `profile` (None: the default), one object per profile."""
        entry = self._bases.get(id(profile))
        if entry is None or entry[0] is not profile:
            # The profile's PrefillCost itself (CostProfile.prefill_s only calls it): T_prefill
            # is evaluated a few dozen times a decision.
            prefill_s = self.prefill_override or (
                profile.prefill.seconds if profile else self.default.prefill_s
            )
            if profile:
                decode_step_s = profile.decode_step_s
                planes = tuple(
                    (p.base_s, p.per_request_s, p.per_context_token_s) for p in profile.decode
                )
            else:
                decode_step_s, planes = self.default.decode_step_s, self.default.decode_planes
            base = CostPredictors(
                prefill_s, decode_step_s, self.default.kv_bytes_per_token, decode_planes=planes
            )
            entry = self._bases[id(profile)] = (profile, base)
        return entry[1]

    def _build(self, profile: CostProfile | None, correction: InstanceCorrection) -> CostPredictors:
        base = self._base(profile)
        prefill_s, decode_step_s = base.prefill_s, base.decode_step_s
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
            base=base,
            prefill_ratio=prefill_ratio,
            prefill_overhead_s=overhead_s,
            decode_ratio=decode_ratio,
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


def reported_queue_s(load: InstanceLoad, ratio: float) -> float:
    """What was left of a prefill instance's reported queue when it reported, corrected by the
    instance's `ratio`: the job computing then counts for what is left of its own prediction,
    never less than nothing, so that a job running past its prediction does not take its
    overrun off the predictions of the jobs queued behind it (they are still all to come)."""
    running_left_s = max(0.0, load.running_predicted_s * ratio - load.running_s)
    queued_s = max(0.0, load.queue_time_s - load.running_predicted_s) * ratio
    return queued_s + running_left_s
