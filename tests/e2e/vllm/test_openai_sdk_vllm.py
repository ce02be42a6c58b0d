"""The official openai SDK against a cluster serving the tiny model on vLLM (issue 12): the rows
of the issue's table that need a model's probabilities, whole and streamed, compared with plain
vLLM where the answer is exact (greedy sampling). One cluster (a prefill and two decode
instances) serves the whole module; its last test kills a decode instance mid-stream."""

from __future__ import annotations

import json
import signal
import time

import jsonschema
import openai
import pytest
from vllm_helpers import ENV, prompt_tokens

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.hf_tokenizer import HfTokenizer
from crescent.common.ports import free_port

pytest.importorskip("vllm", reason="needs the vLLM CPU build (make install-vllm)")

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(900)]
UNIT = {
    "type": "object",
    "properties": {"unit": {"enum": ["c", "f"]}},
    "required": ["unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "the weather", "parameters": UNIT},
}
PROMPT = prompt_tokens(150, seed=20)  # penalized, its output repeats its first token


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir):
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("openai-sdk"),
        api_port=free_port(),
        engine="vllm",
        model_dir=tiny_model_dir,
        env=ENV,
        num_decode=2,
        store_dram_bytes=64 << 20,
        store_ssd_bytes=64 << 20,
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=600)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def client(cluster) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{cluster.api_url}/v1", api_key="unused", max_retries=0, timeout=300
    )


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> str:
    return tiny_model_dir.name


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir) -> HfTokenizer:
    return HfTokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def no_whitespace(tokenizer) -> dict[str, int]:
    """A logit_bias that forbids whitespace-only tokens: the random-weight model would otherwise
    pad JSON with whitespace for as long as it may."""
    return {
        str(i): -100 for i in range(tokenizer.vocab_size) if not tokenizer.token_text(i).strip()
    }


def plain_vllm(reference, prompt: list[int], max_tokens: int, **sampling):
    """Plain vLLM's output for a token prompt: (token ids, logprobs dicts, prompt logprobs)."""
    from vllm import SamplingParams, TokensPrompt

    [output] = reference.generate(
        [TokensPrompt(prompt_token_ids=prompt)],
        SamplingParams(max_tokens=max_tokens, **sampling),
        use_tqdm=False,
    )
    return list(output.outputs[0].token_ids), output.outputs[0].logprobs, output.prompt_logprobs


@pytest.mark.parametrize(
    "penalty",
    [
        {"presence_penalty": 1.5},
        {"frequency_penalty": 1.0},
        {"extra_body": {"repetition_penalty": 1.4}},
    ],
)
def test_penalties_give_plain_vllms_tokens(client, model, reference, tokenizer, penalty):
    sampling = penalty.get("extra_body", penalty)
    plain, _, _ = plain_vllm(reference, PROMPT, 40, temperature=0, ignore_eos=True)
    want, _, _ = plain_vllm(reference, PROMPT, 40, temperature=0, ignore_eos=True, **sampling)
    assert want != plain, "the penalty must change this output for the test to mean anything"
    if "repetition_penalty" not in sampling:  # it counts the prompt too: any continuation is exact
        rest, _, _ = plain_vllm(
            reference, PROMPT + want[:1], 39, temperature=0, ignore_eos=True, **sampling
        )
        assert want != want[:1] + rest, "a decode that took the first token as prompt would differ"
    fields = dict(
        model=model,
        prompt=PROMPT,
        max_tokens=40,
        temperature=0,
        logprobs=0,
        extra_body={"ignore_eos": True, **penalty.get("extra_body", {})},
        **{k: v for k, v in penalty.items() if k != "extra_body"},
    )
    result = client.completions.create(**fields)
    assert result.choices[0].text == tokenizer.decode(want)
    streamed = "".join(
        chunk.choices[0].text for chunk in client.completions.create(**fields, stream=True)
    )
    assert streamed == tokenizer.decode(want)


