"""The OpenAPI 3.0 description the conductor serves at /openapi.json.

It describes the subset of OpenAI's API that openai_api.py and openai_responses.py accept,
with the same ranges, so clients and API fuzzers can generate requests from it. What depends
on the model (token ids within its vocabulary, tools where its template renders them, what its
engine can apply) is a 400 the document cannot foresee. Kept by hand, as it is small; the e2e
test runs schemathesis against it, which fails where the parser refuses what the document
calls valid or takes what it calls invalid.
"""

from __future__ import annotations

from typing import Any

from crescent.common.bounds import MAX_STOP_TOKENS
from crescent.conductor.openai_api import INT64_MAX, INT64_MIN, MAX_BATCH_CHOICES, MAX_N
from crescent.conductor.openai_sampling import MAX_LOGPROBS, MAX_REPETITION_PENALTY, MAX_TOP_K

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string", "nullable": True},
            },
        }
    },
}

# OpenAPI 3.0's way to say JSON null: the parser takes a null optional field as absent.
_NULL = {"type": "string", "nullable": True, "enum": [None]}


def _optional(schema: dict) -> dict:
    if "type" in schema:
        return {**schema, "nullable": True}
    return {"oneOf": [*schema["oneOf"], _NULL]}


_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
}
_TEXT_CONTENT = {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]}

_STOP = {
    "oneOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}},
    ]
}

_TOKEN_ID = {"type": "integer", "minimum": 0, "maximum": INT64_MAX}
_SCHEMA = {"type": "object", "description": "a JSON Schema"}
_JSON_SCHEMA_FORMAT = {
    "name": {"type": "string"},
    "description": {"type": "string"},
    "schema": _SCHEMA,
    "strict": {"type": "boolean", "nullable": True},
}
_RESPONSE_FORMAT = {
    "oneOf": [
        {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"type": "string", "enum": ["text"]}},
        },
        {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"type": "string", "enum": ["json_object"]}},
        },
        {
            "type": "object",
            "required": ["type", "json_schema"],
            "properties": {
                "type": {"type": "string", "enum": ["json_schema"]},
                "json_schema": {
                    "type": "object",
                    "required": ["name"],
                    "properties": _JSON_SCHEMA_FORMAT,
                },
            },
        },
    ]
}
_COMMON = {
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1},
    "top_k": {
        "type": "integer",
        "minimum": -1,
        "maximum": MAX_TOP_K,
        "description": "0 or -1: every token",
    },
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "seed": {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX},
    "stop": _STOP,
    "stop_token_ids": {"type": "array", "maxItems": MAX_STOP_TOKENS, "items": _TOKEN_ID},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "repetition_penalty": {
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": MAX_REPETITION_PENALTY,
    },
    "logit_bias": {
        "type": "object",
        "description": "token id (decimal) to a bias",
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
    },
    "min_tokens": {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
    "stream": {"type": "boolean"},
    "stream_options": {
        "type": "object",
        "properties": {"include_usage": {"type": "boolean", "nullable": True}},
    },
    "ignore_eos": {
        "type": "boolean",
        "description": "generate max_tokens even past end-of-sequence",
    },
}
_SAMPLING = {
    name: _optional(schema)
    for name, schema in {
        **_COMMON,
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
        "n": {"type": "integer", "minimum": 1, "maximum": MAX_N},
        "response_format": _RESPONSE_FORMAT,
    }.items()
}
_MODEL = {"type": "string", "description": "a model from /v1/models"}

_MODEL_OBJECT = {
    "type": "object",
    "required": ["id"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string"},
        "max_model_len": {"type": "integer"},
    },
}
_TEXT_PROMPT = {"type": "string", "minLength": 1}
_TOKEN_PROMPT = {"type": "array", "minItems": 1, "items": _TOKEN_ID}
_COMPLETION_REQUEST = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        **_SAMPLING,
        "model": _MODEL,
        "echo": _optional({"type": "boolean"}),
        "logprobs": _optional({"type": "integer", "minimum": 0, "maximum": MAX_LOGPROBS}),
        "prompt": {
            "oneOf": [
                _TEXT_PROMPT,
                _TOKEN_PROMPT,
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_BATCH_CHOICES,
                    "items": {"oneOf": [_TEXT_PROMPT, _TOKEN_PROMPT]},
                },
            ]
        },
    },
}

_CHAT_REQUEST = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        **_SAMPLING,
        "model": _MODEL,
        "max_completion_tokens": _optional({"type": "integer", "minimum": 1, "maximum": INT64_MAX}),
        "logprobs": _optional({"type": "boolean"}),
        "top_logprobs": _optional(
            {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_LOGPROBS,
                "description": "needs logprobs: true",
            }
        ),
        "tools": _optional(
            {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type", "function"],
                    "properties": {
                        "type": {"type": "string", "enum": ["function"]},
                        "function": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
                                "description": {"type": "string"},
                                "parameters": _SCHEMA,
                            },
                        },
                    },
                },
            }
        ),
        "tool_choice": _optional(
            {
                "oneOf": [
                    {"type": "string", "enum": ["none", "auto", "required"]},
                    {
                        "type": "object",
                        "required": ["type", "function"],
                        "properties": {
                            "type": {"type": "string", "enum": ["function"]},
                            "function": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {"name": {"type": "string"}},
                            },
                        },
                    },
                ]
            }
        ),
        "parallel_tool_calls": _optional({"type": "boolean"}),
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {
                        "type": "string",
                        "enum": ["system", "user", "assistant", "tool", "developer"],
                    },
                    "content": _TEXT_CONTENT,
                    "name": {"type": "string"},
                    "tool_call_id": {"type": "string"},
                },
            },
        },
    },
}

