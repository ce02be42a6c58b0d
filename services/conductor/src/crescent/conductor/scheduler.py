"""The conductor's scheduling state around the pure policy: the block index fed from etcd, the
requests in flight, the learned decode time, each instance's pricing (its published cost
profile, corrected online), and the loop plan → policy(state) → record.

The policy decides; this module only builds its inputs (a ClusterSnapshot at `now`) and
records the consequences (block hits, assignments, in-flight requests, observed decode times,
the prefix tokens each prefill really loaded, and every request's timings, fed back into the
pricing: feedback.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from crescent.common.block_index import BlockIndex, apply_block_change
from crescent.common.errors import ConfigError
from crescent.common.etcd import MirrorEvent
from crescent.common.hashing import block_hashes
from crescent.common.messages import InstanceLoad, PrefillResult
from crescent.conductor import metrics
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.feedback import Feedback
from crescent.conductor.policy import (
    BandwidthTable,
    ClusterSnapshot,
    CostPredictors,
    Decision,
    DecodeChoice,
    DecodeTimeEstimator,
    InflightRequest,
    InflightTable,
    PrefillTimeModel,
    Rejection,
    ReplicationOrder,
    ScheduleRequest,
    Slo,
    make_policy,
)
from crescent.conductor.policy.block_heat import BlockHeat
from crescent.conductor.policy.columns import InstanceColumns
from crescent.conductor.policy.correction import CostCorrection
from crescent.conductor.policy.decode_load import step_fn
from crescent.conductor.policy.imbalance import imbalance_factor, slo_load
from crescent.conductor.policy.replication import HotSpotConfig, hot_spot_orders, rank_target_nodes
from crescent.conductor.pricing import Pricing
from crescent.conductor.settings import ConductorSettings

log = logging.getLogger(__name__)


def prefill_override(settings: ConductorSettings) -> Callable[[int, int], float] | None:
    """--prefill-model: one fitted prefill model for every instance, over what they publish."""
    if not settings.prefill_model:
        return None
    try:
        return PrefillTimeModel.from_dict(json.loads(Path(settings.prefill_model).read_text()))
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot load prefill_model {settings.prefill_model}: {exc}") from exc


def build_predictors(settings: ConductorSettings) -> CostPredictors:
    """The default model: for an instance that has published no profile (the emulated cost
    model of the settings, or --prefill-model)."""
    cost = settings.cost_model()
    return CostPredictors(
        prefill_s=prefill_override(settings) or cost.prefill_s,
        decode_step_s=cost.decode_step_s,
        kv_bytes_per_token=settings.kv_bytes_per_block / settings.block_size,
    )


class Scheduler:
    def __init__(
        self, settings: ConductorSettings, view: ClusterView, clock: Callable[[], float]
    ) -> None:
        self.settings = settings
        self.view = view
        self.clock = clock
        self.index = BlockIndex()
        self.heat = BlockHeat(self.index)
        self.bandwidth = BandwidthTable()
        self.decode_time = DecodeTimeEstimator()
        predictors = build_predictors(settings)
        self.pricing = Pricing(
            predictors,
            CostCorrection(is_enabled=settings.cost_correction),
            prefill_override(settings),
        )
        self.feedback = Feedback(self.pricing)
        self.policy = make_policy(
            settings.policy,
            predictors=predictors,
            admission=settings.admission,
            slo=Slo(settings.ttft_slo_s, settings.tbt_slo_s),
            decode_time=self.decode_time,
            kvcache_balancing_threshold=settings.kvcache_balancing_threshold,
            rng=random.Random(settings.seed),
            local_prefill=settings.local_prefill_rule(),
        )
        self.inflight = InflightTable()
        self.model_of_block: dict[bytes, str] = {}
        self.num_hit_tokens = 0
        self.num_prompt_tokens = 0

    def apply_block_event(self, event: MirrorEvent) -> None:
        """A change under blocks/<model>/<hash>/<node> in etcd."""
        key = apply_block_change(self.index, event.key, event.value is not None)
        if key is None:
            log.warning("ignoring malformed block key", extra={"key": event.key})
        elif event.value is not None:
            self.model_of_block[key.block_hash] = key.model
        elif not self.index.is_held(key.block_hash):
            self.model_of_block.pop(key.block_hash, None)
            self.heat.forget(key.block_hash)

    def max_decode_capacity(self, model: str) -> int:
        return self.view.max_kv_capacity("decode", model)

    def total_decode_capacity(self, model: str) -> int:
        return self.view.total_kv_capacity("decode", model)

    def apply_registry_event(self, event: MirrorEvent) -> None:
        """A change under instances/<role>/<id>: an instance gone takes its corrections along."""
        gone = self.view.apply_registry(event)
        if gone is not None:
            self.pricing.correction.forget(gone[1])

    def apply_load(self, load: InstanceLoad) -> None:
        """A telemetry report: an instance it takes out of the view takes its corrections along."""
        gone = self.view.apply_load(load)
        if gone is not None:
            self.pricing.correction.forget(gone[1])

    def drop_unregistered(self) -> None:
        """Instances kept after their lease ended that went silent leave, corrections and all."""
        for _, instance_id in self.view.drop_unregistered():
            self.pricing.correction.forget(instance_id)

    def request_for(
        self,
        request_id: str,
        model: str,
        token_ids: Sequence[int],
        max_tokens: int,
        may_prefill_on_decode: bool = True,
    ) -> ScheduleRequest:
        hashes = block_hashes(token_ids, self.settings.block_size, model)
        return ScheduleRequest(
            request_id,
            hashes,
            len(token_ids),
            self.settings.block_size,
            max_tokens,
            may_prefill_on_decode,
        )

    def schedule(
        self, request: ScheduleRequest, model: str, exclude: Collection[str] = ()
    ) -> Decision | Rejection:
        """The policy's verdict on the cluster as it is now, leaving out the `exclude`d instances
        (gone, or refused this request); nothing is recorded yet."""
        now = self.clock()
        return self.policy.choose(request, self._snapshot(model, now, exclude), now)

    def schedule_decode(
        self, request: ScheduleRequest, model: str, exclude: Collection[str] = ()
    ) -> DecodeChoice | Rejection:
        """A new decode instance for an admitted request whose decode instance is gone."""
        return self.policy.choose_new_decode(request, self._snapshot(model, self.clock(), exclude))

    def _snapshot(self, model: str, now: float, exclude: Collection[str]) -> ClusterSnapshot:
        prefills = self.view.snapshot("prefill", model, now, self.pricing)
        decodes = self.view.snapshot("decode", model, now, self.pricing)
        if exclude:  # a retry: most requests exclude nothing, and skip two passes
            prefills = InstanceColumns.of(prefills).without(exclude)
            decodes = InstanceColumns.of(decodes).without(exclude)
        return ClusterSnapshot(
            prefill=prefills,
            decode=decodes,
            index=self.index,
            bandwidth=self.bandwidth,
            inflight=self.inflight,
        )

    def record(self, request: ScheduleRequest, decision: Decision, model: str = "") -> None:
        """Account for a placed request at once, before any await, so concurrent requests see
        the queue it adds; `forget` undoes it if its decode reservation is refused."""
        now = self.clock()
        self.feedback.on_placed(request, decision, model)
        self.heat.record_hits(request.block_hashes, now)
        self._assign(request, decision)
        self.inflight[request.request_id] = InflightRequest(
            decision.decode.instance_id,
            request.num_kv_tokens,
            now + decision.prefill.predicted_ttft_s,
            False,
            decision.local_prefill_added_s or 0.0,
        )

    def forget(self, request: ScheduleRequest, decision: Decision) -> None:
        self.view.unassign(request.request_id)
        self.inflight.pop(request.request_id)
        self.feedback.forget(request.request_id)

    def _assign(self, request: ScheduleRequest, decision: Decision) -> None:
        request_id = request.request_id
        if not decision.prefill_on_decode:
            # Queue time is compute: the messaging overhead in the corrected T_prefill is not
            # queued.
            prefill_id = decision.prefill.instance_id
            queue_s = max(
                0.0, decision.prefill.prefill_s - self.pricing.correction.of(prefill_id).overhead_s
            )
            self.view.assign("prefill", prefill_id, request_id, request.num_prompt_tokens, queue_s)
        self.view.assign(
            "decode",
            decision.decode.instance_id,
            request_id,
            request.num_kv_tokens,
            num_context_tokens=request.num_prompt_tokens,
        )

    def assignment_number(self, role: str, instance_id: str, request_id: str) -> int:
        """What the job or reservation for this placed request carries (ClusterView.assign)."""
        return self.view.assignment_number(role, instance_id, request_id)

    def on_prefilled(
        self,
        request: ScheduleRequest,
        decision: Decision,
        result: PrefillResult,
        measured_s: float,
        reserve_wait_s: float = 0.0,
    ) -> None:
        """A prefill finished `measured_s` after it was placed, as `result` says: the cache hit
        rate counts what was really loaded, not what the plan expected, and the TTFT prediction
        is checked against what happened and corrects the instance's pricing."""
        num_cached_tokens = result.num_cached_tokens
        # The job has left the prefill's queue, whether or not a report counted it yet.
        self.view.unassign(request.request_id, "prefill", decision.prefill.instance_id)
        self.feedback.on_prefilled(request.request_id, result, measured_s, reserve_wait_s)
        self._count_prompt(request.num_prompt_tokens, num_cached_tokens)
        metrics.labelled(metrics.PREFIX_TOKENS, "planned").inc(decision.prefill.prefix_tokens)
        for order in decision.replication:
            metrics.REPLICATION_ORDERS.labels(order.reason.value, "planned").inc()
            metrics.REPLICATED_BLOCKS.labels(order.reason.value).inc(len(order.hashes))

    def on_computed_on_decode(
        self, request_id: str, num_prompt_tokens: int, num_cached_tokens: int
    ) -> None:
        """Conditional disaggregation: the decode instance computed the prompt, loading
        `num_cached_tokens` of it from its node's store (its first token chunk says so). The
        hit rate counts it as it counts a prefill's, and its compute no longer waits there."""
        self._count_prompt(num_prompt_tokens, num_cached_tokens)
        request = self.inflight.get(request_id)
        if request is not None:
            self.inflight[request_id] = dataclasses.replace(request, local_prefill_added_s=0.0)

    def _count_prompt(self, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        """A prompt was computed, `num_cached_tokens` of it loaded: the cache hit rate's terms."""
        self.num_prompt_tokens += num_prompt_tokens
        self.num_hit_tokens += num_cached_tokens
        metrics.PROMPT_TOKENS_PREFILLED.inc(num_prompt_tokens)
        metrics.labelled(metrics.PREFIX_TOKENS, "loaded").inc(num_cached_tokens)

    def on_decoded(self, request_id: str, measured_tbt_s: float) -> None:
        """A request's stream ended on the decode instance it was placed on: check the TBT
        predicted at placement against its mean time between tokens, and learn from it."""
        self.feedback.on_decoded(request_id, measured_tbt_s)

    def move_decode(
        self, request: ScheduleRequest, old_decode_id: str, new_decode_id: str, number: int = 0
    ) -> None:
        """The request now decodes on `new_decode_id`, reserved there under `number`."""
        self.view.unassign(request.request_id, "decode", old_decode_id)
        self.view.assign(
            "decode",
            new_decode_id,
            request.request_id,
            request.num_kv_tokens,
            number=number,
            num_context_tokens=request.num_prompt_tokens,
        )
        inflight = self.inflight.get(request.request_id)
        if inflight is not None:
            self.inflight[request.request_id] = dataclasses.replace(
                inflight, decode_instance_id=new_decode_id
            )

    def on_decode_started(self, request_id: str) -> None:
        request = self.inflight.get(request_id)
        if request is not None:
            self.inflight[request_id] = dataclasses.replace(
                request, decode_start_s=self.clock(), is_decoding=True
            )

    def on_finished(self, request_id: str, is_ok: bool) -> None:
        self.view.unassign(request_id)
        self.feedback.forget(request_id)
        request = self.inflight.pop(request_id)
        if request is not None and request.is_decoding and is_ok:
            now = self.clock()
            self.decode_time.observe(now - request.decode_start_s, now)

    def hot_spot_orders(self, model: str) -> list[ReplicationOrder]:
        now = self.clock()
        targets = rank_target_nodes(self.view.snapshot("prefill", model, now))
        orders = hot_spot_orders(self.heat, targets, self.bandwidth, now, HotSpotConfig())
        return [o for o in orders if all(self.model_of_block.get(h) == model for h in o.hashes)]

    def slo_loads(self, model: str) -> tuple[list[float], list[float]]:
        """Each usable prefill and decode instance's current SLO load: queue time over the TTFT
        SLO, predicted step time over the TBT SLO."""
        now = self.clock()
        prefill = [
            slo_load(s.queue_time_s, self.settings.ttft_slo_s)
            for s in self.view.snapshot("prefill", model, now, self.pricing)
            if s.is_usable
        ]
        step_s = self.policy.predictors.decode_step_s
        decode = [
            slo_load(
                step_fn(s, step_s)(s.num_running, s.num_context_tokens), self.settings.tbt_slo_s
            )
            for s in self.view.snapshot("decode", model, now, self.pricing)
            if s.is_usable
        ]
        return prefill, decode

    def imbalance(self, model: str) -> float | None:
        """f_im from each usable instance's current SLO load (None until both sides exist)."""
        prefill, decode = self.slo_loads(model)
        return imbalance_factor(prefill, decode) if prefill and decode else None

    @property
    def cache_hit_rate(self) -> float:
        """Share of the prompt tokens of finished prefills (and prompts computed on decode)
        that were loaded, not computed."""
        return self.num_hit_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0
