"""An instance whose etcd lease ended while it lives is not gone. etcd stalled past the TTL (a
slow disk, a paused process) expires every lease at once when it resumes; each instance
registers again at its next keep-alive. Meanwhile the conductor still hears the instances on
NATS and keeps sending them work, so no request fails in that gap (it was 404 "model does not
exist" and 503 "no live prefill instance" until they registered again).

The leases are ended here by revoking them, which deletes the keys as an expiry does and leaves
the instances to find out at their next keep-alive: with a 15 s TTL, up to 5 s later. In that
gap an instance may also go unheard for a moment (etcd's return sets off a storm of renewals
on a busy host): it is then stale, not gone, until unheard for the lease's TTL."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import pytest
from expected import expected_text
from scrape import metric_total
from sse_client import stream

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.etcd import connect_etcd
from crescent.common.naming import Keys
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
LEASE_TTL_S = 15  # a keep-alive every 5 s: the gap until an instance registers again
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("lease-loss"),
        api_port=free_port(),
        engine_args=["--emulated-time-scale", "1.0"],
        env={"CRESCENT_LEASE_TTL_S": str(LEASE_TTL_S)},
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


async def end_leases(cluster: LocalCluster, roles: tuple[str, ...]) -> int:
    """Revoke the leases the instances of `roles` registered under, once each role has one
    registered (a test before may have ended them); how many were revoked."""
    etcd = await connect_etcd(cluster.etcd_url)
    try:
        prefixes = [f"{Keys(cluster.spec.cluster).instances()}{role}/".encode() for role in roles]
        async with asyncio.timeout(LEASE_TTL_S):
            while True:
                entries = [await etcd.get_prefix(prefix) for prefix in prefixes]
                if all(entries):
                    break
                await asyncio.sleep(0.2)
        leases = {entry.lease for role_entries in entries for entry in role_entries}
        for lease in leases:
            await etcd.revoke_lease(lease)
        return len(leases)
    finally:
        await etcd.close()


async def complete(session: aiohttp.ClientSession, url: str, prompt: str) -> tuple[int, str]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        answer = await response.json()
        if response.status != 200:
            return response.status, answer["error"]["message"]
        return 200, answer["choices"][0]["text"]


async def test_instances_whose_leases_ended_keep_serving_until_they_register_again(cluster):
    conductor = cluster.process("conductor-0")
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.sleep(1.0)  # the conductor hears every instance's telemetry
        assert (await complete(session, cluster.api_url, "before"))[0] == 200
        assert await end_leases(cluster, ("prefill", "decode")) == 2
        ended_at = time.monotonic()

        async def keep_asking(flow: int) -> list[tuple[str, tuple[int, str]]]:
            answers = []
            while time.monotonic() - ended_at < 3.0:
                prompt = f"lease flow {flow} request {len(answers)} " + "x" * 200
                answers.append((prompt, await complete(session, cluster.api_url, prompt)))
            return answers

        flows = await asyncio.gather(*(keep_asking(flow) for flow in range(4)))
    answers = [answer for flow in flows for answer in flow]
    assert len(answers) >= 20
    for prompt, (status, text) in answers:
        assert (status, text) == (200, expected_text(prompt, MAX_TOKENS))
    assert "lease ended while it is still heard" in conductor.log_tail(400)
    await asyncio.to_thread(cluster.wait_serving, 10)


async def test_a_decode_unheard_for_a_moment_before_it_registers_again_keeps_its_streams(cluster):
    """Its lease ended, then it went unheard for 2 s (longer than the stale window, shorter than
    the TTL) before it could register again: its streams wait for it and none is moved (they
    were, when an unregistered instance left at the stale window)."""
    conductor, decode = cluster.process("conductor-0"), cluster.process("decode-0")
    max_tokens = 1000  # ~10 s of emulated decode: past the registration (<= 5 s) and the pause
    prompts = [f"unheard {i} {time.monotonic_ns()} " + "x" * 200 for i in range(3)]
    moved_before = metric_total(cluster.api_url, "crescent_request_migrations_total")
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        seen = [asyncio.Event() for _ in prompts]
        streams = [
            asyncio.create_task(stream(session, cluster.api_url, prompt, max_tokens, event.set))
            for prompt, event in zip(prompts, seen)
        ]
        async with asyncio.timeout(20):
            await asyncio.gather(*(event.wait() for event in seen))
        logged_before = len(conductor.log_path.read_text())
        assert await end_leases(cluster, ("decode",)) == 1
        async with asyncio.timeout(10):  # the conductor has seen the key go and kept decode-0
            while "still heard" not in conductor.log_path.read_text()[logged_before:]:
                await asyncio.sleep(0.05)
        decode.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(2.0)
        finally:
            decode.signal(signal.SIGCONT)
        answers = await asyncio.gather(*streams)
    for prompt, answer in zip(prompts, answers):
        assert answer == (200, expected_text(prompt, max_tokens), "length")
    assert metric_total(cluster.api_url, "crescent_request_migrations_total") == moved_before
    assert "instance gone" not in conductor.log_path.read_text()[logged_before:]
    await asyncio.to_thread(cluster.wait_serving, 20)
