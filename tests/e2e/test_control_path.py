"""The request path's NATS messages, watched on the wire: what the conductor sends at once
instead of one after the other."""

from __future__ import annotations

import time

import aiohttp
import nats
import pytest
from expected import expected_first_token, expected_text

from crescent.common.codec import decode
from crescent.common.messages import PrefillJob
from crescent.common.naming import Subjects

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"


async def test_the_prefill_job_goes_out_before_the_decode_reservation_is_answered(dev_cluster):
    """The conductor sends the decode reservation and the prefill job together: the job is on
    the wire before the decode's reply to the reservation (sent one after the other, the job
    could only follow that reply)."""
    subjects = Subjects(dev_cluster.spec.cluster)
    watcher = await nats.connect(dev_cluster.nats_url)
    seen: list[tuple[str, str]] = []  # (subject, reply subject) in the order the server sent them

    async def record(msg) -> None:
        seen.append((msg.subject, msg.reply))

    try:
        await watcher.subscribe(">", cb=record)
        await watcher.flush()
        prompt = "watch the wire: " * 3
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{dev_cluster.api_url}/v1/completions", json=body) as answer:
                assert answer.status == 200, await answer.text()
                assert (await answer.json())["choices"][0]["text"] == expected_text(prompt, 4)
        await watcher.flush()
    finally:
        await watcher.close()
    reserves = [
        (i, reply)
        for i, (subject, reply) in enumerate(seen)
        if subject.startswith(subjects.prefix + "decode.") and subject.endswith(".reserve")
    ]
    jobs = [
        i
        for i, (subject, _) in enumerate(seen)
        if subject.startswith(subjects.prefix + "prefill.") and subject.endswith(".job")
    ]
    assert len(reserves) == 1 and len(jobs) == 1, seen
    [(_, reserve_inbox)] = reserves
    answered_at = next(i for i, (subject, _) in enumerate(seen) if subject == reserve_inbox)
    assert jobs[0] < answered_at, seen


async def test_a_first_token_that_ends_the_answer_starts_no_decode(dev_cluster):
    """The prefill instance starts the decode only when decoding follows: a first token that is
    one of the request's stop tokens ends the answer there, and no start goes out for it."""
    subjects = Subjects(dev_cluster.spec.cluster)
    watcher = await nats.connect(dev_cluster.nats_url)
    starts: list[str] = []

    async def record(msg) -> None:
        starts.append(msg.subject)

    prompt = "one token is enough: " * 2
    stop = {"stop_token_ids": [expected_first_token(prompt)]}
    try:
        await watcher.subscribe(subjects.decode_start("*"), cb=record)
        await watcher.flush()
        async with aiohttp.ClientSession() as session:
            for extra, finish_reason, num_starts in ((stop, "stop", 0), ({}, "length", 1)):
                body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, **extra}
                url = f"{dev_cluster.api_url}/v1/completions"
                async with session.post(url, json=body) as answer:
                    assert answer.status == 200, await answer.text()
                    choice = (await answer.json())["choices"][0]
                assert choice["finish_reason"] == finish_reason, choice
                await watcher.flush()
                assert len(starts) == num_starts, (extra, starts)
    finally:
        await watcher.close()


async def test_the_prefill_job_carries_the_prefix_the_conductor_planned_to_reuse(dev_cluster):
    """The job says how much of the prompt the conductor counts on the prefill node's store
    for (the engine asks the store only when its own cache holds less): none for a new
    prompt, the two full 512-token blocks once the same prompt's blocks are in the index."""
    subjects = Subjects(dev_cluster.spec.cluster)
    watcher = await nats.connect(dev_cluster.nats_url)
    planned: list[int | None] = []

    async def record(msg) -> None:
        planned.append(decode(msg.data, PrefillJob).planned_prefix_tokens)

    prompt = "plan the reuse of this prefix. " * 40  # 1,240 tokens: two full blocks
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    try:
        await watcher.subscribe(subjects.prefix + "prefill.*.job", cb=record)
        await watcher.flush()
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 10  # etcd is written just after a store commit
            while not planned or planned[-1] == 0:
                assert time.monotonic() < deadline, planned
                async with session.post(f"{dev_cluster.api_url}/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                await watcher.flush()
    finally:
        await watcher.close()
    assert planned[0] == 0 and planned[-1] == 1024, planned
