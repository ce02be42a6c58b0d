"""Decoding request bodies: what the standard library's json lets through, or crashes on, is 400."""

import json

import pytest

from crescent.conductor.http_body import parse_json
from crescent.conductor.openai_api import ApiError


@pytest.mark.parametrize(
    "raw, says",
    [
        (b'{"prompt": "a \\ud800 b"}', "not valid JSON"),
        (b'{"prompt": "\\udc00"}', "surrogate"),
        (b'{"temperature": NaN}', "malformed"),
        (b'{"temperature": Infinity}', "malformed"),
        (b'{"temperature": 1e400}', "out of range"),
        (b'{"max_tokens": 1' + b"0" * 5000 + b"}", "out of range"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"prompt": "\xff"}', "UTF-8"),
        (b"\xef\xbb\xbf{}", "malformed"),
        (b"   ", "empty"),
        (b'{"a": 1} trailing', "malformed"),
    ],
)
def test_bodies_json_loads_would_accept_or_crash_on_are_400(raw, says):
    with pytest.raises(ApiError) as info:
        parse_json(raw)
    assert info.value.status == 400
    assert says in info.value.message


def test_valid_json_decodes_as_the_standard_library_does():
    raw = (
        '{"prompt": "ok \\ud83d\\ude00 é", "seed": 18446744073709551615, '
        '"t": 0.5, "x": [null, true]}'
    ).encode()
    assert parse_json(raw) == json.loads(raw)
