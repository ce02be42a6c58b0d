"""A decode instance that gives no answer for a moment is waited for, not reported full.

After a NATS restart a conductor may be back on the server before a decode instance has
subscribed again, and a killed decode instance is still live by its last telemetry until it
goes stale: either way a reservation or a start meets "no responders". Such silence is not a
refusal: the request waits (up to --placement-wait-s) and asks again, instead of answering
429 "no live decode instance has room". Here the one decode instance is killed, requests
arrive while its telemetry (one report a second) still says it is live, and it is restarted:
every request completes with the emulated engine's tokens.
"""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import pytest
from expected import expected_text

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
PROMPT_BYTES = 200
MAX_TOKENS = 20
NUM_REQUESTS = 3


@pytest.fixture(scope="module", params=["reserve", "start-on-decode"])
def cluster(tmp_path_factory, request):
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("silence"),
        api_port=free_port(),
        engine_args=["--emulated-time-scale", "0.05"],
        # Slow telemetry: the killed decode stays live for the conductor for 3 s.
        decode_args=["--telemetry-period-s", "1.0"],
        conductor_args=["--local-prefill", "512"] if request.param == "start-on-decode" else [],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


async def _complete(session: aiohttp.ClientSession, url: str, prompt: str) -> tuple[int, dict]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS}
    async with session.post(f"{url}/v1/completions", json=body) as answer:
        return answer.status, await answer.json()


async def test_requests_wait_for_a_silent_decode_instance_and_complete(cluster):
    decode = cluster.process("decode-0")
    prompts = [f"silence {i}: ".ljust(PROMPT_BYTES, "s") for i in range(NUM_REQUESTS)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        assert (await _complete(session, cluster.api_url, prompts[0]))[0] == 200  # warm
        decode.signal(signal.SIGKILL)
        await asyncio.to_thread(decode.popen.wait, 10)
        answers = [
            asyncio.create_task(_complete(session, cluster.api_url, prompt)) for prompt in prompts
        ]
        await asyncio.sleep(0.5)  # every request has met the silence by now
        decode.start()  # from the main thread, as the supervisor does
        results = await asyncio.gather(*answers)
    for prompt, (status, body) in zip(prompts, results):
        assert status == 200, body
        assert body["choices"][0]["text"] == expected_text(prompt, MAX_TOKENS)
