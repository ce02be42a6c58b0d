"""The conductor service: HTTP API in front of the request flow.

Handlers validate, tokenize and check the context before any instance is touched, so bad
input costs the cluster nothing; after that the flow owns the request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import time
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

from aiohttp import web
from opentelemetry.trace import SpanKind

from crescent.common.cluster_config import ConfigConflict, conflicts, publish_config
from crescent.common.errors import RecoverableError, RemoteError, RequestTimeoutError
from crescent.common.etcd import PrefixMirror
from crescent.common.messages import ClusterConfig, InstanceInfo, InstanceLoad, SamplingParams
from crescent.common.store_messages import ReplicateBlocks, ReplicateReply
from crescent.common.service import Runtime
from crescent.common.tokenizer import ByteTokenizer
from crescent.common.tracing import tracer
from crescent.conductor import metrics
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.flow import FlowTimeouts, RejectedError, RequestFlow
from crescent.conductor.http_body import read_json
from crescent.conductor.http_errors import REQUEST_ID, openai_errors
from crescent.conductor.policy import RejectReason, ReplicationOrder
from crescent.conductor.scheduler import Scheduler
from crescent.conductor.openai_api import (
    ApiError,
    GenerationRequest,
    bad_request,
    chunk,
    full_response,
    parse_chat,
    parse_completion,
    usage,
    usage_chunk,
)
from crescent.conductor.openapi import OPENAPI
from crescent.conductor.settings import ConductorSettings
from crescent.conductor.text import TextAssembler
from crescent.engine.hf_tokenizer import HfTokenizer

log = logging.getLogger(__name__)


class Conductor:
    role = "conductor"

    def __init__(self, settings: ConductorSettings) -> None:
        self.settings = settings
        self.tokenizer = HfTokenizer(settings.tokenizer) if settings.tokenizer else ByteTokenizer()
        self.view = ClusterView(clock=time.monotonic)
        self.scheduler = Scheduler(settings, self.view, time.monotonic)
        self._runtime: Runtime | None = None
        self._flow: RequestFlow | None = None
        self._num_inflight = 0

    async def start(self, runtime: Runtime) -> None:
        self._runtime = runtime
        await self._agree_on_config(runtime)
        mirror = PrefixMirror(runtime.etcd, runtime.keys.instances(), self.view.apply_registry)
        await mirror.load()
        runtime.tasks.spawn("registry-watch", mirror.run())
        blocks = PrefixMirror(runtime.etcd, runtime.keys.prefix + "blocks/", self.scheduler.apply_block_event)
        await blocks.load()
        runtime.tasks.spawn("blocks-watch", blocks.run())
        if self.settings.hot_spot_period_s > 0:
            runtime.tasks.spawn("hot-spot-replication", self._replicate_hot_blocks())
        await runtime.bus.subscribe(runtime.subjects.telemetry_all(), InstanceLoad, self._on_load)
        timeouts = FlowTimeouts(reserve_s=self.settings.reserve_timeout_s, prefill_s=self.settings.prefill_timeout_s,
                                start_s=self.settings.start_timeout_s, token_gap_s=self.settings.token_timeout_s,
                                placement_wait_s=self.settings.placement_wait_s)
        self._flow = RequestFlow(runtime.bus, runtime.subjects, self.scheduler, timeouts, self.tokenizer.eos_token_id)
        app = runtime.http_app
        app.middlewares.append(openai_errors)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/cluster", self.cluster)
        app.router.add_get("/openapi.json", self.openapi)

    async def _agree_on_config(self, runtime: Runtime) -> None:
        """Write the cluster config if this is the first conductor; refuse to start if the
        config already there says otherwise."""
        settings = self.settings
        mine = ClusterConfig(model=settings.model_name, block_size=settings.block_size,
                             ttft_slo_s=settings.ttft_slo_s, tbt_slo_s=settings.tbt_slo_s)
        stored = await publish_config(runtime.etcd, runtime.keys, mine)
        found = conflicts(stored, {"model": mine.model, "block_size": mine.block_size,
                                   "ttft_slo_s": mine.ttft_slo_s, "tbt_slo_s": mine.tbt_slo_s})
        if found:
            raise ConfigConflict(runtime.keys.config(), f"conductor {runtime.instance_id}", found)

    def instance_info(self) -> InstanceInfo:
        return InstanceInfo(role=self.role, instance_id=self._runtime.instance_id, node=self.settings.node,
                            http_url=self._runtime.http_url, started_at=time.time())

    def _on_load(self, load: InstanceLoad) -> None:
        self.view.apply_load(load)
        for source_node, bytes_per_s in load.bandwidth.items():
            if bytes_per_s > 0:
                self.scheduler.bandwidth.set(source_node, load.node, bytes_per_s)

    def health(self) -> dict:
        now = time.monotonic()
        return {"live_instances": {role: self.view.count(role, now) for role in ("prefill", "decode", "store")}}

    def load(self) -> InstanceLoad:
        self.view.log_changes(time.monotonic())
        for role, count in self.health()["live_instances"].items():
            metrics.INSTANCES.labels(role).set(count)
        for model in self.view.models():
            factor = self.scheduler.imbalance(model)
            if factor is not None:
                metrics.IMBALANCE.labels(model).set(factor)
        metrics.CACHE_HIT_RATE.set(self.scheduler.cache_hit_rate)
        return InstanceLoad(role=self.role, instance_id=self._runtime.instance_id, node=self.settings.node,
                            sent_at=time.time(), period_s=self.settings.telemetry_period_s,
                            num_running=self._num_inflight)

    async def drain(self) -> None:
        """In-flight responses finish while aiohttp shuts down; nothing else to wait for."""

    async def cluster(self, request: web.Request) -> web.Response:
        """Instances and their loads, the cache hit rate, the blocks each node's store holds (as
        this conductor's index sees them), and the hottest blocks' replicas."""
        now = time.monotonic()
        instances = []
        for (role, instance_id), state in sorted(self.view.instances.items()):
            load = state.load
            instances.append({"role": role, "instance_id": instance_id, "node": state.info.node,
                              "model": state.info.model, "is_live": self.view.is_live(state, now),
                              "is_accepting": load is None or load.is_accepting,
                              "load": None if load is None else {
                                  "num_queued": load.num_queued, "num_running": load.num_running,
                                  "queue_time_s": load.queue_time_s, "kv_used_tokens": load.kv_used_tokens,
                                  "kv_capacity_tokens": load.kv_capacity_tokens,
                                  "recent_ttft_s": load.recent_ttft_s, "recent_tbt_s": load.recent_tbt_s,
                                  "bandwidth": load.bandwidth}})
        hottest = [{"hash": block.hash.hex(), "replicas": block.num_replicas, "hits": round(block.hits, 2)}
                   for block in self.scheduler.index.hottest(10, now)]
        models = {model: {"pd_imbalance_factor": self.scheduler.imbalance(model)}
                  for model in self.view.models()}
        index = self.scheduler.index
        blocks_by_node = {node: index.num_blocks_of(node) for node in index.nodes()}
        return web.json_response({"instances": instances, "cache_hit_rate": self.scheduler.cache_hit_rate,
                                  "num_blocks": index.num_blocks, "blocks_by_node": blocks_by_node,
                                  "hottest_blocks": hottest,
                                  "models": models, "policy": self.settings.policy,
                                  "admission": self.settings.admission})

    async def _replicate_hot_blocks(self) -> None:
        """Give hot prefixes more replicas (paper §4.2), one pass every hot_spot_period_s."""
        while True:
            await asyncio.sleep(self.settings.hot_spot_period_s)
            for model in self.view.models():
                for order in self.scheduler.hot_spot_orders(model):
                    await self._replicate(model, order)

    async def _replicate(self, model: str, order: ReplicationOrder) -> None:
        """Have the target node's store pull the order's blocks; counted by outcome and blocks copied."""
        reason = order.reason.value
        request = ReplicateBlocks(model=model, hashes=list(order.hashes), source_node=order.source_node,
                                  reason=reason)
        try:
            reply = await self._runtime.bus.request(self._runtime.subjects.store_ctl(order.target_node), request,
                                                    ReplicateReply, self.settings.prefill_timeout_s)
        except RecoverableError as exc:
            metrics.REPLICATION_ORDERS.labels(reason, "failed").inc()
            log.warning("hot-spot replication failed", extra={"target": order.target_node, "error": str(exc)})
            return
        metrics.REPLICATION_ORDERS.labels(reason, "ok").inc()
        metrics.REPLICATED_BLOCKS.labels(reason).inc(reply.num_copied)
        log.info("hot-spot replication", extra={"source": order.source_node, "target": order.target_node,
                                                "num_blocks": len(order.hashes), "num_copied": reply.num_copied})

    async def models(self, request: web.Request) -> web.Response:
        served = self.view.models()
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "crescent", "max_model_len": length}
                for name, length in sorted(served.items())]
        return web.json_response({"object": "list", "data": data})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, parse_completion, "completions")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, parse_chat, "chat")

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(OPENAPI)

    async def _read_json(self, request: web.Request) -> Any:
        return await read_json(request, self.settings.body_timeout_s)

    def _tokens(self, gen: GenerationRequest) -> tuple[list[int], int]:
        """Prompt tokens and max_tokens, checked against the model's context."""
        served = self.view.models()
        if gen.model not in served:
            raise ApiError(404, f"the model '{gen.model}' does not exist: no instance serves it",
                           type_="not_found_error", param="model", code="model_not_found")
        if gen.prompt_token_ids is not None:
            token_ids = gen.prompt_token_ids
            if max(token_ids) >= self.tokenizer.vocab_size:
                raise bad_request(f"token id {max(token_ids)} is outside the vocabulary "
                                  f"(size {self.tokenizer.vocab_size})", param="prompt")
        elif gen.is_chat:
            token_ids = self.tokenizer.encode(self.tokenizer.apply_chat_template(gen.messages))
        else:
            token_ids = self.tokenizer.encode(gen.prompt_text)
        max_model_len = served[gen.model]
        max_tokens = gen.max_tokens
        if max_tokens is None:
            max_tokens = max(1, min(self.settings.default_max_tokens, max_model_len - len(token_ids)))
        capacity = self.scheduler.max_decode_capacity(gen.model)
        if capacity and len(token_ids) + max_tokens > capacity:
            raise bad_request(f"the request needs {len(token_ids) + max_tokens} tokens of KV cache; the largest "
                              f"decode instance holds {capacity}", code="exceeds_kv_capacity")
        if len(token_ids) + max_tokens > max_model_len:
            raise bad_request(
                f"this model's maximum context length is {max_model_len} tokens; the request asks for "
                f"{len(token_ids) + max_tokens} ({len(token_ids)} in the prompt, {max_tokens} to generate)",
                param="messages" if gen.is_chat else "prompt", code="context_length_exceeded")
        return token_ids, max_tokens

    async def _generate(self, request: web.Request, parse: Callable[[Any], GenerationRequest],
                        endpoint: str) -> web.StreamResponse:
        arrived = time.monotonic()
        gen = parse(await self._read_json(request))
        token_ids, max_tokens = self._tokens(gen)
        request_id = ("chatcmpl-" if gen.is_chat else "cmpl-") + secrets.token_hex(12)
        request[REQUEST_ID] = request_id
        sampling = SamplingParams(temperature=gen.temperature, top_p=gen.top_p, seed=gen.seed,
                                  ignore_eos=gen.ignore_eos)
        metrics.INFLIGHT.inc()
        self._num_inflight += 1
        metrics.PROMPT_TOKENS.inc(len(token_ids))
        outcome = "error"
        try:
            with tracer().start_as_current_span("conductor.request", kind=SpanKind.SERVER) as span:
                span.set_attribute("crescent.request_id", request_id)
                span.set_attribute("crescent.num_prompt_tokens", len(token_ids))
                events = self._flow.generate(request_id, gen.model, token_ids, max_tokens, sampling)
                relay = _Relay(gen, request_id, self.tokenizer, arrived)
                if gen.stream:
                    response = await relay.stream(request, events, len(token_ids))
                else:
                    response = await relay.collect(events, len(token_ids))
                outcome = "ok"
                return response
        except RejectedError as exc:
            outcome = "rejected"
            raise self._rejection_error(exc.rejection, request_id) from exc
        except RequestTimeoutError as exc:
            raise ApiError(504, f"the cluster did not answer in time: {exc}", type_="timeout",
                           headers={"X-Request-Id": request_id}) from exc
        except (RemoteError, RecoverableError) as exc:
            raise ApiError(502, f"an instance failed the request: {exc}", type_="upstream_error",
                           headers={"X-Request-Id": request_id}) from exc
        finally:
            metrics.INFLIGHT.dec()
            self._num_inflight -= 1
            metrics.REQUESTS.labels(endpoint, outcome).inc()
            metrics.E2E.observe(time.monotonic() - arrived)


    def _rejection_error(self, rejection, request_id: str) -> ApiError:
        """429 when the cluster is too loaded for the SLOs (retry later), 503 when it has no
        instance at all for this model."""
        metrics.REJECTED.labels(rejection.reason.value).inc()
        headers = {"Retry-After": str(max(1, math.ceil(rejection.retry_after_s))), "X-Request-Id": request_id}
        has_no_instance = rejection.reason is RejectReason.NO_PREFILL or (
            rejection.reason is RejectReason.NO_DECODE and not self.view.count("decode", time.monotonic()))
        if has_no_instance:
            return ApiError(503, rejection.detail, type_="service_unavailable", code="no_capacity", headers=headers)
        return ApiError(429, f"the cluster cannot serve this request within its SLOs now: {rejection.detail}",
                        type_="rate_limit_error", code=rejection.reason.value, headers=headers)


