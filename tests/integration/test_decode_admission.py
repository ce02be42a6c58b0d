"""A decode instance's own admission, on a real process: KV room and, once the cluster config
gives a TBT SLO, the predicted time between tokens; its telemetry says when it takes no work
(full, draining)."""

import asyncio
import signal
import sys
import time

import msgspec
import pytest

from crescent.cluster.processes import ManagedProcess, ProcessSpec
from crescent.common.bus import Bus
from crescent.common.codec import encode
from crescent.common.errors import NoRespondersError, RemoteError, RequestTimeoutError
from crescent.common.etcd import connect_etcd
from crescent.common.messages import (
    Ack,
    ClusterConfig,
    DecodeCancel,
    DecodeStart,
    InstanceLoad,
    Reservation,
    ReservationReply,
    TokenChunk,
)
from crescent.common.naming import Keys, Subjects

START_TIMEOUT_S = 30


@pytest.fixture
async def decode(infra, cluster_name, tmp_path):
    """Start a decode worker (emulated LLaMA2-7B timing) with the given flags; yields (bus,
    start)."""
    bus = await Bus.connect(infra.nats_url, "test-admission")
    processes = []

    async def start(*flags: str) -> ManagedProcess:
        argv = [
            sys.executable,
            "-m",
            "crescent.decode",
            "--cluster",
            cluster_name,
            "--nats-url",
            infra.nats_url,
            "--etcd-url",
            infra.etcd_url,
            "--instance-id",
            "decode-a",
            "--lease-ttl-s",
            "2",
            "--log-format",
            "text",
            # The tests hold reservations they never start: a stop waiting for them would take
            # the whole stop deadline. The drain test asks for its own.
            "--drain-timeout-s",
            "0",
            *flags,
        ]
        process = ManagedProcess(ProcessSpec(name="decode-a", argv=argv), tmp_path / "logs")
        process.start()
        processes.append(process)
        await reserve(bus, cluster_name, "warm-up", 1, START_TIMEOUT_S, process)
        return process

    yield bus, start
    for process in processes:
        process.stop()
    await bus.drain()


