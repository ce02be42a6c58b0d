"""A prefill worker's published queue time (the conductor's T_queue) counts the prefix each
queued job will load from its node's store, not the whole prompt, and says which share of it is
the running job's; a draining one finishes the jobs it holds and refuses new ones."""

import asyncio
import signal
import sys
import time

import msgspec
import nats
import pytest

from crescent.cluster.processes import ManagedProcess, ProcessSpec
from crescent.common.bus import Bus
from crescent.common.codec import decode
from crescent.common.errors import NoRespondersError, RemoteError, RequestTimeoutError
from crescent.common.etcd import connect_etcd
from crescent.common.hashing import block_hashes
from crescent.common.messages import DecodeStart, InstanceLoad, PrefillJob, PrefillResult
from crescent.common.naming import Subjects
from crescent.engine.settings import EngineSettings
from crescent.storeclient.client import ClientConfig, StoreClient

MODEL = "crescent-emulated"
BLOCK_SIZE = 512
BLOCK_BYTES = 4096


def start(infra, cluster: str, tmp_path, role: str, *flags: str) -> ManagedProcess:
    argv = [
        sys.executable,
        "-m",
        f"crescent.{role}",
        "--cluster",
        cluster,
        "--nats-url",
        infra.nats_url,
        "--etcd-url",
        infra.etcd_url,
        "--instance-id",
        f"{role}-q",
        "--node",
        "n0",
        "--lease-ttl-s",
        "2",
        "--log-format",
        "text",
        *flags,
    ]
    process = ManagedProcess(ProcessSpec(name=f"{role}-q", argv=argv), tmp_path / "logs")
    process.start()
    return process


async def telemetry_of(bus: Bus, cluster: str, prefill: ManagedProcess) -> list[InstanceLoad]:
    """The prefill-q instance's telemetry as it comes, once its first message is in."""
    loads: list[InstanceLoad] = []
    await bus.subscribe(
        Subjects(cluster).telemetry("prefill", "prefill-q"), InstanceLoad, loads.append
    )
    deadline = time.monotonic() + 20
    while not loads:
        assert time.monotonic() < deadline and prefill.is_running, prefill.log_tail()
        await asyncio.sleep(0.05)
    return loads


async def until_serving(bus: Bus, subject: str, prefill: ManagedProcess) -> None:
    """Return once a tiny job on `subject` gets an answer (within 20 s)."""
    ping = PrefillJob(request_id="ping", model=MODEL, token_ids=[1, 2, 3], block_size=BLOCK_SIZE)
    deadline = time.monotonic() + 20
    while True:
        try:
            await bus.request(subject, ping, PrefillResult, 5)
            return
        except (NoRespondersError, RequestTimeoutError):
            assert time.monotonic() < deadline and prefill.is_running, prefill.log_tail()
            await asyncio.sleep(0.1)


@pytest.fixture
async def store_client(infra, cluster_name, tmp_path):
    store = start(
        infra,
        cluster_name,
        tmp_path,
        "store",
        "--block-bytes",
        str(BLOCK_BYTES),
        "--dram-bytes",
        str(64 * BLOCK_BYTES),
    )
    bus = await Bus.connect(infra.nats_url, "test-queue")
    etcd = await connect_etcd(infra.etcd_url)
    client = StoreClient(bus, etcd, cluster_name, ClientConfig(node="client", timeout_s=10))
    await client.start()
    deadline = time.monotonic() + 20
    while "n0" not in client.directory.nodes():
        assert time.monotonic() < deadline and store.is_running, store.log_tail()
        await asyncio.sleep(0.05)
    yield bus, client
    await client.close()
    await bus.drain()
    await etcd.close()
    store.stop()


