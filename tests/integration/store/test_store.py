"""The store daemon and its client, end to end on real processes."""

import asyncio
import signal
import subprocess
import sys
import threading
import urllib.request

import msgspec
import pytest
from scrape import metric_value
from store_helpers import BLOCK, MODEL, blocks, read_back, wait_for_segment, wait_until

from crescent.cluster.processes import ManagedProcess, ProcessSpec
from crescent.common.bus import Bus
from crescent.common.errors import FatalError, NoRespondersError, RemoteError
from crescent.common.etcd import MirrorEvent
from crescent.common.messages import InstanceLoad, PrefillJob, PrefillResult
from crescent.common.naming import Subjects
from crescent.common.ports import free_port
from crescent.common.store_messages import (
    AbortBlocks,
    AllocBlocks,
    BlockSlots,
    CommitBlocks,
    Done,
    LookupBlocks,
    LookupReply,
    PinBlocks,
    PinnedBlocks,
    UnpinBlocks,
)
from crescent.engine.store_check import check_store_block_bytes
from crescent.storeclient import mapped_copy
from crescent.storeclient.directory import encode_segments
from crescent.transfer import PeerUnreachable, TcpEndpoint, TransportKind
from crescent.transfer.transports.rdma import unavailable_reason


@pytest.mark.parametrize("use_mapping", [True, False], ids=["mapped", "data-plane"])
async def test_put_get_round_trip_is_byte_exact(stores, client_factory, use_mapping):
    stores.start("n1")
    client = await client_factory(use_mapping=use_mapping)
    await wait_for_segment(client, "n1")
    hashes, data = blocks(8)
    assert await client.put_blocks(MODEL, "n1", hashes, data, wait_metadata=True) == 8
    assert await client.put_blocks(MODEL, "n1", hashes, data) == 0  # already stored
    count, got = await read_back(client, "n1", hashes)
    assert count == 8 and got == data
    count, got = await read_back(client, "n1", hashes[:3] + [b"\x00" * 16], layer=2, num_layers=4)
    assert count == 3 and got == [d[2 * BLOCK // 4 : 3 * BLOCK // 4] for d in data[:3]]
    assert (
        await client.lookup(MODEL, "n1", hashes[:4] + [b"\x00" * 16] + hashes[5:]) == ["dram"] * 4
    )
    assert (await client.lookup_prefix(MODEL, hashes)) == {"n1": 8}


async def test_a_large_mapped_batch_is_copied_on_every_copy_thread(
    stores, client_factory, monkeypatch
):
    """A mapped put or get of at least `shm_parallel_bytes` is split over the copy threads,
    which copy at once (the barrier breaks if one thread got both halves)."""
    stores.start("n1")
    client = await client_factory(shm_parallel_bytes=4 * BLOCK, shm_copy_threads=2)
    await wait_for_segment(client, "n1")
    monkeypatch.setattr(mapped_copy, "PARALLEL_BLOCK_BYTES", BLOCK)
    barrier = threading.Barrier(2, timeout=10)
    threads = []
    original = mapped_copy._copy_arrays

    def spy(*args):
        threads.append(threading.get_ident())
        barrier.wait()
        return original(*args)

    monkeypatch.setattr(mapped_copy, "_copy_arrays", spy)
    hashes, data = blocks(8)
    assert await client.put_blocks(MODEL, "n1", hashes, data) == 8
    count, got = await read_back(client, "n1", hashes)
    assert count == 8 and got == data
    assert len(threads) == 4 and threading.get_ident() not in threads


async def test_a_batch_allocated_in_free_slots_lies_back_to_back(stores, client_factory):
    """Slots in ascending order, so a batch's blocks move as one range (one memory run on the
    store's tcp server), also after the blocks before them were evicted in another order."""
    stores.start("n1", dram_blocks=8)
    client = await client_factory()
    await wait_for_segment(client, "n1")
    hashes, data = blocks(6)
    assert await client.put_blocks(MODEL, "n1", hashes, data) == 6
    scrambled = [hashes[i] for i in (3, 0, 5, 1, 4, 2)]
    assert sorted((await client.evict(MODEL, "n1", scrambled)).evicted) == sorted(hashes)
    again, _ = blocks(6, seed=100)
    slots = await client.ctl("n1", AllocBlocks(model=MODEL, hashes=again), BlockSlots)
    assert slots.offsets == [slots.offsets[0] + i * BLOCK for i in range(6)]
    await client.ctl("n1", AbortBlocks(model=MODEL, hashes=again), Done)


async def test_lookups_and_repeated_writes_keep_a_hot_prefix_in_dram(stores, client_factory):
    """LRU by use, not by insertion: the prefix written first but looked up (or written again)
    since outlives blocks written after it."""
    stores.start("n1", dram_blocks=4)
    client = await client_factory()
    await wait_for_segment(client, "n1")
    hot, hot_data = blocks(2, seed=0)
    cold, cold_data = blocks(2, seed=100)
    await client.put_blocks(MODEL, "n1", hot, hot_data)
    await client.put_blocks(MODEL, "n1", cold, cold_data)
    assert await client.lookup(MODEL, "n1", hot) == ["dram"] * 2
    newer, newer_data = blocks(2, seed=200)
    await client.put_blocks(MODEL, "n1", newer, newer_data)  # the pool is full: two blocks go
    assert await client.lookup(MODEL, "n1", cold) == []
    assert await client.lookup(MODEL, "n1", hot) == ["dram"] * 2  # now newest: newer is the oldest
    assert (
        await client.put_blocks(MODEL, "n1", newer, newer_data) == 0
    )  # a rewrite of held blocks: a use
    await client.put_blocks(MODEL, "n1", cold, cold_data)
    assert await client.lookup(MODEL, "n1", hot) == []
    assert await client.lookup(MODEL, "n1", newer) == ["dram"] * 2


async def spilled(stores, client_factory, num_blocks: int):
    """A store of 4 DRAM and 16 SSD slots given `num_blocks` blocks two at a time: all but the
    last 4 are on SSD. Returns the client, the blocks' hashes and their bytes."""
    stores.start("n1", dram_blocks=4, ssd_blocks=16)
    client = await client_factory()
    await wait_for_segment(client, "n1")
    hashes, data = blocks(num_blocks)
    for i in range(0, num_blocks, 2):
        await client.put_blocks(MODEL, "n1", hashes[i : i + 2], data[i : i + 2])
    return client, hashes, data


async def test_ssd_spill_and_reload_is_byte_exact(stores, client_factory):
    client, hashes, data = await spilled(stores, client_factory, 12)
    tiers = await client.lookup(MODEL, "n1", hashes)
    assert tiers.count("ssd") == 8 and tiers.count("dram") == 4
    for i in range(12):  # each read of an SSD block brings it back to DRAM, demoting another
        count, got = await read_back(client, "n1", hashes[i : i + 1])
        assert count == 1 and got[0] == data[i]


async def test_a_read_of_ssd_blocks_promotes_them_together_byte_exact(stores, client_factory):
    """One get of four SSD blocks promotes all four: the DRAM blocks they displace go to SSD
    first (one SSD call), then the four are read into the freed slots (another). Reading the
    displaced blocks back, again four at once, gives each its own bytes."""
    client, hashes, data = await spilled(stores, client_factory, 8)
    assert await client.lookup(MODEL, "n1", hashes[:4]) == ["ssd"] * 4
    for first, last in ((0, 4), (4, 8)):  # then blocks 4-7 are the ones on SSD
        count, got = await read_back(client, "n1", hashes[first:last])
        assert count == 4 and got == data[first:last]


async def test_a_put_that_spills_past_the_ssd_keeps_the_blocks_demoted_last(stores, client_factory):
    """A put into a full DRAM demotes as many blocks to SSD, all written in one call in the
    order planned: with more demotions than free SSD slots, a slot is written twice in one
    put, and the block demoted last into it is the one kept, byte exact."""
    stores.start("n1", dram_blocks=4, ssd_blocks=3)
    client = await client_factory()
    await wait_for_segment(client, "n1")
    hashes, data = blocks(8)
    await client.put_blocks(MODEL, "n1", hashes[:4], data[:4])
    await client.put_blocks(MODEL, "n1", hashes[4:], data[4:])  # demotes blocks 0-3, in order
    tiers = [await client.lookup(MODEL, "n1", [h]) for h in hashes[:4]]
    assert tiers == [[], ["ssd"], ["ssd"], ["ssd"]]  # block 3 took block 0's slot
    count, got = await read_back(client, "n1", hashes[3:4])
    assert count == 1 and got[0] == data[3]


async def test_full_pool_of_pinned_blocks_refuses_and_overwrites_nothing(
    stores, client_factory, infra, cluster_name
):
    stores.start("n1", dram_blocks=4)
    client = await client_factory()
    await wait_for_segment(client, "n1")
    hashes, data = blocks(5)
    await client.put_blocks(MODEL, "n1", hashes[:4], data[:4])
    ctl = client._subjects.store_ctl("n1")
    pinned = await client._bus.request(
        ctl, PinBlocks(model=MODEL, hashes=hashes[:4], ttl_s=60), PinnedBlocks, 5
    )
    assert len(pinned.hashes) == 4
    with pytest.raises(RemoteError, match="pool full"):
        await client.put_blocks(MODEL, "n1", hashes[4:], data[4:])
    count, got = await read_back(client, "n1", hashes[:4])
    assert count == 4 and got == data[:4]


async def test_bad_requests_get_clear_errors_and_the_store_keeps_serving(stores, client_factory):
    stores.start("n1")
    client = await client_factory()
    await wait_for_segment(client, "n1")
    bus, ctl = client._bus, client._subjects.store_ctl("n1")
    with pytest.raises(RemoteError, match="16 bytes"):
        await bus.request(ctl, AllocBlocks(model=MODEL, hashes=[b"short"]), BlockSlots, 5)
    with pytest.raises(RemoteError, match="not allocated"):
        await bus.request(ctl, CommitBlocks(model=MODEL, hashes=[b"\x01" * 16]), Done, 5)
    with pytest.raises(RemoteError, match="twice"):
        await bus.request(ctl, AllocBlocks(model=MODEL, hashes=[b"\x01" * 16] * 2), BlockSlots, 5)
    hashes, data = blocks(2)
    assert await client.put_blocks(MODEL, "n1", hashes, data) == 2


async def test_uncommitted_block_is_invisible(stores, client_factory):
    stores.start("n1")
    client = await client_factory()
    await wait_for_segment(client, "n1")
    hashes, _ = blocks(1)
    await client._bus.request(
        client._subjects.store_ctl("n1"), AllocBlocks(model=MODEL, hashes=hashes), BlockSlots, 5
    )
    assert await client.lookup(MODEL, "n1", hashes) == []
    count, _ = await read_back(client, "n1", hashes)
    assert count == 0 and await client.lookup_prefix(MODEL, hashes) == {}


async def test_a_lookup_may_wait_for_blocks_being_written_until_they_settle(stores, client_factory):
    """A decode's lookup waits (wait_writing_s) for blocks of the prefix still being written,
    as its prefill's first token no longer waits for their commit: a commit ends the wait with
    the blocks found, an abort with them missing, and the deadline with what is there. A block
    nobody is writing is not waited for. The store's /metrics times each lookup allowed to
    wait (0 for one that found nothing being written)."""
    http_port = free_port()
    stores.start("n1", 16, 0, "--http-port", str(http_port))
    client = await client_factory()
    await wait_for_segment(client, "n1")
    hashes, _ = blocks(4)
    await client.put_blocks(MODEL, "n1", hashes[:1], [bytes(BLOCK)])

    def lookup(wait_s: float) -> asyncio.Future[LookupReply]:
        request = LookupBlocks(model=MODEL, hashes=hashes, wait_writing_s=wait_s)
        return asyncio.ensure_future(client.ctl("n1", request, LookupReply))

    assert len((await lookup(5)).tiers) == 1  # block 1 is not being written: no wait
    await client.ctl("n1", AllocBlocks(model=MODEL, hashes=hashes[1:3]), BlockSlots)
    assert len((await lookup(0)).tiers) == 1  # not asked to wait
    waiting = lookup(30)
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await client.ctl("n1", CommitBlocks(model=MODEL, hashes=hashes[1:2]), Done)
    await asyncio.sleep(0.3)
    assert not waiting.done()  # block 2 is still being written
    await client.ctl("n1", AbortBlocks(model=MODEL, hashes=hashes[2:3]), Done)
    assert len((await waiting).tiers) == 2  # block 2 aborted, block 3 never allocated
    await client.ctl("n1", AllocBlocks(model=MODEL, hashes=hashes[2:3]), BlockSlots)
    assert len((await lookup(0.5)).tiers) == 2  # its deadline: block 2 still being written
    await client.ctl("n1", CommitBlocks(model=MODEL, hashes=hashes[2:3]), Done)
    assert len((await lookup(5)).tiers) == 3
    page = await asyncio.to_thread(_metrics, http_port)
    waits = "crescent_store_lookup_wait_seconds"
    assert metric_value(page, f"{waits}_count") == 4  # the lookups allowed to wait
    assert metric_value(page, f"{waits}_bucket", le="0.0") == 2  # found nothing being written
    assert metric_value(page, f"{waits}_sum") >= 0.6 + 0.5


async def test_the_staged_road_of_rdma_round_trips_over_tcp(stores, client_factory):
    """Moves over rdma go through the client's staging segment (rdma needs registered memory);
    no rdma here, so tcp is told to take that road, whose copies in and out are then checked."""
    stores.start("n1", 16, 0, "--transports", "tcp")
    client = await client_factory(transports=(TransportKind.TCP,))
    await wait_for_segment(client, "n1")
    client._transfer.moves_local_buffers = lambda descriptor: False
    hashes, data = blocks(8, seed=850)
    assert await client.put_blocks(MODEL, "n1", hashes, data) == 8
    count, got = await read_back(client, "n1", hashes)
    assert count == 8 and got == data and client._data_plane.staging is not None


async def test_client_and_store_on_tcp_move_every_byte_over_tcp(stores, client_factory):
    """A same-host store, yet tcp only: nothing is mapped, and the counters of both ends (the
    client's, the store's on /metrics) show tcp moved the bytes, straight from and into the
    caller's buffers (the client never makes its staging segment)."""
    http_port = free_port()
    stores.start("n1", 16, 0, "--transports", "tcp", "--http-port", str(http_port))
    client = await client_factory(transports=(TransportKind.TCP,))
    await wait_for_segment(client, "n1")
    hashes, data = blocks(4, seed=800)
    await client.put_blocks(MODEL, "n1", hashes, data)
    count, got = await read_back(client, "n1", hashes)
    assert count == 4 and got == data
    assert client.mapping("n1.store") is None
    assert client._data_plane.staging is None
    assert {kind: c.num_bytes for kind, c in client.transfer_counters().items()} == {
        TransportKind.TCP: 8 * BLOCK
    }
    metrics = await asyncio.to_thread(_metrics, http_port)
    assert (
        'crescent_transfer_bytes_total{engine="store",side="served",transport="tcp"} '
        + f"{8 * BLOCK:.1f}"
        in metrics
    )
    assert 'transport="shm"' not in metrics


async def test_a_put_over_a_link_cut_mid_batch_fails_clearly_and_commits_nothing(
    stores, client_factory, cutting_proxy
):
    """Over tcp, a put whose connection breaks mid-batch (every time it is retried) raises
    PeerUnreachable; the store aborts the allocation, so no block of it is readable, and the
    same blocks can be put again over a sound link."""
    stores.start("n1", 64, 0, "--transports", "tcp")
    client = await client_factory(transports=(TransportKind.TCP,))
    await wait_for_segment(client, "n1")
    descriptor = client.directory("n1.store")
    endpoint = descriptor.endpoint(TcpEndpoint)
    proxy = cutting_proxy(endpoint.host, endpoint.port, 5 * BLOCK // 2)
    via_proxy = msgspec.structs.replace(
        descriptor, endpoints=(TcpEndpoint("127.0.0.1", proxy.port, endpoint.segment_id),)
    )
    key = "segments/n1"  # the directory keys descriptors by the node in the key's last part
    client.directory.apply(MirrorEvent(key, encode_segments([via_proxy])))
    hashes, data = blocks(32, seed=900)
    with pytest.raises(PeerUnreachable, match="connection lost"):
        await client.put_blocks(MODEL, "n1", hashes, data)
    assert proxy.num_cuts > 0
    assert await client.lookup(MODEL, "n1", hashes) == []
    assert (await read_back(client, "n1", hashes))[0] == 0
    client.directory.apply(MirrorEvent(key, encode_segments([descriptor])))
    assert await client.put_blocks(MODEL, "n1", hashes, data) == 32
    count, got = await read_back(client, "n1", hashes)
    assert count == 32 and got == data


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_store_asked_for_rdma_without_a_device_stops_with_the_reason(infra, cluster_name):
    reason = unavailable_reason()
    if reason is None:
        pytest.skip("this machine has RDMA")
    argv = [
        sys.executable,
        "-m",
        "crescent.store",
        "--cluster",
        cluster_name,
        "--nats-url",
        infra.nats_url,
        "--etcd-url",
        infra.etcd_url,
        "--node",
        "n1",
        "--transports",
        "rdma",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert f"--transports rdma: transport rdma unavailable: {reason}" in done.stderr


async def test_replicate_pulls_blocks_from_another_node(stores, client_factory):
    stores.start("n1")
    stores.start("n2")
    client = await client_factory()
    await wait_for_segment(client, "n1")
    await wait_for_segment(client, "n2")
    hashes, data = blocks(6)
    await client.put_blocks(MODEL, "n1", hashes, data)
    await client.put_blocks(MODEL, "n2", hashes[:2], data[:2])
    reply = await client.replicate(MODEL, hashes, source_node="n1", target_node="n2")
    assert (reply.num_copied, reply.num_present) == (4, 2)
    count, got = await read_back(client, "n2", hashes)
    assert count == 6 and got == data

    async def in_index_on_both():
        return await client.lookup_prefix(MODEL, hashes) == {"n1": 6, "n2": 6}

    await wait_until(in_index_on_both, 5, "both nodes' blocks in the index")
    # n2's telemetry reports the bandwidth its pull from n1 achieved (the conductor's T_transfer).
    loads = []
    await client._bus.subscribe(
        client._subjects.telemetry("store", "store-n2"), InstanceLoad, loads.append
    )
    await wait_until(
        lambda: loads and loads[-1].bandwidth.get("n1", 0) > 0, 5, "bandwidth in telemetry"
    )


async def test_killed_store_vanishes_from_etcd_and_others_are_unaffected(stores, client_factory):
    stores.start("n1")
    stores.start("n2")
    client = await client_factory()
    await wait_for_segment(client, "n1")
    await wait_for_segment(client, "n2")
    hashes, data = blocks(3)
    await client.put_blocks(MODEL, "n1", hashes, data, wait_metadata=True)
    await client.put_blocks(MODEL, "n2", hashes, data, wait_metadata=True)
    assert await client.lookup_prefix(MODEL, hashes) == {"n1": 3, "n2": 3}
    stores.processes["n1"].signal(signal.SIGKILL)

    async def only_n2():
        return await client.lookup_prefix(MODEL, hashes) == {
            "n2": 3
        } and client.directory.nodes() == ["n2"]

    await wait_until(only_n2, 2 + 1.5, "n1's blocks and segment leaving etcd")
    count, got = await read_back(client, "n2", hashes)
    assert count == 3 and got == data

    # A restarted store starts empty and consistent.
    stores.processes["n1"].popen.wait(5)
    stores.start("n1")
    await wait_for_segment(client, "n1")
    assert await client.lookup(MODEL, "n1", hashes) == []
    assert await client.lookup_prefix(MODEL, hashes) == {"n2": 3}
    assert await client.put_blocks(MODEL, "n1", hashes, data) == 3
    count, got = await read_back(client, "n1", hashes)
    assert count == 3 and got == data
    # what the client wrote is in the restarted store's memory, not in the dead one's that
    # it had mapped before: a client that never mapped it, served by the store, reads it too
    other = await client_factory(node="other-node", use_mapping=False)
    await wait_for_segment(other, "n1")
    count, got = await read_back(other, "n1", hashes)
    assert count == 3 and got == data


async def test_two_writers_of_the_same_blocks_never_double_allocate(stores, client_factory):
    """Two conductors' requests may write one prefix at once: one allocation wins, the other
    writer is told the blocks exist, and what is stored is one writer's bytes, whole."""
    stores.start("n1")
    first, second = await client_factory("w1"), await client_factory("w2")
    await wait_for_segment(first, "n1")
    await wait_for_segment(second, "n1")
    hashes, data = blocks(8)
    written = await asyncio.gather(
        first.put_blocks(MODEL, "n1", hashes, data), second.put_blocks(MODEL, "n1", hashes, data)
    )
    assert sum(written) == 8
    count, got = await read_back(first, "n1", hashes)
    assert count == 8 and got == data


async def test_prefill_job_pulls_the_planned_prefix_into_its_node(
    stores, client_factory, infra, cluster_name, tmp_path
):
    """The conductor's transfer plan (source_node, pull_hashes) lands in the prefill node's
    store."""
    stores.start("n1")
    stores.start("n2")
    argv = [
        sys.executable,
        "-m",
        "crescent.prefill",
        "--cluster",
        cluster_name,
        "--nats-url",
        infra.nats_url,
        "--etcd-url",
        infra.etcd_url,
        "--node",
        "n2",
        "--instance-id",
        "prefill-n2",
        "--model",
        MODEL,
        "--emulated-time-scale",
        "0",
    ]
    prefill = ManagedProcess(ProcessSpec(name="prefill-n2", argv=argv), tmp_path / "logs")
    prefill.start()
    try:
        client = await client_factory()
        await wait_for_segment(client, "n1")
        await wait_for_segment(client, "n2")
        hashes, data = blocks(4)
        await client.put_blocks(MODEL, "n1", hashes, data)
        job = PrefillJob(
            request_id="r1",
            model=MODEL,
            token_ids=list(range(100)),
            source_node="n1",
            pull_hashes=hashes,
        )
        subject = client._subjects.prefill_job("prefill-n2")

        async def answered():
            try:
                return await client._bus.request(subject, job, PrefillResult, 5)
            except NoRespondersError:
                return None

        await wait_until(answered, 20, "prefill job answered")
        assert await client.lookup(MODEL, "n2", hashes) == ["dram"] * 4
        count, got = await read_back(client, "n2", hashes)
        assert count == 4 and got == data
    finally:
        prefill.stop()


async def test_a_get_does_not_wait_for_its_unpin_and_a_later_evict_does(stores, client_factory):
    """The unpin after a get is answered off the get's path: here the store's answer is held
    back until the get has returned; the evict that follows still waits for it, so it finds
    no block kept by the read's pin."""
    stores.start("n1")
    client = await client_factory()
    await wait_for_segment(client, "n1")
    hashes, data = blocks(4)
    assert await client.put_blocks(MODEL, "n1", hashes, data) == 4
    release_unpin, unpin_answered = asyncio.Event(), asyncio.Event()
    real_ctl = client.ctl

    async def ctl_with_held_unpin(node, request, reply_type):
        reply = await real_ctl(node, request, reply_type)
        if isinstance(request, UnpinBlocks):
            await release_unpin.wait()
            unpin_answered.set()
        return reply

    client.ctl = ctl_with_held_unpin
    count, got = await asyncio.wait_for(read_back(client, "n1", hashes), 10)
    assert count == 4 and got == data
    assert not unpin_answered.is_set()
    evicting = asyncio.create_task(client.evict(MODEL, "n1", hashes))
    release_unpin.set()
    evicted = await asyncio.wait_for(evicting, 10)
    assert unpin_answered.is_set() and sorted(evicted.evicted) == sorted(hashes)


async def test_a_worker_refuses_a_store_whose_blocks_are_not_its_size(
    stores, client_factory, infra, cluster_name
):
    """What a vLLM prefill or decode worker checks at start (check_store_block_bytes)."""
    stores.start("n1")
    await wait_for_segment(await client_factory(), "n1")  # the store serves
    bus = await Bus.connect(infra.nats_url, "worker-check")
    subjects = Subjects(cluster_name)
    try:
        await check_store_block_bytes(bus, subjects, "n1", MODEL, BLOCK, 10)  # agrees: passes
        with pytest.raises(FatalError, match=f"start the store with --block-bytes {2 * BLOCK}"):
            await check_store_block_bytes(bus, subjects, "n1", MODEL, 2 * BLOCK, 10)
        # No store on the node: prompts are computed in full, the worker still starts.
        await check_store_block_bytes(bus, subjects, "no-such-node", MODEL, BLOCK, 0.5)
    finally:
        await bus.drain()
