"""The control-plane bench's floor-1P1D sends a 1P1D request's NATS messages, on a real server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request

import nats

from crescent.cluster.processes import is_port_open
from crescent.common.ports import free_port


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


async def _one_request_seen_on_the_bus(nats_url: str, url: str) -> tuple[dict, list[str]]:
    client = await nats.connect(nats_url)
    seen: list[str] = []

    async def note(msg) -> None:
        kind = "reply" if msg.subject.startswith("_INBOX.") else msg.subject
        kind = "floor.conductor" if kind.startswith("floor.conductor.") else kind
        seen.append(kind + (" +reply-to" if msg.reply else ""))

    await client.subscribe(">", cb=note)
    await client.flush()
    body = {"model": "m", "prompt": "hello", "max_tokens": 8}
    answer = await asyncio.to_thread(_post, url, body)
    await asyncio.sleep(0.3)  # the sniffer's copies of the last messages
    await client.close()
    return answer, seen


def test_the_floor_sends_a_1p1d_requests_messages_and_nothing_else(infra):
    port = free_port()
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "crescent.bench.messaging_floor", role]
            + ["--nats-url", infra.nats_url, "--port", str(port)]
        )
        for role in ("prefill", "decode", "conductor")
    ]
    try:
        deadline = time.monotonic() + 30
        while not is_port_open(port):
            assert time.monotonic() < deadline and all(p.poll() is None for p in processes)
            time.sleep(0.05)
        answer, seen = asyncio.run(
            _one_request_seen_on_the_bus(infra.nats_url, f"http://127.0.0.1:{port}/v1/completions")
        )
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)
    assert answer["choices"][0]["text"] == "x" * 8  # the first token and the decode's seven
    # As in 1P1D: reservation and job (requests), the prefill's start to the decode (answered
    # to the conductor), the two replies, the decode's answer to the start, the tokens.
    assert sorted(seen) == sorted(
        [
            "floor.decode.reserve +reply-to",
            "floor.prefill.job +reply-to",
            "floor.decode.start +reply-to",
            "reply",
            "reply",
            "floor.conductor",
            "floor.conductor",
        ]
    )