async def test_queue_time_counts_the_prefix_the_store_holds(
    infra, cluster_name, tmp_path, store_client
):
    bus, client = store_client
    cached_prompt = [7 + i % 1000 for i in range(8000)]
    prefix = block_hashes(cached_prompt, BLOCK_SIZE, MODEL)
    await client.put_blocks(MODEL, "n0", prefix, [bytes(BLOCK_BYTES)] * len(prefix))
    fresh_prompt = [11 + i % 997 for i in range(8000)]
    cost = EngineSettings().cost_model()  # the worker's: LLaMA2-7B at full emulated speed
    expected = cost.prefill_s(8000) + cost.prefill_s(8000, len(prefix) * BLOCK_SIZE)
    whole_prompts = cost.prefill_s(8000) * 2

    prefill = start(infra, cluster_name, tmp_path, "prefill", "--block-size", str(BLOCK_SIZE))
    try:
        loads = await telemetry_of(bus, cluster_name, prefill)
        subject = Subjects(cluster_name).prefill_job("prefill-q")
        first = asyncio.create_task(
            bus.request(
                subject,
                PrefillJob(
                    request_id="fresh", model=MODEL, token_ids=fresh_prompt, block_size=BLOCK_SIZE
                ),
                PrefillResult,
                30,
            )
        )
        await asyncio.sleep(0.1)  # the fresh job holds the compute turn (about 1.3 s)
        second = await bus.request(
            subject,
            PrefillJob(
                request_id="cached", model=MODEL, token_ids=cached_prompt, block_size=BLOCK_SIZE
            ),
            PrefillResult,
            30,
        )
        await first
        assert second.num_cached_tokens == len(prefix) * BLOCK_SIZE
        both_queued = [load.queue_time_s for load in loads if load.num_queued == 2]
        assert both_queued, "no telemetry while both jobs were queued"
        assert both_queued[-1] == pytest.approx(expected, rel=1e-6)
        assert expected < whole_prompts * 0.6
        # While the fresh job computes with the cached one behind it, the telemetry says which
        # share of the queue is the running job's, so its overrun is not taken off the other.
        running = [load for load in loads if load.num_queued == 2 and load.running_s > 0]
        assert running, "no telemetry while the fresh job computed"
        assert running[-1].running_predicted_s == pytest.approx(cost.prefill_s(8000), rel=1e-6)
    finally:
        prefill.stop()


async def test_a_draining_prefill_finishes_its_jobs_and_refuses_new_ones(
    infra, cluster_name, tmp_path, store_client
):
    bus, _ = store_client
    prefill = start(infra, cluster_name, tmp_path, "prefill", "--block-size", str(BLOCK_SIZE))
    subject = Subjects(cluster_name).prefill_job("prefill-q")
    try:
        await until_serving(bus, subject, prefill)
        long_prompt = [11 + i % 997 for i in range(8000)]  # about 1.3 s of compute
        held = asyncio.create_task(
            bus.request(
                subject,
                PrefillJob(
                    request_id="held", model=MODEL, token_ids=long_prompt, block_size=BLOCK_SIZE
                ),
                PrefillResult,
                30,
            )
        )
        await asyncio.sleep(0.2)
        prefill.signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        with pytest.raises(RemoteError, match="draining"):
            await bus.request(
                subject,
                PrefillJob(
                    request_id="late", model=MODEL, token_ids=[1, 2, 3], block_size=BLOCK_SIZE
                ),
                PrefillResult,
                5,
            )
        assert (await held).request_id == "held"
        assert await asyncio.to_thread(prefill.popen.wait, 15) == 0
    finally:
        prefill.stop()


async def test_a_job_under_the_id_of_a_running_one_is_refused_and_the_running_one_goes_on(
    infra, cluster_name, tmp_path, store_client
):
    """Two jobs under one id would share one cancel and one engine request id: the second is
    refused with a clear error (the conductor gives each job of a request its own id)."""
    bus, _ = store_client
    prefill = start(infra, cluster_name, tmp_path, "prefill", "--block-size", str(BLOCK_SIZE))
    subject = Subjects(cluster_name).prefill_job("prefill-q")

    def job(request_id: str, token_ids: list[int]) -> PrefillJob:
        return PrefillJob(
            request_id=request_id, model=MODEL, token_ids=token_ids, block_size=BLOCK_SIZE
        )

    try:
        await until_serving(bus, subject, prefill)
        long_prompt = [11 + i % 997 for i in range(8000)]  # about 1.3 s of compute
        running = asyncio.create_task(
            bus.request(subject, job("twice", long_prompt), PrefillResult, 30)
        )
        await asyncio.sleep(0.2)
        with pytest.raises(RemoteError, match="already running"):
            await bus.request(subject, job("twice", [1, 2, 3]), PrefillResult, 5)
        assert (await running).request_id == "twice"
    finally:
        prefill.stop()


