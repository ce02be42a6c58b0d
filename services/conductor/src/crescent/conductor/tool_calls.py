"""Tool calls out of a model's text.

Free output (tool_choice "auto") is parsed in the Hermes format the tiny model's chat template
asks for, which many instruction-tuned checkpoints use: each call a JSON object
{"name": ..., "arguments": {...}} between <tool_call> and </tool_call>; text outside the blocks
is content. A block that is not such an object stays content. Forced output (tool_choice
"required" or a named function) follows a grammar, so it is parsed as JSON directly.

Streaming holds back text that may be the start of a <tool_call> tag, as stop strings are held
back, and sends each call whole once its closing tag (or the end of the output) arrives.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI returns it
    id: str = field(default_factory=new_call_id)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def _call(block: str) -> ToolCall | None:
    try:
        value = json.loads(block)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ToolCall(
        value["name"], arguments if isinstance(arguments, str) else json.dumps(arguments)
    )


def parse_forced(text: str, function_name: str | None) -> list[ToolCall]:
    """Calls from output under a forcing grammar: a named function's arguments object, or
    ("required") an array of {"name", "parameters"}. Output cut short parses to no call."""
    if function_name is not None:
        return [ToolCall(function_name, text.strip())]
    try:
        value = json.loads(text)
    except ValueError:
        return []
    calls = [_call(json.dumps(item)) for item in value] if isinstance(value, list) else []
    return [call for call in calls if call is not None]


class HermesParser:
    """Feeds on text as it streams; `push` and `finish` return the content that can be shown and
    the calls completed so far."""

    def __init__(self) -> None:
        self._pending = ""
        self._in_call = False
        self.calls: list[ToolCall] = []

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        self._pending += text
        content, new_calls = [], []
        while True:
            if self._in_call:
                end = self._pending.find(CLOSE)
                if end < 0:
                    break
                block, self._pending = self._pending[:end], self._pending[end + len(CLOSE) :]
                self._in_call = False
                self._take(block, content, new_calls, is_closed=True)
            else:
                start = self._pending.find(OPEN)
                if start < 0:
                    keep = _partial_tag_length(self._pending)
                    cut = len(self._pending) - keep
                    content.append(self._pending[:cut])
                    self._pending = self._pending[cut:]
                    break
                content.append(self._pending[:start])
                self._pending = self._pending[start + len(OPEN) :]
                self._in_call = True
        return "".join(content), new_calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """What is left once the output has ended: an unclosed block is a call if it parses."""
        content: list[str] = []
        new_calls: list[ToolCall] = []
        if self._in_call:
            self._take(self._pending, content, new_calls, is_closed=False)
        else:
            content.append(self._pending)
        self._pending, self._in_call = "", False
        return "".join(content), new_calls

    def _take(
        self, block: str, content: list[str], new_calls: list[ToolCall], is_closed: bool
    ) -> None:
        call = _call(block.strip())
        if call is None:
            content.append(OPEN + block + (CLOSE if is_closed else ""))
        else:
            self.calls.append(call)
            new_calls.append(call)


def _partial_tag_length(text: str) -> int:
    """Length of the longest tail of `text` that starts the opening tag."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0