_RESPONSES_REQUEST = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        **{name: _optional(schema) for name, schema in _COMMON.items()},
        "model": _MODEL,
        "instructions": _optional({"type": "string"}),
        "max_output_tokens": _optional({"type": "integer", "minimum": 1, "maximum": INT64_MAX}),
        "text": {
            "type": "object",
            "properties": {
                "format": _optional(
                    {
                        "oneOf": [
                            {
                                "type": "object",
                                "required": ["type"],
                                "properties": {
                                    "type": {"type": "string", "enum": ["text", "json_object"]}
                                },
                            },
                            {
                                "type": "object",
                                "required": ["type", "name"],
                                "properties": {
                                    "type": {"type": "string", "enum": ["json_schema"]},
                                    **_JSON_SCHEMA_FORMAT,
                                },
                            },
                        ]
                    }
                )
            },
        },
        "input": {
            "oneOf": [
                {"type": "string"},
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["role", "content"],
                        "properties": {
                            "type": {"type": "string", "enum": ["message"]},
                            "role": {
                                "type": "string",
                                "enum": ["system", "developer", "user", "assistant"],
                            },
                            "content": {
                                "oneOf": [
                                    {"type": "string"},
                                    {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["type", "text"],
                                            "properties": {
                                                "type": {
                                                    "type": "string",
                                                    "enum": ["input_text", "output_text"],
                                                },
                                                "text": {"type": "string"},
                                            },
                                        },
                                    },
                                ]
                            },
                        },
                    },
                },
            ]
        },
    },
}

_OUTPUT = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"type": "string"},
        "role": {"type": "string"},
        "content": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"type": {"type": "string"}, "text": {"type": "string"}},
            },
        },
    },
}
_RESPONSE = {
    "type": "object",
    "required": ["id", "object", "status", "output"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["response"]},
        "status": {"type": "string", "enum": ["completed", "incomplete"]},
        "model": {"type": "string"},
        "output": {"type": "array", "items": _OUTPUT},
        "usage": {
            "type": "object",
            "properties": {
                name: {"type": "integer"}
                for name in ("input_tokens", "output_tokens", "total_tokens")
            },
        },
    },
}

_USAGE = {
    "type": "object",
    "properties": {
        **{
            name: {"type": "integer"}
            for name in ("prompt_tokens", "completion_tokens", "total_tokens")
        },
        "prompt_tokens_details": {
            "type": "object",
            "properties": {"cached_tokens": {"type": "integer"}},
        },
    },
}


def _response(kind: str, choice: dict) -> dict:
    return {
        "type": "object",
        "required": ["id", "object", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "enum": [kind]},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "items": choice},
            "usage": _USAGE,
        },
    }


_FINISH = {"type": "string", "nullable": True}
_COMPLETION = _response(
    "text_completion",
    {
        "type": "object",
        "properties": {
            "index": {"type": "integer"},
            "text": {"type": "string"},
            "finish_reason": _FINISH,
        },
    },
)
_CHAT = _response(
    "chat.completion",
    {
        "type": "object",
        "properties": {
            "index": {"type": "integer"},
            "finish_reason": _FINISH,
            "message": {
                "type": "object",
                "properties": {
                    "role": {"type": "string"},
                    "content": {"type": "string", "nullable": True},
                    "tool_calls": {"type": "array", "items": {"type": "object"}},
                },
            },
        },
    },
)


# One server-sent event: its data is a chunk of the response as JSON, the last one "[DONE]".
_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _errors(*statuses: int) -> dict:
    return {
        str(status): {
            "description": description,
            "content": _json({"$ref": "#/components/schemas/Error"}),
        }
        for status, description in [
            (400, "invalid request"),
            (404, "unknown model"),
            (408, "the body did not arrive in time"),
            (413, "body too large"),
            (415, "not UTF-8 JSON"),
            (429, "over the SLOs now; retry later"),
            (502, "an instance failed"),
            (503, "no instance for this model"),
            (504, "the cluster did not answer in time"),
        ]
        if status in statuses
    }


def _generation(summary: str, request: dict, response: dict) -> dict:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": _json(request)},
            "responses": {
                "200": {
                    "description": "the whole response, or an SSE stream of chunks when "
                    "stream is true",
                    "content": {**_json(response), "text/event-stream": {"schema": _EVENT}},
                },
                **_errors(400, 404, 408, 413, 415, 429, 502, 503, 504),
            },
        }
    }


OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {
        "title": "Crescent conductor",
        "version": "1",
        "description": "The OpenAI-compatible API of a Crescent cluster.",
    },
    "paths": {
        "/v1/completions": _generation("Complete a prompt", _COMPLETION_REQUEST, _COMPLETION),
        "/v1/chat/completions": _generation("Answer a conversation", _CHAT_REQUEST, _CHAT),
        "/v1/responses": _generation(
            "Answer text input (the Responses API; nothing is stored)",
            _RESPONSES_REQUEST,
            _RESPONSE,
        ),
        "/v1/models": {
            "get": {
                "summary": "Models with a registered prefill and decode instance",
                "responses": {
                    "200": {
                        "description": "the served models",
                        "content": _json(
                            {
                                "type": "object",
                                "required": ["object", "data"],
                                "properties": {
                                    "object": {"type": "string", "enum": ["list"]},
                                    "data": {
                                        "type": "array",
                                        "items": _MODEL_OBJECT,
                                    },
                                },
                            }
                        ),
                    }
                },
            }
        },
        "/v1/models/{model}": {
            "get": {
                "summary": "One model with a registered prefill and decode instance",
                "parameters": [
                    {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": {"description": "the model", "content": _json(_MODEL_OBJECT)},
                    **_errors(404),
                },
            }
        },
    },
    "components": {"schemas": {"Error": _ERROR}},
}
