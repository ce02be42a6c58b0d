"""Faults under load on a real 2-prefill 2-decode cluster: no admitted request is lost.

Every request here either completes with exactly the emulated engine's tokens or is refused
before any work; a worker that is paused (SIGSTOP) fails nothing, and a worker that is killed
has its requests moved: prefill ones placed again, decode ones continued from the tokens
already streamed.
"""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import nats
import pytest
from expected import expected_text
from prometheus_client.parser import text_string_to_metric_families
from sse_client import stream

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.codec import decode
from crescent.common.messages import PrefillJob
from crescent.common.naming import Subjects
from crescent.common.ports import free_port

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
PROMPT_BYTES = 1500  # ~0.2 s of emulated prefill
MAX_TOKENS = 120  # ~1.2 s of emulated decode


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("faults"),
        api_port=free_port(),
        num_prefill=2,
        num_decode=2,
        engine_args=["--emulated-time-scale", "1.0"],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


def process(cluster: LocalCluster, name: str):
    return next(p for p in cluster.processes if p.spec.name == name)


def prompt(i: int) -> str:
    head = f"fault request {i} at {time.monotonic_ns()}: "
    return head + "x" * (PROMPT_BYTES - len(head))


async def load_with_fault(
    cluster: LocalCluster, fault, texts: list[str] | None = None, max_tokens: int = MAX_TOKENS
) -> list[tuple[str, tuple]]:
    """Stream each of `texts` (default: eight prompts), apply `fault` once they are under way,
    wait for them all."""
    prompts = texts or [prompt(i) for i in range(8)]
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tasks = [
            asyncio.create_task(stream(session, cluster.api_url, p, max_tokens)) for p in prompts
        ]
        await asyncio.sleep(0.5)
        await fault()
        results = await asyncio.gather(*tasks)
    return list(zip(prompts, results))


async def load_while_decoding(
    cluster: LocalCluster, texts: list[str], max_tokens: int, fault, **stream_args
) -> list[tuple[str, tuple]]:
    """Stream each of `texts`; apply `fault` once every stream has a token (all are decoding),
    then wait for them all."""
    tokens_seen = [0] * len(texts)

    def counter(i: int):
        def on_token() -> None:
            tokens_seen[i] += 1

        return on_token

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks = [
            asyncio.create_task(
                stream(session, cluster.api_url, text, max_tokens, counter(i), **stream_args)
            )
            for i, text in enumerate(texts)
        ]
        deadline = time.monotonic() + 20
        while min(tokens_seen) == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert min(tokens_seen) > 0, "not every stream was decoding"
        await fault()
        results = await asyncio.gather(*tasks)
    return list(zip(texts, results))


def assert_all_correct(results: list[tuple[str, tuple]], max_tokens: int = MAX_TOKENS) -> None:
    for text, (status, output, finish) in results:
        assert status == 200, output
        assert output == expected_text(text, max_tokens)
        assert finish == "length"


async def watch_decode_starts(cluster: LocalCluster):
    """A NATS connection counting the decode starts seen on the wire, per decode instance
    (close the connection when done)."""
    subjects = Subjects(cluster.spec.cluster)
    starts: dict[str, int] = {}
    watcher = await nats.connect(cluster.nats_url)

    async def record(msg) -> None:
        instance_id = msg.subject.removeprefix(f"{subjects.prefix}decode.").split(".")[0]
        starts[instance_id] = starts.get(instance_id, 0) + 1

    await watcher.subscribe(subjects.decode_start("*"), cb=record)
    await watcher.flush()
    return watcher, starts


async def restart(cluster: LocalCluster, name: str) -> None:
    process(cluster, name).start()
    await asyncio.to_thread(cluster.wait_serving, 30)


@pytest.mark.parametrize("name", ["prefill-0", "decode-0"])
async def test_a_worker_paused_for_3s_fails_nothing(cluster, name):
    async def pause():
        process(cluster, name).signal(signal.SIGSTOP)
        await asyncio.sleep(3.0)
        process(cluster, name).signal(signal.SIGCONT)

    assert_all_correct(await load_with_fault(cluster, pause))
    await asyncio.to_thread(cluster.wait_serving, 10)


async def test_killed_decode_streams_go_on_elsewhere_with_the_same_tokens(cluster):
    """The decode killed is the one most streams were started on: the conductor learns from
    the tests before (a paused decode looks slow for a while) and may send them all to one."""
    watcher, starts = await watch_decode_starts(cluster)
    victim: list[str] = []

    async def kill():
        victim.append(max(starts, key=starts.__getitem__))
        process(cluster, victim[0]).signal(signal.SIGKILL)

    try:
        results = await load_with_fault(cluster, kill)
        assert_all_correct(results)
        metrics = await _metrics(cluster)
        assert any(
            line.startswith("crescent_request_migrations_total{") and 'stage="decode"' in line
            for line in metrics.splitlines()
        )
    finally:  # the next tests need a whole cluster
        await watcher.close()
        for name in victim:
            await restart(cluster, name)


