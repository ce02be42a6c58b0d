"""The official openai SDK against an emulated cluster (issue 12): each row of the issue's table
that needs no model, whole and streamed, and the errors the SDK raises for what cannot be
served. The emulated engine's tokens are certain, so what it can do is exact (n, echo, logprobs
of 0) and what would change its tokens is refused with a 400 naming the parameter. The rows
that need a model's probabilities (penalties, logprobs' values, structured output, tools) run
on the tiny model in vllm/test_openai_sdk_vllm.py."""

from __future__ import annotations

import random
import time

import openai
import pytest

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def client(dev_cluster) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{dev_cluster.api_url}/v1", api_key="unused", max_retries=0, timeout=60
    )


def chat_text(stream) -> tuple[dict[int, str], dict[int, str]]:
    """Content and finish reason of each choice of a chat stream."""
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    return texts, finishes


def test_chat_content_as_a_list_of_text_parts(client):
    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]
    as_parts = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=8
    )
    as_text = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello\nthere"}], max_tokens=8
    )
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content
    assert as_parts.usage.prompt_tokens == as_text.usage.prompt_tokens
    texts, _ = chat_text(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=8, stream=True
        )
    )
    assert texts == {0: as_text.choices[0].message.content}


def test_logprobs_of_certain_tokens_in_both_shapes(client):
    result = client.completions.create(model=MODEL, prompt="hello", max_tokens=6, logprobs=2)
    logprobs = result.choices[0].logprobs
    assert "".join(logprobs.tokens) == result.choices[0].text
    assert logprobs.token_logprobs == [0.0] * 6 and all(
        len(top) == 2 for top in logprobs.top_logprobs
    )
    assert logprobs.text_offset == list(range(6))
    chat = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=5, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content
    assert "".join(entry.token for entry in content) == chat.choices[0].message.content
    assert all(
        entry.logprob == 0.0
        and len(entry.top_logprobs) == 3
        and entry.top_logprobs[0].token == entry.token
        for entry in content
    )
    streamed = client.completions.create(
        model=MODEL, prompt="hello", max_tokens=6, logprobs=2, stream=True
    )
    tokens = [token for chunk in streamed for token in chunk.choices[0].logprobs.tokens]
    assert tokens == logprobs.tokens
    streamed = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=5, logprobs=True, stream=True
    )
    entries = [
        entry.token
        for chunk in streamed
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content
    ]
    assert entries == [entry.token for entry in content]
    plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    assert plain.choices[0].logprobs is None


def test_n_choices_whole_and_streamed(client):
    result = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=7, n=3)
    assert [c.index for c in result.choices] == [0, 1, 2]
    assert len({c.message.content for c in result.choices}) == 1  # a certain engine: the same text
    assert result.usage.completion_tokens == 3 * 7
    texts, finishes = chat_text(
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=7, n=3, stream=True)
    )
    assert texts == {i: result.choices[0].message.content for i in range(3)}
    assert finishes == {0: "length", 1: "length", 2: "length"}
    completion = client.completions.create(model=MODEL, prompt="abc", max_tokens=4, n=2)
    assert len(completion.choices) == 2 and completion.choices[0].text == completion.choices[1].text


def test_a_batch_of_prompts_answers_each_as_if_it_came_alone(client):
    prompts = ["the first prompt", "a second one", list(b"third")]
    alone = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=5, echo=True) for p in prompts
    ]
    fields = {"model": MODEL, "prompt": prompts, "max_tokens": 5, "n": 2, "echo": True}
    batch = client.completions.create(**fields)
    assert [c.index for c in batch.choices] == list(range(6))  # prompt by prompt, n each
    assert [c.text for c in batch.choices] == [a.choices[0].text for a in alone for _ in "ab"]
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert batch.usage.completion_tokens == 6 * 5
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(**fields, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert streamed == {c.index: c.text for c in batch.choices}


def test_a_model_is_retrieved_by_name(client):
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.object == "model"
    assert model.model_dump() == client.models.list().data[0].model_dump()
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.code == "model_not_found"


def test_echo_whole_and_streamed(client):
    plain = client.completions.create(model=MODEL, prompt="the prompt", max_tokens=5)
    echoed = client.completions.create(model=MODEL, prompt="the prompt", max_tokens=5, echo=True)
    assert echoed.choices[0].text == "the prompt" + plain.choices[0].text
    stream = client.completions.create(
        model=MODEL, prompt="the prompt", max_tokens=5, echo=True, stream=True
    )
    pieces = [chunk.choices[0].text for chunk in stream]
    assert pieces[0].startswith("the prompt") and "".join(pieces) == echoed.choices[0].text
    token_prompt = client.completions.create(
        model=MODEL, prompt=list(b"tok"), max_tokens=2, echo=True
    )
    assert token_prompt.choices[0].text.startswith("tok")


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"extra_body": {"repetition_penalty": 1.2}}, "repetition_penalty"),
        ({"logit_bias": {"97": 5}}, "logit_bias"),
        ({"extra_body": {"min_tokens": 2}}, "min_tokens"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_what_the_emulated_engine_cannot_apply_is_a_400_naming_it(client, fields, param, stream):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=4, stream=stream, **fields
        )
    assert raised.value.body["param"] == param


