"""Conditional disaggregation on an emulated 1P1D cluster: with --local-prefill N, a prompt
that short is computed by the decode instance (no prefill job, the decision on the trace), a
longer one still goes to the prefill instance, and both answer what prefill + decode would;
with --local-prefill auto, the decode instance's published cost model draws the line, counting
the prompts it is already computing against the TBT SLO."""

import asyncio
import json
import time

import aiohttp
import pytest
from expected import expected_text
from scrape import metric

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
THRESHOLD = 64  # tokens (bytes: the emulated model's tokenizer)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, otlp):
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("cluster"),
        api_port=free_port(),
        env=env,
        engine_args=["--emulated-time-scale", "0.05"],
        conductor_args=["--local-prefill", str(THRESHOLD)],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


def local_prefills(cluster) -> float:
    return metric(cluster.api_url, "crescent_prefill_on_decode_total")


async def complete(cluster, prompt: str, max_tokens: int, stream: bool = False) -> tuple[str, str]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{cluster.api_url}/v1/completions", json=body) as response,
    ):
        assert response.status == 200, await response.text()
        if not stream:
            result = await response.json()
            return result["id"], result["choices"][0]["text"]
        request_id, text = "", ""
        async for line in response.content:
            data = line.decode().removeprefix("data: ").strip()
            if data and data != "[DONE]":
                chunk = json.loads(data)
                request_id = chunk["id"]
                text += "".join(c["text"] for c in chunk["choices"])
        return request_id, text


async def spans_of(otlp, request_id: str, names: set[str]) -> dict[str, dict]:
    deadline = time.monotonic() + 10
    while {s["name"] for s in otlp.trace_of(request_id)} < names:
        assert time.monotonic() < deadline, (
            f"spans so far: {[s['name'] for s in otlp.trace_of(request_id)]}"
        )
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)  # spans of other services still in flight
    return {s["name"]: s for s in otlp.trace_of(request_id)}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_short_prompt_is_computed_on_decode_with_the_same_answer(cluster, otlp, stream):
    prompt = f"short {stream}"
    before = local_prefills(cluster)
    prompt_tokens_before = metric(cluster.api_url, "crescent_prefilled_prompt_tokens_total")
    request_id, text = await complete(cluster, prompt, 12, stream)
    assert text == expected_text(prompt, 12)
    assert local_prefills(cluster) == before + 1
    # The cache hit rate counts the prompt the decode computed (none of it cached).
    assert metric(
        cluster.api_url, "crescent_prefilled_prompt_tokens_total"
    ) == prompt_tokens_before + len(prompt.encode())
    spans = await spans_of(otlp, request_id, {"conductor.schedule", "decode.generate"})
    assert spans["conductor.schedule"]["attributes"]["crescent.prefill_on_decode"].bool_value
    assert spans["decode.generate"]["attributes"]["crescent.prefill_on_decode"].bool_value
    assert "prefill.compute" not in spans


async def test_a_prompt_longer_than_the_threshold_goes_to_the_prefill_instance(cluster, otlp):
    prompt = "long " * (THRESHOLD // 5 + 1)
    before = local_prefills(cluster)
    request_id, text = await complete(cluster, prompt, 12)
    assert text == expected_text(prompt, 12)
    assert local_prefills(cluster) == before
    spans = await spans_of(
        otlp, request_id, {"conductor.schedule", "prefill.compute", "decode.generate"}
    )
    assert not spans["conductor.schedule"]["attributes"]["crescent.prefill_on_decode"].bool_value


async def test_a_one_token_answer_comes_from_decode(cluster):
    prompt = "one"
    _, text = await complete(cluster, prompt, 1)
    assert text == expected_text(prompt, 1)


def auto_cluster(workdir) -> LocalCluster:
    """`--local-prefill auto` at full time scale: the emulated engine prices 8 tokens at well
    under a millisecond, 2,000 at about 0.26 s and 4,000 at about 0.56 s, against a 0.3 s TBT
    SLO."""
    spec = ClusterSpec(
        workdir=workdir,
        api_port=free_port(),
        conductor_args=["--local-prefill", "auto", "--tbt-slo-s", "0.3"],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    return cluster


async def test_auto_has_decode_compute_what_its_cost_model_prices_within_the_tbt_slo(tmp_path):
    auto = auto_cluster(tmp_path)
    try:
        short, long = "short it", "x" * 4000
        _, text = await complete(auto, short, 4)
        assert text == expected_text(short, 4)
        assert local_prefills(auto) == 1
        _, text = await complete(auto, long, 4)
        assert text == expected_text(long, 4)
        assert local_prefills(auto) == 1
    finally:
        auto.stop()


async def test_auto_keeps_a_bursts_prompts_on_decode_within_one_tbt_slo(tmp_path):
    """Two 2,000-token prompts at once on a fresh cluster (no remote overhead learned yet, so
    about 0.26 s on either instance): the first is computed on decode; the second would make
    that step twice the 0.3 s TBT SLO, while the idle prefill instance answers it well within
    a tenth of the 30 s TTFT SLO."""
    auto = auto_cluster(tmp_path)
    try:
        prompts = [f"{i}" + "y" * 1999 for i in range(2)]
        answers = await asyncio.gather(*(complete(auto, prompt, 4) for prompt in prompts))
        assert [text for _, text in answers] == [expected_text(prompt, 4) for prompt in prompts]
        assert local_prefills(auto) == 1
    finally:
        auto.stop()
