import pytest

from crescent.conductor.openai_api import ApiError, chunk, full_response, parse_chat, parse_completion


def test_text_and_token_prompts():
    assert parse_completion({"model": "m", "prompt": "hi"}).prompt_text == "hi"
    assert parse_completion({"model": "m", "prompt": [1, 2]}).prompt_token_ids == [1, 2]
    assert parse_completion({"model": "m", "prompt": "hi"}).max_tokens == 16


@pytest.mark.parametrize("body, param", [
    ([], None),
    ({"prompt": "x"}, "model"),
    ({"model": 3, "prompt": "x"}, "model"),
    ({"model": "m"}, "prompt"),
    ({"model": "m", "prompt": ""}, "prompt"),
    ({"model": "m", "prompt": 5}, "prompt"),
    ({"model": "m", "prompt": [1, "a"]}, "prompt"),
    ({"model": "m", "prompt": [-1]}, "prompt"),
    ({"model": "m", "prompt": ["a", "b"]}, "prompt"),
    ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"model": "m", "prompt": "x", "temperature": 3}, "temperature"),
    ({"model": "m", "prompt": "x", "top_p": -0.1}, "top_p"),
    ({"model": "m", "prompt": "x", "n": 2}, "n"),
    ({"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
    ({"model": "m", "prompt": "x", "stop": [1]}, "stop"),
])
def test_bad_completion_bodies_name_the_parameter(body, param):
    with pytest.raises(ApiError) as info:
        parse_completion(body)
    assert info.value.status == 400
    assert info.value.param == param
    assert info.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [
    {"model": "m"},
    {"model": "m", "messages": []},
    {"model": "m", "messages": [{"role": "user"}]},
    {"model": "m", "messages": [{"role": "wizard", "content": "x"}]},
    {"model": "m", "messages": ["hi"]},
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
])
def test_bad_chat_bodies(body):
    with pytest.raises(ApiError) as info:
        parse_chat(body)
    assert info.value.status == 400


def test_chat_defaults_leave_max_tokens_to_the_server():
    request = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": "\n"})
    assert request.max_tokens is None and request.stop == ["\n"] and request.is_chat


def test_response_shapes():
    chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    first = chunk(chat, "id", 1, "a", None, is_first=True)
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "a"}
    plain = parse_completion({"model": "m", "prompt": "x"})
    body = full_response(plain, "id", 1, "abc", "length", {"total_tokens": 3})
    assert body["choices"][0]["text"] == "abc" and body["object"] == "text_completion"
