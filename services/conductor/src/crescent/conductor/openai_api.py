"""The OpenAI wire format: validating request bodies and shaping responses and SSE chunks.

Validation is strict on type and range because a bad field that slips through would fail
deep in the cluster, far from the caller; each rejection names the offending parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ApiError(Exception):
    """An error the client caused or must see, rendered as OpenAI's error body."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass
class GenerationRequest:
    is_chat: bool
    model: str
    prompt_text: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False


_MISSING = object()
# Integers the cluster carries are 64-bit (msgpack; vLLM's seed is a torch int64). JSON's
# are not, so every one is checked against this range before it goes anywhere.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _field(body: dict, name: str, kinds: tuple[type, ...], default: Any = _MISSING) -> Any:
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        if default is _MISSING:
            raise bad_request(f"'{name}' is required", param=name, code="missing_required_parameter")
        return default
    # bool is an int in Python; a JSON true is never a valid number here.
    if isinstance(value, bool) and bool not in kinds:
        raise bad_request(f"'{name}' must be {_kind_names(kinds)}, got a boolean", param=name)
    if not isinstance(value, kinds):
        raise bad_request(f"'{name}' must be {_kind_names(kinds)}, got {type(value).__name__}", param=name)
    return value


def _kind_names(kinds: tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "an array",
             dict: "an object"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _shown(value: float) -> str:
    """A number as an error message quotes it: JSON integers may have thousands of digits."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}… ({len(text)} characters)"


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = _field(body, name, (int, float), default)
    # Compared before float(): an integer too large for a float would overflow it. NaN fails too.
    if not low <= value <= high:
        raise bad_request(f"'{name}' must be between {low} and {high}, got {_shown(value)}", param=name)
    return float(value)


def _token_count(body: dict, name: str, default: int | None) -> int | None:
    value = _field(body, name, (int,), default)
    if value is not None and not 1 <= value <= INT64_MAX:
        raise bad_request(f"'{name}' must be between 1 and {INT64_MAX}, got {_shown(value)}", param=name)
    return value


def _common(body: Any, is_chat: bool) -> GenerationRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    request = GenerationRequest(is_chat=is_chat, model=_field(body, "model", (str,)))
    # Chat's max_completion_tokens wins over max_tokens; both are checked when both are given.
    max_tokens = _token_count(body, "max_tokens", None if is_chat else 16)
    completion_tokens = _token_count(body, "max_completion_tokens", None) if is_chat else None
    request.max_tokens = max_tokens if completion_tokens is None else completion_tokens
    request.temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    request.top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    request.seed = _field(body, "seed", (int,), None)
    if request.seed is not None and not INT64_MIN <= request.seed <= INT64_MAX:
        raise bad_request(f"'seed' must be a 64-bit signed integer, got {_shown(request.seed)}", param="seed")
    stop = _field(body, "stop", (str, list), [])
    stop = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) and s for s in stop):
        raise bad_request("'stop' must be a non-empty string or an array of them", param="stop")
    request.stop = stop
    n = _field(body, "n", (int,), 1)
    if n != 1:
        raise bad_request("only n=1 is supported", param="n")
    request.stream = _field(body, "stream", (bool,), False)
    options = _field(body, "stream_options", (dict,), {})
    request.include_usage = _field(options, "include_usage", (bool,), False)
    request.ignore_eos = _field(body, "ignore_eos", (bool,), False)
    return request


def parse_completion(body: Any) -> GenerationRequest:
    request = _common(body, is_chat=False)
    prompt = _field(body, "prompt", (str, list))
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("'prompt' must not be empty", param="prompt")
        request.prompt_text = prompt
    elif prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not all(0 <= t <= INT64_MAX for t in prompt):
            raise bad_request("token ids in 'prompt' must be non-negative 64-bit integers", param="prompt")
        request.prompt_token_ids = list(prompt)
    elif prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_request("batched prompts are not supported: send one prompt per request", param="prompt")
    else:
        raise bad_request("'prompt' must be a non-empty string or array of token ids", param="prompt")
    return request


def parse_chat(body: Any) -> GenerationRequest:
    request = _common(body, is_chat=True)
    messages = _field(body, "messages", (list,))
    if not messages:
        raise bad_request("'messages' must not be empty", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise bad_request(f"messages[{i}] must be an object with string 'role' and 'content'",
                              param=f"messages[{i}]")
        if message["role"] not in ("system", "user", "assistant", "tool", "developer"):
            raise bad_request(f"messages[{i}].role {message['role']!r} is not a known role", param=f"messages[{i}]")
    request.messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    return request


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chunk(request: GenerationRequest, request_id: str, created: int, text: str,
          finish_reason: str | None, is_first: bool) -> dict[str, Any]:
    """One SSE event's JSON for a streaming response."""
    if request.is_chat:
        delta: dict[str, str] = {"role": "assistant"} if is_first else {}
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"id": request_id, "object": "chat.completion.chunk", "created": created,
                "model": request.model, "choices": [choice]}
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {"id": request_id, "object": "text_completion", "created": created, "model": request.model,
            "choices": [choice]}


def usage_chunk(request: GenerationRequest, request_id: str, created: int, usage_body: dict) -> dict[str, Any]:
    kind = "chat.completion.chunk" if request.is_chat else "text_completion"
    return {"id": request_id, "object": kind, "created": created, "model": request.model, "choices": [],
            "usage": usage_body}


def full_response(request: GenerationRequest, request_id: str, created: int, text: str,
                  finish_reason: str | None, usage_body: dict) -> dict[str, Any]:
    if request.is_chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    return {"id": request_id, "object": kind, "created": created, "model": request.model,
            "choices": [choice], "usage": usage_body}
