"""The generating endpoints (/v1/completions, /v1/chat/completions, /v1/responses): parse,
check against the model, tokenize and check the context and KV room before any instance is
touched, so bad input costs the cluster nothing; then one flow per choice, relayed as one response.

A request with n choices is n requests through the cluster, not one that vLLM forks: each is
placed, admitted and, when an instance fails, moved on its own, exactly like any other request,
and the emulated engine needs nothing for it. The KV the first choice's prefill writes to the
stores is there for the others to reuse. Choice i samples with seed + i, as vLLM seeds its own.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web
from jinja2.exceptions import TemplateError
from opentelemetry.trace import SpanKind

from crescent.common.errors import RecoverableError, RequestTimeoutError
from crescent.common.payload import sequence_bytes, sequence_room
from crescent.common.tracing import tracer
from crescent.conductor import metrics
from crescent.conductor.autoscale import RatioLoop
from crescent.conductor.choice import Choice
from crescent.conductor.cluster_view import ClusterView
from crescent.conductor.flow import RequestFlow
from crescent.conductor.flow_errors import RejectedError, RequestRefusedError
from crescent.conductor.http_body import read_json
from crescent.conductor.http_errors import REQUEST_ID
from crescent.conductor.model_checks import check_for_model
from crescent.conductor.openai_api import (
    ApiError,
    GenerationRequest,
    bad_request,
    parse_chat,
    parse_completion,
)
from crescent.conductor.openai_responses import ResponsesRenderer, parse_responses
from crescent.conductor.openai_shapes import OpenAIRenderer
from crescent.conductor.policy import Rejection, RejectReason
from crescent.conductor.relay import Relay
from crescent.conductor.scheduler import Scheduler
from crescent.conductor.settings import ConductorSettings

_ID_PREFIX = {"completions": "cmpl-", "chat": "chatcmpl-", "responses": "resp_"}

Prompt = tuple[GenerationRequest, list[int], int]  # one prompt's request, tokens and max_tokens


class Generation:
    """The handlers of the generating endpoints, sharing one tokenizer and one flow."""

    def __init__(
        self,
        settings: ConductorSettings,
        tokenizer,
        view: ClusterView,
        scheduler: Scheduler,
        flow: RequestFlow,
        ratio: RatioLoop | None = None,
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.view = view
        self.scheduler = scheduler
        self.flow = flow
        self.ratio = ratio  # the P/D ratio controller's SLO outcomes (None: the controller is off)
        self.num_inflight = 0
        self.is_draining = False  # shutting down: the requests in flight finish, no new one starts

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, parse_completion)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, parse_chat)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, parse_responses)

    def _prompt(self, gen: GenerationRequest) -> list[int]:
        if gen.prompt_token_ids is not None:
            token_ids = gen.prompt_token_ids
            largest, vocab_size = max(token_ids), self.tokenizer.vocab_size
            if largest >= vocab_size:
                raise bad_request(
                    f"token id {largest} is outside the vocabulary (size {vocab_size})",
                    param="prompt",
                )
            return token_ids
        if not gen.is_chat:
            return self.tokenizer.encode(gen.prompt_text)
        try:
            return self.tokenizer.encode(
                self.tokenizer.apply_chat_template(gen.messages, gen.tools)
            )
        except TemplateError as exc:
            raise bad_request(
                f"the model's chat template refused the messages: {exc}",
                param="input" if gen.api == "responses" else "messages",
            ) from exc

    def _tokens(self, gen: GenerationRequest) -> Prompt:
        """The request as the model serves it, its prompt tokens and max_tokens, checked against
        the model's context and the cluster's KV room."""
        served = self.view.models()
        if gen.model not in served:
            raise ApiError(
                404,
                f"the model '{gen.model}' does not exist: no instance serves it",
                type_="not_found_error",
                param="model",
                code="model_not_found",
            )
        gen = check_for_model(gen, self.view.engine_of(gen.model), self.tokenizer)
        token_ids = self._prompt(gen)
        max_model_len = served[gen.model]
        max_tokens = gen.max_tokens
        if max_tokens is None:
            max_tokens = max(
                1, min(self.settings.default_max_tokens, max_model_len - len(token_ids))
            )
        if gen.sampling.min_tokens > max_tokens:
            raise bad_request(
                f"'min_tokens' ({gen.sampling.min_tokens}) exceeds the tokens to generate "
                f"({max_tokens})",
                param="min_tokens",
            )
        need = len(token_ids) + max_tokens
        capacity = self.scheduler.max_decode_capacity(gen.model)
        if capacity and need > capacity:
            raise bad_request(
                f"the request needs {need} tokens of KV cache; the largest decode instance holds "
                f"{capacity}",
                code="exceeds_kv_capacity",
            )
        if need > max_model_len:
            raise bad_request(
                f"this model's maximum context length is {max_model_len} tokens; "
                f"the request asks for {need} "
                f"({len(token_ids)} in the prompt, {max_tokens} to generate)",
                param="prompt" if gen.api == "completions" else "messages",
                code="context_length_exceeded",
            )
        room = sequence_room(self.flow.max_payload, gen.sampling)
        size = sequence_bytes(token_ids, max_tokens, self.settings.block_size)
        if size > room:
            raise bad_request(
                f"the request's {need} tokens ({len(token_ids)} in the prompt, {max_tokens} to "
                f"generate) take up to {size} bytes in the one message that carries them, and "
                f"this cluster's NATS server leaves {room} (its max_payload is "
                f"{self.flow.max_payload} bytes)",
                param="prompt" if gen.api == "completions" else "messages",
                code="exceeds_message_size",
            )
        total = self.scheduler.total_decode_capacity(gen.model) if gen.n > 1 else 0
        if total and gen.n * need > total:
            raise bad_request(
                f"n={gen.n} choices need {gen.n} x {need} tokens of KV cache; the cluster's decode "
                f"instances hold {total} together",
                param="n",
                code="exceeds_kv_capacity",
            )
        return gen, token_ids, max_tokens

    def _choices(self, prompts: list[Prompt]) -> list[Choice]:
        choices = []
        for number, (gen, token_ids, _) in enumerate(prompts):
            echo_text = ""
            if gen.echo:
                echo_text = (
                    gen.prompt_text
                    if gen.prompt_text is not None
                    else self.tokenizer.decode(token_ids)
                )
            choices += [
                Choice(len(choices) + i, gen, self.tokenizer, token_ids, echo_text, number)
                for i in range(gen.n)
            ]
        return choices

    def _streams(self, prompts: list[Prompt], request_id: str) -> list:
        streams = []
        for number, (gen, token_ids, max_tokens) in enumerate(prompts):
            prompt_id = request_id if len(prompts) == 1 else f"{request_id}-{number}"
            sampling = gen.sampling
            for i in range(gen.n):
                choice_sampling = sampling
                if sampling.seed is not None and i:
                    choice_sampling = msgspec.structs.replace(
                        sampling, seed=sampling.seed + i
                    )  # < 2**64
                choice_id = prompt_id if gen.n == 1 else f"{prompt_id}-{i}"
                streams.append(
                    self.flow.generate(choice_id, gen.model, token_ids, max_tokens, choice_sampling)
                )
        return streams

    async def _generate(
        self,
        request: web.Request,
        parse: Callable[[Any], GenerationRequest],
    ) -> web.StreamResponse:
        arrived = time.monotonic()
        if self.is_draining:
            raise ApiError(
                503,
                "this conductor is shutting down: send the request to another one",
                type_="service_unavailable",
                code="draining",
                headers={"Retry-After": "1"},
            )
        parsed = parse(await read_json(request, self.settings.body_timeout_s))
        prompts = [self._tokens(one) for one in parsed.one_per_prompt()]
        gen = prompts[0][0]
        num_prompt_tokens = sum(len(token_ids) for _, token_ids, _ in prompts)
        request_id = _ID_PREFIX[gen.api] + secrets.token_hex(12)
        request[REQUEST_ID] = request_id
        metrics.INFLIGHT.inc()
        self.num_inflight += 1
        metrics.PROMPT_TOKENS.inc(num_prompt_tokens)
        outcome = "error"
        headers = {"X-Request-Id": request_id}
        try:
            with tracer().start_as_current_span("conductor.request", kind=SpanKind.SERVER) as span:
                span.set_attribute("crescent.request_id", request_id)
                span.set_attribute("crescent.num_prompt_tokens", num_prompt_tokens)
                span.set_attribute("crescent.num_choices", gen.n * len(prompts))
                renderer_type = ResponsesRenderer if gen.api == "responses" else OpenAIRenderer
                relay = Relay(
                    self._choices(prompts),
                    renderer_type(gen, request_id, int(time.time())),
                    request_id,
                    num_prompt_tokens,
                    arrived,
                    self.ratio.window(gen.model) if self.ratio is not None else None,
                )
                streams = self._streams(prompts, request_id)
                if gen.stream:
                    response = await relay.stream(request, streams)
                else:
                    response = await relay.collect(streams)
                # a stream that ended with an error event was a 200, and is still an error
                outcome = "ok" if relay.failed_midway is None else "error"
                return response
        except RejectedError as exc:
            outcome = "rejected"
            if self.ratio is not None:
                self.ratio.record_rejection(gen.model, exc.rejection.reason)
            raise rejection_error(
                exc.rejection, request_id, self.view.has_live("decode", time.monotonic())
            ) from exc
        except RequestRefusedError as exc:
            raise ApiError(
                400, f"the model's engine refused the request: {exc}", headers=headers
            ) from exc
        except RequestTimeoutError as exc:
            raise ApiError(
                504, f"the cluster did not answer in time: {exc}", type_="timeout", headers=headers
            ) from exc
        except RecoverableError as exc:
            raise ApiError(
                502,
                f"an instance failed the request: {exc}",
                type_="upstream_error",
                headers=headers,
            ) from exc
        finally:
            metrics.INFLIGHT.dec()
            self.num_inflight -= 1
            metrics.labelled(metrics.REQUESTS, gen.api, outcome).inc()
            metrics.E2E.observe(time.monotonic() - arrived)


def rejection_error(rejection: Rejection, request_id: str, has_live_decode: bool) -> ApiError:
    """429 when the cluster is too loaded (retry later): no decode room, or the SLOs; 503
    when it has no instance at all for this model, or those that could take the request
    failed it."""
    metrics.REJECTED.labels(rejection.reason.value).inc()
    headers = {
        "Retry-After": str(max(1, math.ceil(rejection.retry_after_s))),
        "X-Request-Id": request_id,
    }
    has_no_instance = rejection.reason is RejectReason.NO_PREFILL or (
        rejection.reason is RejectReason.NO_DECODE
        and (rejection.is_unavailable or not has_live_decode)
    )
    if has_no_instance:
        return ApiError(
            503,
            rejection.detail,
            type_="service_unavailable",
            code="no_capacity",
            headers=headers,
        )
    why = (
        "no decode instance can take this request now"
        if rejection.reason is RejectReason.NO_DECODE
        else "the cluster cannot serve this request within its SLOs now"
    )
    return ApiError(
        429,
        f"{why}: {rejection.detail}",
        type_="rate_limit_error",
        code=rejection.reason.value,
        headers=headers,
    )