async def test_telemetry_acknowledges_the_jobs_it_counts(
    infra, cluster_name, tmp_path, store_client
):
    """A conductor adds a job to the reported queue until a report says it was received
    (InstanceLoad.received): the report that counts the queued job names its number."""
    bus, _ = store_client
    prefill = start(infra, cluster_name, tmp_path, "prefill", "--block-size", str(BLOCK_SIZE))
    try:
        loads = await telemetry_of(bus, cluster_name, prefill)
        assert all(not load.received for load in loads)  # nothing numbered received yet
        job = PrefillJob(
            request_id="numbered",
            model=MODEL,
            token_ids=[11 + i % 997 for i in range(8000)],  # about 1.3 s of compute
            block_size=BLOCK_SIZE,
            conductor="conductor-t",
            assignment=7,
        )
        running = asyncio.create_task(
            bus.request(Subjects(cluster_name).prefill_job("prefill-q"), job, PrefillResult, 30)
        )
        deadline = time.monotonic() + 10
        while not [load for load in loads if load.num_queued == 1]:
            assert time.monotonic() < deadline, "no telemetry counted the job"
            await asyncio.sleep(0.05)
        counting = [load for load in loads if load.num_queued == 1]
        assert counting[0].received == {"conductor-t": 7}
        await running
    finally:
        prefill.stop()


async def test_the_prefill_starts_the_decode_the_job_names_with_its_first_token(
    infra, cluster_name, tmp_path, store_client
):
    """A job that carries its decode start: the prefill instance sends it to the decode
    instance, its first token and its prompt filled in, as that token is out (no conductor in
    between), and the decode's answer goes to the conductor that reads the stream; unless that
    token ends the answer."""
    bus, _ = store_client
    subjects = Subjects(cluster_name)
    starts: asyncio.Queue[tuple[DecodeStart, str]] = asyncio.Queue()
    watcher = await nats.connect(infra.nats_url)

    async def record(msg) -> None:
        starts.put_nowait((decode(msg.data, DecodeStart), msg.reply))

    await watcher.subscribe(subjects.decode_start("decode-x"), cb=record)
    await watcher.flush()
    prefill = start(infra, cluster_name, tmp_path, "prefill", "--block-size", str(BLOCK_SIZE))
    prompt = [11, 12, 13, 14]
    template = DecodeStart(
        request_id="direct",
        token_ids=[],  # the job's prompt goes in
        first_token=None,
        max_tokens=8,
        stream_owner="conductor-t",
        from_prefill=True,
    )

    async def prefill_job(request_id: str, **fields) -> PrefillResult:
        job = PrefillJob(
            request_id=request_id, model=MODEL, token_ids=prompt, block_size=BLOCK_SIZE, **fields
        )
        return await bus.request(subjects.prefill_job("prefill-q"), job, PrefillResult, 10)

    to_decode = {"decode_instance": "decode-x", "decode_node": "n0"}
    try:
        await telemetry_of(bus, cluster_name, prefill)
        result = await prefill_job("direct", decode_start=template, **to_decode)
        sent, reply_to = await asyncio.wait_for(starts.get(), 5)
        assert sent == msgspec.structs.replace(
            template, token_ids=prompt, first_token=result.first_token
        )
        assert reply_to == subjects.start_reply("direct", "conductor-t")
        # The same prompt gives the same first token: here one that ends the answer.
        ended = await prefill_job(
            "ended",
            decode_start=msgspec.structs.replace(template, request_id="ended"),
            ends_on_first=[result.first_token + 1, result.first_token],
            **to_decode,
        )
        assert ended.first_token == result.first_token
        await watcher.flush()  # a start sent before the result would be here by now
        await asyncio.sleep(0.1)
        assert starts.empty(), "a start was sent for an answer its first token ended"
        with pytest.raises(RemoteError, match="needs a decode instance"):
            await prefill_job("nowhere", decode_start=template)
        assert starts.empty()
    finally:
        await watcher.close()
        prefill.stop()
