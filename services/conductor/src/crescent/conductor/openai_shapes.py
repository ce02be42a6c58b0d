"""The OpenAI wire format, responses: completion and chat bodies and their SSE chunks, built
from ChoiceDeltas (the Responses API's shapes are in openai_responses)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from crescent.conductor.choice import Choice, ChoiceDelta
from crescent.conductor.logprobs import merge_completion_parts
from crescent.conductor.openai_api import GenerationRequest
from crescent.conductor.tool_calls import ToolCall


@dataclass(frozen=True)
class TokenUsage:
    """A response's token counts; `num_cached` is the prompt tokens its prefill loaded (from the
    instance's own cache or the store) instead of computing, the largest over its choices."""

    num_prompt: int
    num_generated: int
    num_cached: int = 0


def usage(counts: TokenUsage) -> dict[str, Any]:
    return {
        "prompt_tokens": counts.num_prompt,
        "completion_tokens": counts.num_generated,
        "total_tokens": counts.num_prompt + counts.num_generated,
        "prompt_tokens_details": {"cached_tokens": counts.num_cached},
    }


@dataclass
class Collected:
    """A whole choice, gathered from its deltas (for a response that is not streamed)."""

    index: int
    texts: list[str] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)  # set once the choice has finished
    logprob_parts: list[Any] = field(default_factory=list)
    finish_reason: str | None = None

    def add(self, delta: ChoiceDelta) -> None:
        """Text and logprobs; the tool calls are the Choice's, taken once it has finished."""
        self.texts.append(delta.text)
        if delta.logprobs is not None:
            self.logprob_parts.append(delta.logprobs)
        self.finish_reason = delta.finish_reason or self.finish_reason

    @property
    def text(self) -> str:
        return "".join(self.texts)


def _object(request: GenerationRequest, is_chunk: bool) -> str:
    if request.api == "completions":
        return "text_completion"
    return "chat.completion.chunk" if is_chunk else "chat.completion"


def _envelope(
    request: GenerationRequest, request_id: str, created: int, choices: list[dict], is_chunk: bool
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": _object(request, is_chunk),
        "created": created,
        "model": request.model,
        "choices": choices,
    }


def chunk(
    request: GenerationRequest,
    request_id: str,
    created: int,
    index: int,
    delta: ChoiceDelta,
    is_first: bool,
    call_id: str = "",
) -> dict[str, Any]:
    """One SSE event's JSON: what one choice adds now."""
    if request.api == "completions":
        choice = {
            "index": index,
            "text": delta.text,
            "logprobs": delta.logprobs,
            "finish_reason": delta.finish_reason,
        }
        return _envelope(request, request_id, created, [choice], is_chunk=True)
    message: dict[str, Any] = {"role": "assistant"} if is_first else {}
    if delta.text or (is_first and not (delta.arguments or delta.opens_call)):
        message["content"] = delta.text
    calls = [
        {"index": i, **call.as_dict()}
        for i, call in enumerate(delta.tool_calls, start=delta.first_call_index)
    ]
    if delta.arguments or delta.opens_call:
        function: dict[str, str] = {"arguments": delta.arguments}
        head: dict[str, Any] = {"index": 0}
        if delta.opens_call:
            head.update(id=call_id, type="function")
            function["name"] = request.tool_choice.name
        calls.append({**head, "function": function})
    if calls:
        message["tool_calls"] = calls
    logprobs = None if delta.logprobs is None else {"content": delta.logprobs, "refusal": None}
    choice = {
        "index": index,
        "delta": message,
        "logprobs": logprobs,
        "finish_reason": delta.finish_reason,
    }
    return _envelope(request, request_id, created, [choice], is_chunk=True)


def usage_chunk(
    request: GenerationRequest, request_id: str, created: int, usage_body: dict
) -> dict[str, Any]:
    return {**_envelope(request, request_id, created, [], is_chunk=True), "usage": usage_body}


def full_response(
    request: GenerationRequest,
    request_id: str,
    created: int,
    choices: list[Collected],
    usage_body: dict,
) -> dict[str, Any]:
    rendered = []
    for choice in choices:
        if request.api == "completions":
            logprobs = (
                merge_completion_parts(choice.logprob_parts) if choice.logprob_parts else None
            )
            if request.sampling.logprobs is None:
                logprobs = None
            rendered.append(
                {
                    "index": choice.index,
                    "text": choice.text,
                    "logprobs": logprobs,
                    "finish_reason": choice.finish_reason,
                }
            )
            continue
        message: dict[str, Any] = {"role": "assistant", "content": choice.text, "refusal": None}
        if choice.tool_calls:
            message["tool_calls"] = [call.as_dict() for call in choice.tool_calls]
            message["content"] = choice.text.strip() or None
        logprobs = None
        if request.sampling.logprobs is not None:
            logprobs = {
                "content": [entry for part in choice.logprob_parts for entry in part],
                "refusal": None,
            }
        rendered.append(
            {
                "index": choice.index,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": choice.finish_reason,
            }
        )
    return {
        **_envelope(request, request_id, created, rendered, is_chunk=False),
        "usage": usage_body,
    }


class OpenAIRenderer:
    """The Renderer (relay.py) of /v1/completions and /v1/chat/completions."""

    def __init__(self, request: GenerationRequest, request_id: str, created: int) -> None:
        self.request = request
        self.request_id = request_id
        self.created = created

    def stream_start(self) -> list:
        return []

    def stream_delta(self, choice: Choice, delta: ChoiceDelta, is_first: bool) -> list:
        return [
            (
                None,
                chunk(
                    self.request,
                    self.request_id,
                    self.created,
                    choice.index,
                    delta,
                    is_first,
                    choice.call_id,
                ),
            )
        ]

    def stream_end(self, choices: list[Collected], counts: TokenUsage) -> list:
        events: list = []
        if self.request.include_usage:
            events.append(
                (
                    None,
                    usage_chunk(
                        self.request,
                        self.request_id,
                        self.created,
                        usage(counts),
                    ),
                )
            )
        return [*events, (None, "[DONE]")]

    def stream_error(self, message: str) -> list:
        return [
            (
                None,
                {
                    "error": {
                        "message": message,
                        "type": "upstream_error",
                        "param": None,
                        "code": None,
                    }
                },
            ),
            (None, "[DONE]"),
        ]

    def body(self, choices: list[Collected], counts: TokenUsage) -> dict[str, Any]:
        return full_response(
            self.request,
            self.request_id,
            self.created,
            choices,
            usage(counts),
        )
