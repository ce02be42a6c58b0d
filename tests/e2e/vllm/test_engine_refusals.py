"""A request vLLM refuses for a parameter only vLLM checks (a response schema nested deeper
than it compiles) is a 400 naming vLLM's reason, whichever instance computes the prompt: a
prefill instance, or the decode instance itself (conditional disaggregation). Before, the
refusal read as a failed instance: the request was moved until no instance was left and the
client got a 429 or a 503. The refusing instance stays in use."""

from __future__ import annotations

import openai
import pytest
from scrape import metric, metric_total
from vllm_helpers import ENV

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytest.importorskip("vllm", reason="needs the vLLM CPU build (make install-vllm)")

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(600)]

LOCAL_PREFILL_TOKENS = 64  # prompts of at most this many tokens are computed on decode
VLLM_MAX_NESTING = 64  # vLLM's MAX_STRUCTURED_OUTPUT_JSON_NESTING


def nested_schema(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


TOO_DEEP = {
    "type": "json_schema",
    "json_schema": {"name": "deep", "schema": nested_schema(VLLM_MAX_NESTING + 6)},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir):
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("engine-refusals"),
        api_port=free_port(),
        engine="vllm",
        model_dir=tiny_model_dir,
        env=ENV,
        store_dram_bytes=64 << 20,
        store_ssd_bytes=64 << 20,
        conductor_args=["--local-prefill", str(LOCAL_PREFILL_TOKENS)],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=600)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def client(cluster) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{cluster.api_url}/v1", api_key="unused", max_retries=0, timeout=120
    )


def ask(client: openai.OpenAI, model: str, content: str, stream: bool, **fields) -> str:
    messages = [{"role": "user", "content": content}]
    if stream:
        chunks = client.chat.completions.create(
            model=model, messages=messages, max_tokens=4, stream=True, **fields
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=4, **fields)
    return reply.choices[0].message.content or ""


@pytest.mark.parametrize("computed_on", ["decode", "prefill"])
def test_a_parameter_vllm_refuses_is_a_400_and_moves_nothing(
    cluster, client, tiny_model_dir, computed_on
):
    model = tiny_model_dir.name
    content = "hi" if computed_on == "decode" else "hello " * 200
    on_decode_before = metric(cluster.api_url, "crescent_prefill_on_decode_total")
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            ask(client, model, content, stream, response_format=TOO_DEEP)
        assert "nested too deeply" in refused.value.message
    assert metric_total(cluster.api_url, "crescent_request_migrations_total") == 0
    assert isinstance(ask(client, model, content, stream=False), str)  # served where refused
    on_decode = metric(cluster.api_url, "crescent_prefill_on_decode_total") - on_decode_before
    assert on_decode == (3 if computed_on == "decode" else 0)
