"""A cluster whose NATS server takes small messages (max_payload 32 KiB): a prompt within the
model's context but too large for the one message that carries it (a prefill job, a decode
start) is refused up front with a 400 that says why, instead of failing inside the cluster; a
prompt that fits is served. Checked with the openai SDK on the emulated engine."""

from __future__ import annotations

import openai
import pytest

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MAX_PAYLOAD = 32 << 10


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("message-size"),
        api_port=free_port(),
        engine_args=["--emulated-time-scale", "0", "--max-model-len", "65536"],
        nats_max_payload=MAX_PAYLOAD,
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield openai.OpenAI(base_url=f"{cluster.api_url}/v1", api_key="unused", max_retries=0)
    cluster.stop()


def complete(client: openai.OpenAI, num_prompt_tokens: int):
    return client.completions.create(
        model="crescent-emulated", prompt=[65] * num_prompt_tokens, max_tokens=4, temperature=0
    )


def test_a_prompt_over_one_message_is_refused_with_the_reason(client):
    with pytest.raises(openai.BadRequestError) as refused:
        complete(client, 40_000)  # ~40 KB of token ids
    error = refused.value.body
    assert error["code"] == "exceeds_message_size" and error["param"] == "prompt"
    assert f"its max_payload is {MAX_PAYLOAD} bytes" in error["message"]


def test_a_prompt_that_fits_is_served(client):
    # 25,000 one-byte ids: as many at the largest id size would not fit
    answer = complete(client, 25_000)
    assert answer.usage.prompt_tokens == 25_000 and answer.usage.completion_tokens == 4
