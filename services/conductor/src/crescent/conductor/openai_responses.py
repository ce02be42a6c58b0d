"""The Responses API (/v1/responses) for text: a string or message items in, one assistant
message of output_text out, whole or as its typed SSE events.

Nothing is stored: previous_response_id, background runs and store=true are refused, as are
tools, reasoning and non-text input, each with a 400 naming the field.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from crescent.conductor.choice import Choice, ChoiceDelta
from crescent.conductor.openai_api import GenerationRequest, parse_common
from crescent.conductor.openai_fields import bad_request, get, refuse
from crescent.conductor.openai_sampling import parse_format
from crescent.conductor.openai_shapes import Collected, TokenUsage
from crescent.conductor.openai_tools import content_text

_UNSUPPORTED = {
    "previous_response_id": (None, ""),
    "conversation": (None,),
    "background": (None, False),
    "store": (None, False),
    "reasoning": (None,),
    "prompt": (None,),
    "include": (None, []),
    "truncation": (None, "disabled"),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
}
_ROLES = ("system", "developer", "user", "assistant")
_PART_TYPES = ("input_text", "output_text")


def _messages(body: Mapping) -> list[dict[str, Any]]:
    messages = []
    instructions = get(body, "instructions", (str,), None)
    if instructions:
        messages.append({"role": "system", "content": instructions})
    items = get(body, "input", (str, list))
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not items:
        raise bad_request("'input' must not be empty", param="input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            raise bad_request(
                f"'{where}' must be a message item; other items (tool calls, reasoning) are not "
                f"supported",
                param=where,
            )
        role = get(item, "role", (str,), param=f"{where}.role")
        if role not in _ROLES:
            raise bad_request(
                f"'{where}.role' {role!r} is not one of {', '.join(_ROLES)}", param=f"{where}.role"
            )
        messages.append(
            {
                "role": role,
                "content": content_text(
                    get(item, "content", (str, list), param=f"{where}.content"),
                    f"{where}.content",
                    _PART_TYPES,
                ),
            }
        )
    return messages


def parse_responses(body: Any) -> GenerationRequest:
    request = parse_common(body, "responses", ("max_output_tokens",), None)
    refuse(body, _UNSUPPORTED)
    request.messages = _messages(body)
    text = get(body, "text", (dict,), {})
    spec = get(text, "format", (dict,), None, param="text.format")
    structured = None if spec is None else parse_format(spec, "text.format", None)
    request.sampling = msgspec.structs.replace(request.sampling, structured=structured)
    return request


class ResponsesRenderer:
    """The Renderer (relay.py) of /v1/responses: one message item with one output_text part."""

    def __init__(self, request: GenerationRequest, request_id: str, created: int) -> None:
        self.request = request
        self.request_id = request_id
        self.created = created
        self.item_id = "msg_" + secrets.token_hex(12)
        self._sequence = 0

    def _response(
        self,
        status: str,
        output: list[dict],
        usage: dict | None = None,
        finish_reason: str | None = None,
    ) -> dict[str, Any]:
        sampling = self.request.sampling
        is_cut = finish_reason == "length"
        return {
            "id": self.request_id,
            "object": "response",
            "created_at": self.created,
            "status": "incomplete" if is_cut and status == "completed" else status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if is_cut else None,
            "instructions": None,
            "max_output_tokens": self.request.max_tokens,
            "model": self.request.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "store": False,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "tool_choice": "none",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "metadata": {},
            "usage": usage,
        }

    def _done_item(self, choice: Collected) -> dict[str, Any]:
        return self._item(
            choice.text, "incomplete" if choice.finish_reason == "length" else "completed"
        )

    def _item(self, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [_part(text)]
        return {
            "type": "message",
            "id": self.item_id,
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def _event(self, kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        self._sequence += 1
        return kind, {"type": kind, "sequence_number": self._sequence - 1, **fields}

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "output_index": 0, "content_index": 0}

    def stream_start(self) -> list:
        response = self._response("in_progress", [])
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
            self._event(
                "response.output_item.added", output_index=0, item=self._item(None, "in_progress")
            ),
            self._event("response.content_part.added", **self._where(), part=_part("")),
        ]

    def stream_delta(self, choice: Choice, delta: ChoiceDelta, is_first: bool) -> list:
        if not delta.text:
            return []
        return [
            self._event(
                "response.output_text.delta", **self._where(), delta=delta.text, logprobs=[]
            )
        ]

    def stream_end(self, choices: Sequence[Collected], counts: TokenUsage) -> list:
        text, finish = choices[0].text, choices[0].finish_reason
        item = self._done_item(choices[0])
        done = self._response("completed", [item], _usage(counts), finish)
        return [
            self._event("response.output_text.done", **self._where(), text=text, logprobs=[]),
            self._event("response.content_part.done", **self._where(), part=_part(text)),
            self._event("response.output_item.done", output_index=0, item=item),
            self._event(f"response.{done['status']}", response=done),
        ]

    def stream_error(self, message: str) -> list:
        return [self._event("error", code="upstream_error", message=message, param=None)]

    def body(self, choices: Sequence[Collected], counts: TokenUsage) -> dict[str, Any]:
        return self._response(
            "completed",
            [self._done_item(choices[0])],
            _usage(counts),
            choices[0].finish_reason,
        )


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _usage(counts: TokenUsage) -> dict[str, Any]:
    return {
        "input_tokens": counts.num_prompt,
        "input_tokens_details": {"cached_tokens": counts.num_cached},
        "output_tokens": counts.num_generated,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": counts.num_prompt + counts.num_generated,
    }