async def reserve(
    bus: Bus,
    cluster: str,
    request_id: str,
    num_prompt_tokens: int,
    wait_s: float = 5,
    process: ManagedProcess | None = None,
    is_moved: bool = False,
) -> ReservationReply:
    """Reserve on decode-a, waiting up to `wait_s` for it to serve."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await bus.request(
                Subjects(cluster).decode_reserve("decode-a"),
                Reservation(
                    request_id=request_id,
                    num_prompt_tokens=num_prompt_tokens,
                    max_tokens=16,
                    is_moved=is_moved,
                ),
                ReservationReply,
                5,
            )
        except (NoRespondersError, RequestTimeoutError):
            assert time.monotonic() < deadline, (
                process.log_tail() if process else "decode-a not serving"
            )
            await asyncio.sleep(0.1)


async def put_config(infra, cluster: str, tbt_slo_s: float) -> None:
    etcd = await connect_etcd(infra.etcd_url)
    try:
        config = ClusterConfig(block_size=512, ttft_slo_s=30.0, tbt_slo_s=tbt_slo_s)
        await etcd.put(Keys(cluster).config().encode(), encode(config))
    finally:
        await etcd.close()


async def test_reservation_is_refused_when_the_predicted_tbt_exceeds_the_clusters_slo(
    infra, cluster_name, decode
):
    bus, start = decode
    await start("--kv-capacity-tokens", str(1 << 24))
    assert (await reserve(bus, cluster_name, "before-config", 4000)).accepted  # no SLO known yet

    # One LLaMA2-7B step reads ~13 GB of weights: at 1.5 TB/s that is ~9 ms, over a 1 ms SLO.
    await put_config(infra, cluster_name, tbt_slo_s=0.001)
    deadline = time.monotonic() + 5
    while (
        reply := await reserve(bus, cluster_name, f"tight-{time.monotonic_ns()}", 4000)
    ).accepted:
        assert time.monotonic() < deadline, "the TBT SLO never applied"
        await asyncio.sleep(0.05)
    assert "predicted TBT" in reply.reason and "exceeds the TBT SLO of 0.001 s" in reply.reason

    await put_config(infra, cluster_name, tbt_slo_s=1.0)
    deadline = time.monotonic() + 5
    while not (await reserve(bus, cluster_name, f"loose-{time.monotonic_ns()}", 4000)).accepted:
        assert time.monotonic() < deadline, "the looser TBT SLO never applied"
        await asyncio.sleep(0.05)


async def test_a_moved_request_is_held_on_kv_room_alone(infra, cluster_name, decode):
    """A request whose decode instance failed mid-answer was admitted already: a predicted TBT
    over the SLO must not fail it, but it still needs room."""
    bus, start = decode
    await start("--kv-capacity-tokens", "10000")
    await put_config(infra, cluster_name, tbt_slo_s=0.001)
    deadline = time.monotonic() + 5
    # ~9 ms a step (the test above) is over the SLO with a 1-token prompt too, and holds little
    while (await reserve(bus, cluster_name, f"new-{time.monotonic_ns()}", 1)).accepted:
        assert time.monotonic() < deadline, "the TBT SLO never applied"
        await asyncio.sleep(0.05)

    assert (await reserve(bus, cluster_name, "moved", 4000, is_moved=True)).accepted
    too_big = await reserve(bus, cluster_name, "moved-too-big", 9000, is_moved=True)
    assert not too_big.accepted and "no KV room" in too_big.reason


async def telemetry_until(bus: Bus, cluster: str, predicate, timeout_s: float) -> InstanceLoad:
    found: asyncio.Queue[InstanceLoad] = asyncio.Queue()
    await bus.subscribe(
        Subjects(cluster).telemetry("decode", "decode-a"), InstanceLoad, found.put_nowait
    )
    deadline = time.monotonic() + timeout_s
    while True:
        load = await asyncio.wait_for(found.get(), max(0.01, deadline - time.monotonic()))
        if predicate(load):
            return load


async def test_a_decode_instance_with_no_kv_room_left_says_it_is_full(infra, cluster_name, decode):
    bus, start = decode
    await start("--kv-capacity-tokens", "200", "--emulated-time-scale", "0")
    # The warm-up reservation holds 1 + 16 tokens; this one the other 183 (167 + 16).
    assert (await reserve(bus, cluster_name, "fills-it", 167)).accepted
    load = await telemetry_until(bus, cluster_name, lambda load: not load.is_accepting, 5)
    assert load.not_accepting_reason == "full"


async def test_a_draining_decode_instance_says_so_and_waits_for_what_it_reserved(
    infra, cluster_name, decode
):
    bus, start = decode
    process = await start("--emulated-time-scale", "0", "--drain-timeout-s", "30")
    seen: list[InstanceLoad] = []
    await bus.subscribe(
        Subjects(cluster_name).telemetry("decode", "decode-a"), InstanceLoad, seen.append
    )
    await asyncio.sleep(0.5)
    assert seen and all(load.is_accepting for load in seen)
    process.signal(signal.SIGTERM)
    # Draining, it refuses new reservations but waits for the one it holds (the warm-up's).
    held = ["warm-up"]  # and any taken before the SIGTERM arrived
    deadline = time.monotonic() + 5
    while (reply := await reserve(bus, cluster_name, f"late-{len(held)}", 1)).accepted:
        held.append(reply.request_id)
        assert time.monotonic() < deadline, "a draining instance kept taking reservations"
        await asyncio.sleep(0.05)
    assert "draining" in reply.reason
    await asyncio.sleep(0.5)
    assert process.is_running, "it left before the requests it reserved room for were done"
    for request_id in held:
        await bus.request(
            Subjects(cluster_name).decode_cancel("decode-a"),
            DecodeCancel(request_id=request_id),
            Ack,
            5,
        )
    assert await asyncio.to_thread(process.popen.wait, 15) == 0
    deadline = time.monotonic() + 2  # what it sent before exiting may still be on its way here
    while not (draining := [load for load in seen if not load.is_accepting]):
        assert time.monotonic() < deadline, [msgspec.to_builtins(load) for load in seen[-3:]]
        await asyncio.sleep(0.05)
    assert draining[0].not_accepting_reason == "draining"


async def test_telemetry_acknowledges_the_reservations_it_counts(infra, cluster_name, decode):
    """A conductor adds a reservation to the reported load until a report says it was received
    (InstanceLoad.received): the report that names its number counts its KV room and its
    prompt."""
    bus, start = decode
    await start("--kv-capacity-tokens", "100000", "--emulated-time-scale", "0")
    reservation = Reservation(
        request_id="numbered",
        num_prompt_tokens=500,
        max_tokens=16,
        conductor="conductor-t",
        assignment=42,
    )
    reply = await bus.request(
        Subjects(cluster_name).decode_reserve("decode-a"), reservation, ReservationReply, 5
    )
    assert reply.accepted
    load = await telemetry_until(
        bus, cluster_name, lambda load: load.received.get("conductor-t") == 42, 5
    )
    assert load.kv_used_tokens >= 516 and load.num_queued >= 1
    # the prompt it brings to the batch once started, which TBT predictions count
    assert load.num_queued_context_tokens >= 500


async def test_a_cancel_right_behind_its_start_releases_the_room(infra, cluster_name, decode):
    """A client that leaves as its first token arrives: the conductor's cancel follows the
    decode start at once, and may be handled before the generation's task first runs. The room
    must come back all the same (a task cancelled before it starts runs none of its body)."""
    bus, start = decode
    await start("--kv-capacity-tokens", "1000000", "--emulated-time-scale", "0.05")
    subjects = Subjects(cluster_name)
    cancel_subject = subjects.decode_cancel("decode-a")
    await bus.request(cancel_subject, DecodeCancel(request_id="warm-up"), Ack, 5)
    for i in range(20):
        request_id = f"left-{i}"
        assert (await reserve(bus, cluster_name, request_id, 4)).accepted
        started = bus.request(
            subjects.decode_start("decode-a"),
            DecodeStart(
                request_id=request_id, token_ids=[1, 2, 3, 4], first_token=5, max_tokens=16
            ),
            Ack,
            5,
        )
        cancelled = bus.publish(cancel_subject, DecodeCancel(request_id=request_id))
        await asyncio.gather(started, cancelled, return_exceptions=True)
    load = await telemetry_until(
        bus, cluster_name, lambda load: load.kv_used_tokens == 0 and load.num_running == 0, 5
    )
    assert load.num_queued == 0


def start_to_admit(request_id: str, num_prompt_tokens: int, assignment: int = 0) -> DecodeStart:
    """A start on a prompt the decode computes itself, with no reservation before it."""
    return DecodeStart(
        request_id=request_id,
        token_ids=[7] * num_prompt_tokens,
        first_token=None,
        max_tokens=16,
        admit=True,
        conductor="conductor-t" if assignment else "",
        assignment=assignment,
    )


async def test_a_start_to_admit_is_refused_where_a_reservation_would_be(
    infra, cluster_name, decode
):
    bus, start = decode
    await start("--kv-capacity-tokens", "2000")
    subject = Subjects(cluster_name).decode_start("decode-a")
    with pytest.raises(RemoteError) as refused:
        await bus.request(subject, start_to_admit("too-big", 3000), Ack, 5)
    assert refused.value.code == "StartRefused" and "no KV room" in str(refused.value)

    await put_config(infra, cluster_name, tbt_slo_s=0.001)  # under one LLaMA2-7B step
    deadline = time.monotonic() + 5
    while True:
        try:
            await bus.request(subject, start_to_admit(f"t-{time.monotonic_ns()}", 10), Ack, 5)
        except RemoteError as exc:
            assert exc.code == "StartRefused" and "exceeds the TBT SLO" in str(exc)
            break
        assert time.monotonic() < deadline, "the TBT SLO never applied to admitted starts"
        await asyncio.sleep(0.05)


async def test_an_admitted_start_runs_and_is_acknowledged_in_telemetry(infra, cluster_name, decode):
    bus, start = decode
    await start("--kv-capacity-tokens", "100000", "--emulated-time-scale", "1")
    subjects = Subjects(cluster_name)
    stream = await bus.stream(subjects.tokens("admitted"), TokenChunk)
    try:
        # Seconds of emulated steps: still running at the next telemetry report.
        admitted = msgspec.structs.replace(start_to_admit("admitted", 300, 43), max_tokens=400)
        await bus.request(subjects.decode_start("decode-a"), admitted, Ack, 5)
        load = await telemetry_until(
            bus, cluster_name, lambda load: load.received.get("conductor-t") == 43, 5
        )
        assert load.num_running >= 1 and load.kv_used_tokens >= 700
        chunk = await stream.next(10)
        assert chunk.request_id == "admitted" and chunk.token_ids
    finally:
        await stream.close()


def start_from_prefill(request_id: str, num_prompt_tokens: int, max_tokens: int) -> DecodeStart:
    """A start as a prefill instance sends it, its first token filled in."""
    return DecodeStart(
        request_id=request_id,
        token_ids=[7] * num_prompt_tokens,
        first_token=8,
        max_tokens=max_tokens,
        from_prefill=True,
    )


async def test_a_start_from_prefill_ahead_of_its_reservation_is_admitted_and_holds_room_once(
    infra, cluster_name, decode
):
    """A prefill instance sends the start as its first token is out, which may overtake the
    reservation its conductor sent: with none held, the start is admitted by a reservation's
    rules, and the reservation that comes after it holds no room a second time."""
    bus, start = decode
    await start("--kv-capacity-tokens", "2000", "--emulated-time-scale", "1")
    subject = Subjects(cluster_name).decode_start("decode-a")
    # 200 tokens: seconds of emulated steps, still running when its reservation comes
    with pytest.raises(RemoteError) as refused:
        await bus.request(subject, start_from_prefill("too-big", 1900, 200), Ack, 5)
    assert refused.value.code == "StartRefused" and "no KV room" in str(refused.value)
    await bus.request(subject, start_from_prefill("early", 1000, 200), Ack, 5)
    # 17 (the warm-up) + 1,200 in use: held again, the reservation's 1,016 would not fit.
    assert (await reserve(bus, cluster_name, "early", 1000)).accepted
    assert (await reserve(bus, cluster_name, "other", 700)).accepted


async def test_a_start_from_prefill_after_its_reservation_was_refused_is_refused(
    infra, cluster_name, decode
):
    """A refused reservation's prefill instance may still send the start, and the room may have
    come back by the time it lands: the start is refused all the same, for its conductor has
    already placed the request again."""
    bus, start = decode
    await start("--kv-capacity-tokens", "1000", "--emulated-time-scale", "0")
    subjects = Subjects(cluster_name)
    assert (await reserve(bus, cluster_name, "holder", 900)).accepted
    refused = await reserve(bus, cluster_name, "late", 500)
    assert not refused.accepted and "no KV room" in refused.reason
    await bus.request(subjects.decode_cancel("decode-a"), DecodeCancel(request_id="holder"), Ack, 5)
    with pytest.raises(RemoteError) as rejected:
        await bus.request(
            subjects.decode_start("decode-a"), start_from_prefill("late", 500, 16), Ack, 5
        )
    assert "refused" in str(rejected.value)
    assert (await reserve(bus, cluster_name, "after", 500)).accepted  # the room did come back
