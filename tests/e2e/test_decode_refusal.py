"""A decode reservation refused after placement, on a real cluster: two conductors that share
no state both place a request on the one decode instance, whose KV room holds only one of
them. The decode is paused (SIGSTOP) until both reservations are on the wire, so the race is
certain, not a matter of timing: it answers them in order and refuses the second, and the
start the second's prefill instance sent it too. The same race on prompts the decode computes
itself (conditional disaggregation), where no reservation comes first: the decode admits the
first start and refuses the second. The second's 429 says which instance refused it and why."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import nats
import pytest
from expected import expected_text

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.codec import decode as decode_msg
from crescent.common.messages import DecodeStart, TokenChunk
from crescent.common.naming import Subjects
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
PROMPT_BYTES = 200
MAX_TOKENS = 100
# One request needs PROMPT_BYTES + MAX_TOKENS tokens (a byte tokenizer, plus BOS): room for one.
KV_CAPACITY_TOKENS = 450


@pytest.fixture(scope="module", params=["reserve", "start-on-decode"])
def cluster(tmp_path_factory, request):
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("refusal"),
        api_port=free_port(),
        num_conductors=2,
        engine_args=["--emulated-time-scale", "0.05"],
        # Slow telemetry: the paused decode stays live for the conductors (3 periods).
        decode_args=[
            "--kv-capacity-tokens",
            str(KV_CAPACITY_TOKENS),
            "--telemetry-period-s",
            "1.0",
        ],
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


async def _refusals(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(f"{url}/metrics") as answer:
        text = await answer.text()
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("crescent_decode_refusals_total")
    )


async def test_a_refused_reservation_is_placed_again_and_answered_cleanly(cluster):
    subjects = Subjects(cluster.spec.cluster)
    decode = cluster.process("decode-0")
    on_decode = bool(cluster.spec.conductor_args)
    reserves: list[bytes] = []
    starts: list[bytes] = []
    placed = asyncio.Queue()  # what each conductor sends the decode first
    streamed: set[str] = set()  # the requests (attempts) of which a token was streamed
    watcher = await nats.connect(cluster.nats_url)

    async def record_tokens(msg) -> None:
        chunk = decode_msg(msg.data, TokenChunk)
        if chunk.token_ids:
            streamed.add(chunk.request_id)

    async def record(msg) -> None:
        reserves.append(msg.data)
        await placed.put(msg.subject)

    async def record_start(msg) -> None:
        starts.append(msg.data)
        if on_decode:
            await placed.put(msg.subject)

    prompts = [f"refusal race {i}: ".ljust(PROMPT_BYTES, "r") for i in range(2)]
    timeout = aiohttp.ClientTimeout(total=30)
    try:
        await watcher.subscribe(subjects.decode_reserve("decode-0"), cb=record)
        await watcher.subscribe(subjects.decode_start("decode-0"), cb=record_start)
        await watcher.subscribe(subjects.tokens(">"), cb=record_tokens)
        await watcher.flush()
        async with aiohttp.ClientSession(timeout=timeout) as session:
            before = [await _refusals(session, url) for url in cluster.conductor_urls]
            decode.signal(signal.SIGSTOP)
            try:
                answers = [
                    asyncio.create_task(_complete(session, url, prompt))
                    for url, prompt in zip(cluster.conductor_urls, prompts)
                ]
                for _ in prompts:  # both conductors placed their request on decode-0
                    await asyncio.wait_for(placed.get(), 5.0)
            finally:
                decode.signal(signal.SIGCONT)
            results = await asyncio.gather(*answers)
            after = [await _refusals(session, url) for url in cluster.conductor_urls]
        await watcher.flush()
    finally:
        await watcher.close()

    statuses = sorted(status for status, _ in results)
    assert statuses == [200, 429], results
    for prompt, (status, body) in zip(prompts, results):
        if status == 200:
            assert body["choices"][0]["text"] == expected_text(prompt, MAX_TOKENS)
        else:  # placed again without the refusing decode: no other has room
            message = body["error"]["message"]
            assert "decode-0 refused it:" in message and "no KV room" in message, body
    assert sum(after) - sum(before) == 1, (before, after)
    assert len(streamed) == 1, f"the refused request was started where it was refused: {streamed}"
    if on_decode:  # each start was admitted or refused on arrival, with no reservation first
        assert not reserves
        assert [decode_msg(data, DecodeStart).admit for data in starts] == [True, True]
    else:  # each prefill instance sent its start, as its first token was out
        assert len(reserves) == 2
        assert all(decode_msg(data, DecodeStart).from_prefill for data in starts), starts