def test_logprobs_are_plain_vllms(client, model, reference, tokenizer):
    want, want_logprobs, _ = plain_vllm(
        reference, PROMPT, 12, temperature=0, ignore_eos=True, logprobs=2
    )
    result = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=12,
        temperature=0,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    logprobs = result.choices[0].logprobs
    assert logprobs.tokens == [tokenizer.token_text(t) for t in want]
    for token, got, entries in zip(want, logprobs.token_logprobs, want_logprobs):
        assert got == pytest.approx(entries[token].logprob, abs=1e-3)
    assert all(len(top) == 2 for top in logprobs.top_logprobs)
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "the cache"}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert "".join(entry.token for entry in content) == chat.choices[0].message.content
    assert all(entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob for entry in content)
    assert all(
        entry.logprob == pytest.approx(entry.top_logprobs[0].logprob) for entry in content
    )  # greedy
    streamed = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "the cache"}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    )
    streamed_entries = [
        entry
        for chunk in streamed
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content
    ]
    assert [(e.token, round(e.logprob, 3)) for e in streamed_entries] == [
        (e.token, round(e.logprob, 3)) for e in content
    ]


def test_echo_with_logprobs_gives_the_prompts_logprobs(client, model, reference):
    prompt = PROMPT[:40]
    _, _, want = plain_vllm(reference, prompt, 1, temperature=0, prompt_logprobs=1)
    result = client.completions.create(
        model=model, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=1
    )
    logprobs = result.choices[0].logprobs
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for token, got, entries in zip(prompt[1:], logprobs.token_logprobs[1 : len(prompt)], want[1:]):
        assert got == pytest.approx(entries[token].logprob, abs=1e-3)
    assert len(logprobs.tokens) == len(prompt) + 3


def test_twenty_logprobs_of_a_long_prompt_come_whole(client, model, reference):
    """6,000 prompt tokens with 20 alternatives each are ~1.7 MB, over the 1 MiB a NATS
    message holds by default: the prefill instance answers them in parts."""
    prompt = prompt_tokens(6000, seed=21)
    _, _, want = plain_vllm(reference, prompt, 1, temperature=0, prompt_logprobs=20)
    result = client.completions.create(
        model=model, prompt=prompt, max_tokens=2, temperature=0, echo=True, logprobs=20
    )
    logprobs = result.choices[0].logprobs
    assert len(logprobs.tokens) == len(prompt) + 2
    got = logprobs.token_logprobs[1 : len(prompt)]
    assert got == pytest.approx(
        [entries[token].logprob for token, entries in zip(prompt[1:], want[1:])], abs=1e-3
    )


def test_sampling_knobs(client, model, reference, tokenizer):
    greedy = (
        client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=16,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        .choices[0]
        .text
    )
    for knob in (
        {"top_k": 1},
        {"min_p": 1.0},
    ):  # at temperature 1, only the likeliest token is left
        sampled = client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=16,
            temperature=1.0,
            seed=4,
            extra_body={"ignore_eos": True, **knob},
        )
        assert sampled.choices[0].text == greedy, knob
    biased = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        logit_bias={"300": 100},
        extra_body={"ignore_eos": True},
    )
    assert biased.choices[0].text == tokenizer.decode([300] * 6)
    plain, _, _ = plain_vllm(reference, PROMPT, 16, temperature=0)
    want, _, _ = plain_vllm(
        reference, PROMPT, 16, temperature=0, stop_token_ids=[plain[2]], min_tokens=6
    )
    result = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=16,
        temperature=0,
        extra_body={"stop_token_ids": [plain[2]], "min_tokens": 6},
    )
    assert result.choices[0].text == tokenizer.decode(want) and len(want) > 6


def test_a_batch_of_prompts_gives_plain_vllms_tokens_for_each(client, model, reference, tokenizer):
    prompts = [prompt_tokens(30, seed=31), prompt_tokens(600, seed=32), prompt_tokens(5, seed=33)]
    result = client.completions.create(
        model=model, prompt=prompts, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    want = [plain_vllm(reference, p, 8, temperature=0, ignore_eos=True)[0] for p in prompts]
    assert [c.text for c in result.choices] == [tokenizer.decode(w) for w in want]
    assert result.usage.prompt_tokens == sum(map(len, prompts))


def test_n_choices_are_seeded_seed_plus_index(client, model):
    together = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=10,
        temperature=1.0,
        seed=11,
        n=3,
    )
    alone = [
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=10,
            temperature=1.0,
            seed=11 + i,
        )
        .choices[0]
        .message.content
        for i in range(3)
    ]
    assert [c.message.content for c in together.choices] == alone
    assert len(set(alone)) > 1
    texts: dict[int, str] = {}
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=10,
        temperature=1.0,
        seed=11,
        n=3,
        stream=True,
    ):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert texts == dict(enumerate(alone))