class _Relay:
    """Turns a request's TokenEvents into one HTTP response (SSE or JSON), timing TTFT and TBT."""

    def __init__(self, gen: GenerationRequest, request_id: str, tokenizer: ByteTokenizer | HfTokenizer,
                 arrived: float) -> None:
        self.gen = gen
        self.request_id = request_id
        self.created = int(time.time())
        self.text = TextAssembler(tokenizer.stream_decoder(), gen.stop)
        self._arrived = arrived
        self._last_token_at: float | None = None
        self.num_generated = 0

    def _on_tokens(self, num_tokens: int) -> None:
        now = time.monotonic()
        if self._last_token_at is None:
            metrics.TTFT.observe(now - self._arrived)
        elif num_tokens:
            metrics.TBT.observe((now - self._last_token_at) / num_tokens)
        self._last_token_at = now
        self.num_generated += num_tokens
        metrics.GENERATED_TOKENS.inc(num_tokens)

    async def collect(self, events, num_prompt_tokens: int) -> web.Response:
        pieces: list[str] = []
        finish = None
        async with aclosing(events):
            async for event in events:
                self._on_tokens(len(event.token_ids))
                pieces.append(self.text.push(event.token_ids))
                finish = "stop" if self.text.is_stopped else event.finish_reason
                if finish is not None:
                    break
        pieces.append(self.text.finish())
        body = full_response(self.gen, self.request_id, self.created, "".join(pieces), finish,
                             usage(num_prompt_tokens, self.num_generated))
        return web.json_response(body, headers={"X-Request-Id": self.request_id})

    async def stream(self, request: web.Request, events, num_prompt_tokens: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "X-Request-Id": self.request_id})
        is_prepared = False
        is_first = True
        try:
            async with aclosing(events):
                async for event in events:
                    self._on_tokens(len(event.token_ids))
                    piece = self.text.push(event.token_ids)
                    finish = "stop" if self.text.is_stopped else event.finish_reason
                    if finish is not None:
                        piece += self.text.finish()
                    if not is_prepared:
                        await response.prepare(request)
                        is_prepared = True
                    await _send(response, chunk(self.gen, self.request_id, self.created, piece, finish, is_first))
                    is_first = False
                    if finish is not None:
                        break
            if self.gen.include_usage:
                await _send(response, usage_chunk(self.gen, self.request_id, self.created,
                                                  usage(num_prompt_tokens, self.num_generated)))
        except (RecoverableError, ApiError) as exc:
            if not is_prepared:
                raise
            log.warning("stream failed midway", extra={"request_id": self.request_id, "error": str(exc)})
            await _send(response, {"error": {"message": str(exc), "type": "upstream_error", "param": None,
                                             "code": None}})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _send(response: web.StreamResponse, body: dict) -> None:
    await response.write(b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n")
