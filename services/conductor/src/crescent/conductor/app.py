"""The conductor service: HTTP API in front of the request flow.

The generating endpoints are generation.py's; here are the service's lifecycle, its view of
the cluster, readiness (/ready) and the informational endpoints.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from aiohttp import web

from crescent.common.cluster_config import ConfigConflict, conflicts, publish_config
from crescent.common.errors import RecoverableError
from crescent.common.etcd import PrefixMirror
from crescent.common.hf_tokenizer import HfTokenizer
from crescent.common.messages import Ack, ClusterConfig, InstanceInfo, InstanceLoad, TokenChunk
from crescent.common.service import Runtime, ServiceStatus, until_drained
from crescent.common.store_messages import ReplicateBlocks, ReplicateReply
from crescent.common.tokenizer import ByteTokenizer
from crescent.conductor import metrics
from crescent.conductor.autoscale import RatioLoop
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.flow import RequestFlow
from crescent.conductor.flow_state import FlowTimeouts
from crescent.conductor.generation import Generation
from crescent.conductor.http_errors import openai_errors
from crescent.conductor.openai_fields import ApiError
from crescent.conductor.openapi import OPENAPI
from crescent.conductor.policy import ReplicationOrder
from crescent.conductor.scheduler import Scheduler
from crescent.conductor.settings import ConductorSettings

log = logging.getLogger(__name__)


class Conductor:
    role = "conductor"

    def __init__(self, settings: ConductorSettings) -> None:
        self.settings = settings
        self.tokenizer = HfTokenizer(settings.tokenizer) if settings.tokenizer else ByteTokenizer()
        self.view = ClusterView(
            clock=time.monotonic,
            outage_allowance_s=settings.nats_outage_s,
            lease_ttl_s=settings.lease_ttl_s,
        )
        self.scheduler = Scheduler(settings, self.view, time.monotonic)
        self.ratio = (
            RatioLoop(settings, self.view, self.scheduler) if settings.ratio_window_s > 0 else None
        )
        self._runtime: Runtime | None = None
        self._generation: Generation | None = None

    async def start(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self.view.conductor_id = runtime.instance_id  # the id its jobs and reservations carry
        await self._agree_on_config(runtime)
        mirror = PrefixMirror(
            runtime.etcd, runtime.keys.instances(), self.scheduler.apply_registry_event
        )
        await mirror.load()
        runtime.tasks.spawn("registry-watch", mirror.run())
        costs = PrefixMirror(
            runtime.etcd, runtime.keys.costs(), self.scheduler.pricing.apply_cost_event
        )
        await costs.load()
        runtime.tasks.spawn("costs-watch", costs.run())
        blocks = PrefixMirror(
            runtime.etcd, runtime.keys.prefix + "blocks/", self.scheduler.apply_block_event
        )
        await blocks.load()
        runtime.tasks.spawn("blocks-watch", blocks.run())
        # What is loaded by now (modules, registry, prices, block index) lives as long as the
        # process: frozen, a full collection no longer walks it, and that collection pauses a
        # decision ~0.6 ms instead of ~76 ms (measured on the schedule bench's 512 × 1,024 state).
        # Collected first, so that no garbage is kept alive by the freeze.
        gc.collect()
        gc.freeze()
        if self.ratio is not None:
            runtime.tasks.spawn("ratio-controller", self.ratio.run(runtime))
        if self.settings.hot_spot_period_s > 0:
            runtime.tasks.spawn("hot-spot-replication", self._replicate_hot_blocks())
        await runtime.bus.subscribe(runtime.subjects.telemetry_all(), InstanceLoad, self._on_load)
        timeouts = FlowTimeouts(
            reserve_s=self.settings.reserve_timeout_s,
            prefill_s=self.settings.prefill_timeout_s,
            start_s=self.settings.start_timeout_s,
            token_gap_s=self.settings.token_timeout_s,
            placement_wait_s=self.settings.placement_wait_s,
            rejoin_wait_s=self.settings.rejoin_wait_s,
        )
        streams = await runtime.bus.stream_group(
            runtime.subjects.tokens_of(runtime.instance_id), TokenChunk
        )
        started = await runtime.bus.replies(
            runtime.subjects.start_replies_of(runtime.instance_id), Ack
        )
        flow = RequestFlow(
            runtime.bus,
            runtime.subjects,
            self.scheduler,
            timeouts,
            self.tokenizer.eos_token_id,
            streams,
            started,
            runtime.instance_id,
        )
        generation = self._generation = Generation(
            self.settings, self.tokenizer, self.view, self.scheduler, flow, self.ratio
        )
        app = runtime.http_app
        app.middlewares.append(openai_errors)
        app.router.add_post("/v1/completions", generation.completions)
        app.router.add_post("/v1/chat/completions", generation.chat_completions)
        app.router.add_post("/v1/responses", generation.responses)
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)
        app.router.add_get("/v1/cluster", self.cluster)
        app.router.add_get("/openapi.json", self.openapi)

    async def _agree_on_config(self, runtime: Runtime) -> None:
        """Write the cluster config if this is the first conductor; refuse to start if the
        config already there says otherwise."""
        settings = self.settings
        mine = ClusterConfig(
            model=settings.model_name,
            block_size=settings.block_size,
            ttft_slo_s=settings.ttft_slo_s,
            tbt_slo_s=settings.tbt_slo_s,
        )
        stored = await publish_config(runtime.etcd, runtime.keys, mine)
        found = conflicts(
            stored,
            {
                "model": mine.model,
                "block_size": mine.block_size,
                "ttft_slo_s": mine.ttft_slo_s,
                "tbt_slo_s": mine.tbt_slo_s,
            },
        )
        if found:
            raise ConfigConflict(runtime.keys.config(), f"conductor {runtime.instance_id}", found)

    def instance_info(self) -> InstanceInfo:
        return InstanceInfo(
            role=self.role,
            instance_id=self._runtime.instance_id,
            node=self.settings.node,
            http_url=self._runtime.http_url,
            started_at=time.time(),
        )

    def _on_load(self, load: InstanceLoad) -> None:
        self.scheduler.apply_load(load)
        for source_node, bytes_per_s in load.bandwidth.items():
            if bytes_per_s > 0:
                self.scheduler.bandwidth.set(source_node, load.node, bytes_per_s)

    def health(self) -> dict:
        now = time.monotonic()
        return {
            "live_instances": {
                role: self.view.count(role, now) for role in ("prefill", "decode", "store")
            }
        }

    def load(self) -> InstanceLoad:
        self.scheduler.drop_unregistered()
        self.view.log_changes(time.monotonic())
        for role, count in self.health()["live_instances"].items():
            metrics.INSTANCES.labels(role).set(count)
        for model in self.view.models():
            factor = self.scheduler.imbalance(model)
            if factor is not None:
                metrics.IMBALANCE.labels(model).set(factor)
        metrics.CACHE_HIT_RATE.set(self.scheduler.cache_hit_rate)
        return InstanceLoad(
            role=self.role,
            instance_id=self._runtime.instance_id,
            node=self.settings.node,
            sent_at=time.time(),
            period_s=self.settings.telemetry_period_s,
            num_running=self._generation.num_inflight if self._generation else 0,
        )

    async def finish_inflight(self) -> None:
        """New requests get a 503 from now on (and /ready says 503, so a load balancer sends
        them to another conductor); the requests in flight finish, for up to drain_timeout_s,
        while the NATS connection they read from is still open."""
        if self._generation is None:
            return
        generation = self._generation
        generation.is_draining = True
        if generation.num_inflight:
            log.info("draining", extra={"num_inflight": generation.num_inflight})
        left = await until_drained(lambda: generation.num_inflight, self.settings.drain_timeout_s)
        if left:
            log.warning(
                "drain deadline passed; closing the requests left", extra={"num_inflight": left}
            )

    async def drain(self) -> None:
        """Nothing to release."""

    async def cluster(self, request: web.Request) -> web.Response:
        """Instances and their loads, the cache hit rate, the blocks each node's store holds (as
        this conductor's index sees them), and the hottest blocks' replicas."""
        now = time.monotonic()
        instances = []
        for (role, instance_id), state in sorted(self.view.instances.items()):
            load = state.load
            instances.append(
                {
                    "role": role,
                    "instance_id": instance_id,
                    "node": state.info.node,
                    "model": state.info.model,
                    "http_url": state.info.http_url,
                    "is_live": self.view.is_live(state, now),
                    "pricing": self.scheduler.pricing.describe(role, instance_id, state.info.model),
                    "is_accepting": load is None or load.is_accepting,
                    "load": None
                    if load is None
                    else {
                        "num_queued": load.num_queued,
                        "num_running": load.num_running,
                        "queue_time_s": load.queue_time_s,
                        "kv_used_tokens": load.kv_used_tokens,
                        "kv_capacity_tokens": load.kv_capacity_tokens,
                        "recent_ttft_s": load.recent_ttft_s,
                        "recent_tbt_s": load.recent_tbt_s,
                        "bandwidth": load.bandwidth,
                    },
                }
            )
        hottest = [
            {"hash": block.hash.hex(), "replicas": block.num_replicas, "hits": round(block.hits, 2)}
            for block in self.scheduler.heat.hottest(10, now)
        ]
        models = {
            model: {
                "pd_imbalance_factor": self.scheduler.imbalance(model),
                "desired_instances": self.ratio.desired(model) if self.ratio is not None else None,
            }
            for model in self.view.models()
        }
        index = self.scheduler.index
        blocks_by_node = {node: index.num_blocks_of(node) for node in index.nodes()}
        return web.json_response(
            {
                "instances": instances,
                "cache_hit_rate": self.scheduler.cache_hit_rate,
                "num_blocks": index.num_blocks,
                "blocks_by_node": blocks_by_node,
                "hottest_blocks": hottest,
                "models": models,
                "policy": self.settings.policy,
                "admission": self.settings.admission,
            }
        )

    async def _replicate_hot_blocks(self) -> None:
        """Give hot prefixes more replicas (paper §4.2), one pass every hot_spot_period_s."""
        while True:
            await asyncio.sleep(self.settings.hot_spot_period_s)
            for model in self.view.models():
                for order in self.scheduler.hot_spot_orders(model):
                    await self._replicate(model, order)

    async def _replicate(self, model: str, order: ReplicationOrder) -> None:
        """Have the target node's store pull the order's blocks; counted by outcome and blocks
        copied."""
        reason = order.reason.value
        request = ReplicateBlocks(
            model=model, hashes=list(order.hashes), source_node=order.source_node, reason=reason
        )
        try:
            reply = await self._runtime.bus.request(
                self._runtime.subjects.store_ctl(order.target_node),
                request,
                ReplicateReply,
                self.settings.prefill_timeout_s,
            )
        except RecoverableError as exc:
            metrics.REPLICATION_ORDERS.labels(reason, "failed").inc()
            log.warning(
                "hot-spot replication failed",
                extra={"target": order.target_node, "error": str(exc)},
            )
            return
        metrics.REPLICATION_ORDERS.labels(reason, "ok").inc()
        metrics.REPLICATED_BLOCKS.labels(reason).inc(reply.num_copied)
        log.info(
            "hot-spot replication",
            extra={
                "source": order.source_node,
                "target": order.target_node,
                "num_blocks": len(order.hashes),
                "num_copied": reply.num_copied,
            },
        )

    async def models(self, request: web.Request) -> web.Response:
        listed = self.view.listed_models()
        data = [_model_object(name, length) for name, length in sorted(listed.items())]
        return web.json_response({"object": "list", "data": data})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        length = self.view.listed_models().get(name)
        if length is None:
            raise ApiError(
                404,
                f"the model '{name}' does not exist: it has no registered prefill and decode",
                type_="not_found_error",
                param="model",
                code="model_not_found",
            )
        return web.json_response(_model_object(name, length))

    def readiness(self) -> tuple[bool, dict[str, dict[str, int]]]:
        """Ready to serve: SERVING, NATS connected, and some model with a live prefill and a
        live decode instance; with each model's live instances by role."""
        now = time.monotonic()
        models = {
            model: {role: self.view.count_live(role, model, now) for role in ("prefill", "decode")}
            for model in self.view.models()
        }
        runtime = self._runtime
        is_up = (
            runtime is not None
            and runtime.status is ServiceStatus.SERVING
            and runtime.bus.is_connected
        )
        return is_up and any(
            counts["prefill"] and counts["decode"] for counts in models.values()
        ), models

    async def ready(self, request: web.Request) -> web.Response:
        """Readiness (a load balancer's or Kubernetes' probe): 200 only when a request could be
        served now; /health stays liveness (the process is up)."""
        is_ready, models = self.readiness()
        return web.json_response(
            {"ready": is_ready, "models": models}, status=200 if is_ready else 503
        )

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(OPENAPI)


def _model_object(name: str, max_model_len: int) -> dict:
    """A served model in OpenAI's shape, with vLLM's max_model_len."""
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "crescent",
        "max_model_len": max_model_len,
    }
