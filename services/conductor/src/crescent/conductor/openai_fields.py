"""Reading one field of a JSON request body: OpenAI's error for a bad one, naming the parameter.

JSON integers have no size limit, so every number is range-checked before it goes anywhere;
a boolean is never taken for a number (Python's bool is an int).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ApiError(Exception):
    """An error the client caused or must see, rendered as OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


# Integers the cluster carries are 64-bit (msgpack; vLLM's seed is a torch int64).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_MISSING = object()
_KIND_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "an array",
    dict: "an object",
}


def get(
    body: Mapping,
    name: str,
    kinds: tuple[type, ...],
    default: Any = _MISSING,
    param: str | None = None,
) -> Any:
    """body[name], of one of `kinds`; a missing or null field is `default` (required if none).
    `param` is how errors name the field (default: `name`)."""
    param = param or name
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        if default is _MISSING:
            raise bad_request(
                f"'{param}' is required", param=param, code="missing_required_parameter"
            )
        return default
    if isinstance(value, bool) and bool not in kinds:
        raise bad_request(f"'{param}' must be {kind_names(kinds)}, got a boolean", param=param)
    if not isinstance(value, kinds):
        raise bad_request(
            f"'{param}' must be {kind_names(kinds)}, got {type(value).__name__}", param=param
        )
    return value


def kind_names(kinds: tuple[type, ...]) -> str:
    return " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)


def shown(value: Any) -> str:
    """A value as an error message quotes it: JSON integers may have thousands of digits."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}… ({len(text)} characters)"


def number(
    body: Mapping,
    name: str,
    default: float,
    low: float,
    high: float,
    param: str | None = None,
    low_is_open: bool = False,
) -> float:
    """A number in [low, high] (or (low, high] when low_is_open)."""
    param = param or name
    value = get(body, name, (int, float), default, param)
    # Compared before float(): an integer too large for a float would overflow it. NaN fails too.
    is_above_low = value > low if low_is_open else value >= low
    if not (is_above_low and value <= high):
        bracket = "(" if low_is_open else "["
        raise bad_request(
            f"'{param}' must be in {bracket}{low}, {high}], got {shown(value)}", param=param
        )
    return float(value)


def integer(
    body: Mapping, name: str, default: int | None, low: int, high: int, param: str | None = None
) -> int | None:
    param = param or name
    value = get(body, name, (int,), default, param)
    if value is not None and not low <= value <= high:
        raise bad_request(
            f"'{param}' must be between {low} and {high}, got {shown(value)}", param=param
        )
    return value


def token_count(body: Mapping, name: str, default: int | None) -> int | None:
    return integer(body, name, default, 1, INT64_MAX)


def boolean(body: Mapping, name: str, default: bool = False, param: str | None = None) -> bool:
    return get(body, name, (bool,), default, param)


def refuse(body: Mapping, neutral_values: Mapping[str, tuple]) -> None:
    """400 for a field this API knows but does not implement, unless it holds a value that asks
    for nothing (null, false, an empty string...)."""
    for name, neutral in neutral_values.items():
        if name in body and body[name] not in neutral:
            raise bad_request(
                f"'{name}' is not supported by this server",
                param=name,
                code="unsupported_parameter",
            )
