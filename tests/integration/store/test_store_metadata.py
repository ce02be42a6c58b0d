"""A commit is answered once the store serves its blocks; their etcd keys (the cluster's block
index) follow within a bounded lag, never outlive an evict, and are measured on /metrics."""

import asyncio
import signal

from scrape import metric_total
from store_helpers import MODEL, blocks, read_back, wait_for_segment, wait_serving, wait_until

from crescent.common.etcd import connect_etcd
from crescent.common.naming import Keys
from crescent.common.ports import free_port

PUBLISH_DEADLINE_S = 5.0


async def keys_in_etcd(infra, cluster_name: str, node: str) -> set[bytes]:
    """Hashes of the blocks etcd lists on `node`, read straight from etcd."""
    etcd = await connect_etcd(infra.etcd_url)
    try:
        prefix = Keys(cluster_name).blocks(MODEL).encode()
        found = set()
        for entry in await etcd.get_prefix(prefix):
            block_hex, holder = entry.key.decode()[len(prefix) :].split("/")
            if holder == node:
                found.add(bytes.fromhex(block_hex))
        return found
    finally:
        await etcd.close()


def store_metric(port: int, name: str) -> float:
    """The sum of the samples `name` on the store's /metrics, whatever their labels."""
    return metric_total(f"http://127.0.0.1:{port}", name)


async def test_a_put_is_answered_before_its_metadata_is_in_etcd(
    stores, client_factory, infra, cluster_name
):
    """With etcd stopped, a put still returns and its blocks are read back through the store;
    the store's /metrics counts them as unwritten; once etcd runs again, their keys arrive
    within the deadline and the lag is recorded."""
    http_port = free_port()
    store = stores.start("n1", 16, 0, "--http-port", str(http_port))
    client = await client_factory()
    await wait_for_segment(client, "n1")
    await wait_serving(store)
    hashes, data = blocks(2, seed=700)
    infra.etcd.signal(signal.SIGSTOP)
    try:
        written = await asyncio.wait_for(client.put_blocks(MODEL, "n1", hashes, data), 5)
        count, got = await read_back(client, "n1", hashes)
        pending = await asyncio.to_thread(
            store_metric, http_port, "crescent_store_metadata_pending_keys"
        )
    finally:
        infra.etcd.signal(signal.SIGCONT)
    assert written == 2 and count == 2 and got == data
    assert await client.lookup(MODEL, "n1", hashes) == ["dram"] * 2
    assert pending == 2

    async def published():
        return await keys_in_etcd(infra, cluster_name, "n1") == set(hashes)

    await wait_until(published, PUBLISH_DEADLINE_S, "the blocks' keys in etcd")
    await wait_until(
        lambda: store_metric(http_port, "crescent_store_metadata_pending_keys") == 0,
        PUBLISH_DEADLINE_S,
        "no unwritten keys on /metrics",
    )
    assert store_metric(http_port, "crescent_store_metadata_lag_seconds_count") >= 1
    assert store_metric(http_port, "crescent_store_metadata_last_lag_seconds") > 0


async def test_a_put_that_waits_for_metadata_returns_with_its_keys_in_etcd(
    stores, client_factory, infra, cluster_name
):
    stores.start("n1")
    client = await client_factory()
    await wait_for_segment(client, "n1")
    hashes, data = blocks(4, seed=100)
    assert await client.put_blocks(MODEL, "n1", hashes, data, wait_metadata=True) == 4
    assert await keys_in_etcd(infra, cluster_name, "n1") == set(hashes)
    # Blocks already stored: nothing to write, still a wait for their keys.
    assert await client.put_blocks(MODEL, "n1", hashes, data, wait_metadata=True) == 0


async def test_an_evict_right_after_a_put_leaves_no_key_in_etcd(
    stores, client_factory, infra, cluster_name
):
    """Put then evict with no wait between (the put's keys are still queued or being written):
    the evict's reply comes with the keys gone, and no write that was queued before it brings
    them back later."""
    stores.start("n1")
    client = await client_factory()
    await wait_for_segment(client, "n1")
    for seed in range(0, 400, 40):  # several rounds: the put's batch caught at varied points
        hashes, data = blocks(8, seed=seed)
        await client.put_blocks(MODEL, "n1", hashes, data)
        evicted = await client.evict(MODEL, "n1", hashes)
        assert sorted(evicted.evicted) == sorted(hashes)
        assert not await keys_in_etcd(infra, cluster_name, "n1") & set(hashes)
    barrier, barrier_data = blocks(1, seed=1000)
    await client.put_blocks(MODEL, "n1", barrier, barrier_data, wait_metadata=True)
    assert await keys_in_etcd(infra, cluster_name, "n1") == set(barrier)


async def test_blocks_dropped_for_room_leave_etcd_with_them(
    stores, client_factory, infra, cluster_name
):
    """A full pool drops its oldest blocks for new ones, one put after another without waits:
    once published, etcd lists exactly the blocks the store holds."""
    stores.start("n1", dram_blocks=4)
    client = await client_factory()
    await wait_for_segment(client, "n1")
    hashes, data = blocks(12, seed=2000)
    for start in range(0, 12, 2):
        await client.put_blocks(MODEL, "n1", hashes[start : start + 2], data[start : start + 2])
    barrier, barrier_data = blocks(1, seed=3000)
    await client.put_blocks(MODEL, "n1", barrier, barrier_data, wait_metadata=True)
    held = {h for h in hashes + barrier if await client.lookup(MODEL, "n1", [h])}
    assert len(held) == 4 and barrier[0] in held
    assert await keys_in_etcd(infra, cluster_name, "n1") == held


async def test_a_stopping_store_says_which_metadata_it_could_not_write(
    stores, client_factory, infra
):
    """SIGTERM while etcd is stopped: the store waits (bounded) for its queued keys before its
    lease is revoked, then logs how many it left unwritten, and still exits."""
    store = stores.start("n1")
    client = await client_factory()
    await wait_for_segment(client, "n1")
    await wait_serving(store)
    hashes, data = blocks(3, seed=4000)
    infra.etcd.signal(signal.SIGSTOP)
    try:
        await asyncio.wait_for(client.put_blocks(MODEL, "n1", hashes, data), 5)
        store.signal(signal.SIGTERM)
        await wait_until(
            lambda: "block metadata not flushed before shutdown" in store.log_path.read_text(),
            15,
            "the store's word on unwritten metadata",
        )
    finally:
        infra.etcd.signal(signal.SIGCONT)
    word = next(
        line
        for line in store.log_path.read_text().splitlines()
        if "block metadata not flushed before shutdown" in line
    )
    assert '"num_keys": 3' in word
    await wait_until(lambda: not store.is_running, 20, "the store's exit")
