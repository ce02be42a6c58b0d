"""Tool calls parsed from a model's text: Hermes <tool_call> blocks, whole or streamed in any
split, and the JSON of a forcing grammar."""

import json

import pytest

from crescent.conductor.tool_calls import HermesParser, parse_forced

TEXT = (
    'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n'
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
)


def parse_in_pieces(text: str, size: int):
    parser = HermesParser()
    content = []
    for start in range(0, len(text), size):
        piece, _ = parser.push(text[start : start + size])
        content.append(piece)
    rest, _ = parser.finish()
    return "".join(content) + rest, parser.calls


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_calls_and_content_in_any_split(size):
    content, calls = parse_in_pieces(TEXT, size)
    assert content.strip() == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {}),
    ]
    assert len({c.id for c in calls}) == 2


def test_text_that_only_looks_like_a_tag_is_content():
    content, calls = parse_in_pieces("a <tool b <tool_call>not json</tool_call> c <tool_ca", 2)
    assert calls == []
    assert content == "a <tool b <tool_call>not json</tool_call> c <tool_ca"


def test_an_unclosed_call_at_the_end_counts_if_it_parses():
    _, calls = parse_in_pieces('<tool_call>{"name": "f", "arguments": {"x": 1}}', 4)
    assert [c.name for c in calls] == ["f"]
    content, calls = parse_in_pieces('<tool_call>{"name": "f", "argu', 4)
    assert calls == [] and content == '<tool_call>{"name": "f", "argu'


def test_forced_output():
    assert parse_forced(' {"city": "Oslo"}', "get_weather")[0].arguments == '{"city": "Oslo"}'
    calls = parse_forced(
        '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}]', None
    )
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("a", {"x": 1}), ("b", {})]
    assert parse_forced('[{"name": "a", "param', None) == []
