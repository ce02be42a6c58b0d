"""Every request field is honoured or refused with a 400 naming it (issue 12): the sampling
fields, logprobs, response_format, tools and tool_choice, chat content parts, the Responses
API's input; unknown fields are ignored, as OpenAI does."""

import json

import pytest

from crescent.common.messages import StructuredOutput
from crescent.conductor.openai_api import ApiError, parse_chat, parse_completion
from crescent.conductor.openai_responses import parse_responses

CHAT = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
COMPLETION = {"model": "m", "prompt": "x"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "today's weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def refused(parse, body: dict) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(body)
    assert info.value.status == 400
    return info.value


def test_sampling_fields_reach_the_sampling_params():
    request = parse_completion(
        {
            **COMPLETION,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "min_p": 0.05,
            "seed": 7,
            "presence_penalty": 0.5,
            "frequency_penalty": -1.0,
            "repetition_penalty": 1.2,
            "logit_bias": {"17": -100, "3": 2.5},
            "min_tokens": 2,
            "stop_token_ids": [5, 6],
            "ignore_eos": True,
            "logprobs": 3,
            "n": 3,
        }
    )
    sampling = request.sampling
    assert (
        sampling.temperature,
        sampling.top_p,
        sampling.top_k,
        sampling.min_p,
        sampling.seed,
    ) == (0.5, 0.9, 40, 0.05, 7)
    assert (sampling.presence_penalty, sampling.frequency_penalty, sampling.repetition_penalty) == (
        0.5,
        -1.0,
        1.2,
    )
    assert sampling.logit_bias == {17: -100.0, 3: 2.5}
    assert (sampling.min_tokens, sampling.stop_token_ids, sampling.ignore_eos) == (2, [5, 6], True)
    assert sampling.logprobs == 3 and sampling.prompt_logprobs is None and request.n == 3


def test_echo_with_logprobs_asks_for_the_prompts_logprobs():
    request = parse_completion({**COMPLETION, "echo": True, "logprobs": 1})
    assert request.echo and request.sampling.prompt_logprobs == 1
    assert parse_completion({**COMPLETION, "echo": True}).sampling.prompt_logprobs is None


def test_chat_logprobs_and_top_logprobs():
    assert parse_chat({**CHAT, "logprobs": True, "top_logprobs": 4}).sampling.logprobs == 4
    assert parse_chat({**CHAT, "logprobs": True}).sampling.logprobs == 0
    assert parse_chat({**CHAT, "logprobs": False}).sampling.logprobs is None
    assert refused(parse_chat, {**CHAT, "top_logprobs": 2}).param == "top_logprobs"


@pytest.mark.parametrize(
    "field, value",
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3),
        ("repetition_penalty", 0),
        ("repetition_penalty", 11),
        ("top_k", -2),
        ("min_p", 1.5),
        ("min_tokens", -1),
        ("logit_bias", {"x": 1}),
        ("logit_bias", {"1": 101}),
        ("logit_bias", []),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", ["a"]),
        ("logprobs", 21),
        ("logprobs", True),
        ("n", 0),
        ("best_of", 3),
        ("suffix", "tail"),
        ("use_beam_search", True),
        ("guided_json", {}),
        ("response_format", {"type": "xml"}),
        ("response_format", {"type": "json_schema"}),
        (
            "response_format",
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
        ),
    ],
)
def test_bad_or_unsupported_completion_fields_name_the_parameter(field, value):
    error = refused(parse_completion, {**COMPLETION, field: value})
    assert error.param.split(".")[0] == field, error.message


