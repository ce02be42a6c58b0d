"""A choice's token events into OpenAI's shapes: text with stop strings, logprobs of both
endpoints (with echo's prompt logprobs), tool calls parsed from free output and from a forced
call; and a decode start that carries the sampling on (min_tokens counted down, replay)."""

import json

import pytest

from crescent.common.messages import SamplingParams, StructuredOutput, TokenLogprobs
from crescent.common.tokenizer import ByteTokenizer
from crescent.conductor.choice import Choice
from crescent.conductor.flow_state import TokenEvent
from crescent.conductor.openai_api import parse_chat, parse_completion
from crescent.conductor.openai_shapes import Collected, chunk, full_response
from crescent.conductor.progress import Progress, Replay, ReplayDivergedError, replayable

TOKENIZER = ByteTokenizer()
CHAT = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}


def lp(token: int) -> TokenLogprobs:
    return TokenLogprobs(logprob=-0.5, top_ids=[token, token + 1], top_logprobs=[-0.5, -1.5])


def events_of(text: str, with_logprobs: bool = False, finish: str = "length") -> list[TokenEvent]:
    ids = list(text.encode())
    return [
        TokenEvent([t], finish if i == len(ids) - 1 else None, [lp(t)] if with_logprobs else [])
        for i, t in enumerate(ids)
    ]


def run(choice: Choice, events: list[TokenEvent]) -> Collected:
    collected = Collected(choice.index)
    for event in events:
        collected.add(choice.push(event))
        if choice.is_finished:
            break
    collected.tool_calls = choice.tool_calls
    return collected


def test_completion_logprobs_with_echo_start_with_the_prompt():
    request = parse_completion({"model": "m", "prompt": "ab", "echo": True, "logprobs": 1})
    choice = Choice(0, request, TOKENIZER, [97, 98], echo_text="ab")
    events = events_of("cd", with_logprobs=True)
    events[0].prompt_logprobs = [lp(98)]
    body = full_response(request, "id", 0, [run(choice, events)], {})
    result = body["choices"][0]
    assert result["text"] == "abcd"
    logprobs = result["logprobs"]
    assert logprobs["tokens"] == ["a", "b", "c", "d"]
    assert logprobs["token_logprobs"] == [None, -0.5, -0.5, -0.5]
    assert logprobs["top_logprobs"][0] is None and logprobs["top_logprobs"][2] == {
        "c": -0.5,
        "d": -1.5,
    }
    assert logprobs["text_offset"] == [0, 1, 2, 3]


def test_chat_logprobs_shape():
    request = parse_chat({**CHAT, "logprobs": True, "top_logprobs": 2})
    body = full_response(
        request, "id", 0, [run(Choice(0, request, TOKENIZER, []), events_of("hi", True))], {}
    )
    content = body["choices"][0]["logprobs"]["content"]
    assert content[0] == {
        "token": "h",
        "logprob": -0.5,
        "bytes": [104],
        "top_logprobs": [
            {"token": "h", "logprob": -0.5, "bytes": [104]},
            {"token": "i", "logprob": -1.5, "bytes": [105]},
        ],
    }
    plain = parse_chat(CHAT)
    assert (
        full_response(plain, "id", 0, [run(Choice(0, plain, TOKENIZER, []), events_of("hi"))], {})[
            "choices"
        ][0]["logprobs"]
        is None
    )


def test_a_stop_string_ends_the_choice_and_is_not_sent():
    request = parse_completion({"model": "m", "prompt": "x", "stop": "cd"})
    choice = Choice(0, request, TOKENIZER, [])
    collected = run(choice, events_of("abcdef"))
    assert collected.text == "ab" and choice.finish_reason == "stop"


