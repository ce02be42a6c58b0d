"""The OpenAI wire format, requests: /v1/completions and /v1/chat/completions bodies into a
GenerationRequest (the Responses API's are in openai_responses).

Validation is strict on type and range because a bad field that slips through would fail
deep in the cluster, far from the caller; each rejection names the offending parameter. A field
this API knows but does not implement is refused with a 400 naming it rather than ignored, since
the caller would believe it was applied; fields it does not know are ignored, as OpenAI's own
API does. What depends on the model (its vocabulary, context, engine and chat template) is
checked once the model is known (model_checks).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Any

import msgspec

from crescent.common.messages import SamplingParams
from crescent.conductor.openai_fields import (
    INT64_MAX,
    INT64_MIN,
    ApiError,
    bad_request,
    boolean,
    get,
    integer,
    refuse,
    token_count,
)
from crescent.conductor.openai_sampling import parse_logprobs, parse_response_format, parse_sampling
from crescent.conductor.openai_tools import ToolChoice, parse_messages, parse_tools

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "ApiError",
    "GenerationRequest",
    "bad_request",
    "parse_chat",
    "parse_common",
    "parse_completion",
]

MAX_N = 128  # choices per request, as OpenAI allows
# Choices of one /v1/completions request over all its prompts: each is a request through the
# cluster, and one that cannot be placed fails the whole response.
MAX_BATCH_CHOICES = 256
_TOKEN_IDS = list[Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]]

# Fields known and not implemented, with the values that ask for nothing; any other value is a 400.
_UNSUPPORTED = {
    "use_beam_search": (None, False),
    "prompt_logprobs": (None,),
    "structured_outputs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "bad_words": (None, []),
    "allowed_token_ids": (None,),
}
_COMPLETION_UNSUPPORTED = {**_UNSUPPORTED, "suffix": (None, "")}
_CHAT_UNSUPPORTED = {
    **_UNSUPPORTED,
    "functions": (None,),
    "function_call": (None,),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "web_search_options": (None,),
    "reasoning_effort": (None,),
    "store": (None, False),
}


@dataclass
class GenerationRequest:
    """A validated request, whichever endpoint it came through."""

    api: str  # "completions", "chat" or "responses"
    model: str
    prompt_text: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: ToolChoice | None = None  # None: the output is not searched for tool calls
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    n: int = 1
    echo: bool = False
    stream: bool = False
    include_usage: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # A /v1/completions request that sends several prompts (an array of strings or of token-id
    # arrays) has them here, and neither prompt_text nor prompt_token_ids.
    prompt_batch: list[str | list[int]] = field(default_factory=list)

    @property
    def is_chat(self) -> bool:
        """Rendered through the chat template (chat and responses)."""
        return self.api != "completions"

    def one_per_prompt(self) -> list[GenerationRequest]:
        """The request as one request per prompt, in order: its choices are answered as if
        each prompt came alone, their indexes running on from one prompt's to the next's."""
        if not self.prompt_batch:
            return [self]
        return [
            replace(
                self,
                prompt_text=prompt if isinstance(prompt, str) else None,
                prompt_token_ids=prompt if isinstance(prompt, list) else None,
                prompt_batch=[],
            )
            for prompt in self.prompt_batch
        ]


def parse_common(
    body: Any,
    api: str,
    max_tokens_names: tuple[str, ...],
    default_max_tokens: int | None,
) -> GenerationRequest:
    """The fields every endpoint shares. Of several names for max_tokens, the last one given
    wins; each is checked when given."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    request = GenerationRequest(
        api=api, model=get(body, "model", (str,)), max_tokens=default_max_tokens
    )
    for name in max_tokens_names:
        value = token_count(body, name, None)
        request.max_tokens = request.max_tokens if value is None else value
    stop = get(body, "stop", (str, list), [])
    stop = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) and s for s in stop):
        raise bad_request("'stop' must be a non-empty string or an array of them", param="stop")
    request.stop = stop
    request.stream = boolean(body, "stream")
    options = get(body, "stream_options", (dict,), {})
    request.include_usage = boolean(options, "include_usage", param="stream_options.include_usage")
    request.sampling = parse_sampling(body)
    return request


def parse_completion(body: Any) -> GenerationRequest:
    request = parse_common(body, "completions", ("max_tokens",), 16)
    refuse(body, _COMPLETION_UNSUPPORTED)
    request.n = integer(body, "n", 1, 1, MAX_N)
    best_of = get(body, "best_of", (int,), None)
    if best_of is not None and best_of != request.n:
        raise bad_request(
            "'best_of' other than n is not supported: every choice is returned", param="best_of"
        )
    request.echo = boolean(body, "echo")
    num_logprobs = parse_logprobs(get(body, "logprobs", (int,), None), "logprobs")
    request.sampling = msgspec.structs.replace(
        request.sampling,
        logprobs=num_logprobs,
        structured=parse_response_format(body),
        prompt_logprobs=num_logprobs if request.echo else None,
    )
    prompt = get(body, "prompt", (str, list))
    if isinstance(prompt, str):
        request.prompt_text = _text(prompt)
    elif prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) * request.n > MAX_BATCH_CHOICES:
            raise bad_request(
                f"{len(prompt)} prompts with n={request.n} are {len(prompt) * request.n} "
                f"choices; a request may have at most {MAX_BATCH_CHOICES}",
                param="prompt",
            )
        request.prompt_batch = [_text(p) if isinstance(p, str) else _token_ids(p) for p in prompt]
    else:
        request.prompt_token_ids = _token_ids(prompt)
    return request


def _text(prompt: str) -> str:
    if not prompt:
        raise bad_request("'prompt' must not be empty", param="prompt")
    return prompt


def _token_ids(prompt: list[Any]) -> list[int]:
    """A prompt given as token ids. msgspec checks every id in one pass in C (a Python loop
    over an 8,000-id prompt cost milliseconds); only a prompt it refuses is looked at again,
    to say what is wrong with it."""
    if prompt:
        try:
            return msgspec.convert(prompt, _TOKEN_IDS)
        except msgspec.ValidationError:
            pass
    if prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise bad_request(
            "token ids in 'prompt' must be non-negative 64-bit integers", param="prompt"
        )
    raise bad_request(
        "'prompt' must be a non-empty string or array of token ids, or an array of those",
        param="prompt",
    )


def parse_chat(body: Any) -> GenerationRequest:
    # max_completion_tokens wins over max_tokens; both are checked when both are given.
    request = parse_common(body, "chat", ("max_tokens", "max_completion_tokens"), None)
    refuse(body, _CHAT_UNSUPPORTED)
    request.n = integer(body, "n", 1, 1, MAX_N)
    if boolean(body, "echo"):
        raise bad_request("'echo' is a /v1/completions parameter", param="echo")
    wants_logprobs = boolean(body, "logprobs")
    top = get(body, "top_logprobs", (int,), None)
    if top is not None and not wants_logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    num_logprobs = parse_logprobs(top or 0, "top_logprobs") if wants_logprobs else None
    request.messages = parse_messages(get(body, "messages", (list,)))
    request.tools, request.tool_choice, tool_grammar = parse_tools(body)
    structured = parse_response_format(body)
    if tool_grammar is not None and structured is not None:
        raise bad_request(
            "'response_format' cannot be combined with a tool_choice that forces a call",
            param="response_format",
        )
    request.sampling = msgspec.structs.replace(
        request.sampling, logprobs=num_logprobs, structured=structured or tool_grammar
    )
    return request
