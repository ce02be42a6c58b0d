"""Chat messages and tools: validating them into what the chat template renders, and the
grammar that a tool_choice forcing a call puts on the output.

Content may be a string or a list of text parts (joined with newlines, as vLLM does). A forced
call is structured output: tool_choice naming a function makes the output that function's
arguments (an object of its `parameters` schema); "required" makes it a JSON array of
{"name", "parameters"} calls, one at most without parallel_tool_calls. "auto" leaves the
output free, and calls are parsed from it (tool_calls.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crescent.common.messages import StructuredOutput
from crescent.conductor.openai_fields import bad_request, boolean, get
from crescent.conductor.openai_sampling import check_json_schema

ROLES = ("system", "developer", "user", "assistant", "tool")
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # "auto": the model may call; "required": it must; "function": it must call `name`
    name: str | None = None
    is_parallel: bool = True


def content_text(content: Any, param: str, part_types: tuple[str, ...] = ("text",)) -> str:
    """A message's content as text: a string, or text parts joined with newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"'{param}' must be a string or an array of text parts", param=param)
    texts = []
    for i, part in enumerate(content):
        where = f"{param}[{i}]"
        if not isinstance(part, dict):
            raise bad_request(f"'{where}' must be an object", param=where)
        kind = get(part, "type", (str,), param=f"{where}.type")
        if kind not in part_types:
            raise bad_request(
                f"'{where}.type' {kind!r} is not supported: this model takes text parts only "
                f"({', '.join(part_types)})",
                param=f"{where}.type",
            )
        texts.append(get(part, "text", (str,), param=f"{where}.text"))
    return "\n".join(texts)


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise bad_request(f"'{where}' must be an object", param=where)
    function = get(call, "function", (dict,), param=f"{where}.function")
    arguments = get(function, "arguments", (str,), param=f"{where}.function.arguments")
    try:
        parsed: Any = json.loads(arguments)
    except ValueError:
        parsed = (
            arguments  # templates render what the model was given back; OpenAI takes any string
        )
    return {
        "id": get(call, "id", (str,), "", param=f"{where}.id"),
        "type": "function",
        "function": {
            "name": get(function, "name", (str,), param=f"{where}.function.name"),
            "arguments": parsed,
        },
    }


def parse_messages(messages: list) -> list[dict[str, Any]]:
    """The messages as the chat template takes them (tool call arguments as objects)."""
    if not messages:
        raise bad_request("'messages' must not be empty", param="messages")
    rendered = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"'{where}' must be an object with a 'role'", param=where)
        role = get(message, "role", (str,), param=f"{where}.role")
        if role not in ROLES:
            raise bad_request(
                f"'{where}.role' {role!r} is not one of {', '.join(ROLES)}", param=f"{where}.role"
            )
        calls = (
            get(message, "tool_calls", (list,), [], param=f"{where}.tool_calls")
            if role == "assistant"
            else []
        )
        content = message.get("content")
        if content is None and not (role == "assistant" and calls):
            raise bad_request(
                f"'{where}.content' is required",
                param=f"{where}.content",
                code="missing_required_parameter",
            )
        entry: dict[str, Any] = {
            "role": role,
            "content": None if content is None else content_text(content, f"{where}.content"),
        }
        if calls:
            entry["tool_calls"] = [
                _tool_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)
            ]
        if role == "tool":
            entry["tool_call_id"] = get(
                message, "tool_call_id", (str,), "", param=f"{where}.tool_call_id"
            )
        name = get(message, "name", (str,), None, param=f"{where}.name")
        if name is not None:
            entry["name"] = name
        rendered.append(entry)
    return rendered


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise bad_request(
            f'\'{where}\' must be a function tool ({{"type": "function", ...}})', param=where
        )
    function = get(tool, "function", (dict,), param=f"{where}.function")
    name = get(function, "name", (str,), param=f"{where}.function.name")
    if not _FUNCTION_NAME.fullmatch(name):
        raise bad_request(
            f"'{where}.function.name' must be 1-64 letters, digits, '_', '.' or '-'",
            param=f"{where}.function.name",
        )
    parameters = get(
        function, "parameters", (dict,), _EMPTY_PARAMETERS, param=f"{where}.function.parameters"
    )
    check_json_schema(parameters, f"{where}.function.parameters")
    described = {"name": name, "parameters": parameters}
    description = get(function, "description", (str,), None, param=f"{where}.function.description")
    if description is not None:
        described["description"] = description
    return {"type": "function", "function": described}


def _choice(body: Mapping, tools: list[dict[str, Any]]) -> ToolChoice | None:
    choice = get(body, "tool_choice", (str, dict), "auto" if tools else "none")
    if not tools and choice != "none":
        raise bad_request("'tool_choice' needs 'tools'", param="tool_choice")
    is_parallel = boolean(body, "parallel_tool_calls", True)
    if choice == "none":
        return None
    if choice in ("auto", "required"):
        return ToolChoice(choice, is_parallel=is_parallel)
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = get(
            get(choice, "function", (dict,), param="tool_choice.function"),
            "name",
            (str,),
            param="tool_choice.function.name",
        )
        if name not in {t["function"]["name"] for t in tools}:
            raise bad_request(
                f"'tool_choice' names {name!r}, which is not among the tools",
                param="tool_choice.function.name",
            )
        return ToolChoice("function", name, is_parallel)
    raise bad_request(
        '\'tool_choice\' must be none, auto, required or {"type": "function", ...}',
        param="tool_choice",
    )


def forced_grammar(
    tools: list[dict[str, Any]], choice: ToolChoice | None
) -> StructuredOutput | None:
    """The grammar of a tool_choice that forces a call; None when the output is free."""
    if choice is None or choice.mode == "auto":
        return None
    functions = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    if choice.mode == "function":
        schema: dict[str, Any] = functions[choice.name]
    else:
        calls = [
            {
                "properties": {
                    "name": {"type": "string", "enum": [name]},
                    "parameters": parameters,
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for name, parameters in functions.items()
        ]
        schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": calls}}
        if not choice.is_parallel:
            schema["maxItems"] = 1
    return StructuredOutput(json_schema=json.dumps(schema, separators=(",", ":")))


def parse_tools(
    body: Mapping,
) -> tuple[list[dict[str, Any]], ToolChoice | None, StructuredOutput | None]:
    """The tools (as the template renders them), the tool choice, and its grammar if it forces
    one."""
    tools = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(get(body, "tools", (list,), []))]
    choice = _choice(body, tools)
    return tools, choice, forced_grammar(tools, choice)