def test_echo_with_logprobs_needs_a_model(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, echo=True, logprobs=1)
    assert raised.value.body["param"] == "echo"


def test_responses_api_for_text(client):
    response = client.responses.create(
        model=MODEL, input="hello there", instructions="be brief", max_output_tokens=6
    )
    assert response.object == "response" and response.output[0].role == "assistant"
    assert len(response.output_text) == 6 and response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 6 and response.usage.input_tokens > 0
    items = [{"role": "user", "content": [{"type": "input_text", "text": "hello there"}]}]
    again = client.responses.create(
        model=MODEL, input=items, instructions="be brief", max_output_tokens=6
    )
    assert again.output_text == response.output_text
    events = list(
        client.responses.create(
            model=MODEL,
            input="hello there",
            instructions="be brief",
            max_output_tokens=6,
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.incomplete" and [e.sequence_number for e in events] == list(
        range(len(events))
    )
    assert (
        "".join(e.delta for e in events if e.type == "response.output_text.delta")
        == response.output_text
    )
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_1")
    assert raised.value.body["param"] == "previous_response_id"


def test_what_worked_before_still_works(client):
    completion = client.completions.create(
        model=MODEL, prompt="hello", max_tokens=5, seed=3, temperature=0.7
    )
    assert (
        completion.choices[0].finish_reason == "length" and completion.usage.completion_tokens == 5
    )
    by_ids = client.completions.create(model=MODEL, prompt=list(b"hello"), max_tokens=5)
    assert by_ids.choices[0].text == completion.choices[0].text
    stream = client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].choices == []
    full = client.completions.create(model=MODEL, prompt="hello", max_tokens=12)
    stop_at = full.choices[0].text[3:5]
    stopped = client.completions.create(model=MODEL, prompt="hello", max_tokens=12, stop=[stop_at])
    assert stopped.choices[0].text == full.choices[0].text[: full.choices[0].text.index(stop_at)]
    assert stopped.choices[0].finish_reason == "stop"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x")
    for bad in ({"max_tokens": 0}, {"temperature": 3}, {"max_tokens": 40000}):
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=MODEL, prompt="x", **bad)


def test_the_issues_bad_input(client):
    with pytest.raises(
        openai.BadRequestError
    ) as raised:  # each choice fits a decode instance, all do not
        client.completions.create(model=MODEL, prompt="x", max_tokens=30000, n=100)
    assert raised.value.body["param"] == "n" and raised.value.body["code"] == "exceeds_kv_capacity"
    bad_schema = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "required": 5}},
    }
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=HELLO, tools=[bad_schema])
    assert raised.value.body["param"] == "tools[0].function.parameters"
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=HELLO, top_logprobs="2")
    assert raised.value.body["param"] == "top_logprobs"
    ignored = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=2, extra_body={"a_field_from_the_future": {"x": 1}}
    )
    assert ignored.choices[0].message.content


def cached_once_stored(create, cached_of) -> int:
    """The cached tokens of `create()` once the first call's blocks are stored and in the
    conductor's index (etcd is written just after a store commit, hence the deadline)."""
    deadline = time.monotonic() + 10
    while True:
        cached = cached_of(create())
        if cached or time.monotonic() > deadline:
            return cached
        time.sleep(0.2)


def test_usage_counts_the_prompt_tokens_loaded_from_the_cache(client):
    """`usage.prompt_tokens_details.cached_tokens` is what the prefill loaded instead of
    computing: nothing the first time, then the prompt's whole blocks (512 tokens each); the
    Responses API says the same in `input_tokens_details`."""
    prompt = random.Random(11).choices(range(256), k=1200)

    def complete(**extra):
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, **extra)

    first = complete()
    assert first.usage.prompt_tokens == 1200
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert (
        cached_once_stored(complete, lambda r: r.usage.prompt_tokens_details.cached_tokens) == 1024
    )
    streamed = list(complete(stream=True, stream_options={"include_usage": True}))
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == 1024

    text = bytes(random.Random(12).choices(range(97, 123), k=1200)).decode()

    def respond():
        return client.responses.create(model=MODEL, input=text, max_output_tokens=2)

    assert respond().usage.input_tokens_details.cached_tokens == 0
    cached = cached_once_stored(respond, lambda r: r.usage.input_tokens_details.cached_tokens)
    assert cached > 0 and cached % 512 == 0