def test_structured_output(client, model, no_whitespace):
    schema = {
        "type": "json_schema",
        "json_schema": {"name": "unit", "schema": UNIT, "strict": True},
    }
    for stream in (False, True):
        fields = {
            "model": model,
            "messages": [{"role": "user", "content": "which unit?"}],
            "max_tokens": 100,
            "temperature": 0,
            "logit_bias": no_whitespace,
        }
        if stream:
            chunks = list(
                client.chat.completions.create(**fields, response_format=schema, stream=True)
            )
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
        else:
            text = (
                client.chat.completions.create(**fields, response_format=schema)
                .choices[0]
                .message.content
            )
        jsonschema.validate(json.loads(text), UNIT)
        anything = client.chat.completions.create(**fields, response_format={"type": "json_object"})
        assert isinstance(json.loads(anything.choices[0].message.content), dict)
    response = client.responses.create(
        model=model,
        input="which unit?",
        max_output_tokens=100,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "unit", "schema": UNIT}},
        extra_body={"logit_bias": no_whitespace},
    )
    jsonschema.validate(json.loads(response.output_text), UNIT)


def test_tools(client, model, no_whitespace):
    messages = [{"role": "user", "content": "the weather?"}]
    fields = {
        "model": model,
        "messages": messages,
        "max_tokens": 100,
        "temperature": 0,
        "tools": [WEATHER],
        "logit_bias": no_whitespace,
    }
    # One call at most: the random model would otherwise go on adding calls to the array.
    required = client.chat.completions.create(
        **fields, tool_choice="required", parallel_tool_calls=False
    )
    assert required.choices[0].finish_reason == "tool_calls", required.choices[0].message
    [call] = required.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), UNIT)
    named = {"type": "function", "function": {"name": "get_weather"}}
    forced = client.chat.completions.create(**fields, tool_choice=named)
    [call] = forced.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), UNIT)
    deltas = [
        c.choices[0].delta
        for c in client.chat.completions.create(**fields, tool_choice=named, stream=True)
    ]
    streamed_calls = [call for delta in deltas for call in delta.tool_calls or []]
    assert streamed_calls[0].function.name == "get_weather" and streamed_calls[0].id
    assert "".join(c.function.arguments for c in streamed_calls) == call.function.arguments
    history = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "12 degrees"},
    ]
    answer = client.chat.completions.create(
        model=model, messages=history, tools=[WEATHER], max_tokens=5
    )
    assert answer.choices[0].finish_reason in ("length", "stop", "tool_calls")
    free = client.chat.completions.create(
        model=model, messages=messages, tools=[WEATHER], max_tokens=5, stream=True
    )
    assert list(free)[-1].choices[0].finish_reason in ("length", "stop", "tool_calls")


# With 120 tokens, one fresh-clone CI run (2026-11-30) found no decode instance showing the
# request running in its load telemetry (every 0.2 s) after its fifth chunk.
KILLED_MAX_TOKENS = 400


def test_decode_killed_mid_stream_replays_a_penalized_request_exactly(
    cluster, client, model, reference, tokenizer
):
    """Presence penalties count the engine's own output only, so the request replays on the other
    decode instance (from its prompt) and the client still gets plain vLLM's tokens. The answer
    is long enough to outlast a few telemetry periods: the busy decode is found by its load."""
    want, _, _ = plain_vllm(
        reference, PROMPT, KILLED_MAX_TOKENS, temperature=0, ignore_eos=True, presence_penalty=1.0
    )
    stream = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=KILLED_MAX_TOKENS,
        temperature=0,
        presence_penalty=1.0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    pieces, killed = [], ""
    for chunk in stream:
        pieces.append(chunk.choices[0].text)
        if len(pieces) == 5:
            killed = busy_decode(client, cluster)
            cluster.process(killed).signal(signal.SIGKILL)
    assert killed
    assert "".join(pieces) == tokenizer.decode(want)


def busy_decode(client: openai.OpenAI, cluster) -> str:
    for _ in range(100):
        instances = client.get("/cluster", cast_to=object)["instances"]
        running = [
            i["instance_id"]
            for i in instances
            if i["role"] == "decode" and i["load"] and i["load"]["num_running"] > 0
        ]
        if running:
            return running[0]
        time.sleep(0.05)
    raise AssertionError("no decode instance reports the request running")