async def test_killed_prefill_jobs_are_placed_again(cluster):
    """Each job placed again goes out under an id of its own: a late cancel of the job it
    replaces, or that job's engine request, can never stop it."""
    job_ids: list[str] = []
    watcher = await nats.connect(cluster.nats_url)

    async def record(msg) -> None:
        job_ids.append(decode(msg.data, PrefillJob).request_id)

    async def kill():
        process(cluster, "prefill-1").signal(signal.SIGKILL)

    # Long prompts so that jobs are queued on both prefill instances when one dies.
    try:
        await watcher.subscribe(Subjects(cluster.spec.cluster).prefill_job("*"), cb=record)
        await watcher.flush()
        assert_all_correct(await load_with_fault(cluster, kill, [prompt(i) for i in range(12)]))
    finally:
        await watcher.close()
        await restart(cluster, "prefill-1")
    assert len(job_ids) > 12, "no job was placed again"
    assert len(set(job_ids)) == len(job_ids), sorted(job_ids)


async def test_client_gone_cancels_its_prefill_job(cluster):
    """A client that leaves while its prompt waits in a prefill queue: the job is dropped."""
    long_prompt = "y" * 6000  # ~0.9 s of prefill each
    async with aiohttp.ClientSession() as session:
        queued = [
            asyncio.create_task(stream(session, cluster.api_url, f"{i} {long_prompt}", 4))
            for i in range(4)
        ]
        await asyncio.sleep(0.3)
        for task in queued:
            task.cancel()
        await asyncio.gather(*queued, return_exceptions=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        logs = "".join(process(cluster, f"prefill-{i}").log_path.read_text() for i in range(2))
        if logs.count('"prefill cancelled"') >= 2:
            break
        await asyncio.sleep(0.2)
    assert logs.count('"prefill cancelled"') >= 2


async def _metrics(cluster: LocalCluster) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{cluster.api_url}/metrics") as response:
            return await response.text()


@pytest.mark.parametrize("name", ["store-node0", "nats", "etcd"])
async def test_store_killed_or_nats_or_etcd_restarted_under_load_fails_nothing(cluster, name):
    """The store comes back empty (prompts are computed again); NATS and etcd come back on the
    same ports, with etcd's data. Requests in flight move or wait; none fails."""

    async def bounce():
        target = process(cluster, name)
        if name.startswith("store"):
            target.signal(signal.SIGKILL)
            await asyncio.sleep(0.5)
        else:
            await asyncio.to_thread(target.stop)
        target.start()
        await asyncio.to_thread(target.wait_ready, 30)

    assert_all_correct(await load_with_fault(cluster, bounce))
    await asyncio.to_thread(cluster.wait_serving, 30)


async def restart_nats(cluster: LocalCluster) -> None:
    """Stop nats-server (SIGTERM) and start it again on the same port."""
    nats_server = process(cluster, "nats")
    await asyncio.to_thread(nats_server.stop)
    nats_server.start()
    await asyncio.to_thread(nats_server.wait_ready, 30)


def _sample(metrics: str, name: str, **labels: str) -> float:
    """The value of one sample of the conductor's /metrics (0 when absent)."""
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


async def test_nats_restart_mid_stream_keeps_every_stream_on_its_decode(cluster):
    """NATS restarts while every stream is decoding: the conductor asks each decode for the
    chunks the drop may have lost and reads on. No stream is moved; a move would compute its
    prompt and tokens again on another decode instance."""
    num_streams, max_tokens = 6, 400  # ~4 s of decode: longer than the restart
    texts = [prompt(i) for i in range(num_streams)]
    before = await _metrics(cluster)
    results = await load_while_decoding(cluster, texts, max_tokens, lambda: restart_nats(cluster))
    after = await _metrics(cluster)
    assert_all_correct(results, max_tokens)

    def moved(metrics: str) -> float:
        return _sample(metrics, "crescent_request_migrations_total", stage="decode")

    def resent(metrics: str) -> float:
        return _sample(metrics, "crescent_stream_resends_total", outcome="resent")

    assert moved(after) == moved(before)
    assert resent(after) - resent(before) >= num_streams
    await asyncio.to_thread(cluster.wait_serving, 30)


async def test_nats_restart_mid_prefill_computes_no_prompt_again(cluster):
    """NATS restarts while prompts are computing: each conductor asks the prefill instance for
    the result its job's reply may have lost, instead of placing the request again."""
    long_prompt = "z" * 6000  # ~0.9 s of prefill each: two queue on each prefill instance
    texts = [f"mid-prefill {i} {time.monotonic_ns()} {long_prompt}" for i in range(4)]
    before = await _metrics(cluster)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks = [
            asyncio.create_task(stream(session, cluster.api_url, text, MAX_TOKENS))
            for text in texts
        ]
        await asyncio.sleep(0.3)
        await restart_nats(cluster)
        results = await asyncio.gather(*tasks)
    after = await _metrics(cluster)
    assert_all_correct(list(zip(texts, results)))

    def moved(metrics: str) -> float:
        return _sample(metrics, "crescent_request_migrations_total", stage="prefill")

    def answered(metrics: str) -> float:
        return _sample(metrics, "crescent_prefill_result_asks_total", outcome="answered")

    assert moved(after) == moved(before)
    assert answered(after) - answered(before) >= 1
    await asyncio.to_thread(cluster.wait_serving, 30)