@pytest.mark.parametrize(
    "field, value",
    [
        ("functions", [{"name": "f"}]),
        ("audio", {"voice": "x"}),
        ("modalities", ["text", "audio"]),
        ("prediction", {"type": "content"}),
        ("web_search_options", {}),
        ("reasoning_effort", "high"),
        ("store", True),
        ("echo", True),
        ("top_logprobs", 30),
        ("tool_choice", "required"),
        ("tools", [{"type": "custom", "custom": {"name": "x"}}]),
        ("tools", [{"type": "function", "function": {"name": "bad name"}}]),
        ("tools", [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]),
        ("tools", [{"type": "function", "function": {"name": "f", "parameters": {"$schema": []}}}]),
        ("tools", [{"type": "function", "function": {"name": "f", "parameters": {"$schema": 5}}}]),
        (
            "response_format",
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$schema": {}}}},
        ),
    ],
)
def test_bad_or_unsupported_chat_fields_name_the_parameter(field, value):
    body = {**CHAT, field: value, **({"logprobs": True} if field == "top_logprobs" else {})}
    error = refused(parse_chat, body)
    assert error.param.split(".")[0].split("[")[0] == field, error.message


def test_unknown_fields_and_neutral_values_are_accepted():
    parse_chat(
        {
            **CHAT,
            "user": "u1",
            "metadata": {"a": "b"},
            "store": False,
            "modalities": ["text"],
            "some_future_field": 1,
            "service_tier": "auto",
        }
    )
    parse_completion({**COMPLETION, "suffix": "", "best_of": 1, "user": "u1"})


def test_content_parts_are_joined_and_non_text_parts_refused():
    request = parse_chat(
        {
            **CHAT,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
        }
    )
    assert request.messages == [{"role": "user", "content": "a\nb"}]
    image = {"type": "image_url", "image_url": {"url": "http://x"}}
    error = refused(parse_chat, {**CHAT, "messages": [{"role": "user", "content": [image]}]})
    assert error.param == "messages[0].content[0].type"


def test_tool_history_is_rendered_with_parsed_arguments():
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ]
    request = parse_chat({**CHAT, "messages": messages, "tools": [WEATHER]})
    assert request.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert request.messages[2]["tool_call_id"] == "c1"
    assert request.tool_choice.mode == "auto" and request.sampling.structured is None


def test_a_forced_tool_choice_becomes_a_grammar():
    named = parse_chat(
        {
            **CHAT,
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        }
    )
    assert json.loads(named.sampling.structured.json_schema) == WEATHER["function"]["parameters"]
    required = parse_chat(
        {**CHAT, "tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}
    )
    schema = json.loads(required.sampling.structured.json_schema)
    assert schema["type"] == "array" and schema["maxItems"] == 1
    assert schema["items"]["anyOf"][0]["properties"]["name"]["enum"] == ["get_weather"]
    error = refused(
        parse_chat,
        {
            **CHAT,
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "other"}},
        },
    )
    assert error.param == "tool_choice.function.name"
    error = refused(
        parse_chat,
        {
            **CHAT,
            "tools": [WEATHER],
            "tool_choice": "required",
            "response_format": {"type": "json_object"},
        },
    )
    assert error.param == "response_format"


def test_response_formats():
    assert parse_chat({**CHAT, "response_format": {"type": "text"}}).sampling.structured is None
    assert parse_chat(
        {**CHAT, "response_format": {"type": "json_object"}}
    ).sampling.structured == StructuredOutput(json_object=True)
    spec = {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True},
    }
    assert json.loads(
        parse_chat({**CHAT, "response_format": spec}).sampling.structured.json_schema
    ) == {"type": "object"}


def test_responses_input_and_refusals():
    request = parse_responses(
        {
            "model": "m",
            "input": "hi",
            "instructions": "be brief",
            "max_output_tokens": 9,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        }
    )
    assert request.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert (
        request.max_tokens == 9 and request.sampling.structured.json_schema == '{"type":"object"}'
    )
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
    ]
    assert [m["content"] for m in parse_responses({"model": "m", "input": items}).messages] == [
        "a",
        "b",
    ]
    for field, value in [
        ("previous_response_id", "resp_1"),
        ("store", True),
        ("background", True),
        ("tools", [WEATHER]),
        ("reasoning", {"effort": "low"}),
        ("include", ["x"]),
        ("input", [{"type": "function_call_output", "output": "x"}]),
        ("input", [{"role": "user", "content": [{"type": "input_image"}]}]),
    ]:
        error = refused(parse_responses, {"model": "m", "input": "hi", field: value})
        assert error.param.split("[")[0] == field, error.message
