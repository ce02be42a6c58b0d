"""The sampling fields of a request body, into the SamplingParams the cluster carries, and
structured output (`response_format`) into a StructuredOutput.

Ranges here are the API's (OpenAI's where it has one, vLLM's for its own extensions); what
depends on the model (token ids within its vocabulary) is checked once the model is known.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from crescent.common.bounds import MAX_SCHEMA_CHARS, MAX_STOP_TOKENS
from crescent.common.messages import SamplingParams, StructuredOutput
from crescent.conductor.openai_fields import (
    INT64_MAX,
    INT64_MIN,
    bad_request,
    boolean,
    get,
    integer,
    number,
    shown,
)

MAX_LOGPROBS = 20  # alternatives per token (OpenAI's top_logprobs limit, vLLM's default)
MAX_REPETITION_PENALTY = 10.0
MAX_TOP_K = 2**31 - 1


def parse_sampling(body: Mapping) -> SamplingParams:
    """Every sampling field but logprobs and structured output, which differ by endpoint."""
    seed = get(body, "seed", (int,), None)
    if seed is not None and not INT64_MIN <= seed <= INT64_MAX:
        raise bad_request(
            f"'seed' must be a 64-bit signed integer, got {shown(seed)}", param="seed"
        )
    top_k = integer(body, "top_k", 0, -1, MAX_TOP_K)
    return SamplingParams(
        temperature=number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=number(body, "top_p", 1.0, 0.0, 1.0, low_is_open=True),
        top_k=top_k,
        min_p=number(body, "min_p", 0.0, 0.0, 1.0),
        seed=seed,
        ignore_eos=boolean(body, "ignore_eos"),
        min_tokens=integer(body, "min_tokens", 0, 0, INT64_MAX),
        presence_penalty=number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=number(
            body, "repetition_penalty", 1.0, 0.0, MAX_REPETITION_PENALTY, low_is_open=True
        ),
        logit_bias=_logit_bias(body),
        stop_token_ids=_stop_token_ids(body),
    )


def _logit_bias(body: Mapping) -> dict[int, float]:
    """OpenAI's {"<token id>": bias} with bias in [-100, 100]; ids are checked against the
    vocabulary later."""
    raw = get(body, "logit_bias", (dict,), {})
    bias: dict[int, float] = {}
    for key in raw:
        if not (key.isascii() and key.isdigit()) or int(key) > INT64_MAX:
            raise bad_request(
                f"'logit_bias' keys must be token ids, got {shown(key)!r}", param="logit_bias"
            )
        bias[int(key)] = number(raw, key, 0.0, -100.0, 100.0, param=f"logit_bias.{shown(key)}")
    return bias


def _stop_token_ids(body: Mapping) -> list[int]:
    ids = get(body, "stop_token_ids", (list,), [])
    if len(ids) > MAX_STOP_TOKENS or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT64_MAX for t in ids
    ):
        raise bad_request(
            f"'stop_token_ids' must be an array of at most {MAX_STOP_TOKENS} token ids",
            param="stop_token_ids",
        )
    return list(ids)


def parse_logprobs(value: int | None, param: str) -> int | None:
    """How many alternatives per token (None: no logprobs at all)."""
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise bad_request(
            f"'{param}' must be between 0 and {MAX_LOGPROBS}, got {shown(value)}", param=param
        )
    return value


def check_json_schema(schema: Any, param: str) -> str:
    """`schema` as JSON text, once it is a valid JSON Schema (its metaschema's check)."""
    import jsonschema

    if not isinstance(schema, dict):
        raise bad_request(f"'{param}' must be a JSON Schema object", param=param)
    if not isinstance(schema.get("$schema", ""), str):  # names the metaschema to check against
        raise bad_request(f"'{param}.$schema' must be a string", param=param)
    try:
        jsonschema.validators.validator_for(
            schema, default=jsonschema.Draft202012Validator
        ).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise bad_request(
            f"'{param}' is not a valid JSON Schema: {exc.message}", param=param
        ) from exc
    text = json.dumps(schema, separators=(",", ":"))
    if len(text) > MAX_SCHEMA_CHARS:
        raise bad_request(f"'{param}' is longer than {MAX_SCHEMA_CHARS} characters", param=param)
    return text


def parse_format(spec: Mapping, param: str, schema_holder: str | None) -> StructuredOutput | None:
    """A response format {"type": "text" | "json_object" | "json_schema", ...}. Chat nests the
    schema's fields under "json_schema" (`schema_holder`); the Responses API does not (None)."""
    kind = get(spec, "type", (str,), param=f"{param}.type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(json_object=True)
    if kind != "json_schema":
        raise bad_request(
            f"'{param}.type' must be text, json_object or json_schema, got {kind!r}",
            param=f"{param}.type",
        )
    holder, where = spec, param
    if schema_holder is not None:
        holder, where = (
            get(spec, schema_holder, (dict,), param=f"{param}.{schema_holder}"),
            f"{param}.{schema_holder}",
        )
    get(holder, "name", (str,), param=f"{where}.name")
    schema = get(holder, "schema", (dict,), {}, param=f"{where}.schema")
    return StructuredOutput(json_schema=check_json_schema(schema, f"{where}.schema"))


def parse_response_format(body: Mapping) -> StructuredOutput | None:
    spec = get(body, "response_format", (dict,), None)
    return None if spec is None else parse_format(spec, "response_format", "json_schema")
