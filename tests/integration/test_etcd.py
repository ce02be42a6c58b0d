"""Leases and the prefix mirror on a real etcd, including restarts and compaction."""

import asyncio
import time

import grpc
import pytest
from aetcd.rpc import rpc_pb2

from crescent.cluster.infra import etcd_spec
from crescent.cluster.processes import ManagedProcess
from crescent.common.errors import UnreachableError
from crescent.common.etcd import LeasedKeys, MirrorEvent, PrefixMirror, connect_etcd
from crescent.common.heartbeat import LeaseHeartbeat
from crescent.common.ports import free_port


async def wait_for(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


class Recorder:
    def __init__(self):
        self.events: list[MirrorEvent] = []

    def __call__(self, event: MirrorEvent) -> None:
        self.events.append(event)

    def state(self) -> dict[str, bytes]:
        state: dict[str, bytes] = {}
        for event in self.events:
            if event.value is None:
                del state[event.key]  # a delete of an unknown key would be a duplicate
            else:
                state[event.key] = event.value
        return state


async def etcd_state(client, prefix: str) -> dict[str, bytes]:
    return {kv.key.decode(): kv.value for kv in await client.get_prefix(prefix.encode())}


async def test_leased_keys_vanish_when_the_lease_is_revoked_or_expires(infra):
    client = await connect_etcd(infra.etcd_url)
    try:
        keys = LeasedKeys(client, ttl_s=1)
        await keys.start()
        await keys.put("/t/a", b"1")
        assert await etcd_state(client, "/t/") == {"/t/a": b"1"}
        await keys.revoke()
        assert await etcd_state(client, "/t/") == {}

        orphan = LeasedKeys(client, ttl_s=1)  # never kept alive
        await orphan.start()
        await orphan.put("/t/b", b"2")
        await asyncio.sleep(2.5)
        assert await etcd_state(client, "/t/") == {}
    finally:
        await client.close()


async def test_kept_lease_survives_and_reputs_after_loss(infra):
    client = await connect_etcd(infra.etcd_url)
    try:
        keys = LeasedKeys(client, ttl_s=1)
        await keys.start()
        await keys.put("/t/a", b"1")
        keeper = asyncio.create_task(keys.run())
        await asyncio.sleep(2.5)
        assert await etcd_state(client, "/t/") == {"/t/a": b"1"}
        await client.revoke_lease(keys._lease.id)  # as if the lease had expired
        deadline = time.monotonic() + 5
        while await etcd_state(client, "/t/") != {"/t/a": b"1"}:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        keeper.cancel()
    finally:
        await client.close()


async def test_a_revoked_lease_is_not_renewed_by_its_keep_alive(infra):
    """A clean shutdown revokes the lease while the keep-alive still runs: the keep-alive must
    not take the lease's loss for an outage and register the keys again, nor end (the service's
    task supervisor would take that for a task that died, and the stop for a failure)."""
    client = await connect_etcd(infra.etcd_url)
    try:
        keys = LeasedKeys(client, ttl_s=1)
        await keys.start()
        await keys.put("/r/a", b"1")
        keeper = asyncio.create_task(keys.run())
        await keys.revoke()
        await asyncio.sleep(1.2)  # the keep-alive wakes every ttl/3
        await keys.put("/r/b", b"2")  # a late writer
        assert await etcd_state(client, "/r/") == {}
        assert not keeper.done()
        keeper.cancel()
    finally:
        await client.close()


async def test_mirror_loads_then_follows(infra):
    client = await connect_etcd(infra.etcd_url)
    recorder = Recorder()
    try:
        await client.put(b"/p/a", b"1")
        mirror = PrefixMirror(client, "/p/", recorder)
        await mirror.load()
        assert recorder.state() == {"/p/a": b"1"}
        follower = asyncio.create_task(mirror.run())
        await client.put(b"/p/b", b"2")
        await client.put(b"/other", b"x")
        await client.delete(b"/p/a")
        await wait_for(lambda: recorder.state() == {"/p/b": b"2"})
        assert len(recorder.events) == 3
        follower.cancel()
    finally:
        await client.close()


async def test_mirror_resumes_after_etcd_restart_without_missing_or_repeating(infra):
    client = await connect_etcd(infra.etcd_url)
    recorder = Recorder()
    try:
        for i in range(5):
            await client.put(f"/p/{i}".encode(), b"v0")
        mirror = PrefixMirror(client, "/p/", recorder, retry_s=0.2)
        await mirror.load()
        follower = asyncio.create_task(mirror.run())
        await client.put(b"/p/0", b"v1")
        await wait_for(lambda: recorder.state().get("/p/0") == b"v1")

        infra.etcd.stop()
        infra.etcd.start()
        infra.etcd.wait_ready(30)

        await client.put(b"/p/1", b"v2")
        await client.delete(b"/p/2")
        await client.put(b"/p/new", b"v3")
        expected = await etcd_state(client, "/p/")
        await wait_for(lambda: recorder.state() == expected, timeout_s=20)
        # One event per change: 5 initial puts, 1 update before the restart, 3 changes after.
        await asyncio.sleep(0.5)
        assert len(recorder.events) == 9
        follower.cancel()
    finally:
        await client.close()


async def test_mirror_recovers_from_compaction_by_diffing(infra):
    client = await connect_etcd(infra.etcd_url)
    recorder = Recorder()
    try:
        for i in range(3):
            await client.put(f"/p/{i}".encode(), b"v0")
        mirror = PrefixMirror(client, "/p/", recorder, retry_s=2.0)
        await mirror.load()
        follower = asyncio.create_task(mirror.run())
        await asyncio.sleep(0.3)

        infra.etcd.stop()
        infra.etcd.start()
        infra.etcd.wait_ready(30)
        # While the mirror waits to retry, history it never saw is written and compacted away.
        other = await connect_etcd(infra.etcd_url)
        await other.put(b"/p/0", b"v1")
        await other.put(b"/p/0", b"v2")
        await other.delete(b"/p/1")
        result = await other.put(b"/p/3", b"v3")
        await other.compact(result.header.revision)
        expected = await etcd_state(other, "/p/")
        await other.close()

        await wait_for(lambda: recorder.state() == expected, timeout_s=20)
        await asyncio.sleep(0.5)
        # 3 initial puts + the net difference (0 changed, 1 deleted, 3 added): no intermediate v1.
        assert len(recorder.events) == 6
        assert b"v1" not in [e.value for e in recorder.events]
        follower.cancel()
    finally:
        await client.close()


async def test_unreachable_etcd_fails_fast_with_a_clear_error():
    started = time.monotonic()
    with pytest.raises(UnreachableError, match="etcd"):
        await connect_etcd("http://127.0.0.1:1", timeout_s=1.5)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("has_heartbeat", [True, False])
async def test_heartbeat_thread_keeps_the_lease_while_the_event_loop_is_blocked(
    infra, has_heartbeat
):
    """Slow is not dead: a loop held by compute for twice the TTL keeps its registry key only
    because the heartbeat thread keeps the lease alive."""
    client = await connect_etcd(infra.etcd_url)
    try:
        keys = LeasedKeys(client, ttl_s=1)
        await keys.start()
        await keys.put("/t/busy", b"1")
        heartbeat = LeaseHeartbeat(infra.etcd_url, keys, ttl_s=1, connect_timeout_s=5)
        if has_heartbeat:
            heartbeat.start()
            await asyncio.sleep(0.5)  # connected
        time.sleep(2.5)  # noqa: ASYNC251  the event loop is blocked on purpose, as by a long engine step
        held = await etcd_state(client, "/t/")
        heartbeat.stop()
        assert held == ({"/t/busy": b"1"} if has_heartbeat else {})
    finally:
        await client.close()


async def test_a_put_after_the_lease_lapsed_takes_a_new_lease(infra):
    """A service whose start held its event loop past the TTL still registers."""
    client = await connect_etcd(infra.etcd_url)
    try:
        keys = LeasedKeys(client, ttl_s=1)
        await keys.start()
        await keys.put("/t/a", b"1")
        await client.revoke_lease(keys.lease.id)  # as if it had expired
        await keys.put("/t/b", b"2")
        assert await etcd_state(client, "/t/") == {"/t/a": b"1", "/t/b": b"2"}
    finally:
        await client.close()


async def test_etcd_as_crescent_starts_it_compacts_its_history(tmp_path):
    """The retention here is a second (crescent up: COMPACTION_RETENTION): a revision older
    than that is soon compacted away, so churning block keys do not grow etcd without bound."""
    port = free_port()
    etcd = ManagedProcess(etcd_spec(port, tmp_path / "etcd", compaction_retention="1s"), tmp_path)
    etcd.start()
    etcd.wait_ready(30)
    client = await connect_etcd(f"http://127.0.0.1:{port}")
    try:
        first = (await client.put(b"/churn", b"0")).header.revision
        deadline = time.monotonic() + 20
        compacted = False
        while not compacted:
            assert time.monotonic() < deadline, "etcd kept its history"
            await client.put(b"/churn", b"1")
            await asyncio.sleep(0.5)
            try:
                await client.kvstub.Range(rpc_pb2.RangeRequest(key=b"/churn", revision=first))
            except grpc.aio.AioRpcError as exc:
                assert "compacted" in exc.details()
                compacted = True
    finally:
        await client.close()
        etcd.stop()
