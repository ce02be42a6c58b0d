import pytest

from crescent.conductor.choice import ChoiceDelta
from crescent.conductor.openai_api import ApiError, parse_chat, parse_completion
from crescent.conductor.openai_shapes import Collected, chunk, full_response


def test_text_and_token_prompts():
    assert parse_completion({"model": "m", "prompt": "hi"}).prompt_text == "hi"
    assert parse_completion({"model": "m", "prompt": [1, 2]}).prompt_token_ids == [1, 2]
    assert parse_completion({"model": "m", "prompt": "hi"}).max_tokens == 16


def test_a_batch_of_prompts_is_one_request_per_prompt_in_order():
    request = parse_completion({"model": "m", "prompt": ["a", [5, 6], "b"], "n": 2, "seed": 3})
    one = request.one_per_prompt()
    assert [(r.prompt_text, r.prompt_token_ids) for r in one] == [
        ("a", None),
        (None, [5, 6]),
        ("b", None),
    ]
    assert all(r.n == 2 and r.sampling.seed == 3 and not r.prompt_batch for r in one)
    single = parse_completion({"model": "m", "prompt": "a"})
    assert single.one_per_prompt() == [single]


@pytest.mark.parametrize(
    "body, param",
    [
        ([], None),
        ({"prompt": "x"}, "model"),
        ({"model": 3, "prompt": "x"}, "model"),
        ({"model": "m"}, "prompt"),
        ({"model": "m", "prompt": ""}, "prompt"),
        ({"model": "m", "prompt": 5}, "prompt"),
        ({"model": "m", "prompt": [1, "a"]}, "prompt"),
        ({"model": "m", "prompt": [-1]}, "prompt"),
        ({"model": "m", "prompt": ["a", ""]}, "prompt"),
        ({"model": "m", "prompt": [[1], []]}, "prompt"),
        ({"model": "m", "prompt": [[1], [-1]]}, "prompt"),
        ({"model": "m", "prompt": ["a"] * 129, "n": 2}, "prompt"),  # 258 choices
        ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": "5"}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
        ({"model": "m", "prompt": "x", "temperature": 3}, "temperature"),
        ({"model": "m", "prompt": "x", "top_p": -0.1}, "top_p"),
        ({"model": "m", "prompt": "x", "top_p": 0}, "top_p"),  # vLLM takes (0, 1]
        ({"model": "m", "prompt": "x", "n": 0}, "n"),
        ({"model": "m", "prompt": "x", "n": 129}, "n"),
        ({"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
        ({"model": "m", "prompt": "x", "stop": [1]}, "stop"),
    ],
)
def test_bad_completion_bodies_name_the_parameter(body, param):
    with pytest.raises(ApiError) as info:
        parse_completion(body)
    assert info.value.status == 400
    assert info.value.param == param
    assert info.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m"},
        {"model": "m", "messages": []},
        {"model": "m", "messages": [{"role": "user"}]},
        {"model": "m", "messages": [{"role": "wizard", "content": "x"}]},
        {"model": "m", "messages": ["hi"]},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
    ],
)
def test_bad_chat_bodies(body):
    with pytest.raises(ApiError) as info:
        parse_chat(body)
    assert info.value.status == 400


def test_chat_defaults_leave_max_tokens_to_the_server():
    request = parse_chat(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": "\n"}
    )
    assert request.max_tokens is None and request.stop == ["\n"] and request.is_chat


def test_response_shapes():
    chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    first = chunk(chat, "id", 1, 0, ChoiceDelta(text="a"), is_first=True)
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "a"}
    plain = parse_completion({"model": "m", "prompt": "x"})
    body = full_response(
        plain, "id", 1, [Collected(0, ["ab", "c"], finish_reason="length")], {"total_tokens": 3}
    )
    assert body["choices"][0]["text"] == "abc" and body["object"] == "text_completion"


@pytest.mark.parametrize(
    "field, value",
    [
        ("seed", 2**63),
        ("seed", -(2**63) - 1),
        ("seed", 10**30),
        ("max_tokens", 2**63),
        ("max_tokens", -(10**400)),
        ("temperature", 10**400),
        ("temperature", float("inf")),
        ("top_p", float("nan")),
        ("stream_options", {"include_usage": "yes"}),
    ],
)
def test_numbers_outside_what_the_cluster_carries_are_400(field, value):
    with pytest.raises(ApiError) as info:
        parse_completion({"model": "m", "prompt": "x", field: value})
    assert info.value.status == 400
    assert len(info.value.message) < 200  # a huge number is not quoted whole


def test_sixty_four_bit_extremes_are_accepted():
    request = parse_completion(
        {"model": "m", "prompt": [0, 2**63 - 1], "seed": -(2**63), "max_tokens": 2**63 - 1}
    )
    assert request.sampling.seed == -(2**63) and request.max_tokens == 2**63 - 1
    with pytest.raises(ApiError) as info:
        parse_completion({"model": "m", "prompt": [2**63]})
    assert info.value.param == "prompt"


def test_chat_checks_max_tokens_even_when_max_completion_tokens_wins():
    messages = [{"role": "user", "content": "x"}]
    assert (
        parse_chat(
            {"model": "m", "messages": messages, "max_tokens": 5, "max_completion_tokens": 3}
        ).max_tokens
        == 3
    )
    with pytest.raises(ApiError) as info:
        parse_chat(
            {"model": "m", "messages": messages, "max_tokens": 0, "max_completion_tokens": 3}
        )
    assert info.value.param == "max_tokens"