def test_tool_calls_parsed_from_free_output():
    request = parse_chat({**CHAT, "tools": [WEATHER]})
    text = 'ok <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    choice = Choice(0, request, TOKENIZER, [])
    body = full_response(request, "id", 0, [run(choice, events_of(text, finish="stop"))], {})
    result = body["choices"][0]
    assert result["finish_reason"] == "tool_calls" and result["message"]["content"] == "ok"
    assert json.loads(result["message"]["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Oslo"
    }


def test_a_named_function_streams_its_arguments():
    request = parse_chat(
        {
            **CHAT,
            "tools": [WEATHER],
            "stream": True,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        }
    )
    choice = Choice(0, request, TOKENIZER, [])
    chunks = [
        chunk(request, "id", 0, 0, choice.push(event), i == 0, choice.call_id)
        for i, event in enumerate(events_of('{"a": 1}', finish="stop"))
    ]
    first = chunks[0]["choices"][0]["delta"]["tool_calls"][0]
    assert first["id"] == choice.call_id and first["function"]["name"] == "get_weather"
    arguments = "".join(
        c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in chunks
    )
    assert arguments == '{"a": 1}' and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert [(c.id, c.name, c.arguments) for c in choice.tool_calls] == [
        (first["id"], "get_weather", '{"a": 1}')
    ]


def test_decode_start_counts_min_tokens_down_and_drops_prompt_logprobs():
    progress = Progress(
        [1, 2, 3], 10, SamplingParams(min_tokens=4, prompt_logprobs=1), generated=[7, 8]
    )
    start = progress.decode_start("r-m1")
    assert (start.token_ids, start.first_token, start.max_tokens) == ([1, 2, 3, 7], 8, 9)
    assert start.sampling.min_tokens == 2 and start.sampling.prompt_logprobs is None


def test_a_request_with_output_dependent_sampling_restarts_from_the_prompt():
    for sampling in (
        SamplingParams(presence_penalty=0.5),
        SamplingParams(frequency_penalty=-1.0),
        SamplingParams(structured=StructuredOutput(json_object=True)),
    ):
        progress = Progress([1, 2, 3], 10, sampling, generated=[7, 8])
        start = progress.decode_start("r-m1")
        assert (start.token_ids, start.first_token, start.max_tokens) == ([1, 2], 3, 11)
    assert not Progress([1], 5, SamplingParams(repetition_penalty=1.3)).is_replayed


def test_a_replayed_request_at_a_temperature_gets_a_seed():
    assert replayable(SamplingParams(presence_penalty=0.5, temperature=0.8)).seed is not None
    assert replayable(SamplingParams(presence_penalty=0.5, temperature=0.8, seed=3)).seed == 3
    assert replayable(SamplingParams(temperature=0.8)).seed is None


def test_a_named_functions_call_opens_with_its_first_arguments():
    request = parse_chat(
        {
            **CHAT,
            "tools": [WEATHER],
            "stream": True,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        }
    )
    choice = Choice(0, request, TOKENIZER, [])
    held = choice.push(TokenEvent([0xC3]))  # half of a two-byte character: no text yet
    first = chunk(request, "id", 0, 0, held, True, choice.call_id)
    assert "tool_calls" not in first["choices"][0]["delta"]
    opening = chunk(
        request, "id", 0, 0, choice.push(TokenEvent([0xA9], "stop")), False, choice.call_id
    )
    [call] = opening["choices"][0]["delta"]["tool_calls"]
    assert call["id"] == choice.call_id and call["function"] == {
        "arguments": "é",
        "name": "get_weather",
    }


def test_a_replaying_decode_adds_only_what_follows_the_streamed_tokens():
    replay = Replay([5, 6, 7])
    assert replay.new_part([5, 6], [lp(5), lp(6)], False) == ([], [])
    assert replay.new_part([7, 8, 9], [lp(7), lp(8), lp(9)], False) == ([8, 9], [lp(8), lp(9)])
    assert replay.new_part([10], [], True) == ([10], [])
    with pytest.raises(ReplayDivergedError):
        Replay([5, 6]).new_part([5, 9], [], False)
    with pytest.raises(ReplayDivergedError):
        Replay([5, 6]).new_part([5], [], True)
